"""The running session: the :class:`Session` object and the context variable that holds the current one.

This is the layer below the tracer: a Session writes its events through the tracer that opened it
(handed to it at creation), so nothing here imports the tracer, and the tracer can create the implicit
session and look up the current one. ``sdk._session`` builds the public ``session()`` scope on top.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from sdk._internal import count
from sdk._records import new_id, same_tools
from sdk.store._events import check_reward, encode_event

if TYPE_CHECKING:
    from sdk._link import Attempt
    from sdk._records import CallRecord
    from sdk.store._writer import SegmentWriter

__all__ = ["Session", "current_session"]

_MAX_THREADS_PER_SESSION = 4
"""Recent threads of a session kept for prefix deduplication."""

_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar("tracerl_session", default=None)


def current_session() -> Session | None:
    """Return the innermost active session in this context, or ``None``.

    Example:
        >>> current_session() is None
        True
    """
    return _current.get()


class _Tracer(Protocol):
    """What a Session needs from the tracer that opened it (``sdk._tracer.Tracer``)."""

    @property
    def writer(self) -> SegmentWriter: ...

    def reward(self, s: Session, value: float, name: str, call_id: str | None) -> None: ...


def _common_prefix(messages: list[Any], thread: list[Any]) -> int:
    n = len(thread)
    if len(messages) >= n and messages[:n] == thread:
        return n
    i = 0
    for a, b in zip(messages, thread, strict=False):
        if a != b:
            break
        i += 1
    return i


class Session:
    """A running session: the calls, rewards and metadata of one attempt at one task.

    Created by :func:`sdk.session`; you receive it from ``with session(...) as s``.

    Attributes:
        session_id: Unique id (also in the store).
        task_id: Groups sessions into GRPO groups; inherited from the enclosing session if not given.
        sample: Optional sample / rollout index.
        metadata: Merged metadata (enclosing sessions' first, this one's wins).
        parent_session_ids: Enclosing sessions' ids, outermost first.
        num_calls: Calls recorded in this session and in sessions nested inside it.
        num_tool_calls: Tool calls the server parsed in those calls' responses.
        num_malformed_tool_calls: Those calls whose response opens a tool call the server did not parse
            (stored with ``malformed_tool_call``; see :func:`sdk.messages.malformed_tool_call`).
        rewards: ``(name, value, call_id)`` tuples given so far.

    Example:
        >>> from sdk import session
        >>> with session(task_id="t1") as s:
        ...     s.reward(1.0)
        >>> s.rewards
        [('reward', 1.0, None)]
    """

    __slots__ = (
        "session_id",
        "task_id",
        "sample",
        "metadata",
        "parent",
        "parent_session_ids",
        "implicit",
        "started_at",
        "ended_at",
        "num_calls",
        "num_tool_calls",
        "num_malformed_tool_calls",
        "rewards",
        "last_call_id",
        "_lock",
        "_threads",
        "_token",
        "_scope",
        "_transport_calls",
        "_waiting",
        "_tracer",
    )

    def __init__(
        self,
        task_id: str | None,
        metadata: dict[str, Any],
        *,
        sample: int | None = None,
        parent: Session | None = None,
        session_id: str | None = None,
        implicit: bool = False,
        tracer: _Tracer,
    ) -> None:
        self.session_id = session_id or new_id()
        self.task_id = task_id
        self.sample = sample
        self.metadata = metadata
        self.parent = parent
        self.parent_session_ids: list[str] = (
            [*parent.parent_session_ids, parent.session_id] if parent is not None else []
        )
        self.implicit = implicit
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.num_calls = 0
        self.num_tool_calls = 0
        self.num_malformed_tool_calls = 0
        self.rewards: list[tuple[str, float, str | None]] = []
        self.last_call_id: str | None = None
        self._lock = threading.Lock()
        # Recent threads for prefix deduplication: (call_id, request messages + response, tools,
        # (prompt token ids, completion token ids), [the tools' JSON once computed]).
        self._threads: list[tuple[str, list[Any], Any, tuple[Any, Any], list[str | None]]] = []
        self._token: contextvars.Token[Session | None] | None = None
        self._scope: object | None = None  # the sdk._session.SessionScope that opened it
        # Recent calls seen by a recording transport, by fingerprint, so that a framework hook's view of
        # the same call is linked to it (the reader merges the two) instead of counted twice.
        self._transport_calls: dict[Any, list[str]] = {}
        self._waiting: list[Attempt] = []  # attempts a hook's record waits for (see _join)
        self._tracer = tracer

    def __repr__(self) -> str:
        return f"Session(session_id={self.session_id!r}, task_id={self.task_id!r}, calls={self.num_calls})"

    def reward(self, value: float, name: str = "reward", *, call_id: str | None = None) -> None:
        """Record a reward for this session (or for one of its calls with ``call_id``).

        The last value given under a name wins. May be called after the session ended (post-hoc
        scoring). Raises ``ValueError`` for non-numbers, NaN and infinities.

        Args:
            value: A finite real number.
            name: Reward name; ``"reward"`` is the episode reward trainers use by default.
            call_id: Attach the reward to one call (see ``Session.last_call_id``).

        Example:
            >>> from sdk import session
            >>> with session(task_id="t1") as s:
            ...     s.reward(0.5, name="format")
        """
        v = check_reward(value, name)
        self.rewards.append((name, v, call_id))
        self._tracer.reward(self, v, name, call_id)

    def _join(self, record: CallRecord) -> tuple[str | None, Attempt | None]:
        """Under the lock: the transport call ``record`` is another view of, or the attempt to wait for.

        A transport's record is noted; a framework hook's is joined to one of the HTTP requests its own
        call sent (sdk/_link.py): the latest with the same content, else the latest not yet joined. A hook
        whose link saw no request (integrations that open none, a request sent from another context)
        falls back to content: the oldest transport record, sent under no link, with the same fingerprint.
        """
        if record.source == "transport":
            att = record.attempt
            fp = record.fingerprint()
            if att is not None:
                att.fingerprint, att.session, att.recorded = fp, self, True
            elif fp is not None:
                ids = self._transport_calls.setdefault(fp, [])
                ids.append(record.call_id)
                if len(ids) > 16:  # the same exchange over and over with no hook to join it
                    del ids[0]
                if len(self._transport_calls) > 16:
                    del self._transport_calls[next(iter(self._transport_calls))]
            return None, None
        link = record.link
        if link is None or not link.attempts:
            # No request was sent under this call's identity (no link, or the framework sent it from
            # another context): the transport's records of such requests are joined by content.
            if not self._transport_calls:
                return None, None
            fp = record.fingerprint()
            ids = self._transport_calls.get(fp)
            if not ids:
                return None, None
            same = ids.pop(0)
            if not ids:
                del self._transport_calls[fp]
            return same, None
        fp = record.fingerprint()
        mine = [a for a in link.attempts if a.recorded and a.session is self and not a.claimed]
        pick = next((a for a in reversed(mine) if a.fingerprint == fp), None)
        if pick is None:
            pending = [a for a in link.attempts if not a.recorded]
            if pending and pending[-1].waiting is None:
                return None, pending[-1]  # the hook ended before the transport's record: wait for it
            pick = mine[-1] if mine else None
        if pick is None:
            return None, None
        pick.claimed = True
        return pick.call_id, None

    def _record(self, record: CallRecord, *, join: bool = True) -> bool:
        """Write ``record``; ``False`` when it only completes a call the transport recorded (or will)."""
        messages = record.messages
        with self._lock:
            same_call_as, wait = self._join(record) if join else (None, None)
            if wait is not None:
                wait.waiting = (record, self)
                self._waiting.append(wait)
                return False
            best_n, best = 0, None
            for cand in reversed(self._threads):
                n = _common_prefix(messages, cand[1])
                if n > best_n:
                    best_n, best = n, cand
                    if n == len(cand[1]):
                        break
            tools_json: list[str | None] = [None]
            if best is None:
                event = record.to_event(self.session_id, self.parent_session_ids, same_call_as=same_call_as)
            else:
                # The usual base is the session's previous call: then its id is implied.
                base = {"n": best_n} if best is self._threads[-1] else {"call_id": best[0], "n": best_n}
                same = same_tools(record.tools, best[2], best[4])
                if same:
                    tools_json = best[4]  # the same bytes: one cached encoding for both
                event = record.to_event(
                    self.session_id,
                    self.parent_session_ids,
                    messages=messages[best_n:],
                    base=base,
                    tools_from_base=same,
                    same_call_as=same_call_as,
                    base_token_ids=best[3],
                )
            thread = messages if record.response_message is None else [*messages, record.response_message]
            tokens = (record.prompt_token_ids, record.completion_token_ids)
            self._threads.append((record.call_id, thread, record.tools, tokens, tools_json))
            if len(self._threads) > _MAX_THREADS_PER_SESSION:
                del self._threads[0]
            # Written under the session lock so a call is never on disk before the call it builds on.
            self._tracer.writer.append(encode_event(event))
            self.last_call_id = record.call_id
        att = record.attempt
        if att is not None and att.waiting is not None:
            self._release(att)  # a hook's record of this same call was waiting for this one
        if same_call_as is not None:
            return False  # the transport's record of this call was counted already
        msg = record.response_message
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        tool_calls = len(calls) if isinstance(calls, list) else 0
        malformed = int(record.malformed_tool_call)
        s: Session | None = self
        while s is not None:
            s.num_calls += 1
            s.num_tool_calls += tool_calls
            s.num_malformed_tool_calls += malformed
            s = s.parent
        return True

    def _release(self, att: Attempt, *, join: bool = True) -> None:
        """Write the hook's record that waited for ``att`` (joined to it, or on its own)."""
        waiting, att.waiting = att.waiting, None
        if waiting is None:
            return
        rec, owner = waiting
        with owner._lock:
            if att in owner._waiting:
                owner._waiting.remove(att)
        if owner._record(rec, join=join):
            count("calls_recorded")

    def _release_waiting(self) -> None:
        """At the session's end: hook records whose transport record never came are written on their own."""
        for att in list(self._waiting):
            self._release(att, join=False)
