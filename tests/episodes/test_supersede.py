"""``supersede`` events: the named session is read, marked ``superseded``, and left out of episodes, counted."""

from __future__ import annotations

from pathlib import Path

from sdk.episodes import ExportSummary, build_episodes
from sdk.store import StoreReader
from tests.support.sessions import RawStore, assistant, user


def _killed_then_rerun(path: Path) -> None:
    first = RawStore(path, "20260101T000000-host-1-aaaaaa")  # the runner killed mid-sample
    first.start("cut", sample=0).call("cut", [user("q")], assistant("a")).reward("cut", 1.0)  # no end
    first.start("other", sample=1).call("other", [user("q")], assistant("b")).reward("other", 0.0).end(
        "other"
    )
    rerun = RawStore(path, "20260101T000100-host-2-bbbbbb")  # its re-run, by another process
    rerun.line({"event": "supersede", "v": 1, "session_id": "cut", "reason": "rerun", "ts": 2.0})
    rerun.line({"event": "supersede", "v": 1, "session_id": "never-written", "reason": "rerun", "ts": 2.0})
    rerun.start("again", sample=0).call("again", [user("q")], assistant("c")).reward("again", 1.0).end(
        "again"
    )


def test_a_superseded_session_is_read_marked_and_not_a_store_problem(tmp_path: Path) -> None:
    _killed_then_rerun(tmp_path / "store")
    reader = StoreReader(tmp_path / "store")
    got = {s.session_id: (s.status, s.superseded, s.reward) for s in reader.sessions()}
    assert got == {
        "cut": ("incomplete", True, 1.0),  # still readable, as it was
        "other": ("ok", False, 0.0),
        "again": ("ok", False, 1.0),
    }
    assert dict(reader.problems) == {}  # neither missing_session_end nor unknown_event


def test_the_export_leaves_superseded_sessions_out_counted(tmp_path: Path) -> None:
    _killed_then_rerun(tmp_path / "store")
    summary = ExportSummary()
    eps = list(build_episodes(tmp_path / "store", summary=summary))
    assert sorted((e["sample"], e["reward"]) for e in eps) == [(0, 1.0), (1, 0.0)]
    assert summary.skipped["sessions_superseded"] == 1 and summary.skipped["calls_superseded"] == 1
    assert summary.store_problems == {}
