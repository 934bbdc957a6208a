"""200 concurrent sessions in one process, mixing the four stacks: every call lands in its own session."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("strands")

import openai

import sdk
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer
from tests.support.tools import ADD_TOOL

pytestmark = pytest.mark.reliability


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [ADD_TOOL]


def openai_agent(base_url: str, question: str) -> None:
    from integrations.openai import wrap_openai

    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(3):
        msg = (
            client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
            .choices[0]
            .message
        )
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})


def langchain_agent(base_url: str, question: str) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler

    llm = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="x", max_retries=0)
    create_agent(llm, tools=[tool(add)]).invoke(
        {"messages": [{"role": "user", "content": question}]},
        config={"callbacks": [TracerlCallbackHandler()]},
    )


def llama_index_agent(base_url: str, question: str) -> None:
    from llama_index.core.agent import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(model="gpt-4o-mini", api_base=base_url, api_key="x", max_retries=0)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(add)], llm=llm)

    async def run() -> Any:
        return await agent.run(question)

    asyncio.run(run())


def strands_agent(base_url: str, question: str) -> None:
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from integrations.strands import TracerlHookProvider

    model = OpenAIModel(
        client_args={"base_url": base_url, "api_key": "x", "max_retries": 0},
        model_id="gpt-4o-mini",
        params={},
    )
    Agent(model=model, tools=[tool(add)], hooks=[TracerlHookProvider()], callback_handler=None)(question)


STACKS = [openai_agent, langchain_agent, llama_index_agent, strands_agent]


def test_200_concurrent_sessions_across_four_stacks(tmp_path: Path) -> None:
    from integrations.llama_index import instrument_llama_index, uninstrument_llama_index

    sdk.configure(store=tmp_path / "store")
    instrument_llama_index()
    expected: dict[str, str] = {}

    def one(i: int, base_url: str) -> None:
        run = STACKS[i % len(STACKS)]
        task = f"task-{i:03d}-{run.__name__}"
        with sdk.session(task_id=task) as s:
            expected[s.session_id] = task
            run(base_url, f"[{task}] please add two numbers")

    try:
        with ScriptedOpenAIServer() as server, concurrent.futures.ThreadPoolExecutor(32) as pool:
            for f in [pool.submit(one, i, server.base_url) for i in range(200)]:
                f.result()
        sdk.flush()
        sessions = {s.session_id: s for s in StoreReader(tmp_path / "store").sessions()}
    finally:
        uninstrument_llama_index()
        sdk.shutdown()

    assert set(sessions) == set(expected)
    for sid, s in sessions.items():
        task = expected[sid]
        framework = task.split("-", 2)[2].removesuffix("_agent")
        assert len(s.calls) == 2, (task, len(s.calls))  # tool call, then the answer
        for call in s.calls:
            users = [m for m in call["request"]["messages"] if m["role"] == "user"]
            assert f"[{task}]" in str(users[0]["content"]), (task, users)
            assert call["framework"] == framework
