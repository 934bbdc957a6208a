"""Joining a framework hook's record of a call with the recording transport's, by the request's identity.

A framework hook (LangChain's ``on_chat_model_start``) opens a :class:`CallLink` in the context its call
runs in; the recording transport, which sends that call's HTTP requests from the same context, adds each
request it sends to the links open there as an :class:`Attempt`. When the hook's record arrives, its
session joins it to one of *its* link's attempts (the latest with the same content, else the latest one),
never to a request sent from another context: two sub-agents asking the same thing at the same moment
each keep their own record. Content only chooses among the requests one framework call made (retries,
or several runs started in one context).
"""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["Attempt", "CallLink", "start_attempt", "open_link"]

_MAX_CHAIN = 8
"""Open links, in one context, that one HTTP request is added to (runs started together, e.g. a batch)."""

_MAX_ATTEMPTS = 64
"""Requests one framework call may send (retries); a link reaching it is closed (its end was lost)."""

_current: contextvars.ContextVar[CallLink | None] = contextvars.ContextVar("tracerl_call_link", default=None)


class Attempt:
    """One HTTP request a recording transport sent; filled in as its record is written."""

    __slots__ = ("call_id", "fingerprint", "session", "recorded", "claimed", "waiting")

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.fingerprint: Any = None
        self.session: Any = None  # the Session its record was written in
        self.recorded = False
        self.claimed = False  # a hook's record was joined to it
        # A hook's (record, session) that ended before this attempt's record was written: written after it.
        self.waiting: tuple[Any, Any] | None = None


class CallLink:
    """One framework call, and the HTTP requests sent while it was open in its context."""

    __slots__ = ("attempts", "open", "prev")

    def __init__(self, prev: CallLink | None) -> None:
        self.attempts: list[Attempt] = []
        self.open = True
        self.prev = prev

    def close(self) -> None:
        """The framework call ended: later requests from this context are not its."""
        self.open = False
        self.prev = None


def open_link() -> CallLink:
    """Open a link for a framework call starting in this context (links still open stay open too)."""
    cur = _current.get()
    link = CallLink(cur if cur is not None and cur.open else None)
    _current.set(link)
    tail = link
    for _ in range(_MAX_CHAIN):  # calls that never ended must not chain up without bound
        if tail.prev is None:
            break
        tail = tail.prev
    else:
        tail.prev = None
    return link


def start_attempt(call_id: str) -> Attempt | None:
    """Add a request being sent now to the links open in this context; ``None`` when there are none."""
    link = _current.get()
    if link is None or not link.open:
        return None
    attempt = Attempt(call_id)
    for _ in range(_MAX_CHAIN):
        older = link.prev
        if link.open:
            link.attempts.append(attempt)
            if len(link.attempts) >= _MAX_ATTEMPTS:  # a call whose end never came: stop growing it
                link.close()
        if older is None:
            break
        link = older
    return attempt
