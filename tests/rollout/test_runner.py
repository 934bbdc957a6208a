"""``sdk.rollout``: real agent functions (openai clients, wrapped) against a scripted OpenAI server."""

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

import sdk
from sdk.rollout import RolloutError, RolloutSpec, load_tasks, main, read_results, run_rollout
from sdk.store import read_sessions

pytest.importorskip("openai")

HERE = Path(__file__).parent


@pytest.fixture
def policy_env(openai_server, monkeypatch):
    monkeypatch.setenv("TRACERL_POLICY_BASE_URL", openai_server.base_url)
    return openai_server


def child_env() -> dict[str, str]:
    """The environment of a ``python -m sdk.rollout`` child: this checkout and the test agents importable."""
    path = os.pathsep.join([str(HERE), os.getcwd(), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def write_tasks(path: Path, tasks: list[dict]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


def finished_pairs(store: Path) -> Counter:
    """(task, sample) of sessions that ended normally (ok or error, not cut short)."""
    out: Counter = Counter()
    for s in read_sessions(store):
        cut = s.status == "error" and (s.error or {}).get("type") in ("CancelledError", "KeyboardInterrupt")
        if s.sample is not None and s.status in ("ok", "error") and not cut:
            out[(s.task_id, s.sample)] += 1
    return out


def test_each_sample_in_its_own_session_with_rewards(policy_env, tmp_path):
    store = tmp_path / "store"
    tasks = [{"id": f"t-{i}", "q": i} for i in range(3)]
    spec = RolloutSpec("rollout_agents:chat", group_size=2, reward_fn="rollout_agents:score", concurrency=4)
    summary = run_rollout(spec, tasks, store=store, results=tmp_path / "res.jsonl", split="train")
    assert (summary.done, summary.ran, summary.total) == (6, 6, 6)
    assert summary.counts["ok"] == 6 and summary.success_rate == pytest.approx(4 / 6)
    assert (summary.tasks_always, summary.tasks_sometimes, summary.tasks_never) == (2, 0, 1)
    sessions = {(s.task_id, s.sample): s for s in read_sessions(store)}
    assert set(sessions) == {(f"t-{i}", k) for i in range(3) for k in range(2)}
    for (tid, _), s in sessions.items():
        assert s.metadata["split"] == "train" and len(s.calls) == 1 and s.status == "ok"
        assert s.reward == (1.0 if tid != "t-1" else 0.0)
    rows = read_results(tmp_path / "res.jsonl")
    assert {r["session_id"] for r in rows} == {s.session_id for s in sessions.values()}
    assert "success rate" in summary.format_table()


def test_agent_reward_and_named_rewards(policy_env, tmp_path):
    tasks = [{"task_id": "t-0"}]  # task_id works as the id field too
    s = run_rollout(
        RolloutSpec("rollout_agents:self_rewarding", group_size=2), tasks, results=tmp_path / "a.jsonl"
    )
    assert s.mean_reward == 0.25 and s.counts["ok"] == 2
    assert read_results(tmp_path / "a.jsonl")[0]["rewards"] == {"reward": 0.25, "format": 1.0}
    s = run_rollout(
        RolloutSpec("rollout_agents:chat", reward_fn="rollout_agents:named"),
        tasks,
        results=tmp_path / "b.jsonl",
    )
    assert read_results(tmp_path / "b.jsonl")[0]["rewards"]["length"] > 0
    # No reward function and the agent gives none: counted, not a failure.
    s = run_rollout(RolloutSpec("rollout_agents:chat"), tasks, results=tmp_path / "c.jsonl")
    assert s.counts["no_reward"] == 1 and s.mean_reward is None


def test_concurrency_is_bounded_and_used(policy_env, tmp_path):
    import rollout_agents

    rollout_agents.peak = 0
    tasks = [{"id": f"t-{i}", "sleep": 0.2} for i in range(12)]
    s = run_rollout(RolloutSpec("rollout_agents:chat", concurrency=4), tasks, results=tmp_path / "r.jsonl")
    assert s.done == 12 and rollout_agents.peak == 4  # four ran at once, never more
    # async agents run on the event loop, also bounded
    s = run_rollout(RolloutSpec("rollout_agents:achat", concurrency=6), tasks, results=tmp_path / "a.jsonl")
    assert s.done == 12 and s.counts["no_reward"] == 12


@pytest.mark.parametrize("agent", ["rollout_agents:chat", "rollout_agents:achat"])
def test_timeouts_and_agent_errors_are_recorded_and_counted(policy_env, tmp_path, agent, capsys):
    store = tmp_path / "store"
    tasks = [{"id": "t-0"}, {"id": "t-2", "hang": True}, {"id": "t-4", "fail": agent.endswith(":chat")}]
    spec = RolloutSpec(agent, group_size=2, timeout=3.0, reward_fn="rollout_agents:score", concurrency=6)
    s = run_rollout(spec, tasks, store=store, results=tmp_path / "r.jsonl")
    failing = 2 if agent.endswith(":chat") else 0
    assert s.counts["timeout"] == 2 and s.counts["error"] == failing and s.done == 6
    assert s.counts["ok"] == 4 - failing
    by_task = {}
    for st in read_sessions(store):
        by_task.setdefault(st.task_id, set()).add((st.status, (st.error or {}).get("type")))
    assert by_task["t-2"] == {("error", "SampleTimeout")}
    if failing:
        assert by_task["t-4"] == {("error", "RuntimeError")}
        assert "agent raised on task 't-4'" in capsys.readouterr().err


def test_reward_function_failures_are_clear_and_counted(policy_env, tmp_path, capsys):
    tasks = [{"id": "t-0"}, {"id": "t-2", "bad_score": True}]
    s = run_rollout(
        RolloutSpec("rollout_agents:chat", group_size=3, reward_fn="rollout_agents:score"),
        tasks,
        results=tmp_path / "r.jsonl",
    )
    assert s.counts["reward_error"] == 3 and s.counts["ok"] == 3
    err = capsys.readouterr().err
    assert err.count("reward function failed") == 1 and "ValueError: cannot score this one" in err
    assert "error:" not in err and "warning: the reward function failed" in err  # the run goes on: exit 0
    rows = [r for r in read_results(tmp_path / "r.jsonl") if r["task_id"] == "t-2"]
    assert all(r["reward"] is None and "ValueError" in r["error"] for r in rows)
    s = run_rollout(
        RolloutSpec("rollout_agents:chat", reward_fn="rollout_agents:bad_type"),
        tasks,
        results=tmp_path / "b.jsonl",
    )
    assert s.counts["reward_error"] == 2
    assert "expected a float or a dict" in read_results(tmp_path / "b.jsonl")[0]["error"]


def test_rerun_skips_finished_pairs(policy_env, tmp_path):
    tasks = [{"id": f"t-{i}"} for i in range(4)]
    res = tmp_path / "r.jsonl"
    spec = RolloutSpec("rollout_agents:chat", group_size=2, reward_fn="rollout_agents:score")
    run_rollout(spec, tasks[:2], results=res)
    n_requests = len(policy_env.requests)
    s = run_rollout(spec, tasks, results=res)
    assert (s.ran, s.done) == (4, 8) and len(policy_env.requests) == n_requests + 4


def test_results_lines_lost_after_the_session_ended_are_recovered_with_their_status(policy_env, tmp_path):
    """A run killed between a session's end and its results line: the next run takes the line from the store."""
    tasks = [{"id": "t-0"}, {"id": "t-2", "hang": True}]
    res = tmp_path / "r.jsonl"
    spec = RolloutSpec("rollout_agents:chat", timeout=1.0, reward_fn="rollout_agents:score")
    kw = dict(store=tmp_path / "store", results=res)
    first = run_rollout(spec, tasks, **kw)
    assert (first.counts["ok"], first.counts["timeout"], first.done) == (1, 1, 2)
    res.write_text("")  # both lines lost; both sessions ended in the store
    n_requests = len(policy_env.requests)
    again = run_rollout(spec, tasks, **kw)
    assert again.ran == 0 and len(policy_env.requests) == n_requests  # nothing ran again
    assert again.counts == first.counts
    rows = {r["task_id"]: r for r in read_results(res)}
    assert rows["t-2"]["status"] == "timeout" and rows["t-2"]["recovered"] is True
    assert rows["t-0"]["status"] == "ok" and rows["t-0"]["reward"] == 1.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_run_resumes_with_every_pair_exactly_once(policy_env, tmp_path, sig):
    """Kill the runner mid-run, run the same command again: each (task, sample) once in results and store."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": f"t-{i}", "sleep": 0.1} for i in range(16)])
    store, res = tmp_path / "store", tmp_path / "res.jsonl"
    cmd = [
        sys.executable, "-m", "sdk.rollout", "rollout_agents:chat", tasks, "-G", "3", "-c", "4",
        "--reward-fn", "rollout_agents:score", "--store", str(store), "--results", str(res), "--no-progress",
    ]  # fmt: skip
    env = child_env()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(read_results(res)) < 12:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    first = len(read_results(res))
    assert 12 <= first < 48, err
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "re-run the same command" in err
    done = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["done"] == 48 and summary["ran"] <= 48 - first + 4
    pairs = Counter((r["task_id"], r["sample"]) for r in read_results(res))
    want = {(f"t-{i}", k) for i in range(16) for k in range(3)}
    assert set(pairs) == want and set(pairs.values()) == {1}
    in_store = finished_pairs(store)
    assert set(in_store) == want and set(in_store.values()) == {1}
    # and the export trains on each (task, sample) once
    from sdk.episodes import export, read_episodes

    export(store, tmp_path / "ep.parquet", rejects=False)
    eps = Counter((e["task_id"], e["sample"]) for e in read_episodes(tmp_path / "ep.parquet"))
    assert set(eps) == want and set(eps.values()) == {1}


def test_samples_killed_after_their_reward_are_superseded_and_trained_once(policy_env, tmp_path):
    """kill -9 while samples that already called ``sdk.reward`` keep working; re-run; export and train.

    The killed attempts are ``incomplete`` sessions carrying a reward: without the runner's supersede
    marks they were exported beside their finished re-runs (each (task, sample) trained twice).
    """
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": f"t-{i}", "work": 0.4} for i in range(8)])
    store, res = tmp_path / "store", tmp_path / "res.jsonl"
    cmd = [
        sys.executable, "-m", "sdk.rollout", "rollout_agents:reward_then_work", tasks, "-G", "2", "-c", "4",
        "--store", str(store), "--results", str(res), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(read_results(res)) < 4:
        time.sleep(0.02)
    time.sleep(0.2)  # the next samples are past their reward, in their work
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=20)
    killed = [s for s in read_sessions(store) if s.status == "incomplete" and s.reward is not None]
    assert killed and len(read_results(res)) < 16  # cut-short attempts that carry their reward
    done = subprocess.run(cmd + ["--json"], env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["done"] == 16

    from sdk.episodes import ExportSummary, build_episodes, export, read_episodes
    from trainers.data import DataReport, load_episodes

    want = {(f"t-{i}", k) for i in range(8) for k in range(2)}
    summary = export(store, tmp_path / "ep.parquet", rejects=False)
    eps = Counter((e["task_id"], e["sample"]) for e in read_episodes(tmp_path / "ep.parquet"))
    assert set(eps) == want and set(eps.values()) == {1}
    superseded = {s.session_id for s in read_sessions(store) if s.superseded}
    assert {s.session_id for s in killed} <= superseded
    assert summary.skipped["sessions_superseded"] == len(superseded)
    assert "missing_session_end" not in summary.store_problems  # accounted for, not "lines skipped"
    assert ("  skipped: sessions_superseded", str(len(superseded))) in summary.rows()
    # a second resume marks nothing twice, and a parallel export (a worker per chain) agrees
    subprocess.run(cmd, env=child_env(), capture_output=True, timeout=60, check=True)
    again = ExportSummary()
    assert len(list(build_episodes(store, summary=again))) == 16
    assert again.skipped["sessions_superseded"] == len(superseded)
    parallel = export(store, tmp_path / "par.parquet", rejects=False, workers=2)
    assert (parallel.written, parallel.skipped["sessions_superseded"]) == (16, len(superseded))
    # the trainer reads the store the same way, and its data report says why sessions were left out
    report = DataReport()
    rows = load_episodes(str(store), report=report)
    assert len(rows) == 16 and report.superseded == len(superseded) and not report.store_problems
    assert f"sessions superseded by a re-run of their (task, sample) (left out): {len(superseded)}" in (
        report.lines()
    )


def test_task_sources_and_bad_input(tmp_path, capsys):
    import polars as pl

    pl.DataFrame({"id": [1, 2], "q": ["a", "b"]}).write_parquet(tmp_path / "t.parquet")
    assert [t["id"] for t in load_tasks(tmp_path / "t.parquet")] == ["1", "2"]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"name": ["x", "y"]}).save_to_disk(str(tmp_path / "ds"))
    assert [t["id"] for t in load_tasks(tmp_path / "ds", id_field="name")] == ["x", "y"]
    with pytest.raises(RolloutError, match="appears twice"):
        load_tasks([{"id": 1}, {"id": "1"}])
    with pytest.raises(RolloutError, match="has no 'id'"):
        load_tasks([{"q": 1}])
    bad = write_tasks(tmp_path / "bad.jsonl", [{"id": "a"}])
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\nnot json\n')
    capsys.readouterr()
    for argv, msg in (
        (["nomodule_xyz:f", bad], "cannot import agent module"),
        (["rollout_agents", bad], "must be 'module:function'"),
        (["rollout_agents:chat", bad], "bad.jsonl:2: not valid JSON"),
        (["rollout_agents:chat", str(tmp_path / "missing.jsonl")], "task file not found"),
        (["rollout_agents:chat", bad, "--group-size", "0"], "at least 1"),
    ):
        assert main([*argv, "--store", str(tmp_path / "st"), "--results", str(tmp_path / "r.jsonl")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and msg in err and "Traceback" not in err
    sdk.flush()


def test_an_empty_task_file_is_one_error_line_and_exit_2(tmp_path):
    """As the loop does: nothing to run is bad input, not ``samples done 0/0`` and exit 0."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    argv = ["rollout_agents:chat", str(empty), "--store", str(tmp_path / "st"), "--no-progress"]
    env = child_env()
    got = subprocess.run(
        [sys.executable, "-m", "sdk.rollout", *argv], env=env, capture_output=True, text=True
    )
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr == f"error: no tasks in {empty}\n"
    with pytest.raises(RolloutError, match="no tasks given"):
        run_rollout(RolloutSpec("rollout_agents:chat"), [], results=tmp_path / "r.jsonl")


def test_agent_warning_names_the_root_cause_not_the_frameworks_note(tmp_path, capsys):
    s = run_rollout(
        RolloutSpec("rollout_agents:unreachable", group_size=2), [{"id": "t-0"}], results=tmp_path / "r.jsonl"
    )
    assert s.counts["error"] == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "agent raised" in x)
    assert "Connection refused" in line and "raised as APIConnectionError" in line, line
    assert "During task" not in line


def test_an_agent_of_the_wrong_signature_is_refused_before_any_sample(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "t.jsonl", [{"id": "t-0"}])
    results = str(tmp_path / "r.jsonl")
    assert main(["rollout_agents:score", tasks, "--results", results]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: the agent cannot be called as rollout_agents:score(task): missing a required argument: 'answer'"
    ]
    assert main(["rollout_agents:chat", tasks, "--results", results, "--reward-fn", "json:dumps"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reward function cannot be called as json:dumps(task, answer)" in err[0]
    assert not (tmp_path / "r.jsonl").exists()
