"""``StreamingSource``: GRPO groups from a store that keeps growing, exactly once, staleness-bounded.

The asynchronous loop (:mod:`trainers.loop.continuous`) trains while the agents keep running. This source
follows the store they write to: each :meth:`StreamingSource.poll` reads the store again (a local directory
or an ``s3://`` URI through :class:`sdk.store.StoreReader`; re-reading is simple and keeps the reader's
guarantees — torn lines, late rewards, superseded attempts — at the cost of reading old segments again)
and returns the GRPO groups that became ready since the last poll.

A *sample* is identified by ``(rollout, task_id, sample)``: ``rollout`` is the session metadata the rollout
runner stamps (its results file's key), so runs that reuse sample numbers never collide. Sample ``k`` of a
task belongs to the group ``k // group_size``. A group is ready when all ``group_size`` of its samples have
ended (a superseded attempt does not count: the runner ran that sample again) and each has a reward or has
waited ``reward_wait_s`` seconds since its session ended (late rewards, from a scoring job or a user, are
let in until then). Then, in this order:

- samples still without a reward are dropped (``no_reward_after_wait``); a group left with fewer than 2
  rewarded samples is dropped (``group_too_small``);
- the group's policy version is its OLDEST turn's: a call's ``policy_version`` when the store records it,
  else the session metadata ``policy_version`` the loop stamps on every sample; a group without one is
  dropped (``unknown_version``: its staleness cannot be bounded);
- a group with ``current_version - version > max_staleness`` is dropped (``stale``);
- otherwise it is taken.

Every taken or dropped sample enters the cursor (:meth:`StreamingSource.state`), which makes the source
exactly-once across restarts: the loop saves it atomically with each checkpoint and passes it back as
``state=``, so groups taken after the last checkpoint are offered again and none twice. Nothing is dropped
without a count (:attr:`StreamBatch.dropped`, :attr:`StreamBatch.dropped_samples`).

Example:
    >>> import tempfile
    >>> src = StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=1)
    >>> batch = src.poll(current_version=0)
    >>> batch.groups, dict(batch.dropped)
    ([], {})
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdk.store import StoredSession, StoreReader
from trainers.errors import UserError

__all__ = ["StreamBatch", "StreamGroup", "StreamingSource", "sample_key", "session_version"]

_STATE_FORMAT = 1
#: Drop reasons, in the order they are checked.
DROP_REASONS = ("no_reward_after_wait", "group_too_small", "unknown_version", "stale")


def session_version(session: StoredSession) -> int | None:
    """The oldest policy version that produced ``session``'s calls (``None`` when unknown).

    A call's own ``policy_version`` (recorded by servers that report it) wins; calls without one take the
    session metadata ``policy_version``.

    Example:
        >>> session_version(StoredSession("s", metadata={"policy_version": 3}))
        3
        >>> session_version(StoredSession("s", calls=[{"policy_version": 2}], metadata={"policy_version": 3}))
        2
    """
    meta = session.metadata.get("policy_version") if isinstance(session.metadata, dict) else None
    fallback = meta if isinstance(meta, int) and not isinstance(meta, bool) else None
    versions = []
    for call in session.calls:
        v = call.get("policy_version")
        versions.append(v if isinstance(v, int) and not isinstance(v, bool) else fallback)
    if not versions:
        return fallback
    if any(v is None for v in versions):
        return None
    return min(versions)  # type: ignore[type-var]


@dataclasses.dataclass
class StreamGroup:
    """One GRPO group taken from the stream: rewarded samples of one task, oldest version ``policy_version``.

    Example:
        >>> StreamGroup("t#0", "t", [], 0, 1).staleness
        1
    """

    key: str
    task_id: str
    sessions: list[StoredSession]
    policy_version: int
    staleness: int


@dataclasses.dataclass
class StreamBatch:
    """What one :meth:`StreamingSource.poll` found.

    Attributes:
        groups: Groups taken now.
        dropped: Samples dropped now, by reason (:data:`DROP_REASONS`).
        dropped_samples: ``{"rollout", "task_id", "sample", "session_id", "reason"}`` per dropped sample.
        staleness: ``current_version - policy_version`` of each group taken.
        pending: Groups seen but not ready yet (samples running, or waiting for a reward).
        backlog: Ended samples in those groups (the loop slows the collector down when it grows).

    Example:
        >>> StreamBatch().groups
        []
    """

    groups: list[StreamGroup] = dataclasses.field(default_factory=list)
    dropped: Counter[str] = dataclasses.field(default_factory=Counter)
    dropped_samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    staleness: list[int] = dataclasses.field(default_factory=list)
    pending: int = 0
    backlog: int = 0


def _pair(s: StoredSession) -> tuple[str, str, int]:
    rollout = s.metadata.get("rollout") if isinstance(s.metadata, dict) else None
    return (str(rollout or ""), str(s.task_id), int(s.sample or 0))


def sample_key(rollout: str, task_id: str, sample: int) -> str:
    """A sample's key in the cursor (:meth:`StreamingSource.state`).

    Example:
        >>> sample_key("r1", "t", 3)
        'r1|t|3'
    """
    return f"{rollout}|{task_id}|{sample}"


def _pair_key(pair: tuple[str, str, int]) -> str:
    return sample_key(*pair)


class StreamingSource:
    """GRPO groups from a growing store; see the module docstring for the rules.

    Args:
        store: Store directory or URI (``s3://bucket/prefix``).
        group_size: Samples per group (G).
        max_staleness: Largest allowed ``current_version - oldest turn version`` of a taken group.
        reward_wait_s: Seconds after a session's end during which a missing reward may still arrive.
        state: A cursor from :meth:`state` (resume).
        split: Only sessions whose metadata ``split`` equals this (``None``: any); validation sessions
            written to the same store are left alone.
        clock: Time source (tests pass a fake one).

    Example:
        >>> import tempfile
        >>> src = StreamingSource(tempfile.mkdtemp(), group_size=4, max_staleness=2, reward_wait_s=30)
        >>> src.state()["taken"]
        []
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        *,
        group_size: int,
        max_staleness: int,
        reward_wait_s: float = 0.0,
        state: dict[str, Any] | None = None,
        split: str | None = "train",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if group_size < 2:
            raise UserError(f"group_size must be at least 2 for GRPO, got {group_size}")
        if max_staleness < 0 or reward_wait_s < 0:
            raise UserError("max_staleness and reward_wait_s must be >= 0")
        self.store = store
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.reward_wait_s = reward_wait_s
        self.split = split
        self.clock = clock
        self._taken: set[str] = set()
        self._dropped: dict[str, str] = {}  # pair key -> reason
        self.dropped_total: Counter[str] = Counter()
        if state:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise UserError(f"unknown stream cursor format {state.get('format')!r}")
        self._taken = set(state.get("taken") or [])
        self._dropped = dict(state.get("dropped") or {})
        self.dropped_total = Counter(self._dropped.values())

    def state(self) -> dict[str, Any]:
        """The cursor: samples taken and dropped (with reasons), JSON-serialisable.

        Example:
            >>> import tempfile
            >>> StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0).state()["format"]
            1
        """
        return {"format": _STATE_FORMAT, "taken": sorted(self._taken), "dropped": dict(self._dropped)}

    def release(self, groups: list[StreamGroup]) -> None:
        """Give taken groups back: the next :meth:`poll` offers them again (with their staleness then).

        The loop takes a batch's worth and releases the rest, so the cursor it saves never counts a group
        as taken that no step trained on.

        Example:
            >>> import tempfile
            >>> src = StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0)
            >>> src.release([])
        """
        for g in groups:
            for s in g.sessions:
                self._taken.discard(_pair_key(_pair(s)))

    def _candidates(self) -> dict[tuple[str, str, int], dict[int, StoredSession]]:
        """Ended, not superseded, not yet decided samples of the split, by group key then sample."""
        store = self.store
        if not str(store).startswith(("s3://", "gs://", "az://")) and not Path(store).is_dir():
            return {}  # nothing written yet
        groups: dict[tuple[str, str, int], dict[int, StoredSession]] = defaultdict(dict)
        for s in StoreReader(store).sessions():
            if s.implicit or s.task_id is None or s.sample is None or s.superseded:
                continue
            if s.status == "incomplete" or s.ended_at is None:
                continue
            if self.split is not None and s.metadata.get("split") != self.split:
                continue
            pair = _pair(s)
            key = _pair_key(pair)
            if key in self._taken or key in self._dropped:
                continue
            gkey = (pair[0], pair[1], pair[2] // self.group_size)
            have = groups[gkey].get(pair[2])
            if have is None or (have.ended_at or 0) < s.ended_at:  # two live attempts: the later one
                groups[gkey][pair[2]] = s
        return groups

    def poll(self, current_version: int) -> StreamBatch:
        """Read the store and return the groups ready now (see the module docstring).

        Example:
            >>> import tempfile
            >>> StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0).poll(3).pending
            0
        """
        batch = StreamBatch()
        now = self.clock()
        for gkey, samples in sorted(self._candidates().items()):
            if len(samples) < self.group_size:
                batch.pending += 1
                batch.backlog += len(samples)
                continue
            waiting = [
                s
                for s in samples.values()
                if s.reward is None and now - (s.ended_at or now) < self.reward_wait_s
            ]
            if waiting:
                batch.pending += 1
                batch.backlog += len(samples)
                continue
            self._decide(gkey, list(samples.values()), current_version, batch)
        return batch

    def _decide(
        self, gkey: tuple[str, str, int], sessions: list[StoredSession], current: int, batch: StreamBatch
    ) -> None:
        rewarded = []
        for s in sessions:
            if s.reward is None:
                self._drop(s, "no_reward_after_wait", batch)
            else:
                rewarded.append(s)
        if len(rewarded) < 2:
            for s in rewarded:
                self._drop(s, "group_too_small", batch)
            return
        versions = [session_version(s) for s in rewarded]
        if any(v is None for v in versions):
            for s in rewarded:
                self._drop(s, "unknown_version", batch)
            return
        oldest = min(v for v in versions if v is not None)
        if current - oldest > self.max_staleness:
            for s in rewarded:
                self._drop(s, "stale", batch)
            return
        for s in rewarded:
            self._taken.add(_pair_key(_pair(s)))
        rollout, task, k = gkey
        key = f"{task}#{rollout}:{k}" if rollout else f"{task}#{k}"
        batch.groups.append(
            StreamGroup(key, task, sorted(rewarded, key=lambda s: s.sample or 0), oldest, current - oldest)
        )
        batch.staleness.append(current - oldest)

    def _drop(self, s: StoredSession, reason: str, batch: StreamBatch) -> None:
        pair = _pair(s)
        self._dropped[_pair_key(pair)] = reason
        self.dropped_total[reason] += 1
        batch.dropped[reason] += 1
        batch.dropped_samples.append(
            {
                "rollout": pair[0],
                "task_id": pair[1],
                "sample": pair[2],
                "session_id": s.session_id,
                "reason": reason,
            }
        )
