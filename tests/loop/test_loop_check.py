"""``tracerl train --loop loop.yaml --check`` on the tiny model: the loop's own policy server, a few samples,
the lines that say whether a run can learn, exit 0, and nothing of it left for the run to train on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from trainers.loop import main

pytest.importorskip("openai")


def _tasks(path: Path, prefix: str, n: int) -> str:
    path.write_text(
        "".join(json.dumps({"id": f"{prefix}-{i}", "q": f"{i} plus {i}"}) + "\n" for i in range(n))
    )
    return str(path)


def test_the_loop_check_runs_samples_on_its_policy_server_and_says_no_group_has_spread(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    monkeypatch.setenv("LOOP_TEST_FLAT", "1")  # every reward 0: no group has spread
    import sdk

    # A user who configured nothing: the default store ./.tracerl, not created yet (the check must not make it).
    monkeypatch.chdir(tmp_path)
    sdk.configure(store=".tracerl")
    (tmp_path / ".tracerl").rmdir()
    out = tmp_path / "loop"
    config = {
        "agent": "loop_agents:solve",
        "reward_fn": "loop_agents:coin_until_flat",
        "tasks": _tasks(tmp_path / "train.jsonl", "train", 6),
        "eval_tasks": _tasks(tmp_path / "eval.jsonl", "eval", 10),
        "eval_subset": 4,
        "model": str(tiny_model_dir),
        "out": str(out),
        "tasks_per_round": 4,
        "group_size": 2,
        "concurrency": 4,
        "train": {"lora": True, "grpo": {"use_cpu": True}},
    }
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main([str(path), "--check"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("check: 4 samples (2 tasks x 2)"), text
    assert sum("no spread: no signal" in ln for ln in lines) == 2
    assert "model calls per sample  1.0" in text
    # The tiny model's words are random: under load the server batches its requests differently, and a
    # sample may open a tool call by chance, so the counts are not fixed; the line is.
    assert re.search(r"^  tool calls +\d+ parsed, \d+ malformed", text, re.M), text
    assert any(
        ln.startswith("  one round's collection") and "(8 samples at concurrency 4)" in ln for ln in lines
    )
    assert any(ln.startswith("  a validation") and "(4 samples" in ln for ln in lines)  # the subset
    assert any(ln.startswith("  first/last validation") and "(10 samples" in ln for ln in lines)
    assert "GB this process" in text and "GB the policy server" in text
    verdict = [ln for ln in lines if ln.startswith("verdict: ")]
    assert any("no group has reward spread and no sample scored" in v and "tracerl sft" in v for v in verdict)
    assert any(v.startswith("verdict: one round takes ~") and "plus its training" in v for v in verdict)
    # The held-out tasks ran too (as many as the training tasks), scored beside the training ones.
    assert "verdict: held-out: 2 tasks x 2 samples, mean reward 0.00 (training tasks 0.00)" in text, text
    assert not any("score far below" in v for v in verdict)
    # Nothing for the run: no metrics, no round, no loop store; the check's samples are in out/check.
    assert not (out / "metrics.jsonl").exists() and not (out / "store").exists()
    assert not (out / "policy-server.pid").exists()
    assert not (tmp_path / ".tracerl").exists()


def test_the_loop_check_says_when_the_held_out_tasks_score_far_below_the_training_tasks(
    tmp_path, tiny_model_dir, capsys
):
    out = tmp_path / "loop"
    config = {
        "agent": "loop_agents:solve",
        "reward_fn": "loop_agents:training_tasks_only",  # the first training tasks were "demonstrated"
        "tasks": _tasks(tmp_path / "train.jsonl", "train", 4),
        "eval_tasks": _tasks(tmp_path / "eval.jsonl", "eval", 4),
        "model": str(tiny_model_dir),
        "out": str(out),
        "group_size": 2,
        "concurrency": 4,
    }
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main([str(path), "--check", "1"]) == 0
    text = capsys.readouterr().out
    assert "verdict: held-out: 1 task x 2 samples, mean reward 0.00 (training tasks 1.00)" in text, text
    assert "the held-out tasks score far below the first training tasks" in text
    # The held-out samples are the check's own too: in out/check/held-out, nothing in the loop's store.
    assert (out / "check" / "held-out" / "check.jsonl").is_file() and not (out / "store").exists()
