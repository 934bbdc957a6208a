"""The gateway's open sessions: one :class:`~sdk.capture.Session` per session id seen by this worker.

In-process capture opens a session with ``with session(...)`` and keeps it in a context variable; the
gateway sees only ids (in the URL or a header), from any connection, in any of its worker processes. So
each worker opens its own ``Session`` object for an id the first time it sees it. The ``session_start``
it writes is marked ``"spans_processes": true``: the store reader merges the parts that several
processes (workers, or a restarted gateway) wrote for one id into one session.

Everything here that is not public SDK API is in :func:`_open_session`, :func:`_end_session` and
:func:`_reward_event` (marked "internal" below), so a change of the session internals touches only them.
"""

from __future__ import annotations

import collections
import hashlib
import json
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

from sdk.capture import Session, capture_internal_exceptions, count
from sdk.store import _events as events

__all__ = ["SessionTable"]

MAX_OPEN_SESSIONS = 100_000
"""Sessions a worker keeps open; past this the least recently used one is forgotten (not ended)."""


# --- internal: the only uses of SDK internals in the gateway ------------------------------------------


def _open_session(
    session_id: str, task_id: str | None, sample: int | None, metadata: dict[str, Any]
) -> Session:
    """Create a session object for ``session_id`` and write its ``session_start`` (internal)."""
    from sdk._tracer import tracer

    s = Session(task_id, metadata, sample=sample, session_id=session_id, tracer=tracer)
    # Other workers (and a restarted gateway) write parts of this session too.
    tracer.session_started(s, spans_processes=True)
    return s


def _end_session(s: Session, error: str | None) -> None:
    """Write ``s``'s ``session_end`` (internal)."""
    from sdk._tracer import tracer

    s.ended_at = time.time()
    tracer.session_ended(s, None if error is None else _SessionError(error))


def _reward_event(session_id: str, value: float, name: str, call_id: str | None) -> None:
    """Write a reward for a session this worker has not opened (internal). ``ValueError`` if invalid."""
    from sdk._tracer import tracer

    value = events.check_reward(value, name)
    if not tracer.config.enabled:
        return
    with capture_internal_exceptions("gateway.reward"):
        tracer.append(events.reward(session_id, value, name, call_id, time.time()))


def _in_store(session_id: str) -> bool:
    """Whether any segment of the configured local store has an event of ``session_id`` (internal).

    A byte search of the segment files for the id as the writer spells it; a store that is not local (or
    cannot be read) answers ``True``, so an id is never refused for want of a look.
    """
    from sdk._tracer import tracer

    store = tracer.config.store
    if getattr(tracer.config, "store_uri", None) or store is None:
        return True
    needles = {
        b'"session_id":' + json.dumps(session_id, ensure_ascii=ascii).encode("utf-8") + b","
        for ascii in (False, True)
    }
    try:
        paths = [p for p in Path(store).rglob("*.jsonl") if p.is_file()]
        for path in paths:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    continue
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    if any(data.find(n) >= 0 for n in needles):
                        return True
    except OSError:
        return True
    return False


class _SessionError(Exception):
    """The error a client reported when it ended a session (stored as its type and message)."""


# --- the table ------------------------------------------------------------------------------------------


class SessionTable:
    """Open sessions of this worker by id, least recently used first.

    Example:
        >>> table = SessionTable()
        >>> s = table.get("s1", task_id="t1")
        >>> table.get("s1") is s
        True
        >>> table.end("s1")
    """

    def __init__(self, max_open: int = MAX_OPEN_SESSIONS, shared_dir: str | None = None) -> None:
        self.max_open = max_open
        # Where the workers of one gateway mark the ids they opened (see `known`).
        self.shared_dir = shared_dir
        self._open: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def get(
        self,
        session_id: str,
        task_id: str | None = None,
        sample: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """The open session ``session_id``, opened (``session_start`` written) if this worker has none."""
        with self._lock:
            s = self._open.get(session_id)
            if s is not None:
                self._open.move_to_end(session_id)
                return s
            s = _open_session(session_id, task_id, sample, dict(metadata or {}))
            self._open[session_id] = s
            self._mark(session_id)
            if len(self._open) > self.max_open:
                # Forgotten, not ended: a later call reopens it, and the reader merges the two parts.
                self._open.popitem(last=False)
                count("gateway_sessions_forgotten")
            return s

    def _mark(self, session_id: str) -> None:
        if self.shared_dir is not None:
            with capture_internal_exceptions("gateway.session"):
                Path(self.shared_dir, _marker(session_id)).touch()

    def known(self, session_id: str) -> bool:
        """Whether ``session_id`` was opened: by this worker, another worker of this gateway, or in the store.

        Example:
            >>> table = SessionTable()
            >>> _ = table.get("s2")
            >>> table.known("s2")
            True
        """
        with self._lock:
            if session_id in self._open:
                return True
        if self.shared_dir is not None and Path(self.shared_dir, _marker(session_id)).exists():
            return True
        return _in_store(session_id)

    def end(self, session_id: str, error: str | None = None) -> None:
        """End ``session_id`` in this worker (opened first if only other workers have it)."""
        s = self.get(session_id)
        with self._lock:
            self._open.pop(session_id, None)
        _end_session(s, error)

    def reward(self, session_id: str, value: float, name: str = "reward", call_id: str | None = None) -> None:
        """Record a reward for ``session_id``; ``ValueError`` for a non-finite value or an empty name."""
        with self._lock:
            s = self._open.get(session_id)
        if s is not None:
            s.reward(value, name, call_id=call_id)
        else:
            _reward_event(session_id, value, name, call_id)


def _marker(session_id: str) -> str:
    # A file name for any id (ids may hold "/", NUL, or be longer than a name may be).
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()
