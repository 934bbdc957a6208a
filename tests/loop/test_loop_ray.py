"""The lock-step loop with ``train.backend: ray``: each round trains through the trainer API as a job on a
local Ray head (``ray_head`` in tests/conftest.py), on the round's groups written to Parquet, and the policy
server serves the downloaded weights as the next version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.loop import loop_config
from trainers.loop import run_loop

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_round_trains_on_the_ray_backend_and_its_weights_are_served(ray_head, tiny_model_dir, tmp_path):
    cfg = loop_config(tmp_path, str(tiny_model_dir))
    cfg.update(rounds=1, curriculum=False, eval_tasks=None, plot=False)
    cfg["train"].update(
        backend="ray", address=ray_head.dashboard, lora=False, poll_interval=0.3, retry_base_delay=0.05
    )
    result = run_loop(cfg, quiet=True)
    out = Path(cfg["out"])
    row = result["rows"][-1]
    assert row["round"] == 1 and row["groups"] > 0 and row["steps"] > 0 and row["policy_version"] == 1
    # The round's groups with reward spread, as episodes: what the job trained on.
    assert (out / "episodes" / "round-1.parquet").is_file()
    assert (Path(row["checkpoint"]) / "config.json").is_file() and result["checkpoint"] == row["checkpoint"]
    state = json.loads((out / "state.json").read_text())
    assert state["round"] == 1 and state["version"] == 1 and state["checkpoint"] == row["checkpoint"]
    trained = [json.loads(x) for x in (out / "trained_samples.jsonl").read_text().splitlines()]
    assert len(trained) == 4 * row["groups"] and {t["policy_version"] for t in trained} == {1}
