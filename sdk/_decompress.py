"""HTTP bodies decoded from their ``Content-Encoding``, for every reader of one (gateway, OTLP, transports).

Standard library only. Bodies come from the network: with a limit, they are inflated a bounded piece at a
time, so a compression bomb costs at most the limit.
"""

from __future__ import annotations

import zlib

__all__ = ["BodyTooLarge", "decompress"]


class BodyTooLarge(ValueError):
    """A request body over its size limit, compressed or decompressed (the OTLP receivers answer 413).

    Example:
        >>> str(BodyTooLarge(1024))
        'the request body is over 1024 bytes (decompressed)'
    """

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes (decompressed)")
        self.limit = limit


def decompress(raw: bytes, encoding: str, limit: int | None = None) -> bytes | None:
    """``raw`` decoded from its ``Content-Encoding``; ``None`` for an encoding other than gzip or deflate.

    gzip (``x-gzip`` too, several members too) and deflate (zlib-wrapped, as RFC 9110 says, or raw, as
    some servers send it); an empty encoding or ``identity`` gives ``raw`` back.

    Args:
        raw: The body as received.
        encoding: The ``Content-Encoding`` header's value.
        limit: The most bytes out; ``None`` for no bound (a body already trusted to fit in memory).

    Raises:
        BodyTooLarge: ``raw`` inflates past ``limit``; inflating stops there.
        ValueError: ``raw`` is corrupt or truncated.

    Example:
        >>> import gzip
        >>> decompress(gzip.compress(b"hi"), "gzip"), decompress(b"x", "br")
        (b'hi', None)
        >>> decompress(gzip.compress(b"0" * 100), "gzip", limit=10)
        Traceback (most recent call last):
        ...
        sdk._decompress.BodyTooLarge: the request body is over 10 bytes (decompressed)
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding in ("gzip", "x-gzip"):
            return _inflate(raw, 16 + zlib.MAX_WBITS, limit)
        if encoding != "deflate":
            return None
        try:
            return _inflate(raw, zlib.MAX_WBITS, limit)
        except zlib.error:  # no zlib header: raw deflate
            return _inflate(raw, -zlib.MAX_WBITS, limit)
    except zlib.error as exc:
        raise ValueError(f"corrupt compressed body ({exc})") from None


def _inflate(data: bytes, wbits: int, limit: int | None) -> bytes:
    """``data`` inflated with zlib's window bits ``wbits``, one stream after another (gzip members)."""
    out: list[bytes] = []
    n = 0
    while data:
        d = zlib.decompressobj(wbits)
        # max_length 0 is zlib's "no bound"; limit + 1 - n is never 0 here (n <= limit).
        out.append(d.decompress(data, 0 if limit is None else limit + 1 - n))
        n += len(out[-1])
        if limit is not None and (n > limit or d.unconsumed_tail):
            raise BodyTooLarge(limit)
        if not d.eof:
            raise ValueError("truncated compressed body")
        data = d.unused_data
        if wbits < 0:  # no header to know a next raw stream by: what follows is ignored, as zlib does
            break
    return b"".join(out)
