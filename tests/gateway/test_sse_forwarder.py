"""The gateway's SSE forwarder: whole events only, the terminal event held back, at any chunk boundary."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiohttp")

from sdk.gateway._sse import SSEForwarder as _SSEForwarder


def _event(payload: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(payload).encode() + b"\n\n"


CHAT = b"".join(_event({"choices": [{"delta": {"content": f"t{i} [DONE]"}}]}) for i in range(3))
CHAT_END = b"data: [DONE]\n\n"
RESPONSES = b"".join(
    _event({"type": "response.output_text.delta"}, "response.output_text.delta") for _ in range(3)
)
RESPONSES_END = _event({"type": "response.completed", "response": {}}, "response.completed")
MESSAGES = b"".join(
    _event(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "message_stop"}},
        "content_block_delta",
    )
    for _ in range(3)
)
MESSAGES_END = _event({"type": "message_stop"}, "message_stop")


@pytest.mark.parametrize(
    ("body", "end"), [(CHAT, CHAT_END), (RESPONSES, RESPONSES_END), (MESSAGES, MESSAGES_END)]
)
def test_every_split_point_forwards_whole_events_and_holds_the_terminal_one(body: bytes, end: bytes) -> None:
    stream = body + end
    for cut in range(len(stream) + 1):
        f = _SSEForwarder("chat.completions", frozenset())
        sent = f.feed(stream[:cut])
        sent += f.feed(stream[cut:])
        assert sent == body, cut  # everything before the terminal event, never a part of an event
        assert f.rest() == end, cut  # the terminal event only once the call is stored


@pytest.mark.parametrize(("body", "end"), [(CHAT, CHAT_END), (RESPONSES, RESPONSES_END)])
def test_small_reads_never_split_an_event(body: bytes, end: bytes) -> None:
    stream = body + end
    for size in range(1, 40):
        f = _SSEForwarder("chat.completions", frozenset())
        sent = [f.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert b"".join(sent) == body and f.rest() == end, size
        assert all(s.endswith(b"\n\n") for s in sent if s), size
