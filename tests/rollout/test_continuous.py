"""``sdk.rollout.run_continuous`` and ``python -m sdk.rollout --continuous``: a real agent (a wrapped openai
client) against the scripted server, whose requests are held at a gate so that what is in flight is exact.

Concurrency is measured by the server (requests received and not answered), never by wall time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk import _env
from sdk.rollout import RolloutError, RolloutSpec, read_results, run_continuous
from sdk.store import read_sessions
from sdk.testing import ScriptedOpenAIServer

pytest.importorskip("openai")

HERE = Path(__file__).parent
AGENT = "rollout_agents:policy_chat"


class Gate:
    """A server policy that holds every request until the test lets one through."""

    def __init__(self) -> None:
        self._sem = threading.Semaphore(0)

    def __call__(self, request: dict, endpoint: str) -> None:
        self._sem.acquire(timeout=60)  # never hangs a failed test for good
        return None  # the default reply

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._sem.release()


def wait_until(what: Callable[[], bool], message: str, limit_s: float = 30) -> None:
    """Poll ``what`` (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


def sequence(tasks: list[str], group_size: int) -> Iterator[tuple[str, int]]:
    """The (task, sample) order of a cycled task set: each round gives every task its next block of G."""
    for round_ in range(1000):
        for tid in tasks:
            for k in range(round_ * group_size, (round_ + 1) * group_size):
                yield tid, k


def first(n: int, tasks: list[str], group_size: int) -> set[tuple[str, int]]:
    it = sequence(tasks, group_size)
    return {next(it) for _ in range(n)}


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ScriptedOpenAIServer, Gate]]:
    gate = Gate()
    with ScriptedOpenAIServer(policy=gate) as server:
        monkeypatch.setenv(_env.TRACERL_POLICY_BASE_URL, server.base_url)
        monkeypatch.setenv(_env.TRACERL_POLICY_MODEL, "policy")
        try:
            yield server, gate
        finally:
            gate.release(1000)  # nothing stays held when a test fails


def start(spec: RolloutSpec, **kwargs: Any) -> tuple[threading.Thread, threading.Event, dict[str, Any]]:
    stop, out = threading.Event(), {}

    def run() -> None:
        out["summary"] = run_continuous(spec, stop=stop, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, stop, out


def test_keeps_exactly_concurrency_samples_in_flight_and_stops_cleanly(gated, tmp_path):
    server, gate = gated
    tasks = [{"id": "t-0"}, {"id": "t-1"}]
    res, store = tmp_path / "res.jsonl", tmp_path / "store"
    spec = RolloutSpec(AGENT, concurrency=3, group_size=2, reward_fn="rollout_agents:score")
    thread, stop, out = start(spec, tasks=tasks, results=res, store=store)
    wait_until(lambda: server.in_flight == 3, "3 samples never got in flight")
    for n in range(4, 12):  # steady state: each sample that ends is replaced at once
        gate.release()
        wait_until(lambda n=n: len(server.requests) == n and server.in_flight == 3, f"no steady state at {n}")
        assert len(read_results(res)) == n - 3
    stop.set()
    gate.release(3)  # the samples in flight when stopped finish
    thread.join(30)
    assert not thread.is_alive()
    assert server.max_in_flight == 3 and len(server.requests) == 11  # none started after the stop
    rows = read_results(res)
    pairs = Counter((r["task_id"], r["sample"]) for r in rows)
    assert set(pairs) == first(11, ["t-0", "t-1"], 2) and set(pairs.values()) == {1}
    assert {r["status"] for r in rows} == {"ok"}
    summary = out["summary"]
    assert (summary.done, summary.ran, summary.counts["ok"]) == (11, 11, 11)
    sessions = list(read_sessions(store))
    assert {(s.task_id, s.sample) for s in sessions} == set(pairs)
    assert {s.status for s in sessions} == {"ok"} and all(len(s.calls) == 1 for s in sessions)
    assert {r["session_id"] for r in rows} == {s.session_id for s in sessions}


def test_a_changed_policy_model_reaches_the_samples_started_after_it(gated, tmp_path, monkeypatch):
    server, gate = gated
    tasks = [{"id": f"t-{i}"} for i in range(3)]
    stamp = lambda task, k: {"policy_model": os.environ[_env.TRACERL_POLICY_MODEL]}  # noqa: E731
    thread, stop, _ = start(
        RolloutSpec(AGENT, concurrency=2), tasks=tasks, results=tmp_path / "res.jsonl", store=tmp_path / "store",
        metadata=stamp,
    )  # fmt: skip
    wait_until(lambda: server.in_flight == 2, "2 samples never got in flight")
    monkeypatch.setenv(_env.TRACERL_POLICY_MODEL, "policy@v1")  # the loop switched the policy's version
    for n in range(3, 7):
        gate.release()
        wait_until(lambda n=n: len(server.requests) == n and server.in_flight == 2, f"no steady state at {n}")
    stop.set()
    gate.release(2)
    thread.join(30)
    assert not thread.is_alive()
    models = [r.json["model"] for r in server.requests]
    assert models[:2] == ["policy", "policy"] and models[2:] == ["policy@v1"] * 4
    by_model = Counter(s.metadata["policy_model"] for s in read_sessions(tmp_path / "store"))
    assert by_model == {"policy": 2, "policy@v1": 4}  # the metadata callable ran at each sample's start


def test_a_task_stream_gets_fresh_sample_indices_and_one_pass_ends(gated, tmp_path):
    server, gate = gated
    gate.release(1000)  # no holding here
    stream = iter([{"id": "t-0"}, {"id": "t-1"}, {"id": "t-0"}, {"bad": 1}, {"id": "t-0"}])
    seen: list[dict] = []
    summary = run_continuous(
        RolloutSpec(AGENT, concurrency=2, group_size=2), results=tmp_path / "res.jsonl", store=tmp_path / "store",
        stop=threading.Event(), task_stream=stream, on_sample=seen.append,
    )  # fmt: skip
    pairs = Counter((r["task_id"], r["sample"]) for r in read_results(tmp_path / "res.jsonl"))
    assert pairs == Counter({("t-0", k): 1 for k in range(6)} | {("t-1", 0): 1, ("t-1", 1): 1})
    assert summary.done == 8 and len(seen) == 8 and server.max_in_flight <= 2
    once = run_continuous(
        RolloutSpec(AGENT),
        [{"id": "t-9"}],
        results=tmp_path / "once.jsonl",
        stop=threading.Event(),
        cycle=False,
    )
    assert once.done == 1
    with pytest.raises(RolloutError, match="no tasks"):
        run_continuous(RolloutSpec(AGENT), [], results=tmp_path / "none.jsonl", stop=threading.Event())


def test_a_task_stream_is_read_by_one_thread_no_further_than_the_free_slots(gated, tmp_path):
    """Samples that end together are replaced together: one thread reads the stream (not a thread per pair),
    and never more pairs than there are free slots, so a stream held back by back-pressure is not read ahead."""
    server, gate = gated
    readers: list[threading.Thread] = []  # held: a thread's identity is not reused while it is

    def stream() -> Iterator[dict[str, Any]]:
        for i in range(1000):
            readers.append(threading.current_thread())
            yield {"id": f"t-{i}"}

    res = tmp_path / "res.jsonl"
    thread, stop, _ = start(
        RolloutSpec(AGENT, concurrency=4), task_stream=stream(), results=res, store=tmp_path / "store"
    )
    try:
        wait_until(lambda: server.in_flight == 4, "4 samples never got in flight")
        assert len(readers) == 4  # no pair read ahead of a free slot
        gate.release(4)  # the four end together ...
        wait_until(lambda: len(server.requests) == 8 and server.in_flight == 4, "the four were not replaced")
        assert len(readers) == 8 and len(read_results(res)) == 4
    finally:
        stop.set()
        gate.release(1000)
        thread.join(30)
    assert not thread.is_alive()
    assert len(set(readers)) == 1 and readers[0] is not threading.main_thread()


def test_a_task_stream_that_fails_stops_the_run_with_its_error(gated, tmp_path):
    server, gate = gated
    gate.release(1000)

    def stream() -> Iterator[dict[str, Any]]:
        yield {"id": "t-0"}
        raise OSError("the curriculum's source went away")

    with pytest.raises(OSError, match="source went away"):
        spec = RolloutSpec(AGENT, concurrency=2)
        run_continuous(spec, task_stream=stream(), results=tmp_path / "r.jsonl", stop=threading.Event())


def child_env(base_url: str) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.getcwd(), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    env[_env.TRACERL_POLICY_BASE_URL], env[_env.TRACERL_POLICY_MODEL] = base_url, "policy"
    return env


def test_kill_9_then_restart_runs_each_pair_once_and_supersedes_the_cut_attempts(gated, tmp_path):
    server, gate = gated
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t-{i}"}) + "\n" for i in range(3)))
    store, res = tmp_path / "store", tmp_path / "res.jsonl"
    cmd = [
        sys.executable, "-m", "sdk.rollout", AGENT, str(tasks), "--continuous", "-G", "2", "-c", "3",
        "--reward-fn", "rollout_agents:score", "--store", str(store), "--results", str(res), "--no-progress",
    ]  # fmt: skip
    env = child_env(server.base_url)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: server.in_flight == 3, "the child never had 3 samples in flight")
        gate.release(5)
        wait_until(lambda: len(read_results(res)) == 5 and server.in_flight == 3, "no 5 results")
        wait_until(
            lambda: len(list(read_sessions(store))) == 8, "the started sessions never reached the store"
        )
        proc.send_signal(signal.SIGKILL)  # 3 samples cut mid-call
        proc.communicate(timeout=30)
        gate.release(3)  # the killed child's requests, answered to no one
        wait_until(lambda: server.in_flight == 0, "the cut requests were never released")
        cut = {s.session_id: (s.task_id, s.sample) for s in read_sessions(store) if s.status == "incomplete"}
        assert len(cut) == 3
        server.reset()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: server.in_flight == 3, "the restarted child never had 3 samples in flight")
        gate.release(4)
        wait_until(lambda: len(read_results(res)) == 9 and server.in_flight == 3, "no 9 results")
        proc.send_signal(signal.SIGTERM)
        gate.release(3)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopping: finishing the samples in flight" in err and "samples done" in out
    rows = read_results(res)
    pairs = Counter((r["task_id"], r["sample"]) for r in rows)
    assert len(pairs) == 12 and set(pairs.values()) == {1}
    assert set(cut.values()) <= set(pairs)  # the cut pairs ran again
    for tid in ("t-0", "t-1", "t-2"):  # each task's samples are whole blocks of G from 0: no group lost
        got = sorted(k for t, k in pairs if t == tid)
        assert got == list(range(len(got))) and len(got) % 2 == 0
    sessions = list(read_sessions(store))
    superseded = {s.session_id for s in sessions if s.superseded}
    assert superseded == set(cut)
    kept = Counter((s.task_id, s.sample) for s in sessions if not s.superseded)
    assert kept == pairs and {s.status for s in sessions if not s.superseded} == {"ok"}


def test_after_kill_9_a_part_done_group_runs_first_even_while_the_stream_yields_nothing(gated, tmp_path):
    """A killed run leaves t-1's group half done; the same results file then finishes it before anything
    else, although the task stream (held back, as the loop's back-pressure holds it) never yields t-1."""
    server, gate = gated
    tasks = [{"id": f"t-{i}"} for i in range(3)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    store, res = tmp_path / "store", tmp_path / "res.jsonl"
    cmd = [
        sys.executable, "-m", "sdk.rollout", AGENT, str(path), "--continuous", "-G", "2", "-c", "1",
        "--reward-fn", "rollout_agents:score", "--store", str(store), "--results", str(res), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=child_env(server.base_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_until(lambda: server.in_flight == 1, "the child never started a sample")
        gate.release(3)  # t-0's group and t-1 sample 0; t-1 sample 1 is then held
        wait_until(lambda: len(read_results(res)) == 3 and server.in_flight == 1, "no 3 results")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    gate.release(1)  # the cut request, answered to no one
    wait_until(lambda: server.in_flight == 0, "the cut request was never released")
    assert {(r["task_id"], r["sample"]) for r in read_results(res)} == {("t-0", 0), ("t-0", 1), ("t-1", 0)}

    def held_back() -> Iterator[dict[str, Any]]:
        stop.wait(60)  # bounded: a failed test does not hang
        return
        yield

    gate.release(1000)
    spec = RolloutSpec(AGENT, group_size=2, concurrency=1)
    thread, stop, _ = start(spec, tasks=tasks, task_stream=held_back(), results=res, store=store)
    try:
        wait_until(lambda: len(read_results(res)) == 4, "the part-done group was never finished")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    pairs = Counter((r["task_id"], r["sample"]) for r in read_results(res))
    assert pairs == Counter({("t-0", 0): 1, ("t-0", 1): 1, ("t-1", 0): 1, ("t-1", 1): 1})
    sessions = list(read_sessions(store))
    assert [(s.task_id, s.sample) for s in sessions if s.superseded] == [("t-1", 1)]
