"""The reader's store-wide indexes move to SQLite past their limit and behave the same there."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from sdk.store._index import RewardIndex, SeenSessions, reward_lines, scan_rewards


@pytest.mark.parametrize("limit", [1_000, 3])
def test_reward_index_in_memory_and_spilled(limit: int, tmp_path: Path) -> None:
    index = RewardIndex(limit=limit)
    for i in range(10):
        index.add(f"s{i}", (float(i), "reward", None, 1.0))
    index.add("s3", (9.0, "tool", "c1", None))
    assert index.spilled == (limit == 3)
    taken = index.take_many(["s3", "missing"])
    assert list(taken) == ["s3"]
    assert [r["value"] for r in taken["s3"]] == [3.0, 9.0]  # in the order given
    assert taken["s3"][1] == {"value": 9.0, "name": "tool", "call_id": "c1", "ts": None}
    assert list(index.take_many([f"s{i}" for i in range(0, 10, 2)])) == ["s0", "s2", "s4", "s6", "s8"]
    assert list(index.unclaimed()) == ["s1", "s5", "s7", "s9"]
    # Claims made elsewhere (a worker's claims database) count too.
    claims = sqlite3.connect(tmp_path / "claims.sqlite")
    claims.execute("CREATE TABLE c (k TEXT NOT NULL)")
    claims.executemany("INSERT INTO c VALUES (?)", [("s5",), ("s9",)])
    claims.commit()
    claims.close()
    index.claim_from(str(tmp_path / "claims.sqlite"))
    assert list(index.unclaimed()) == ["s1", "s7"]
    path = index.path
    index.close()
    assert path is not None and not os.path.exists(path)


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
    taken = index.take_many(["a", "b"])
    assert [r["value"] for sid in ("a", "b") for r in taken[sid]] == [1.0, 2.0] and problems == []
