"""The rollout runner on a local Ray head (``ray_head`` in tests/conftest.py): the arithmetic agent's samples
run as Ray tasks give the same counts as a local run; re-running skips what is done; bounded concurrency."""

from __future__ import annotations

import dataclasses

import pytest

from examples.arithmetic.task import make_splits, write_tasks
from sdk.rollout import RolloutSpec, read_results, run_rollout
from sdk.store import StoreReader

pytestmark = pytest.mark.ray

AGENT = "examples.arithmetic.agent:solve_openai"
REWARD = "examples.arithmetic.task:reward_fn"


def test_arithmetic_rollout_on_ray_matches_local(ray_head, openai_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACERL_POLICY_BASE_URL", openai_server.base_url)  # passed on to the Ray workers
    tasks = write_tasks(make_splits(0, n_train=4, n_eval=1, n_sft=1)["train"], tmp_path / "tasks.jsonl")
    spec = RolloutSpec(AGENT, group_size=3, concurrency=2, reward_fn=REWARD, timeout=60)
    local = run_rollout(spec, tasks, store=tmp_path / "local", results=tmp_path / "local.jsonl")
    on_ray = run_rollout(
        spec, tasks, store=tmp_path / "ray", results=tmp_path / "ray.jsonl", ray=ray_head.gcs
    )
    assert on_ray.total == local.total == 12 and on_ray.done == on_ray.ran == 12
    assert on_ray.counts == local.counts and on_ray.success_rate == local.success_rate
    assert on_ray.task_rewards == local.task_rewards

    # Every (task, sample) once in the store, written by the workers' own segments.
    sessions = [s for s in StoreReader(tmp_path / "ray").sessions() if not s.implicit]
    assert sorted((s.task_id, s.sample) for s in sessions) == sorted(
        (r["task_id"], r["sample"]) for r in read_results(tmp_path / "ray.jsonl")
    )
    assert all(s.status == "ok" and s.calls for s in sessions)

    # Re-running the same command skips what is done, on the cluster as locally.
    again = run_rollout(spec, tasks, store=tmp_path / "ray", results=tmp_path / "ray.jsonl", ray=ray_head.gcs)
    assert again.ran == 0 and again.done == 12 and again.counts == local.counts

    # A partial re-run (here: one more sample per task) runs only what is missing.
    more = run_rollout(
        dataclasses.replace(spec, group_size=4),
        tasks,
        store=tmp_path / "ray",
        results=tmp_path / "ray.jsonl",
        ray=ray_head.gcs,
    )
    assert more.ran == 4 and more.done == more.total == 16
    assert sorted(r["sample"] for r in read_results(tmp_path / "ray.jsonl")).count(3) == 4
