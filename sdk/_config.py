"""Configuration: capture's settings from its environment variables (their names are in sdk._env)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

from sdk import _env

__all__ = [
    "ENV_DISABLED",
    "ENV_FSYNC",
    "ENV_IMPLICIT",
    "ENV_SHIP_INTERVAL",
    "ENV_STORE",
    "Config",
    "validate_store_path",
]

ENV_STORE = _env.TRACERL_STORE
"""Store directory (default ``./.tracerl``) or object-store URI (``s3://bucket/prefix``)."""
ENV_SHIP_INTERVAL = _env.TRACERL_SHIP_INTERVAL
"""Seconds between uploads of the growing segment to an object-store store (default 5)."""
ENV_FSYNC = _env.TRACERL_FSYNC
"""fsync policy: ``never`` (default), ``interval`` or ``always``."""
ENV_IMPLICIT = _env.TRACERL_IMPLICIT_SESSIONS
"""What happens to calls outside any session: ``process`` (default) or ``off``."""
ENV_DISABLED = _env.TRACERL_DISABLED
"""Set to 1 to turn capture off entirely."""

FsyncPolicy = Literal["never", "interval", "always"]
ImplicitSessions = Literal["process", "off"]


@dataclasses.dataclass(frozen=True)
class Config:
    """Resolved tracerl configuration.

    Attributes:
        store: Directory of the event-log store (for an object-store store: this host's local segments).
        store_uri: The object-store URI (``s3://bucket/prefix``) segments are shipped to, or ``None``.
        ship_interval: Seconds between uploads of the growing segment to ``store_uri``.
        fsync: ``never`` relies on the OS page cache (survives ``kill -9``, not a power cut);
            ``interval`` fsyncs every ``fsync_interval`` seconds; ``always`` after every event.
        fsync_interval: Seconds between fsyncs under the ``interval`` policy.
        implicit_sessions: ``process`` records calls made outside any session into one implicit
            session per process; ``off`` skips them (counted in ``sdk.stats()``, warned once).
        segment_max_bytes: Segment files rotate past this size.
        spill_max_bytes: Events kept in memory while the store cannot be written; past this they are
            dropped and counted.
        enabled: ``False`` records nothing.

    Example:
        >>> Config.from_env().fsync in ("never", "interval", "always")
        True
    """

    store: Path = Path(".tracerl")
    store_uri: str | None = None
    ship_interval: float = 5.0
    fsync: FsyncPolicy = "never"
    fsync_interval: float = 1.0
    implicit_sessions: ImplicitSessions = "process"
    segment_max_bytes: int = 64 * 1024 * 1024
    spill_max_bytes: int = 64 * 1024 * 1024
    enabled: bool = True

    @classmethod
    def from_env(cls) -> Config:
        """Build a config from the ``TRACERL_*`` environment variables, with defaults."""
        fsync = os.environ.get(ENV_FSYNC, "never")
        implicit = os.environ.get(ENV_IMPLICIT, "process")
        if fsync not in ("never", "interval", "always"):
            fsync = "never"
        if implicit not in ("process", "off"):
            implicit = "process"
        from sdk.store._remote import is_store_uri, spool_dir

        store = os.environ.get(ENV_STORE) or ".tracerl"
        uri = None
        if is_store_uri(store):
            uri, store = store, str(spool_dir(store))
        try:
            interval = float(os.environ.get(ENV_SHIP_INTERVAL) or 5.0)
        except ValueError:
            interval = 5.0
        return cls(
            store=Path(store),
            store_uri=uri,
            ship_interval=interval if interval > 0 else 5.0,
            fsync=fsync,  # type: ignore[arg-type]
            implicit_sessions=implicit,  # type: ignore[arg-type]
            enabled=os.environ.get(ENV_DISABLED, "") in ("", "0", "false"),
        )


def validate_store_path(path: object) -> Path:
    """Return ``path`` as a ``Path`` or raise ``ValueError`` saying what is wrong with it.

    Example:
        >>> validate_store_path("./traces").name
        'traces'
    """
    if not isinstance(path, (str, os.PathLike)) or str(path).strip() == "":
        raise ValueError(f"store must be a directory path (str or os.PathLike), got {path!r}")
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ValueError(f"store path {str(p)!r} exists and is not a directory")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"store path {str(p)!r} is under {str(parent)!r}, which is not a directory")
            break
    return p
