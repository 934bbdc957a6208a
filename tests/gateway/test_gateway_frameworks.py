"""Agents pointed at the gateway give the same episodes as in-process capture of the same conversation.

Each stack runs one scripted conversation (system prompt, question, a tool call, its result, an answer)
twice against the same scripted upstream: once in this process with its tracerl integration, once
through a real two-worker gateway process (session id in the URL, task in a header, reward and end over
HTTP). The episodes are compared on messages, tools and reward (see tests/support/gateway.py for normalisation).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("polars")

import sdk
from sdk.episodes import build_episodes
from sdk.store import read_sessions
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.gateway import Gateway, new_id, normalise_messages, normalise_tools
from tests.support.tools import ADD_TOOL


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


SYSTEM = "You are a careful calculator. Use the tools."
QUESTION = "What is 2 + 3?"
ANSWER = "The answer is 5."


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [ADD_TOOL]


def _script(server: ScriptedOpenAIServer) -> None:
    server.reset()
    server.enqueue(
        ScriptedResponse.tool_calls([{"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}]),
        ScriptedResponse.text(ANSWER),
    )


def run_openai(base_url: str, headers: dict[str, str], in_process: bool, stream: bool = False) -> None:
    import openai

    from integrations.openai import wrap_openai

    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, default_headers=headers)
    if in_process:
        wrap_openai(client)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    while True:
        if stream:
            content, calls = "", {}
            for chunk in client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS, stream=True
            ):
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is None:
                    continue
                content += delta.content or ""
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(
                        tc.index, {"id": tc.id, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            reply = (
                client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
                .choices[0]
                .message
            )
            msg = reply.model_dump(exclude_none=True)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return
        for call in msg["tool_calls"]:
            result = add(**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})


def run_openai_stream(base_url: str, headers: dict[str, str], in_process: bool) -> None:
    run_openai(base_url, headers, in_process, stream=True)


def run_langchain(base_url: str, headers: dict[str, str], in_process: bool) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler

    llm = ChatOpenAI(
        model="gpt-4o-mini", base_url=base_url, api_key="sk-test", max_retries=0, default_headers=headers
    )
    agent = create_agent(llm, tools=[tool(add)], system_prompt=SYSTEM)
    config = {"callbacks": [TracerlCallbackHandler()]} if in_process else {}
    agent.invoke({"messages": [{"role": "user", "content": QUESTION}]}, config=config)


def run_strands(base_url: str, headers: dict[str, str], in_process: bool) -> None:
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from integrations.strands import TracerlHookProvider

    model = OpenAIModel(
        client_args={
            "base_url": base_url,
            "api_key": "sk-test",
            "max_retries": 0,
            "default_headers": headers,
        },
        model_id="gpt-4o-mini",
        params={},
    )
    hooks = [TracerlHookProvider()] if in_process else []
    Agent(model=model, tools=[tool(add)], system_prompt=SYSTEM, hooks=hooks, callback_handler=None)(QUESTION)


STACKS = {
    "openai": run_openai,
    "openai-stream": run_openai_stream,
    "langchain": pytest.param(
        run_langchain, marks=pytest.mark.skipif(not _has("langchain_openai"), reason="langchain")
    ),
    "strands": pytest.param(run_strands, marks=pytest.mark.skipif(not _has("strands"), reason="strands")),
}


def _episode(sessions: list[Any]) -> dict[str, Any]:
    [episode] = list(build_episodes(sessions))
    return episode


@pytest.mark.parametrize("run", list(STACKS.values()), ids=list(STACKS))
def test_gateway_episode_equals_in_process_episode(
    run: Any, upstream: ScriptedOpenAIServer, gateway: Gateway, tmp_path: Path
) -> None:
    # In process: the stack's own integration, in a session.
    store = tmp_path / "in-process"
    sdk.configure(store=store)
    _script(upstream)
    with sdk.session(task_id="calc") as s:
        run(upstream.base_url, {}, True)
        s.reward(1.0)
    sdk.shutdown()
    assert len(upstream.requests) == 2
    reference = _episode(list(read_sessions(store)))

    # Through the gateway: nothing of tracerl in the agent but its base URL and a task header.
    sid = new_id()
    _script(upstream)
    run(gateway.base(sid), {"X-Tracerl-Task": "calc"}, False)
    gateway.reward(sid, 1.0)
    gateway.end(sid)
    assert len(upstream.requests) == 2
    stored = gateway.session(sid)
    assert stored.status == "ok" and stored.task_id == "calc" and len(stored.calls) == 2
    assert all(c["framework"] == "gateway" for c in stored.calls)
    episode = _episode([stored])

    assert [m[0] for m in normalise_messages(episode["messages"])] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert normalise_messages(episode["messages"]) == normalise_messages(reference["messages"])
    assert normalise_tools(episode["tools"]) == normalise_tools(reference["tools"])
    assert episode["reward"] == reference["reward"] == 1.0
    assert episode["task_id"] == reference["task_id"] == "calc"
