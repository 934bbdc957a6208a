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

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "JSONError",
    "UntrustedJSONError",
    "dumps",
    "fast",
    "loads",
    "parse_untrusted",
    "strict_loads",
]

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


MAX_DEPTH = 128
"""Untrusted JSON nested deeper than this is refused: what tracerl stores is walked and re-encoded
recursively, and a real request, answer or event nests a few dozen levels at most."""

MAX_BYTES = 64 * 1024 * 1024
"""Untrusted JSON larger than this (bytes; characters for a ``str``) is refused without being parsed."""


class UntrustedJSONError(ValueError):
    """JSON from outside the process that :func:`parse_untrusted` will not read; the message says why.

    Example:
        >>> str(UntrustedJSONError("nested too deeply"))
        'nested too deeply'
    """


def parse_untrusted(
    data: bytes | bytearray | memoryview | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES
) -> Any:
    """Parse JSON that came from outside (a request body, an upstream answer, a stream chunk, an SSE event).

    The one parser for such input, everywhere it is read (the gateway, the wire module, the in-process
    recording transports): what it returns can be walked and re-encoded without a recursion error, and
    whatever it refuses raises one error, :class:`UntrustedJSONError` (a ``ValueError``), never a
    ``RecursionError``. The standard library's :func:`json.loads` parses (integers of any size kept,
    ``NaN`` accepted, as clients parse them); the depth is checked after, without recursion.

    Args:
        data: The JSON text.
        max_depth: Most levels of nested lists and objects allowed.
        max_bytes: Largest input parsed.

    Raises:
        UntrustedJSONError: Not JSON, larger than ``max_bytes`` or nested deeper than ``max_depth``.

    Example:
        >>> parse_untrusted(b'{"a": [1, 2]}')
        {'a': [1, 2]}
        >>> parse_untrusted(b"[" * 5000 + b"]" * 5000)
        Traceback (most recent call last):
        ...
        sdk._json.UntrustedJSONError: nested too deeply (more than 128 levels)
    """
    if len(data) > max_bytes:
        raise UntrustedJSONError(f"larger than {max_bytes} bytes")
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    deep = UntrustedJSONError(f"nested too deeply (more than {max_depth} levels)")
    try:
        value = json.loads(data)
    except RecursionError:
        raise deep from None
    except ValueError as exc:  # includes integers longer than Python parses (sys.int_info)
        raise UntrustedJSONError(f"not valid JSON ({str(exc)[:200]})") from None
    # Counting brackets first: most documents have too few to nest that deep, and are not walked at all.
    brackets = (b"[", b"{") if isinstance(data, bytes) else ("[", "{")
    if sum(map(data.count, brackets)) > max_depth and _deeper(value, max_depth):
        raise deep
    return value


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels deep (iterative: no recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


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
