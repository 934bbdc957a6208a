"""Issue 53, the gateway's half: cut and malformed streams, one content-type, errors in the route's
format, ``previous_response_id`` named, and a control token for rewards and ends.

Real clients (the ``anthropic`` and ``openai`` SDKs, httpx) against a real gateway process in front of
upstreams on 127.0.0.1: a raw HTTP/1.1 server that can cut a chunked stream mid-event, and an aiohttp
server (which enforces RFC 9110's one ``Content-Type``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402
from aiohttp import web  # noqa: E402

from sdk.episodes import export  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import Gateway, new_id, start_gateway  # noqa: E402

DEEP = b"[" * 5000 + b"]" * 5000
HI = [{"role": "user", "content": "hi"}]


def _sse(payload: bytes, event: str | None = None) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + payload + b"\n\n"


def _chunk(delta: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": finish}
    return _sse(json.dumps({"model": "raw", "choices": [choice]}).encode())


M_START = _sse(
    b'{"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","model":"raw",'
    b'"content":[],"usage":{"input_tokens":3,"output_tokens":0}}}',
    "message_start",
)
M_BLOCK = _sse(
    b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
    "content_block_start",
)
M_DELTA = _sse(
    b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}',
    "content_block_delta",
)
M_END = (
    _sse(b'{"type":"content_block_stop","index":0}', "content_block_stop")
    + _sse(
        b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}',
        "message_delta",
    )
    + _sse(b'{"type":"message_stop"}', "message_stop")
)
R_CREATED = _sse(
    b'{"type":"response.created","response":{"id":"r1","status":"in_progress","output":[]}}',
    "response.created",
)
R_DELTA = _sse(
    b'{"type":"response.output_text.delta","item_id":"i1","output_index":0,"content_index":0,"delta":"hel"}',
    "response.output_text.delta",
)

# model name -> (content type, body, cut): a cut stream stops mid-event, its chunked encoding unfinished.
CANNED: dict[str, tuple[str, bytes, bool]] = {
    "cut-messages": ("text/event-stream", M_START + M_BLOCK + M_DELTA[:30], True),
    "cut-chat": ("text/event-stream", _chunk("hel") + _chunk("lo")[:25], True),
    "cut-responses": ("text/event-stream", R_CREATED + R_DELTA[:40], True),
    # Translated streams with one chunk that cannot be read, between good ones.
    "deep-chunk": (
        "text/event-stream",
        _chunk("hel") + _sse(DEEP) + _chunk("", "stop") + b"data: [DONE]\n\n",
        False,
    ),
    "choices-int": (
        "text/event-stream",
        _chunk("hel") + _sse(b'{"choices": [1]}') + _chunk("", "stop"),
        False,
    ),
    "delta-str": (
        "text/event-stream",
        _chunk("hel") + _sse(b'{"choices": [{"index": 0, "delta": "x"}]}') + _chunk("", "stop"),
        False,
    ),
    "function-str": (
        "text/event-stream",
        _chunk("hel")
        + _sse(b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]}')
        + _chunk("", "stop"),
        False,
    ),
    "deep-answer": ("application/json", b'{"id": "c1", "choices": [], "x": ' + DEEP + b"}", False),
    # A Messages stream with a nameless event nested 5,000 deep: the anthropic SDK ignores it.
    "nameless-deep": ("text/event-stream", M_START + M_BLOCK + _sse(DEEP) + M_DELTA + M_END, False),
}


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[str]:
    """Answers each request with the canned body its model names, chunked (or cut mid-stream)."""

    def canned(req: dict[str, Any], endpoint: str) -> ScriptedResponse:
        content_type, data, cut = CANNED[req["model"]]
        return ScriptedResponse.raw(data, content_type=content_type, framing="cut" if cut else "chunked")

    with ScriptedOpenAIServer(policy=canned) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def forward_gw(raw_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(raw_upstream, tmp_path_factory.mktemp("fwd") / "store")
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def chat_gw(raw_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(raw_upstream, tmp_path_factory.mktemp("chat") / "store", args=("--anthropic-to-chat",))
    try:
        yield gw
    finally:
        gw.stop()


def _anthropic(gw: Gateway, sid: str) -> Any:
    return anthropic.Anthropic(base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0)


def _no_traceback(gw: Gateway) -> None:
    time.sleep(0.3)  # log lines are written by the gateway process
    assert not any("Traceback" in line or "Exception in ASGI" in line for line in gw.output), gw.output


# --- item 7: a stream cut mid-event ---------------------------------------------------------------------


@pytest.mark.parametrize("route", ["messages", "translated", "responses"])
def test_item7_a_cut_stream_is_a_failed_call_an_error_event_and_no_traceback(
    forward_gw: Gateway, chat_gw: Gateway, route: str
) -> None:
    gw, sid = (chat_gw if route == "translated" else forward_gw), new_id()
    if route == "responses":
        client = openai.OpenAI(base_url=forward_gw.base(sid), api_key="x", max_retries=0)
        # The Responses API's own error event ends the stream, not a broken connection.
        events = list(client.responses.create(model="cut-responses", input="hi", stream=True))
        assert events[-1].type == "error" and "stream broke" in events[-1].message
    else:
        model = "cut-chat" if route == "translated" else "cut-messages"
        with pytest.raises(anthropic.APIStatusError, match="stream broke"):
            with _anthropic(gw, sid).messages.stream(model=model, max_tokens=9, messages=HI) as stream:
                "".join(stream.text_stream)
    (call,) = gw.session(sid).calls
    assert call["error"]["type"] == "RemoteProtocolError" and call["response"]["finish_reason"] is None
    assert call["endpoint"] == ("responses" if route == "responses" else "messages")
    _no_traceback(gw)


# --- item 8: a translated chunk that cannot be read ---------------------------------------------------


@pytest.mark.parametrize("model", ["deep-chunk", "choices-int", "delta-str", "function-str"])
def test_item8_an_unreadable_translated_chunk_is_a_stored_failed_call(chat_gw: Gateway, model: str) -> None:
    sid = new_id()
    with pytest.raises(anthropic.APIStatusError, match="cannot be read"):
        with _anthropic(chat_gw, sid).messages.stream(model=model, max_tokens=9, messages=HI) as stream:
            "".join(stream.text_stream)
    (call,) = chat_gw.session(sid).calls  # stored, as the forwarded route stores the same chunks
    assert call["endpoint"] == "messages" and call["error"]["type"] == "malformed_stream"
    assert call["response"]["finish_reason"] is None  # never trained as a complete turn
    assert call["request"]["messages"] == HI
    stats = httpx.get(chat_gw.url + "/stats", timeout=30).json()["store"]
    assert stats["internal_errors"] == 0
    _no_traceback(chat_gw)


# --- item 9: a translated answer nested 5,000 deep -----------------------------------------------------


def test_item9_a_deep_translated_answer_is_an_anthropic_error_body(chat_gw: Gateway) -> None:
    sid = new_id()
    body = {"model": "deep-answer", "max_tokens": 9, "messages": HI}
    r = httpx.post(f"{chat_gw.url}/sessions/{sid}/v1/messages", json=body, timeout=30)
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    assert r.json()["type"] == "error" and "nested too deeply" in r.json()["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as err:  # the SDK reads it as an API error
        _anthropic(chat_gw, new_id()).messages.create(**body)
    assert err.value.status_code == 502 and err.value.body["type"] == "error"
    (call,) = chat_gw.session(sid).calls
    assert call["error"]["type"] == "invalid_body"
    _no_traceback(chat_gw)


def test_item9_errors_on_the_messages_route_are_anthropic_bodies(chat_gw: Gateway, tmp_path: Path) -> None:
    deep = b'{"model": "m", "max_tokens": 9, "messages": ' + DEEP + b"}"
    r = httpx.post(f"{chat_gw.url}/v1/messages", content=deep, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    (tmp_path / "token").write_text("s3cret")
    with ScriptedOpenAIServer() as server:
        gw = start_gateway(
            server.base_url, tmp_path / "store", args=("--auth-token-file", str(tmp_path / "token"))
        )
        try:
            body = {"model": "m", "max_tokens": 9, "messages": HI}
            r = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30)
            assert r.status_code == 401 and r.json()["type"] == "error"
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": HI}, timeout=30)
            assert r.status_code == 401 and "message" in r.json()["error"]  # OpenAI's format there
        finally:
            gw.stop()
    _no_traceback(chat_gw)


# --- item 11 (through the gateway too): a nameless event the client ignores -------------------------


def test_a_nameless_deep_event_on_a_forwarded_messages_stream_keeps_the_call(forward_gw: Gateway) -> None:
    sid = new_id()
    with _anthropic(forward_gw, sid).messages.stream(model="nameless-deep", max_tokens=9, messages=HI) as s:
        assert "".join(s.text_stream) == "hello"
    (call,) = forward_gw.session(sid).calls
    assert call["error"] is None and call["response"]["message"]["content"] == "hello"


# --- item 6: one content-type upstream ------------------------------------------------------------------


class _StrictUpstream:
    """An aiohttp server on 127.0.0.1 (RFC 9110: one Content-Type, else its parser answers 400)."""

    def __init__(self) -> None:
        self.content_types: list[list[str]] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        assert ready.wait(30)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def chat(request: web.Request) -> web.Response:
            self.content_types.append(request.headers.getall("Content-Type", []))
            body = await request.json()
            answer = {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "strict ok"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            }  # fmt: skip
            return web.json_response(answer)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_item6_translated_calls_send_one_content_type(tmp_path: Path) -> None:
    upstream = _StrictUpstream()
    gw = start_gateway(
        f"http://127.0.0.1:{upstream.port}/v1", tmp_path / "store", args=("--anthropic-to-chat",)
    )
    try:
        # The strict server refuses two Content-Type headers itself (the bug this guards against).
        two = httpx.post(
            f"http://127.0.0.1:{upstream.port}/v1/chat/completions",
            content=b'{"model": "m"}',
            headers=[("content-type", "application/json"), ("content-type", "application/json")],
            timeout=30,
        )
        assert two.status_code == 400
        sid = new_id()
        reply = _anthropic(gw, sid).messages.create(model="m", max_tokens=9, messages=HI)
        assert reply.content[0].text == "strict ok"
        (call,) = gw.session(sid).calls
        assert call["error"] is None and call["response"]["message"]["content"] == "strict ok"
    finally:
        gw.stop()
        upstream.close()
    assert upstream.content_types == [["application/json"]]


# --- item 10: previous_response_id named in the summary and the log -----------------------------------


def test_item10_previous_response_id_is_named_in_the_summary_and_logged_once(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(policy=lambda req, ep: ScriptedResponse.text("fine")) as server:
        gw = start_gateway(server.base_url, tmp_path / "store")
        try:
            sids = [new_id(), new_id()]
            for sid in sids:
                client = openai.OpenAI(base_url=gw.base(sid), api_key="x", max_retries=0)
                client.responses.create(model="m", input="go on", previous_response_id="resp_1")
                gw.reward(sid, 1.0)
                gw.end(sid)
            time.sleep(0.3)
            lines = [line for line in gw.output if "previous_response_id" in line]
        finally:
            gw.stop()
    summary = export(tmp_path / "store", tmp_path / "eps.parquet", rejects=tmp_path / "rejects.jsonl")
    assert summary.rejected == {"previous_response_id": 2}
    assert len(lines) == 1 and "stored without messages" in lines[0]
    row = json.loads((tmp_path / "rejects.jsonl").read_text().splitlines()[0])
    assert row["problems"][0]["code"] == "previous_response_id"


# --- item 3: rewards and ends need a credential the agent does not hold ------------------------------


def test_item3_rewards_and_ends_need_the_control_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("agent-token\n")
    (tmp_path / "control").write_text("trainer-token\n")
    args = ("--auth-token-file", str(tmp_path / "token"), "--control-token-file", str(tmp_path / "control"))
    with ScriptedOpenAIServer(policy=lambda req, ep: ScriptedResponse.text("fine")) as server:
        gw = start_gateway(server.base_url, tmp_path / "store", args=args)
        try:
            assert "control token" in gw.output[0]
            sid = new_id()
            agent = {"X-Tracerl-Gateway-Token": "agent-token"}
            client = openai.OpenAI(base_url=gw.base(sid), api_key="x", max_retries=0, default_headers=agent)
            assert client.chat.completions.create(model="m", messages=HI).choices[0].message.content == "fine"
            for route, body in (("reward", {"value": 1.0}), ("end", {})):
                url = f"{gw.url}/sessions/{sid}/{route}"
                # The agent's own token (header or URL prefix) does not let it score or end its session.
                assert httpx.post(url, json=body, headers=agent, timeout=30).status_code == 403
                prefixed = f"{gw.url}/token/agent-token/sessions/{sid}/{route}"
                assert httpx.post(prefixed, json=body, timeout=30).status_code == 403
                r = httpx.post(url, json=body, timeout=30)
                assert r.status_code == 401 and "control token" in r.json()["error"]["message"]
            # The agent's session is untouched: no reward, still open.
            s = gw.session(sid)
            assert s.rewards == [] and s.ended_at is None
            trainer = {"X-Tracerl-Control-Token": "trainer-token"}
            for route, body in (("reward", {"value": 1.0}), ("end", {})):
                r = httpx.post(f"{gw.url}/sessions/{sid}/{route}", json=body, headers=trainer, timeout=30)
                assert r.status_code == 200, r.text
            s = gw.session(sid)
            assert [r["value"] for r in s.rewards] == [1.0] and s.ended_at is not None
            # The control token is not a gateway token: model calls with it alone are refused.
            r = httpx.post(
                gw.base() + "/chat/completions", json={"model": "m", "messages": HI}, headers=trainer
            )
            assert r.status_code == 401
        finally:
            gw.stop()
    assert len(server.requests) == 1  # the control token never reached the upstream


def test_item3_the_control_token_must_differ_from_the_gateway_token(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "token").write_text("same\n")
    cmd = [sys.executable, "-m", "sdk.gateway", "--upstream", "http://127.0.0.1:9/v1", "--port", "0"]
    cmd += ["--auth-token-file", str(tmp_path / "token"), "--control-token-file", str(tmp_path / "token")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
