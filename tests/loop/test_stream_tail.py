"""The streaming source reading only what was appended (``sdk.store.StoreTail``) against re-reading the store.

Stores are real segment files in the writer's format (``sdk.store._events`` + ``encode_event``), written by
several processes' chains that roll over to new segments, with lines landing half-written, rewards given
late by another process, and attempts superseded. Two sources follow the same store with the same clock
and policy versions, one incrementally, one re-reading it whole (the reference), and every poll must
return the same groups, drops and backlog.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sdk.store import _events
from sdk.store._events import encode_event
from trainers.data.stream import StreamingSource


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Chain:
    """One writing process's segments: ``<key>.<seq>.jsonl``, a new one past ``limit`` bytes."""

    def __init__(self, store: Path, key: str, limit: int = 900) -> None:
        self.store, self.key, self.limit = store, key, limit
        self.seq, self.size, self.partial = 0, 0, b""

    @property
    def path(self) -> Path:
        return self.store / f"{self.key}.{self.seq:05d}.jsonl"

    def write(self, event: dict, *, half: bool = False) -> None:
        """Append an event; ``half``: only its first half now (the rest comes with the next write)."""
        line = self.partial + encode_event(event)
        self.partial = b""
        if half:
            cut = len(line) // 2
            line, self.partial = line[:cut], line[cut:]
        with open(self.path, "ab") as fh:
            fh.write(line)
        self.size += len(line)
        if self.size >= self.limit and not self.partial:
            self.seq, self.size = self.seq + 1, 0


def _sample_events(
    sid: str, task: str, k: int, version: int, t: float, rng: random.Random, *, shared: bool = False
) -> list[dict]:
    """A session's start and one call (``shared``: a part of a session several processes write)."""
    meta = {"split": rng.choice(["train"] * 9 + ["eval"]), "rollout": "r1", "policy_version": version}
    start = _events.session_start(
        sid, ts=t, task_id=task, sample=k, metadata=meta, parent_session_ids=[], implicit=False, pid=1,
        spans_processes=shared,
    )  # fmt: skip
    request = {"messages": [{"role": "user", "content": f"{task} #{k}"}]}
    response = {
        "message": {"role": "assistant", "content": "x" * rng.randint(1, 40)},
        "finish_reason": "stop",
    }
    call = _events.call(
        f"c-{sid}-{rng.random()}", sid, framework="openai", model="m", request=request, response=response,
        started_at=t, ended_at=t, optional=(("policy_version", version),),
    )  # fmt: skip
    return [start, call]


def _summary(batch) -> tuple:
    groups = [
        (g.key, g.task_id, g.policy_version, g.staleness, [(s.session_id, s.reward) for s in g.sessions])
        for g in batch.groups
    ]
    drops = sorted((d["session_id"], d["reason"]) for d in batch.dropped_samples)
    return groups, drops, dict(batch.dropped), batch.pending, batch.backlog, batch.staleness


@pytest.mark.parametrize("seed", range(8))
def test_following_the_store_polls_the_same_groups_as_reading_it_whole(tmp_path, seed, monkeypatch):
    rng = random.Random(seed)
    # odd seeds: the sets of ended and forgotten sessions past their memory limit (SQLite and a Bloom filter)
    if seed % 2:
        monkeypatch.setattr("sdk.store._reader.DEFAULT_LIMIT", 2)
    store = tmp_path / "store"
    store.mkdir()
    clock = Clock()
    kw = dict(group_size=2, max_staleness=1, reward_wait_s=5.0, clock=clock)
    follow, reread = StreamingSource(store, **kw), StreamingSource(store, incremental=False, **kw)
    chains = [Chain(store, f"20261128T000000-h-{i}-abc{i}") for i in range(3)]
    scorer = Chain(store, "20261128T000001-h-9-score")  # late rewards from another process
    # Per sample, its events in order; the samples' events interleave at random across the chains.
    scripts: list[list[tuple[Chain, dict]]] = []
    for n in range(40):
        task, k = f"t{n // 4}", n % 4
        sid = f"s{n}"
        chain = rng.choice(chains)
        v = rng.choice(
            [0, 0, 0, 1, 1, 1, 1, 1, 1, 2]
        )  # the trainer moves from 0 to 2 (some stale, some future)
        shared = rng.random() < 0.2  # written by two processes, as the gateway's workers do
        steps = [(chain, e) for e in _sample_events(sid, task, k, v, clock.now, rng, shared=shared)]
        if shared:
            other = rng.choice([c for c in chains if c is not chain])
            part = _sample_events(sid, task, k, v, clock.now, rng, shared=True)
            part[0]["metadata"] = steps[0][1]["metadata"]
            steps += [(other, e) for e in part]
            if rng.random() < 0.5:  # that process ends its part too
                steps.append((other, _events.session_end(sid, ts=None, error=None, num_calls=1)))
        how = rng.random()
        if how < 0.6:  # rewarded before its end, in its own chain
            steps.append((chain, _events.reward(sid, float(rng.randint(0, 1)), "reward", None, 0.0)))
        elif how < 0.7:  # rewarded by the scoring process while it runs
            steps.append((scorer, _events.reward(sid, float(rng.randint(0, 1)), "reward", None, 0.0)))
        steps.append((chain, _events.session_end(sid, ts=None, error=None, num_calls=1)))
        if 0.7 <= how < 0.9:  # rewarded after its end, by the scoring process
            steps.append((scorer, _events.reward(sid, float(rng.randint(0, 1)), "reward", None, 0.0)))
        if rng.random() < 0.1:  # the runner ran this sample again: the first attempt is superseded
            steps.append((chain, _events.supersede(sid, reason="rerun", ts=0.0)))
            again = f"{sid}-again"
            steps += [(chain, e) for e in _sample_events(again, task, k, v, clock.now, rng)]
            steps.append((chain, _events.reward(again, 1.0, "reward", None, 0.0)))
            steps.append((chain, _events.session_end(again, ts=None, error=None, num_calls=1)))
        scripts.append(steps)
    polls, current, total = 0, 0, sum(len(s) for s in scripts)
    taken_a: list = []
    taken_b: list = []
    while any(scripts):
        steps = rng.choice([s for s in scripts if s])
        chain, event = steps.pop(0)
        clock.now += rng.random()
        if event["event"] == "session_end":
            event["ts"] = clock.now
        chain.write(event, half=rng.random() < 0.15)
        if rng.random() < 0.25:
            current = 3 * (total - sum(len(s) for s in scripts)) // (total + 1)  # 0, 1, 2 as writing goes on
            closed = not any(scripts) and not any(c.partial for c in chains)
            a, b = follow.poll(current, closed=closed), reread.poll(current, closed=closed)
            assert _summary(a) == _summary(b)
            taken_a, taken_b = taken_a + a.groups, taken_b + b.groups
            if rng.random() < 0.4:  # as the loop does: takes over several polls, then gives back the surplus
                keys = {g.key for g in taken_a if rng.random() < 0.3}
                follow.release([g for g in taken_a if g.key in keys])
                reread.release([g for g in taken_b if g.key in keys])
                taken_a, taken_b = [], []
            polls += 1
    for c in [*chains, scorer]:
        if c.partial:
            c.write(_events.reward("none", 0.0, "reward", None, 0.0))  # completes the half-written line
    clock.now += 10.0  # every reward wait over
    assert _summary(follow.poll(2, closed=True)) == _summary(reread.poll(2, closed=True))
    assert follow.state() == reread.state()
    assert polls > 10 and follow.incremental and follow.dropped_total == reread.dropped_total
    # Each line was parsed once: the calls the tail reconstructed are the calls written.
    assert follow._tail is not None and follow._tail.num_calls == _calls_written(store)
    # Every shared session ended and was decided: the tail holds none of their parts any more.
    follow.release([])
    follow.poll(2, closed=True)
    assert follow._tail._parts == {} and follow._pool == {}
    if seed % 2:
        assert follow._tail._seen._db is not None and follow._tail._forgotten._db is not None


def _calls_written(store: Path) -> int:
    return sum(p.read_bytes().count(b'"event":"call"') for p in store.glob("*.jsonl"))


def _write_samples(chain: Chain, first: int, n: int, clock: Clock, **start_kw) -> None:
    """Samples ``first..first+n-1`` of tasks of two samples each, rewarded 0/1, at policy version 0."""
    for k in range(first, first + n):
        sid = f"s{k}"
        meta = {"split": "train", "rollout": "r1", "policy_version": 0}
        chain.write(
            _events.session_start(
                sid, ts=clock.now, task_id=f"t{k // 2}", sample=k % 2, metadata=meta, parent_session_ids=[],
                implicit=False, pid=1, **start_kw,
            )
        )  # fmt: skip
        chain.write(_events.reward(sid, float(k % 2), "reward", None, 0.0))
        chain.write(_events.session_end(sid, ts=clock.now, error=None, num_calls=0))


def _two_sources(store, clock):
    kw = dict(group_size=2, max_staleness=1, reward_wait_s=5.0, clock=clock)
    return StreamingSource(store, **kw), StreamingSource(store, incremental=False, **kw)


def test_a_store_the_tail_cannot_follow_is_read_whole_from_then_on(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    clock = Clock()
    follow, reread = _two_sources(store, clock)
    chain = Chain(store, "20261128T000000-h-1-aaa", limit=10**9)
    _write_samples(chain, 0, 4, clock)
    assert _summary(follow.poll(0)) == _summary(reread.poll(0)) and follow.incremental
    # A session read as one process's, that another process then writes a part of: read whole from then on.
    _write_samples(Chain(store, "20261128T000000-h-2-bbb"), 1, 1, clock, spans_processes=True)
    a, b = follow.poll(0), reread.poll(0)
    assert _summary(a) == _summary(b) and not follow.incremental
    # A segment that shrank, or one that appeared before the segment being read: the tail says so and
    # the source reads the store whole.
    other = StreamingSource(store, group_size=2, max_staleness=1, clock=clock)
    other.poll(0)
    chain.path.write_bytes(chain.path.read_bytes()[:100])
    assert other.poll(0).groups == [] and not other.incremental
    store2 = tmp_path / "store2"
    store2.mkdir()
    follow, reread = _two_sources(store2, clock)
    _write_samples(Chain(store2, "20261128T000000-h-1-aaa"), 0, 2, clock)
    assert _summary(follow.poll(0)) == _summary(reread.poll(0))
    early = Chain(tmp_path, "early")
    _write_samples(early, 2, 2, clock)
    early.path.rename(store2 / "20261128T000000-h-1-aaa.0000.jsonl")  # sorts before its .00000 segment
    a, b = follow.poll(0), reread.poll(0)
    assert _summary(a) == _summary(b) and len(a.groups) == 1 and not follow.incremental


@pytest.mark.s3
def test_the_tail_reads_an_object_store_as_it_grows(bucket, tmp_path):
    import fsspec

    local = tmp_path / "local"
    local.mkdir()
    uri = f"{bucket}/traces"
    s3 = fsspec.filesystem("s3")
    clock = Clock()
    follow, reread = _two_sources(uri, clock)
    chain = Chain(local, "20261128T000000-h-1-aaa", limit=600)
    seen = 0
    for first in (0, 4, 8):
        _write_samples(chain, first, 4, clock)
        for seg in local.glob("*.jsonl"):  # what a writer's shipper does: whole segments, whole lines
            s3.put_file(str(seg), f"{uri}/{seg.name}")
        a, b = follow.poll(0), reread.poll(0)
        assert _summary(a) == _summary(b)
        seen += len(a.groups)
    assert seen == 6 and follow.incremental and len(list(local.glob("*.jsonl"))) > 1


def test_a_lock_step_round_takes_its_groups_as_a_whole_store_read_does(tmp_path):
    """Each round's poll reads only what was appended since the last round's, takes that round's groups
    (the same as a source reading the whole store), and leaves validation sessions alone."""
    from trainers.data.stream import StreamingSource
    from trainers.loop.driver import _is_round

    store = tmp_path / "store"
    store.mkdir()
    rng = random.Random(0)
    chains = [Chain(store, f"20261128T000000-h-{i}-abc{i}") for i in range(2)]
    scorer = Chain(store, "20261128T000001-h-9-score")
    clock = Clock()
    follow = StreamingSource(store, group_size=4, max_staleness=0, split=_is_round)
    for rnd in (1, 2, 3):
        for split in (f"round-{rnd}", f"eval-round-{rnd}"):
            for k in range(8):
                sid, chain = f"{split}-{k}", rng.choice(chains)
                shared = k % 4 == 1  # parts written by both processes, as the gateway's workers do
                for e in _sample_events(sid, f"t{k // 4}", k % 4, 0, clock.now, rng, shared=shared):
                    e.get("metadata", {})["split"] = split
                    e.get("metadata", {})["rollout"] = split
                    chain.write(e)
                if shared:
                    other = chains[1] if chain is chains[0] else chains[0]
                    for e in _sample_events(sid, f"t{k // 4}", k % 4, 0, clock.now, rng, shared=True):
                        e.get("metadata", {})["split"] = split
                        e.get("metadata", {})["rollout"] = split
                        other.write(e)
                if k % 3 == 0:  # its reward before its end
                    chain.write(_events.reward(sid, float(k % 2), "reward", None, 0.0))
                chain.write(_events.session_end(sid, ts=clock.now, error=None, num_calls=1))
                if k % 3 == 1:  # after its end, from the scoring process
                    scorer.write(_events.reward(sid, float(k % 2), "reward", None, 0.0))
        split = f"round-{rnd}"
        whole = StreamingSource(store, group_size=4, max_staleness=0, split=split, incremental=False)
        got = follow.poll(0, closed=True, only=lambda s, split=split: s.metadata.get("split") == split)
        want = whole.poll(0, closed=True)
        assert _summary(got) == _summary(want) and got.groups
        assert {s.metadata["split"] for g in got.groups for s in g.sessions} == {split}
    assert follow.incremental and follow._tail.num_calls == _calls_written(store)  # each line parsed once
