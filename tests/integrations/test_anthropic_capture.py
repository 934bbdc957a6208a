"""The `anthropic` SDK captured in process by wrap_anthropic: sync, async, streamed, errors, agent names."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

import sdk  # noqa: E402
from integrations.anthropic import wrap_anthropic  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


def _calls(store: Path) -> list[dict[str, Any]]:
    sdk.flush()
    return [c for s in StoreReader(store).sessions() for c in s.calls]


def test_sync_async_and_streamed_calls_are_recorded(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    base = openai_server.url
    client = wrap_anthropic(anthropic.Anthropic(base_url=base, api_key="x", max_retries=0), agent="writer")
    assert wrap_anthropic(client) is client  # idempotent
    aclient = wrap_anthropic(anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0))
    openai_server.enqueue(
        ScriptedResponse.text("one"), ScriptedResponse.text("two"), ScriptedResponse.text("three"),
        ScriptedResponse.text("four"),
    )  # fmt: skip

    async def async_calls() -> list[str]:
        reply = await aclient.messages.create(model="m", max_tokens=9, messages=HI)
        async with aclient.messages.stream(model="m", max_tokens=9, messages=HI) as s:
            streamed = await s.get_final_message()
        return [reply.content[0].text, streamed.content[0].text]

    with sdk.session(task_id="t"):
        first = client.messages.create(model="m", max_tokens=9, messages=HI).content[0].text
        events = list(client.messages.create(model="m", max_tokens=9, messages=HI, stream=True))
        rest = asyncio.run(async_calls())
    assert [first, *rest] == ["one", "three", "four"] and events[-1].type == "message_stop"
    calls = _calls(store)
    assert [c["response"]["message"]["content"] for c in calls] == ["one", "two", "three", "four"]
    assert [c["stream"] for c in calls] == [False, True, False, True]
    assert all(c["endpoint"] == "messages" and c["framework"] == "anthropic" for c in calls)
    assert [c["agent"] for c in calls] == ["writer", "writer", None, None]
    assert calls[0]["request"]["messages"] == HI and calls[0]["request"]["params"] == {"max_tokens": 9}
    assert calls[0]["usage"]["prompt_tokens"] > 0 and calls[0]["response"]["finish_reason"] == "stop"


def test_an_error_is_a_failed_call_and_the_user_s_error(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    client = wrap_anthropic(anthropic.Anthropic(base_url=openai_server.url, api_key="x", max_retries=0))
    openai_server.enqueue(ScriptedResponse.error(429, "slow down"))
    with sdk.session(task_id="t"), pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="m", max_tokens=9, messages=HI)
    (call,) = _calls(store)
    assert call["error"]["status"] == 429 and call["response"]["message"] is None
