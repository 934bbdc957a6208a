"""The reader's store-wide indexes move to SQLite past their limit and behave the same there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sdk.store._index import RewardIndex, SeenSessions, reward_lines, scan_rewards


@pytest.mark.parametrize("limit", [1_000, 3])
def test_reward_index_in_memory_and_spilled(limit: int) -> None:
    index = RewardIndex(limit=limit)
    for i in range(10):
        index.add(f"s{i}", (float(i), "reward", None, 1.0))
    index.add("s3", (9.0, "tool", "c1", None))
    assert (index.path is not None) == (limit == 3)
    taken = index.take("s3")
    assert [r["value"] for r in taken] == [3.0, 9.0]  # in the order given
    assert taken[1] == {"value": 9.0, "name": "tool", "call_id": "c1", "ts": None}
    assert index.get("missing") == [] and index.take("missing") == []
    taken_many = index.take_many([f"s{i}" for i in range(0, 10, 2)] + ["missing"])
    assert list(taken_many) == ["s0", "s2", "s4", "s6", "s8"]
    assert taken_many["s4"] == [{"value": 4.0, "name": "reward", "call_id": None, "ts": 1.0}]
    assert list(index.unclaimed()) == ["s1", "s5", "s7", "s9"]
    index.discard(["s5", "s9"])
    assert list(index.unclaimed()) == ["s1", "s7"]
    path = index.path
    index.close()
    assert path is None or not os.path.exists(path)


def test_a_spilled_index_is_readable_by_another_process_view() -> None:
    index = RewardIndex(limit=1_000)
    index.add("s1", (0.5, "reward", None, 2.0))
    path = index.spill()
    view = RewardIndex(path=path)
    assert view.get("s1") == [{"value": 0.5, "name": "reward", "call_id": None, "ts": 2.0}]
    view.close()
    assert os.path.exists(path)  # the view does not own the file
    index.close()
    assert not os.path.exists(path)


@pytest.mark.parametrize("limit", [1_000, 2])
def test_seen_sessions(limit: int) -> None:
    seen = SeenSessions(limit=limit)
    for i in range(5):
        seen.add(f"s{i}")
    seen.add("s1")
    assert all(f"s{i}" in seen for i in range(5)) and "s9" not in seen
    seen.close()


def test_reward_lines_yields_whole_reward_lines(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert list(reward_lines(tmp_path / "empty.jsonl")) == []
    f = tmp_path / "seg.jsonl"
    lines = [
        b'{"event":"call","session_id":"a","x":"' + b"y" * 40 + b'"}\n',
        b'{"event":"reward","session_id":"a","value":1}\n',
        b'{"event": "reward", "session_id": "b", "value": 2}\n',
        b'{"event":"call","session_id":"b"}\n',
        b'{"event":"reward","session_id":"c","value":3}',  # torn: no newline
    ]
    f.write_bytes(b"".join(lines))
    assert list(reward_lines(f)) == lines[1:3]
    problems: list[str] = []
    index = scan_rewards([f], problems.append)
    assert [r["value"] for r in index.take("a") + index.take("b")] == [1.0, 2.0] and problems == []
