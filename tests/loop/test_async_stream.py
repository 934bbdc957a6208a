"""``StreamingSource`` on stores written through the SDK: groups, late rewards, staleness, exactly once."""

from __future__ import annotations

import json

import pytest

import sdk
from sdk.store import add_reward
from trainers.data.stream import StreamingSource
from trainers.errors import UserError


class Clock:
    def __init__(self) -> None:
        self.now = 1e10  # later than every session's end

    def __call__(self) -> float:
        return self.now


def _sample(task: str, k: int, *, version: int | None, reward: float | None, rollout: str = "r1") -> str:
    meta = {"split": "train", "rollout": rollout}
    if version is not None:
        meta["policy_version"] = version
    with sdk.session(task_id=task, sample=k, **meta) as s:
        if reward is not None:
            s.reward(reward)
        sid = s.session_id
    return sid


def _source(store, clock, **kw):
    kw.setdefault("max_staleness", 1)
    return StreamingSource(store, group_size=2, clock=clock, reward_wait_s=60, **kw)


def test_groups_form_once_all_samples_end_and_are_taken_once(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    clock = Clock()
    src = _source(store, clock)
    _sample("a", 0, version=0, reward=1.0)
    sdk.flush()
    first = src.poll(0)
    assert first.groups == [] and first.pending == 1  # one of two samples ended
    _sample("a", 1, version=0, reward=0.0)
    _sample("b", 0, version=0, reward=1.0, rollout="r2")  # another run: its own groups
    sdk.flush()
    second = src.poll(0)
    assert [g.task_id for g in second.groups] == ["a"] and [s.sample for s in second.groups[0].sessions] == [
        0,
        1,
    ]
    assert second.staleness == [0] and second.pending == 1
    assert src.poll(0).groups == []  # exactly once
    # The cursor survives a restart: a new source with the saved state takes nothing again.
    again = _source(store, clock, state=json.loads(json.dumps(src.state())))
    assert again.poll(0).groups == []


def test_a_late_reward_reaches_the_group_within_the_wait(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    clock = Clock()
    src = _source(store, clock)
    _sample("a", 0, version=0, reward=1.0)
    late = _sample("a", 1, version=0, reward=None)
    sdk.flush()
    clock.now = max(s.ended_at for s in sdk.store.read_sessions(store)) + 1
    waiting = src.poll(0)
    assert waiting.groups == [] and waiting.pending == 1 and not waiting.dropped
    add_reward(store, late, 0.5)  # the scoring job answers late
    got = src.poll(0)
    assert len(got.groups) == 1
    assert sorted(s.reward for s in got.groups[0].sessions) == [0.5, 1.0]


def test_missing_reward_after_the_wait_is_dropped_and_counted(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    clock = Clock()  # far past the wait
    src = _source(store, clock)
    for k in range(2):
        _sample("a", k, version=0, reward=None)
    _sample("b", 0, version=0, reward=1.0)
    _sample("b", 1, version=0, reward=None)
    sdk.flush()
    got = src.poll(0)
    assert got.groups == []
    assert got.dropped == {"no_reward_after_wait": 3, "group_too_small": 1}
    assert {d["reason"] for d in got.dropped_samples} == {"no_reward_after_wait", "group_too_small"}


def test_stale_groups_are_dropped_and_counted(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    src = _source(store, Clock(), max_staleness=1)
    for task, version in (("old", 0), ("ok", 1), ("new", 2)):
        for k in range(2):
            _sample(task, k, version=version, reward=float(k))
    _sample("mixed", 0, version=0, reward=1.0)  # the oldest turn decides
    _sample("mixed", 1, version=2, reward=0.0)
    _sample("nover", 0, version=None, reward=1.0)
    _sample("nover", 1, version=None, reward=0.0)
    sdk.flush()
    got = src.poll(2)
    assert sorted(g.task_id for g in got.groups) == ["new", "ok"]
    assert sorted(got.staleness) == [0, 1]
    assert got.dropped == {"stale": 4, "unknown_version": 2}
    assert src.dropped_total == {"stale": 4, "unknown_version": 2}
    assert src.state()["dropped"]["r1|old|0"] == "stale"


def test_superseded_attempts_are_left_out(tmp_path):
    from sdk.store import SegmentWriter
    from sdk.store import _events as events

    store = tmp_path / "store"
    sdk.configure(store=store)
    src = _source(store, Clock())
    cut = _sample("a", 0, version=0, reward=0.0)
    sdk.flush()
    w = SegmentWriter(store)
    w.append(events.encode_event(events.supersede(cut, reason="rerun", ts=1.0)))
    w.close()
    _sample("a", 1, version=0, reward=0.0)
    sdk.flush()
    assert src.poll(0).pending == 1  # the superseded attempt does not complete the group
    rerun = _sample("a", 0, version=0, reward=1.0)
    sdk.flush()
    (group,) = src.poll(0).groups
    assert rerun in {s.session_id for s in group.sessions} and cut not in {
        s.session_id for s in group.sessions
    }


def test_a_group_from_a_future_version_is_refused_and_counted(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    src = _source(store, Clock(), max_staleness=1)
    for k in range(2):
        _sample("ahead", k, version=5, reward=float(k))  # stamped by weights the trainer does not have
        _sample("now", k, version=2, reward=float(k))
    sdk.flush()
    got = src.poll(2)
    assert [g.task_id for g in got.groups] == ["now"] and got.staleness == [0]
    assert got.dropped == {"future_version": 2}
    assert {d["task_id"] for d in got.dropped_samples if d["reason"] == "future_version"} == {"ahead"}
    assert src.state()["dropped"]["r1|ahead|0"] == "future_version"
    assert src.poll(7).groups == []  # refused for good: not offered again once the trainer gets there


def test_a_given_back_group_that_lost_a_sample_is_offered_again(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    clock = Clock()
    src = StreamingSource(store, group_size=4, max_staleness=1, clock=clock)
    for k in range(4):
        _sample("a", k, version=0, reward=None if k == 3 else float(k % 2))
    sdk.flush()
    first = src.poll(0)
    (group,) = first.groups
    assert [s.sample for s in group.sessions] == [0, 1, 2] and first.dropped == {"no_reward_after_wait": 1}
    src.release(first.groups)  # the trainer had no room for it this version
    again = src.poll(0)
    assert [[s.sample for s in g.sessions] for g in again.groups] == [[0, 1, 2]]
    assert not again.dropped and again.pending == 0
    src.release(again.groups)
    # After a restart from a cursor saved meanwhile (the drop in it, the group not taken): offered again.
    restarted = StreamingSource(store, group_size=4, max_staleness=1, clock=clock, state=src.state())
    assert [[s.sample for s in g.sessions] for g in restarted.poll(0).groups] == [[0, 1, 2]]


def test_a_given_back_group_taken_again_stays_given_back_in_the_cursor_until_a_release_counts_it(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    clock = Clock()
    src = StreamingSource(store, group_size=4, max_staleness=1, clock=clock)
    for k in range(4):
        _sample("a", k, version=0, reward=None if k == 3 else float(k % 2))
    sdk.flush()
    src.release(src.poll(0).groups)  # lost sample 3 (no reward); no room for the group this version
    live = src.poll(0)
    assert [[s.sample for s in g.sessions] for g in live.groups] == [[0, 1, 2]]  # offered again live
    # A cursor saved now (taken again, no release since: not trained yet) offers it again after a restart.
    cursor = json.loads(json.dumps(src.state()))
    restarted = StreamingSource(store, group_size=4, max_staleness=1, clock=clock, state=cursor)
    again = restarted.poll(0)
    assert [[s.sample for s in g.sessions] for g in again.groups] == [[0, 1, 2]]
    assert not again.dropped and again.pending == 0
    # Once a release leaves it out (trained), it is final, live and through the cursor: never twice.
    for source in (src, restarted):
        source.release([])
        assert source.state()["taken"] == ["r1|a|0", "r1|a|1", "r1|a|2"]
        after = StreamingSource(store, group_size=4, max_staleness=1, clock=clock, state=source.state())
        assert after.poll(0).groups == [] and after.poll(0).pending == 0 and source.poll(0).groups == []


@pytest.mark.parametrize("incremental", [True, False])
def test_giving_back_a_group_a_release_already_counted_trained_is_refused(tmp_path, incremental):
    store = tmp_path / "store"
    sdk.configure(store=store)
    src = _source(store, Clock(), incremental=incremental)
    for k in range(2):
        _sample("a", k, version=0, reward=float(k))
    sdk.flush()
    taken = src.poll(0).groups
    src.release([])  # trained: final, and in any cursor saved from now on
    src.poll(0)
    with pytest.raises(UserError, match="a#r1:0"):
        src.release(taken)  # following the store it could not be offered again: never left in between
    assert src.state()["taken"] == ["r1|a|0", "r1|a|1"] and src.poll(0).groups == []


def test_once_nothing_more_will_come_a_part_done_group_is_dropped_not_awaited(tmp_path):
    store = tmp_path / "store"
    sdk.configure(store=store)
    src = StreamingSource(store, group_size=4, max_staleness=1, clock=Clock(), reward_wait_s=60)
    for k in range(3):  # the fourth sample never ends (its run was killed, no re-run will come)
        _sample("a", k, version=0, reward=1.0)
    for k in range(4):
        _sample("b", k, version=0, reward=float(k % 2))
    sdk.flush()
    live = src.poll(0)
    assert [g.task_id for g in live.groups] == ["b"] and live.pending == 1 and live.backlog == 3
    closed = src.poll(0, closed=True)
    assert closed.groups == [] and closed.pending == 0
    assert closed.dropped == {"group_incomplete": 3}
    assert src.poll(0, closed=True).dropped == {}  # decided once
