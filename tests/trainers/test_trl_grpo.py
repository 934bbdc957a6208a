"""Replay GRPO through TRL on a tiny local model: learning signal, masks, clipping contract, resume, LoRA."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from tests.support.synth import cpu_grpo, make_episode, make_episodes

pytestmark = pytest.mark.slow


def seq_logp(model, sequence):
    """Mean log-prob of the sequence's model tokens (loss_mask == 1) under ``model``."""
    import torch

    ids = torch.tensor([sequence.prompt_ids + sequence.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    comp = logps[len(sequence.prompt_ids) - 1 :]
    mask = torch.tensor(sequence.loss_mask, dtype=torch.float32)
    return float((comp * mask).sum() / mask.sum())


def policy_logprobs_episodes(model, tok, n_tasks=2, per_task=4):
    """Token-faithful episodes whose stored logprobs are the model's own (behaviour = initial policy)."""
    import torch

    from trainers.data import convert_episode

    eps = make_episodes(n_tasks, per_task, tokenizer=tok)
    for ep in eps:
        s = convert_episode(ep, tok).sequences[0]
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(
                -1, ids[0, 1:, None]
            )[:, 0]
        comp = lp[len(s.prompt_ids) - 1 :].tolist()
        pos = 0
        spans = [i for i, m in enumerate(s.loss_mask) if m]
        for t in ep["turns"]:
            n = len(t["token_ids"])
            t["logprobs"] = [comp[i] for i in spans[pos : pos + n]]
            pos += n
    return eps


def config(tmp_path, model_dir, **kw):
    from trainers.trl import TRLGRPOConfig

    grpo = cpu_grpo(**kw.pop("grpo", {}))
    return TRLGRPOConfig(model=str(model_dir), output_dir=str(tmp_path / "run"), grpo=grpo, **kw)


def metrics(path):
    return [json.loads(line) for line in open(path)]


def test_replay_raises_logprob_of_rewarded_completions(tmp_path, tiny_model_dir, model_tokenizer):
    from transformers import AutoModelForCausalLM

    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    eps = make_episodes(2, 4, tokenizer=tok)
    cfg = config(tmp_path, tiny_model_dir, grpo={"max_steps": 4, "learning_rate": 3e-3, "loss_type": "grpo"})
    trainer = TRLGRPOTrainer()
    prepared = trainer.prepare(eps, cfg, tokenizer=tok)
    sequences = [s for g in prepared.groups for s in g.sequences]
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lp0 = [seq_logp(before, s) for s in sequences]
    result = trainer.train(eps, cfg, tokenizer=tok, prepared=prepared)
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    lp1 = [seq_logp(after, s) for s in sequences]
    up_good = [b - a for a, b, s in zip(lp0, lp1, sequences, strict=True) if s.reward == 1.0]
    up_bad = [b - a for a, b, s in zip(lp0, lp1, sequences, strict=True) if s.reward == 0.0]
    gain = sum(up_good) / len(up_good) - sum(up_bad) / len(up_bad)
    assert result.global_step == 4
    assert gain > 0.05, (up_good, up_bad)
    rows = metrics(result.metrics_path)
    assert [r["reward"] for r in rows if "reward" in r] == [0.5] * 4  # stored rewards, replayed as is


def test_env_mask_reaches_trl_and_tool_tokens_get_no_gradient(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    eps = make_episodes(2, 4, tokenizer=tok)
    # No behaviour logprobs: ratio 1, nothing clipped, so every model token must get a gradient.
    cfg = config(
        tmp_path,
        tiny_model_dir,
        behaviour_logprobs=False,
        grpo={"loss_type": "dapo", "per_device_train_batch_size": 8},
    )
    built = TRLGRPOTrainer().build_trainer(eps, cfg, tokenizer=tok)
    trainer = built.trainer
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._generate_and_score_completions(batch)

    # TRL's tool_mask is our loss_mask (TRL's env_mask), row for row, and zeros sit exactly on the tool-result spans
    by_episode = {s.episode_id: s for g in built.prepared.groups for s in g.sequences}
    for i, row in enumerate(batch):
        s = by_episode[row["episode_id"]]
        n = len(s.completion_ids)
        assert inputs["completion_ids"][i, :n].tolist() == s.completion_ids
        assert inputs["tool_mask"][i, :n].tolist() == s.loss_mask
        zero_text = tok.decode([t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if not m])
        assert "<tool_response>" in zero_text and "temperature" in zero_text
        one_text = tok.decode([t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if m])
        assert "<tool_response>" not in one_text

    # d loss / d logp is zero on tool tokens and non-zero on model tokens
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def spy(*a, **kw):
        logps, ent, aux = original(*a, **kw)
        if torch.is_grad_enabled():
            logps.retain_grad()
            captured["logps"] = logps
        return logps, ent, aux

    trainer._get_per_token_logps_and_entropies = spy
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grad = captured["logps"].grad
    cm, tm = inputs["completion_mask"].bool(), inputs["tool_mask"].bool()
    assert grad[cm & ~tm].abs().max().item() == 0.0
    assert (grad[cm & tm].abs() > 0).float().mean().item() > 0.99

    # perturbing the labels (logps) at tool positions leaves the loss unchanged
    def perturbed(*a, **kw):
        logps, ent, aux = original(*a, **kw)
        noise = torch.randn_like(logps) * 5 * (cm & ~tm).float()
        return logps + noise, ent, aux

    with torch.no_grad():
        trainer._get_per_token_logps_and_entropies = original
        base = trainer.compute_loss(trainer.model, inputs).item()
        trainer._get_per_token_logps_and_entropies = perturbed
        noisy = trainer.compute_loss(trainer.model, inputs).item()
    assert noisy == pytest.approx(base, abs=1e-6)


def test_contract_behaviour_logprob_clipping_is_nonzero(tmp_path, tiny_model_dir, model_tokenizer):
    """Pins TRL's private API: stored behaviour logprobs must drive the clipped ratio (trl==1.16.0)."""
    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    # stored logprobs from "another policy" (random) → the ratio is far from 1 at the first step
    eps = make_episodes(2, 4, tokenizer=tok)
    res = TRLGRPOTrainer().train(
        eps, config(tmp_path / "a", tiny_model_dir, grpo={"max_steps": 1, "loss_type": "grpo"}), tokenizer=tok
    )
    first = metrics(res.metrics_path)[0]
    assert first["clip_ratio/region_mean"] > 0.05 and first["replay/behaviour_token_frac"] == 1.0

    # the same data without behaviour logprobs: ratio 1, no clipping
    res = TRLGRPOTrainer().train(
        eps,
        config(
            tmp_path / "b",
            tiny_model_dir,
            behaviour_logprobs=False,
            grpo={"max_steps": 1, "loss_type": "grpo"},
        ),
        tokenizer=tok,
    )
    first = metrics(res.metrics_path)[0]
    assert first["clip_ratio/region_mean"] == 0.0 and "replay/behaviour_token_frac" not in first


def test_behaviour_equals_initial_policy_clips_only_after_updates(tmp_path, tiny_model_dir, model_tokenizer):
    from transformers import AutoModelForCausalLM

    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    eps = policy_logprobs_episodes(model, tok)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        grpo={"max_steps": 4, "num_iterations": 2, "loss_type": "grpo", "learning_rate": 2e-2},
    )
    res = TRLGRPOTrainer().train(eps, cfg, tokenizer=tok)
    clips = [r["clip_ratio/region_mean"] for r in metrics(res.metrics_path) if "clip_ratio/region_mean" in r]
    assert clips[0] < 0.01  # ratio ≈ 1 before any update
    assert max(clips[1:]) > 0.0


def test_resume_reaches_same_step_count_and_weights(tmp_path, tiny_model_dir, model_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    eps = make_episodes(2, 4, tokenizer=tok)
    common = {
        "save_strategy": "steps",
        "save_steps": 2,
        "lr_scheduler_type": "constant",
        "loss_type": "grpo",
        "per_device_train_batch_size": 4,
    }
    full = TRLGRPOTrainer().train(
        eps, config(tmp_path / "full", tiny_model_dir, grpo={**common, "max_steps": 3}), tokenizer=tok
    )
    part_cfg = config(tmp_path / "part", tiny_model_dir, grpo={**common, "max_steps": 2})
    part = TRLGRPOTrainer().train(eps, part_cfg, tokenizer=tok)  # "interrupted" after step 2
    assert part.global_step == 2 and (tmp_path / "part" / "run" / "checkpoint-2").is_dir()
    resumed_cfg = config(tmp_path / "part", tiny_model_dir, resume="latest", grpo={**common, "max_steps": 3})
    resumed = TRLGRPOTrainer().train(eps, resumed_cfg, tokenizer=tok)
    assert resumed.global_step == full.global_step == 3
    steps = [r["step"] for r in metrics(resumed.metrics_path) if "loss" in r]
    assert steps == [1, 2, 3]  # metrics.jsonl appended across the interruption
    a = AutoModelForCausalLM.from_pretrained(full.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_per_turn_groups_train_with_precomputed_advantages(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    eps = make_episodes(2, 4)
    cfg = config(tmp_path, tiny_model_dir, per_turn="always", grpo={"max_steps": 2, "loss_type": "grpo"})
    built = TRLGRPOTrainer().build_trainer(eps, cfg, tokenizer=tok)
    trainer = built.trainer
    assert len(built.units) == 4 and all(
        len(u.seqs) == 4 for u in built.units
    )  # 8 sequences per group → 2 units
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    out = trainer._generate_and_score_completions(batch)
    expected = torch.tensor([float(r["replay_advantage"]) for r in batch])
    assert torch.allclose(out["advantages"].cpu(), expected)
    adv = 0.5 / (statistics.stdev([1, 0, 1, 0]) + 1e-4)  # rewards 1/0/1/0: (r - mean) / (std + 1e-4)
    assert {round(x, 4) for x in expected.tolist()} == {round(adv, 4), round(-adv, 4)}
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    changed = sum(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    assert changed > 0


def test_curriculum_starts_easy_and_expands(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    # 4 tasks with mean rewards 0.75 / 0.5 / 0.25 / ... : easy = high mean reward
    eps = []
    for t, rewards in enumerate([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0.5, 0, 0, 0]]):
        eps += [make_episode(t, i, good=r > 0, reward=float(r)) for i, r in enumerate(rewards)]
    cfg = config(
        tmp_path,
        tiny_model_dir,
        curriculum=True,
        curriculum_start=0.25,
        curriculum_expand_every=2,
        curriculum_expand_by=0.25,
        grpo={"max_steps": 4, "per_device_train_batch_size": 4},
    )
    built = TRLGRPOTrainer().build_trainer(eps, cfg, tokenizer=tok)
    trainer = built.trainer
    cur = trainer._curriculum
    assert [built.units[i].group.task_id for i in cur.order] == ["task-0", "task-1", "task-2", "task-3"]
    assert [cur.available(s) for s in (0, 1, 2, 4, 6, 8)] == [1, 1, 2, 3, 4, 4]
    sampler = trainer._get_train_sampler()
    first = list(sampler)[:4]
    assert set(first) == {cur.order[0]}  # only the easiest group at the start
    trainer.train()
    rows = metrics(built.metrics_path)
    avail = [
        r["curriculum/groups_available"] for r in rows if "curriculum/groups_available" in r and "loss" in r
    ]
    assert avail[0] == 1 and avail[-1] > 1


def test_lora_adapter_and_heldout_eval(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    eps = make_episodes(3, 4, tokenizer=tok)
    cfg = config(
        tmp_path,
        tiny_model_dir,
        lora=True,
        lora_r=4,
        lora_alpha=8,
        eval_fraction=0.34,
        eval_steps=1,
        grpo={"max_steps": 2, "per_device_train_batch_size": 4},
    )
    res = TRLGRPOTrainer().train(eps, cfg, tokenizer=tok)
    assert res.adapter and (res.checkpoint / "adapter_config.json").is_file()
    assert res.report.eval_groups == 1 and res.report.groups == 2
    evals = [r for r in metrics(res.metrics_path) if "eval/logp_mean" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(math.isfinite(r["eval/logp_gap"]) for r in evals)


def test_training_samples_api(tmp_path, tiny_model_dir, model_tokenizer):
    """The Trainer protocol also takes prebuilt TrainingSequences."""
    from trainers.data import convert_episodes
    from trainers.trl import TRLGRPOTrainer

    tok = model_tokenizer
    convs, _ = convert_episodes(make_episodes(2, 4, tokenizer=tok), tok)
    sequences = [s for c in convs for s in c.sequences]
    res = TRLGRPOTrainer().train(
        sequences, config(tmp_path, tiny_model_dir, grpo={"max_steps": 1}), tokenizer=tok
    )
    assert res.global_step == 1
