"""The store reader merges a session whose parts several processes wrote (gateway workers, restarts).

Events are written as the gateway's workers write them, each "process" with its own SegmentWriter (its own
chain of segments): each part has its own marked session_start; the end and the rewards are in one part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdk.store import SegmentWriter, StoreReader, add_reward


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps({"v": 1, **event}, separators=(",", ":")) + "\n").encode()


def _start(sid: str, ts: float, *, marked: bool = True, task: str | None = "t") -> dict[str, Any]:
    ev = {
        "event": "session_start",
        "session_id": sid,
        "ts": ts,
        "task_id": task,
        "sample": None,
        "metadata": {},
    }
    ev.update({"parent_session_ids": [], "implicit": False, "pid": 1})
    if marked:
        ev["spans_processes"] = True
    return ev


def _call(sid: str, cid: str, ts: float, text: str, base: int | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "tools": None}
    if base is not None:
        request["base"] = {"n": base}
    return {
        "event": "call",
        "call_id": cid,
        "session_id": sid,
        "framework": "gateway",
        "model": "m",
        "request": request,
        "response": {"message": {"role": "assistant", "content": f"re {text}"}, "finish_reason": "stop"},
        "started_at": ts,
        "ended_at": ts + 0.1,
    }


def _end(sid: str, ts: float, status: str = "ok") -> dict[str, Any]:
    return {
        "event": "session_end",
        "session_id": sid,
        "ts": ts,
        "status": status,
        "error": None,
        "num_calls": 1,
    }


def _write(store: Path, *chains: list[dict[str, Any]]) -> None:
    for events in chains:
        w = SegmentWriter(store)
        for ev in events:
            assert w.append(_line(ev))
        w.close()


def test_parts_in_two_chains_are_one_session(tmp_path: Path) -> None:
    a = [_start("s", 1.0), _call("s", "c1", 1.0, "one"), _call("s", "c3", 3.0, "three", base=2)]
    b = [
        _start("s", 2.0, task=None),
        _call("s", "c2", 2.0, "two"),
        {"event": "reward", "session_id": "s", "value": 1.0, "name": "reward", "call_id": None, "ts": 4.0},
        _end("s", 5.0),
    ]
    _write(tmp_path, a, b)
    reader = StoreReader(tmp_path)
    [s] = list(reader.sessions())
    assert [c["call_id"] for c in s.calls] == ["c1", "c2", "c3"]
    # Each part's prefix deduplication is rebuilt from its own chain.
    assert [m["content"] for m in s.calls[2]["request"]["messages"]] == ["one", "re one", "three"]
    assert (s.status, s.task_id, s.started_at, s.ended_at, s.reward) == ("ok", "t", 1.0, 5.0, 1.0)
    assert not reader.problems and reader.num_sessions == 1


def test_start_and_end_in_every_chain_and_late_rewards(tmp_path: Path) -> None:
    a = [_start("s", 1.0), _call("s", "c1", 1.0, "one"), _end("s", 1.5)]
    b = [_start("s", 2.0), _call("s", "c2", 2.0, "two"), _end("s", 6.0, "error")]
    c = [_start("s", 3.0), _call("s", "c3", 3.0, "three")]  # a worker that never saw the end
    other = [_start("o", 1.0), _call("o", "x", 1.0, "x"), _end("o", 2.0)]
    _write(tmp_path, a, other, b, c)
    add_reward(tmp_path, "s", 0.5)  # post-hoc, from another process: indexed, attached to the merge
    reader = StoreReader(tmp_path)
    sessions = {s.session_id: s for s in reader.sessions()}
    s = sessions["s"]
    assert [c["call_id"] for c in s.calls] == ["c1", "c2", "c3"]
    assert (s.status, s.ended_at, s.reward) == ("error", 6.0, 0.5)
    assert len(sessions["o"].calls) == 1
    assert not reader.problems


def test_no_part_ended_is_incomplete_and_counted_once(tmp_path: Path) -> None:
    _write(
        tmp_path,
        [_start("s", 1.0), _call("s", "c1", 1.0, "a")],
        [_start("s", 2.0), _call("s", "c2", 2.0, "b")],
    )
    reader = StoreReader(tmp_path)
    [s] = list(reader.sessions())
    assert s.status == "incomplete" and len(s.calls) == 2
    assert reader.problems == {"missing_session_end": 1}


def test_unmarked_session_in_two_chains_is_read_as_before(tmp_path: Path) -> None:
    # In-process sessions are not marked: a second process reusing an id stays a counted store problem.
    _write(
        tmp_path,
        [_start("s", 1.0, marked=False), _call("s", "c1", 1.0, "a"), _end("s", 1.5)],
        [_start("s", 2.0, marked=False), _call("s", "c2", 2.0, "b"), _end("s", 2.5)],
    )
    reader = StoreReader(tmp_path)
    [s] = list(reader.sessions())
    assert len(s.calls) == 1
    assert reader.problems["event_after_session_end"] == 3


def test_parallel_export_reads_spread_sessions_in_one_process(tmp_path: Path) -> None:
    from sdk.episodes._parallel import plan_workers

    store = tmp_path / "store"
    _write(
        store, [_start("s", 1.0), _call("s", "c1", 1.0, "a")], [_start("s", 2.0), _call("s", "c2", 2.0, "b")]
    )
    assert plan_workers(store, 2) is None
    plain = tmp_path / "plain"
    _write(plain, [_start("s", 1.0, marked=False)], [_start("t", 1.0, marked=False)])
    assert plan_workers(plain, 2) is not None


def _view(s: Any) -> tuple:
    messages = [[m.get("content") for m in c["request"]["messages"]] for c in s.calls]
    return (s.session_id, s.status, s.task_id, s.started_at, s.ended_at, s.reward, messages)


def test_a_tail_following_the_writers_merges_the_parts_as_the_reader_does(tmp_path: Path) -> None:
    from sdk.store import StoreTail

    tail = StoreTail(tmp_path)
    a = [_start("s", 1.0), _call("s", "c1", 1.0, "one"), _call("s", "c3", 3.0, "three", base=2)]
    _write(tmp_path, a)
    assert tail.read().ended == []  # no part ended yet
    b = [_start("s", 2.0, task=None), _call("s", "c2", 2.0, "two"), _end("s", 5.0)]
    other = [_start("o", 1.0), _call("o", "x", 1.0, "x"), _end("o", 2.0)]
    _write(tmp_path, b, other)
    got = {s.session_id: _view(s) for s in tail.read().ended}
    assert got == {s.session_id: _view(s) for s in StoreReader(tmp_path).sessions()}
    add_reward(tmp_path, "s", 0.5)  # post-hoc: the merged session comes again, with it
    [again] = tail.read().ended
    assert _view(again) == next(_view(s) for s in StoreReader(tmp_path).sessions() if s.session_id == "s")
    assert again.reward == 0.5 and not tail.problems
