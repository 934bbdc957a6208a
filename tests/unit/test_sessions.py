"""Sessions: context managers, decorators, nesting, rewards, threads and the implicit session."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from pathlib import Path

import pytest

import sdk
from sdk.capture import CallRecord, record_call
from sdk.store import StoreReader, add_reward


def _call(text: str, messages: list | None = None) -> CallRecord:
    return CallRecord(
        framework="test",
        model="m",
        messages=messages or [{"role": "user", "content": text}],
        response_message={"role": "assistant", "content": f"re: {text}"},
    )


def _sessions(path: Path) -> dict[str, sdk.Session]:
    sdk.flush()
    return {s.session_id: s for s in StoreReader(path).sessions()}


def test_with_session_records_calls_rewards_and_metadata(store: Path) -> None:
    with sdk.session(task_id="t1", split="train", sample=3) as s:
        record_call(_call("a"))
        record_call(_call("b"))
        sdk.reward(0.5)
        s.reward(1.0)
        s.reward(0.2, name="format")
    assert s.num_calls == 2
    got = _sessions(store)[s.session_id]
    assert (got.task_id, got.sample, got.metadata, got.status) == ("t1", 3, {"split": "train"}, "ok")
    assert got.reward == 1.0  # the last value under a name wins
    assert got.named_rewards == {"reward": 1.0, "format": 0.2}
    assert [c["request"]["messages"][0]["content"] for c in got.calls] == ["a", "b"]


def test_session_error_is_recorded_and_propagates_unchanged(store: Path) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom) as info:
        with sdk.session(task_id="t") as s:
            raise Boom("user failure")
    assert str(info.value) == "user failure"
    got = _sessions(store)[s.session_id]
    assert got.status == "error" and got.error == {"type": "Boom", "message": "user failure"}


def test_nested_sessions_merge_metadata_and_inherit_task(store: Path) -> None:
    with sdk.session(task_id="outer", a=1, b=1) as outer:
        record_call(_call("o"))
        with sdk.session(b=2, c=3) as inner:
            record_call(_call("i"))
            assert sdk.current_session() is inner
        assert sdk.current_session() is outer
    assert outer.num_calls == 2 and inner.num_calls == 1  # inner calls are visible from the outer one
    got = _sessions(store)
    assert got[inner.session_id].metadata == {"a": 1, "b": 2, "c": 3}
    assert got[inner.session_id].task_id == "outer"
    assert got[inner.session_id].parent_session_ids == [outer.session_id]
    assert len(got[outer.session_id].calls) == 1 and len(got[inner.session_id].calls) == 1


def test_decorators_on_every_function_kind(store: Path) -> None:
    seen: list[tuple[str, str]] = []

    @sdk.session(task_id=lambda q: f"sync-{q}")
    def sync_fn(q: int) -> int:
        seen.append(("sync", sdk.current_session().task_id))
        return q * 2

    @sdk.session(task_id=lambda q: f"async-{q}")
    async def async_fn(q: int) -> int:
        await asyncio.sleep(0)
        seen.append(("async", sdk.current_session().task_id))
        return q * 3

    @sdk.session(task_id="gen")
    def gen_fn(n: int):
        for i in range(n):
            seen.append(("gen", sdk.current_session().task_id))
            yield i

    @sdk.session(task_id="agen")
    async def agen_fn(n: int):
        for i in range(n):
            await asyncio.sleep(0)
            seen.append(("agen", sdk.current_session().task_id))
            yield i

    async def consume() -> list[int]:
        return [i async for i in agen_fn(2)]

    assert sync_fn(1) == 2 and sync_fn(2) == 4
    assert asyncio.run(async_fn(1)) == 3
    assert list(gen_fn(2)) == [0, 1]
    assert asyncio.run(consume()) == [0, 1]
    assert sdk.current_session() is None  # generators never leak their session to the consumer
    assert seen == [
        ("sync", "sync-1"),
        ("sync", "sync-2"),
        ("async", "async-1"),
        ("gen", "gen"),
        ("gen", "gen"),
        ("agen", "agen"),
        ("agen", "agen"),
    ]
    tasks = sorted(s.task_id for s in _sessions(store).values())
    assert tasks == ["agen", "async-1", "gen", "sync-1", "sync-2"]  # a fresh session per call


def test_async_with_and_tasks_carry_context(store: Path) -> None:
    async def worker(i: int) -> str:
        async with sdk.session(task_id=f"t{i}") as s:
            await asyncio.sleep(0.001 * (i % 3))
            inner = await asyncio.create_task(asyncio.sleep(0, result=sdk.current_session()))
            assert inner is s
            record_call(_call(f"q{i}"))
            return s.session_id

    async def main() -> list[str]:
        return await asyncio.gather(*(worker(i) for i in range(50)))

    ids = asyncio.run(main())
    got = _sessions(store)
    for i, sid in enumerate(ids):
        assert got[sid].task_id == f"t{i}"
        assert got[sid].calls[0]["request"]["messages"][0]["content"] == f"q{i}"


def test_wrap_carries_the_session_into_threads(store: Path) -> None:
    with sdk.session(task_id="t") as s:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(sdk.wrap(lambda _: sdk.current_session()), range(4))) == [s] * 4
            assert pool.submit(sdk.current_session).result() is None  # documented: plain threads don't
        t = threading.Thread(target=sdk.wrap(lambda: record_call(_call("from thread"))))
        t.start()
        t.join()
    assert len(_sessions(store)[s.session_id].calls) == 1


def test_calls_outside_sessions_go_to_the_implicit_session(store: Path) -> None:
    record_call(_call("loose 1"))
    record_call(_call("loose 2"))
    sdk.shutdown()
    [implicit] = StoreReader(store).sessions()
    assert implicit.implicit and implicit.status == "ok" and len(implicit.calls) == 2


def test_implicit_sessions_off_counts_skipped_calls(store: Path, caplog: pytest.LogCaptureFixture) -> None:
    sdk.configure(implicit_sessions="off")
    before = sdk.stats()["calls_outside_session_skipped"]
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        record_call(_call("loose"))
        record_call(_call("loose"))
    assert sdk.stats()["calls_outside_session_skipped"] == before + 2
    assert list(StoreReader(store).sessions()) == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", None, True])
def test_reward_rejects_non_finite_and_non_numbers(store: Path, value: object) -> None:
    with sdk.session(task_id="t") as s:
        with pytest.raises(ValueError, match="reward"):
            s.reward(value)  # type: ignore[arg-type]


def test_reward_outside_a_session_is_a_clear_error(store: Path) -> None:
    with pytest.raises(ValueError, match="outside a session"):
        sdk.reward(1.0)


def test_post_hoc_reward_from_another_writer(store: Path) -> None:
    with sdk.session(task_id="t") as s:
        record_call(_call("x"))
    s.reward(0.25, name="late")  # after the session ended
    add_reward(store, s.session_id, 0.75, name="judge")
    got = _sessions(store)[s.session_id]
    assert got.named_rewards == {"late": 0.25, "judge": 0.75}


def test_configure_rejects_invalid_store_paths(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad in (a_file, a_file / "sub", "", 42):
        with pytest.raises(ValueError, match="store"):
            sdk.configure(store=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fsync"):
        sdk.configure(fsync="sometimes")


def test_non_serialisable_metadata_is_stored_as_repr_with_one_warning(
    store: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque>"

    before = sdk.stats()["values_stored_as_repr"]
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        for _ in range(3):
            with sdk.session(task_id="t", thing=Opaque()) as s:
                record_call(_call("x"))
    assert sdk.stats()["values_stored_as_repr"] == before + 3
    assert sum("Opaque" in r.getMessage() for r in caplog.records) <= 1
    assert _sessions(store)[s.session_id].metadata == {"thing": "<Opaque>"}


def test_prefix_deduplication_stores_only_new_messages(store: Path) -> None:
    system = {"role": "system", "content": "you are terse " * 50}
    messages = [system, {"role": "user", "content": "turn 0"}]
    with sdk.session(task_id="t") as s:
        for i in range(10):
            rec = _call("", messages=list(messages))
            record_call(rec)
            messages = [*messages, rec.response_message, {"role": "user", "content": f"turn {i + 1}"}]
    sdk.flush()
    raw = b"".join(p.read_bytes() for p in store.glob("*.jsonl"))
    assert raw.count(b'"role":"system"') == 1  # the system prompt is stored once
    calls = _sessions(store)[s.session_id].calls
    assert [len(c["request"]["messages"]) for c in calls] == [2 + 2 * i for i in range(10)]
    assert calls[-1]["request"]["messages"] == messages[:-2]


def test_segment_rotation_and_many_writers(store: Path, tmp_path: Path) -> None:
    sdk.configure(segment_max_bytes=2000)
    with sdk.session(task_id="t") as s:
        for i in range(30):
            record_call(_call(f"message {i} " + "x" * 100))
    assert len(list(store.glob("*.jsonl"))) > 3
    got = _sessions(store)[s.session_id]
    assert len(got.calls) == 30
