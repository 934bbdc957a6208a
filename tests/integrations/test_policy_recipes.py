"""Each framework's recipe (``policy_client``, ``policy_chat_model``, ``policy_llm``, ``policy_model``) against
``tracerl serve`` on the tiny model: the call goes through with the recipe's temperature and timeout, lands
in the store with the server's token ids and logprobs, and an agent's tools reach the server.

The tiny model writes random text, so nothing here depends on what it says.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from sdk import _env  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from trainers.serve.pidfile import free_port, terminate, wait_healthy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is 3 plus 4?"}]


@pytest.fixture(scope="module")
def policy_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tracerl serve`` on the tiny model, in its own process on 127.0.0.1, as the loop would start it."""
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "sdk.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    with open(log, "ab") as out:
        proc = subprocess.Popen([*cmd, "--model-name", "policy", "--threads", "1"], stdout=out, stderr=out)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 120, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        terminate(proc, 10)


@pytest.fixture
def policy_env(policy_url: str, store: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The environment the loop gives an agent: the policy's base URL and served name (and a fresh store)."""
    monkeypatch.setenv(_env.TRACERL_STORE, str(store))
    monkeypatch.setenv(_env.TRACERL_POLICY_BASE_URL, policy_url)
    monkeypatch.setenv(_env.TRACERL_POLICY_MODEL, "policy")
    return policy_url


def _calls(task_id: str) -> list[dict[str, Any]]:
    sdk.flush()
    (session,) = [s for s in StoreReader(os.environ[_env.TRACERL_STORE]).sessions() if s.task_id == task_id]
    return session.calls


def _token_exact(call: dict[str, Any], framework: str) -> None:
    """The stored call has the server's token ids and logprobs, and was sampled at temperature 1."""
    assert call["framework"] == framework
    assert call["prompt_token_ids"] and call["completion_token_ids"]
    assert len(call["logprobs"]) == len(call["completion_token_ids"])
    assert call["response_model"] == "policy"
    assert call["request"]["params"]["temperature"] == 1.0


def _tool_names(call: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in call["request"]["tools"])


# ------------------------------------------------------------------------------------------------------
# The raw OpenAI client
# ------------------------------------------------------------------------------------------------------


def test_openai_recipe_records_token_ids_with_its_timeout(policy_env: str) -> None:
    from integrations.openai import policy_client, policy_model

    client = policy_client()
    assert (str(client.base_url).rstrip("/"), client.timeout, client.max_retries) == (policy_env, 600.0, 2)
    with sdk.session(task_id="openai"):
        reply = client.chat.completions.create(
            model=policy_model(), messages=QUESTION, temperature=1.0, max_tokens=6
        )
    assert reply.choices[0].message.role == "assistant"
    (call,) = _calls("openai")
    _token_exact(call, "openai")


def test_openai_recipe_tools_reach_the_server(policy_env: str) -> None:
    from integrations.openai import policy_client, policy_model

    tools = [
        {"type": "function", "function": {"name": name, "description": f"{name} two numbers.", "parameters": {
            "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]}}}
        for name in ("add", "mul")
    ]  # fmt: skip
    with sdk.session(task_id="openai-tools"):
        policy_client().chat.completions.create(
            model=policy_model(), messages=QUESTION, tools=tools, temperature=1.0, max_tokens=6
        )
    (call,) = _calls("openai-tools")
    assert _tool_names(call) == ["add", "mul"]
    _token_exact(call, "openai")


def test_async_client_and_unset_environment(policy_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from integrations.openai import policy_client, policy_model

    async def one() -> str:
        async with policy_client(async_=True) as client:
            reply = await client.chat.completions.create(
                model=policy_model(), messages=QUESTION, temperature=1.0, max_tokens=4
            )
            return reply.model

    with sdk.session(task_id="async"):
        assert asyncio.run(one()) == "policy"
    _token_exact(_calls("async")[0], "openai")

    monkeypatch.delenv(_env.TRACERL_POLICY_BASE_URL)
    monkeypatch.delenv(_env.TRACERL_POLICY_MODEL)
    assert policy_model() == "policy"
    with pytest.raises(RuntimeError, match="TRACERL_POLICY_BASE_URL is not set: run the agent through"):
        policy_client()


# ------------------------------------------------------------------------------------------------------
# LangChain
# ------------------------------------------------------------------------------------------------------


def test_langchain_recipe_records_token_ids_with_its_timeout(policy_env: str) -> None:
    pytest.importorskip("langchain_openai")
    from integrations.langchain import policy_chat_model

    llm = policy_chat_model(max_tokens=6)
    assert (llm.model_name, llm.temperature, llm.request_timeout, llm.max_retries) == (
        "policy",
        1.0,
        600.0,
        2,
    )
    assert (llm.root_client.timeout, llm.root_async_client.timeout) == (600.0, 600.0)
    with sdk.session(task_id="langchain"):
        reply = llm.invoke(QUESTION)
    assert reply.response_metadata["logprobs"]  # LangChain's own view has them too
    (call,) = _calls("langchain")
    _token_exact(call, "langchain")


def test_langchain_agent_with_tools(policy_env: str) -> None:
    pytest.importorskip("langchain_openai")
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from integrations.langchain import policy_chat_model

    @tool
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @tool
    def mul(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    agent = create_agent(model=policy_chat_model(max_tokens=6), tools=[add, mul])
    with sdk.session(task_id="langchain-tools"):
        try:
            agent.invoke({"messages": QUESTION}, config={"recursion_limit": 3})
        except Exception as exc:  # random text may be a tool call that runs past the limit
            assert type(exc).__name__ == "GraphRecursionError"
    call = _calls("langchain-tools")[0]
    assert _tool_names(call) == ["add", "mul"]
    _token_exact(call, "langchain")


# ------------------------------------------------------------------------------------------------------
# LlamaIndex
# ------------------------------------------------------------------------------------------------------


def test_llama_index_recipe_records_token_ids_with_its_timeout(policy_env: str) -> None:
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage

    from integrations.llama_index import policy_llm

    llm = policy_llm(max_tokens=6)
    assert (llm.model, llm.temperature, llm.timeout, llm.max_retries) == ("policy", 1.0, 600.0, 2)
    assert llm.metadata.is_chat_model and llm.metadata.is_function_calling_model
    assert llm._get_client().timeout == 600.0
    with sdk.session(task_id="llama-index"):
        reply = llm.chat([ChatMessage(role="user", content=QUESTION[0]["content"])])
    assert reply.message.role == "assistant"
    (call,) = _calls("llama-index")
    _token_exact(call, "openai")  # the recording client alone (instrument_llama_index adds LlamaIndex's view)


def test_llama_index_function_agent_with_tools(policy_env: str) -> None:
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.agent import FunctionAgent
    from llama_index.core.tools import FunctionTool

    from integrations.llama_index import instrument_llama_index, policy_llm, uninstrument_llama_index

    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    def mul(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    tools = [FunctionTool.from_defaults(fn=f) for f in (add, mul)]
    agent = FunctionAgent(tools=tools, llm=policy_llm(max_tokens=6), timeout=60)

    async def run() -> None:
        with sdk.session(task_id="llama-index-tools"):
            try:
                await agent.run(QUESTION[0]["content"], max_iterations=2)
            except Exception as exc:  # random text may be a tool call that runs past the limit
                assert "max iterations" in str(exc).lower(), exc

    instrument_llama_index()
    try:
        asyncio.run(run())
    finally:
        uninstrument_llama_index()
    call = _calls("llama-index-tools")[0]
    assert _tool_names(call) == ["add", "mul"]
    _token_exact(call, "llama_index")


# ------------------------------------------------------------------------------------------------------
# Strands
# ------------------------------------------------------------------------------------------------------


def test_strands_recipe_and_agent_with_tools(policy_env: str) -> None:
    pytest.importorskip("strands")
    from strands import Agent, tool
    from strands.types.exceptions import MaxTokensReachedException

    from integrations.strands import TracerlHookProvider, policy_model

    @tool
    def add(a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    @tool
    def mul(a: float, b: float) -> float:
        """Multiply two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a * b

    model = policy_model(params={"max_tokens": 6})
    assert model.get_config()["model_id"] == "policy"
    assert (model._custom_client.timeout, model._custom_client.max_retries) == (600.0, 2)
    # Two sync calls: Strands runs each on an event loop of its own, with the same client (kept alive).
    for k in range(2):
        agent = Agent(model=model, tools=[add, mul], callback_handler=None, hooks=[TracerlHookProvider()])
        with sdk.session(task_id=f"strands-{k}"):
            try:
                agent("What is 3 plus 4?")
            except MaxTokensReachedException:  # Strands raises on finish_reason "length" (6 tokens here)
                pass
        call = _calls(f"strands-{k}")[0]
        assert _tool_names(call) == ["add", "mul"]
        _token_exact(call, "strands")


def test_sync_agents_on_loops_of_their_own_at_once(policy_env: str) -> None:
    # Strands' agent(...) and an agent function that asyncio.run()s LlamaIndex each run on an event loop of
    # their own, and the runner runs several in threads: one shared async client failed some of them with
    # APIConnectionError; the recipes give each running loop its own client.
    pytest.importorskip("strands")
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    from integrations.llama_index import policy_llm
    from integrations.strands import policy_model

    llm, model = policy_llm(max_tokens=4), policy_model(params={"max_tokens": 4})
    errors: list[str] = []
    clients: list[Any] = []

    async def llama() -> None:
        clients.append(llm._get_aclient()._current())
        await llm.achat([ChatMessage(role="user", content="hi")])

    def worker(k: int) -> None:
        for _ in range(3):
            try:
                asyncio.run(llama())
                Agent(model=model, callback_handler=None)("hi")
            except MaxTokensReachedException:
                pass
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len({id(c) for c in clients}) > 1  # loops at once: clients of their own


# ------------------------------------------------------------------------------------------------------
# What the extras install
# ------------------------------------------------------------------------------------------------------


def test_the_extras_install_what_the_recipes_import() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {r.split(">")[0].split("<")[0].split("=")[0].split(";")[0].strip() for r in extras[extra]}

    assert "llama-index-llms-openai-like" in names("llamaindex")
    assert "langchain-openai" in names("langchain")
    assert {"strands-agents", "tracerl[openai]"} <= names("strands")  # OpenAIModel needs openai
    assert all(f in extras["all"][0] for f in ("langchain", "llamaindex", "strands", "openai"))
    assert extras["dev"][0] == "tracerl[all]"
    pins = (ROOT / "tests" / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("llama-index-llms-openai-like==") for line in pins)
