"""``tracerl sft``: the SFT labels are GRPO's assistant tokens; it trains, checks held-out data, refuses bad input."""

from __future__ import annotations

import json

import pytest

from sdk.cli import main as tracerl
from tests.support.synth import WEATHER_TOOL, make_episodes, messages_for, write_parquet


def _grpo_tokens(episodes, model_dir, tok, tmp_path):
    """{episode: (ids, 0/1 mask)} as the GRPO trainer prepares them (TRL backend, nothing held out)."""
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    cfg = TRLGRPOConfig(
        model=str(model_dir), output_dir=str(tmp_path / "grpo"), group_size=4, eval_fraction=0.0
    )
    prepared = TRLGRPOTrainer().prepare(episodes, cfg, tokenizer=tok)
    return {
        s.episode_id: (s.prompt_ids + s.completion_ids, [0] * len(s.prompt_ids) + s.loss_mask)
        for g in prepared.groups
        for s in g.sequences
    }


def _sft_tokens(data, model_dir, tok, tmp_path):
    """The same, from the SFT trainer's prepared dataset (labels != -100)."""
    from trainers.sft import SFTSettings, build_sft_trainer

    settings = SFTSettings(
        data=str(data), model=str(model_dir), output_dir=str(tmp_path / "sft"), eval_fraction=0
    )
    trainer, _ = build_sft_trainer(settings, tokenizer=tok)
    return sorted((r["input_ids"], [int(x != -100) for x in r["labels"]]) for r in trainer.train_dataset)


@pytest.mark.parametrize("stored_ids", [False, True], ids=["rerendered", "stored-ids"])
def test_sft_tokens_equal_grpo_assistant_tokens(tmp_path, tiny_model_dir, model_tokenizer, stored_ids):
    tok = model_tokenizer
    episodes = make_episodes(2, 4, tokenizer=tok if stored_ids else None, tools_in_prompt=True)
    data = write_parquet(episodes, tmp_path / "episodes.parquet")
    grpo = sorted(_grpo_tokens(episodes, tiny_model_dir, tok, tmp_path).values())
    sft = _sft_tokens(data, tiny_model_dir, tok, tmp_path)
    assert sft == [(ids, mask) for ids, mask in grpo]
    assert all(0 < sum(mask) < len(mask) for _, mask in sft)


def test_demonstration_labels_cover_tool_calls_and_answers_only(tmp_path, tiny_model_dir, model_tokenizer):
    """A JSONL demonstration: loss on the tool call and the answer, none on system, user or tool result."""
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages_for(0, True)]
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"messages": msgs, "tools": [WEATHER_TOOL]}) + "\n")
    ((ids, mask),) = _sft_tokens(path, tiny_model_dir, model_tokenizer, tmp_path)
    trained = model_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert '"name": "get_weather"' in trained and "<tool_call>" in trained
    assert "What is the weather" not in trained and "tool_response" not in trained
    assert trained.count("<|im_end|>") == 2


def test_min_reward_keeps_the_good_episodes(tmp_path):
    from trainers.sft import load_rows

    data = write_parquet(make_episodes(2, 4), tmp_path / "episodes.parquet")
    rows, dropped = load_rows(str(data), min_reward=1.0)
    assert len(rows) == 4 and all(r["reward"] == 1.0 for r in rows)
    assert dict(dropped) == {"below min_reward": 4}


def test_micro_batches_change_the_memory_not_the_step(tmp_path, tiny_model_dir, model_tokenizer):
    """batch_size 4 in micro-batches of 1 (the CPU default) takes the step 4 at once would (plain SGD)."""
    import torch

    from trainers.sft import SFTSettings, build_sft_trainer

    data = write_parquet(make_episodes(1, 4, tools_in_prompt=True), tmp_path / "episodes.parquet")
    weights = {}
    for micro in (None, 4):
        settings = SFTSettings(
            data=str(data), model=str(tiny_model_dir), output_dir=str(tmp_path / f"sft-{micro}"),
            eval_fraction=0, batch_size=4, micro_batch_size=micro, max_steps=1, learning_rate=0.5,
            extra={"optim": "sgd", "lr_scheduler_type": "constant"},
        )  # fmt: skip
        trainer, _ = build_sft_trainer(settings, tokenizer=model_tokenizer)
        args = trainer.args
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (
            (1, 4) if micro is None else (4, 1)
        )
        start = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        trainer.train()
        weights[micro] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    assert any(not torch.equal(start[k], weights[4][k]) for k in start)  # the step moved the weights
    for k in start:
        torch.testing.assert_close(weights[None][k], weights[4][k], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_sft_cli_trains_and_reports_held_out(tmp_path, tiny_model_dir, capsys):
    data = write_parquet(make_episodes(3, 4, tools_in_prompt=True), tmp_path / "episodes.parquet")
    out = tmp_path / "sft"
    args = ["sft", "--data", str(data), "--model", str(tiny_model_dir), "--output", str(out)]
    assert tracerl([*args, "--min-reward", "1", "--max-steps", "3", "--learning-rate", "1e-2", "--lora"]) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["dropped_rows"] == {"below min_reward": 6}
    assert summary["train_examples"] + summary["held_out_examples"] == 6 and summary["steps"] == 3
    held = summary["held_out"]
    assert held["after"]["loss"] < held["before"]["loss"]
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()  # LoRA merged
    out_text = capsys.readouterr().out
    assert "held-out (1 examples): loss" in out_text
    # No terminal here, so no bar: a line per step says it is alive and how long is left.
    assert "sft: step 1/3, " in out_text and "sft: step 3/3, " in out_text and " s left" in out_text


def _bad_inputs(tmp_path, model):
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    no_msgs = tmp_path / "nomsgs.jsonl"
    no_msgs.write_text('{"prompt": "x"}\n')
    base = ["--model", str(model), "--output", str(tmp_path / "o")]
    return {
        "missing data": ["--data", str(tmp_path / "nope.jsonl"), *base],
        "not json": ["--data", str(broken), *base],
        "no messages": ["--data", str(no_msgs), *base],
        "no assistant turn": ["--data", str(demos), *base],
        "all below min reward": ["--data", str(demos), "--min-reward", "1", *base],
        "bad eval fraction": ["--data", str(demos), "--eval-fraction", "1.5", *base],
        "missing model dir": ["--data", str(demos), "--model", "./no/such/model", "--output", "o"],
        "unknown flag": ["--data", str(demos), *base, "--epocs", "2"],
        "no output": ["--data", str(demos), "--model", str(model)],
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing data",
        "not json",
        "no messages",
        "no assistant turn",
        "all below min reward",
        "bad eval fraction",
        "missing model dir",
        "unknown flag",
        "no output",
    ],
)
def test_sft_bad_input_is_one_error_line(tmp_path, tokenizer_dir, capsys, case):
    status = tracerl(["sft", *_bad_inputs(tmp_path, tokenizer_dir)[case]])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("error: "), err
