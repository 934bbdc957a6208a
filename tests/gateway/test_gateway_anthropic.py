"""Anthropic's Messages API through the gateway, driven by the real `anthropic` SDK.

Two set-ups: forwarded to an Anthropic-compatible upstream (the scripted server serves /v1/messages), and
translated to chat completions for an OpenAI-compatible upstream (`--anthropic-to-chat`). Each call is
stored as the Messages call it is and builds the same OpenAI-format episode as chat completions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

from sdk.episodes import build_episodes  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import Gateway, new_id, start_gateway  # noqa: E402
from tests.support.tools import ANTHROPIC_ADD_TOOL  # noqa: E402

TOOLS = [ANTHROPIC_ADD_TOOL]
SYSTEM = [{"type": "text", "text": "You are a calculator."}]


@pytest.fixture(scope="module", params=["forward", "chat"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with ScriptedOpenAIServer() as server:
        args = ("--anthropic-to-chat",) if request.param == "chat" else ()
        store = tmp_path_factory.mktemp(f"anthropic-{request.param}") / "store"
        gw = start_gateway(server.base_url, store, args=args)
        try:
            yield request.param, server, gw
        finally:
            gw.stop()


def _client(gw: Gateway, sid: str, *, async_: bool = False) -> Any:
    cls = anthropic.AsyncAnthropic if async_ else anthropic.Anthropic
    return cls(base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0)


def _tool_round_trip(client: Any, *, stream: bool) -> str:
    """An agent loop: the model calls `add`, the agent runs it and sends the result back."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    for _ in range(3):
        kwargs = {"model": "claude-local", "max_tokens": 64, "system": SYSTEM, "tools": TOOLS}
        if stream:
            with client.messages.stream(messages=messages, **kwargs) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(messages=messages, **kwargs)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": str(u.input["a"] + u.input["b"])}
            for u in uses
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("no final answer")


def _episode(gw: Gateway, sid: str) -> dict[str, Any]:
    [ep] = [e for e in build_episodes(gw.store) if e["session_id"] == sid]
    return ep


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip_is_one_episode(setup: Any, stream: bool) -> None:
    mode, server, gw = setup
    server.reset()
    server.enqueue(
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}], content="Let me add."),
        ScriptedResponse.text("2 + 3 = 5."),
    )
    sid = new_id()
    answer = _tool_round_trip(_client(gw, sid), stream=stream)
    assert answer == "2 + 3 = 5."
    gw.reward(sid, 1.0)
    gw.end(sid)
    calls = gw.session(sid).calls
    assert [c["endpoint"] for c in calls] == ["messages", "messages"]
    assert all(c["request"]["params"]["max_tokens"] == 64 and c["stream"] is stream for c in calls)
    assert calls[0]["response"]["finish_reason"] == "tool_calls"
    ep = _episode(gw, sid)
    assert ep["reward"] == 1.0
    roles = [(m["role"], m.get("content")) for m in ep["messages"]]
    assert roles == [
        ("system", "You are a calculator."),
        ("user", "What is 2 + 3?"),
        ("assistant", "Let me add."),
        ("tool", "5"),
        ("assistant", "2 + 3 = 5."),
    ]
    call = ep["messages"][2]["tool_calls"][0]
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    tools = json.loads(ep["tools"])
    assert tools[0]["function"]["name"] == "add" and tools[0]["function"]["parameters"]["required"] == [
        "a",
        "b",
    ]
    # What the upstream was asked: the Messages call itself, or its chat completions translation.
    paths = [r.path for r in server.requests]
    assert paths == (["/v1/messages"] * 2 if mode == "forward" else ["/v1/chat/completions"] * 2)


def test_async_client_and_thinking(setup: Any) -> None:
    _, server, gw = setup
    server.reset()
    server.enqueue(ScriptedResponse.text("Paris.", reasoning_content="The capital of France."))
    sid = new_id()

    async def run() -> Any:
        client = _client(gw, sid, async_=True)
        return await client.messages.create(
            model="claude-local", max_tokens=32, messages=[{"role": "user", "content": "Capital of France?"}]
        )

    reply = asyncio.run(run())
    assert [b.type for b in reply.content] == ["thinking", "text"]
    gw.reward(sid, 0.5)
    ep = _episode(gw, sid)
    last = ep["messages"][-1]
    assert last["content"] == "Paris." and last["reasoning_content"] == "The capital of France."


@pytest.mark.parametrize("mode", ["forward", "chat"])
def test_token_agent_and_policy_version_as_on_the_chat_route(mode: str, tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with ScriptedOpenAIServer(model_suffix="") as server:
        args = ("--auth-token-file", str(token), *(("--anthropic-to-chat",) if mode == "chat" else ()))
        gw = start_gateway(server.base_url, tmp_path / "store", args=args)
        try:
            sid = new_id()
            hi = {"model": "policy@v3", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
            bare = anthropic.Anthropic(base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0)
            with pytest.raises(anthropic.AuthenticationError):
                bare.messages.create(**hi)
            headers = {"X-Tracerl-Gateway-Token": "s3cret", "X-Tracerl-Agent": "coder"}
            client = anthropic.Anthropic(
                base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0, default_headers=headers
            )
            assert client.messages.create(**hi).content[0].text == "You said: hi"
            (call,) = gw.session(sid).calls
        finally:
            gw.stop()
    assert call["agent"] == "coder" and call["policy_version"] == 3
    assert len(server.requests) == 1  # the refused call never reached the upstream
