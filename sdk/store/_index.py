"""Store-wide indexes the reader needs, in bounded memory: rewards by session, and sessions already read.

Rewards are indexed only when the reader cannot attach them as it reads (see :func:`scan_rewards`): in a
store written by sessions that give their own rewards, that index stays empty. Both can grow with the
number of sessions in a store. Each lives in a dict until it holds ``limit`` entries,
then moves to a temporary SQLite database in the system temp directory, so a reader's memory stays flat
whatever the store's size. The database is deleted when the reader is done.
"""

from __future__ import annotations

import contextlib
import marshal
import mmap
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

from sdk._json import JSONError, loads
from sdk._numbers import is_finite_number

__all__ = [
    "DEFAULT_LIMIT",
    "END_MARK",
    "REWARD_MARK",
    "RewardIndex",
    "SeenSessions",
    "insert_rows",
    "marked_lines",
    "reward_of",
    "scan_rewards",
]

DEFAULT_LIMIT = 100_000
"""Entries an index keeps in memory before it moves to SQLite (~30 MB of rewards)."""

_RELEASE = 16 << 20

Reward = tuple[float, str, Any, Any]
"""``(value, name, call_id, ts)``: the compact form of a reward event (a dict per reward cost 2x)."""


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # A scratch database: durability buys nothing, and journaling would double the writes.
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    return db


def _temp_db(prefix: str) -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".sqlite")
    os.close(fd)
    return path


def insert_rows(db: sqlite3.Connection, sql: str, rows: list[Any]) -> None:
    """Run ``sql`` for every row in one transaction (nothing when ``rows`` is empty)."""
    if rows:
        db.execute("BEGIN")
        db.executemany(sql, rows)
        db.execute("COMMIT")


class RewardIndex:
    """Rewards by session id, filled by a first pass over the store and claimed as sessions are read.

    Example:
        >>> index = RewardIndex()
        >>> index.add("s1", (1.0, "reward", None, 0.0))
        >>> index.take_many(["s1", "s2"])
        {'s1': [{'value': 1.0, 'name': 'reward', 'call_id': None, 'ts': 0.0}]}
        >>> list(index.unclaimed())
        []
        >>> index.close()
    """

    def __init__(self, limit: int = DEFAULT_LIMIT, path: str | None = None) -> None:
        self.limit = limit
        self.indexed_chains: set[int] = set()  # see scan_rewards
        self._mem: dict[str, list[Reward]] = {}
        self._size = 0
        self._db: sqlite3.Connection | None = None
        self._path: str | None = None
        self._spill_to = path  # a file the caller keeps (default: a temp file, deleted by close)
        self._pending: list[tuple[str, bytes]] = []  # reward rows not inserted yet
        self._claims: list[tuple[str]] = []  # claimed session ids not inserted yet

    @property
    def path(self) -> str | None:
        """The SQLite file, once the index has spilled to disk (``None`` while in memory)."""
        return self._path

    def __len__(self) -> int:
        """Rewards added (claimed ones included)."""
        return self._size

    @property
    def spilled(self) -> bool:
        """Whether lookups go to SQLite (then batch them: :meth:`take_many`)."""
        return self._db is not None

    def add(self, session_id: str, reward: Reward) -> None:
        """Record one reward of ``session_id`` (in the order rewards were given)."""
        self._size += 1
        if self._db is None:
            self._mem.setdefault(session_id, []).append(reward)
            if self._size > self.limit:
                self.spill()
            return
        self._pending.append((session_id, marshal.dumps(reward)))
        if len(self._pending) >= 10_000:
            self._flush()

    def spill(self) -> str:
        """Move the index to a SQLite file (done automatically past ``limit``); return its path."""
        if self._db is None:
            self._path = self._spill_to or _temp_db("tracerl-rewards-")
            self._db = _connect(self._path)
            self._db.execute("CREATE TABLE r (k TEXT NOT NULL, v BLOB NOT NULL)")
            self._db.execute("CREATE INDEX r_k ON r (k)")
            self._db.execute("CREATE TABLE c (k TEXT NOT NULL)")
            self._pending = [(k, marshal.dumps(r)) for k, rs in self._mem.items() for r in rs]
            self._mem = {}
        self._flush()
        return self._path  # type: ignore[return-value]

    def _flush(self) -> None:
        if self._db is not None:
            insert_rows(self._db, "INSERT INTO r VALUES (?, ?)", self._pending)
            self._pending = []
            self._flush_claims()

    def _flush_claims(self) -> None:
        assert self._db is not None
        insert_rows(self._db, "INSERT INTO c VALUES (?)", self._claims)
        self._claims = []

    def _rows(self, session_ids: list[str]) -> dict[str, list[Reward]]:
        """Rewards of ``session_ids`` from the database, each session's in the order given."""
        assert self._db is not None
        if self._pending:
            self._flush()
        out: dict[str, list[Reward]] = {}
        # One query per 500 sessions: a query per session cost 7x more (SQLite's limit is 999 variables).
        for i in range(0, len(session_ids), 500):
            chunk = session_ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT k, v FROM r WHERE k IN ({marks}) ORDER BY rowid"
            for k, v in self._db.execute(query, chunk):
                out.setdefault(k, []).append(marshal.loads(v))
        return out

    def take_many(self, session_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The rewards of ``session_ids``, claimed (sessions without rewards are left out).

        What no session claims is :meth:`unclaimed`. A reader takes each session once.
        """
        if not self.spilled:
            found = {sid: self._mem.pop(sid) for sid in session_ids if sid in self._mem}
        else:
            found = self._rows(session_ids)
            # Claims are batched into a table of their own: a DELETE per session cost twice the lookup.
            self._claims.extend((sid,) for sid in found)
            if len(self._claims) >= 10_000:
                self._flush_claims()
        return {
            sid: [{"value": v, "name": n, "call_id": c, "ts": t} for v, n, c, t in rows]
            for sid, rows in found.items()
        }

    def merge_from(self, paths: list[str]) -> int:
        """Add the rewards of other spilled indexes' files (in order); return this index's size."""
        self.spill()
        assert self._db is not None
        for path in paths:
            self._db.execute("ATTACH DATABASE ? AS other", (path,))
            try:
                cursor = self._db.execute("INSERT INTO r (k, v) SELECT k, v FROM other.r ORDER BY rowid")
                self._size += cursor.rowcount
            finally:
                self._db.execute("DETACH DATABASE other")
        return self._size

    def claim_from(self, claims_db: str) -> None:
        """Claim the session ids listed in table ``c`` of another database (a worker's claims)."""
        self.spill()
        assert self._db is not None
        self._db.execute("ATTACH DATABASE ? AS claims", (claims_db,))
        try:
            self._db.execute("INSERT INTO c SELECT k FROM claims.c")
        finally:
            self._db.execute("DETACH DATABASE claims")

    def unclaimed(self) -> Iterator[str]:
        """Session ids whose rewards no read session took, in first-reward order."""
        if self._db is None:
            yield from list(self._mem)
            return
        self._flush()
        query = "SELECT k FROM r WHERE k NOT IN (SELECT k FROM c) GROUP BY k ORDER BY min(rowid)"
        yield from [k for (k,) in self._db.execute(query)]

    def close(self) -> None:
        """Release the database and delete it."""
        if self._db is not None:
            self._db.close()
            self._db = None
            if self._path and self._path != self._spill_to:
                with contextlib.suppress(OSError):
                    os.unlink(self._path)
        self._mem = {}


class SeenSessions:
    """The set of session ids already read, in memory up to ``limit`` ids and in SQLite past that.

    Almost every lookup is for a session not read yet (each ``session_start``), so past the limit a Bloom
    filter (8 MiB, fixed) answers those without touching the database.

    Example:
        >>> seen = SeenSessions()
        >>> seen.add("s1")
        >>> "s1" in seen, "s2" in seen
        (True, False)
        >>> seen.close()
    """

    _BITS = 1 << 26  # 8 MiB: ~0.5% false positives (each then costs one lookup) at 2.5M sessions

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._mem: set[str] = set()
        self._db: sqlite3.Connection | None = None
        self._path: str | None = None
        self._pending: list[tuple[str]] = []
        self._bloom = bytearray()

    def _mark(self, session_id: str) -> None:
        h = hash(session_id)
        i, j = h & (self._BITS - 1), (h >> 26) & (self._BITS - 1)
        bloom = self._bloom
        bloom[i >> 3] |= 1 << (i & 7)
        bloom[j >> 3] |= 1 << (j & 7)

    def _maybe(self, session_id: str) -> bool:
        h = hash(session_id)
        i, j = h & (self._BITS - 1), (h >> 26) & (self._BITS - 1)
        return bool(self._bloom[i >> 3] & (1 << (i & 7)) and self._bloom[j >> 3] & (1 << (j & 7)))

    def add(self, session_id: str) -> None:
        """Remember ``session_id``."""
        if self._db is None:
            self._mem.add(session_id)
            if len(self._mem) > self.limit:
                self._path = _temp_db("tracerl-seen-")
                self._db = _connect(self._path)
                self._db.execute("CREATE TABLE s (k TEXT PRIMARY KEY) WITHOUT ROWID")
                self._bloom = bytearray(self._BITS >> 3)
                for k in self._mem:
                    self._mark(k)
                self._pending = [(k,) for k in self._mem]
                self._mem = set()
                self._flush()
            return
        self._mark(session_id)
        self._pending.append((session_id,))
        if len(self._pending) >= 10_000:
            self._flush()

    def _flush(self) -> None:
        if self._db is not None:
            self._pending.sort()  # keys in order: the B-tree takes them ~25% faster than at random
            insert_rows(self._db, "INSERT OR IGNORE INTO s VALUES (?)", self._pending)
            self._pending = []

    def __contains__(self, session_id: object) -> bool:
        if self._db is None:
            return session_id in self._mem
        if not isinstance(session_id, str) or not self._maybe(session_id):
            return False
        self._flush()
        return self._db.execute("SELECT 1 FROM s WHERE k = ?", (session_id,)).fetchone() is not None

    def close(self) -> None:
        """Release (and delete) the database, if any."""
        if self._db is not None:
            self._db.close()
            self._db = None
            with contextlib.suppress(OSError):
                os.unlink(self._path)  # type: ignore[arg-type]
        self._mem = set()
        self._bloom = bytearray()


REWARD_MARK = b'"reward"'
"""Bytes every reward event's line holds (its event name); lines without it are not reward events."""

END_MARK = b'"session_end"'
"""Bytes every session_end event's line holds."""

PENDING_LIMIT = 10_000
"""Sessions of one chain with rewards waiting for their ``session_end`` in the first pass; past this the
chain is a scoring job's (rewards for sessions it never ends) and all its rewards are indexed instead."""


def marked_lines(path: str | os.PathLike[str], pending: Sized) -> Iterator[bytes]:
    """Yield the complete lines of a segment that may be a reward event (or a ``session_end``, if needed).

    Lines holding :data:`REWARD_MARK` always; lines holding :data:`END_MARK` while ``pending`` is not empty.

    Searches the memory-mapped file with ``find`` instead of iterating lines: a store is mostly call
    lines, and this pass needs only the few reward lines (and the ``session_end`` right after one). A last
    line without its newline (torn) is not yielded.
    """
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            released = 0
            cur = 0  # where the next line starts
            reward = mm.find(REWARD_MARK)
            end, end_from = -1, -1  # the next END_MARK searched from end_from (-1: not searched)
            while True:
                pos = reward
                if pending:
                    if end_from < 0 or 0 <= end < cur:
                        end, end_from = mm.find(END_MARK, cur), cur
                    if end >= 0 and (pos < 0 or end < pos):
                        pos = end
                if pos < 0:
                    return
                stop = mm.find(b"\n", pos)
                if stop < 0:
                    return
                yield mm[mm.rfind(b"\n", 0, pos) + 1 : stop + 1]
                cur = stop + 1
                if 0 <= reward < cur:
                    reward = mm.find(REWARD_MARK, cur)
                if stop - released > _RELEASE:
                    # Pages scanned count in this process's RSS until unmapped: hand them back as we go.
                    size = (stop - released) // mmap.PAGESIZE * mmap.PAGESIZE
                    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                        mm.madvise(mmap.MADV_DONTNEED, released, size)
                    released += size


def reward_of(event: dict[str, Any]) -> Reward | None:
    """The compact form of a reward event, or ``None`` when its value is not a finite number."""
    value = event.get("value")
    if not is_finite_number(value):
        return None
    return (float(value), event.get("name") or "reward", event.get("call_id"), event.get("ts"))


def scan_rewards(
    chains: Iterable[Iterable[str | os.PathLike[str]]],
    on_invalid: Callable[[str], None],
    usable: Callable[[Any], bool],
    index: RewardIndex | None = None,
) -> RewardIndex:
    """First pass: the rewards of ``chains`` that the main pass cannot attach as it reads, indexed.

    A reward followed, in its chain (one writing process's segments), by a ``session_end`` line of its
    session is left out: the main pass attaches it at that line. Every other valid reward (given after its
    session ended, by another process, or for a session that never ends) is indexed. The positions of
    chains whose rewards are all indexed (scoring jobs: see :data:`PENDING_LIMIT`) are in
    ``index.indexed_chains``: the main pass does not attach rewards of those.

    ``on_invalid(file_name)`` is called for each reward event whose value is not a finite number;
    ``usable(event)`` must be the main pass's test of a parsed line (other lines it counts itself).
    """
    index = index if index is not None else RewardIndex()
    for position, chain in enumerate(chains):
        files = list(chain)
        pending = _scan_chain(files, on_invalid, usable, PENDING_LIMIT)
        if pending is None:  # too many sessions waiting: a scoring job's chain, indexed whole
            index.indexed_chains.add(position)
            pending = _scan_chain(files, on_invalid, usable, None)
            assert pending is not None
        for sid, rewards in pending.items():
            for reward in rewards:
                index.add(sid, reward)
    return index


def _scan_chain(
    files: list[str | os.PathLike[str]],
    on_invalid: Callable[[str], None],
    usable: Callable[[Any], bool],
    limit: int | None,
) -> dict[str, list[Reward]] | None:
    """Rewards of one chain that no ``session_end`` of their session follows.

    All of them when ``limit`` is ``None``; ``None`` when more than ``limit`` sessions wait at once.
    """
    pending: dict[str, list[Reward]] = {}
    ends: Sized = pending if limit is not None else ()  # no limit: every reward is kept, ends unread
    invalid: list[str] = []
    for f in files:
        name = os.path.basename(f)
        for raw in marked_lines(f, ends):
            # Matches any JSON spacing (`"event": "reward"` from other writers); checked once parsed.
            try:
                ev = loads(raw)
            except JSONError:
                continue  # the main pass counts it
            if not usable(ev):
                continue  # likewise
            kind = ev["event"]
            if kind == "session_end":
                if limit is not None and END_MARK in raw:
                    pending.pop(ev["session_id"], None)
            elif kind == "reward" and REWARD_MARK in raw:
                reward = reward_of(ev)
                if reward is None:
                    invalid.append(name)
                    continue
                pending.setdefault(ev["session_id"], []).append(reward)
                if limit is not None and len(pending) > limit:
                    return None
    for name in invalid:  # reported once the chain is settled: a rescan must not count twice
        on_invalid(name)
    return pending
