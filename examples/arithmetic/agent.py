"""The arithmetic agent, as ordinary application code: LangChain (``create_agent``) and raw ``openai``.

``solve`` / ``solve_openai`` are the entry points ``sdk.rollout`` and the loop call: a task dict in, the
final answer out (``examples.arithmetic.task:reward_fn`` scores it).

Both talk to any OpenAI-compatible endpoint (``python -m sdk.serve``); nothing here knows about training.
``ARITHMETIC_TOOL_LATENCY_S`` makes each calculator call wait that long, as a real tool would (the
asynchronous-loop benchmark sets it; read from the environment so that agents in the loop's collector and
validation processes wait too). They ask for logprobs and vLLM-style token ids (``return_token_ids``), which
the server returns and a capture layer can store.

Example:
    >>> agent = make_langchain_agent("http://127.0.0.1:8000/v1")           # doctest: +SKIP
    >>> run_langchain(agent, Task("t", "add", 2, 3))["answer"]             # doctest: +SKIP
    '5'
    >>> run_openai(openai.OpenAI(base_url=..., api_key="x"), Task("t", "add", 2, 3))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from examples.arithmetic.task import SYSTEM_PROMPT, TOOLS, Task, calculator, reward, task_from_dict
from trainers.serve.policy import ENV_BASE_URL, ENV_MODEL


def _lc_tools() -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        _tool_latency()
        return a + b

    @tool
    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        _tool_latency()
        return a * b

    return [add, mul]


def _tool_latency() -> None:
    """Wait ``ARITHMETIC_TOOL_LATENCY_S`` seconds (default 0), as a slow tool would."""
    delay = float(os.environ.get("ARITHMETIC_TOOL_LATENCY_S") or 0)
    if delay > 0:
        time.sleep(delay)


def make_langchain_agent(
    base_url: str,
    model: str = "policy",
    temperature: float = 1.0,
    max_tokens: int = 48,
    http_client: Any = None,
    tools: list[Any] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> Any:
    """A LangChain ``create_agent`` ReAct agent with the calculator tools on ``ChatOpenAI``.

    Args:
        base_url: ``http://127.0.0.1:PORT/v1``.
        model: model name sent in requests.
        temperature: sampling temperature (1.0 for RL collection).
        max_tokens: per-call completion cap.
        http_client: optional ``openai.DefaultHttpxClient`` (e.g. with a recording transport).
        tools: LangChain tools (default: this example's ``add`` and ``mul``).
        system_prompt: the agent's system prompt.

    Example:
        >>> agent = make_langchain_agent("http://127.0.0.1:8000/v1")  # doctest: +SKIP
    """
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    kwargs: dict[str, Any] = {}
    if http_client is not None:
        kwargs["http_client"] = http_client
    llm = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key="x",
        max_retries=0,
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=True,
        extra_body={"return_token_ids": True},
        **kwargs,
    )
    return create_agent(model=llm, tools=_lc_tools() if tools is None else tools, system_prompt=system_prompt)


def run_langchain(
    agent: Any, task: Task, max_steps: int = 6, callbacks: list[Any] | None = None
) -> dict[str, Any]:
    """Run the LangChain agent on one task; returns ``{"answer", "reward", "messages", "error"}``.

    ``callbacks`` are passed in the run config (e.g. ``[TracerlCallbackHandler()]`` to capture the run).

    Example:
        >>> run_langchain(agent, Task("t", "mul", 6, 7))["reward"]  # doctest: +SKIP
        1.0
    """
    from langchain_core.messages import AIMessage

    try:
        out = agent.invoke(
            {"messages": [{"role": "user", "content": task.question}]},
            config={"recursion_limit": max_steps, "callbacks": list(callbacks or [])},
        )
    except Exception as exc:
        return {"answer": None, "reward": 0.0, "messages": [], "error": f"{type(exc).__name__}: {exc}"}
    msgs = out["messages"]
    last = msgs[-1]
    answer = last.content if isinstance(last, AIMessage) and not last.tool_calls else None
    return {"answer": answer, "reward": reward(task, answer), "messages": msgs, "error": None}


def run_openai(
    client: Any,
    task: Task,
    model: str = "policy",
    temperature: float = 1.0,
    max_tokens: int = 48,
    max_turns: int = 3,
) -> dict[str, Any]:
    """The same agent on the raw ``openai`` client (a hand-written tool loop).

    Returns ``{"answer", "reward", "messages", "responses"}`` where ``responses`` are the raw
    response dicts (with ``prompt_token_ids``, ``choices[0].token_ids`` and logprobs).

    Example:
        >>> client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x")  # doctest: +SKIP
        >>> run_openai(client, Task("t", "add", 2, 3))["answer"]  # doctest: +SKIP
        '5'
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.question},
    ]
    responses: list[dict[str, Any]] = []
    answer: str | None = None
    for _ in range(max_turns):
        resp = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            temperature=temperature,
            max_tokens=max_tokens,
            logprobs=True,
            extra_body={"return_token_ids": True},
        ).model_dump()
        responses.append(resp)
        msg = resp["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        assistant: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
        if calls:
            assistant["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": dict(c["function"])} for c in calls
            ]
        messages.append(assistant)
        if not calls:
            answer = msg.get("content")
            break
        for c in calls:
            try:
                args = json.loads(c["function"]["arguments"])
            except json.JSONDecodeError:
                args = {}
            _tool_latency()
            result = calculator(c["function"]["name"], args if isinstance(args, dict) else {})
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return {"answer": answer, "reward": reward(task, answer), "messages": messages, "responses": responses}


# ----------------------------------------------------------------------------------------------------
# Entry points for sdk.rollout and the loop: one function, task dict in, final answer out
# ----------------------------------------------------------------------------------------------------

_AGENTS: dict[tuple[str, ...], Any] = {}
_AGENTS_LOCK = threading.Lock()


def _policy() -> tuple[str, str, float]:
    base_url = os.environ.get(ENV_BASE_URL)
    if not base_url:
        raise RuntimeError(f"{ENV_BASE_URL} is not set: run the agent through the loop or set it")
    model = os.environ.get(ENV_MODEL, "policy")
    return base_url, model, float(os.environ.get("ARITHMETIC_TEMPERATURE", "1.0"))


def _cached(kind: str, build: Any) -> Any:
    key = (kind, *map(str, _policy()))
    with _AGENTS_LOCK:
        if key not in _AGENTS:
            _AGENTS[key] = build(*_policy())
        return _AGENTS[key]


def solve(task: dict[str, Any]) -> str | None:
    """The LangChain agent on one task dict, captured by tracerl; returns its final answer.

    The policy endpoint comes from ``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL`` (set by the
    loop), the sampling temperature from ``ARITHMETIC_TEMPERATURE`` (default 1.0).

    Example:
        >>> solve({"id": "t", "op": "add", "a": 2, "b": 3})  # doctest: +SKIP
        '5'
    """

    def build(base_url: str, model: str, temperature: float) -> tuple[Any, list[Any]]:
        from integrations.langchain import TracerlCallbackHandler
        from integrations.openai import recording_http_client

        agent = make_langchain_agent(
            base_url, model=model, temperature=temperature, http_client=recording_http_client()
        )
        return agent, [TracerlCallbackHandler()]

    agent, callbacks = _cached("langchain", build)
    return run_langchain(agent, task_from_dict(task), callbacks=callbacks)["answer"]  # type: ignore[no-any-return]


def solve_openai(task: dict[str, Any]) -> str | None:
    """The raw ``openai`` agent on one task dict, captured with ``wrap_openai``; returns its final answer.

    Example:
        >>> solve_openai({"id": "t", "op": "mul", "a": 6, "b": 7})  # doctest: +SKIP
        '42'
    """

    def build(base_url: str, model: str, temperature: float) -> tuple[Any, str, float]:
        import openai

        from integrations.openai import wrap_openai

        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        wrap_openai(client)
        return client, model, temperature

    client, model, temperature = _cached("openai", build)
    return run_openai(client, task_from_dict(task), model=model, temperature=temperature)["answer"]  # type: ignore[no-any-return]
