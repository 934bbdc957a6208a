"""The store: where captured sessions, calls and rewards live.

The embedded store is a directory of append-only JSON-line segment files (one per process). Write
through :mod:`sdk` (sessions, rewards); read back with :class:`StoreReader` / :func:`read_sessions`, or
follow a growing store with :class:`StoreTail` (only what was appended since its last read).

Event lines (``v`` = 1), one JSON object per line, built only by the constructors of
``sdk.store._events``:

- ``session_start``: ``session_id, ts, task_id, sample, metadata, parent_session_ids, implicit, pid``
- ``call``: a CallRecord; ``request.messages`` holds only what is new relative to an earlier call of
  the same session (``request.base = {"call_id", "n"}``: the first ``n`` messages of that call's
  request messages + response message; no ``call_id`` means the session's previous call); with a
  base, absent ``request.tools`` means the base's tools. Fields at their default are omitted
  (``sdk.store._events.CALL_DEFAULTS``); the reader restores them. Token data is compact: with a base,
  the prompt ids are ``prompt_token_suffix = {"n", "ids"}`` (the first ``n`` of the base call's prompt +
  completion ids, then ``ids``) instead of ``prompt_token_ids``, and ``logprobs`` are plain numbers when
  the completion ids are stored beside them and no entry has ``top_logprobs`` (older stores: per-token
  entries and full prompt ids, read as before). ``same_call_as`` links a framework
  hook's record to the recording transport's record of the same call (merged on read);
  ``malformed_tool_call: true`` marks a response whose content opens a tool call that the server did not
  parse into ``tool_calls`` (``sdk.messages.malformed_tool_call``): counted by the rollout summary, the
  loop and ``tracerl inspect``, and the loop's ``malformed_tool_call_penalty`` scores it
- ``reward``: ``session_id, value, name, call_id, ts``
- ``session_end``: ``session_id, ts, status ("ok" | "error"), error, num_calls``
- ``supersede``: ``session_id, reason, run, ts``: that session is replaced by a later attempt (the rollout
  runner's re-run of its (task, sample)); read as ``StoredSession.superseded``, left out of episodes

Guarantees:

- **A call that returned to the agent is on disk** (in the OS page cache) before control returns: the event
  is one ``O_APPEND`` write on the agent's thread (:mod:`sdk.store._writer`), so ``kill -9`` loses only
  calls still in flight. ``configure(fsync="interval" | "always")`` (``TRACERL_FSYNC``) covers OS crashes.
- **Nothing is dropped silently.** A write the disk refuses leaves the agent's call unchanged; the SDK warns
  once, counts it (``sdk.stats()["write_failures"]``), keeps the lines in a bounded memory spill (a deleted
  segment's lines too, until the store can be written again) and retries them; what still cannot be
  written at exit is reported.
- **A stream the agent stops reading is still its session's call**: a raw OpenAI stream left open is
  recorded when its session ends (or at exit) with the text read so far, marked ``incomplete_stream`` and
  counted (``streams_left_open``); never written after its session ended.
- **Readers tolerate a torn last line** (counted as ``torn_line`` in ``StoreReader.problems``), and any
  number of processes can write one store, each to its own segments; the reader merges a session's parts.
- **No credentials**: every call record goes through one redaction rule when it is written
  (:func:`sdk.capture.redact`, rule in :mod:`sdk._redact`); headers are never read; the conversation
  itself (messages, tools, output) is kept as the model saw and produced it.
- **Object storage** (``s3://...``, any fsspec URI): events go to a local spool first and are shipped every
  ``TRACERL_SHIP_INTERVAL`` seconds (5), at ``sdk.flush()`` and at exit; the next process on the host ships
  what a crashed one left (:mod:`sdk.store._remote`).

Example:
    >>> import tempfile
    >>> from sdk.store import StoreReader
    >>> reader = StoreReader(tempfile.mkdtemp())
    >>> sum(1 for _ in reader.sessions())
    0
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sdk.store import _events as events
from sdk.store._events import EVENT_VERSION
from sdk.store._reader import StoredSession, StoreReader, read_sessions
from sdk.store._tail import StoreTail, TailUnsupported, TailUpdate
from sdk.store._writer import SegmentWriter

__all__ = [
    "EVENT_VERSION",
    "SegmentWriter",
    "StoreReader",
    "StoreTail",
    "StoredSession",
    "TailUnsupported",
    "TailUpdate",
    "add_reward",
    "read_sessions",
]


def add_reward(
    store: str | os.PathLike[str],
    session_id: str,
    value: float,
    name: str = "reward",
    *,
    call_id: str | None = None,
) -> None:
    """Append a reward for a stored session, e.g. from a scoring job that runs after the agent.

    Raises ``ValueError`` for a non-finite value and ``FileNotFoundError`` when ``store`` is missing.

    Example:
        >>> import tempfile
        >>> add_reward(tempfile.mkdtemp(), "0123abcd", 1.0)
    """
    v = events.check_reward(value, name)
    path = Path(store)
    if not path.is_dir():
        raise FileNotFoundError(f"no tracerl store at {str(path)!r}")
    writer = SegmentWriter(path)
    event = events.reward(session_id, v, name, call_id, time.time())
    try:
        if not writer.append(events.encode_event(event)):
            raise OSError(f"could not write the reward to {str(path)!r}")
    finally:
        writer.close()
