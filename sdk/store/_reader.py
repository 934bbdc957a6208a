"""Reading a store back: segments → sessions with fully reconstructed calls.

Streaming by design: a process's segments are read in order and each session is yielded when its
``session_end`` event is seen, so memory holds only the sessions still open, whatever the store's size.
Every line that cannot be used is counted by reason in :attr:`StoreReader.problems`; nothing is dropped
without a count.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sdk._records import CALL_DEFAULTS
from sdk.store._writer import SEGMENT_SUFFIX

__all__ = ["EVENT_VERSION", "StoreReader", "StoredSession", "read_sessions"]

EVENT_VERSION = 1
"""Version written in every event's ``v`` field; readers reject larger versions (counted)."""

_KNOWN_EVENTS = frozenset({"session_start", "call", "reward", "session_end"})


@dataclasses.dataclass
class StoredSession:
    """One session as read back from the store.

    Attributes:
        session_id: Unique id.
        task_id: The task this session attempted (groups episodes for GRPO); ``None`` if not given.
        sample: Optional sample / rollout index within the task.
        metadata: Session metadata (outer sessions' metadata merged in, inner wins).
        parent_session_ids: Enclosing sessions, outermost first.
        started_at: Unix time of ``session_start`` (``None`` if that event is missing).
        ended_at: Unix time of ``session_end`` (``None`` if missing).
        status: ``ok``, ``error`` (the session body raised), ``incomplete`` (no ``session_end``:
            crash or kill) or ``implicit`` (calls made outside any session).
        error: ``{"type", "message"}`` when the session body raised.
        implicit: Whether this is a process's implicit session.
        calls: CallRecord dicts in call order, each with the full ``request.messages`` rebuilt.
        rewards: ``{"value", "name", "call_id", "ts"}`` dicts in the order they were given.

    Example:
        >>> s = StoredSession(session_id="s1")
        >>> s.reward is None
        True
    """

    session_id: str
    task_id: str | None = None
    sample: int | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    parent_session_ids: list[str] = dataclasses.field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    status: str = "incomplete"
    error: dict[str, Any] | None = None
    implicit: bool = False
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rewards: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def reward(self) -> float | None:
        """The session's default reward (name ``"reward"``, no ``call_id``): the last one given."""
        value = None
        for r in self.rewards:
            if r.get("name", "reward") == "reward" and r.get("call_id") is None:
                value = r["value"]
        return value

    @property
    def named_rewards(self) -> dict[str, float]:
        """Session-level rewards by name (the last value given for each name)."""
        return {r.get("name", "reward"): r["value"] for r in self.rewards if r.get("call_id") is None}


@dataclasses.dataclass
class _Open:
    session: StoredSession
    bases: dict[str, tuple[list[Any], Any]] = dataclasses.field(default_factory=dict)
    last: tuple[list[Any], Any] | None = None


class StoreReader:
    """Reads every segment of a store directory.

    Attributes:
        path: The store directory.
        problems: Counts of unusable or suspicious input by reason (``torn_line``, ``corrupt_line``,
            ``unknown_event``, ``missing_session_end``, ``missing_base``, …).
        examples: The first ``file:line`` seen for each problem reason, for error messages.
        num_calls: Calls read so far.
        num_sessions: Sessions yielded so far.
        num_merged: Framework records merged into the recording transport's record of the same call.

    Example:
        >>> import tempfile
        >>> reader = StoreReader(tempfile.mkdtemp())
        >>> list(reader.sessions())
        []
        >>> dict(reader.problems)
        {}
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"no tracerl store at {str(self.path)!r} (not a directory)")
        self.problems: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.num_calls = 0
        self.num_sessions = 0
        self.num_merged = 0

    def segments(self) -> list[list[Path]]:
        """Segment files grouped by writing process, each group in write order."""
        chains: dict[str, list[Path]] = {}
        for f in sorted(self.path.glob(f"*{SEGMENT_SUFFIX}")):
            key = f.name[: -len(SEGMENT_SUFFIX)].rsplit(".", 1)[0]
            chains.setdefault(key, []).append(f)
        return [chains[k] for k in sorted(chains)]

    def _problem(self, reason: str, where: str) -> None:
        self.problems[reason] += 1
        self.examples.setdefault(reason, where)

    def _lines(self, chain: list[Path]) -> Iterator[tuple[dict[str, Any], str]]:
        for i, seg in enumerate(chain):
            last_segment = i == len(chain) - 1
            # Line by line: reading a whole segment (up to segment_max_bytes) and splitting it held two
            # copies of it in memory.
            with open(seg, "rb") as fh:
                for n, raw in enumerate(fh, 1):
                    if not raw.endswith(b"\n"):
                        # A line without its newline is a write cut short (kill, crash): expected only at
                        # the very end of a process's last segment.
                        if raw.strip():
                            self._problem("torn_line" if last_segment else "corrupt_line", f"{seg.name}:{n}")
                        break
                    if not raw.strip():
                        continue
                    where = f"{seg.name}:{n}"
                    event = self._decode(raw, where)
                    if event is not None:
                        yield event, where

    def _decode(self, raw: bytes, where: str) -> dict[str, Any] | None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._problem("non_utf8_line", where)
            return None
        try:
            event = json.loads(text)
        except ValueError:
            self._problem("corrupt_line", where)
            return None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            self._problem("not_an_event", where)
            return None
        if event["event"] not in _KNOWN_EVENTS:
            self._problem("unknown_event", where)
            return None
        v = event.get("v", EVENT_VERSION)
        if not isinstance(v, int) or v > EVENT_VERSION:
            self._problem("unsupported_event_version", where)
            return None
        if not isinstance(event.get("session_id"), str):
            self._problem("missing_session_id", where)
            return None
        return event

    def _rewards(self, chains: list[list[Path]]) -> dict[str, list[dict[str, Any]]]:
        # Rewards may arrive after a session ended, or from another process (post-hoc scoring): collect
        # them in a cheap first pass so a session is complete when it is yielded.
        rewards: dict[str, list[dict[str, Any]]] = {}
        for chain in chains:
            for seg in chain:
                with open(seg, "rb") as fh:
                    for raw in fh:
                        # A cheap filter that still matches any JSON spacing (`"event": "reward"` from
                        # other writers); the event type is checked after parsing.
                        if b'"reward"' not in raw or not raw.endswith(b"\n"):
                            continue
                        try:
                            ev = json.loads(raw)
                        except ValueError:
                            continue
                        if not isinstance(ev, dict) or ev.get("event") != "reward":
                            continue
                        value = ev.get("value")
                        if (
                            not isinstance(ev, dict)
                            or not isinstance(ev.get("session_id"), str)
                            or not isinstance(value, (int, float))
                            or isinstance(value, bool)
                            or value != value
                            or value in (float("inf"), float("-inf"))
                        ):
                            self._problem("invalid_reward", seg.name)
                            continue
                        rewards.setdefault(ev["session_id"], []).append(
                            {
                                "value": float(value),
                                "name": ev.get("name") or "reward",
                                "call_id": ev.get("call_id"),
                                "ts": ev.get("ts"),
                            }
                        )
        return rewards

    def sessions(self) -> Iterator[StoredSession]:
        """Yield every session in the store, each when complete (or at the end, if it never ended)."""
        chains = self.segments()
        rewards = self._rewards(chains)
        seen: set[str] = set()
        for chain in chains:
            open_: dict[str, _Open] = {}
            for event, where in self._lines(chain):
                kind = event["event"]
                sid = event["session_id"]
                if kind == "reward":
                    continue
                if sid in seen:
                    self._problem("event_after_session_end", where)
                    continue
                state = open_.get(sid)
                if kind == "session_start":
                    if state is not None:
                        self._problem("duplicate_session_start", where)
                        continue
                    open_[sid] = _Open(self._start(event))
                    continue
                if state is None:
                    self._problem(f"{kind}_before_session_start", where)
                    state = open_[sid] = _Open(StoredSession(session_id=sid))
                if kind == "call":
                    if _malformed_call(event):
                        self._problem("malformed_call", where)
                        continue
                    call = self._call(event, state, where)
                    if not self._merge(call, state.session):
                        state.session.calls.append(call)
                        self.num_calls += 1
                else:  # session_end
                    s = state.session
                    s.ended_at = event.get("ts")
                    s.status = event.get("status") or "ok"
                    s.error = event.get("error")
                    del open_[sid]
                    seen.add(sid)
                    yield self._finish(s, rewards)
            for state in open_.values():
                s = state.session
                if not s.implicit:
                    self._problem("missing_session_end", s.session_id)
                s.status = "implicit" if s.implicit else "incomplete"
                seen.add(s.session_id)
                yield self._finish(s, rewards)
        for sid in rewards:
            if sid not in seen:
                self._problem("reward_for_unknown_session", sid)

    def _finish(self, s: StoredSession, rewards: dict[str, list[dict[str, Any]]]) -> StoredSession:
        s.rewards = rewards.get(s.session_id, [])
        self.num_sessions += 1
        return s

    @staticmethod
    def _start(event: dict[str, Any]) -> StoredSession:
        meta = event.get("metadata")
        return StoredSession(
            session_id=event["session_id"],
            task_id=event.get("task_id"),
            sample=event.get("sample"),
            metadata=meta if isinstance(meta, dict) else {},
            parent_session_ids=_list(event.get("parent_session_ids")),
            started_at=event.get("ts"),
            implicit=bool(event.get("implicit")),
            status="implicit" if event.get("implicit") else "incomplete",
        )

    def _merge(self, call: dict[str, Any], s: StoredSession) -> bool:
        # A framework hook and a recording transport both saw this call: keep one record with the
        # transport's exact request/response and token data, plus what only the framework knows.
        target_id = call.get("same_call_as")
        if not target_id:
            return False
        for target in reversed(s.calls):
            if target.get("call_id") == target_id:
                break
        else:
            self.problems["merge_target_missing"] += 1
            return False
        for key, value in call.items():
            if target.get(key) is None and value is not None:
                target[key] = value
        target["framework"] = call.get("framework") or target.get("framework")
        target["agent"] = call.get("agent") or target.get("agent")
        target["merged_call_ids"] = [*target.get("merged_call_ids", []), call.get("call_id")]
        self.num_merged += 1
        return True

    def _call(self, event: dict[str, Any], state: _Open, where: str) -> dict[str, Any]:
        call = {k: v for k, v in event.items() if k not in ("event", "v")}
        for key, default in CALL_DEFAULTS.items():
            if key not in call:
                call[key] = list(default) if isinstance(default, list) else default
        started, ended = call.get("started_at"), call.get("ended_at")
        if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
            call["latency_s"] = max(0.0, ended - started)
        else:
            call["latency_s"] = None
        request = dict(call.get("request") or {})
        request.setdefault("params", {})
        messages = request.get("messages") or []
        base = request.pop("base", None)
        if base is not None:
            # No call_id means the session's previous call (the writer's common case).
            prior = state.bases.get(base["call_id"]) if "call_id" in base else state.last
            if prior is None:
                self._problem("missing_base", where)
                call["request_incomplete"] = True
            else:
                messages = prior[0][: base.get("n", 0)] + messages
                if "tools" not in request:
                    request["tools"] = prior[1]
        request.setdefault("tools", None)
        request["messages"] = messages
        call["request"] = request
        response = call.get("response") or {}
        thread = messages + [response["message"]] if response.get("message") is not None else messages
        state.last = state.bases[call.get("call_id", "")] = (thread, request.get("tools"))
        return call


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _malformed_call(event: dict[str, Any]) -> bool:
    # Shapes that would make request reconstruction raise: counted and skipped, never a crash.
    cid, request, response = event.get("call_id"), event.get("request"), event.get("response")
    if (cid is not None and type(cid) is not str) or (response is not None and type(response) is not dict):
        return True
    if request is None:
        return False
    if type(request) is not dict:
        return True
    messages, base = request.get("messages"), request.get("base")
    if messages is not None and type(messages) is not list:
        return True
    if base is None:
        return False
    if type(base) is not dict:
        return True
    n, base_id = base.get("n", 0), base.get("call_id")
    return type(n) is not int or (base_id is not None and type(base_id) is not str)


def read_sessions(path: str | os.PathLike[str]) -> Iterator[StoredSession]:
    """Yield the sessions of the store at ``path`` (see :class:`StoreReader` for problem counts).

    Example:
        >>> import tempfile
        >>> [s.session_id for s in read_sessions(tempfile.mkdtemp())]
        []
    """
    return StoreReader(path).sessions()
