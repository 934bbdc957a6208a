"""Following a store that keeps growing: each read returns only what was written since the last one.

:class:`StoreReader` reads a store whole, which is right for an export and wrong for a trainer that polls a
store its agents write to for hours: every poll would read every old segment again, so a poll's cost grows
with the store and, over a run, the reading with its square. :class:`StoreTail` keeps, per writing process
(chain of segments), the segment and byte offset it has read up to and the sessions still open there; a
read parses only the lines appended since, with the reader's own rules (the same line checks, call
reconstruction, problem counts), and returns the sessions that ended, the rewards given since to sessions
that had ended before (a scoring job's, a user's), and the sessions a ``supersede`` event named.

Sessions that span processes (the gateway's workers each write a part) are kept as parts and merged as
the whole reader merges them (``sdk.store._spread``), again at each read that adds to them; one that ended
and that ``keep`` no longer wants is forgotten (its id kept: later lines of it are counted, not read).
What it does not follow, it says (:class:`TailUnsupported`), and the caller reads the store whole instead:
a segment that shrank or vanished, a new segment that sorts before the one being read, a session read as
one process's that another process then marks as shared. A line without its newline at the end of a
process's last segment is a write in progress: it is read again next time.

Example:
    >>> import tempfile
    >>> tail = StoreTail(tempfile.mkdtemp())
    >>> update = tail.read()
    >>> update.ended, update.rewards, update.superseded
    ([], {}, set())
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sdk.store._index import SeenSessions, reward_of
from sdk.store._reader import StoredSession, StoreReader, _Open, chain_key
from sdk.store._remote import fetch_store, is_store_uri
from sdk.store._spread import _ts, merge_parts

__all__ = ["StoreTail", "TailUnsupported", "TailUpdate"]

_Line = tuple[dict[str, Any], str, int, bytes]  # a usable line: event, segment name, line number, bytes


class TailUnsupported(Exception):
    """The store changed in a way a tail cannot follow; read it whole (:class:`StoreReader`) instead.

    Example:
        >>> str(TailUnsupported("segment a.00001.jsonl shrank"))
        'segment a.00001.jsonl shrank'
    """


@dataclasses.dataclass
class TailUpdate:
    """What one :meth:`StoreTail.read` found.

    Attributes:
        ended: Sessions that ended since the last read, each with the rewards given to it so far and
            ``superseded`` set if a ``supersede`` event named it. A session several processes write is
            returned again, merged anew, by each read that adds to it.
        rewards: Rewards given since the last read to sessions that ended before it, by session id
            (``{"value", "name", "call_id", "ts"}`` dicts in the order read).
        superseded: Sessions a ``supersede`` event named since the last read (ended or not).
        source: The store read (its URI for an object-store store): what ``sdk.episodes.export`` names as
            the episodes' source when it exports an update.

    Rewards and ``supersede`` marks read after a session's end in the same read are already on the
    session in ``ended``; ``rewards`` holds those of sessions that ended in an earlier read.

    Example:
        >>> TailUpdate().ended
        []
    """

    ended: list[StoredSession] = dataclasses.field(default_factory=list)
    rewards: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    superseded: set[str] = dataclasses.field(default_factory=set)
    source: str | None = None
    _by_id: dict[str, StoredSession] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass
class _Chain:
    """How far a writing process's segments have been read, and its sessions still open there."""

    segment: str = ""
    index: int = 0  # the segment's place in the chain: one before it appearing later is not followed
    offset: int = 0
    line: int = 0
    open_: dict[str, _Open] = dataclasses.field(default_factory=dict)
    given: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)


class StoreTail(StoreReader):
    """Reads what a store's writers appended since the last :meth:`read`.

    Args:
        path: Store directory or object-store URI (``s3://bucket/prefix``: its local copy is refreshed at
            each read, changed segments only).

    Attributes:
        problems: Counts of unusable input by reason, as :class:`StoreReader` counts them (a torn last line
            is not counted while it may still be a write in progress).

    Example:
        >>> import tempfile
        >>> import sdk
        >>> store = tempfile.mkdtemp()
        >>> tail = StoreTail(store)
        >>> _ = sdk.configure(store=store)
        >>> with sdk.session(task_id="t", sample=0) as s:
        ...     s.reward(1.0)
        >>> _ = sdk.flush()
        >>> [(x.task_id, x.reward) for x in tail.read().ended]
        [('t', 1.0)]
        >>> tail.read().ended
        []
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._source = str(path) if is_store_uri(path) else None
        super().__init__(path)
        self._chains: dict[str, _Chain] = {}
        self._seen = SeenSessions(self.index_limit)  # sessions that ended (read once)
        weakref.finalize(self, self._seen.close)  # its temporary database, past index_limit sessions
        self._pending: dict[str, list[dict[str, Any]]] = {}  # rewards of sessions not ended yet
        # Sessions that span processes: their parts (one per process, or more), their rewards, and the
        # ids of those forgotten (ended, and no longer wanted by ``keep``; on disk past index_limit, as
        # the ended ones, so a long run's memory stays flat).
        self._parts: dict[str, list[StoredSession]] = {}
        self._part_rewards: dict[str, list[dict[str, Any]]] = {}
        self._forgotten = SeenSessions(self.index_limit)
        weakref.finalize(self, self._forgotten.close)

    def read(self, keep: Callable[[StoredSession], bool] | None = None) -> TailUpdate:
        """Read the lines appended since the last call (all of them the first time).

        Args:
            keep: Which ended sessions to return (default: all). The others are dropped as they end, so
                a first read of a large store holds only the sessions wanted, not the store; a shared
                session (several processes' parts) is kept in parts until ``keep`` stops wanting it.

        Raises:
            TailUnsupported: The store changed in a way this cannot follow (see the module docstring);
                the tail is then unusable.
        """
        if self._source is not None:
            fetch_store(self._source)
        update = TailUpdate(source=self.uri or str(self.path))
        touched: set[str] = set()  # shared sessions this read added to
        for chain in self.segments():
            state = self._chains.setdefault(chain_key(chain[0].name), _Chain())
            for line in self._follow(chain, state):
                event, name, n, _ = line
                sid = event["session_id"]
                if sid in self._forgotten:  # a shared session already read, ended and not wanted
                    if event["event"] not in ("reward", "supersede"):
                        self._problem("event_after_session_end", f"{name}:{n}")
                elif sid in self._parts or event.get("spans_processes") is True:
                    self._part(line, state, update, touched)
                else:
                    self._apply(line, state, update, keep)
        self._merge_parts(touched, update, keep)
        return update

    def close(self) -> None:
        """Release the sets of ended sessions (temporary databases past ``index_limit`` of them)."""
        self._seen.close()
        self._forgotten.close()

    def _follow(self, chain: list[Path], state: _Chain) -> Iterator[_Line]:
        """The usable whole lines of ``chain`` after ``state``'s position, advancing it as they are read."""
        names = [p.name for p in chain]
        if state.segment and state.segment not in names:
            raise TailUnsupported(f"segment {state.segment} is gone")
        start = names.index(state.segment) if state.segment else 0
        if start != state.index:
            raise TailUnsupported(f"a segment before {state.segment} appeared after it was read")
        for i in range(start, len(chain)):
            seg, last = chain[i], i == len(chain) - 1
            if seg.name != state.segment:
                state.segment, state.index, state.offset, state.line = seg.name, i, 0, 0
            with open(seg, "rb", buffering=1 << 16) as fh:
                if os.fstat(fh.fileno()).st_size < state.offset:
                    raise TailUnsupported(f"segment {seg.name} shrank")
                fh.seek(state.offset)
                for raw in fh:
                    if raw[-1] != 10:  # b"\n"
                        if last:
                            break  # maybe a write in progress: read it again next time
                        # The process went on to a new segment: this line was cut short for good.
                        state.offset += len(raw)
                        if raw.strip():
                            self._skip("corrupt_line", f"{seg.name}:{state.line + 1}")
                        break
                    state.offset += len(raw)
                    state.line += 1
                    event = self._parsed(raw, seg.name, state.line)
                    if event is not None:
                        yield event, seg.name, state.line, raw

    def _apply(
        self, line: _Line, state: _Chain, update: TailUpdate, keep: Callable[[StoredSession], bool] | None
    ) -> None:
        """A line of a session one process writes."""
        event, name, n, raw = line
        kind, sid = event["event"], event["session_id"]
        if kind == "supersede":
            self._superseded.add(sid)
            update.superseded.add(sid)
            if sid in update._by_id:
                update._by_id[sid].superseded = True
            return
        if kind == "reward":
            self._reward(event, name, sid, state, update)
            return
        s = self._step(event, name, n, raw, state.open_, state.given, self._seen)
        if s is None:
            return
        s.rewards.extend(self._pending.pop(sid, ()))
        s.superseded = sid in self._superseded
        self._seen.add(sid)
        self.num_sessions += 1
        if keep is None or keep(s):
            update.ended.append(s)
            update._by_id[sid] = s

    def _entry(self, event: dict[str, Any], name: str) -> dict[str, Any] | None:
        reward = reward_of(event)
        if reward is None:
            self._problem("invalid_reward", name)
            return None
        value, reward_name, call_id, ts = reward
        return {"value": value, "name": reward_name, "call_id": call_id, "ts": ts}

    def _reward(self, event: dict[str, Any], name: str, sid: str, state: _Chain, update: TailUpdate) -> None:
        entry = self._entry(event, name)
        if entry is None:
            return
        if sid in state.open_:
            state.given.setdefault(sid, []).append(entry)  # the session takes it at its end
        elif sid in update._by_id:  # ended earlier in this read
            update._by_id[sid].rewards.append(entry)
        elif sid in self._seen:
            update.rewards.setdefault(sid, []).append(entry)
        else:  # given in another process than the session's, or before its start line was read
            self._pending.setdefault(sid, []).append(entry)

    def _part(self, line: _Line, state: _Chain, update: TailUpdate, touched: set[str]) -> None:
        """A line of a session that spans processes: it adds to that session's parts."""
        event, name, n, raw = line
        kind, sid = event["event"], event["session_id"]
        if sid not in self._parts:  # its first part's start
            if sid in self._seen:  # read as one process's session, and that is what it was trained as
                raise TailUnsupported(f"session {sid} was read whole before another process shared it")
            self._parts[sid] = []
            self._part_rewards[sid] = self._pending.pop(sid, [])
        touched.add(sid)
        if kind == "supersede":
            self._superseded.add(sid)
            update.superseded.add(sid)  # for a consumer holding what an earlier read returned
        elif kind == "reward":
            entry = self._entry(event, name)
            if entry is not None:
                self._part_rewards[sid].append(entry)
        else:
            ended = self._step(event, name, n, raw, state.open_, state.given, self._seen)
            open_ = state.open_.get(sid)
            for part in (open_.session if open_ is not None else None, ended):
                if part is not None and not any(part is p for p in self._parts[sid]):
                    self._parts[sid].append(part)

    def _merge_parts(
        self, touched: set[str], update: TailUpdate, keep: Callable[[StoredSession], bool] | None
    ) -> None:
        """Merge the shared sessions this read added to; forget the ended ones ``keep`` does not want."""
        for sid in sorted(touched):
            parts = self._parts[sid]
            if not parts:
                continue  # a reward or a supersede mark before any part
            s = merge_parts(parts)  # one part: that part
            rewards = self._part_rewards[sid]
            s.rewards = sorted(rewards, key=lambda r: _ts(r.get("ts"))) if len(parts) > 1 else list(rewards)
            s.superseded = sid in self._superseded
            if s.status not in ("ok", "error"):
                continue  # no part ended yet
            if keep is None or keep(s):
                update.ended.append(s)
                update._by_id[sid] = s
            else:
                self._forget(sid)
        if keep is not None:  # the ended ones decided since (a trainer took them): memory stays flat
            for sid, parts in list(self._parts.items()):
                if sid not in touched and any(p.status in ("ok", "error") for p in parts):
                    s = merge_parts(parts)
                    s.superseded = sid in self._superseded
                    if not keep(s):
                        self._forget(sid)

    def _forget(self, sid: str) -> None:
        del self._parts[sid], self._part_rewards[sid]
        self._forgotten.add(sid)
        for chain in self._chains.values():  # its parts that never end (another worker's)
            chain.open_.pop(sid, None)
            chain.given.pop(sid, None)
