"""A store written by an earlier tracerl still exports to the same episodes, byte for byte.

``tests/fixtures/store_v1/`` was written through real capture by ``tests/fixtures/make_store_v1.py`` at
commit 8bdc59d, and exported then to ``tests/fixtures/store_v1.parquet``; ``store_v1.polars`` records the
polars version that wrote that file. Today's code exports the same store again (in this process and with
two worker processes). When the installed polars is the recorded one, the files must be identical bytes.
With another polars the bytes may legitimately differ (its Parquet writer changes), so the test then
compares what the bytes mean instead: the decoded frame (schema and every value) and the file's
key-value metadata (tracerl and schema versions), exactly.

The write side too: today's capture of the same sessions (``make_store_v1.write_store``) writes the same
event lines as the fixture's, once ids, times, pids and server-made request ids, tool-call ids and token counts are replaced by stable
placeholders, and once prompt token ids are left aside: today's writer stores them relative to the previous
call (``prompt_token_suffix``), the fixture in full; the reader rebuilds the same lists from both.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pl = pytest.importorskip("polars")
pq = pytest.importorskip("pyarrow.parquet")

from sdk.episodes import export  # noqa: E402
from sdk.store import StoreReader  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = FIXTURES / "store_v1.parquet"
POLARS_AT_FIXTURE = (FIXTURES / "store_v1.polars").read_text().strip()


def _tracerl_metadata(path: Path) -> dict[bytes, bytes]:
    meta = pq.read_metadata(path).metadata or {}
    return {k: v for k, v in meta.items() if k.startswith(b"tracerl.")}


@pytest.mark.parametrize("workers", [1, 2])
def test_store_v1_exports_as_it_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    # Episode metadata holds the store path as given: export it as the generator did, from its folder.
    monkeypatch.chdir(FIXTURES)
    out = tmp_path / "episodes.parquet"
    summary = export("store_v1", out, rejects=False, require_reward=False, workers=workers)
    assert summary.written == 10
    assert not summary.rejected and not summary.store_problems
    if pl.__version__ == POLARS_AT_FIXTURE:
        assert out.read_bytes() == EXPECTED.read_bytes()
    else:
        got, want = pl.read_parquet(out), pl.read_parquet(EXPECTED)
        assert got.schema == want.schema
        assert got.to_dicts() == want.to_dicts()
        assert _tracerl_metadata(out) == _tracerl_metadata(EXPECTED)


def _normalised_lines(store: Path) -> list[str]:
    """Event lines of ``store`` in the order written, ids numbered by first appearance, times zeroed."""
    ids: dict[str, str] = {}
    out = []
    segments = sorted(
        store.glob("*.jsonl"), key=lambda p: float(re.search(rb'"ts":([0-9.]+)', p.read_bytes())[1])
    )
    for segment in segments:
        for line in segment.read_text(encoding="utf-8").splitlines():
            line = re.sub(r"\b[0-9a-f]{32}\b", lambda m: ids.setdefault(m[0], f"id{len(ids)}"), line)
            line = re.sub(r'"(ts|started_at|ended_at|pid)":[0-9.]+', r'"\1":0', line)
            line = re.sub(r'"request_id":"[^"]*"', '"request_id":"req"', line)
            # The scripted server derives tool-call ids and prompt token counts from the request text
            # (it joins text parts as sdk.messages does since the fixture was written): server output.
            line = re.sub(r"\bcall_[0-9a-f]{24}\b", "call_x", line)
            line = re.sub(r'"(prompt_tokens|total_tokens)":[0-9]+', r'"\1":0', line)
            line = re.sub(r',"prompt_token_(ids":\[[0-9,]*\]|suffix":\{[^}]*\})', "", line)
            out.append(line)
    return out


def test_capture_writes_the_fixture_lines(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    spec = importlib.util.spec_from_file_location("make_store_v1", FIXTURES / "make_store_v1.py")
    assert spec is not None and spec.loader is not None
    make_store_v1 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_store_v1)
    make_store_v1.write_store(tmp_path / "store")
    want = _normalised_lines(FIXTURES / "store_v1")
    assert len(want) == 44
    assert _normalised_lines(tmp_path / "store") == want
    assert b'"prompt_token_suffix"' in b"".join(p.read_bytes() for p in (tmp_path / "store").glob("*.jsonl"))
    assert _prompt_ids(tmp_path / "store") == _prompt_ids(FIXTURES / "store_v1")


def _prompt_ids(store: Path) -> list[list[int] | None]:
    """Every call's prompt token ids as the reader rebuilds them, in session start order."""
    sessions = sorted(StoreReader(store).sessions(), key=lambda s: s.started_at or 0.0)
    return [c["prompt_token_ids"] for s in sessions for c in s.calls]
