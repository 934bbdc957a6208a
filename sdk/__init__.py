"""tracerl: capture your agent's LLM calls, turn them into episodes, improve the agent with RL.

Example:
    >>> from sdk import configure, session
    >>> with session(task_id="gsm8k-17", split="train") as s:
    ...     pass  # run the agent here; attach one integration (see integrations/)
    ...     s.reward(1.0)
"""

from __future__ import annotations

import os
from typing import Any

from sdk._config import Config
from sdk._session import Session, current_session, reward, session, wrap
from sdk._tracer import tracer as _tracer

__all__ = [
    "Config",
    "Session",
    "configure",
    "current_session",
    "flush",
    "reward",
    "session",
    "shutdown",
    "stats",
    "wrap",
]

__version__ = "0.1.0"


def configure(
    store: str | os.PathLike[str] | None = None,
    *,
    fsync: str | None = None,
    fsync_interval: float | None = None,
    implicit_sessions: str | None = None,
    segment_max_bytes: int | None = None,
    spill_max_bytes: int | None = None,
    enabled: bool | None = None,
    ship_interval: float | None = None,
) -> Config:
    """Configure capture. Optional: defaults come from ``TRACERL_*`` environment variables.

    Raises ``ValueError`` for an invalid store path or option (a programmer error, raised here rather
    than on the agent's call path).

    Args:
        store: Store directory (default ``$TRACERL_STORE`` or ``./.tracerl``); created if missing. An
            object-store URI (``s3://bucket/prefix``, via fsspec) keeps crash-safe local segments on this
            host and ships them there (see ``sdk.store``).
        fsync: ``never`` (default; survives ``kill -9``), ``interval`` or ``always`` (survive OS crashes).
        fsync_interval: Seconds between fsyncs with ``fsync="interval"``.
        implicit_sessions: ``process`` (default) records calls outside any session in one implicit
            session per process; ``off`` skips them (counted, warned once).
        segment_max_bytes: Rotate segment files past this size.
        spill_max_bytes: Memory for events that could not be written, before dropping (counted).
        enabled: ``False`` turns capture off.
        ship_interval: Seconds between uploads of the growing segment to an object-store ``store``.

    Returns:
        The resolved :class:`Config`.

    Example:
        >>> import tempfile
        >>> configure(store=tempfile.mkdtemp(), fsync="interval").fsync
        'interval'
    """
    return _tracer.configure(
        store=store,
        fsync=fsync,
        fsync_interval=fsync_interval,
        implicit_sessions=implicit_sessions,
        segment_max_bytes=segment_max_bytes,
        spill_max_bytes=spill_max_bytes,
        enabled=enabled,
        ship_interval=ship_interval,
    )


def flush() -> bool:
    """Write out events held in memory and fsync the store; ``True`` when nothing is left pending.

    Example:
        >>> flush()
        True
    """
    return _tracer.flush()


def shutdown() -> None:
    """End the implicit session, flush and close the store (also runs at interpreter exit).

    Example:
        >>> shutdown()
    """
    _tracer.shutdown()


def stats() -> dict[str, Any]:
    """Counters of what was recorded and what went wrong (write failures, spills, drops, …).

    Example:
        >>> stats()["write_failures"] >= 0
        True
    """
    return _tracer.stats()
