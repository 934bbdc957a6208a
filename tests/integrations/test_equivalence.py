"""One scripted conversation through four stacks gives the same episode.

System prompt, user question, two tool calls (add, then multiply), their results, a final answer: driven
through the raw OpenAI client, LangChain ``create_agent``, LlamaIndex ``FunctionAgent`` and a Strands
``Agent`` against the loopback server. After normalisation (below) the episode messages and tool schemas
are identical. What normalisation removes, and why it cannot be removed at capture:

- tool-call ids: here the server scripts the same ids for every stack, but a real model's ids differ run
  to run, so they are compared by position;
- tool-call ``arguments`` strings: compared as parsed JSON (whitespace differs by serialiser);
- tool schemas: the frameworks derive them from the same Python functions but decorate them differently —
  LlamaIndex prefixes the signature to the description (``"add(a: 'int', b: 'int') -> 'int'\\nAdd two
  integers."``) and adds ``title`` to each parameter, Strands adds a per-parameter ``description``. These
  are what each framework really sent the model, so they are kept in the store and compared here on name,
  the docstring line, parameter names and types, and ``required``.

Measured (not normalised): assistant ``content`` on tool-call-only turns is ``None`` in all four.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("strands")
pytest.importorskip("polars")

import openai

import sdk
from sdk.episodes import build_episodes
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

SYSTEM = "You are a careful calculator. Use the tools."
QUESTION = "What is (2 + 3) * 4?"
ANSWER = "The answer is 20."


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def _script(server: ScriptedOpenAIServer) -> None:
    server.reset()
    server.enqueue(
        ScriptedResponse.tool_calls([{"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}]),
        ScriptedResponse.tool_calls([{"id": "call_2", "name": "multiply", "arguments": {"a": 5, "b": 4}}]),
        ScriptedResponse.text(ANSWER),
    )


def _params(fn: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }


OPENAI_TOOLS = [
    {"type": "function", "function": {"name": f.__name__, "description": f.__doc__, "parameters": _params(f)}}
    for f in (add, multiply)
]


def run_openai(base_url: str) -> None:
    from integrations.openai import wrap_openai

    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))
    fns = {"add": add, "multiply": multiply}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    while True:
        msg = (
            client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=OPENAI_TOOLS)
            .choices[0]
            .message
        )
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return
        for call in msg.tool_calls:
            result = fns[call.function.name](**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})


def run_langchain(base_url: str) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler

    llm = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="x", max_retries=0)
    agent = create_agent(llm, tools=[tool(add), tool(multiply)], system_prompt=SYSTEM)
    agent.invoke(
        {"messages": [{"role": "user", "content": QUESTION}]},
        config={"callbacks": [TracerlCallbackHandler()]},
    )


def run_llama_index(base_url: str) -> None:
    from llama_index.core.agent import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai import OpenAI

    from integrations.llama_index import instrument_llama_index, uninstrument_llama_index

    llm = OpenAI(model="gpt-4o-mini", api_base=base_url, api_key="x", max_retries=0)
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(add), FunctionTool.from_defaults(multiply)],
        llm=llm,
        system_prompt=SYSTEM,
    )
    instrument_llama_index()
    try:
        asyncio.run(_run_agent(agent))
    finally:
        uninstrument_llama_index()


async def _run_agent(agent: Any) -> Any:
    return await agent.run(QUESTION)  # the workflow needs a running loop when it starts


def run_strands(base_url: str) -> None:
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from integrations.strands import TracerlHookProvider

    model = OpenAIModel(
        client_args={"base_url": base_url, "api_key": "x", "max_retries": 0},
        model_id="gpt-4o-mini",
        params={},
    )
    agent = Agent(
        model=model,
        tools=[tool(add), tool(multiply)],
        system_prompt=SYSTEM,
        hooks=[TracerlHookProvider()],
        callback_handler=None,
    )
    agent(QUESTION)


STACKS = {
    "openai": run_openai,
    "langchain": run_langchain,
    "llama_index": run_llama_index,
    "strands": run_strands,
}


def _normalise_messages(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    ids: dict[str, int] = {}
    out = []
    for m in messages:
        calls = tuple(
            (tc["function"]["name"], json.loads(tc["function"]["arguments"] or "{}"))
            for tc in m.get("tool_calls") or []
        )
        for tc in m.get("tool_calls") or []:
            ids.setdefault(tc["id"], len(ids))
        tool_call = ids.get(m["tool_call_id"]) if m.get("tool_call_id") else None
        out.append(
            (m["role"], (m.get("content") or "").strip(), json.dumps(calls, sort_keys=True), tool_call)
        )
    return out


def _normalise_tools(tools_json: str) -> list[tuple[Any, ...]]:
    out = []
    for t in json.loads(tools_json):
        fn = t["function"]
        desc = (fn.get("description") or "").strip().splitlines()
        doc = next((line for line in desc if "(" not in line), "")  # LlamaIndex prefixes the signature
        params = fn.get("parameters") or {}
        props = {k: v.get("type") for k, v in (params.get("properties") or {}).items()}
        out.append(
            (fn["name"], doc.strip(), json.dumps(props, sort_keys=True), sorted(params.get("required", [])))
        )
    return sorted(out)


def test_same_conversation_same_episode_across_four_stacks(tmp_path: Path, openai_server) -> None:
    episodes: dict[str, dict[str, Any]] = {}
    for name, run in STACKS.items():
        store = tmp_path / name
        sdk.configure(store=store)
        _script(openai_server)
        with sdk.session(task_id="calc", stack=name) as s:
            run(openai_server.base_url)
            s.reward(1.0)
        sdk.shutdown()
        [episode] = list(build_episodes(store))
        episodes[name] = episode
        assert len(openai_server.requests) == 3, f"{name} did not run the scripted conversation"

    reference = _normalise_messages(episodes["openai"]["messages"])
    assert [m[0] for m in reference] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert reference[-1][1] == ANSWER and reference[3][1] == "5" and reference[5][1] == "20"
    for name, episode in episodes.items():
        assert _normalise_messages(episode["messages"]) == reference, name
        assert _normalise_tools(episode["tools"]) == _normalise_tools(episodes["openai"]["tools"]), name
        assert episode["num_calls"] == 3 and episode["reward"] == 1.0, name
