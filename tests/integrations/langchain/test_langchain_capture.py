"""The LangChain handler against real ChatOpenAI / create_agent / LangGraph runs on the loopback server."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph")

import openai
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import sdk
from integrations.langchain import TracerlCallbackHandler, instrument_langchain, uninstrument_langchain
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.tools import ADD_TOOL

Reader = Callable[..., list[dict[str, Any]]]

# Python 3.10's asyncio cannot carry a run's config into the tasks LangGraph starts, and create_agent calls
# the model without forwarding it (langchain-ai/langchain#36393, #36477). In async runs on 3.10, handlers
# passed per call see no model calls at all, and handlers on the model object or attached globally see
# them without the graph metadata (no node name, no parent run). These tests state both behaviours.
PY310 = sys.version_info < (3, 11)
ASYNC_AGENT = None if PY310 else "model"

ADD_SCHEMA = ADD_TOOL


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def script_two_tool_calls(server: ScriptedOpenAIServer) -> None:
    server.enqueue(
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 1, "b": 2}}]),
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 3, "b": 4}}]),
        ScriptedResponse.text("The sums are 3 and 7."),
    )


USER = {"messages": [{"role": "user", "content": "Add 1+2, then 3+4."}]}


def assert_agent_calls(
    calls: list[dict[str, Any]],
    server: ScriptedOpenAIServer,
    agent: str | None = "model",
    *,
    stream: bool = False,
    tool_timings: bool = True,
) -> None:
    """Three calls, each exactly what went over the wire, with tool calls and results in the next request."""
    assert len(calls) == 3
    assert [c["framework"] for c in calls] == ["langchain"] * 3
    wire = [r.json for r in server.requests if r.path.endswith("/chat/completions")]
    assert len(wire) == 3
    for call, body in zip(calls, wire, strict=True):
        assert call["request"]["messages"] == body["messages"]
        assert call["request"]["tools"] == body["tools"] == [ADD_SCHEMA]
        assert call["model"] == "gpt-test" and call["response_model"] == "gpt-test-2026-01-01"
        assert call["agent"] == agent
        assert call["usage"]["prompt_tokens"] > 0 and call["usage"]["completion_tokens"] > 0
        assert call["ended_at"] >= call["started_at"]
        assert call["stream"] is stream
        assert call["extra"]["run_id"] and call["error"] is None
    first, second, third = calls
    assert first["request"]["messages"] == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "Add 1+2, then 3+4."},
    ]
    msg = first["response"]["message"]
    assert msg["content"] is None and first["response"]["finish_reason"] == "tool_calls"
    (tc,) = msg["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "add" and tc["id"]
    assert json.loads(tc["function"]["arguments"]) == {"a": 1, "b": 2}
    # The call's response and the tool result are the next request's tail (the episode is built from calls);
    # a named agent's history also carries the agent's name, which the model did not generate.
    resent, result = second["request"]["messages"][-2:]
    assert {k: v for k, v in resent.items() if k != "name"} == msg and resent.get("name") in (None, agent)
    assert result == {"role": "tool", "tool_call_id": tc["id"], "content": "3"}
    assert third["request"]["messages"][-1]["content"] == "7"
    assert third["response"]["message"] == {"role": "assistant", "content": "The sums are 3 and 7."}
    assert third["response"]["finish_reason"] == "stop"
    if not tool_timings:  # a handler on the model object sees no tool events
        assert all("tool_runs" not in c["extra"] for c in calls)
        return
    # Tool timings ride on the call that sees the tool's result.
    (timing,) = second["extra"]["tool_runs"]
    assert timing["tool_call_id"] == tc["id"] and timing["name"] == "add"
    assert timing["ended_at"] >= timing["started_at"]


# --------------------------------------------------------------------------- plain chat model


def test_chat_model_invoke_records_one_call(store: Any, read_calls: Reader, make_llm: Any) -> None:
    llm = make_llm(temperature=0.5)
    with sdk.session(task_id="t1") as s:
        out = llm.invoke("hello there", config={"callbacks": [TracerlCallbackHandler()]})
    assert out.content == "You said: hello there"
    (call,) = read_calls("t1")
    assert call["session_id"] == s.session_id and s.num_calls == 1
    assert call["framework"] == "langchain" and call["endpoint"] == "chat.completions"
    assert call["request"]["messages"] == [{"role": "user", "content": "hello there"}]
    assert call["request"].get("tools") is None
    assert call["request"]["params"] == {"temperature": 0.5}
    assert call["response"] == {
        "message": {"role": "assistant", "content": "You said: hello there"},
        "finish_reason": "stop",
    }
    assert call["model"] == "gpt-test" and call["response_model"] == "gpt-test-2026-01-01"
    assert (
        call["usage"]["total_tokens"] == call["usage"]["prompt_tokens"] + call["usage"]["completion_tokens"]
    )
    assert call["logprobs"] is None and call["prompt_token_ids"] is None
    assert call["extra"]["response_id"].startswith("chatcmpl-")


def test_batch_records_each_prompt(store: Any, read_calls: Reader, make_llm: Any) -> None:
    with sdk.session(task_id="t1"):
        make_llm().batch(["one", "two"], config={"callbacks": [TracerlCallbackHandler()]})
    calls = read_calls("t1")
    assert sorted(c["response"]["message"]["content"] for c in calls) == ["You said: one", "You said: two"]


def test_call_outside_a_session_goes_to_the_implicit_session(
    store: Any, read_calls: Reader, make_llm: Any
) -> None:
    make_llm().invoke("hi", config={"callbacks": [TracerlCallbackHandler()]})
    sdk.flush()
    from sdk.store import StoreReader

    (s,) = list(StoreReader(store).sessions())
    assert s.implicit and len(s.calls) == 1


def test_session_given_to_the_handler_wins(store: Any, read_calls: Reader, make_llm: Any) -> None:
    with sdk.session(task_id="outer") as outer, sdk.session(task_id="inner"):
        make_llm().invoke("hi", config={"callbacks": [TracerlCallbackHandler(session=outer, agent="critic")]})
    (call,) = read_calls("outer")
    assert call["session_id"] == outer.session_id and call["agent"] == "critic"


# --------------------------------------------------------------------------- agents and graphs


def test_create_agent_sync_per_call(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.")
    with sdk.session(task_id="t1"):
        out = agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    assert out["messages"][-1].content == "The sums are 3 and 7."
    assert_agent_calls(read_calls("t1"), openai_server)


def test_create_agent_async(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.")

    async def main() -> Any:
        async with sdk.session(task_id="t1"):
            return await agent.ainvoke(USER, config={"callbacks": [TracerlCallbackHandler()]})

    out = asyncio.run(main())
    assert out["messages"][-1].content == "The sums are 3 and 7."
    if PY310:
        assert read_calls("t1") == []
    else:
        assert_agent_calls(read_calls("t1"), openai_server)


def test_create_agent_named_agent(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.", name="adder")
    with sdk.session(task_id="t1"):
        agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    assert_agent_calls(read_calls("t1"), openai_server, agent="adder")


def _graph(llm: Any) -> Any:
    bound = llm.bind_tools([add])

    def agent_node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent_node)
    g.add_node("tools", ToolNode([add]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def test_langgraph_state_graph_with_tool_node(store: Any, read_calls: Reader, make_llm: Any) -> None:
    graph = _graph(make_llm())
    with sdk.session(task_id="t1"):
        out = graph.invoke(
            {"messages": [("user", "add please")]}, config={"callbacks": [TracerlCallbackHandler()]}
        )
    assert out["messages"][-1].content == "Tool result: 5"  # default policy: add(2, 3), then quote it
    first, second = read_calls("t1")
    assert first["agent"] == second["agent"] == "agent"
    assert first["extra"]["langgraph_node"] == "agent"
    call_id = first["response"]["message"]["tool_calls"][0]["id"]
    assert second["request"]["messages"][-1] == {"role": "tool", "tool_call_id": call_id, "content": "5"}
    assert second["extra"]["tool_runs"][0]["tool_call_id"] == call_id


def test_langgraph_async_graph_with_tool_node(store: Any, read_calls: Reader, make_llm: Any) -> None:
    graph = _graph(make_llm())

    async def main() -> Any:
        async with sdk.session(task_id="t1"):
            return await graph.ainvoke(
                {"messages": [("user", "x")]}, config={"callbacks": [TracerlCallbackHandler()]}
            )

    asyncio.run(main())
    # 3.11+: the sync node runs in a thread executor under a copy of the context holding the run's config.
    assert len(read_calls("t1")) == (0 if PY310 else 2)


def test_langgraph_async_graph_global_attach(store: Any, read_calls: Reader, make_llm: Any) -> None:
    graph = _graph(make_llm())
    instrument_langchain()

    async def main() -> Any:
        async with sdk.session(task_id="t1"):
            return await graph.ainvoke({"messages": [("user", "x")]})

    asyncio.run(main())
    calls = read_calls("t1")
    assert len(calls) == 2  # on every Python version
    assert [c["agent"] for c in calls] == [None if PY310 else "agent"] * 2


def test_async_node_calling_the_model_without_config(store: Any, read_calls: Reader, make_llm: Any) -> None:
    llm1 = llm2 = make_llm()

    async def without_config(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm1.ainvoke(state["messages"])]}

    async def with_config(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [await llm2.ainvoke(state["messages"], config=config)]}

    async def run(node: Any) -> None:
        g = StateGraph(MessagesState)
        g.add_node("n", node)
        g.add_edge(START, "n")
        g.add_edge("n", END)
        async with sdk.session(task_id=node.__name__):
            await g.compile().ainvoke(
                {"messages": [("user", "x")]}, config={"callbacks": [TracerlCallbackHandler()]}
            )

    async def main() -> None:  # one event loop: langchain-openai caches its async http client process-wide
        await run(without_config)
        await run(with_config)

    asyncio.run(main())
    # Python 3.10's asyncio cannot carry the node's config into the nested call implicitly.
    assert len(read_calls("without_config")) == (0 if PY310 else 1)
    assert len(read_calls("with_config")) == 1


# --------------------------------------------------------------------------- streaming


def test_streaming_sync(store: Any, read_calls: Reader, make_llm: Any) -> None:
    llm = make_llm(stream_usage=True)
    with sdk.session(task_id="t1"):
        text = "".join(
            c.content for c in llm.stream("stream me", config={"callbacks": [TracerlCallbackHandler()]})
        )
    (call,) = read_calls("t1")
    assert call["stream"] is True and text == "You said: stream me"
    assert call["response"]["message"] == {"role": "assistant", "content": text}
    assert call["response"]["finish_reason"] == "stop" and call["response_model"] == "gpt-test-2026-01-01"
    assert call["usage"]["completion_tokens"] > 0
    assert call["extra"]["ttft_s"] >= 0


def test_streaming_without_stream_usage_has_no_usage(store: Any, read_calls: Reader, make_llm: Any) -> None:
    # Documented: langchain-openai asks for streamed usage only with stream_usage=True (custom base_url).
    with sdk.session(task_id="t1"):
        list(make_llm().stream("x", config={"callbacks": [TracerlCallbackHandler()]}))
    (call,) = read_calls("t1")
    assert call["stream"] is True and call["usage"] is None


def test_streaming_agent_async_with_tool_calls(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(
        make_llm(streaming=True, stream_usage=True), tools=[add], system_prompt="You add numbers."
    )
    instrument_langchain()  # per-call handlers see nothing here on 3.10 (see PY310)

    async def main() -> list[Any]:
        async with sdk.session(task_id="t1"):
            return [c async for c in agent.astream(USER, stream_mode="messages")]

    asyncio.run(main())
    calls = read_calls("t1")
    assert [c["stream"] for c in calls] == [True, True, True]
    assert [c["agent"] for c in calls] == [ASYNC_AGENT] * 3
    wire = [r.json["messages"] for r in openai_server.requests]
    assert [c["request"]["messages"] for c in calls] == wire
    assert json.loads(calls[1]["response"]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "a": 3,
        "b": 4,
    }
    assert calls[1]["response"]["message"]["content"] is None
    assert calls[2]["response"]["message"]["content"] == "The sums are 3 and 7."


# --------------------------------------------------------------------------- attach points


def test_attach_per_model_object(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(
        make_llm(callbacks=[TracerlCallbackHandler()]), tools=[add], system_prompt="You add numbers."
    )
    with sdk.session(task_id="t1"):
        agent.invoke(USER)
    assert_agent_calls(read_calls("t1"), openai_server, tool_timings=False)


def test_attach_per_model_object_async(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(
        make_llm(callbacks=[TracerlCallbackHandler()]), tools=[add], system_prompt="You add numbers."
    )

    async def main() -> None:
        async with sdk.session(task_id="t1"):
            await agent.ainvoke(USER)

    asyncio.run(main())
    assert_agent_calls(read_calls("t1"), openai_server, agent=ASYNC_AGENT, tool_timings=False)


def test_attach_globally(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.")
    instrument_langchain()
    with sdk.session(task_id="t1"):
        agent.invoke(USER)
    assert_agent_calls(read_calls("t1"), openai_server)
    uninstrument_langchain()
    with sdk.session(task_id="t2"):
        make_llm().invoke("not recorded")
    assert read_calls("t2") == []


def test_attach_globally_async(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.")
    instrument_langchain()

    async def main() -> None:
        async with sdk.session(task_id="t1"):
            await agent.ainvoke(USER)

    asyncio.run(main())
    assert_agent_calls(read_calls("t1"), openai_server, agent=ASYNC_AGENT)


def test_global_attach_reaches_plain_threads(store: Any, read_calls: Reader, make_llm: Any) -> None:
    # RL rollouts often run agents in worker threads, which start with an empty context.
    instrument_langchain()
    llm = make_llm()

    def worker(i: int) -> None:
        with sdk.session(task_id=f"w{i}"):
            llm.invoke(f"thread {i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        (call,) = read_calls(f"w{i}")
        assert call["request"]["messages"][0]["content"] == f"thread {i}"


def test_every_attach_point_at_once_records_each_call_once(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    script_two_tool_calls(openai_server)
    instrument_langchain()
    llm = make_llm(callbacks=[TracerlCallbackHandler()])
    agent = create_agent(llm, tools=[add], system_prompt="You add numbers.")
    with sdk.session(task_id="t1") as s:
        agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    assert_agent_calls(read_calls("t1"), openai_server)
    assert s.num_calls == 3


def test_instrument_is_idempotent(store: Any, read_calls: Reader, make_llm: Any) -> None:
    from langchain_core.tracers.context import _configure_hooks

    import integrations.langchain as lc

    handler = instrument_langchain()
    assert instrument_langchain() is handler
    instrument_langchain()
    assert sum(1 for hook in _configure_hooks if hook[0] is lc._slot) == 1
    with sdk.session(task_id="t1"):
        make_llm().invoke("once")
    assert len(read_calls("t1")) == 1
    mine = TracerlCallbackHandler(agent="mine")
    assert instrument_langchain(mine) is mine and instrument_langchain() is mine
    uninstrument_langchain()
    uninstrument_langchain()
    assert lc._slot.get() is None
    with sdk.session(task_id="t2"):
        make_llm().invoke("none")
    assert read_calls("t2") == []


def test_with_config_callbacks_are_lost_inside_create_agent(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    # A LangChain limitation: create_agent re-binds tools on the raw
    # model, dropping a config bound with with_config(). Attach per call, per object or globally instead.
    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm().with_config(callbacks=[TracerlCallbackHandler()]), tools=[add])
    with sdk.session(task_id="t1"):
        agent.invoke(USER)
    assert read_calls("t1") == []


# --------------------------------------------------------------------------- errors


def _raise(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("expected an exception")


def test_error_propagates_unchanged_and_is_recorded(store: Any, read_calls: Reader, make_llm: Any) -> None:
    llm = make_llm()
    bare = _raise(lambda: llm.invoke("FAIL_400 please"))
    with sdk.session(task_id="t1") as s:
        seen = _raise(lambda: llm.invoke("FAIL_400 please", config={"callbacks": [TracerlCallbackHandler()]}))
    assert type(seen) is type(bare) and isinstance(seen, openai.BadRequestError)
    assert str(seen) == str(bare) and seen.status_code == 400
    (call,) = read_calls("t1")
    assert s.num_calls == 1
    assert call["error"]["type"] == type(bare).__name__ and call["error"]["status"] == 400
    assert call["error"]["code"] == "invalid_request" and "FAIL_400" in call["error"]["message"]
    assert call["request_id"].startswith("req_")
    assert call["response"]["message"] is None
    assert call["request"]["messages"] == [{"role": "user", "content": "FAIL_400 please"}]


def test_error_inside_an_agent(store: Any, read_calls: Reader, make_llm: Any) -> None:
    agent = create_agent(make_llm(), tools=[add])
    with pytest.raises(openai.BadRequestError), sdk.session(task_id="t1") as s:
        agent.invoke({"messages": [("user", "FAIL_400")]}, config={"callbacks": [TracerlCallbackHandler()]})
    (call,) = read_calls("t1")
    assert call["error"]["status"] == 400
    from sdk.store import StoreReader

    (stored,) = [x for x in StoreReader(store).sessions() if x.session_id == s.session_id]
    assert stored.status == "error"


def test_streaming_error(store: Any, read_calls: Reader, make_llm: Any) -> None:
    async def main() -> None:
        async with sdk.session(task_id="t1"):
            async for _ in make_llm().astream("FAIL_500", config={"callbacks": [TracerlCallbackHandler()]}):
                pass

    seen = _raise(lambda: asyncio.run(main()))
    assert isinstance(seen, openai.APIError)  # langchain-openai re-raises it as its OpenAIAPIError
    (call,) = read_calls("t1")
    assert call["error"]["status"] == 500 and call["error"]["type"] == type(seen).__name__
    assert call["stream"] is False  # it failed before the first token


def test_tool_error_timing(store: Any, read_calls: Reader, make_llm: Any) -> None:
    @tool
    def broken(city: str) -> str:
        """Always fails."""
        raise ValueError("no such city")

    bound = make_llm().bind_tools([broken])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [bound.invoke(state["messages"])]})
    g.add_node("tools", ToolNode([broken], handle_tool_errors=True))  # the error becomes the tool's message
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    with sdk.session(task_id="t1"):
        g.compile().invoke({"messages": [("user", "go")]}, config={"callbacks": [TracerlCallbackHandler()]})
    first, second = read_calls("t1")
    result = second["request"]["messages"][-1]
    assert result["role"] == "tool" and "no such city" in result["content"]
    (timing,) = second["extra"]["tool_runs"]
    assert timing["error"] == "ValueError" and timing["name"] == "broken"
    assert timing["tool_call_id"] == first["response"]["message"]["tool_calls"][0]["id"]


# --------------------------------------------------------------------------- logprobs and token ids


def test_logprobs_when_enabled(store: Any, read_calls: Reader, make_llm: Any) -> None:
    llm = make_llm(logprobs=True, top_logprobs=2)
    with sdk.session(task_id="t1"):
        out = llm.invoke("hi", config={"callbacks": [TracerlCallbackHandler()]})
        streamed = "".join(
            c.content for c in llm.stream("hi", config={"callbacks": [TracerlCallbackHandler()]})
        )
    plain, stream = read_calls("t1")
    for call, text in ((plain, out.content), (stream, streamed)):
        lps = call["logprobs"]
        assert "".join(e["token"] for e in lps) == text
        assert all(isinstance(e["logprob"], float) and len(e["top_logprobs"]) == 2 for e in lps)
        assert lps[0]["top_logprobs"][0] == {"token": lps[0]["token"], "logprob": lps[0]["logprob"]}
        assert (
            call["request"]["params"]["logprobs"] is True and call["request"]["params"]["top_logprobs"] == 2
        )
    assert stream["stream"] is True


def test_token_ids_are_dropped_by_langchain(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    # Documented: the server returns token ids, langchain-openai drops them, the handler cannot see them.
    llm = make_llm(extra_body={"return_token_ids": True})
    with sdk.session(task_id="t1"):
        llm.invoke("hi", config={"callbacks": [TracerlCallbackHandler()]})
    (call,) = read_calls("t1")
    assert call["prompt_token_ids"] is None and call["completion_token_ids"] is None
    assert call["request"]["params"]["extra_body"] == {"return_token_ids": True}


@pytest.mark.parametrize("mode", ["sync", "async", "stream", "astream", "instrument_openai"])
def test_recording_client_adds_token_ids_one_call_each(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any, mode: str
) -> None:
    from integrations.openai import instrument_openai, recording_http_client

    script_two_tool_calls(openai_server)
    kw: dict[str, Any] = {"extra_body": {"return_token_ids": True}, "logprobs": True}
    if mode == "instrument_openai":
        instrument_openai()
    else:
        kw.update(http_client=recording_http_client(), http_async_client=recording_http_client(async_=True))
    if mode in ("stream", "astream"):
        kw.update(streaming=True, stream_usage=True)
    agent = create_agent(make_llm(**kw), tools=[add], system_prompt="You add numbers.")
    config: RunnableConfig = {"callbacks": [TracerlCallbackHandler()]}
    with sdk.session(task_id="t1") as s:
        if mode in ("async", "astream"):
            instrument_langchain()  # async: per-call handlers see nothing on 3.10 (see PY310)
            asyncio.run(agent.ainvoke(USER))
        else:
            agent.invoke(USER, config=config)
    calls = read_calls("t1")
    assert s.num_calls == 3
    agent_name = ASYNC_AGENT if mode in ("async", "astream") else "model"
    assert_agent_calls(calls, openai_server, agent=agent_name, stream=mode in ("stream", "astream"))
    for call in calls:
        assert call["source"] == "transport" and len(call["merged_call_ids"]) == 1
        assert call["prompt_token_ids"] and call["completion_token_ids"]
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
        assert call["stream"] is (mode in ("stream", "astream"))


def test_responses_api(store: Any, read_calls: Reader, make_llm: Any, openai_server: Any) -> None:
    script_two_tool_calls(openai_server)
    llm = make_llm(use_responses_api=True, include=["message.output_text.logprobs"], top_logprobs=2)
    agent = create_agent(llm, tools=[add], system_prompt="You add numbers.")
    with sdk.session(task_id="t1"):
        agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    calls = read_calls("t1")
    assert [c["endpoint"] for c in calls] == ["responses"] * 3
    assert [c["response"]["finish_reason"] for c in calls] == ["tool_calls", "tool_calls", "stop"]
    first, second, third = calls
    tc = first["response"]["message"]["tool_calls"][0]
    assert first["response"]["message"]["content"] is None
    assert second["request"]["messages"][-2:] == [
        first["response"]["message"],
        {"role": "tool", "tool_call_id": tc["id"], "content": "3"},
    ]
    assert third["response"]["message"] == {"role": "assistant", "content": "The sums are 3 and 7."}
    assert third["usage"]["prompt_tokens"] > 0
    # Documented: langchain-openai does not surface Responses API logprobs, even when requested.
    assert all(c["logprobs"] is None for c in calls)


def test_responses_api_with_recording_client_recovers_logprobs(
    store: Any, read_calls: Reader, make_llm: Any, openai_server: Any
) -> None:
    from integrations.openai import recording_http_client

    script_two_tool_calls(openai_server)
    llm = make_llm(
        use_responses_api=True,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        http_client=recording_http_client(),
    )
    agent = create_agent(llm, tools=[add], system_prompt="You add numbers.")
    with sdk.session(task_id="t1") as s:
        agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    calls = read_calls("t1")
    assert s.num_calls == 3 and [c["framework"] for c in calls] == ["langchain"] * 3
    assert (
        calls[2]["logprobs"] and "".join(e["token"] for e in calls[2]["logprobs"]) == "The sums are 3 and 7."
    )


def test_failed_call_with_recording_client_is_one_call(store: Any, read_calls: Reader, make_llm: Any) -> None:
    from integrations.openai import recording_http_client

    llm = make_llm(http_client=recording_http_client())
    with sdk.session(task_id="t1"), pytest.raises(openai.BadRequestError):
        llm.invoke("FAIL_400", config={"callbacks": [TracerlCallbackHandler()]})
    assert len(read_calls("t1")) == 1


# --------------------------------------------------------------------------- robustness


def test_handler_bug_does_not_break_the_agent(
    store: Any,
    read_calls: Reader,
    make_llm: Any,
    openai_server: Any,
    allow_internal_errors: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import integrations.langchain as lc

    script_two_tool_calls(openai_server)
    agent = create_agent(make_llm(), tools=[add], system_prompt="You add numbers.")
    baseline = agent.invoke(USER)["messages"][-1].content
    openai_server.reset()
    script_two_tool_calls(openai_server)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracerl bug")

    monkeypatch.setattr(lc, "_response_message", boom)  # every on_llm_end fails
    before = sdk.stats()["internal_errors"]
    with sdk.session(task_id="t1"):
        out = agent.invoke(USER, config={"callbacks": [TracerlCallbackHandler()]})
    assert out["messages"][-1].content == baseline
    assert sdk.stats()["internal_errors"] == before + 3
    assert read_calls("t1") == []


def test_handler_bug_at_start_does_not_break_the_agent(
    store: Any,
    read_calls: Reader,
    make_llm: Any,
    allow_internal_errors: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import integrations.langchain as lc

    def boom() -> Any:
        raise RuntimeError("tracerl bug")

    monkeypatch.setattr(lc, "capture_target", boom)
    before = sdk.stats()["internal_errors"]
    with sdk.session(task_id="t1"):
        out = make_llm().invoke("hi", config={"callbacks": [TracerlCallbackHandler()]})
    assert out.content == "You said: hi"
    assert sdk.stats()["internal_errors"] == before + 1
    assert read_calls("t1") == []


def test_fake_chat_model_without_metadata(store: Any, read_calls: Reader) -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    llm = GenericFakeChatModel(messages=iter([AIMessage(content="scripted")]))
    with sdk.session(task_id="t1"):
        llm.invoke([HumanMessage(content="hi")], config={"callbacks": [TracerlCallbackHandler()]})
    (call,) = read_calls("t1")
    assert call["response"]["message"] == {"role": "assistant", "content": "scripted"}
    assert call["model"] is None and call["usage"] is None and call["response"]["finish_reason"] is None
