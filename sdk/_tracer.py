"""The tracer: owns the configuration, the store writer and the implicit session, and appends events.

The hot path (:meth:`Tracer.record_call`) runs on the user's thread for every LLM call. It does the
minimum: the call's session compares it with its recent threads (prefix deduplication, in
:meth:`sdk._context.Session._record`), then one ``json.dumps`` of what is new and one ``os.write``. It
is firewalled: nothing in it can raise into the agent.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sdk._config import Config, validate_store_path
from sdk._context import Session, current_session
from sdk._internal import capture_internal_exceptions, count, counters, warn_once
from sdk.store import _events as events
from sdk.store._events import encode_event
from sdk.store._writer import SegmentWriter

if TYPE_CHECKING:
    from sdk._records import CallRecord

__all__ = ["Tracer", "tracer"]


class Tracer:
    """Process-wide owner of the configuration, the store writer and the implicit session."""

    def __init__(self) -> None:
        self.config = Config.from_env()
        self._lock = threading.RLock()
        self._writer: SegmentWriter | None = None
        self._shipper: Any = None  # a SegmentShipper when the store is an object-store URI
        self._implicit: Session | None = None
        self._implicit_pid = -1
        self._atexit = False
        # Calls whose response is still being read: (session, finish(reason), pid) by key. A session that
        # ends, or a shutdown, finishes them first, so a stream never left closed is recorded in time.
        self._open_calls: dict[int, tuple[Session | None, Callable[[str], None], int]] = {}
        self._open_lock = threading.Lock()
        self._open_keys = itertools.count()

    # -- configuration -----------------------------------------------------------------------

    def configure(self, **changes: Any) -> Config:
        """Apply configuration changes (validated) and return the new config."""
        if "store" in changes and changes["store"] is not None:
            from sdk.store._remote import is_store_uri, spool_dir

            if is_store_uri(changes["store"]):  # local segments in the spool, shipped to the URI
                changes["store_uri"] = changes["store"].rstrip("/")
                changes["store"] = spool_dir(changes["store"])
            else:
                changes["store"] = validate_store_path(changes["store"])
                changes["store_uri"] = ""  # kept through the None filter below, then cleared
        changes = {k: v for k, v in changes.items() if v is not None}
        if changes.get("fsync", "never") not in ("never", "interval", "always"):
            raise ValueError(f"fsync must be 'never', 'interval' or 'always', got {changes['fsync']!r}")
        if changes.get("implicit_sessions", "process") not in ("process", "off"):
            raise ValueError(
                f"implicit_sessions must be 'process' or 'off', got {changes['implicit_sessions']!r}"
            )
        for key in ("fsync_interval", "segment_max_bytes", "spill_max_bytes", "ship_interval"):
            if key in changes and not (isinstance(changes[key], (int, float)) and changes[key] > 0):
                raise ValueError(f"{key} must be a positive number, got {changes[key]!r}")
        new = dataclasses.replace(self.config, **changes)
        if new.store_uri == "":
            new = dataclasses.replace(new, store_uri=None)
        if new.store.exists() is False:
            try:
                new.store.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"cannot create the store directory {str(new.store)!r}: {exc}") from None
        with self._lock:
            self._close_locked()
            self.config = new
        return new

    def restore(self, config: Config) -> None:
        """Put back a configuration this tracer had (``tracer.config`` read earlier), as it was.

        Unlike :meth:`configure` it creates nothing: a store directory that did not exist then (the default
        ``./.tracerl`` before anything was recorded) is not made now.
        """
        with self._lock:
            self._close_locked()
            self.config = config

    @property
    def writer(self) -> SegmentWriter:
        """The store writer for the current configuration (created on first use)."""
        w = self._writer
        if w is None:
            with self._lock:
                if self._writer is None:
                    c = self.config
                    self._writer = SegmentWriter(
                        c.store,
                        fsync=c.fsync,
                        fsync_interval=c.fsync_interval,
                        segment_max_bytes=c.segment_max_bytes,
                        spill_max_bytes=c.spill_max_bytes,
                    )
                    if c.store_uri:
                        from sdk.store._remote import SegmentShipper

                        self._shipper = SegmentShipper(c.store, c.store_uri, interval=c.ship_interval)
                        self._shipper.start()
                    if not self._atexit:
                        atexit.register(self.shutdown)
                        self._atexit = True
                w = self._writer
        return w

    # -- events ------------------------------------------------------------------------------

    def append(self, event: dict[str, Any]) -> None:
        """Encode and append one event (firewalled by the callers)."""
        self.writer.append(encode_event(event))

    def session_started(self, s: Session, *, spans_processes: bool = False) -> None:
        """Write the ``session_start`` event of ``s`` (``spans_processes``: see ``events.session_start``)."""
        if not self.config.enabled:
            return
        with capture_internal_exceptions("session_start"):
            self.append(
                events.session_start(
                    s.session_id,
                    ts=s.started_at,
                    task_id=s.task_id,
                    sample=s.sample,
                    metadata=s.metadata,
                    parent_session_ids=s.parent_session_ids,
                    implicit=s.implicit,
                    pid=os.getpid(),
                    spans_processes=spans_processes,
                )
            )
            count("sessions_started")

    def track_open_call(self, s: Session | None, finish: Callable[[str], None]) -> Callable[[], None]:
        """Have ``finish(reason)`` called if ``s`` ends or the tracer shuts down first; returns untrack."""
        key = next(self._open_keys)
        with self._open_lock:
            self._open_calls[key] = (s, finish, os.getpid())

        def untrack() -> None:
            with self._open_lock:
                self._open_calls.pop(key, None)

        return untrack

    def _finish_open_calls(self, s: Session | None, reason: str) -> None:
        """Finish this process's open calls of ``s`` (every one when ``None``), each recorded once."""
        if not self._open_calls:
            return
        pid = os.getpid()  # a forked child does not record its parent's streams
        with self._open_lock:
            due = [
                k for k, (owner, _, p) in self._open_calls.items() if p == pid and (s is None or owner is s)
            ]
            finishers = [self._open_calls.pop(k)[1] for k in due]
        for finish in finishers:
            with capture_internal_exceptions("open_call"):
                finish(reason)

    def session_ended(self, s: Session, error: BaseException | None) -> None:
        """Write the ``session_end`` event of ``s`` (after the calls still open in it)."""
        self._finish_open_calls(s, "its session ended")
        with capture_internal_exceptions("session_end"):
            s._release_waiting()  # hook records whose transport record never came: written on their own
        if not self.config.enabled:
            return
        with capture_internal_exceptions("session_end"):
            self.append(events.session_end(s.session_id, ts=s.ended_at, error=error, num_calls=s.num_calls))

    def reward(self, s: Session, value: float, name: str, call_id: str | None) -> None:
        """Write a ``reward`` event for ``s``."""
        if not self.config.enabled:
            return
        with capture_internal_exceptions("reward"):
            self.append(events.reward(s.session_id, value, name, call_id, time.time()))

    def capture_target(self) -> Session | None:
        """The session a call starting now belongs to: the current one, else the implicit one."""
        if not self.config.enabled:
            return None
        s = current_session()
        if s is not None:
            return s
        return self.implicit_session()

    def implicit_session(self) -> Session | None:
        """This process's implicit session (created on first use), or ``None`` when turned off."""
        if self.config.implicit_sessions == "off" or not self.config.enabled:
            return None
        s = self._implicit
        if s is not None and self._implicit_pid == os.getpid():
            return s
        with self._lock:
            if self._implicit is None or self._implicit_pid != os.getpid():
                s = Session(task_id=None, metadata={}, implicit=True, tracer=self)
                self.session_started(s)
                self._implicit, self._implicit_pid = s, os.getpid()
            return self._implicit

    def record_call(self, record: CallRecord, session: Session | None = None) -> None:
        """Persist ``record`` in ``session`` (default: the current or implicit session). Never raises."""
        with capture_internal_exceptions("record_call"):
            if not self.config.enabled:
                return
            s = session if session is not None else self.capture_target()
            if s is None:
                count("calls_outside_session_skipped")
                warn_once(
                    "outside-session",
                    "an LLM call was made outside any session and implicit sessions are off; it was not "
                    "recorded (counted in sdk.stats()['calls_outside_session_skipped'])",
                )
                return
            if s._record(record):
                count("calls_recorded")

    # -- lifecycle ---------------------------------------------------------------------------

    def flush(self) -> bool:
        """Write out anything held in memory and fsync; ``True`` when nothing is pending."""
        with capture_internal_exceptions("flush"):
            w = self._writer
            ok = True if w is None else w.flush()
            if self._shipper is not None:
                self._shipper.ship()
            return ok
        return False

    def _close_locked(self) -> None:
        implicit = self._implicit
        if implicit is not None and self._implicit_pid == os.getpid():
            implicit.ended_at = time.time()
            self.session_ended(implicit, None)
        self._implicit = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._shipper is not None:
            self._shipper.close()
            self._shipper = None

    def shutdown(self) -> None:
        """End the implicit session, flush and close the store. Safe to call more than once."""
        with capture_internal_exceptions("shutdown"), self._lock:
            self._finish_open_calls(None, "the SDK shut down (sdk.shutdown() or the process exited)")
            self._close_locked()

    def stats(self) -> dict[str, Any]:
        """Counters plus the store path and the number of events pending in memory."""
        out: dict[str, Any] = {
            "calls_recorded": 0,
            "sessions_started": 0,
            "write_failures": 0,
            "events_spilled": 0,
            "events_dropped": 0,
            "internal_errors": 0,
            "values_stored_as_repr": 0,
            "calls_outside_session_skipped": 0,
            "streams_left_open": 0,
        }
        out.update(counters())
        out["store"] = self.config.store_uri or str(self.config.store)
        w = self._writer
        out["events_pending"] = 0 if w is None else w.pending
        return out


tracer = Tracer()
