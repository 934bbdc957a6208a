"""The recording path integrations use: build a :class:`CallRecord`, hand it to :func:`record_call`.

Resolve the owning session when the call *starts* (:func:`capture_target`) and pass it to
:func:`record_call` when it ends: framework callbacks may fire in another context than the call.

Example:
    >>> from sdk import session
    >>> from sdk.capture import CallRecord, capture_target, record_call
    >>> with session(task_id="t1"):
    ...     target = capture_target()
    ...     record_call(CallRecord(framework="custom", messages=[{"role": "user", "content": "hi"}],
    ...                            response_message={"role": "assistant", "content": "hello"}), target)
"""

from __future__ import annotations

from sdk._internal import MissingDependency, capture_internal_exceptions, count, logger, warn_once
from sdk._records import CallRecord, new_id
from sdk._session import Session, current_session
from sdk._tracer import tracer

__all__ = [
    "CallRecord",
    "MissingDependency",
    "Session",
    "capture_internal_exceptions",
    "capture_target",
    "count",
    "current_session",
    "logger",
    "new_id",
    "record_call",
    "warn_once",
]


def capture_target() -> Session | None:
    """The session a call starting now belongs to: the current one, else the process's implicit one.

    ``None`` when capture is disabled or implicit sessions are off and no session is active.

    Example:
        >>> from sdk import session
        >>> with session(task_id="t1") as s:
        ...     capture_target() is s
        True
    """
    with capture_internal_exceptions("capture_target"):
        return tracer.capture_target()
    return None


def record_call(record: CallRecord, session: Session | None = None) -> None:
    """Persist one call in ``session`` (default: the current or implicit one). Never raises.

    The call is in the OS page cache when this returns.

    Example:
        >>> record_call(CallRecord(framework="custom", messages=[{"role": "user", "content": "hi"}]))
    """
    tracer.record_call(record, session)
