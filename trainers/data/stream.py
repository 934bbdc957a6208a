"""``StreamingSource``: GRPO groups from a store that keeps growing, exactly once, staleness-bounded.

The asynchronous loop (:mod:`trainers.loop.driver`, ``mode: async``) trains while the agents keep running.
This source follows the store they write to (a local directory or an ``s3://`` URI): each
:meth:`StreamingSource.poll` reads what was appended since the last one (:class:`sdk.store.StoreTail`, with
the reader's rules — torn lines, late rewards, superseded attempts), keeps the samples not decided yet, and
returns the GRPO groups that became ready. A poll's cost follows what was written since the last poll, not the
store's size. A store the tail cannot follow (a segment that shrank or vanished, see
:class:`sdk.store.StoreTail`) is read whole at each poll from then on, as with ``incremental=False``.

A *sample* is identified by ``(rollout, task_id, sample)``: ``rollout`` is the session metadata the rollout
runner stamps (its results file's key), so runs that reuse sample numbers never collide. Sample ``k`` of a
task belongs to the group ``k // group_size``. A group is ready when each of its ``group_size`` samples has
ended (a superseded attempt does not count: the runner ran that sample again) or was dropped already, and
each ended one has a reward or has waited ``reward_wait_s`` seconds since its session ended (late rewards,
from a scoring job or a user, are let in until then). Then, in this order:

- samples still without a reward are dropped (``no_reward_after_wait``); a group left with fewer than 2
  rewarded samples is dropped (``group_too_small``);
- the group's policy version is its OLDEST turn's: a call's ``policy_version`` when the store records it,
  else the session metadata ``policy_version`` the loop stamps on every sample; a group without one is
  dropped (``unknown_version``: its staleness cannot be bounded);
- a group with a turn of a version newer than ``current_version`` is dropped (``future_version``: weights
  the trainer never had; another run's store, or a run resumed from older weights);
- a group with ``current_version - version > max_staleness`` is dropped (``stale``);
- otherwise it is taken.

A group the trainer gives back (:meth:`StreamingSource.release`) is offered again, its dropped samples
still counted as decided, and stays given back, in the cursor too, until a release counts it trained (see
:meth:`StreamingSource.state`). A group that can no longer complete is never waited on: once nothing will
write samples any more (``poll(..., closed=True)``: the collector has ended), its ended samples are dropped
(``group_incomplete``); before that, the rollout runner re-runs a killed run's missing samples first
(:func:`sdk.rollout.run_continuous`).

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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk.store import StoredSession, StoreReader, StoreTail, TailUnsupported
from trainers.errors import UserError

__all__ = ["StreamBatch", "StreamGroup", "StreamingSource", "sample_key", "session_version"]

_STATE_FORMAT = 1
#: Drop reasons, in the order they are checked.
DROP_REASONS = (
    "group_incomplete",
    "no_reward_after_wait",
    "group_too_small",
    "unknown_version",
    "future_version",
    "stale",
)


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
    versions = _versions(session)
    return None if versions is None else min(versions)


def _versions(session: StoredSession) -> list[int] | None:
    """The policy version of each of ``session``'s calls (the metadata's when it has none), or ``None``."""
    meta = session.metadata.get("policy_version") if isinstance(session.metadata, dict) else None
    fallback = meta if isinstance(meta, int) and not isinstance(meta, bool) else None
    versions = []
    for call in session.calls:
        v = call.get("policy_version")
        versions.append(v if isinstance(v, int) and not isinstance(v, bool) else fallback)
    if not versions:
        return None if fallback is None else [fallback]
    if any(v is None for v in versions):
        return None
    return versions  # type: ignore[return-value]


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
        split: Only sessions whose metadata ``split`` equals this, or for which this function of it is
            true (``None``: any); validation sessions written to the same store are left alone.
        clock: Time source (tests pass a fake one).
        incremental: Read only what was appended since the last poll (``False``: read the whole store at
            each poll; the same groups, at a cost that grows with the store).

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
        split: str | Callable[[Any], bool] | None = "train",
        clock: Callable[[], float] = time.time,
        incremental: bool = True,
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
        self._dropped_in: Counter[tuple[str, str, int]] = Counter()  # dropped samples per group key
        self.dropped_total: Counter[str] = Counter()
        self.incremental = incremental
        self._tail: StoreTail | None = None
        # Incremental: the ended samples of the split not decided yet, by pair key then session id (two
        # attempts of a sample may both have ended; the candidates take the later live one).
        self._pool: dict[str, dict[str, StoredSession]] = {}
        self._open_takes: set[str] = set()  # taken since the last release: may be given back
        # Given back and not counted trained since (a release that left them out): the cursor keeps them
        # undecided, also when they were taken again after their release.
        self._given_back: set[str] = set()
        if state:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise UserError(f"unknown stream cursor format {state.get('format')!r}")
        self._taken = set(state.get("taken") or [])
        self._dropped = dict(state.get("dropped") or {})
        self._given_back = set(state.get("given_back") or []) - self._taken - self._dropped.keys()
        self.dropped_total = Counter(self._dropped.values())
        for key in self._dropped:
            rollout, rest = key.split("|", 1)
            task, k = rest.rsplit("|", 1)
            self._dropped_in[(rollout, task, int(k) // self.group_size)] += 1

    def state(self) -> dict[str, Any]:
        """The cursor: samples taken and dropped (with reasons), JSON-serialisable.

        ``taken`` counts a group as trained once it is taken (a trainer that trains all it takes need not
        release), except a group given back (:meth:`release`) and taken again since the last release: it
        was not trained when given back, so it stays under ``given_back`` (with the given-back groups not
        taken again) and a source restored from the cursor offers it again; the next release that leaves
        it out counts it trained. The loop releases before it trains and saves, so its cursors list no
        group as taken that is trained after the save.

        Example:
            >>> import tempfile
            >>> StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0).state()["format"]
            1
        """
        return {
            "format": _STATE_FORMAT,
            "taken": sorted(self._taken - self._given_back),
            "given_back": sorted(self._given_back),
            "dropped": dict(self._dropped),
        }

    def release(self, groups: list[StreamGroup]) -> None:
        """Give taken groups back: the next :meth:`poll` offers them again (with their staleness then).

        The loop takes a batch's worth and releases the rest, so the cursor it saves never counts a group
        as taken that no step trained on. Groups taken before the previous release are final; until then
        a source that follows the store keeps their samples in memory, as they may come back. A group
        offered with fewer than ``group_size`` samples (some were dropped) is offered again with the same
        samples: its dropped ones stay decided.

        Raises:
            UserError: A group an earlier release counted trained (taken before it, not given back then):
                a cursor saved since counts it, and following the store its samples are forgotten.

        Example:
            >>> import tempfile
            >>> src = StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0)
            >>> src.release([])
        """
        back = {_pair_key(_pair(s)): g.key for g in groups for s in g.sessions}
        final = sorted({key for k, key in back.items() if k in self._taken and k not in self._open_takes})
        if final:
            raise UserError(
                f"cannot give back {', '.join(final)}: an earlier release counted them trained "
                "(give groups back at the first release after they are taken)"
            )
        self._taken.difference_update(back)
        # The other groups taken since the last release are trained: following the store, their samples
        # are forgotten at the next poll (until now they were kept, in case they came back).
        self._given_back -= self._open_takes
        self._given_back.update(back)
        self._open_takes.clear()

    def _candidates(self) -> dict[tuple[str, str, int], dict[int, StoredSession]]:
        """Ended, not superseded, not yet decided samples of the split, by group key then sample."""
        store = self.store
        if not str(store).startswith(("s3://", "gs://", "az://")) and not Path(store).is_dir():
            return {}  # nothing written yet
        groups: dict[tuple[str, str, int], dict[int, StoredSession]] = defaultdict(dict)
        for s in self._followed() if self.incremental else StoreReader(store).sessions():
            if not self._wanted(s):
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

    def _wanted(self, s: StoredSession) -> bool:
        """An ended training sample of the split that no later attempt replaces."""
        if s.implicit or s.task_id is None or s.sample is None or s.superseded:
            return False
        if s.status == "incomplete" or s.ended_at is None:
            return False
        split = s.metadata.get("split")
        return self.split is None or (self.split(split) if callable(self.split) else split == self.split)

    def _final(self, key: str) -> bool:
        """Whether a sample is decided for good: dropped, or taken and not given back at the last release."""
        return key in self._dropped or (key in self._taken and key not in self._open_takes)

    def _undecided(self, s: StoredSession) -> bool:
        return self._wanted(s) and not self._final(_pair_key(_pair(s)))

    def _followed(self) -> Iterable[StoredSession]:
        """The undecided samples after reading what the store got since the last poll (incremental mode)."""
        try:
            if self._tail is None:
                self._tail = StoreTail(self.store)
            update = self._tail.read(keep=self._undecided)
        except TailUnsupported:
            self.incremental, self._tail, self._pool = False, None, {}
            return StoreReader(self.store).sessions()
        pool = self._pool
        for key in [k for k in pool if self._final(k)]:
            del pool[key]
        for s in update.ended:
            pool.setdefault(_pair_key(_pair(s)), {})[s.session_id] = s
        if update.rewards or update.superseded:
            for key, attempts in list(pool.items()):
                for sid, s in list(attempts.items()):
                    s.rewards.extend(update.rewards.get(sid, ()))
                    if sid in update.superseded:  # replaced by a later attempt for good
                        del attempts[sid]
                if not attempts:
                    del pool[key]
        return [s for attempts in pool.values() for s in attempts.values()]

    def poll(
        self,
        current_version: int,
        *,
        closed: bool = False,
        only: Callable[[StoredSession], bool] | None = None,
    ) -> StreamBatch:
        """Read the store and return the groups ready now (see the module docstring).

        Args:
            current_version: The trainer's policy version (staleness is counted from it).
            closed: Nothing will write training samples any more (the collector has ended): a group whose
                samples have not all ended cannot complete, and its ended samples are dropped
                (``group_incomplete``) instead of waited on.
            only: Decide only the samples it is true for (the lock-step loop: this round's); the others
                stay undecided for a later poll, ``closed`` or not.

        Example:
            >>> import tempfile
            >>> StreamingSource(tempfile.mkdtemp(), group_size=2, max_staleness=0).poll(3).pending
            0
        """
        batch = StreamBatch()
        now = self.clock()
        for gkey, samples in sorted(self._candidates().items()):
            if only is not None:
                samples = {k: s for k, s in samples.items() if only(s)}
                if not samples:
                    continue
            if len(samples) + self._dropped_in[gkey] < self.group_size:
                if closed:
                    for s in samples.values():
                        self._drop(s, "group_incomplete", batch)
                    continue
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
        versions = [_versions(s) for s in rewarded]
        known = [v for v in versions if v is not None]
        if len(known) < len(versions):
            for s in rewarded:
                self._drop(s, "unknown_version", batch)
            return
        oldest = min(min(v) for v in known)
        if max(max(v) for v in known) > current:  # never trained from weights the trainer did not have
            for s in rewarded:
                self._drop(s, "future_version", batch)
            return
        if current - oldest > self.max_staleness:
            for s in rewarded:
                self._drop(s, "stale", batch)
            return
        for s in rewarded:
            self._taken.add(_pair_key(_pair(s)))
            self._open_takes.add(_pair_key(_pair(s)))
        rollout, task, k = gkey
        key = f"{task}#{rollout}:{k}" if rollout else f"{task}#{k}"
        batch.groups.append(
            StreamGroup(key, task, sorted(rewarded, key=lambda s: s.sample or 0), oldest, current - oldest)
        )
        batch.staleness.append(current - oldest)

    def _drop(self, s: StoredSession, reason: str, batch: StreamBatch) -> None:
        pair = _pair(s)
        self._dropped[_pair_key(pair)] = reason
        self._given_back.discard(_pair_key(pair))
        self._dropped_in[(pair[0], pair[1], pair[2] // self.group_size)] += 1
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
