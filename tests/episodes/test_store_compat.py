"""A store written by an earlier tracerl still exports to the same episodes, byte for byte.

``tests/fixtures/store_v1/`` was written through real capture by ``tests/fixtures/make_store_v1.py`` at
commit 8bdc59d, and exported then to ``tests/fixtures/store_v1.parquet``; ``store_v1.polars`` records the
polars version that wrote that file. Today's code exports the same store again (in this process and with
two worker processes). When the installed polars is the recorded one, the files must be identical bytes.
With another polars the bytes may legitimately differ (its Parquet writer changes), so the test then
compares what the bytes mean instead: the decoded frame (schema and every value) and the file's
key-value metadata (tracerl and schema versions), exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pl = pytest.importorskip("polars")
pq = pytest.importorskip("pyarrow.parquet")

from sdk.episodes import export  # noqa: E402

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
