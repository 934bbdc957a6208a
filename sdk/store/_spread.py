"""Sessions written by several processes: found in a first pass, merged into one session on read.

A writer that may share a session with other processes (the gateway's workers, or a gateway restarted
mid-session) marks that session's ``session_start`` with ``"spans_processes": true``. Each process's
segments then hold a part of the session: its own start, calls, rewards and maybe an end. The reader holds
the parts of a session found in more than one chain and yields them merged once the last chain that
holds a part is read. Sessions without the mark are read as before (one chain each).
"""

from __future__ import annotations

import heapq
import mmap
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sdk._json import JSONError, loads

if TYPE_CHECKING:
    from sdk.store._reader import StoredSession

__all__ = ["SPREAD_MARK", "marked_session_ids", "merge_parts", "scan_spread"]

SPREAD_MARK = b'"spans_processes":true'
"""Bytes of a ``session_start`` line whose session other processes may write parts of."""


def marked_session_ids(
    path: str | os.PathLike[str], mark: bytes = SPREAD_MARK, kind: str = "session_start"
) -> Iterable[str]:
    r"""The session ids of the ``kind`` events among a segment's lines that hold ``mark`` (one ``find`` each).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        ...     _ = f.write(b'{"event":"session_start","session_id":"s1","spans_processes":true}\n')
        ...     f.flush()
        ...     list(marked_session_ids(f.name))
        ['s1']
    """
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = mm.find(mark)
            while pos >= 0:
                stop = mm.find(b"\n", pos)
                if stop < 0:
                    return  # a torn last line: the main pass counts it
                line = mm[mm.rfind(b"\n", 0, pos) + 1 : stop + 1]
                try:
                    event = loads(line)
                except JSONError:
                    event = None  # the main pass counts it
                if isinstance(event, dict) and event.get("event") == kind:
                    sid = event.get("session_id")
                    if isinstance(sid, str):
                        yield sid
                pos = mm.find(mark, stop)


def scan_spread(chains: list[list[Any]]) -> dict[str, int]:
    """First pass: marked sessions started in more than one chain -> the position of the last such chain.

    Stores without marked sessions cost one ``find`` over each segment's bytes.

    Example:
        >>> scan_spread([])
        {}
    """
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, chain in enumerate(chains):
        for f in chain:
            for sid in marked_session_ids(f):
                seen = first.setdefault(sid, position)
                if seen != position:
                    last[sid] = position
    return last


def _ts(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def merge_parts(parts: list[StoredSession]) -> StoredSession:
    """One session from the parts several processes wrote of it.

    Calls are merged in start-time order (each part's own order kept), rewards in the order given; the
    start is the earliest; the session ended if any part ended (``error`` if one ended with an error),
    at the latest end; task, sample and metadata come from the earliest part that has them.

    Example:
        >>> from sdk.store import StoredSession
        >>> a = StoredSession("s1", task_id="t", started_at=1.0, calls=[{"started_at": 1.0}])
        >>> b = StoredSession("s1", started_at=2.0, ended_at=3.0, status="ok", calls=[{"started_at": 2.0}])
        >>> m = merge_parts([b, a])
        >>> m.task_id, m.status, m.started_at, len(m.calls)
        ('t', 'ok', 1.0, 2)
    """
    parts = sorted(parts, key=lambda p: _ts(p.started_at))
    merged = parts[0]
    if len(parts) == 1:
        return merged
    out = type(merged)(session_id=merged.session_id)
    out.task_id = next((p.task_id for p in parts if p.task_id is not None), None)
    out.sample = next((p.sample for p in parts if p.sample is not None), None)
    out.metadata = next((p.metadata for p in parts if p.metadata), {})
    out.parent_session_ids = next((p.parent_session_ids for p in parts if p.parent_session_ids), [])
    starts = [p.started_at for p in parts if p.started_at is not None]
    out.started_at = min(starts) if starts else None
    ended = [p for p in parts if p.status in ("ok", "error")]
    if ended:
        failed = [p for p in ended if p.status == "error"]
        out.status = "error" if failed else "ok"
        out.error = failed[0].error if failed else None
        ends = [p.ended_at for p in ended if p.ended_at is not None]
        out.ended_at = max(ends) if ends else None
    out.calls = list(heapq.merge(*(p.calls for p in parts), key=lambda c: _ts(c.get("started_at"))))
    out.rewards = sorted((r for p in parts for r in p.rewards), key=lambda r: _ts(r.get("ts")))
    return out
