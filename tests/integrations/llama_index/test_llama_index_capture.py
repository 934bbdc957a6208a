"""LlamaIndex capture through the instrumentation API, against the loopback OpenAI-compatible server.

Real ``llama_index.llms.openai.OpenAI`` LLMs drive ``FunctionAgent``, ``ReActAgent`` and ``AgentWorkflow``
(streaming and not) against :class:`sdk.testing.ScriptedOpenAIServer`; the store is read back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.llms.openai")

import openai
from llama_index.core.agent import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    ImageBlock,
    LLMMetadata,
    LogProb,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import MockLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI

import sdk
from integrations import llama_index as li
from integrations.llama_index import (
    TracerlEventHandler,
    TracerlSpanHandler,
    instrument_llama_index,
    messages_to_openai,
    uninstrument_llama_index,
)
from integrations.openai import recording_http_client
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

ROOT = Path(__file__).resolve().parents[3]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [FunctionTool.from_defaults(fn=add), FunctionTool.from_defaults(fn=multiply)]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh store, tracerl attached to LlamaIndex, SDK bugs re-raised (and counted) under tests.

    LlamaIndex's dispatcher swallows handler exceptions, so a re-raised internal error would go
    unnoticed: the fixture also fails the test if ``internal_errors`` grew.
    """
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    path = tmp_path / "store"
    sdk.configure(store=path)
    instrument_llama_index()
    before = sdk.stats()["internal_errors"]
    yield path
    uninstrument_llama_index()
    sdk.shutdown()
    if not getattr(request.node, "allow_internal_errors", False):
        assert sdk.stats()["internal_errors"] == before, "tracerl internal error inside a LlamaIndex handler"


def _sessions(store: Path) -> list[Any]:
    sdk.flush()
    return list(StoreReader(store).sessions())


def _calls(store: Path, task_id: str | None = None) -> list[dict[str, Any]]:
    return [c for s in _sessions(store) if task_id is None or s.task_id == task_id for c in s.calls]


def _llm(server: ScriptedOpenAIServer, *, recording: bool = False, **kwargs: Any) -> OpenAI:
    if recording:
        kwargs.update(
            http_client=recording_http_client(), async_http_client=recording_http_client(async_=True)
        )
    return OpenAI(model="gpt-4o-mini", api_base=server.base_url, api_key="x", max_retries=0, **kwargs)


def _script_two_tools(server: ScriptedOpenAIServer) -> None:
    server.enqueue(
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]),
        ScriptedResponse.tool_calls([{"name": "multiply", "arguments": {"a": 5, "b": 4}}]),
        ScriptedResponse.text("The answer is 20."),
    )


async def _run(agent: Any, question: str) -> str:
    return str(await agent.run(question))


def _chat_requests(server: ScriptedOpenAIServer) -> list[dict[str, Any]]:
    return [r.json for r in server.requests if r.path.endswith("/chat/completions")]


# ------------------------------------------------------------------------------------------------
# Agents
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_function_agent_two_tool_calls_then_answer(
    store: Path, openai_server: ScriptedOpenAIServer, streaming: bool
) -> None:
    _script_two_tools(openai_server)
    llm = _llm(
        openai_server, additional_kwargs={"stream_options": {"include_usage": True}} if streaming else {}
    )
    agent = FunctionAgent(tools=TOOLS, llm=llm, streaming=streaming, system_prompt="Use the tools.")

    async def main() -> str:
        with sdk.session(task_id="fa"):
            return str(await agent.run("What is (2 + 3) * 4?"))

    assert asyncio.run(main()) == "The answer is 20."
    calls = _calls(store, "fa")
    wire = _chat_requests(openai_server)
    assert len(calls) == len(wire) == 3
    for call, request in zip(calls, wire, strict=True):
        assert call["framework"] == "llama_index"
        assert call["source"] == "framework"
        assert call["agent"] == "Agent"
        assert call["stream"] is streaming
        assert call["model"] == "gpt-4o-mini"
        assert call["response_model"] == "gpt-4o-mini-2026-01-01"
        # The converter reproduces exactly what LlamaIndex sent on the wire.
        assert call["request"]["messages"] == request["messages"]
        assert call["request"]["tools"] == request["tools"]
        assert call["request"]["params"]["tool_choice"] == "auto"
        assert call["request"]["params"]["temperature"] == request["temperature"]
        assert call["usage"]["total_tokens"] > 0
        assert call["error"] is None
        assert call["ended_at"] >= call["started_at"]
    first, second, last = calls
    assert first["response"]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": first["response"]["message"]["tool_calls"][0]["id"],
                "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
            }
        ],
    }
    assert first["response"]["finish_reason"] == "tool_calls"
    assert second["request"]["messages"][-1] == {
        "role": "tool",
        "content": "5",
        "tool_call_id": first["response"]["message"]["tool_calls"][0]["id"],
    }
    assert second["response"]["message"]["tool_calls"][0]["function"]["name"] == "multiply"
    assert last["request"]["messages"][-1]["content"] == "20"
    assert last["response"]["message"] == {"role": "assistant", "content": "The answer is 20."}
    assert last["response"]["finish_reason"] == "stop"


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_react_agent(store: Path, openai_server: ScriptedOpenAIServer, streaming: bool) -> None:
    openai_server.enqueue(
        ScriptedResponse.text('Thought: I need to add.\nAction: add\nAction Input: {"a": 2, "b": 3}'),
        ScriptedResponse.text("Thought: I can answer without using any more tools.\nAnswer: 5"),
    )
    agent = ReActAgent(tools=TOOLS, llm=_llm(openai_server), streaming=streaming, name="reactor")

    async def main() -> str:
        with sdk.session(task_id="react"):
            return str(await agent.run("What is 2 + 3?"))

    assert asyncio.run(main()) == "5"
    calls = _calls(store, "react")
    wire = _chat_requests(openai_server)
    assert len(calls) == 2
    assert [c["agent"] for c in calls] == ["reactor", "reactor"]
    assert [c["request"]["messages"] for c in calls] == [r["messages"] for r in wire]
    assert calls[0]["request"].get("tools") is None  # ReAct describes its tools in the system prompt
    assert "add" in calls[0]["request"]["messages"][0]["content"]
    assert calls[0]["response"]["message"]["content"].startswith("Thought: I need to add.")
    assert "Observation: 5" in json.dumps(calls[1]["request"]["messages"])


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_agent_workflow_handoff_records_each_agent(
    store: Path, openai_server: ScriptedOpenAIServer, streaming: bool
) -> None:
    openai_server.enqueue(
        ScriptedResponse.tool_calls(
            [{"name": "handoff", "arguments": {"to_agent": "calculator", "reason": "math"}}]
        ),
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]),
        ScriptedResponse.text("5"),
    )
    llm = _llm(openai_server)
    router = FunctionAgent(
        name="router",
        description="Routes questions.",
        tools=[],
        llm=llm,
        streaming=streaming,
        can_handoff_to=["calculator"],
    )
    calculator = FunctionAgent(
        name="calculator", description="Does arithmetic.", tools=TOOLS, llm=llm, streaming=streaming
    )
    workflow = AgentWorkflow(agents=[router, calculator], root_agent="router")

    async def main() -> str:
        with sdk.session(task_id="wf"):
            return str(await workflow.run(user_msg="What is 2 + 3?"))

    assert asyncio.run(main()) == "5"
    calls = _calls(store, "wf")
    assert [c["agent"] for c in calls] == ["router", "calculator", "calculator"]
    assert [c["request"]["messages"] for c in calls] == [r["messages"] for r in _chat_requests(openai_server)]
    assert {t["function"]["name"] for t in calls[0]["request"]["tools"]} == {"handoff"}
    assert {t["function"]["name"] for t in calls[1]["request"]["tools"]} >= {"add", "multiply"}
    assert calls[2]["response"]["message"]["content"] == "5"


def test_concurrent_sessions_get_their_own_calls(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    llm = _llm(openai_server)

    async def one(i: int) -> None:
        agent = FunctionAgent(tools=[TOOLS[0]], llm=llm, streaming=bool(i % 2))
        with sdk.session(task_id=f"c{i}"):
            await agent.run(f"question {i}")

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(6)))

    asyncio.run(main())
    by_task = {s.task_id: s.calls for s in _sessions(store) if s.task_id}
    assert sorted(by_task) == [f"c{i}" for i in range(6)]
    for task, calls in by_task.items():
        assert len(calls) == 2  # the policy calls the tool once, then answers
        assert all(
            c["request"]["messages"][0] == {"role": "user", "content": f"question {task[1:]}"} for c in calls
        )


# ------------------------------------------------------------------------------------------------
# Direct LLM calls: sync / async, streaming / not, completion, logprobs and token ids
# ------------------------------------------------------------------------------------------------


def test_direct_calls_sync_async_stream_and_complete(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    llm = _llm(openai_server)
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi")]

    async def async_calls() -> None:
        await llm.achat(msgs)
        async for _ in await llm.astream_chat(msgs):
            pass

    with sdk.session(task_id="direct"):
        llm.chat(msgs)
        for _ in llm.stream_chat(msgs):
            pass
        asyncio.run(async_calls())
        assert llm.complete("complete me").text == "You said: complete me"
    calls = _calls(store, "direct")
    assert [c["stream"] for c in calls] == [False, True, False, True, False]
    assert [c["endpoint"] for c in calls] == ["chat.completions"] * 4 + ["completions"]
    for c in calls[:4]:
        assert c["request"]["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
        assert c["response"]["message"] == {"role": "assistant", "content": "You said: hi"}
        assert c["response"]["finish_reason"] == "stop"
        assert c["response_model"] == "gpt-4o-mini-2026-01-01"
    assert calls[4]["request"]["messages"] == [{"role": "user", "content": "complete me"}]
    assert calls[4]["response"]["message"]["content"] == "You said: complete me"
    # Streaming without stream_options.include_usage: the server sends no usage, so none is recorded.
    assert calls[0]["usage"]["total_tokens"] > 0 and calls[1]["usage"] is None


def test_logprobs_and_token_ids_non_streaming(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    llm = _llm(
        openai_server,
        logprobs=True,
        top_logprobs=2,
        additional_kwargs={"extra_body": {"return_token_ids": True}},
    )
    with sdk.session(task_id="lp"):
        response = llm.chat([ChatMessage(role="user", content="say something long")])
    (call,) = _calls(store, "lp")
    assert response.logprobs  # LlamaIndex surfaces them (as top alternatives only) when not streaming
    lp = call["logprobs"]
    assert "".join(e["token"] for e in lp) == response.message.content
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in lp)
    assert len(call["completion_token_ids"]) == len(lp)
    assert call["prompt_token_ids"] and all(isinstance(i, int) for i in call["prompt_token_ids"])
    assert call["request"]["params"]["logprobs"] is True and call["request"]["params"]["top_logprobs"] == 2


def test_streaming_logprobs_gap_and_chunk_recovery(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    """LlamaIndex drops logprobs, token ids and the finish reason when streaming (documented gap).

    Its streamed ``ChatResponse.logprobs`` is ``None`` and the final ``raw`` is only the last chunk.
    tracerl folds them back from each ``LLMChatInProgressEvent``'s raw OpenAI chunk; an LLM whose raw
    chunk is not an OpenAI ``chat.completion.chunk`` (here ``MockLLM``) gets none of these fields.
    """
    llm = _llm(
        openai_server,
        logprobs=True,
        top_logprobs=2,
        additional_kwargs={"extra_body": {"return_token_ids": True}},
    )
    with sdk.session(task_id="stream-lp"):
        chunks = list(llm.stream_chat([ChatMessage(role="user", content="say something long")]))
        assert all(c.logprobs is None for c in chunks)  # the framework's gap
        assert (
            chunks[-1].raw.choices[0].finish_reason == "stop"
            and chunks[-1].raw.choices[0].delta.content is None
        )
        list(MockLLM(max_tokens=4).stream_chat([ChatMessage(role="user", content="hello")]))
    openai_call, mock_call = _calls(store, "stream-lp")
    text = chunks[-1].message.content
    assert "".join(e["token"] for e in openai_call["logprobs"]) == text
    assert len(openai_call["completion_token_ids"]) == len(openai_call["logprobs"])
    assert openai_call["prompt_token_ids"]
    assert openai_call["response"]["finish_reason"] == "stop"
    assert mock_call["stream"] is True
    assert mock_call["response"]["message"]["content"]
    assert mock_call["logprobs"] is None and mock_call["completion_token_ids"] is None
    assert mock_call["response"]["finish_reason"] is None


@pytest.mark.parametrize("mode", ["chat", "stream_chat", "achat", "astream_chat"])
def test_recording_client_merges_into_one_call_with_token_ids(
    store: Path, openai_server: ScriptedOpenAIServer, mode: str
) -> None:
    llm = _llm(openai_server, recording=True, additional_kwargs={"extra_body": {"return_token_ids": True}})
    msgs = [ChatMessage(role="user", content="hello there")]

    async def run_async() -> None:
        if mode == "achat":
            await llm.achat(msgs)
        else:
            async for _ in await llm.astream_chat(msgs):
                pass

    with sdk.session(task_id="merge"):
        if mode == "chat":
            llm.chat(msgs)
        elif mode == "stream_chat":
            list(llm.stream_chat(msgs))
        else:
            asyncio.run(run_async())
    (call,) = _calls(store, "merge")
    assert call["framework"] == "llama_index"
    assert call["source"] == "transport"
    assert len(call["merged_call_ids"]) == 1
    assert call["stream"] is mode.endswith("stream_chat")
    assert call["prompt_token_ids"] and call["completion_token_ids"]
    assert call["response_model"] == "gpt-4o-mini-2026-01-01"
    assert call["response"]["message"]["content"] == "You said: hello there"


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_recording_client_merge_through_function_agent(
    store: Path, openai_server: ScriptedOpenAIServer, streaming: bool
) -> None:
    _script_two_tools(openai_server)
    llm = _llm(openai_server, recording=True, additional_kwargs={"extra_body": {"return_token_ids": True}})
    agent = FunctionAgent(tools=TOOLS, llm=llm, streaming=streaming)

    async def main() -> None:
        with sdk.session(task_id="agent-merge"):
            await agent.run("What is (2 + 3) * 4?")

    asyncio.run(main())
    calls = _calls(store, "agent-merge")
    assert len(calls) == 3
    assert all(c["framework"] == "llama_index" and c["agent"] == "Agent" for c in calls)
    assert all(c["prompt_token_ids"] and c["completion_token_ids"] for c in calls)
    assert calls[0]["response"]["message"]["tool_calls"][0]["function"]["name"] == "add"


# ------------------------------------------------------------------------------------------------
# Errors and robustness
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_llm_error_propagates_unchanged_and_is_recorded(
    store: Path, openai_server: ScriptedOpenAIServer, streaming: bool
) -> None:
    def run() -> BaseException:
        # A fresh LLM per event loop: LlamaIndex caches its async client, bound to the first loop.
        agent = FunctionAgent(tools=TOOLS, llm=_llm(openai_server), streaming=streaming)
        with pytest.raises(openai.BadRequestError) as info:
            asyncio.run(_run(agent, "FAIL_400 now"))
        return info.value

    uninstrument_llama_index()
    plain = run()
    instrument_llama_index()
    with sdk.session(task_id="err"):
        captured = run()
    assert type(captured) is type(plain) and str(captured) == str(plain)
    (call,) = _calls(store, "err")
    assert call["error"]["type"] == "BadRequestError"
    assert call["error"]["status"] == 400
    assert "FAIL_400" in call["error"]["message"]
    assert call["response"]["message"] is None
    assert call["stream"] is streaming
    assert call["request"]["messages"][-1] == {"role": "user", "content": "FAIL_400 now"}
    assert not li._RECORDER.pending


def test_sync_errors_streaming_and_not(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    llm = _llm(openai_server)
    msgs = [ChatMessage(role="user", content="FAIL_500 please")]
    with sdk.session(task_id="sync-err"):
        with pytest.raises(openai.InternalServerError):
            llm.chat(msgs)
        with pytest.raises(openai.InternalServerError):
            list(llm.stream_chat(msgs))
    calls = _calls(store, "sync-err")
    assert [(c["stream"], c["error"]["type"], c["error"]["status"]) for c in calls] == [
        (False, "InternalServerError", 500),
        (True, "InternalServerError", 500),
    ]


def test_stream_closed_early_is_recorded_as_such(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    llm = _llm(openai_server)
    with sdk.session(task_id="closed"):
        stream = llm.stream_chat([ChatMessage(role="user", content="one two three four five")])
        next(stream)
        stream.close()
    (call,) = _calls(store, "closed")
    assert call["stream"] is True
    assert call["error"]["type"] == "GeneratorExit"
    assert call["response"]["message"] is None
    assert not li._RECORDER.pending


@pytest.mark.parametrize("streaming", [False, True], ids=["chat", "stream_chat"])
def test_recording_client_merges_failed_calls(
    store: Path, openai_server: ScriptedOpenAIServer, streaming: bool
) -> None:
    llm = _llm(openai_server, recording=True)
    msgs = [ChatMessage(role="user", content="FAIL_400")]
    with sdk.session(task_id="merge-err"), pytest.raises(openai.BadRequestError):
        if streaming:
            list(llm.stream_chat(msgs))
        else:
            llm.chat(msgs)
    (call,) = _calls(store, "merge-err")
    assert call["framework"] == "llama_index"
    assert call["error"]["status"] == 400
    assert len(call["merged_call_ids"]) == 1


def test_handler_bug_does_not_break_the_agent(
    store: Path,
    openai_server: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.delenv("TRACERL_RAISE_INTERNAL", raising=False)
    request.node.allow_internal_errors = True

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("tracerl bug")

    def run() -> str:
        _script_two_tools(openai_server)
        agent = FunctionAgent(tools=TOOLS, llm=_llm(openai_server), streaming=True)
        with sdk.session(task_id="bug"):
            return asyncio.run(_run(agent, "What is (2 + 3) * 4?"))

    expected = run()
    before = sdk.stats()["internal_errors"]
    monkeypatch.setattr(li, "_fill_response", broken)
    monkeypatch.setattr(li._Recorder, "span_enter", broken)
    monkeypatch.setattr(li._Pending, "add_chunk", broken)
    assert run() == expected == "The answer is 20."
    assert sdk.stats()["internal_errors"] > before


def test_handler_bug_under_raise_internal_is_still_contained(
    store: Path,
    openai_server: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # With TRACERL_RAISE_INTERNAL set the firewall re-raises; LlamaIndex's dispatcher swallows it.
    request.node.allow_internal_errors = True
    monkeypatch.setattr(li, "messages_to_openai", lambda messages: 1 / 0)
    before = sdk.stats()["internal_errors"]
    assert (
        _llm(openai_server).chat([ChatMessage(role="user", content="hi")]).message.content == "You said: hi"
    )
    assert sdk.stats()["internal_errors"] == before + 1


def test_nested_chat_and_completion_record_once(store: Path) -> None:
    # MockLLM.chat() calls complete(): both chat and completion events fire; only the chat is recorded.
    llm = MockLLM(max_tokens=3)
    msgs = [ChatMessage(role="user", content="x")]

    async def async_calls() -> None:
        await llm.achat(msgs)
        async for _ in await llm.astream_chat(msgs):
            pass

    with sdk.session(task_id="nested"):
        llm.chat(msgs)
        list(llm.stream_chat(msgs))
        llm.complete("y")
        asyncio.run(async_calls())
    calls = _calls(store, "nested")
    assert [(c["endpoint"], c["stream"]) for c in calls] == [
        ("chat.completions", False),
        ("chat.completions", True),
        ("completions", False),
        ("chat.completions", False),
        ("chat.completions", True),
    ]
    assert calls[0]["request"]["messages"] == [{"role": "user", "content": "x"}]
    assert calls[2]["request"]["messages"] == [{"role": "user", "content": "y"}]
    assert all(c["model"] == "unknown" and c["response"]["message"]["content"] for c in calls)
    assert not li._RECORDER.pending


def test_framework_logprobs_used_when_raw_has_none(store: Path) -> None:
    # An LLM that reports logprobs only through LlamaIndex's ChatResponse.logprobs (top alternatives per
    # position, the sampled token unmarked): the first alternative is taken, and the record says so.
    class LogprobLLM(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name="lp-model", is_chat_model=True)

        @llm_chat_callback()
        def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
            alts = [[LogProb(token="Hi", logprob=-0.1), LogProb(token="Yo", logprob=-2.0)]]
            return ChatResponse(message=ChatMessage(role="assistant", content="Hi"), logprobs=alts)

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            return CompletionResponse(text="Hi")

        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
            raise NotImplementedError

    with sdk.session(task_id="fw-lp"):
        LogprobLLM().chat([ChatMessage(role="user", content="hello")])
    (call,) = _calls(store, "fw-lp")
    assert call["model"] == "lp-model"
    assert call["logprobs"] == [
        {
            "token": "Hi",
            "logprob": -0.1,
            "top_logprobs": [{"token": "Hi", "logprob": -0.1}, {"token": "Yo", "logprob": -2.0}],
        }
    ]
    assert call["extra"] == {"logprobs_source": "llama_index_top_logprobs"}


def test_abandoned_streams_are_bounded(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(li, "_MAX_PENDING", 3)
    llm = MockLLM(max_tokens=2)
    with sdk.session(task_id="abandon"):
        for _ in range(10):
            llm.stream_chat([ChatMessage(role="user", content="never read")])  # generator never iterated
    assert len(li._RECORDER.pending) <= 3
    assert sdk.stats().get("llama_index_calls_abandoned", 0) >= 7


# ------------------------------------------------------------------------------------------------
# Attach / detach, conversion, missing framework, example
# ------------------------------------------------------------------------------------------------


def test_instrument_is_idempotent(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    d = get_dispatcher()

    def ours() -> tuple[int, int]:
        return (
            sum(isinstance(h, TracerlEventHandler) for h in d.event_handlers),
            sum(isinstance(h, TracerlSpanHandler) for h in d.span_handlers),
        )

    instrument_llama_index()
    instrument_llama_index()
    assert ours() == (1, 1)
    llm = _llm(openai_server)
    with sdk.session(task_id="once"):
        llm.chat([ChatMessage(role="user", content="hi")])
    assert len(_calls(store, "once")) == 1
    uninstrument_llama_index()
    uninstrument_llama_index()
    assert ours() == (0, 0)
    with sdk.session(task_id="detached"):
        llm.chat([ChatMessage(role="user", content="hi")])
    assert _calls(store, "detached") == []
    instrument_llama_index()
    assert ours() == (1, 1)


def test_messages_to_openai_blocks() -> None:
    messages = [
        ChatMessage(role="user", blocks=[TextBlock(text="look: "), ImageBlock(url="https://x.test/a.png")]),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="hmm"),
                ToolCallBlock(tool_call_id="c1", tool_name="add", tool_kwargs={"a": 1, "b": 2}),
            ],
        ),
        ChatMessage(role="tool", content="3", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(
            role="assistant",
            content="",
            additional_kwargs={
                "tool_calls": [
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'},
                    }
                ]
            },
        ),
        ChatMessage(role="model", content="done"),
    ]
    assert messages_to_openai(messages) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look: "},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "hmm",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}
            ],
        },
        {"role": "assistant", "content": "done"},
    ]


def test_missing_framework_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'llama_index':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import integrations.llama_index\n"
        "except ImportError as e:\n"
        "    from sdk.capture import MissingDependency\n"
        "    assert isinstance(e, MissingDependency), type(e)\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('imported without llama_index')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'tracerl[llamaindex]'" in out.stdout
    assert "llama-index-core" in out.stdout


def test_importing_integrations_package_imports_no_framework() -> None:
    code = "import sys, sdk, integrations; print('llama_index' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_example_runs(tmp_path: Path) -> None:
    env = {**os.environ, "TRACERL_STORE": str(tmp_path / "ex-store")}
    env.pop("OPENAI_BASE_URL", None)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "llama_index_agent.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("answer='Tool result: 5'") and "calls_recorded=2" in line
    (session,) = [s for s in StoreReader(tmp_path / "ex-store").sessions() if s.task_id == "llama-index-demo"]
    assert [c["framework"] for c in session.calls] == ["llama_index", "llama_index"]
    assert session.reward == 1.0


def test_example_against_a_given_base_url(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as server:
        env = {**os.environ, "TRACERL_STORE": str(tmp_path / "ex-store")}
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "llama_index_agent.py"), server.base_url],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stderr
        assert len(server.requests) == 2
