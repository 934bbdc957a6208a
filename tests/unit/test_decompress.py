"""The one HTTP body decompressor (sdk._decompress), and the OTLP route both receivers share."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from pathlib import Path
from typing import Any

import pytest

from sdk._decompress import BodyTooLarge, decompress

PLAIN = b'{"model": "m", "messages": []}' * 50


def _deflate(data: bytes, wbits: int) -> bytes:
    c = zlib.compressobj(wbits=wbits)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(PLAIN)),
        (" X-GZIP ", gzip.compress(PLAIN)),
        ("deflate", zlib.compress(PLAIN)),
        ("deflate", _deflate(PLAIN, 9)),  # a small window: the zlib header is not 0x78
        ("deflate", _deflate(PLAIN, -zlib.MAX_WBITS)),  # raw deflate, no zlib header
        ("identity", PLAIN),
        ("", PLAIN),
    ],
)
def test_every_encoding_decodes(encoding: str, body: bytes) -> None:
    assert decompress(body, encoding) == PLAIN
    assert decompress(body, encoding, limit=len(PLAIN)) == PLAIN


def test_gzip_members_are_concatenated() -> None:
    assert decompress(gzip.compress(b"a") + gzip.compress(b"b"), "gzip") == b"ab"


def test_another_encoding_is_none() -> None:
    assert decompress(b"x", "br") is None


def test_a_bomb_stops_at_the_limit() -> None:
    with pytest.raises(BodyTooLarge, match="over 100 bytes"):
        decompress(gzip.compress(b"0" * (1 << 20)), "gzip", limit=100)
    with pytest.raises(BodyTooLarge):  # the limit counts every member
        decompress(gzip.compress(b"0" * 60) * 2, "gzip", limit=100)


@pytest.mark.parametrize(
    ("encoding", "body", "why"),
    [
        ("gzip", gzip.compress(PLAIN)[:-8], "truncated"),
        ("gzip", b"not gzip", "corrupt"),
        ("deflate", b"\xff\xff not deflate", "corrupt"),
    ],
)
def test_a_bad_body_is_a_value_error(encoding: str, body: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decompress(body, encoding)


def _receive(chunks: list[bytes]) -> Any:
    async def receive() -> dict[str, Any]:
        body = chunks.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    return receive


def test_the_otlp_route_stops_reading_over_the_limit(tmp_path: Path) -> None:
    from sdk.otel._collector import SpanCollector

    c = SpanCollector(tmp_path, max_body_bytes=10)
    unread = [b"x" * 20]
    status, body, _ = asyncio.run(c.answer(_receive(unread), {"content-length": "20"}))
    assert status == 413 and b"over 10 bytes" in body and unread  # refused on its length, not read
    status, _, _ = asyncio.run(c.answer(_receive([b"x" * 6, b"x" * 6, b"x"]), {}))
    assert status == 413
    assert c.counts()["skipped"] == {"oversized_requests": 2}


def test_the_otlp_route_reads_a_body_in_chunks(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.proto")
    from sdk.otel._collector import SpanCollector

    c = SpanCollector(tmp_path)
    chunks = [b'{"resourceSpans"', b": []}"]
    status, _, ctype = asyncio.run(c.answer(_receive(chunks), {"content-type": "application/json"}))
    assert (status, ctype) == (200, "application/json")
