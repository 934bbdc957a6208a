"""Compact token storage: prompt ids relative to the base call, plain-number logprobs; same episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sdk
from sdk.capture import CallRecord, record_call
from sdk.store import StoreReader
from sdk.store import _events as events


def _call(prompt: list[int], completion: list[int], messages: list[dict[str, Any]], text: str) -> CallRecord:
    return CallRecord(
        framework="openai",
        model="m",
        messages=messages,
        response_message={"role": "assistant", "content": text},
        finish_reason="stop",
        logprobs=[{"token": f"t{i}", "logprob": -0.25 * (k + 1)} for k, i in enumerate(completion)],
        prompt_token_ids=prompt,
        completion_token_ids=completion,
    )


def _write(store: Path) -> None:
    sdk.configure(store=store, implicit_sessions="process", fsync="never")
    try:
        with sdk.session(task_id="t"):
            msgs = [{"role": "user", "content": "q"}]
            record_call(_call([1, 2, 3], [4, 5], msgs, "a1"))
            msgs = [*msgs, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "r"}]
            record_call(_call([1, 2, 3, 4, 5, 6, 7], [8, 9, 10], msgs, "a2"))  # extends the previous ids
            msgs = [*msgs, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "again"}]
            record_call(_call([1, 2, 3, 4, 11, 6, 7, 8, 9], [12], msgs, "a3"))  # drift: a re-tokenised turn
            record_call(_call([20, 21], [22], [{"role": "user", "content": "other"}], "b"))  # no base
            sdk.reward(1.0)
    finally:
        sdk.shutdown()


def _episodes(store: Path) -> list[dict[str, Any]]:
    from sdk.episodes import build_episodes

    out = []
    for ep in build_episodes(store, require_reward=False):
        ep = dict(ep)
        for key in ("episode_id", "session_id", "metadata", "started_at", "ended_at"):
            ep.pop(key, None)
        out.append(ep)
    return out


def test_compact_store_rebuilds_prompt_ids_and_exports_the_same_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("polars")
    _write(tmp_path / "new")
    lines = b"".join(p.read_bytes() for p in (tmp_path / "new").glob("*.jsonl"))
    assert lines.count(b'"prompt_token_suffix"') == 2 and b'"top_logprobs"' not in lines
    assert b'"logprobs":[-0.25,-0.5,-0.75]' in lines  # plain numbers, not per-token objects
    reader = StoreReader(tmp_path / "new")
    (s,) = [s for s in reader.sessions() if not s.implicit]
    assert [c["prompt_token_ids"] for c in s.calls] == [
        [1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 11, 6, 7, 8, 9], [20, 21]
    ]  # fmt: skip
    assert not reader.problems

    # The old encoding: full prompt ids and per-token logprob objects on every call.
    monkeypatch.setattr(events, "prompt_id_suffix", lambda *a: None)
    monkeypatch.setattr(events, "compact_logprobs", lambda entries, ids: entries)
    _write(tmp_path / "old")
    assert b'"prompt_token_suffix"' not in b"".join(
        p.read_bytes() for p in (tmp_path / "old").glob("*.jsonl")
    )
    assert _episodes(tmp_path / "new") == _episodes(tmp_path / "old")


def test_top_logprobs_and_missing_ids_keep_per_token_entries() -> None:
    entries = [{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}]}]
    assert events.compact_logprobs(entries, [5]) is entries
    assert events.compact_logprobs([{"token": "a", "logprob": -0.1}], None) == [
        {"token": "a", "logprob": -0.1}
    ]
    assert events.compact_logprobs([{"token": "a", "logprob": "x"}], [5]) == [{"token": "a", "logprob": "x"}]


def test_prompt_id_suffix_round_trips() -> None:
    cases = [([1, 2, 3, 4], [1, 2], [3]), ([1, 9], [1, 2], [3]), ([7], [1], [2]), ([1, 2], [1, 2, 3], None)]
    for prompt, base, completion in cases:
        suffix = events.prompt_id_suffix(prompt, base, completion)
        if suffix is None:
            assert prompt[:1] != base[:1]
            continue
        assert events.expand_prompt_ids(suffix, base, completion) == prompt
    assert events.expand_prompt_ids({"n": 9, "ids": []}, [1], [2]) is None  # reaches past the base


def test_a_missing_token_base_is_counted(tmp_path: Path) -> None:
    _write(tmp_path / "s")
    seg = next(p for p in sorted((tmp_path / "s").glob("*.jsonl")) if b'"event":"call"' in p.read_bytes())
    lines = seg.read_bytes().splitlines(keepends=True)
    first_call = next(i for i, line in enumerate(lines) if b'"event":"call"' in line)
    seg.write_bytes(b"".join(lines[:first_call] + lines[first_call + 1 :]))
    reader = StoreReader(tmp_path / "s")
    list(reader.sessions())
    # The second call lost its base; the third builds on the second, whose rebuilt request is now shorter
    # than the prefix the third claims (so its base is missing too), and on its unknown prompt ids.
    assert reader.problems["missing_base"] == 2 and reader.problems["missing_token_base"] == 2
