"""Smoke test of the main job (``python -m examples.main``) with tiny settings: it runs end to end.

It checks the plumbing (SFT → loop: serve → ``sdk.rollout`` in sessions → export → ``sdk.train`` → reload →
validate → table, ``results.json``, ``progress.png``), not that the policy improves: a 10-step SFT policy
never succeeds, so the reward function is replaced by a coin flip to give the groups reward spread and make
a GRPO round actually train.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from tests.support.main_job import OURS

pytest.importorskip("trl")
pytest.importorskip("langchain")


def assert_only_our_lines(out: str, err: str) -> None:
    assert [line for line in out.splitlines() if line and not OURS.match(line)] == []
    assert [
        line for line in re.split(r"[\r\n]", err) if line.strip() and not line.startswith("tracerl: ")
    ] == []


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["openai", "langchain"])
def test_main_job_runs_end_to_end(
    agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import examples.arithmetic.task as task_mod
    from examples.main import main

    rng = random.Random(0)
    monkeypatch.setattr(task_mod, "reward_fn", lambda task, answer: float(rng.random() < 0.5))
    out = tmp_path / "run"
    argv = [
        "--agent", agent, "--out", str(out), "--seed", "0", "--rounds", "1",
        "--sft-steps", "10", "--sft-batch", "8", "--n-sft", "40", "--n-train", "8", "--n-eval", "4",
        "--eval-samples", "1", "--tasks-per-round", "4", "--group-size", "4", "--epochs", "1", "--workers", "8",
    ]  # fmt: skip
    result = main(argv)
    printed, err = capfd.readouterr()
    assert_only_our_lines(printed, err)  # no third-party bar, log or warning between the table's rows
    assert printed.strip().splitlines()[-1].startswith("held-out success: ")
    assert "round  validation" in printed
    saved = json.loads((out / "results.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"], default=str))
    assert [r["round"] for r in saved["rows"]] == [0, 1]
    row = saved["rows"][1]
    assert row["samples"] == 16 and row["groups"] > 0 and row["steps"] > 0
    # The resident trainer's weights went to the server as tensors; its checkpoint and final weights are on disk.
    assert row["push_bytes"] > 0 and (out / "train" / "final").is_dir()
    assert (out / "train" / f"checkpoint-{row['steps']}").is_dir()
    # The round's groups with reward spread trained; the other samples are dropped with their reason.
    trained = (out / "trained_samples.jsonl").read_text().splitlines()
    dropped = (out / "dropped_samples.jsonl").read_text().splitlines()
    assert len(trained) == 4 * row["groups"] and len(trained) + len(dropped) == 16
    assert (out / "progress.png").stat().st_size > 0
    # Every (task, sample) of the round ran once, in its own session.
    lines = [json.loads(x) for x in (out / "rollouts" / "round-1.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["sample"]) for r in lines) == sorted(
        (f"train-{t}", k) for t in range(4) for k in range(4)
    )
    assert len({r["session_id"] for r in lines}) == 16

    # Re-running the same command continues after the last finished round: nothing runs again.
    main(argv)
    assert [r["round"] for r in json.loads((out / "results.json").read_text())["rows"]] == [0, 1]
    printed, err = capfd.readouterr()
    assert "reusing the SFT checkpoint" in printed
    assert_only_our_lines(printed, err)
