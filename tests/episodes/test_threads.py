"""Sessions → threads → episodes: how calls are grouped and what each episode carries."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

import sdk
from sdk.capture import record_call
from sdk.episodes import EpisodeError, ExportSummary, build_episodes
from sdk.store import StoreReader
from tests.support.sessions import (
    TOOLS,
    RawStore,
    assistant,
    call,
    close_store,
    system,
    tool,
    tool_call,
    user,
    weather_session,
)


def episodes(path: Path, **kw: object) -> list[dict]:
    close_store()
    return list(build_episodes(path, **kw))


def meta(ep: dict) -> dict:
    return json.loads(ep["metadata"])


def test_tool_using_session_is_one_episode_with_everything(store: Path) -> None:
    sid = weather_session(task_id="t1", split="train")
    [ep] = episodes(store)
    assert ep["episode_id"] == f"{sid}:0" and ep["session_id"] == sid and ep["thread"] == 0
    assert ep["schema_version"] == 1 and ep["task_id"] == "t1" and ep["status"] == "ok"
    assert [m["role"] for m in ep["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert ep["messages"][2]["tool_calls"] == [tool_call("c1", arguments='{"city": "Paris"}')]
    assert ep["messages"][3]["tool_call_id"] == "c1"
    assert all(
        set(m) == {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
        for m in ep["messages"]
    )
    assert json.loads(ep["tools"]) == TOOLS
    assert ep["reward"] == 1.0 and ep["rewards"] == [{"name": "reward", "value": 1.0}]
    assert [t["message_index"] for t in ep["turns"]] == [2, 4]
    assert ep["turns"][0]["logprobs"] == pytest.approx([-0.1, -0.2, -0.3])
    assert ep["turns"][0]["token_ids"] == [100, 101, 102]
    assert ep["turns"][0]["prompt_token_ids"] == list(range(8))
    assert ep["token_faithful"] is True
    assert ep["num_calls"] == 2
    assert ep["usage"] == {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26}
    assert ep["started_at"] <= ep["ended_at"]
    m = meta(ep)
    assert m["split"] == "train"
    assert m["tracerl"]["threads_in_session"] == 1 and len(m["tracerl"]["call_ids"]) == 2
    assert m["tracerl"]["source"] == str(store)


def test_interleaved_agents_become_separate_threads(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        a1 = [system("You are the planner."), user("plan")]
        b1 = [system("You are the coder."), user("code")]
        record_call(call(a1, assistant("plan v1"), agent="planner"))
        record_call(call(b1, assistant("code v1"), agent="coder"))
        record_call(call([*a1, assistant("plan v1"), user("more")], assistant("plan v2"), agent="planner"))
        record_call(call([*b1, assistant("code v1"), user("fix")], assistant("code v2"), agent="coder"))
        s.reward(1.0)
    eps = episodes(store)
    assert [(e["thread"], e["agent"], e["num_calls"]) for e in eps] == [(0, "planner", 2), (1, "coder", 2)]
    assert [m["content"] for m in eps[0]["messages"]][-1] == "plan v2"
    assert all(e["reward"] == 1.0 for e in eps)  # a session reward applies to each of its threads
    assert meta(eps[0])["tracerl"]["threads_in_session"] == 2


def test_truncated_or_summarised_context_starts_a_new_thread(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        h = [system("s"), user("q1")]
        record_call(call(h, assistant("a1")))
        h2 = [*h, assistant("a1"), user("q2")]
        record_call(call(h2, assistant("a2")))
        # The agent dropped old turns (context window): the request no longer extends the thread.
        record_call(call([system("s"), user("q2"), assistant("a2"), user("q3")], assistant("a3")))
        # Summarisation: a new system prompt carrying a summary.
        record_call(call([system("summary: q1..q3"), user("q4")], assistant("a4")))
        s.reward(0.5)
    eps = episodes(store)
    assert [e["num_calls"] for e in eps] == [2, 1, 1]
    assert [e["messages"][-1]["content"] for e in eps] == ["a2", "a3", "a4"]


def test_a_retry_after_a_failed_call_continues_the_thread(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        req = [system("s"), user("q")]
        record_call(call(req, None, error={"type": "RateLimitError", "message": "slow down", "status": 429}))
        record_call(call(req, assistant("answer")))
        s.reward(1.0)
    [ep] = episodes(store)
    assert ep["num_calls"] == 2 and len(ep["turns"]) == 1
    assert meta(ep)["tracerl"]["failed_calls"] == 1
    assert meta(ep)["tracerl"]["errors"] == ["RateLimitError"]


def test_a_thread_whose_calls_all_failed_is_rejected_as_empty(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        record_call(call([user("q")], None, error={"type": "APIError", "message": "boom", "status": 500}))
        s.reward(0.0)
    summary = ExportSummary()
    assert episodes(store, summary=summary) == []
    assert summary.rejected == {"empty_episode": 1}
    [ep] = episodes(store, on_invalid="keep")
    from sdk.episodes import validate_episode

    [problem] = validate_episode(ep)
    assert problem.code == "empty_episode" and "1 call(s) failed: APIError" in problem.message


def test_resampling_the_same_prompt_starts_a_new_thread(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        req = [system("s"), user("q")]
        record_call(call(req, assistant("first try")))
        record_call(call(req, assistant("second try")))
        s.reward(1.0)
    eps = episodes(store)
    assert [e["messages"][-1]["content"] for e in eps] == ["first try", "second try"]


def test_history_reserialised_by_a_framework_still_continues_the_thread(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        req = [system("s"), user("q")]
        generated = assistant(
            None, [tool_call("c1", arguments='{"city":"Paris"}')], reasoning_content="think"
        )
        record_call(call(req, generated))
        # What frameworks send back: reasoning dropped, content "" for None, arguments re-dumped,
        # extra keys, the tool message with a name.
        resent = {
            "role": "assistant",
            "content": "",
            "refusal": None,
            "tool_calls": [tool_call("c1", arguments='{"city": "Paris"}')],
        }
        record_call(call([*req, resent, {**tool("c1"), "name": "get_weather"}], assistant("done")))
        s.reward(1.0)
    [ep] = episodes(store)
    assert ep["num_calls"] == 2
    # The message as the model generated it (its token ids belong to it), not the re-sent copy.
    assert ep["messages"][2]["reasoning_content"] == "think"
    assert ep["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'
    assert ep["messages"][3]["name"] == "get_weather"


def test_split_by_agent_separates_a_handoff(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        req = [system("s"), user("q")]
        record_call(call(req, assistant("triage: handing off"), agent="triage"))
        record_call(
            call([*req, assistant("triage: handing off"), user("go")], assistant("solved"), agent="solver")
        )
        s.reward(1.0)
    close_store()
    [ep] = list(build_episodes(store))
    assert ep["agent"] == "solver" and meta(ep)["tracerl"]["agents"] == ["triage", "solver"]
    eps = list(build_episodes(store, split_by=["agent"]))
    assert [e["agent"] for e in eps] == ["triage", "solver"]
    with pytest.raises(ValueError, match="split_by"):
        build_episodes(store, split_by=["colour"])


def test_filter_by_model_and_agent_counts_what_it_drops(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        record_call(call([user("q")], assistant("policy answer"), model="policy-7b", agent="solver"))
        record_call(call([user("judge this")], assistant("8/10"), model="judge-gpt", agent="judge"))
        s.reward(1.0)
    close_store()
    summary = ExportSummary()
    eps = list(build_episodes(store, models=["policy-*"], summary=summary))
    assert [e["model"] for e in eps] == ["policy-7b"]
    assert summary.skipped["calls_filtered"] == 1
    assert [e["agent"] for e in build_episodes(store, agents=["jud*"])] == ["judge"]


def test_split_filter_on_session_metadata(store: Path) -> None:
    weather_session(task_id="a", split="train")
    weather_session(task_id="b", split="test")
    summary = ExportSummary()
    eps = episodes(store, splits=["train"], summary=summary)
    assert [e["task_id"] for e in eps] == ["a"]
    assert summary.skipped == {"sessions_filtered": 1, "calls_filtered": 2}


def test_token_faithful_needs_ids_and_logprobs_of_equal_length_on_every_turn(store: Path) -> None:
    def session(second: dict) -> None:
        with sdk.session(task_id="t1") as s:
            h = [user("q")]
            record_call(call(h, assistant("a1")))
            record_call(call([*h, assistant("a1"), user("q2")], assistant("a2"), **second))
            s.reward(1.0)

    session({})
    session({"token_ids": False})  # an OpenAI-style server: no token data
    session({"completion_token_ids": [1, 2]})  # 3 logprobs, 2 ids
    session({"logprobs": [{"token": "x", "logprob": None}] * 3})
    eps = episodes(store)
    assert [e["token_faithful"] for e in eps] == [True, False, False, False]
    assert eps[1]["turns"][1] == {
        "message_index": 3,
        "logprobs": None,
        "token_ids": None,
        "prompt_token_ids": None,
        "policy_version": None,
    }


def test_token_ids_are_recovered_from_vllm_token_id_logprobs(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        lps = [{"token": f"token_id:{i}", "logprob": -1.0} for i in (7, 8, 9)]
        record_call(call([user("q")], assistant("a"), logprobs=lps, completion_token_ids=None))
        s.reward(1.0)
    [ep] = episodes(store)
    assert ep["turns"][0]["token_ids"] == [7, 8, 9] and ep["token_faithful"]
    assert meta(ep)["tracerl"]["normalization"] == {"token_ids_from_logprobs": 1}


def test_assistant_messages_in_the_prompt_are_context_not_turns(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        few_shot = [system("s"), user("1+1?"), assistant("2"), user("2+2?")]
        record_call(call(few_shot, assistant("4")))
        s.reward(1.0)
    [ep] = episodes(store)
    assert [t["message_index"] for t in ep["turns"]] == [2, 4]
    assert ep["turns"][0]["token_ids"] is None and ep["turns"][1]["token_ids"] == [100, 101, 102]
    # The few-shot turn is context, not the thread's output: the episode is token-faithful, as the trainer
    # (exact ids) and `tracerl inspect` / the viewer (this column) agree.
    assert ep["token_faithful"] is True
    assert meta(ep)["tracerl"]["context_assistant_messages"] == [2]
    if importlib.util.find_spec("tokenizers") is not None:  # the torch-free CI legs have no tokenizer
        from trainers._tiny import build_tiny_tokenizer
        from trainers.data import convert_episode

        conv = convert_episode(ep, build_tiny_tokenizer())
        assert conv.path == "exact_ids" and conv.faithful  # the trainer: exact ids, behaviour logprobs used
    stale = {**ep, "token_faithful": False}  # a file exported with the old definition
    from sdk._sources import SourcedEpisode
    from sdk.view import episode_view

    assert episode_view(SourcedEpisode(stale, None))["faithful"] is True


def test_list_content_is_flattened_and_images_counted(store: Path) -> None:
    parts = [
        {"type": "text", "text": "look:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "what is it?"},
    ]
    with sdk.session(task_id="t1") as s:
        record_call(
            call(
                [{"role": "developer", "content": "be brief"}, {"role": "user", "content": parts}],
                assistant("a cat", reasoning="it has whiskers"),
            )
        )
        s.reward(1.0)
    [ep] = episodes(store)
    assert ep["messages"][0] == {
        "role": "system",
        "content": "be brief",
        "tool_calls": None,
        "tool_call_id": None,
        "name": None,
        "reasoning_content": None,
    }
    assert ep["messages"][1]["content"] == "look:\nwhat is it?"
    assert ep["messages"][2]["reasoning_content"] == "it has whiskers"  # vLLM's "reasoning" key
    assert meta(ep)["tracerl"]["normalization"] == {
        "developer_as_system": 1,
        "content_flattened": 1,
        "images_dropped": 1,
    }


def test_nested_sessions_and_sessions_without_calls(store: Path) -> None:
    with sdk.session(task_id="outer", run="r1") as outer, sdk.session(task_id="inner") as inner:
        record_call(call([user("q")], assistant("a")))
        inner.reward(1.0)
    summary = ExportSummary()
    [ep] = episodes(store, summary=summary)
    assert ep["session_id"] == inner.session_id and ep["task_id"] == "inner"
    assert meta(ep)["run"] == "r1"  # metadata merges from the outer session
    assert meta(ep)["tracerl"]["parent_session_ids"] == [outer.session_id]
    assert summary.skipped["sessions_without_calls"] == 1 and summary.sessions == 2


def test_calls_outside_a_session_are_an_implicit_episode(store: Path) -> None:
    record_call(call([user("q")], assistant("a")))
    summary = ExportSummary()
    assert episodes(store, summary=summary) == []
    assert summary.rejected == {"missing_reward": 1}
    [ep] = episodes(store, require_reward=False)
    assert ep["status"] == "implicit" and ep["task_id"] is None


def test_incomplete_session_keeps_its_status_and_is_counted(raw_store: RawStore) -> None:
    raw_store.start("s1").call("s1", [user("q")], assistant("a")).reward("s1", 1.0)
    summary = ExportSummary()
    [ep] = build_episodes(raw_store.path, summary=summary)
    assert ep["status"] == "incomplete"
    assert summary.store_problems == {"missing_session_end": 1}


def test_sources_reader_and_sessions_and_missing_store(store: Path, tmp_path: Path) -> None:
    weather_session()
    close_store()
    reader = StoreReader(store)
    assert len(list(build_episodes(reader))) == 1
    sessions = list(StoreReader(store).sessions())
    assert len(list(build_episodes(sessions))) == 1
    with pytest.raises(FileNotFoundError, match="no tracerl store"):
        build_episodes(tmp_path / "nowhere")  # raised at the call, not on first iteration
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(FileNotFoundError, match="read_episodes"):
        build_episodes(tmp_path / "x.parquet")


def test_on_invalid_skip_keep_raise(store: Path, caplog: pytest.LogCaptureFixture) -> None:
    weather_session(task_id="good")
    weather_session(task_id="bad", reward=None)
    close_store()
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        assert [e["task_id"] for e in build_episodes(store)] == ["good"]
    assert "skipped 1 invalid episode(s) (missing_reward 1)" in caplog.text
    caplog.clear()
    summary = ExportSummary()  # a caller with a summary has every count: nothing is logged
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        assert [e["task_id"] for e in build_episodes(store, summary=summary)] == ["good"]
    assert dict(summary.rejected) == {"missing_reward": 1} and "skipped" not in caplog.text
    assert [e["task_id"] for e in build_episodes(store, on_invalid="keep")] == ["good", "bad"]
    with pytest.raises(EpisodeError, match="missing_reward"):
        list(build_episodes(store, on_invalid="raise"))
    with pytest.raises(ValueError, match="on_invalid"):
        build_episodes(store, on_invalid="ignore")


def test_per_call_and_session_rewards_count_once_per_thread(store: Path) -> None:
    with sdk.session(task_id="t1") as s:
        record_call(call([user("q")], assistant("a")))
        first = s.last_call_id
        record_call(call([user("q"), assistant("a"), user("q2")], assistant("b")))
        s.reward(0.25, call_id=first)
        s.reward(0.5, call_id=s.last_call_id)
        s.reward(1.0, name="format")
    [ep] = episodes(store)
    # No session-level "reward": the per-call rewards of the thread are summed into it.
    assert ep["reward"] == 0.75
    assert ep["rewards"] == [{"name": "format", "value": 1.0}, {"name": "reward", "value": 0.75}]
    assert [(r["message_index"], r["value"]) for r in meta(ep)["tracerl"]["call_rewards"]] == [
        (1, 0.25),
        (3, 0.5),
    ]
