"""Groups that cannot complete in the asynchronous loop are re-run or dropped with a reason, never waited on
for ever: after kill -9 with every group part-done (and a spent sample budget) the same command finishes;
groups that lost a sample's reward and were given back by the trainer are offered again; the loop ends with
every completed sample trained or dropped. Every wait is bounded: a hang fails the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sdk.rollout import read_results
from tests.support.loop import async_config, check_run
from trainers.data.stream import StreamingSource

pytest.importorskip("trl")


def _start(cfg_path: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    here = Path(__file__).parent
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(here.parent.parent), str(here)])}
    return subprocess.Popen(
        [sys.executable, "-m", "trainers.loop", str(cfg_path)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, log: Path, limit_s: float) -> str:
    """Wait for ``proc`` (killed, and the test failed, after ``limit_s``); its exit status must be 0."""
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the loop hung (killed after {limit_s} s):\n{log.read_text()[-3000:]}")
    assert code == 0, log.read_text()
    return log.read_text()


def _accounted(out: Path) -> dict[tuple[str, str, int], str]:
    """Every (rollout, task, sample) trained (``"trained"``) or dropped (its reason); none in both."""
    lines = [json.loads(x) for x in (out / "trained_samples.jsonl").read_text().splitlines()]
    got = {(t["rollout"], t["task_id"], t["sample"]): "trained" for t in lines}
    for x in (out / "dropped_samples.jsonl").read_text().splitlines():
        d = json.loads(x)
        key = (d["rollout"], d["task_id"], d["sample"])
        assert key not in got, f"{key} both trained and dropped"
        got[key] = d["reason"]
    return got


@pytest.mark.slow
def test_kill_9_with_every_group_part_done_and_the_budget_spent_then_the_same_command_finishes(
    tmp_path, tiny_model_dir
):
    # 4 tasks x G 4 = the whole budget; the 4th sample of each group is held, so at the kill 12 samples have
    # ended, 4 are cut, no group is whole and no task is left to hand out: the same command must run the 4
    # again (the old loop waited for ever for groups whose tasks never came round).
    cfg = async_config(
        tmp_path, str(tiny_model_dir), agent="loop_agents:solve_or_hold", max_versions=None, max_samples=16,
        max_staleness=4, eval_tasks=None,
    )  # fmt: skip
    out = Path(cfg["out"])
    cfg_path = tmp_path / "loop.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    hold = tmp_path / "hold"
    hold.touch()
    env = {"LOOP_TEST_HOLD": str(hold)}
    proc = _start(cfg_path, tmp_path / "first.log", env)
    results = out / "rollouts" / "stream.jsonl"
    deadline = time.time() + 120
    while len(read_results(results)) < 12:
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "12 samples never ended"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "state.json").exists()  # no group was whole: nothing trained
    hold.unlink()

    again = _start(cfg_path, tmp_path / "second.log", env)
    _finish(again, tmp_path / "second.log", 180)
    got = check_run(out, 4, str(tiny_model_dir))
    assert got["state"]["version"] >= 1
    rows = read_results(results)
    pairs = Counter((r["task_id"], r["sample"]) for r in rows)
    assert len(pairs) == 16 and set(pairs.values()) == {1}  # the budget, each sample once
    cut = [s for s in got["sessions"].values() if s.superseded]
    assert len(cut) == 4 and {s.sample % 4 for s in cut} == {3}  # the held samples, run again
    # The collector has ended: every completed sample is trained or dropped with its reason, none waits.
    accounted = _accounted(out)
    rollout = {s.metadata["rollout"] for s in got["sessions"].values() if s.metadata.get("split") == "train"}
    assert len(rollout) == 1
    assert set(accounted) == {(*rollout, t, k) for t, k in pairs}


@pytest.mark.slow
def test_a_reward_missing_in_every_group_is_dropped_and_the_rest_of_the_group_trained(
    tmp_path, tiny_model_dir
):
    # One sample in four never gets a reward; the trainer gives back the groups it has no room for this
    # version. Those groups must come back (the old source waited for their dropped sample for ever, the
    # collector then waited for room: the loop stopped after version 2).
    cfg = async_config(
        tmp_path, str(tiny_model_dir), agent="loop_agents:solve_reward_3_of_4", reward_fn=None,
        max_versions=4, max_staleness=2, eval_tasks=None,
    )  # fmt: skip
    out = Path(cfg["out"])
    cfg_path = tmp_path / "loop.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    _finish(_start(cfg_path, tmp_path / "loop.log"), tmp_path / "loop.log", 180)
    got = check_run(out, 2, str(tiny_model_dir))
    assert got["state"]["version"] == 4
    accounted = _accounted(out)
    trained = [k for k, r in accounted.items() if r == "trained"]
    assert trained and all(k[2] % 4 != 3 for k in trained)
    assert all(accounted[(r, t, k - k % 4 + 3)] == "no_reward_after_wait" for r, t, k in trained)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    per_version = {r["policy_version"]: r["samples_dropped"] for r in rows if r["kind"] == "train"}
    counted = sum(d.get("no_reward_after_wait", 0) for d in per_version.values())
    assert counted == Counter(accounted.values())["no_reward_after_wait"]
    # Nothing is stuck: a source on the saved cursor, told that nothing more will come, decides every group
    # left (the groups given back at the end are offered again, with their unrewarded sample still dropped).
    cursor = json.loads(Path(got["state"]["cursor"]).read_text())
    source = StreamingSource(out / "store", group_size=4, max_staleness=2, state=cursor)
    rest = source.poll(got["state"]["version"], closed=True)
    for g in rest.groups:
        accounted.update({(s.metadata["rollout"], g.task_id, s.sample): "offered" for s in g.sessions})
    accounted.update({(d["rollout"], d["task_id"], d["sample"]): d["reason"] for d in rest.dropped_samples})
    assert rest.pending == 0
    ended = {
        (s.metadata["rollout"], s.task_id, s.sample)
        for s in got["sessions"].values()
        if s.metadata.get("split") == "train" and s.ended_at is not None and not s.superseded
    }
    assert ended == set(accounted)
    # A group trained or offered is whole: its unrewarded sample dropped, the other three taken together
    # (a group cut by the end of the run, samples never started, is dropped as group_incomplete).
    taken = {(r, t, k // 4) for (r, t, k), why in accounted.items() if why in ("trained", "offered")}
    for r, t, b in taken:
        got_group = {k: accounted.get((r, t, k)) for k in range(4 * b, 4 * b + 4)}
        assert got_group[4 * b + 3] == "no_reward_after_wait" and all(
            why in ("trained", "offered") for k, why in got_group.items() if k != 4 * b + 3
        ), got_group
    assert set(accounted.values()) <= {
        "trained",
        "offered",
        "no_reward_after_wait",
        "no_reward_spread",
        "group_incomplete",
        "stale",
    }
