"""``python -m sdk.inspect`` on odd input: task ids that are not strings, huge rewards, a directory of Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdk import inspect as inspect_cli
from sdk.episodes import export
from tests.support.sessions import RawStore, assistant, user


def _store(r: RawStore) -> RawStore:
    for sid, task, reward in (("s0", ["a", "b"], 1e308), ("s1", {"x": 1}, -1e308), ("s2", "t", 1.0)):
        r.start(sid, task_id=task).call(sid, [user("q")], assistant("a")).reward(sid, reward).end(sid)
    return r


def _json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    rc = inspect_cli.main([str(path), "--json"])
    out = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out.err, out.err
    return json.loads(out.out)


def test_list_task_ids_and_extreme_rewards(raw_store: RawStore, capsys: pytest.CaptureFixture[str]) -> None:
    info = _json(capsys, _store(raw_store).path)
    assert info["tasks"] == 3 and info["sessions_with_reward"] == 3
    assert info["session_reward"].startswith("0.3333 ± ")
    assert inspect_cli.main([str(raw_store.path)]) == 0  # the table too


def test_a_directory_of_parquet_files_is_not_an_empty_store(
    raw_store: RawStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    export(_store(raw_store).path, parts / "a.parquet")
    export(raw_store.path, parts / "b.parquet")
    info = _json(capsys, parts)
    assert info["kind"] == "parquet" and info["episodes"] == 6 and info["tasks"] == 3
    assert "e+308" in json.dumps(info["reward_per_task"])


def test_duplicate_episode_ids_across_parquet_files_are_counted_with_an_example(
    raw_store: RawStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same store exported twice into one directory: training would drop 3 copies; inspect says so."""
    parts = tmp_path / "parts"
    parts.mkdir()
    export(_store(raw_store).path, parts / "a.parquet")
    info = _json(capsys, parts)
    assert info["duplicate_episode_ids"] == {"count": 0, "example": None}
    export(raw_store.path, parts / "b.parquet")
    info = _json(capsys, parts)
    dup = info["duplicate_episode_ids"]
    assert dup["count"] == 3 and dup["example"].startswith(("s0", "s1", "s2"))
    assert inspect_cli.main([str(parts)]) == 0
    table = capsys.readouterr().out
    assert f"3 (e.g. {dup['example']};" in table


def test_a_fifo_among_the_segments_is_skipped_not_waited_on(
    raw_store: RawStore, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import signal

    os.mkfifo(_store(raw_store).path / "20260101T000000-host-2-bbbbbb.00001.jsonl")

    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError("sdk.inspect waited on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)  # opening a FIFO for reading blocks until a writer comes
    try:
        info = _json(capsys, raw_store.path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert info["sessions_with_reward"] == 3
    assert "not_a_segment_file" in json.dumps(info)
