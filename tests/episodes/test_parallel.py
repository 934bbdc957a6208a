"""Parallel export (worker processes over segment chains) gives exactly the single-process result."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import polars as pl
import pytest

from sdk import export as export_cli
from sdk.episodes import EpisodeError, export
from sdk.episodes._parallel import _split_shares, plan_workers
from tests.support.sessions import RawStore, assistant, system, tool, tool_call, user

OK = [system("s"), user("q")]


def multi_process_store(path: Path, processes: int = 3, sessions: int = 4) -> Path:
    for p in range(processes):
        raw = RawStore(path, f"20260101T000000-host-{p}-abcdef")
        for i in range(sessions):
            sid = f"p{p}s{i}"
            calls = [tool_call("c1")] if i % 2 else None
            raw.start(sid, task_id=f"t{i % 2}", metadata={"split": "train"})
            raw.call(sid, OK, assistant(None, calls) if calls else assistant("direct"), call_id=f"{sid}a")
            if calls:
                raw.call(sid, [*OK, assistant(None, calls), tool("c1")], assistant("done"), call_id=f"{sid}b")
            if i != 3:
                raw.reward(sid, float(i) / 4)
            raw.end(sid)
    return path


def frames_equal(a: Path, b: Path) -> bool:
    return pl.read_parquet(a).equals(pl.read_parquet(b))


def test_parallel_equals_single_process(tmp_path: Path) -> None:
    store = multi_process_store(tmp_path / "store")
    # A reward written by a scoring job in another process, for a session of the first process.
    RawStore(store, "20260101T000000-scorer-9-abcdef").reward("p0s3", 0.5).reward("ghost", 1.0)
    one = export(store, tmp_path / "one.parquet", workers=1)
    two = export(store, tmp_path / "two.parquet", workers=2)
    assert frames_equal(tmp_path / "one.parquet", tmp_path / "two.parquet")
    for s in (one, two):
        assert s.written == 10 and dict(s.rejected) == {"missing_reward": 2}
        assert dict(s.store_problems) == {"reward_for_unknown_session": 1}
    a, b = one.reward_stats(), two.reward_stats()
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k]) for k in a)
    assert (
        two.token_faithful == one.token_faithful and two.sessions == one.sessions and two.calls == one.calls
    )
    rejects = [json.loads(x) for x in (tmp_path / "two.rejects.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in rejects) == ["p1s3:0", "p2s3:0"]


def test_a_session_in_two_processes_is_rejected_once_as_duplicate(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for p in range(2):
        RawStore(store, f"20260101T000000-host-{p}-abcdef").session("same", OK, assistant("a"))
    single = export(store, tmp_path / "one.parquet", workers=1)
    assert single.written == 1 and dict(single.store_problems) == {"event_after_session_end": 4}
    parallel = export(store, tmp_path / "two.parquet", workers=2)
    assert parallel.written == 1 and dict(parallel.rejected) == {"duplicate_id": 1}
    [line] = (tmp_path / "two.rejects.jsonl").read_text().splitlines()
    assert json.loads(line)["reasons"] == ["duplicate_id"]
    with pytest.raises(EpisodeError, match="duplicate_id"):
        export(store, tmp_path / "strict.parquet", workers=2, strict=True)


def test_strict_failure_in_a_worker_is_raised_and_nothing_is_written(tmp_path: Path) -> None:
    store = multi_process_store(tmp_path / "store")
    out = tmp_path / "e.parquet"
    with pytest.raises(EpisodeError, match=r"missing_reward.*strict mode"):
        export(store, out, workers=3, strict=True)
    assert not out.exists() and list(tmp_path.glob(".e.parquet*")) == []  # no parts or temp file left


def test_strict_failure_only_in_a_worker_group_is_raised(tmp_path: Path) -> None:
    # This process exports the first chain group itself: an error in another group, found by a worker
    # process, must still stop the export.
    store = tmp_path / "store"
    for p in range(2):
        raw = RawStore(store, f"20260101T000000-host-{p}-abcdef")
        raw.session(f"p{p}", OK, assistant("a"), reward=None if p else 1.0)
    assert [len(g) for g in plan_workers(store, 2)] == [1, 1]
    out = tmp_path / "e.parquet"
    with pytest.raises(EpisodeError, match=r"p1:0: missing_reward.*strict mode"):
        export(store, out, workers=2, strict=True)
    assert not out.exists() and list(tmp_path.glob(".e.parquet*")) == []


def test_a_worker_that_dies_is_reported_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = multi_process_store(tmp_path / "store", processes=2)
    (tmp_path / "dying_rewards.py").write_text(
        "import os\n"
        "def score(ep):\n"
        "    if os.getpid() != int(os.environ['PARENT_PID']):\n"
        "        os._exit(3)  # a worker killed mid-export (out of memory, say)\n"
        "    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PARENT_PID", str(os.getpid()))
    out = tmp_path / "e.parquet"
    with pytest.raises(RuntimeError, match=r"export worker 1 died \(exit code 3\)"):
        export(store, out, workers=2, reward_fns="dying_rewards:score")
    assert not out.exists() and list(tmp_path.glob(".e.parquet*")) == []


def test_module_level_reward_functions_travel_to_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = multi_process_store(tmp_path / "store")
    (tmp_path / "par_rewards.py").write_text("def one(ep):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = export(store, tmp_path / "e.parquet", workers=2, reward_fns="par_rewards:one")
    assert summary.written == 12 and set(pl.read_parquet(tmp_path / "e.parquet")["reward"]) == {1.0}
    # A lambda cannot be sent to a worker: the export runs in this process instead, same result.
    summary = export(store, tmp_path / "f.parquet", workers=2, reward_fns=lambda ep: 1.0)
    assert summary.written == 12 and frames_equal(tmp_path / "e.parquet", tmp_path / "f.parquet")


def test_cli_workers_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = multi_process_store(tmp_path / "store")
    rc = export_cli.main(
        [
            "--store",
            str(store),
            "--out",
            str(tmp_path / "e.parquet"),
            "--workers",
            "2",
            "--summary-json",
            "-",
            "-q",
        ]
    )
    assert rc == 0 and json.loads(capsys.readouterr().out)["written"] == 9


def test_planning(tmp_path: Path) -> None:
    store = multi_process_store(tmp_path / "store", processes=3, sessions=1)
    assert plan_workers(store, 1) is None
    assert plan_workers(store, 0) is None  # automatic, small store: not worth starting processes
    assert [len(g) for g in plan_workers(store, 2)] in ([1, 2], [2, 1])
    assert [len(g) for g in plan_workers(store, 8)] == [1, 1, 1]
    assert plan_workers(store, 2, group_rewards=True) is None
    one_chain = tmp_path / "one"
    RawStore(one_chain).session("s", OK, assistant("a"))
    assert plan_workers(one_chain, 4) is None
    chains = [[tmp_path / f"c{i}"] for i in range(4)]
    for i, c in enumerate(chains):
        c[0].write_bytes(b"x" * (100 if i == 0 else 10))
    assert [len(g) for g in _split_shares(chains, 2)] == [1, 3]


def test_spilled_indexes_give_the_same_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past DEFAULT_LIMIT entries the reader's reward index and seen-session set live in SQLite: a store
    # with late, foreign, unknown and duplicate-session rewards exports the same either way.
    import sdk.store._reader as reader_module

    store = multi_process_store(tmp_path / "store")
    RawStore(store, "20260101T000000-scorer-9-abcdef").reward("p0s3", 0.5).reward("ghost", 1.0)
    RawStore(store, "20260101T000000-host-0-abcdef").session("p0s0", OK, assistant("again"))
    memory = export(store, tmp_path / "memory.parquet", workers=1)
    monkeypatch.setattr(reader_module, "DEFAULT_LIMIT", 2)
    spilled = export(store, tmp_path / "spilled.parquet", workers=1)
    assert frames_equal(tmp_path / "memory.parquet", tmp_path / "spilled.parquet")
    paths = ("out", "rejects_path", "elapsed_s")
    assert {k: v for k, v in spilled.to_dict().items() if k not in paths} == {
        k: v for k, v in memory.to_dict().items() if k not in paths
    }
    assert dict(spilled.store_problems) == {"reward_for_unknown_session": 1, "event_after_session_end": 4}


def test_the_duplicate_dropped_in_the_merge_is_the_later_copy_across_batches(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = RawStore(store, "20260101T000000-host-0-abcdef")
    second = RawStore(store, "20260101T000000-host-1-abcdef")
    for sid in ("a", "b", "c"):
        first.session(sid, OK, assistant(f"{sid} first"))
    for sid in ("d", "e", "b", "f"):
        second.session(sid, OK, assistant(f"{sid} second"))
    export(store, tmp_path / "two.parquet", workers=2, batch_size=2)
    frame = pl.read_parquet(tmp_path / "two.parquet")
    assert frame["episode_id"].to_list() == ["a:0", "b:0", "c:0", "d:0", "e:0", "f:0"]
    assert frame.filter(pl.col("session_id") == "b")["messages"][0][-1]["content"] == "b first"


def test_rewards_given_anywhere_reach_their_sessions_in_both_modes(tmp_path: Path) -> None:
    # Rewards inside their session (attached as the store is read), after it ended, before it started,
    # from a scoring process, invalid ones, and a scoring chain with more sessions waiting than the first
    # pass follows (indexed whole): one process and two give the same episodes and counts.
    store = multi_process_store(tmp_path / "store", processes=2)
    RawStore(store, "20260101T000000-host-0-abcdef").reward("p0s3", 0.25).reward("p0s1", "bad")
    late = RawStore(store, "20260101T000000-host-2-abcdef").reward("early", 0.5)
    late.start("early").call("early", OK, assistant("a"), call_id="e1").end("early")
    scorer = RawStore(store, "20260101T000000-scorer-9-abcdef").reward("p1s3", 0.75)
    scorer.raw(
        b"".join(
            json.dumps({"event": "reward", "v": 1, "session_id": f"ghost{i}", "value": 1.0}).encode() + b"\n"
            for i in range(10_001)
        )
    )
    one = export(store, tmp_path / "one.parquet", workers=1)
    two = export(store, tmp_path / "two.parquet", workers=2)
    assert frames_equal(tmp_path / "one.parquet", tmp_path / "two.parquet")
    for s in (one, two):
        assert s.written == 9 and dict(s.rejected) == {}
        assert dict(s.store_problems) == {"invalid_reward": 1, "reward_for_unknown_session": 10_001}
    rewards = dict(pl.read_parquet(tmp_path / "one.parquet").select("session_id", "reward").iter_rows())
    assert rewards["p0s3"] == 0.25 and rewards["p1s3"] == 0.75 and rewards["early"] == 0.5


def test_progress_counts_every_call_and_byte_of_the_store(tmp_path: Path) -> None:
    from sdk.episodes import EpisodeOptions
    from sdk.episodes._pipeline import Pipeline
    from sdk.store import StoreReader

    store = multi_process_store(tmp_path / "store")
    reader = StoreReader(store)
    seen = [0, 0]

    def progress(calls: int, nbytes: int) -> None:
        seen[0] += calls
        seen[1] += nbytes

    pipeline = Pipeline(reader, EpisodeOptions(require_reward=False), progress=progress)
    episodes = sum(1 for _ in pipeline)
    assert episodes == 12 and seen == [pipeline.summary.calls, reader.total_bytes()]
    assert reader.bytes_read == reader.total_bytes()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_progress_bar_shows_the_share_of_the_store_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    pytest.importorskip("tqdm")
    store = multi_process_store(tmp_path / "store")
    export(store, tmp_path / "e.parquet", workers=workers, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"export:\s+\d+%\|", err)  # a percentage: the bar knows the store's size (and an ETA)
