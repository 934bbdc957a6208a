"""The asynchronous loop on the tiny model: versions, staleness bound, versions on every trained turn, TIS."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.loop import async_config, check_run
from tests.support.loop import read_jsonl as _jsonl
from trainers import UserError
from trainers.loop import LoopConfig, run_loop

pytest.importorskip("trl")
pytest.importorskip("openai")


def _logps(model_dir: str, prompt: list[int], completion: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def check_tis_batch(out: Path, model: str) -> None:
    """The resident trainer's first batch: TIS weights equal min(exp(π_prox − π_behaviour), cap) by a forward
    pass of the starting model (π_prox: the policy at the start of the batch)."""
    start = model
    rows = _jsonl(out / "train" / "tis_batch.jsonl")
    assert rows
    for r in rows:
        policy = _logps(start, r["prompt_ids"], r["completion_ids"])
        for w, p, b, m in zip(r["weights"], policy, r["behaviour"], r["loss_mask"], strict=True):
            expected = 1.0 if not m or b is None else min(math.exp(p - b), r["cap"])
            assert w == pytest.approx(expected, rel=1e-3, abs=1e-4)


@pytest.mark.slow
def test_async_loop_bounds_staleness_and_versions_every_trained_turn(tmp_path, tiny_model_dir):
    cfg = async_config(tmp_path, str(tiny_model_dir))
    out = Path(cfg["out"])
    result = run_loop(cfg, quiet=True)
    assert result["version"] == 3
    got = check_run(out, 1, str(tiny_model_dir))
    assert {t["policy_version"] for t in got["trained"]} == {1, 2, 3}
    check_tis_batch(out, str(tiny_model_dir))
    rows = [r for r in _jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    # The trainer was built once; every version's weights were pushed (the full model: tens of kB here).
    assert [r["build_s"] > 0 for r in rows] == [True] + [False] * (len(rows) - 1)
    assert all(r["push_bytes"] > 0 and r["push_s"] >= 0 and r["checkpoint_s"] > 0 for r in rows)
    assert result["checkpoint"] == str(out / "train" / "final-merged")
    evals = [r for r in _jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert {0, 3} <= {r["policy_version"] for r in evals} and all(r["val_success"] is not None for r in evals)
    assert (out / "progress.png").stat().st_size > 0
    assert run_loop(cfg, quiet=True)["version"] == 3  # finished: the same command changes nothing
    # Killed after the last commit, before its validation (issue 38 item 12): the same command validates
    # the final weights and draws the plot, and trains nothing more.
    metrics = _jsonl(out / "metrics.jsonl")
    kept = [r for r in metrics if not (r["kind"] == "eval" and r["policy_version"] == 3)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    (out / "progress.png").unlink()
    again = run_loop(cfg, quiet=True)
    assert again["version"] == 3
    finals = [r for r in _jsonl(out / "metrics.jsonl") if r["kind"] == "eval" and r["policy_version"] == 3]
    assert len(finals) == 1 and finals[0]["val_success"] is not None
    assert (out / "progress.png").stat().st_size > 0
    assert [r for r in _jsonl(out / "metrics.jsonl") if r["kind"] == "train"] == rows


def test_async_settings_are_checked_before_anything_loads():
    base = {"agent": "a:f", "tasks": "t", "model": "m", "mode": "async"}
    for bad in (
        {"max_staleness": -1},
        {"sync_every": 0},
        {"reward_wait_s": -1},
        {"mode": "later"},
        {"curriculum": True},
        {"tis_cap": 0},
    ):
        with pytest.raises(UserError):
            LoopConfig.from_mapping({**base, **bad})
    assert LoopConfig.from_mapping(base).max_staleness == 2


@pytest.mark.slow
def test_the_sample_budget_ends_the_run_with_every_sample_accounted_for(tmp_path, tiny_model_dir):
    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=None, max_samples=24, eval_tasks=None)
    out = Path(cfg["out"])
    result = run_loop(cfg, quiet=True)
    got = check_run(out, 1, str(tiny_model_dir))
    assert result["version"] >= 1
    # 24 samples = 6 tasks x G 4, once each: every one trained or dropped with its reason, none left over.
    from sdk.rollout import read_results

    ran = [r for p in (out / "rollouts").glob("stream*.jsonl") for r in read_results(p)]
    assert len(ran) == 24
    ledger = {(t["rollout"], t["task_id"], t["sample"]) for t in got["trained"]} | set(got["dropped"])
    assert len(ledger) == 24


@pytest.mark.slow
def test_late_rewards_from_a_scoring_job_reach_training(tmp_path, tiny_model_dir):
    """No reward at the end of a sample: a separate scorer adds it a while later (sdk.store.add_reward)."""
    import random
    import threading
    import time

    from sdk.store import add_reward, read_sessions

    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=2, reward_wait_s=60, eval_tasks=None)
    del cfg["reward_fn"]
    out = Path(cfg["out"])
    stop = threading.Event()
    scored: dict[str, float] = {}

    def scorer() -> None:
        rng = random.Random(0)
        while not stop.is_set():
            time.sleep(0.5)
            if not (out / "store").is_dir():
                continue
            for s in read_sessions(out / "store"):
                if (
                    s.ended_at
                    and s.reward is None
                    and s.session_id not in scored
                    and time.time() > s.ended_at + 1
                ):
                    scored[s.session_id] = float(rng.random() < 0.5)
                    add_reward(out / "store", s.session_id, scored[s.session_id])

    thread = threading.Thread(target=scorer, daemon=True)
    thread.start()
    try:
        run_loop(cfg, quiet=True)
    finally:
        stop.set()
        thread.join()
    got = check_run(out, 1, str(tiny_model_dir))
    for t in got["trained"]:
        s = got["sessions"][t["session_id"]]
        assert s.reward == scored[t["session_id"]]  # the late reward is the one trained on
        assert s.rewards[-1]["ts"] > s.ended_at + 1
