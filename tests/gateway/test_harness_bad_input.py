"""Bad harness input through the gateway: a failed call or a count, never a traceback, never another's loss.

Malformed content blocks, a Responses call that leans on ``previous_response_id``, unknown stream event
types, a stream cut mid-event, and a ``tool_result`` without its ``tool_use``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("aiohttp")
pytest.importorskip("polars")

from sdk.episodes import export  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import Gateway, new_id, start_gateway  # noqa: E402

START = b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","model":"raw","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
BLOCK = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}\n\n'
UNKNOWN = b'event: brand_new_event\ndata: {"type":"brand_new_event","detail":1}\n\n'
END = (
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
STREAMS = {
    "unknown": START + BLOCK + UNKNOWN + DELTA + END,
    "cut": START + BLOCK + DELTA[: len(DELTA) // 2],  # the connection closes mid-event
    # A chat completions stream (for --anthropic-to-chat) cut before its finish chunk, mid-event.
    "chat-cut": b'data: {"model":"raw","choices":[{"index":0,"delta":{"role":"assistant","content":"hel"}}]}\n\n'
    b'data: {"model":"raw","choices":[{"index":0,"delta":{"content":"lo"',
}


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[str]:
    """An Anthropic-compatible upstream answering with the canned stream the request's model names."""

    def canned(req: dict[str, Any], endpoint: str) -> ScriptedResponse:
        return ScriptedResponse.raw(STREAMS[req["model"]], content_type="text/event-stream", framing="close")

    with ScriptedOpenAIServer(policy=canned) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def raw_gateway(raw_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Messages calls forwarded to the raw upstream's /v1/messages."""
    gw = start_gateway(raw_upstream, tmp_path_factory.mktemp("raw") / "store")
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def raw_chat_gateway(raw_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Messages calls translated to the raw upstream's /v1/chat/completions."""
    gw = start_gateway(
        raw_upstream, tmp_path_factory.mktemp("raw-chat") / "store", args=("--anthropic-to-chat",)
    )
    try:
        yield gw
    finally:
        gw.stop()


def _stream(gw: Gateway, sid: str, model: str) -> str:
    client = anthropic.Anthropic(base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0)
    with client.messages.stream(
        model=model, max_tokens=9, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        return "".join(stream.text_stream)


def test_unknown_stream_event_types_are_counted_and_the_call_kept(raw_gateway: Gateway) -> None:
    sid = new_id()
    assert _stream(raw_gateway, sid, "unknown") == "hello"
    (call,) = raw_gateway.session(sid).calls
    assert call["error"] is None and call["response"]["finish_reason"] == "stop"
    assert call["response"]["message"]["content"] == "hello"
    stats = httpx.get(raw_gateway.url + "/stats").json()["store"]
    assert stats["anthropic_stream_events_unknown"] >= 1


@pytest.mark.parametrize("translated", [False, True])
def test_a_stream_cut_mid_event_is_a_failed_call(
    raw_gateway: Gateway, raw_chat_gateway: Gateway, translated: bool
) -> None:
    gw, sid = (raw_chat_gateway if translated else raw_gateway), new_id()
    try:  # the client sees the stream end early (no message_stop), as it would without the gateway
        _stream(gw, sid, "chat-cut" if translated else "cut")
    except anthropic.APIError:
        pass
    (call,) = gw.session(sid).calls
    assert call["endpoint"] == "messages" and call["stream"] is True
    assert call["error"]["type"] in ("incomplete_stream", "RemoteProtocolError")
    assert call["response"]["finish_reason"] is None  # never trained as a complete turn
    # The gateway goes on serving: the next client's call is whole.
    other = new_id()
    assert _stream(raw_gateway, other, "unknown") == "hello"
    assert raw_gateway.session(other).calls[0]["error"] is None


def _outcome(gw: Gateway, sid: str, tmp_path: Path) -> str | None:
    """``"written"``, the code a session's episode was rejected with, or ``None`` (no episode)."""
    import json

    import polars as pl

    rejects = tmp_path / "rejects.jsonl"
    export(gw.store, tmp_path / "eps.parquet", rejects=rejects)
    if sid in pl.read_parquet(tmp_path / "eps.parquet")["session_id"].to_list():
        return "written"
    for line in rejects.read_text().splitlines() if rejects.exists() else []:
        row = json.loads(line)
        if row["episode"]["session_id"] == sid:
            return row["problems"][0]["code"]
    return None


@pytest.fixture(scope="module", params=["forward", "chat"])
def scripted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with ScriptedOpenAIServer() as server:
        args = ("--anthropic-to-chat",) if request.param == "chat" else ()
        gw = start_gateway(server.base_url, tmp_path_factory.mktemp("bad") / "store", args=args)
        try:
            yield request.param, server, gw
        finally:
            gw.stop()


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "mystery_block", "x": 1}],  # an unknown block type
        [1, 2],  # blocks that are not objects
        {"type": "text"},  # content that is neither a string nor a list
    ],
)
def test_malformed_content_blocks_are_stored_as_unmapped_calls(scripted: Any, content: Any) -> None:
    mode, _, gw = scripted
    sid = new_id()
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{gw.url}/sessions/{sid}/v1/messages", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"  # the upstream's or the gateway's answer
    (call,) = gw.session(sid).calls
    assert call["request"]["messages"] == [] and call["error"] is not None
    assert call["extra"]["malformed_request"]["request"]["messages"][0]["content"] == content
    assert (
        "cannot be mapped" in call["extra"]["malformed_request"]["problem"]
        or "not" in call["extra"]["malformed_request"]["problem"]
    )
    assert httpx.get(gw.url + "/stats").json()["store"]["requests_unmapped"] >= 1


def test_previous_response_id_is_a_counted_rejection(scripted: Any, tmp_path: Path) -> None:
    _, server, gw = scripted
    sid = new_id()
    body = {"model": "m", "previous_response_id": "resp_123", "input": [{"role": "user", "content": "go on"}]}
    headers = {"X-Tracerl-Task": "t"}
    r = httpx.post(f"{gw.url}/sessions/{sid}/v1/responses", json=body, headers=headers, timeout=30)
    assert r.status_code == 200  # forwarded as it is: the agent's call proceeds
    gw.reward(sid, 1.0)
    gw.end(sid)
    (call,) = gw.session(sid).calls
    assert call["request"]["messages"] == []
    assert call["extra"]["malformed_request"]["problem"].startswith("previous_response_id")
    assert httpx.get(gw.url + "/stats").json()["store"]["responses_previous_id"] >= 1
    assert _outcome(gw, sid, tmp_path) != "written"  # no episode on a prompt the server rendered itself


def test_tool_result_without_its_tool_use_rejects_the_episode(scripted: Any, tmp_path: Path) -> None:
    _, server, gw = scripted
    sid = new_id()
    client = anthropic.Anthropic(
        base_url=f"{gw.url}/sessions/{sid}",
        api_key="x",
        max_retries=0,
        default_headers={"X-Tracerl-Task": "t"},
    )
    messages = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "I will not call a tool."},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "5"}],
        },
    ]
    reply = client.messages.create(model="m", max_tokens=9, messages=messages)
    assert reply.content  # the agent's call proceeds
    gw.reward(sid, 1.0)
    gw.end(sid)
    (call,) = gw.session(sid).calls
    assert call["request"]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "toolu_nowhere",
        "content": "5",
    }
    assert _outcome(gw, sid, tmp_path) == "tool_result_without_call"
