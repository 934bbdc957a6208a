"""JSON parsing for the read side: orjson when installed (``episodes`` extra), else the standard library.

Reading a store is mostly parsing JSON lines, and orjson parses them about three times faster. It is
stricter than :func:`json.loads` (no ``NaN``/``Infinity``, no lone surrogates, no numbers beyond double
range), so whatever orjson refuses is parsed again by :func:`json.loads`: a line means the same thing with
or without orjson. One difference remains: integers beyond 64 bits come back from orjson as floats.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["JSONError", "dumps", "fast", "loads", "strict_loads"]

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


def strict_loads() -> Any:
    """The fastest parser of a store line: ``orjson.loads`` when installed, else :func:`loads`.

    Stricter than :func:`loads`: where it raises ``ValueError``, call :func:`loads`, which decides.

    Example:
        >>> strict_loads()(b'[1]')
        [1]
    """
    return _orjson.loads if fast() else loads


def dumps(value: Any) -> str:
    """JSON text of ``value`` for an episode column: compact, non-ASCII kept, other types as ``str()``.

    NaN and infinities become ``null``: JSON has no such numbers and strict readers (polars, duckdb)
    reject the ``NaN`` that :func:`json.dumps` writes. The text is the same with or without orjson up to
    float spelling (``1e-07`` / ``1e-7``).

    Example:
        >>> dumps({"a": [1, float("nan")], "b": "é"})
        '{"a":[1,null],"b":"é"}'
    """
    if not _resolved:
        fast()
    if _orjson is not None:
        try:
            return _orjson.dumps(value, default=str, option=_orjson.OPT_NON_STR_KEYS).decode()
        except (TypeError, _orjson.JSONEncodeError):
            pass  # lone surrogates, integers beyond 64 bits: the standard library writes them
    try:
        return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), ensure_ascii=False, default=str, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


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
