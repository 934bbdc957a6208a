"""The bad-input corpus: every malformed case ends as a documented error or a counted skip, never a crash.

Each case writes raw segment lines, exports, and checks the exact counts: store problems (the reader's
reasons), rejected episodes by reason, warnings, and episodes written. Invariant for every case:
episodes built == written + rejected, and the CLI never prints a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdk import export as export_cli
from sdk.episodes import export, read_episodes
from tests.support.sessions import RawStore, assistant, system, tool, tool_call, user

OK = [system("s"), user("q")]


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[RawStore], Any]
    store: dict[str, int] = dataclasses.field(default_factory=dict)
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    written: int = 1
    warnings: dict[str, int] = dataclasses.field(default_factory=dict)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def good(r: RawStore, sid: str = "good") -> RawStore:
    return r.session(sid, OK, assistant("fine"))


def second_segment(r: RawStore, text: bytes) -> None:
    """A later segment of the same process (rotation)."""
    r.file.with_name(r.file.name.replace(".00001.", ".00002.")).write_bytes(text)


def call_event(sid: str, **kw: Any) -> dict[str, Any]:
    return {"event": "call", "v": 1, "session_id": sid, "call_id": "c", "framework": "openai", **kw}


CASES = [
    # --- lines the reader cannot use -------------------------------------------------------------
    Case(
        "torn_last_line",
        lambda r: good(r).raw(b'{"event":"call","v":1,"session_id":"good","requ'),
        store={"torn_line": 1},
    ),
    Case(
        "corrupt_json_mid_file",
        lambda r: good(r.line('{"event": "call", "session_id": oops}')),
        store={"corrupt_line": 1},
    ),
    Case(
        "torn_line_in_an_earlier_segment",
        lambda r: (r.raw(b'{"event":"sess'), second_segment(r, b"")),
        store={"corrupt_line": 1},
        written=0,
    ),
    Case(
        "non_utf8_bytes",
        lambda r: good(r.raw(b'\xff\xfe{"event":"session_start"}\n')),
        store={"non_utf8_line": 1},
    ),
    Case(
        "unknown_event_type",
        lambda r: good(r.line({"event": "span_start", "v": 1, "session_id": "x"})),
        store={"unknown_event": 1},
    ),
    Case("json_array_line", lambda r: good(r.line("[1, 2, 3]")), store={"not_an_event": 1}),
    Case("json_string_line", lambda r: good(r.line('"hello"')), store={"not_an_event": 1}),
    Case(
        "array_that_looks_like_a_reward",
        lambda r: good(r.line('[{"event":"reward","session_id":"good","value":1}]')),
        store={"not_an_event": 1},
    ),
    Case(
        "future_event_version",
        lambda r: good(r.line({"event": "call", "v": 99, "session_id": "good"})),
        store={"unsupported_event_version": 1},
    ),
    Case(
        "missing_session_id",
        lambda r: good(r.line({"event": "call", "v": 1})),
        store={"missing_session_id": 1},
    ),
    Case("blank_and_whitespace_lines", lambda r: good(r.raw(b"\n   \n\t\n"))),
    Case(
        "empty_segment_and_foreign_files",
        lambda r: (good(r), second_segment(r, b""), (r.path / "notes.txt").write_text("hi")),
    ),
    Case(
        "segment_is_a_directory",
        lambda r: (good(r), (r.path / "x.00001.jsonl").mkdir()),
        store={"not_a_segment_file": 1},
    ),
    Case(
        "fifo_named_like_a_segment",  # opening it would block forever
        lambda r: (good(r), os.mkfifo(r.path / "x.00001.jsonl")),
        store={"not_a_segment_file": 1},
    ),
    Case(
        "dangling_symlink_segment",
        lambda r: (good(r), (r.path / "x.00001.jsonl").symlink_to(r.path / "gone.jsonl")),
        store={"not_a_segment_file": 1},
    ),
    Case(
        "looping_symlink_segment",
        lambda r: (good(r), (r.path / "x.00001.jsonl").symlink_to(r.path / "x.00001.jsonl")),
        store={"not_a_segment_file": 1},
    ),
    # --- a damaged line inside a thread -----------------------------------------------------------
    Case(
        "damaged_line_before_an_implied_base",
        lambda r: (
            r.start("s1")
            .call("s1", [user("u0")], assistant("a0"))
            .raw(b"{garbage\n")  # perhaps the session's 2nd call: the 3rd builds on "the previous call"
            .call("s1", [], assistant("a2"), request={"messages": [user("u2")], "base": {"n": 2}})
            .reward("s1")
            .end("s1")
        ),
        store={"corrupt_line": 1, "base_after_damaged_line": 1},
        rejected={"damaged_thread": 1},
        written=1,  # the first call's thread, as the model saw it
    ),
    Case(
        "base_shorter_than_its_prefix",
        lambda r: (
            r.start("s1")
            .call("s1", [user("u0")], assistant("a0"))
            .call("s1", [], assistant("a2"), request={"messages": [user("u2")], "base": {"n": 4}})
            .reward("s1")
            .end("s1")
        ),
        store={"missing_base": 1},
        rejected={"incomplete_request": 1},
        written=1,
    ),
    # --- events out of order or missing ------------------------------------------------------------
    Case(
        "call_before_session_start",
        lambda r: r.call("s1", OK, assistant("a")).start("s1").reward("s1").end("s1"),
        store={"call_before_session_start": 1, "duplicate_session_start": 1},
    ),
    Case(
        "session_end_without_start",
        lambda r: good(r).end("orphan"),
        store={"session_end_before_session_start": 1},
        skipped={"sessions_without_calls": 1},
    ),
    Case(
        "missing_session_end",
        lambda r: r.start("s1").call("s1", OK, assistant("a")).reward("s1"),
        store={"missing_session_end": 1},
    ),
    Case(
        "call_after_session_end",
        lambda r: good(r).call("good", OK, assistant("late")),
        store={"event_after_session_end": 1},
    ),
    Case(
        "duplicate_session_start",
        lambda r: r.start("s1").start("s1").call("s1", OK, assistant("a")).reward("s1").end("s1"),
        store={"duplicate_session_start": 1},
    ),
    Case(
        "same_session_in_two_processes",
        lambda r: (good(r, "s1"), good(RawStore(r.path, "20260101T000000-host-2-bbbbbb"), "s1")),
        store={"event_after_session_end": 4},  # start, call, reward and end of the copy
    ),
    Case(
        "missing_base_call",
        lambda r: (
            r.start("s1")
            .call(
                "s1",
                [tool("c1")],
                assistant("a"),
                request={"messages": [tool("c1")], "base": {"call_id": "gone", "n": 3}},
            )
            .reward("s1")
            .end("s1")
        ),
        store={"missing_base": 1},
        rejected={"incomplete_request": 1},
        written=0,
    ),
    # --- rewards ----------------------------------------------------------------------------------
    Case(
        "nan_reward",
        lambda r: (
            r.start("s1")
            .call("s1", OK, assistant("a"))
            .line('{"event":"reward","v":1,"session_id":"s1","value":NaN}')
            .end("s1")
        ),
        store={"invalid_reward": 1},
        rejected={"missing_reward": 1},
        written=0,
    ),
    Case(
        "string_reward",
        lambda r: r.start("s1").call("s1", OK, assistant("a")).reward("s1", "1.0").end("s1"),
        store={"invalid_reward": 1},
        rejected={"missing_reward": 1},
        written=0,
    ),
    Case(
        "reward_for_unknown_session",
        lambda r: good(r).reward("ghost", 1.0),
        store={"reward_for_unknown_session": 1},
    ),
    Case(
        "reward_written_with_spaces_is_used",
        lambda r: (
            r.start("s1")
            .call("s1", OK, assistant("a"))
            .line('{"event": "reward", "v": 1, "session_id": "s1", "value": 0.5}')
            .end("s1")
        ),
    ),
    Case(
        "non_finite_reward_from_a_reward_function",
        good,
        rejected={"non_finite_reward": 1},
        written=0,
        kwargs={"reward_fns": lambda ep: float("inf")},
    ),
    Case(
        "missing_reward",
        lambda r: r.session("s1", OK, assistant("a"), reward=None),
        rejected={"missing_reward": 1},
        written=0,
    ),
    Case(
        "reward_before_session_start_is_used",
        lambda r: r.reward("s1", 0.5).start("s1").call("s1", OK, assistant("a")).end("s1"),
    ),
    Case(
        "reward_after_session_end_is_used",
        lambda r: r.start("s1").call("s1", OK, assistant("a")).end("s1").reward("s1", 0.5),
    ),
    Case(
        "reward_between_two_ends_of_a_session",
        lambda r: good(r, "s1").reward("s1", 0.5).end("s1"),
        store={"event_after_session_end": 2},
    ),
    Case(
        "reward_event_name_written_with_escapes",
        lambda r: (
            r.start("s1")
            .call("s1", OK, assistant("a"))
            .line('{"event":"rew\\u0061rd","v":1,"session_id":"s1","value":0.5}')
            .end("s1")
        ),
        store={"unsupported_reward_line": 1},
        rejected={"missing_reward": 1},
        written=0,
    ),
    # --- malformed calls --------------------------------------------------------------------------
    Case(
        "call_request_is_a_list",
        lambda r: good(r.start("s1").line(call_event("s1", request=[1, 2]))),
        store={"malformed_call": 1, "missing_session_end": 1},
        skipped={"sessions_without_calls": 1},
    ),
    Case(
        "call_response_is_a_string",
        lambda r: good(r.start("s1").line(call_event("s1", response="oops"))),
        store={"malformed_call": 1, "missing_session_end": 1},
        skipped={"sessions_without_calls": 1},
    ),
    Case(
        "call_messages_is_an_object",
        lambda r: good(r.start("s1").line(call_event("s1", request={"messages": {"role": "user"}}))),
        store={"malformed_call": 1, "missing_session_end": 1},
        skipped={"sessions_without_calls": 1},
    ),
    Case(
        "call_without_request",
        lambda r: (
            r.start("s1").line(call_event("s1", response={"message": assistant("a")})).reward("s1").end("s1")
        ),
        rejected={"role_order": 1},
        written=0,
    ),
    Case(
        "message_is_not_an_object",
        lambda r: r.session("s1", [user("q"), "oops"], assistant("a")),
        rejected={"invalid_message": 1},
        written=0,
    ),
    Case(
        "huge_token_id",
        lambda r: r.session(
            "s1", OK, assistant("a"), completion_token_ids=[2**70], logprobs=[{"token": "a", "logprob": -1.0}]
        ),
        # Parquet's int64 cannot hold it: the token ids are dropped (the episode is kept), and counted.
        warnings={"invalid_token_data_dropped": 1},
    ),
    Case(
        "null_token_id",
        lambda r: r.session(
            "s1",
            OK,
            assistant("a"),
            completion_token_ids=[5, None],
            logprobs=[{"token": "a", "logprob": -1.0}],
        ),
        warnings={"invalid_token_data_dropped": 1},
    ),
    Case(
        "string_logprob",
        lambda r: r.session(
            "s1", OK, assistant("a"), completion_token_ids=[5], logprobs=[{"token": "a", "logprob": "-1"}]
        ),
        warnings={"invalid_token_data_dropped": 1},
    ),
    Case(
        "float_prompt_token_ids",
        lambda r: r.session("s1", OK, assistant("a"), prompt_token_ids=[1, 2.5]),
        warnings={"invalid_token_data_dropped": 1},
    ),
    Case(
        "metadata_and_task_id_of_odd_types",
        lambda r: (
            r.start("s1", task_id=17, metadata=["x"], sample="three", parent_session_ids=5)
            .call("s1", OK, assistant("a"), model=42, agent=["x"])
            .reward("s1")
            .end("s1", status=3)
        ),
    ),
    Case("content_is_an_object", lambda r: r.session("s1", [user({"text": "q"})], assistant("a"))),
    # --- every validation case ---------------------------------------------------------------------
    Case(
        "role_order_tool_first",
        lambda r: r.session("s1", [tool("c1"), user("q")], assistant("a")),
        rejected={"tool_result_without_call": 1},
        written=0,
    ),
    Case(
        "role_order_late_system",
        lambda r: r.session("s1", [user("q"), assistant("a"), system("late")], assistant("b")),
        rejected={"role_order": 1},
        written=0,
    ),
    Case(
        "role_order_unknown_role",
        lambda r: r.session("s1", [{"role": "bot", "content": "x"}], assistant("a")),
        rejected={"role_order": 1},
        written=0,
    ),
    Case(
        "tool_result_without_call",
        lambda r: r.session(
            "s1", [user("q"), assistant(None, [tool_call("c1")]), tool("c2")], assistant("a")
        ),
        rejected={"tool_result_without_call": 1},
        written=0,
    ),
    Case(
        "tool_call_never_answered",
        lambda r: r.session("s1", [user("q"), assistant(None, [tool_call("c1")]), user("?")], assistant("a")),
        rejected={"tool_call_unanswered": 1},
        written=0,
    ),
    Case(
        "trailing_tool_call_is_a_warning",
        lambda r: r.session("s1", OK, assistant(None, [tool_call("c1")])),
        warnings={"trailing_tool_call": 1},
    ),
    Case(
        "invalid_json_arguments",
        lambda r: r.session("s1", OK, assistant(None, [tool_call("c1", arguments='{"city": ')])),
        rejected={"invalid_tool_arguments": 1},
        written=0,
    ),
    Case(
        "tool_call_without_id",
        lambda r: r.session("s1", OK, assistant(None, [{"type": "function", "function": {"name": "f"}}])),
        rejected={"invalid_tool_call": 1},
        written=0,
    ),
    Case(
        "tool_calls_not_a_list",
        lambda r: r.session("s1", OK, assistant(None, tool_call("c1", arguments="[1]"))),
        rejected={"invalid_tool_arguments": 1},
        written=0,
    ),
    Case(
        "duplicate_tool_call_ids",
        lambda r: r.session("s1", OK, assistant(None, [tool_call("c1"), tool_call("c1")])),
        rejected={"duplicate_id": 1},
        written=0,
    ),
    Case(
        "empty_episode_every_call_failed",
        lambda r: r.session(
            "s1", OK, None, error={"type": "RateLimitError", "message": "429", "status": 429}
        ),
        rejected={"empty_episode": 1},
        written=0,
    ),
    # --- size and encoding ---------------------------------------------------------------------------
    Case("very_large_message", lambda r: r.session("s1", [user("x" * (16 * 1024 * 1024))], assistant("a"))),
    Case(
        "lone_surrogate",
        lambda r: r.session("s1", [user("half \ud83d emoji")], assistant("a")),
        warnings={"invalid_unicode_replaced": 1},
    ),
]


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, raw_store: RawStore, tmp_path: Path) -> None:
    case.build(raw_store)
    out = tmp_path / "e.parquet"
    summary = export(raw_store.path, out, **case.kwargs)
    assert dict(summary.store_problems) == case.store
    assert dict(summary.rejected) == case.rejected
    assert dict(summary.warnings) == case.warnings
    assert dict(summary.skipped) == case.skipped
    assert summary.written == case.written
    # Nothing disappears uncounted.
    assert summary.episodes == summary.written + summary.rejected_total
    assert len(read_episodes(out)) == case.written
    rejects = tmp_path / "e.rejects.jsonl"
    lines = rejects.read_text().splitlines() if rejects.exists() else []
    assert len(lines) == summary.rejected_total


def test_unknown_fields_are_preserved_not_fatal(raw_store: RawStore, tmp_path: Path) -> None:
    raw_store.start("s1", future_field={"x": 1}).call("s1", OK, assistant("a"), something_new=[1]).reward(
        "s1"
    )
    raw_store.end("s1")
    assert export(raw_store.path, tmp_path / "e.parquet").written == 1


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        (
            "corrupt_json_mid_file",
            "store problem corrupt_line at 20260101T000000-host-1-abcdef.00001.jsonl:1",
        ),
        ("torn_last_line", "store problem torn_line at"),
        ("tool_call_never_answered", "tool_call_unanswered"),
        ("unknown_event_type", "store problem unknown_event"),
    ],
)
def test_strict_cli_fails_with_one_line(
    case: str, fragment: str, raw_store: RawStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    next(c for c in CASES if c.name == case).build(raw_store)
    rc = export_cli.main(
        ["--store", str(raw_store.path), "--out", str(tmp_path / "e.parquet"), "--strict", "-q"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: ") and fragment in err


def test_default_cli_counts_bad_input_and_succeeds(
    raw_store: RawStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("corrupt_json_mid_file", "non_utf8_bytes", "unknown_event_type", "torn_last_line"):
        next(c for c in CASES if c.name == name).build(raw_store)
    rc = export_cli.main(
        ["--store", str(raw_store.path), "--out", str(tmp_path / "e.parquet"), "--summary-json", "-", "-q"]
    )
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0
    # The good session written by each case reuses one id: later copies are counted, not merged.
    assert summary["store_problems"] == {
        "corrupt_line": 1,
        "non_utf8_line": 1,
        "unknown_event": 1,
        "torn_line": 1,
        "event_after_session_end": 12,
    }
    assert summary["written"] == 1


def test_a_damaged_call_line_mid_thread_is_rejected_never_rebuilt_wrong(
    tmp_path: Path, openai_server: Any
) -> None:
    """A 3-turn chat captured through the SDK, its 2nd call's line then replaced by garbage."""
    openai = pytest.importorskip("openai")
    import sdk
    from integrations.openai import wrap_openai

    store = tmp_path / "store"
    sdk.configure(store=store)
    try:
        client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
        with sdk.session(task_id="t") as s:
            messages: list[dict[str, Any]] = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"user{turn}"})
                r = client.chat.completions.create(model="m", messages=messages)
                messages.append({"role": "assistant", "content": r.choices[0].message.content})
            s.reward(1.0)
    finally:
        sdk.shutdown()
    [segment] = [f for f in store.glob("*.jsonl") if b'"event":"call"' in f.read_bytes()]
    lines = segment.read_bytes().splitlines(keepends=True)
    calls = [i for i, line in enumerate(lines) if b'"event":"call"' in line]
    assert len(calls) == 3
    lines[calls[1]] = b"{garbage\n"
    segment.write_bytes(b"".join(lines))

    summary = export(store, tmp_path / "e.parquet")
    assert dict(summary.store_problems) == {"corrupt_line": 1, "base_after_damaged_line": 1}
    assert dict(summary.rejected) == {"damaged_thread": 1}
    users = [
        [m["content"] for m in ep["messages"] if m["role"] == "user"]
        for ep in read_episodes(tmp_path / "e.parquet")
    ]
    assert users == [["user0"]]  # the first call's thread, exactly; never [user0, user2]
