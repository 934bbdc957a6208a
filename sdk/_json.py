"""JSON parsing for the read side: orjson when installed (``episodes`` extra), else the standard library.

Reading a store is mostly parsing JSON lines, and orjson parses them about three times faster. It is
stricter than :func:`json.loads` (no ``NaN``/``Infinity``, no lone surrogates, no numbers beyond double
range), so whatever orjson refuses is parsed again by :func:`json.loads`: a line means the same thing with
or without orjson. One difference remains: integers beyond 64 bits come back from orjson as floats.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["JSONError", "fast", "loads"]

_orjson: Any = None
_resolved = False

JSONError = (ValueError, RecursionError)
"""What :func:`loads` raises on bad input (``RecursionError``: nesting deeper than the parser allows)."""


def loads(data: bytes | str) -> Any:
    """Parse one JSON document, as :func:`json.loads` would.

    Raises ``ValueError`` (invalid JSON, or bytes that are not UTF-8) or ``RecursionError`` (too deeply
    nested): catch :data:`JSONError`.

    Example:
        >>> loads(b'{"a": [1, NaN]}')["a"][0]
        1
    """
    if not _resolved:
        fast()
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # maybe valid for json.loads (NaN, lone surrogates, 1e400): let it decide
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8")  # json.loads would also guess UTF-16/32: a store is UTF-8
    return json.loads(data)


def fast() -> bool:
    """Whether orjson is in use (imported on first use: ``import sdk`` stays free of third-party modules).

    Example:
        >>> isinstance(fast(), bool)
        True
    """
    global _orjson, _resolved
    if not _resolved:
        try:
            import orjson
        except ImportError:
            orjson = None
        _orjson, _resolved = orjson, True
    return _orjson is not None
