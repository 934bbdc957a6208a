"""Reading a store back: segments → sessions with fully reconstructed calls.

Streaming by design: a process's segments are read in order and each session is yielded when its
``session_end`` event is seen, so memory holds only the sessions still open, whatever the store's size.
A reward given before its session's end is attached as the lines are read; a first pass indexes the
others (given later, or by another process). That index and the set of sessions already read move to a
temporary SQLite file past ``index_limit`` entries, so memory stays flat as a store grows.
Every line that cannot be used is counted by reason in :attr:`StoreReader.problems`; nothing is dropped
without a count.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sdk._json import JSONError, loads, strict_loads
from sdk.store._events import CALL_DEFAULTS, EVENT_VERSION, SUPERSEDE_MARK, expand_prompt_ids
from sdk.store._index import (
    DEFAULT_LIMIT,
    END_MARK,
    REWARD_MARK,
    RewardIndex,
    SeenSessions,
    reward_of,
    scan_rewards,
)
from sdk.store._remote import SOURCE_FILE, fetch_store, is_store_uri
from sdk.store._spread import marked_session_ids, merge_parts, scan_spread
from sdk.store._writer import SEGMENT_SUFFIX

__all__ = ["EVENT_VERSION", "StoreReader", "StoredSession", "read_sessions"]

"""Version written in every event's ``v`` field; readers reject larger versions (counted)."""

_REFUSED = object()  # a line no JSON parser takes (see StoreReader._refused)
_KNOWN_EVENTS = frozenset({"session_start", "call", "reward", "session_end", "supersede"})
_DEFAULTS = {k: v for k, v in CALL_DEFAULTS.items() if not isinstance(v, list) and k != "prompt_token_suffix"}


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
        calls: CallRecord dicts in call order, each with the full ``request.messages`` and
            ``prompt_token_ids`` rebuilt; ``logprobs`` holds per-token entries or (compact stores, see
            ``sdk.store._events.compact_logprobs``) plain numbers.
        rewards: ``{"value", "name", "call_id", "ts"}`` dicts in the order they were given.
        superseded: A later attempt replaces this one (a ``supersede`` event names it: the rollout runner
            ran its (task, sample) again); the episode export leaves it out, counted.

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
    superseded: bool = False

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
    # Per call id: (request messages + response, tools, prompt token ids, completion token ids).
    bases: dict[str, tuple[list[Any], Any, Any, Any]] = dataclasses.field(default_factory=dict)
    last: tuple[list[Any], Any, Any, Any] | None = None
    # The reader's count of unusable lines when ``last`` was set: if it has grown since, an unusable line
    # (perhaps this session's next call) came in between, and ``last`` may not be the previous call.
    damage: int = 0


class StoreReader:
    """Reads every segment of a store directory.

    Attributes:
        path: The store directory.
        problems: Counts of unusable or suspicious input by reason (``torn_line``, ``corrupt_line``,
            ``unknown_event``, ``missing_session_end``, ``missing_base``, ``base_after_damaged_line``
            (a call builds on "the previous call" but an unusable line came in between, so the previous
            call may be lost), ``not_a_segment_file`` (a directory, FIFO or broken link named
            ``*.jsonl``: skipped, never opened), …). A directory or segment that cannot be read raises
            ``OSError`` (e.g. ``PermissionError``): it never reads as empty.
        examples: The first ``file:line`` seen for each problem reason, for error messages.
        num_calls: Calls read so far.
        num_sessions: Sessions yielded so far.
        num_merged: Framework records merged into the recording transport's record of the same call.
        index_limit: Entries the reward index and the set of read sessions keep in memory before they
            move to a temporary SQLite file (memory against speed: lookups there are batched, ~1 µs each).

    Example:
        >>> import tempfile
        >>> reader = StoreReader(tempfile.mkdtemp())
        >>> list(reader.sessions())
        []
        >>> dict(reader.problems)
        {}
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if is_store_uri(path):
            path = fetch_store(path)  # read a local copy of the object-store store's segments
        self.path = Path(path)
        source = self.path / SOURCE_FILE
        #: The object-store URI when this reads a local copy of one (``None`` for a local store).
        self.uri: str | None = source.read_text().strip() if source.is_file() else None
        if not self.path.is_dir():
            raise FileNotFoundError(f"no tracerl store at {str(self.path)!r} (not a directory)")
        self.problems: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.num_calls = 0
        self.num_sessions = 0
        self.num_merged = 0
        self.index_limit = DEFAULT_LIMIT
        self._bytes_done = 0  # segments read whole by the main pass
        self._damage = 0  # unusable lines met so far (see _Open.damage)
        self._segment: Any = None  # the one it is reading
        self._superseded: set[str] = set()  # sessions a supersede event names (found by sessions())
        self._parse = strict_loads()

    @property
    def bytes_read(self) -> int:
        """Bytes of segment files the main pass has read so far (for progress; see :meth:`total_bytes`)."""
        fh = self._segment
        return self._bytes_done + (fh.tell() if fh is not None and not fh.closed else 0)

    def total_bytes(self) -> int:
        """Bytes of every segment file now in the store."""
        return sum(f.stat().st_size for chain in self.segments() for f in chain)

    def segments(self) -> list[list[Path]]:
        """Segment files by writing process: one chain per process, in write order."""
        chains: dict[str, list[Path]] = {}
        skipped: list[str] = []
        # os.scandir, not Path.glob: glob swallows a permission error and an unreadable store would read
        # as an empty one. Only regular files are segments: opening a FIFO would block forever.
        names = []
        with os.scandir(self.path) as entries:
            for e in entries:
                if e.name.endswith(SEGMENT_SUFFIX):
                    (names if _regular_file(e) else skipped).append(e.name)
        for name in sorted(names):
            chains.setdefault(chain_key(name), []).append(self.path / name)
        if skipped:  # assigned, not added: segments() may be called more than once
            self.problems["not_a_segment_file"] = len(skipped)
            self.examples.setdefault("not_a_segment_file", min(skipped))
        return [chains[k] for k in sorted(chains)]

    def _problem(self, reason: str, where: str) -> None:
        self.problems[reason] += 1
        self.examples.setdefault(reason, where)

    def _skip(self, reason: str, where: str) -> None:
        """Count a line the main pass cannot use (it may have been any session's call)."""
        self._damage += 1
        self._problem(reason, where)

    def _lines(self, chain: list[Path]) -> Iterator[tuple[dict[str, Any], str, int, bytes]]:
        """Yield ``(event, segment name, line number, line)`` for each usable line of a process's segments."""
        parse = self._parse
        for i, seg in enumerate(chain):
            last_segment = i == len(chain) - 1
            name = seg.name
            # Line by line: reading a whole segment (up to segment_max_bytes) and splitting it held two
            # copies of it in memory. A 64 KiB buffer: with the default 8 KiB, lines of a few KB (token
            # data) mostly straddle two buffers, and reading them cost 4x more.
            with open(seg, "rb", buffering=1 << 16) as fh:
                self._segment = fh
                for n, raw in enumerate(fh, 1):
                    if raw[-1] != 10:  # b"\n"
                        # A line without its newline is a write cut short (kill, crash): expected only at
                        # the very end of a process's last segment.
                        if raw.strip():
                            self._skip("torn_line" if last_segment else "corrupt_line", f"{name}:{n}")
                        break
                    try:
                        event = parse(raw)
                    except (ValueError, RecursionError) as e:
                        event = self._refused(raw, e, name, n)
                        if event is _REFUSED:
                            continue
                    # The checks every event must pass, cheapest first (the writer's events pass them all).
                    if (
                        type(event) is dict
                        and event.get("event") in _KNOWN_EVENTS
                        and type(event.get("session_id")) is str
                        and event.get("v", EVENT_VERSION) == EVENT_VERSION
                    ) or self._usable_here(event, name, n):
                        yield event, name, n, raw
                self._bytes_done += os.fstat(fh.fileno()).st_size
                self._segment = None

    def _parsed(self, raw: bytes, name: str, n: int) -> dict[str, Any] | None:
        """The event of a whole line ``n`` of segment ``name``, or ``None`` if it is unusable (counted).

        What :meth:`_lines` does per line, which keeps it inline for speed.
        """
        try:
            event = self._parse(raw)
        except (ValueError, RecursionError) as e:
            event = self._refused(raw, e, name, n)
            if event is _REFUSED:
                return None
        return event if self._usable_here(event, name, n) else None

    def _refused(self, raw: bytes, error: Exception, name: str, n: int) -> Any:
        """The fast parser refused a line: the lenient one decides (``_REFUSED``: not JSON, counted)."""
        if isinstance(error, RecursionError):
            self._skip("corrupt_line", f"{name}:{n}")
            return _REFUSED
        try:  # orjson's refusal: NaN, a lone surrogate, bad UTF-8, bad JSON
            return loads(raw)
        except UnicodeDecodeError:
            self._skip("non_utf8_line", f"{name}:{n}")
        except JSONError:
            if raw.strip():
                self._skip("corrupt_line", f"{name}:{n}")
        return _REFUSED

    def _usable_here(self, event: Any, name: str, n: int) -> bool:
        """Whether a parsed line is a usable event; an unusable one is counted."""
        reason = _unusable(event)
        if reason is None:  # a str subclass, a bool version, ...: usable after all
            return True
        self._skip(reason, f"{name}:{n}")
        return False

    def _rewards(self, chains: list[list[Path]]) -> RewardIndex:
        # Rewards may arrive after a session ended, or from another process (post-hoc scoring): collect
        # them in a cheap first pass so a session is complete when it is yielded. Those given before
        # their session's end (the common case) are left to the main pass: no index to fill or query.
        return scan_rewards(
            chains,
            lambda name: self._problem("invalid_reward", name),
            usable,
            RewardIndex(self.index_limit),
        )

    def sessions(self) -> Iterator[StoredSession]:
        """Yield every session in the store, each when complete (or at the end, if it never ended)."""
        chains = self.segments()
        # Marks are store-wide: a reader of some chains (a parallel export's share) scans every chain.
        self._superseded = _scan_superseded(StoreReader.segments(self))
        rewards = self._rewards(chains)
        seen = SeenSessions(self.index_limit)
        # Sessions several processes wrote parts of (see sdk.store._spread): held, merged, yielded once the
        # last chain with a part is read.
        spread = scan_spread(chains)
        held: dict[str, list[StoredSession]] = {}
        try:
            for position, chain in enumerate(chains):
                inline = position not in rewards.indexed_chains
                parts = self._chain_sessions(chain, seen, inline, spread, held)
                yield from self._with_rewards(parts, rewards)
                if held:
                    yield from self._with_rewards(self._merged(position, spread, held, seen), rewards)
            for sid in rewards.unclaimed():
                self._problem("reward_for_unknown_session", sid)
        finally:
            rewards.close()
            seen.close()

    def _with_rewards(
        self, sessions: Iterator[StoredSession], rewards: RewardIndex
    ) -> Iterator[StoredSession]:
        """Add each session's indexed rewards: a lookup per session in memory, one per 32 from SQLite."""
        if self._superseded:
            sessions = self._marked(sessions)
        if not len(rewards):
            for s in sessions:
                self.num_sessions += 1
                yield s
            return
        batch: list[StoredSession] = []
        for s in sessions:
            batch.append(s)
            if len(batch) >= (32 if rewards.spilled else 1):
                yield from self._attach(batch, rewards)
                batch = []
        yield from self._attach(batch, rewards)

    def _marked(self, sessions: Iterator[StoredSession]) -> Iterator[StoredSession]:
        for s in sessions:
            s.superseded = s.session_id in self._superseded
            yield s

    def _attach(self, batch: list[StoredSession], rewards: RewardIndex) -> Iterator[StoredSession]:
        found = rewards.take_many([s.session_id for s in batch]) if batch else {}
        for s in batch:
            indexed = found.get(s.session_id)
            if indexed:
                s.rewards.extend(indexed)
            self.num_sessions += 1
            yield s

    def _merged(
        self, position: int, spread: dict[str, int], held: dict[str, list[StoredSession]], seen: SeenSessions
    ) -> Iterator[StoredSession]:
        """The held sessions whose last part is in a chain up to ``position``, each merged into one."""
        for sid in [sid for sid, last in spread.items() if last <= position and sid in held]:
            s = merge_parts(held.pop(sid))
            if s.status == "incomplete":
                self._problem("missing_session_end", sid)
            seen.add(sid)
            yield s

    def _chain_sessions(
        self,
        chain: list[Path],
        seen: SeenSessions,
        inline: bool,
        spread: dict[str, int] | None = None,
        held: dict[str, list[StoredSession]] | None = None,
    ) -> Iterator[StoredSession]:
        """Sessions of one chain, with the rewards given before their end in this chain when ``inline``.

        The first pass indexed every other reward (see :func:`~sdk.store._index.scan_rewards`). Parts of
        sessions in ``spread`` go to ``held`` instead (see :meth:`_merged`).
        """
        open_: dict[str, _Open] = {}
        given: dict[str, list[dict[str, Any]]] = {}  # rewards waiting for their session's end
        for event, name, n, raw in self._lines(chain):
            if event["event"] == "reward":
                if inline:
                    self._given(event, raw, given, f"{name}:{n}")
                continue
            s = self._step(event, name, n, raw, open_, given, seen)
            if s is None:
                continue
            if spread and s.session_id in spread:
                held.setdefault(s.session_id, []).append(s)  # type: ignore[union-attr]
                continue
            seen.add(s.session_id)
            yield s
        # Rewards still waiting (their session ends later elsewhere, or never) are in the index.
        for state in open_.values():
            s = state.session
            if spread and s.session_id in spread:
                held.setdefault(s.session_id, []).append(s)  # type: ignore[union-attr]
                continue
            if not s.implicit and s.session_id not in self._superseded:  # a superseded one is accounted for
                self._problem("missing_session_end", s.session_id)
            s.status = "implicit" if s.implicit else "incomplete"
            seen.add(s.session_id)
            yield s

    def _step(
        self,
        event: dict[str, Any],
        name: str,
        n: int,
        raw: bytes,
        open_: dict[str, _Open],
        given: dict[str, list[dict[str, Any]]],
        seen: Any,
    ) -> StoredSession | None:
        """Apply a chain's next non-reward event to its open sessions; the session it ends, if any.

        ``given`` holds the rewards given in this chain to sessions not ended yet: a session takes them at
        its end. The caller marks the returned session as read (``seen``), or holds it (spread sessions).
        """
        kind = event["event"]
        sid = event["session_id"]
        if kind == "supersede":
            return None  # read in a first pass (sessions()) or by the caller
        state = open_.get(sid)
        if state is None and sid in seen:  # only sessions not open are looked up: rare
            self._problem("event_after_session_end", f"{name}:{n}")
            if kind == "session_end" and given and END_MARK in raw:
                for _ in given.pop(sid, ()):  # rewards between this session's two ends
                    self._problem("event_after_session_end", f"{name}:{n}")
            return None
        if kind == "call":
            if state is None:
                self._problem("call_before_session_start", f"{name}:{n}")
                state = open_[sid] = _Open(StoredSession(session_id=sid))
            if _malformed_call(event):
                self._problem("malformed_call", f"{name}:{n}")
                state.damage = -1  # its next call cannot trust "the previous call"
                return None
            call = self._call(event, state, name, n)
            if call.get("same_call_as") is None or not self._merge(call, state.session):
                state.session.calls.append(call)
                self.num_calls += 1
            return None
        if kind == "session_start":
            if state is not None:
                self._problem("duplicate_session_start", f"{name}:{n}")
                return None
            open_[sid] = _Open(self._start(event))
            return None
        # session_end
        if state is None:
            self._problem("session_end_before_session_start", f"{name}:{n}")
            state = _Open(StoredSession(session_id=sid))
        else:
            del open_[sid]
        s = state.session
        s.ended_at = event.get("ts")
        s.status = event.get("status") or "ok"
        s.error = event.get("error")
        if given and END_MARK in raw:
            s.rewards = given.pop(sid, s.rewards)
        return s

    def _given(
        self, event: dict[str, Any], raw: bytes, given: dict[str, list[dict[str, Any]]], where: str
    ) -> None:
        if REWARD_MARK not in raw:
            # Its event name written with JSON escapes: the first pass, which finds reward lines by their
            # bytes, did not see it. No writer does this; counted rather than half-handled.
            self._problem("unsupported_reward_line", where)
            return
        reward = reward_of(event)
        if reward is not None:  # an invalid one was counted by the first pass
            value, name, call_id, ts = reward
            given.setdefault(event["session_id"], []).append(
                {"value": value, "name": name, "call_id": call_id, "ts": ts}
            )

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

    def _call(self, event: dict[str, Any], state: _Open, name: str, n: int) -> dict[str, Any]:
        call = {**_DEFAULTS, **event}
        del call["event"]
        call.pop("v", None)
        if "parent_session_ids" not in event:
            call["parent_session_ids"] = []  # a list of its own: callers may append to it
        started, ended = call.get("started_at"), call.get("ended_at")
        if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
            call["latency_s"] = max(0.0, ended - started)
        else:
            call["latency_s"] = None
        request = call.get("request") or {}  # the event was just parsed: its dicts are ours to change
        request.setdefault("params", {})
        messages = request.get("messages") or []
        base = request.pop("base", None)
        prior = None
        if base is not None:
            # No call_id means the session's previous call (the writer's common case).
            if "call_id" in base:
                prior = state.bases.get(base["call_id"])
            elif state.damage != self._damage and state.last is not None:
                # An unusable line came after this session's last readable call: it may have been the
                # previous call. Building on an earlier one would write a wrong transcript.
                prior = None
                self._problem("base_after_damaged_line", f"{name}:{n}")
                call["request_damaged"] = True
            else:
                prior = state.last
            if prior is not None and len(prior[0]) < base.get("n", 0):
                prior = None  # shorter than the prefix it should hold: not the call this one builds on
            if prior is None:
                if not call.get("request_damaged"):
                    self._problem("missing_base", f"{name}:{n}")
                call["request_incomplete"] = True
            else:
                messages = prior[0][: base.get("n", 0)] + messages
                if "tools" not in request:
                    request["tools"] = prior[1]
        suffix = call.pop("prompt_token_suffix", None)
        if suffix is not None:
            # Prompt ids stored relative to the base call's prompt + completion ids (compact stores).
            ids = expand_prompt_ids(suffix, prior[2], prior[3]) if prior is not None else None
            if ids is None:
                self._problem("missing_token_base", f"{name}:{n}")
            call["prompt_token_ids"] = ids
        request.setdefault("tools", None)
        request["messages"] = messages
        call["request"] = request
        response = call.get("response") or {}
        thread = messages + [response["message"]] if response.get("message") is not None else messages
        tokens = (call["prompt_token_ids"], call["completion_token_ids"])
        state.last = state.bases[call.get("call_id", "")] = (thread, request.get("tools"), *tokens)
        state.damage = self._damage
        return call


def _scan_superseded(chains: list[list[Path]]) -> set[str]:
    """First pass: the sessions that ``supersede`` events name (one ``find`` over each segment's bytes)."""
    return {
        sid for chain in chains for f in chain for sid in marked_session_ids(f, SUPERSEDE_MARK, "supersede")
    }


def chain_key(name: str) -> str:
    """The writing process of a segment file name (``<process key>.<sequence>.jsonl``)."""
    return name[: -len(SEGMENT_SUFFIX)].rsplit(".", 1)[0]


def usable(event: Any) -> bool:
    """Whether a parsed line is an event the reader uses (the first pass must skip the same lines)."""
    return _unusable(event) is None


def _unusable(event: Any) -> str | None:
    """Why a parsed line is not a usable event (``None``: it is one)."""
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return "not_an_event"
    if event["event"] not in _KNOWN_EVENTS:
        return "unknown_event"
    v = event.get("v", EVENT_VERSION)
    if not isinstance(v, int) or v > EVENT_VERSION:
        return "unsupported_event_version"
    if not isinstance(event.get("session_id"), str):
        return "missing_session_id"
    return None


def _regular_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows links: False for a broken one
    except OSError:  # a link loop
        return False


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
