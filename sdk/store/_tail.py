"""Following a store that keeps growing: each read returns only what was written since the last one.

:class:`StoreReader` reads a store whole, which is right for an export and wrong for a trainer that polls a
store its agents write to for hours: every poll would read every old segment again, so a poll's cost grows
with the store and, over a run, the reading with its square. :class:`StoreTail` keeps, per writing process
(chain of segments), the segment and byte offset it has read up to and the sessions still open there; a
read parses only the lines appended since, with the reader's own rules (the same line checks, call
reconstruction, problem counts), and returns the sessions that ended, the rewards given since to sessions
that had ended before (a scoring job's, a user's), and the sessions a ``supersede`` event named.

What it does not follow, it says (:class:`TailUnsupported`), and the caller reads the store whole instead:
a segment that shrank or vanished, a new segment that sorts before the one being read, and sessions that
span processes (the gateway's workers), whose parts only a whole read can merge. A line without its
newline at the end of a process's last segment is a write in progress: it is read again next time.

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

__all__ = ["StoreTail", "TailUnsupported", "TailUpdate"]


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
            ``superseded`` set if a ``supersede`` event named it.
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

    def read(self, keep: Callable[[StoredSession], bool] | None = None) -> TailUpdate:
        """Read the lines appended since the last call (all of them the first time).

        Args:
            keep: Which ended sessions to return (default: all). The others are dropped as they end, so
                a first read of a large store holds only the sessions wanted, not the store.

        Raises:
            TailUnsupported: The store changed in a way this cannot follow (see the module docstring);
                the tail is then unusable.
        """
        if self._source is not None:
            fetch_store(self._source)
        update = TailUpdate(source=self.uri or str(self.path))
        for chain in self.segments():
            state = self._chains.setdefault(chain_key(chain[0].name), _Chain())
            for event, name, n, raw in self._follow(chain, state):
                self._apply(event, name, n, raw, state, update, keep)
        return update

    def close(self) -> None:
        """Release the set of ended sessions (a temporary database past ``index_limit`` of them)."""
        self._seen.close()

    def _follow(self, chain: list[Path], state: _Chain) -> Iterator[tuple[dict[str, Any], str, int, bytes]]:
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
        self,
        event: dict[str, Any],
        name: str,
        n: int,
        raw: bytes,
        state: _Chain,
        update: TailUpdate,
        keep: Callable[[StoredSession], bool] | None,
    ) -> None:
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
        if kind == "session_start" and event.get("spans_processes") is True:
            raise TailUnsupported("sessions that span processes (the gateway's) are merged by a whole read")
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

    def _reward(self, event: dict[str, Any], name: str, sid: str, state: _Chain, update: TailUpdate) -> None:
        reward = reward_of(event)
        if reward is None:
            self._problem("invalid_reward", name)
            return
        value, reward_name, call_id, ts = reward
        entry = {"value": value, "name": reward_name, "call_id": call_id, "ts": ts}
        if sid in state.open_:
            state.given.setdefault(sid, []).append(entry)  # the session takes it at its end
        elif sid in update._by_id:  # ended earlier in this read
            update._by_id[sid].rewards.append(entry)
        elif sid in self._seen:
            update.rewards.setdefault(sid, []).append(entry)
        else:  # given in another process than the session's, or before its start line was read
            self._pending.setdefault(sid, []).append(entry)
