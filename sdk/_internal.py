"""Internal plumbing: the logger, one-time warnings, counters and the internal-error firewall.

Nothing here is public API. The rule it enforces: a tracerl failure never breaks the user's agent.
It is caught, reported loudly once, counted (see :func:`sdk.stats`), and the user's call proceeds.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sdk import _env

__all__ = [
    "MissingDependency",
    "capture_internal_exceptions",
    "count",
    "counters",
    "load_function",
    "logger",
    "warn_once",
]

logger = logging.getLogger("tracerl")

_lock = threading.Lock()
_counters: Counter[str] = Counter()
_warned: set[str] = set()


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"{package} is not installed; run: pip install 'tracerl[{extra}]'")


def count(name: str, n: int = 1) -> None:
    """Increment an internal counter (visible through ``sdk.stats()``)."""
    with _lock:
        _counters[name] += n


def counters() -> dict[str, int]:
    """Return a snapshot of the internal counters."""
    with _lock:
        return dict(_counters)


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING level the first time ``key`` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning("tracerl: " + message, *args)


def _raise_internal() -> bool:
    # Tests set this so that SDK bugs fail loudly instead of being swallowed (Logfire/Sentry pattern).
    return os.environ.get(_env.TRACERL_RAISE_INTERNAL, "") not in ("", "0", "false")


@contextmanager
def capture_internal_exceptions(where: str) -> Iterator[None]:
    """Swallow, count and report (once per place) any exception raised inside the block.

    Wrap every SDK code path that runs on the user's call path. User exceptions must never pass
    through here: call the user's code outside the block.
    """
    try:
        yield
    except Exception as exc:
        count("internal_errors")
        warn_once(
            f"internal:{where}:{type(exc).__name__}",
            "internal error in %s (the agent was not affected; further errors here are counted in "
            "sdk.stats()['internal_errors']): %s\n%s",
            where,
            exc,
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        if _raise_internal():
            raise


def load_function(spec: str, what: str = "function") -> Callable[..., Any]:
    """Import ``"package.module:function"`` (dotted attributes allowed); ``ValueError`` with one line if not.

    The current directory is importable, as with ``python -m``: users name functions of their own code.

    Example:
        >>> load_function("json:dumps")([1])
        '[1]'
    """
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} must be 'module:function', got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(
            f"cannot import {what} module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ValueError(f"{what} {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]
