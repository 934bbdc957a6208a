"""Conversion of LangChain messages and results to OpenAI chat format, driven through the handler's hooks."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult

import integrations.langchain as lc
import sdk
from integrations.langchain import TracerlCallbackHandler

Reader = Callable[..., list[dict[str, Any]]]


def run_once(
    request: list[Any],
    response: AIMessage | None,
    *,
    invocation_params: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    error: BaseException | None = None,
    n: int = 1,
) -> None:
    """Drive one chat-model run through the hooks the way LangChain's callback manager does."""
    h = TracerlCallbackHandler()
    run_id = uuid.uuid4()
    h.on_chat_model_start(
        {"id": ["x"]},
        [request],
        run_id=run_id,
        metadata=metadata or {},
        invocation_params=invocation_params or {"model": "m", "_type": "fake"},
    )
    if error is not None:
        h.on_llm_error(error, run_id=run_id)
        return
    assert response is not None
    gens = [ChatGeneration(message=response) for _ in range(n)]
    h.on_llm_end(LLMResult(generations=[gens]), run_id=run_id)


def test_request_history_in_openai_format(store: Any, read_calls: Reader) -> None:
    history = [
        SystemMessage(content="sys"),
        HumanMessage(
            content=[{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
        ),
        AIMessage(
            content="",
            tool_calls=[{"name": "f", "args": {"q": "é"}, "id": "c1"}],
            invalid_tool_calls=[
                {"name": "g", "args": "{bad", "id": "c2", "error": None, "type": "invalid_tool_call"}
            ],
        ),
        ToolMessage(content="r1", tool_call_id="c1", name="f"),
        ToolMessage(content=[{"type": "text", "text": "r2"}], tool_call_id="c2"),
        HumanMessage(content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
    ]
    with sdk.session(task_id="t1"):
        run_once(history, AIMessage(content="ok"))
    (call,) = read_calls("t1")
    assert call["request"]["messages"] == [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "id": "c1", "function": {"name": "f", "arguments": '{"q": "é"}'}},
                {"type": "function", "id": "c2", "function": {"name": "g", "arguments": "{bad"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},  # no "name": not a chat-completions field
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "r2"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]


def test_response_with_invalid_tool_call_keeps_the_raw_arguments(store: Any, read_calls: Reader) -> None:
    # A malformed tool call is still what the model generated: keep it, verbatim.
    bad = AIMessage(
        content="",
        invalid_tool_calls=[
            {"name": "f", "args": '{"q": ', "id": "c9", "error": "x", "type": "invalid_tool_call"}
        ],
    )
    with sdk.session(task_id="t1"):
        run_once([HumanMessage(content="hi")], bad)
    (call,) = read_calls("t1")
    assert call["response"]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": '{"q": '}}],
    }


def test_response_content_blocks_and_reasoning(store: Any, read_calls: Reader) -> None:
    blocks = AIMessage(
        content=[
            {"type": "reasoning", "reasoning": "think"},
            {"type": "text", "text": "Hello "},
            {"type": "text", "text": "world"},
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
        ],
        tool_calls=[{"name": "f", "args": {}, "id": "c1"}],
    )
    kw = AIMessage(content="answer", additional_kwargs={"reasoning_content": "because"})
    with sdk.session(task_id="t1"):
        run_once([HumanMessage(content="q")], blocks)
        run_once([HumanMessage(content="q2")], kw)
    first, second = read_calls("t1")
    assert first["response"]["message"] == {
        "role": "assistant",
        "content": "Hello world",
        "reasoning_content": "think",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert second["response"]["message"] == {
        "role": "assistant",
        "content": "answer",
        "reasoning_content": "because",
    }


def test_usage_metadata_is_mapped_to_openai_names(store: Any, read_calls: Reader) -> None:
    msg = AIMessage(
        content="x",
        usage_metadata={
            "input_tokens": 10,
            "output_tokens": 4,
            "total_tokens": 14,
            "input_token_details": {"cache_read": 3},
            "output_token_details": {"reasoning": 1},
        },
        response_metadata={"model_name": "claude-x", "stop_reason": "end_turn"},
    )
    with sdk.session(task_id="t1"):
        run_once(
            [HumanMessage(content="q")],
            msg,
            invocation_params={"model": "claude", "temperature": 0.0, "max_tokens": 5, "stream": False},
        )
    (call,) = read_calls("t1")
    assert call["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    assert call["model"] == "claude" and call["response_model"] == "claude-x"
    assert call["response"]["finish_reason"] == "end_turn"
    assert call["request"]["params"] == {"temperature": 0.0, "max_tokens": 5}


def test_n_greater_than_one_keeps_other_choices(store: Any, read_calls: Reader) -> None:
    with sdk.session(task_id="t1"):
        run_once([HumanMessage(content="q")], AIMessage(content="a"), n=2)
    (call,) = read_calls("t1")
    assert call["extra"]["other_choices"] == [{"role": "assistant", "content": "a"}]


def test_agent_name_sources(store: Any, read_calls: Reader) -> None:
    with sdk.session(task_id="t1"):
        run_once(
            [HumanMessage(content="1")],
            AIMessage(content="a"),
            metadata={"lc_agent_name": "planner", "langgraph_node": "model"},
        )
        run_once([HumanMessage(content="2")], AIMessage(content="b"), metadata={"langgraph_node": "agent"})
    assert [c["agent"] for c in read_calls("t1")] == ["planner", "agent"]


def test_error_without_status(store: Any, read_calls: Reader) -> None:
    with sdk.session(task_id="t1"):
        run_once([HumanMessage(content="q")], None, error=TimeoutError("slow"))
    (call,) = read_calls("t1")
    assert call["error"] == {"type": "TimeoutError", "message": "slow", "status": None}


def test_run_state_is_bounded(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lc, "_MAX_RUNS", 2)
    before = sdk.stats().get("langchain_runs_evicted", 0)
    h = TracerlCallbackHandler()
    ids = [uuid.uuid4() for _ in range(3)]
    for run_id in ids:
        h.on_chat_model_start({}, [[HumanMessage(content="q")]], run_id=run_id, invocation_params={})
    assert list(lc._runs) == ids[1:]
    assert sdk.stats()["langchain_runs_evicted"] == before + 1
    for run_id in ids:  # ending an evicted run is a no-op
        h.on_llm_end(LLMResult(generations=[[ChatGeneration(message=AIMessage(content="a"))]]), run_id=run_id)
    assert not lc._runs


def test_unknown_run_end_is_ignored(store: Any, read_calls: Reader) -> None:
    h = TracerlCallbackHandler()
    h.on_llm_end(LLMResult(generations=[]), run_id=uuid.uuid4())
    h.on_llm_error(ValueError("x"), run_id=uuid.uuid4())
    h.on_llm_new_token("t", run_id=uuid.uuid4())
    h.on_tool_end("x", run_id=uuid.uuid4())
    assert read_calls() == []
