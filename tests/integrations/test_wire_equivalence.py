"""One conversation sent as chat completions, as the Responses API and as Anthropic Messages: one episode.

System prompt, user question, a turn with text and a tool call in one output, the tool's result, a final
answer; the server scripts the same tool-call id for each. Each API's own client (openai, anthropic)
sends it as its API has it, recorded in process; the episodes are compared whole: messages and the tools
JSON, byte for byte. Also through the gateway (forwarded and translated Messages calls, and Responses).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("polars")

import sdk  # noqa: E402
from integrations.anthropic import wrap_anthropic  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.episodes import build_episodes  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402

SYSTEM, QUESTION, ANSWER = "You add.", "What is 2 + 3?", "2 + 3 = 5."
PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": PARAMS}}]


def _script(server: ScriptedOpenAIServer) -> None:
    server.reset()
    server.enqueue(
        ScriptedResponse.tool_calls(
            [{"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}], "Let me add."
        ),
        ScriptedResponse.text(ANSWER),
    )


def _chat(base_url: str) -> None:
    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    for _ in range(2):
        msg = (
            client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS).choices[0].message
        )
        messages.append(msg.model_dump(exclude_none=True, exclude={"refusal", "annotations"}))
        for tc in msg.tool_calls or ():
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(args["a"] + args["b"])})


def _responses(base_url: str) -> None:
    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))
    tools = [{"type": "function", **CHAT_TOOLS[0]["function"]}]
    items: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for _ in range(2):
        reply = client.responses.create(model="m", instructions=SYSTEM, input=items, tools=tools)
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        for o in reply.output:
            if o.type == "function_call":
                args = json.loads(o.arguments)
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": o.call_id,
                        "output": str(args["a"] + args["b"]),
                    }
                )


def _anthropic(base_url: str, *, stream: bool = False) -> None:
    client = wrap_anthropic(
        anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="x", max_retries=0)
    )
    tools = [{"name": "add", "description": "Add.", "input_schema": PARAMS}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for _ in range(2):
        kwargs = {"model": "m", "max_tokens": 64, "system": SYSTEM, "tools": tools, "messages": messages}
        if stream:
            with client.messages.stream(**kwargs) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": str(b.input["a"] + b.input["b"])}
            for b in reply.content
            if b.type == "tool_use"
        ]
        if results:
            messages.append({"role": "user", "content": results})


def _episode(tmp_path: Path, name: str, agent: Any) -> dict[str, Any]:
    store = tmp_path / name
    sdk.configure(store=store, fsync="never")
    try:
        with ScriptedOpenAIServer() as server:
            _script(server)
            with sdk.session(task_id="add") as s:
                agent(server.base_url)
                s.reward(1.0)
    finally:
        sdk.shutdown()
    [ep] = build_episodes(store)
    return ep


def test_one_conversation_three_apis_one_episode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    chat = _episode(tmp_path, "chat", _chat)
    others = {
        "responses": _episode(tmp_path, "responses", _responses),
        "anthropic": _episode(tmp_path, "anthropic", _anthropic),
        "anthropic-stream": _episode(tmp_path, "anthropic-stream", lambda url: _anthropic(url, stream=True)),
    }
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("system", SYSTEM), ("user", QUESTION), ("assistant", "Let me add."), ("tool", "5"), ("assistant", ANSWER)
    ]  # fmt: skip
    for name, ep in others.items():
        assert ep["messages"] == chat["messages"], name
        assert ep["tools"] == chat["tools"], name
        assert len(ep["turns"]) == len(chat["turns"]) == 2, name
