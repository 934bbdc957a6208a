"""Per-turn policy versions in episodes (schema version 2) and the version-1 files that still read.

A file is version 2 when some turn has a policy version, else version 1 exactly as before (the byte-for-byte
check of an old store's export is tests/episodes/test_store_compat.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pl = pytest.importorskip("polars")
pq = pytest.importorskip("pyarrow.parquet")

from sdk.episodes import export, open_episodes, read_episodes  # noqa: E402
from sdk.episodes._schema import polars_schema  # noqa: E402
from tests.support.sessions import RawStore, assistant, user  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _session(raw: RawStore, sid: str, versions: list[int | None]) -> None:
    """A session of one thread with one call per version (each call continuing the previous one)."""
    raw.start(sid, task_id="t1")
    messages = [user("q")]
    for k, version in enumerate(versions):
        extra = {} if version is None else {"policy_version": version}
        raw.call(sid, list(messages), assistant(f"a{k}"), call_id=f"{sid}-{k}", **extra)
        messages += [assistant(f"a{k}"), user(f"more {k}")]
    raw.reward(sid, 1.0).end(sid)


def _file_version(path: Path) -> bytes:
    return (pq.read_metadata(path).metadata or {})[b"tracerl.schema_version"]


def test_turns_carry_the_version_of_the_call_that_generated_them(raw_store: RawStore, tmp_path: Path) -> None:
    _session(raw_store, "s1", [0, 0, 1])
    built = list(open_episodes(raw_store.path))
    [ep] = built
    assert [t["policy_version"] for t in ep["turns"]] == [0, 0, 1] and ep["schema_version"] == 2
    out = tmp_path / "e.parquet"
    assert export(raw_store.path, out).written == 1
    assert pl.read_parquet_schema(out) == polars_schema(2) and _file_version(out) == b"2"
    assert read_episodes(out) == built


def test_a_later_batch_with_versions_makes_the_whole_file_version_2(
    raw_store: RawStore, tmp_path: Path
) -> None:
    # Batches of one episode: the first written without versions (version 1), then one with versions
    # arrives, and what was written is read back as version 2 with the rest after it.
    _session(raw_store, "s1", [None, None])
    _session(raw_store, "s2", [None])
    _session(raw_store, "s3", [3, None])
    built = sorted(open_episodes(raw_store.path), key=lambda e: e["session_id"])
    out = tmp_path / "e.parquet"
    summary = export(raw_store.path, out, batch_size=1)
    assert summary.written == 3 and _file_version(out) == b"2"
    got = sorted(read_episodes(out), key=lambda e: e["session_id"])
    assert got == built
    assert [e["schema_version"] for e in got] == [1, 1, 2]
    assert [t["policy_version"] for t in got[2]["turns"]] == [3, None]
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_schema_1_files_still_read_with_null_versions() -> None:
    old = FIXTURES / "store_v1.parquet"
    assert _file_version(old) == b"1"
    eps = read_episodes(old)
    assert eps and all(t["policy_version"] is None for e in eps for t in e["turns"])
    assert all(e["schema_version"] == 1 for e in eps)
    assert [e["episode_id"] for e in open_episodes(old)] == [e["episode_id"] for e in eps]
