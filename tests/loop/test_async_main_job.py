"""The main job with one flag, ``python -m examples.main --async``, with tiny settings: it runs end to end."""

from __future__ import annotations

import json
import random
import re

import pytest

from tests.support.main_job import OURS

pytest.importorskip("trl")


# The asynchronous loop's own lines, besides the main job's.
ASYNC = re.compile(
    r"^(validation of version \d+: |version \d+: \d+ groups, staleness |the collector's sample budget)"
)


@pytest.mark.slow
def test_main_job_runs_async_with_one_flag(tmp_path, monkeypatch, capfd):
    import examples.arithmetic.task as task_mod
    from examples.main import main

    rng = random.Random(0)
    monkeypatch.setattr(task_mod, "reward_fn", lambda task, answer: float(rng.random() < 0.5))
    out = tmp_path / "run"
    argv = [
        "--async", "--agent", "openai", "--out", str(out), "--seed", "0", "--rounds", "1",
        "--sft-steps", "10", "--sft-batch", "8", "--n-sft", "40", "--n-train", "8", "--n-eval", "4",
        "--eval-samples", "1", "--tasks-per-round", "4", "--group-size", "4", "--workers", "8",
        "--sync-every", "1",
    ]  # fmt: skip
    result = main(argv)
    printed, err = capfd.readouterr()
    stray = [x for x in printed.splitlines() if x and not (OURS.match(x) or ASYNC.match(x))]
    assert stray == [] and [x for x in err.splitlines() if x.strip() and not x.startswith("tracerl: ")] == []
    assert printed.strip().splitlines()[-1].startswith("held-out success: ")
    assert result["settings"]["loop"]["mode"] == "async" and result["settings"]["loop"]["max_samples"] == 16
    evals = [r for r in result["rows"] if r.get("kind") == "eval"]
    assert evals[0]["policy_version"] == 0 and all(r["val_success"] is not None for r in evals)
    trained = [json.loads(x) for x in (out / "trained_samples.jsonl").read_text().splitlines()]
    dropped = [json.loads(x) for x in (out / "dropped_samples.jsonl").read_text().splitlines()]
    assert len(trained) + len(dropped) == 16  # the sample budget, every sample accounted for
