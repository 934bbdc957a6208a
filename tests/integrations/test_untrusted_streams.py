"""Issue 53, in process: stream events the recording transports cannot read never lose the call.

``wrap_anthropic`` and ``wrap_openai`` (the real SDKs) against a raw HTTP/1.1 server on 127.0.0.1 whose
streams carry an event nested 5,000 levels deep, or a chunk of the wrong shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from integrations.anthropic import wrap_anthropic  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402

DEEP = b"[" * 5000 + b"]" * 5000
HI = [{"role": "user", "content": "hi"}]


def _sse(payload: bytes, event: str | None = None) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + payload + b"\n\n"


MESSAGES = (
    _sse(
        b'{"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","model":"raw",'
        b'"content":[],"usage":{"input_tokens":3,"output_tokens":0}}}',
        "message_start",
    )
    + _sse(
        b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        "content_block_start",
    )
    + _sse(DEEP)  # nameless: the anthropic SDK ignores it, as the recorder must
    + _sse(
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}',
        "content_block_delta",
    )
    + _sse(b'{"type":"content_block_stop","index":0}', "content_block_stop")
    + _sse(
        b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}',
        "message_delta",
    )
    + _sse(b'{"type":"message_stop"}', "message_stop")
)


def _chat(bad: bytes) -> bytes:
    good = json.dumps({"model": "raw", "choices": [{"index": 0, "delta": {"content": "hel"}}]}).encode()
    end = json.dumps(
        {"model": "raw", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    ).encode()
    return _sse(good) + _sse(bad) + _sse(end) + b"data: [DONE]\n\n"


STREAMS = {"messages": MESSAGES, "deep": _chat(DEEP), "choices-int": _chat(b'{"choices": [1]}')}


@pytest.fixture(scope="module")
def raw_url() -> Iterator[str]:
    def canned(req: dict[str, Any], endpoint: str) -> ScriptedResponse:
        return ScriptedResponse.raw(STREAMS[req["model"]], content_type="text/event-stream")

    with ScriptedOpenAIServer(policy=canned) as server:
        yield server.url


def _calls(store: Path) -> list[dict[str, Any]]:
    sdk.flush()
    return [c for s in StoreReader(store).sessions() for c in s.calls]


def test_item11_a_nameless_deep_event_is_ignored_and_the_call_stored(store: Path, raw_url: str) -> None:
    client = wrap_anthropic(anthropic.Anthropic(base_url=raw_url, api_key="x", max_retries=0))
    before = sdk.stats()  # the process's counters: earlier tests' counts included
    with sdk.session(task_id="t"):
        with client.messages.stream(model="messages", max_tokens=9, messages=HI) as stream:
            assert "".join(stream.text_stream) == "hello"
    (call,) = _calls(store)
    assert call["error"] is None and call["response"]["message"]["content"] == "hello"
    assert call["response"]["finish_reason"] == "stop"
    stats = sdk.stats()
    assert stats["internal_errors"] == before.get("internal_errors", 0)
    assert stats["anthropic_stream_events_unnamed"] == before.get("anthropic_stream_events_unnamed", 0) + 1


@pytest.mark.parametrize("model", ["deep", "choices-int"])
def test_an_unreadable_chat_chunk_is_a_stored_failed_call(store: Path, raw_url: str, model: str) -> None:
    client = wrap_openai(openai.OpenAI(base_url=raw_url + "/v1", api_key="x", max_retries=0))
    errors = sdk.stats().get("internal_errors", 0)
    with sdk.session(task_id="t"):
        try:  # the client fails on the chunk (or hands it over as it is): the agent's business
            for chunk in client.chat.completions.create(model=model, messages=HI, stream=True):
                [c.delta for c in chunk.choices]
        except Exception:
            pass
    (call,) = _calls(store)  # never lost
    assert call["error"]["type"] == "malformed_stream" and call["response"]["finish_reason"] is None
    assert call["request"]["messages"] == HI and sdk.stats()["internal_errors"] == errors
