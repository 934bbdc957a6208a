"""The store's event format: the only place events are built and encoded.

One constructor per event type (:func:`session_start`, :func:`call`, :func:`reward`,
:func:`session_end`, :func:`supersede`) returns the event as a dict with its keys in the order they are
written; the fields are documented in :mod:`sdk.store`. :func:`encode_event` turns an event into the line
appended to a segment. The reader checks ``v`` against :data:`EVENT_VERSION` and restores the call fields the
writer omitted (:data:`CALL_DEFAULTS`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any

from sdk._internal import count, warn_once

__all__ = [
    "CALL_DEFAULTS",
    "EVENT_VERSION",
    "call",
    "check_reward",
    "compact_logprobs",
    "encode_event",
    "expand_prompt_ids",
    "prompt_id_suffix",
    "reward",
    "session_end",
    "session_start",
    "supersede",
]

EVENT_VERSION = 1
"""Version of the event lines (``"v"``); the reader skips and counts events of a newer version."""

CALL_DEFAULTS: dict[str, Any] = {
    "parent_session_ids": [],
    "endpoint": "chat.completions",
    "response_model": None,
    "agent": None,
    "usage": None,
    "stream": False,
    "request_id": None,
    "error": None,
    "logprobs": None,
    "prompt_token_ids": None,
    "completion_token_ids": None,
    "prompt_token_suffix": None,
    "extra": None,
    "source": "framework",
    "same_call_as": None,
    "policy_version": None,
    "malformed_tool_call": False,
}
"""Values of the call fields that the writer omits when they hold their default."""


def session_start(
    session_id: str,
    *,
    ts: float,
    task_id: str | None,
    sample: int | None,
    metadata: dict[str, Any],
    parent_session_ids: list[str],
    implicit: bool,
    pid: int,
    spans_processes: bool = False,
) -> dict[str, Any]:
    """The ``session_start`` event.

    ``spans_processes`` marks a session that several processes write parts of (the gateway's workers,
    or a restarted gateway): the reader merges those parts into one session. Written only when true.

    Example:
        >>> session_start("s1", ts=1.0, task_id="t1", sample=None, metadata={}, parent_session_ids=[],
        ...               implicit=False, pid=1)["event"]
        'session_start'
    """
    event = {
        "event": "session_start",
        "v": EVENT_VERSION,
        "session_id": session_id,
        "ts": ts,
        "task_id": task_id,
        "sample": sample,
        "metadata": metadata,
        "parent_session_ids": parent_session_ids,
        "implicit": implicit,
        "pid": pid,
    }
    if spans_processes:
        event["spans_processes"] = True
    return event


def call(
    call_id: str,
    session_id: str,
    *,
    framework: str,
    model: str | None,
    request: dict[str, Any],
    response: dict[str, Any],
    started_at: float,
    ended_at: float,
    optional: tuple[tuple[str, Any], ...] = (),
) -> dict[str, Any]:
    """The ``call`` event; of the ``optional`` ``(field, value)`` pairs only values that carry information.

    A value is written when it is truthy and differs from its :data:`CALL_DEFAULTS` entry: the store's
    size is per-call overhead plus what is new in the conversation, and the reader restores the defaults.
    ``policy_version`` is written whenever known (0 is the first weights' version, not "unknown").

    Example:
        >>> e = call("c1", "s1", framework="openai", model="m", request={"messages": []},
        ...          response={"message": None, "finish_reason": None}, started_at=1.0, ended_at=2.0,
        ...          optional=(("stream", False), ("source", "transport")))
        >>> e["source"], "stream" in e
        ('transport', False)
    """
    event: dict[str, Any] = {
        "event": "call",
        "v": EVENT_VERSION,
        "call_id": call_id,
        "session_id": session_id,
        "framework": framework,
        "model": model,
        "request": request,
        "response": response,
        "started_at": started_at,
        "ended_at": ended_at,
    }
    for key, value in optional:
        if (value and value != CALL_DEFAULTS[key]) or (key == "policy_version" and value is not None):
            event[key] = value
    return event


def compact_logprobs(entries: list[Any] | None, completion_ids: list[int] | None) -> list[Any] | None:
    """Per-token logprob entries as plain numbers, when nothing but the numbers would be lost.

    OpenAI-style entries (``{"token", "logprob", "top_logprobs"}``) spend most of their bytes on the
    token text, which is the server's decoding of the completion ids stored beside them. When the ids are
    there (one per entry) and no entry carries ``top_logprobs``, the entries are stored as their
    ``logprob`` numbers; otherwise they are stored as they are. Readers accept both forms.

    Example:
        >>> compact_logprobs([{"token": "a", "logprob": -0.5}], [7])
        [-0.5]
        >>> compact_logprobs([{"token": "a", "logprob": -0.5}], None)
        [{'token': 'a', 'logprob': -0.5}]
    """
    if not entries or not isinstance(completion_ids, list) or len(completion_ids) != len(entries):
        return entries
    out = []
    for e in entries:
        if type(e) is not dict or e.get("top_logprobs") or not set(e) <= _PLAIN_ENTRY:
            return entries
        lp = e.get("logprob")
        if type(lp) not in (float, int):  # exact types: a bool (its own type) or a subclass keeps the entries
            return entries
        out.append(lp)
    return out


_PLAIN_ENTRY = frozenset({"token", "logprob", "top_logprobs"})


def _prefix_len(a: list[Any], b: list[Any]) -> int:
    """Length of the common prefix of ``a`` and ``b`` (slice comparisons run in C: O(n log n))."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prompt_id_suffix(
    prompt_ids: list[int], base_prompt: list[int] | None, base_completion: list[int] | None
) -> dict[str, Any] | None:
    """``prompt_ids`` relative to the base call's prompt + completion ids: ``{"n", "ids"}``, or ``None``.

    The stored form of a call's prompt ids when its request has a base (``request.base``): the first
    ``n`` ids of the base call's prompt ids followed by its completion ids, then ``ids``. ``None`` when
    nothing is shared (the full list is stored as ``prompt_token_ids``).

    Example:
        >>> prompt_id_suffix([1, 2, 3, 9, 5], [1, 2], [3, 4])
        {'n': 3, 'ids': [9, 5]}
    """
    if not isinstance(prompt_ids, list) or not isinstance(base_prompt, list):
        return None
    n = _prefix_len(prompt_ids, base_prompt)
    if n == len(base_prompt) and isinstance(base_completion, list):
        n += _prefix_len(prompt_ids[n:], base_completion)
    return {"n": n, "ids": prompt_ids[n:]} if n else None


def expand_prompt_ids(
    suffix: Any, base_prompt: list[int] | None, base_completion: list[int] | None
) -> list[int] | None:
    """The full prompt ids from a stored ``prompt_token_suffix`` (see :func:`prompt_id_suffix`).

    ``None`` when the suffix is malformed or reaches past what the base call has.

    Example:
        >>> expand_prompt_ids({"n": 3, "ids": [9, 5]}, [1, 2], [3, 4])
        [1, 2, 3, 9, 5]
    """
    if type(suffix) is not dict or not isinstance(base_prompt, list):
        return None
    n, ids = suffix.get("n"), suffix.get("ids")
    if type(n) is not int or n < 0 or not isinstance(ids, list):
        return None
    if n <= len(base_prompt):
        return base_prompt[:n] + ids
    rest = n - len(base_prompt)
    if not isinstance(base_completion, list) or rest > len(base_completion):
        return None
    return base_prompt + base_completion[:rest] + ids


def reward(session_id: str, value: float, name: str, call_id: str | None, ts: float) -> dict[str, Any]:
    """The ``reward`` event (``value`` checked by :func:`check_reward` first).

    Example:
        >>> reward("s1", 1.0, "reward", None, 5.0)["value"]
        1.0
    """
    return {
        "event": "reward",
        "v": EVENT_VERSION,
        "session_id": session_id,
        "value": value,
        "name": name,
        "call_id": call_id,
        "ts": ts,
    }


def session_end(
    session_id: str, *, ts: float | None, error: BaseException | None, num_calls: int
) -> dict[str, Any]:
    """The ``session_end`` event; ``error`` is the exception the session ended with, if any.

    Example:
        >>> session_end("s1", ts=2.0, error=ValueError("bad"), num_calls=3)["error"]
        {'type': 'ValueError', 'message': 'bad'}
    """
    return {
        "event": "session_end",
        "v": EVENT_VERSION,
        "session_id": session_id,
        "ts": ts,
        "status": "ok" if error is None else "error",
        "error": None if error is None else {"type": type(error).__name__, "message": str(error)[:2000]},
        "num_calls": num_calls,
    }


SUPERSEDE_MARK = b'"supersede"'
"""Bytes of a ``supersede`` event line (readers find these lines in a first pass, as spread sessions)."""


def supersede(session_id: str, *, reason: str, ts: float, run: str | None = None) -> dict[str, Any]:
    """The ``supersede`` event: session ``session_id`` is replaced by a later attempt and must not be trained.

    Written by the rollout runner for the cut-short attempts of a (task, sample) it runs again
    (``reason`` ``"rerun"``, ``run`` its results file's key). Readers keep the session and mark it
    ``superseded``; the episode export leaves it out, counted. Readers from before this event count its
    line as an ``unknown_event`` and read the rest of the store as before.

    Example:
        >>> supersede("s1", reason="rerun", ts=3.0)["event"]
        'supersede'
    """
    event: dict[str, Any] = {"event": "supersede", "v": EVENT_VERSION, "session_id": session_id}
    event["reason"] = reason
    if run is not None:
        event["run"] = run
    event["ts"] = ts
    return event


def check_reward(value: object, name: object) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` for a non-finite or non-real value or a bad name.

    Example:
        >>> check_reward(1, "reward")
        1.0
    """
    # numbers.Real, not sdk._numbers: a reward the user's code computes may be a numpy float32 or a Fraction.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"reward must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"reward must be a finite number, got {v!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    return v


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    count("values_stored_as_repr")
    warn_once(
        f"repr:{type(value).__qualname__}",
        "a value of type %s is not JSON-serialisable; it is stored as its repr()",
        type(value).__qualname__,
    )
    return repr(value)


def encode_event(event: dict[str, Any]) -> bytes:
    r"""Encode one event as a newline-terminated JSON line.

    Example:
        >>> encode_event({"event": "reward", "value": 1.0})
        b'{"event":"reward","value":1.0}\n'
    """
    text = json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # lone surrogates: escape them so the line stays valid UTF-8
        return json.dumps(event, separators=(",", ":"), default=_json_default).encode("ascii") + b"\n"
