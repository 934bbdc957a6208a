"""The bad-input corpus of ``python -m sdk.train``: a counted skip or one ``error:`` line with exit 2, never
a traceback or a hang.

Each case builds a store directory or a Parquet file next to good data (two tasks, rewards 1 and 0, so a
dry run has groups to show) and runs ``sdk.train --dry-run`` on it under an alarm. A case expects either
exit 0 with its count in the data report, or exit 2 with one ``error:`` line naming the problem.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk.train import main
from tests.support.segments import SEGMENT, good_store, session_lines
from tests.support.segments import event_line as _line
from tests.support.segments import negative_token_id as _negative_token_id
from tests.support.synth import episode_schema, make_episodes, write_parquet


def parquet_with(path: Path, tokenizer: Any, change: Callable[[list[dict[str, Any]]], Any]) -> Path:
    episodes = make_episodes(2, 2, tokenizer=tokenizer)
    change(episodes)
    return write_parquet(episodes, path)


def raw_parquet(path: Path, tokenizer: Any, **columns: Callable[[Any], Any]) -> Path:
    """Good episodes with some columns replaced (polars infers their new type: e.g. a string column)."""
    import polars as pl

    rows = make_episodes(2, 2, tokenizer=tokenizer)
    df = pl.DataFrame(rows, schema=episode_schema())
    for name, fn in columns.items():
        df = df.with_columns(pl.Series(name, [fn(v) for v in df[name].to_list()]))
    df.write_parquet(path)
    return path


def _drop_column(path: Path, column: str) -> Path:
    import polars as pl

    pl.read_parquet(path).drop(column).write_parquet(path)
    return path


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[Path, Any], Path]  # (tmp_path, tokenizer) -> the --data path
    report: dict[str, str] = dataclasses.field(default_factory=dict)  # line prefix -> value, in the report
    error: str | None = None  # a fragment of the one error line (exit 2)
    args: tuple[str, ...] = ()


def store_case(tmp: Path, extra: Callable[[Path], Any]) -> Path:
    store = good_store(tmp / "store")
    extra(store)
    return store


def _fifo(store: Path) -> None:
    os.mkfifo(store / "20260101T000000-host-2-bbbbbb.00001.jsonl")


def _surrogate(store: Path) -> None:
    with open(store / SEGMENT, "ab") as fh:
        fh.write(session_lines("s-sur", "t0", 1.0, content="half \ud83d emoji"))


def _damaged_thread(store: Path) -> None:
    """A 3-turn chat whose 2nd call's line is damaged: the 3rd cannot be rebuilt exactly (issue 20, item 2)."""
    first = {
        "event": "call",
        "call_id": "c1",
        "session_id": "dmg",
        "framework": "openai",
        "model": "tiny",
        "request": {"messages": [{"role": "user", "content": "u0"}], "params": {}},
        "response": {"message": {"role": "assistant", "content": "a0"}, "finish_reason": "stop"},
        "started_at": 2.0,
        "ended_at": 3.0,
    }
    third = {
        "event": "call",
        "call_id": "c3",
        "session_id": "dmg",
        "framework": "openai",
        "model": "tiny",
        # Builds on "the previous call" (no call_id), the lost 2nd one: the first 4 messages of its thread.
        "request": {"messages": [{"role": "user", "content": "u2"}], "base": {"n": 4}, "params": {}},
        "response": {"message": {"role": "assistant", "content": "b"}, "finish_reason": "stop"},
        "started_at": 2.0,
        "ended_at": 3.0,
    }
    with open(store / SEGMENT, "ab") as fh:
        fh.write(_line({"event": "session_start", "session_id": "dmg", "ts": 1.0, "task_id": "t0"}))
        fh.write(_line(first))
        fh.write(b"{garbage\n")
        fh.write(_line(third))
        fh.write(_line({"event": "reward", "session_id": "dmg", "value": 1.0, "name": "reward", "ts": 4.0}))
        fh.write(_line({"event": "session_end", "session_id": "dmg", "ts": 5.0, "status": "ok"}))


def _turn0(eps: list[dict[str, Any]], **change: Any) -> None:
    eps[0]["turns"][0].update(change)


def _mid_line(store: Path, text: bytes) -> None:
    seg = store / SEGMENT
    lines = seg.read_bytes().splitlines(keepends=True)
    seg.write_bytes(b"".join(lines[:2] + [text] + lines[2:]))


CASES = [
    # --- store: lines and files the reader cannot use ------------------------------------------------
    Case(
        "store_corrupt_line",
        lambda tmp, tok: store_case(tmp, lambda s: _mid_line(s, b"{garbage\n")),
        report={"store problems (lines skipped)": "1", "corrupt_line": "1"},
    ),
    Case(
        "store_corrupt_line_strict",
        lambda tmp, tok: store_case(tmp, lambda s: _mid_line(s, b"{garbage\n")),
        error="store problem corrupt_line",
        args=("--strict",),
    ),
    Case(
        "store_damaged_thread",
        lambda tmp, tok: store_case(tmp, _damaged_thread),
        report={
            "corrupt_line": "1",
            "base_after_damaged_line": "1",
            "damaged_thread": "1",
            "episodes loaded": "6",
        },
    ),
    Case("store_empty", lambda tmp, tok: (tmp / "s").mkdir() or tmp / "s", error="no episodes"),
    Case(
        "store_torn_last_line",
        lambda tmp, tok: store_case(tmp, lambda s: open(s / SEGMENT, "ab").write(b'{"event":"ca')),
        report={"torn_line": "1"},
    ),
    Case(
        "store_segment_is_a_directory",
        lambda tmp, tok: store_case(tmp, lambda s: (s / "x.00001.jsonl").mkdir()),
        report={"not_a_segment_file": "1"},
    ),
    Case(
        "store_dangling_symlink",
        lambda tmp, tok: store_case(tmp, lambda s: (s / "x.00001.jsonl").symlink_to(s / "gone")),
        report={"not_a_segment_file": "1"},
    ),
    Case(
        "store_looping_symlink",
        lambda tmp, tok: store_case(tmp, lambda s: (s / "x.00001.jsonl").symlink_to(s / "x.00001.jsonl")),
        report={"not_a_segment_file": "1"},
    ),
    Case(
        "store_fifo_segment",
        lambda tmp, tok: store_case(tmp, _fifo),
        report={"not_a_segment_file": "1"},
    ),
    Case(
        "store_lone_surrogate",
        lambda tmp, tok: store_case(tmp, _surrogate),
        report={"episodes loaded": "5", "episodes with invalid unicode (lone surrogates replaced)": "1"},
    ),
    Case(
        "store_huge_message",
        lambda tmp, tok: store_case(
            tmp,
            lambda s: open(s / SEGMENT, "ab").write(
                session_lines("big", "t0", 1.0, content="x" * 50_000_000)
            ),
        ),
        report={"episodes skipped: longer than max length": "1"},
        args=("--max-length", "256"),
    ),
    Case(
        "store_negative_token_id",
        lambda tmp, tok: store_case(tmp, _negative_token_id),
        report={"episodes loaded": "5", "invalid_token_ids": "1"},
    ),
    # --- Parquet -------------------------------------------------------------------------------------
    # Rejected like ids past the vocabulary, never counted as exact, never passed to the trainer.
    Case(
        "parquet_negative_token_id",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: _turn0(eps, token_ids=[-1, *eps[0]["turns"][0]["token_ids"]])
        ),
        report={
            "invalid_token_ids": "1",
            "episodes trained from the exact stored token ids (no chat template)": "3",
        },
    ),
    Case(
        "parquet_negative_prompt_token_id",
        lambda tmp, tok: parquet_with(tmp / "e.parquet", tok, lambda eps: _turn0(eps, prompt_token_ids=[-1])),
        report={"invalid_token_ids": "1"},
    ),
    # Its own reason, not "no stored token ids/logprobs" (issue 24, item 24).
    Case(
        "parquet_logprobs_length_mismatch",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: _turn0(eps, logprobs=eps[0]["turns"][0]["logprobs"][:-1])
        ),
        report={
            "of which: logprobs of another length than their ids": "1",
            "token-faithful episodes (behaviour logprobs used)": "3",
        },
    ),
    Case(
        "parquet_messages_as_string",
        lambda tmp, tok: raw_parquet(tmp / "e.parquet", tok, messages=json.dumps),
        error="messages",
    ),
    Case(
        "parquet_turns_as_string",
        lambda tmp, tok: raw_parquet(tmp / "e.parquet", tok, turns=json.dumps),
        error="turns",
    ),
    Case(
        "parquet_infinite_reward",
        lambda tmp, tok: parquet_with(tmp / "e.parquet", tok, lambda eps: eps[0].update(reward=math.inf)),
        report={"non_finite_reward": "1"},
    ),
    Case(
        "parquet_nan_reward",
        lambda tmp, tok: parquet_with(tmp / "e.parquet", tok, lambda eps: eps[0].update(reward=math.nan)),
        report={"episodes without a reward (dropped)": "1"},
    ),
    Case(
        "parquet_duplicate_episode_ids",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: eps[1].update(episode_id=eps[0]["episode_id"])
        ),
        report={"duplicate_id": "1"},
    ),
    Case(
        "parquet_invalid_tool_arguments",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet",
            tok,
            lambda eps: eps[0]["messages"][2]["tool_calls"][0]["function"].update(arguments="{not json"),
        ),
        report={"invalid_tool_arguments": "1"},
    ),
    Case(
        "parquet_huge_message",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: eps[0]["messages"][1].update(content="x" * 50_000_000)
        ),
        report={"episodes skipped: longer than max length": "1"},
        args=("--max-length", "256"),
    ),
    # Past the first assistant turn, with --truncation truncate (the default): the thread is cut before the
    # huge message, untokenized, and what comes before it still trains.
    Case(
        "parquet_huge_tool_result",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: eps[0]["messages"][3].update(content="x" * 50_000_000)
        ),
        report={"episodes cut before a message that starts past max length (not tokenized)": "1"},
        args=("--max-length", "256"),
    ),
    Case(
        "parquet_huge_assistant_message",
        lambda tmp, tok: parquet_with(
            tmp / "e.parquet", tok, lambda eps: eps[0]["messages"][4].update(content="x" * 50_000_000)
        ),
        report={"episodes cut before a message that starts past max length (not tokenized)": "1"},
        args=("--max-length", "256"),
    ),
    Case(
        "directory_of_parquet_files",
        lambda tmp, tok: (
            (tmp / "d").mkdir(),
            write_parquet(make_episodes(2, 2, tokenizer=tok), tmp / "d" / "a.parquet"),
            tmp / "d",
        )[-1],
        report={"episodes loaded": "4"},
    ),
    Case(
        "not_parquet",
        lambda tmp, tok: (tmp / "e.parquet").write_text("hi") and tmp / "e.parquet",
        error="Parquet",
    ),
    Case(
        "parquet_missing_reward_column",
        lambda tmp, tok: _drop_column(parquet_with(tmp / "e.parquet", tok, lambda eps: None), "reward"),
        error="reward",
    ),
    Case("missing_path", lambda tmp, tok: tmp / "nothing", error="not found"),
]


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail a case that hangs (a FIFO opened for reading blocks until a writer comes) instead of the run."""

    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError("sdk.train hung on this input")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


def _report(stdout: str) -> dict[str, str]:
    """The data report's rows (rich table cells: '│ key │ value │')."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_train_bad_input(
    case: Case, tmp_path: Path, tokenizer_dir: Path, tiny_tokenizer: Any, alarm: None, capsys: Any
) -> None:
    data = case.build(tmp_path, tiny_tokenizer)
    try:
        rc = main(["--data", str(data), "--model", str(tokenizer_dir), "--dry-run", *case.args])
    except SystemExit as exc:  # pragma: no cover - a failure path
        rc = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    if case.error is not None:
        lines = out.err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.err
        assert case.error in lines[0], lines[0]
        return
    assert rc == 0, out.err
    report = _report(out.out)
    for key, value in case.report.items():
        assert report.get(key) == value, (key, report, out.err)
