"""The reader's store-wide indexes move to SQLite past their limit and behave the same there."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import sdk.store._index as index_module
from sdk.store._index import RewardIndex, SeenSessions, marked_lines, scan_rewards
from sdk.store._reader import usable


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


def test_marked_lines_yields_reward_lines_and_ends_only_while_needed(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert list(marked_lines(tmp_path / "empty.jsonl", {})) == []
    f = tmp_path / "seg.jsonl"
    lines = [
        b'{"event":"session_end","session_id":"z"}\n',
        b'{"event":"call","session_id":"a","x":"' + b"y" * 40 + b'"}\n',
        b'{"event":"reward","session_id":"a","value":1}\n',
        b'{"event": "session_end", "session_id": "a", "note": "reward"}\n',  # both marks: yielded once
        b'{"event":"session_end","session_id":"b"}\n',
        b'{"event":"reward","session_id":"c","value":3}',  # torn: no newline
    ]
    f.write_bytes(b"".join(lines))
    assert list(marked_lines(f, {})) == [lines[2], lines[3]]
    assert list(marked_lines(f, {"a": 1})) == [lines[0], *lines[2:5]]
    # What the caller waits for is read after each line: nothing waits once the reward's end is seen.
    pending: dict[str, int] = {}
    seen = []
    for line in marked_lines(f, pending):
        seen.append(line)
        pending.clear() if b"session_end" in line else pending.update(a=1)
    assert seen == [lines[2], lines[3]]


def _chain(path: Path, *events: str) -> Path:
    path.write_bytes("".join(e + "\n" for e in events).encode())
    return path


def _reward(sid: str, value: object = 1.0) -> str:
    return json.dumps({"event": "reward", "v": 1, "session_id": sid, "value": value})


def _end(sid: str) -> str:
    return json.dumps({"event": "session_end", "v": 1, "session_id": sid})


def test_scan_rewards_indexes_only_what_the_main_pass_cannot_attach(tmp_path: Path) -> None:
    own = _chain(
        tmp_path / "a.jsonl",
        _reward("inline"),
        _end("inline"),
        _end("late"),
        _reward("late", 2.0),  # after its session ended
        _reward("elsewhere", 3.0),  # a session of another process
        _reward("bad", "1.0"),
        _reward("nan", float("nan")),
        json.dumps({"event": "reward", "v": 2, "session_id": "future", "value": 1.0}),  # counted by main pass
    )
    invalid: list[str] = []
    index = scan_rewards([[own]], invalid.append, usable)
    assert invalid == ["a.jsonl", "a.jsonl"] and index.indexed_chains == set()
    taken = index.take_many(["inline", "late", "elsewhere", "future"])
    assert {sid: [r["value"] for r in rs] for sid, rs in taken.items()} == {"late": [2.0], "elsewhere": [3.0]}
    index.close()


def test_a_scoring_chain_is_indexed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "PENDING_LIMIT", 2)
    scorer = _chain(
        tmp_path / "scorer.jsonl",
        _reward("x"),
        _reward("bad", None),
        _end("x"),
        _reward("y"),
        _reward("z"),
        _reward("w"),
    )
    normal = _chain(tmp_path / "normal.jsonl", _reward("n"), _end("n"))
    invalid: list[str] = []
    index = scan_rewards([[normal], [scorer]], invalid.append, usable)
    assert index.indexed_chains == {1} and invalid == ["scorer.jsonl"]  # counted once despite the rescan
    assert sorted(index.take_many(["n", "x", "y", "z", "w"])) == ["w", "x", "y", "z"]
    index.close()


def test_merge_from_appends_other_indexes_in_order(tmp_path: Path) -> None:
    parts = []
    for i in range(2):
        part = RewardIndex(limit=0, path=str(tmp_path / f"{i}.sqlite"))
        part.add("s", (float(i), "reward", None, None))
        part.add(f"only{i}", (9.0, "reward", None, None))
        part.spill()
        part.close()
        assert (tmp_path / f"{i}.sqlite").exists()  # a file the caller named is kept
        parts.append(str(tmp_path / f"{i}.sqlite"))
    index = RewardIndex(limit=0)
    assert index.merge_from(parts) == 4 and len(index) == 4
    assert [r["value"] for r in index.take_many(["s"])["s"]] == [0.0, 1.0]
    assert list(index.unclaimed()) == ["only0", "only1"]
    index.close()
