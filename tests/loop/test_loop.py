"""The loop on the tiny model: 2 rounds (LoRA on the resident trainer, the adapter pushed to the server),
interrupted between rounds, resumed from the round's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.loop import final_state as _final_state
from tests.support.loop import loop_config as _config
from trainers import UserError
from trainers.loop import LoopConfig, main, run_loop, select_tasks

pytest.importorskip("trl")
pytest.importorskip("openai")


@pytest.mark.slow
def test_two_rounds_interrupted_between_rounds_then_resumed(tmp_path, tiny_model_dir, capsys):
    cfg = _config(tmp_path, str(tiny_model_dir))
    out = Path(cfg["out"])

    def stop_after_round_1(row: dict) -> None:
        if row["round"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_loop(cfg, on_round_end=stop_after_round_1)
    state = json.loads((out / "state.json").read_text())
    # A LoRA run's server starts on the base and gets the checkpoint's adapter pushed on it.
    assert state["round"] == 1 and state["checkpoint"] == str(tiny_model_dir)
    assert state["resident_checkpoint"] == str(out / "train" / "checkpoint-1") and state["version"] == 1
    first_round = (out / "rollouts" / "round-1.jsonl").read_text()

    result = run_loop(cfg)
    assert "resuming after round 1" in capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]  # each round once: round 0 and 1 were not run again
    assert (out / "rollouts" / "round-1.jsonl").read_text() == first_round
    for rnd, r in enumerate(rows[1:], start=1):
        assert r["samples"] == 8 and r["groups"] > 0 and r["steps"] == 1
        assert r["val_success"] is not None and r["policy_version"] == rnd
        assert r["val_pass_at_1"] == pytest.approx(r["val_success"]) and "val_pass_at_1_se" in r
        # The adapter's tensors went to the server (tens of kB, not the model), and a checkpoint was written.
        assert 0 < r["push_bytes"] < 200_000 and r["push_s"] >= 0 and r["checkpoint_s"] > 0
        # A LoRA round's row names its adapter (its checkpoint is the base the adapter is pushed on).
        assert r["adapter"] == str(out / "train" / f"checkpoint-{rnd}")
    assert rows[1]["curriculum_share"] == 0.5 and rows[2]["curriculum_share"] == 1.0
    # Every sample of the two rounds is trained once (by its round's version) or dropped with a reason.
    trained = [json.loads(x) for x in (out / "trained_samples.jsonl").read_text().splitlines()]
    dropped = [json.loads(x) for x in (out / "dropped_samples.jsonl").read_text().splitlines()]
    assert len(trained) == 4 * (rows[1]["groups"] + rows[2]["groups"])
    assert len(trained) + len(dropped) == 16 and {d["reason"] for d in dropped} <= {"no_reward_spread"}
    assert {(t["policy_version"], t["staleness"]) for t in trained} <= {(1, 0), (2, 0)}
    # The trainer was built in round 1 and, after the interruption, again from round 1's checkpoint.
    assert rows[1]["build_s"] > 0 and rows[2]["build_s"] > 0
    assert rows[2]["checkpoint"] == result["checkpoint"] == str(out / "train" / "final-merged")
    assert (out / "train" / "final" / "adapter_config.json").is_file()
    assert not list((out / "train").glob("round-*"))  # no per-round model on disk
    assert (out / "progress.png").stat().st_size > 0
    # Validation ran on the eval split, and nothing trained on it.
    assert {
        json.loads(x)["split"] for x in (out / "rollouts" / "eval-round-2.jsonl").read_text().splitlines()
    } == {"eval-round-2"}


def test_the_loop_trains_a_short_group_as_it_is_instead_of_resampling_it():
    """Issue 38 item 11: the loop trains a group short of samples as a smaller group, never resampled."""
    from trainers.loop.config import train_settings

    cfg = LoopConfig(agent="a:f", tasks="t", model="m")
    assert train_settings(cfg, "m", Path("o"))["group_underflow"] == "smaller"


def test_select_tasks_curriculum_ranks_by_earlier_rewards():
    pool = [{"id": str(i)} for i in range(8)]
    cfg = LoopConfig(
        agent="a:f", tasks="t", model="m", curriculum=True, curriculum_start=0.5, curriculum_expand_every=2
    )
    history = {"0": [0.0], "1": [1.0, 1.0], "2": [0.5], "3": [0.0]}
    uses = {"1": 1, "2": 1}
    chosen, share = select_tasks(pool, 1, 2, history=history, uses=uses, share=cfg.curriculum_share(1))
    assert share == 0.5
    # easiest first: 1 (1.0), then 2 (0.5) and the untried ones at the average (0.375) in file order
    assert [t["id"] for t in chosen] == ["4", "5"]  # least used among the available half
    assert [cfg.curriculum_share(r) for r in (3, 9)] == [0.75, 1.0]


def test_bad_config_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    for text, msg in (
        ("agent: a:f\ntasks: t.jsonl\nmodel: m\nbogus: 1\n", "unknown loop setting(s): bogus"),
        ("agent: a:f\ntasks: t.jsonl\n", "needs model"),
        ("agent: a:f\ntasks: t.jsonl\nmodel: m\ngroup_size: 1\n", "group_size must be >= 2"),
        ("agent: a:f\ntasks: t.jsonl\nmodel: m\ntrain: {model: x}\n", "train.model is set by the loop"),
        (
            "agent: a:f\ntasks: t.jsonl\nmodel: m\ntrain: {group_underflow: resample}\n",
            "never filled with one sample twice",
        ),
        (
            "agent: a:f\ntasks: t.jsonl\nmodel: m\ntrain: {backend: openai}\n",
            "leaves no weights on this machine",
        ),
        ("agent: json:dumps\ntasks: missing.jsonl\nmodel: .\n", "task file not found"),
    ):
        path.write_text(text)
        assert main([str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and msg in err, err
    with pytest.raises(UserError, match="curriculum_start must be in"):
        LoopConfig(agent="a:f", tasks="t", model="m", curriculum=True, curriculum_start=0)


def test_the_old_samples_key_is_refused():
    """``samples`` was renamed ``group_size`` before any release: an unknown setting, not an alias."""
    from trainers.loop import LoopConfig

    base = {"agent": "a:f", "tasks": "t", "model": "m"}
    assert LoopConfig.from_mapping({**base, "group_size": 4}).group_size == 4
    with pytest.raises(UserError, match="unknown loop setting"):
        LoopConfig.from_mapping({**base, "samples": 4})


@pytest.mark.slow
def test_a_round_where_every_sample_failed_stops_and_a_rerun_retries_it(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    cfg = {**_config(tmp_path, str(tiny_model_dir)), "agent": "loop_agents:broken_until_fixed", "rounds": 1}
    cfg["curriculum"] = False
    path = tmp_path / "loop.yaml"
    path.write_text(json.dumps(cfg))
    monkeypatch.delenv("LOOP_AGENT_FIXED", raising=False)
    assert main([str(path)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "every sample of eval-round-0 failed" in err[0] and "ConnectionError" in err[0]
    assert not (Path(cfg["out"]) / "state.json").exists()  # round 0 did not finish

    monkeypatch.setenv("LOOP_AGENT_FIXED", "1")
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(x) for x in (Path(cfg["out"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1] and rows[0]["val_success"] is not None
    results = (Path(cfg["out"]) / "rollouts" / "eval-round-0.jsonl").read_text().splitlines()
    assert {json.loads(x)["status"] for x in results} == {"ok"}  # retried, not skipped as done
    assert "final: " in out and "best: " in out and (Path(cfg["out"]) / "best").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", [None, 2])  # round 1 checkpointed already, or not
def test_a_last_round_with_nothing_to_train_still_leaves_the_final_weights(
    tmp_path, tiny_model_dir, monkeypatch, checkpoint_every
):
    cfg = {**_config(tmp_path, str(tiny_model_dir)), "reward_fn": "loop_agents:coin_until_flat"}
    cfg["checkpoint_every"] = checkpoint_every
    cfg["train"]["lora"] = False
    out = Path(cfg["out"])
    monkeypatch.delenv("LOOP_TEST_FLAT", raising=False)

    def flat_after_round_1(row: dict) -> None:
        if row["round"] == 1:
            monkeypatch.setenv("LOOP_TEST_FLAT", "1")

    result = run_loop(cfg, on_round_end=flat_after_round_1, quiet=True)
    rows = result["rows"]
    assert rows[1]["steps"] == 1 and rows[2]["groups"] == 0 and rows[2]["steps"] == 0
    assert result["checkpoint"] == rows[2]["checkpoint"] == str(out / "train" / "final")
    assert (out / "train" / "final" / "config.json").is_file()
    # The last round committed (its weights are the ones round 1 trained, checkpointed): the run is done.
    state = json.loads((out / "state.json").read_text())
    assert state["round"] == 2 and state["resident_checkpoint"] == str(out / "train" / "checkpoint-1")
    assert run_loop(cfg, quiet=True)["rows"] == rows


@pytest.mark.slow
def test_kill_9_mid_round_then_the_same_command_ends_with_the_weights_of_a_run_never_killed(
    tmp_path, tiny_model_dir
):
    """Lock-step, full weights, seeded sampling: kill -9 once round 2's samples are all in (its training
    running or its checkpoint not yet written), then the same command; its final weights equal those of an
    uninterrupted run of the same configuration."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import torch
    import yaml

    def config(name: str) -> Path:
        cfg = {**_config(tmp_path / name, str(tiny_model_dir)), "agent": "loop_agents:solve_seeded"}
        cfg.update(reward_fn="loop_agents:even_length", eval_tasks=None, plot=False)
        cfg["curriculum"] = False
        cfg["train"]["lora"] = False
        cfg["train"]["grpo"]["max_steps"] = 6  # long enough a round that the kill lands inside it
        path = tmp_path / name / "loop.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    for name in ("killed", "whole"):
        (tmp_path / name).mkdir()
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent.parent), str(here)])}

    def start(cfg: Path, log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "trainers.loop", str(cfg)], stdout=(cfg.parent / log).open("w"),
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip

    killed, whole = config("killed"), config("whole")
    out = tmp_path / "killed" / "loop"
    proc = start(killed, "first.log")
    deadline = time.time() + 180
    results = out / "rollouts" / "round-2.jsonl"
    while not results.exists() or results.read_text().count("\n") < 8:  # 2 tasks x 4 samples
        assert proc.poll() is None, (killed.parent / "first.log").read_text()
        assert time.time() < deadline, "round 2 never collected"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((out / "state.json").read_text())["round"] == 1  # round 2 was not committed
    assert start(killed, "second.log").wait(timeout=240) == 0, (killed.parent / "second.log").read_text()
    assert "resuming after round 1" in (killed.parent / "second.log").read_text()
    assert start(whole, "whole.log").wait(timeout=240) == 0, (whole.parent / "whole.log").read_text()

    a, b = (
        _final_state(out / "train" / "final"),
        _final_state(tmp_path / "whole" / "loop" / "train" / "final"),
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2] and all(r["steps"] == 6 for r in rows[1:])
    assert a.keys() == b.keys()
    for k in a:  # the same up to float summation order (the samples arrive in another order)
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)


def test_malformed_tool_calls_are_counted_in_the_table_and_the_penalty_gives_rl_a_signal(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """Odd samples answer with a tool call the server could not parse; every reward is 0. The round's row
    counts them, and ``malformed_tool_call_penalty`` turns the flat groups into groups RL can learn from."""
    from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
    from trainers.loop.table import HEADER

    malformed = '<tool_call>{"name": "add", "arguments": {"a": float(1, 2)}}</tool_call>'
    cfg = {
        **_config(tmp_path, str(tiny_model_dir)),
        "agent": "loop_agents:solve_or_malformed",
        "reward_fn": "loop_agents:zero",
        "eval_tasks": None,
        "rounds": 1,
        "curriculum": False,
        "plot": False,
        "malformed_tool_call_penalty": 0.5,
    }
    with ScriptedOpenAIServer(policy=lambda request, endpoint: ScriptedResponse.text(malformed)) as server:
        monkeypatch.setenv("LOOP_TEST_MALFORMED_URL", server.base_url)
        result = run_loop(cfg)
    row = result["rows"][1]
    assert row["malformed_tool_calls"] == 4 and row["malformed_share"] == 1.0  # 2 tasks x 2 odd samples
    assert row["groups"] == 2 and row["steps"] == 1  # without the penalty: no spread, nothing trained
    out = capsys.readouterr().out
    assert HEADER in out and "malformed" in HEADER
    assert any(line.split()[:1] == ["1"] and "100.0%" in line for line in out.splitlines())
    rounds = [json.loads(x) for x in (Path(cfg["out"]) / "metrics.jsonl").read_text().splitlines()]
    assert rounds[1]["malformed_share"] == 1.0
    shaped = [
        json.loads(x)["reward"]
        for x in (Path(cfg["out"]) / "rollouts" / "round-1.jsonl").read_text().splitlines()
    ]
    assert sorted(shaped) == [-0.5] * 4 + [0.0] * 4


def test_the_penalty_must_not_reward_malformed_calls():
    with pytest.raises(UserError, match="malformed_tool_call_penalty must be a finite number >= 0"):
        LoopConfig(agent="a:f", tasks="t", model="m", malformed_tool_call_penalty=-1.0)
