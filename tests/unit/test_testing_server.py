"""The scripted OpenAI-compatible server, driven by the real openai clients."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import openai
import pytest

from sdk.testing import ScriptedOpenAIServer, ScriptedResponse, fake_tokenize, synthesize_arguments

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "number"}, "city": {"type": "string"}},
    "required": ["a", "b", "city"],
    "additionalProperties": False,
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "add", "parameters": PARAMS, "strict": True}}]
RESP_TOOLS = [{"type": "function", "name": "add", "parameters": PARAMS, "strict": True}]
USER = [{"role": "user", "content": "What is 2 + 3?"}]


def _unparsed(value: object) -> object:
    """Drop the ``parsed*`` fields the openai stream helpers add."""
    if isinstance(value, dict):
        return {k: _unparsed(v) for k, v in value.items() if not k.startswith("parsed")}
    return [_unparsed(v) for v in value] if isinstance(value, list) else value


@pytest.fixture
def client(openai_server: ScriptedOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)


def test_chat_text_model_usage_headers(openai_server: ScriptedOpenAIServer, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-test", messages=USER)
    r = raw.parse()
    assert raw.headers["content-type"] == "application/json"
    assert raw.headers["x-request-id"].startswith("req_") and r._request_id == raw.headers["x-request-id"]
    assert r.model == "gpt-test-2026-01-01" and r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.content == "You said: What is 2 + 3?" and msg.tool_calls is None
    assert r.choices[0].finish_reason == "stop" and r.choices[0].logprobs is None
    assert r.usage.completion_tokens == len(fake_tokenize(msg.content))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    assert "prompt_token_ids" not in (r.model_extra or {})
    (req,) = openai_server.requests
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == "Bearer x" and req.json["messages"] == USER


def test_chat_tool_call_loop_with_default_policy(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3, "city": "Paris"}
    again = client.chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS)
    assert again.choices[0].message.tool_calls[0].id == call.id  # deterministic per request

    history = [*USER, choice.message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    final = client.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS)
    assert final.choices[0].message.content == "Tool result: 5"
    assert final.choices[0].finish_reason == "stop"

    history += [final.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    turn2 = client.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS)
    assert turn2.choices[0].message.tool_calls[0].id != call.id  # unique across turns
    none = client.chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS, tool_choice="none")
    assert none.choices[0].message.content.startswith("You said:")


def test_synthesized_arguments_cover_schema_shapes() -> None:
    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "opt": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
            "unit": {"enum": ["c", "f"]},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "point": {"$ref": "#/$defs/P"},
        },
        "$defs": {"P": {"type": "object", "properties": {"z": {"type": "integer"}}}},
    }
    assert synthesize_arguments(schema) == {
        "x": 2, "opt": 3, "unit": "c", "flag": True, "tags": ["Paris"], "point": {"z": 4},
    }  # fmt: skip
    assert synthesize_arguments({}) == {}


def test_chat_logprobs_and_token_ids(client: openai.OpenAI) -> None:
    kwargs = {"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 3}
    r = client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
    content = r.choices[0].logprobs.content
    token_ids = r.choices[0].model_extra["token_ids"]
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert len(content) == len(token_ids) == r.usage.completion_tokens > 0
    assert len(prompt_ids) == r.usage.prompt_tokens > 0
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token
    assert token_ids == [i for _, i in fake_tokenize(r.choices[0].message.content)]
    again = client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
    assert again.model_extra["prompt_token_ids"] == prompt_ids
    assert again.choices[0].model_extra["token_ids"] == token_ids
    other = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}],
                                           extra_body={"return_token_ids": True})  # fmt: skip
    assert other.model_extra["prompt_token_ids"] != prompt_ids

    tool = client.chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS, logprobs=True,
                                          extra_body={"return_token_ids": True})  # fmt: skip
    n = tool.usage.completion_tokens
    assert len(tool.choices[0].logprobs.content) == len(tool.choices[0].model_extra["token_ids"]) == n


def test_reasoning_content_counts_as_reasoning_tokens(openai_server, client) -> None:
    openai_server.enqueue(ScriptedResponse.text("Paris.", reasoning_content="Think, then answer."))
    r = client.chat.completions.create(model="m", messages=USER, extra_body={"return_token_ids": True})
    assert r.choices[0].message.model_extra["reasoning_content"] == "Think, then answer."
    assert r.usage.completion_tokens_details.reasoning_tokens == len(fake_tokenize("Think, then answer."))
    assert len(r.choices[0].model_extra["token_ids"]) == r.usage.completion_tokens
    reply = ScriptedResponse.text("Paris.", reasoning_content="Think.", finish_reason="length")
    openai_server.enqueue(reply, reply)
    resp = client.responses.create(model="m", input="x")
    assert [o.type for o in resp.output] == ["reasoning", "message"] and resp.status == "incomplete"
    assert resp.usage.output_tokens_details.reasoning_tokens == 2 and resp.output_text == "Paris."
    with client.responses.stream(model="m", input="x") as stream:
        types = [e.type for e in stream]
    assert types[-1] == "response.incomplete" and types.count("response.output_item.done") == 2


def test_chat_stream_helper_assembles_tool_calls_and_usage(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="m", messages=USER, tools=CHAT_TOOLS, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.parsed_arguments == {"a": 2, "b": 3, "city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls" and final.model == "m-2026-01-01"
    plain = client.chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS)
    assert call.id == plain.choices[0].message.tool_calls[0].id
    assert final.usage.model_dump() == plain.usage.model_dump()

    with client.chat.completions.stream(model="m", messages=USER) as stream:
        text = stream.get_final_completion()
    assert text.choices[0].message.content == "You said: What is 2 + 3?" and text.usage is None


def test_chat_raw_stream_chunks_match_non_streaming(client: openai.OpenAI) -> None:
    for tools in (None, CHAT_TOOLS):
        extra = {"tools": tools} if tools else {}
        kw = {"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 2, **extra}
        full = client.chat.completions.create(**kw, extra_body={"return_token_ids": True})
        chunks = list(
            client.chat.completions.create(
                **kw,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"return_token_ids": True},
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[0].model_extra["prompt_token_ids"] == full.model_extra["prompt_token_ids"]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason
        token_ids = [i for c in chunks[:-1] for i in c.choices[0].model_extra["token_ids"]]
        lps = [e for c in chunks[:-1] if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert token_ids == full.choices[0].model_extra["token_ids"]
        assert [e.model_dump() for e in lps] == [e.model_dump() for e in full.choices[0].logprobs.content]
        if tools:
            frags = [tc for c in chunks[:-1] for tc in c.choices[0].delta.tool_calls or []]
            assert frags[0].id and frags[0].function.arguments == ""
            assert all(f.index == 0 and f.id is None for f in frags[1:])
            args = "".join(f.function.arguments for f in frags)
            assert args == full.choices[0].message.tool_calls[0].function.arguments
        else:
            text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
            assert text == full.choices[0].message.content
    no_usage = list(client.chat.completions.create(model="m", messages=USER, stream=True))
    assert no_usage[-1].choices[0].finish_reason == "stop" and no_usage[-1].usage is None


def test_sse_wire_format(openai_server: ScriptedOpenAIServer) -> None:
    body = json.dumps({"model": "m", "messages": USER, "stream": True}).encode()
    req = urllib.request.Request(openai_server.base_url + "/chat/completions", data=body, method="POST")
    with urllib.request.urlopen(req) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Connection"] == "close" and resp.headers["x-request-id"]
        raw = resp.read().decode()
    assert raw.endswith("data: [DONE]\n\n") and raw.startswith("data: {")


def test_responses_api_text_tools_and_logprobs(openai_server, client) -> None:
    lp_kw = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    r = client.responses.create(model="m", input="hi", **lp_kw)
    assert r.status == "completed" and r.model == "m-2026-01-01" and r.output_text == "You said: hi"
    part = r.output[0].content[0]
    assert len(part.logprobs) == r.usage.output_tokens and len(part.logprobs[0].top_logprobs) == 2
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert client.responses.create(model="m", input="hi").output[0].content[0].logprobs == []

    call = client.responses.create(model="m", input="add please", tools=RESP_TOOLS, instructions="be brief")
    (item,) = call.output
    assert item.type == "function_call" and item.name == "add" and item.call_id.startswith("call_")
    assert json.loads(item.arguments) == {"a": 2, "b": 3, "city": "Paris"}
    assert call.instructions == "be brief" and call.tools[0].name == "add"
    follow = client.responses.create(
        model="m",
        tools=RESP_TOOLS,
        input=[
            {"role": "user", "content": "add please"},
            {"type": "function_call", "call_id": item.call_id, "name": "add", "arguments": item.arguments},
            {"type": "function_call_output", "call_id": item.call_id, "output": "5"},
        ],
    )
    assert follow.output_text == "Tool result: 5"
    assert [q.path for q in openai_server.requests] == ["/v1/responses"] * 4


def test_responses_stream(client: openai.OpenAI) -> None:
    for tools in (None, RESP_TOOLS):
        kw = {"model": "m", "input": "hello", "include": ["message.output_text.logprobs"]}
        if tools:
            kw["tools"] = tools
        plain = client.responses.create(**kw)
        with client.responses.stream(**kw) as stream:
            events = list(stream)
            final = stream.get_final_response()
        types = [e.type for e in events]
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert _unparsed(final.output[0].model_dump()) == plain.output[0].model_dump()
        assert final.usage == plain.usage
        if tools:
            assert "response.function_call_arguments.done" in types
            assert final.output[0].parsed_arguments == {"a": 2, "b": 3, "city": "Paris"}
        else:
            deltas = [e for e in events if e.type == "response.output_text.delta"]
            assert "".join(d.delta for d in deltas) == final.output_text == "You said: hello"
            assert all(len(d.logprobs) == 1 for d in deltas)
            assert types[1:4] == [
                "response.output_item.added", "response.content_part.added", "response.output_text.delta",
            ]  # fmt: skip


@pytest.mark.parametrize(
    ("marker", "exc", "etype"),
    [
        ("FAIL_400", openai.BadRequestError, "invalid_request_error"),
        ("FAIL_429", openai.RateLimitError, "rate_limit_error"),
        ("FAIL_500", openai.InternalServerError, "server_error"),
    ],
)
def test_error_markers(client: openai.OpenAI, marker: str, exc: type, etype: str) -> None:
    messages = [{"role": "user", "content": f"please {marker} now"}]
    with pytest.raises(exc) as info:
        client.chat.completions.create(model="m", messages=messages)
    assert info.value.request_id.startswith("req_")
    assert info.value.body["type"] == etype and marker in info.value.body["message"]
    assert set(info.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(exc):
        client.chat.completions.create(model="m", messages=messages, stream=True)
    with pytest.raises(exc):
        client.responses.create(model="m", input=f"x {marker}")


def test_enqueue_order_shared_across_endpoints(openai_server, client) -> None:
    openai_server.enqueue(
        ScriptedResponse.text("hi"),
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "call_x"}]),
        ScriptedResponse.error(429, "slow down"),
        ScriptedResponse.tool_calls([{"name": "lookup", "arguments": "{not json"}], content="Let me check."),
    )
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content == "hi"
    call = client.chat.completions.create(model="m", messages=USER).choices[0].message.tool_calls[0]
    assert (call.id, call.function.name) == ("call_x", "add")
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(model="m", input="x")
    assert info.value.body["message"] == "slow down" and info.value.status_code == 429
    r = client.responses.create(model="m", input="x")
    assert [o.type for o in r.output] == ["message", "function_call"] and r.output[1].arguments == "{not json"
    after = client.chat.completions.create(model="m", messages=USER)
    assert after.choices[0].message.content.startswith("You")
    openai_server.enqueue(ScriptedResponse.text("left over"))
    openai_server.reset()
    assert openai_server.requests == []
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content != "left over"


def test_custom_policy_and_fallthrough() -> None:
    def policy(req: dict, endpoint: str) -> ScriptedResponse | None:
        if endpoint == "responses":
            return None
        return ScriptedResponse.text(f"{endpoint}:{len(req['messages'])}", finish_reason="length")

    with ScriptedOpenAIServer(policy=policy, model_suffix="") as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = c.chat.completions.create(model="m", messages=USER)
        got = (r.choices[0].message.content, r.choices[0].finish_reason, r.model)
        assert got == ("chat.completions:1", "length", "m")
        assert c.responses.create(model="m", input="yo").output_text == "You said: yo"


def test_models_and_unknown_route(openai_server, client) -> None:
    client.chat.completions.create(model="my-model", messages=USER)
    ids = [m.id for m in client.models.list()]
    assert "my-model" in ids
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="m", prompt="x")


def test_async_client_concurrency_and_latency() -> None:
    async def run(server: ScriptedOpenAIServer) -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)

        async def one(i: int) -> str:
            if i % 2:
                messages = [{"role": "user", "content": str(i)}]
                r = await client.chat.completions.create(model="m", messages=messages)
                return r.choices[0].message.content
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": str(i)}], stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        try:
            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await client.close()

    # Each request waits until 50 are in flight at once: a server handling requests one at a time could
    # never get past the barrier (its timeout is only a hang guard), so this proves concurrency without
    # measuring time.
    barrier = threading.Barrier(50, timeout=60)

    def policy(request: dict, endpoint: str) -> None:
        barrier.wait()
        return None  # then answer with the default policy

    with ScriptedOpenAIServer(policy=policy) as server:
        out = asyncio.run(run(server))
        assert out == [f"You said: {i}" for i in range(200)] and len(server.requests) == 200
        assert not barrier.broken


def test_stop_closes_keepalive_connections() -> None:
    server = ScriptedOpenAIServer().start()
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=USER)
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=USER)
    with pytest.raises(RuntimeError):
        _ = server.base_url
    assert port > 0


def test_python_dash_m_serves() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdk.testing", "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(r"tracerl test server listening on (http://127\.0\.0\.1:\d+/v1)\n", line)
        assert match, line
        client = openai.OpenAI(base_url=match.group(1), api_key="x", max_retries=0)
        assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out == "" and err == ""


def test_import_pulls_no_third_party_modules() -> None:
    code = (
        "import sys, sdk.testing\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'sdk'})\n"
        "print(','.join(m for m in bad if not m.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_in_flight_counts_requests_until_their_reply_starts() -> None:
    gate = threading.Semaphore(0)

    def held(request: dict, endpoint: str) -> None:
        gate.acquire(timeout=30)
        return None

    with ScriptedOpenAIServer(policy=held) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        calls = [
            threading.Thread(target=client.chat.completions.create, kwargs={"model": "m", "messages": USER})
            for _ in range(3)
        ]
        for t in calls:
            t.start()
        for _ in range(3000):  # a bound on a hang, not a timing
            if server.in_flight == 3:
                break
            threading.Event().wait(0.01)
        assert (server.in_flight, server.max_in_flight) == (3, 3)
        for _ in range(3):
            gate.release()
        for t in calls:
            t.join(10)
        assert (server.in_flight, server.max_in_flight, len(server.requests)) == (0, 3, 3)
        server.reset()
        assert (server.in_flight, server.max_in_flight, server.requests) == (0, 0, [])


def _raw_exchange(url: str, path: str) -> tuple[bytes, bool]:
    """POST a chat request over a raw socket: what the server sends until it goes quiet, and whether it closed."""
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    body = json.dumps({"model": "m", "messages": USER}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sock.settimeout(1.0)
        data = b""
        while True:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                return data, False  # the connection stayed open (keep-alive): what came is the reply
            if not part:
                return data, True
            data += part


@pytest.mark.parametrize(
    ("framing", "wire", "closes"),
    [
        ("length", b"Content-Length: 13\r\n", False),
        ("close", b"Connection: close\r\n", True),
        ("chunked", b"Transfer-Encoding: chunked\r\n", False),
        ("cut", b"Transfer-Encoding: chunked\r\n", True),
    ],
)
def test_raw_replies_send_their_bytes_as_framed(framing: str, wire: bytes, closes: bool) -> None:
    """A raw reply is the scripted bytes, delimited as asked: a cut stream ends before its last chunk."""
    body = b'{"choices": ['  # not JSON: what a well-formed reply could never script
    raw = ScriptedResponse.raw(
        body, content_type="text/event-stream", headers={"X-Upstream": "yes"}, framing=framing
    )
    with ScriptedOpenAIServer() as server:
        for path in ("/v1/chat/completions", "/v1/messages"):
            server.enqueue(raw)
            data, closed = _raw_exchange(server.url, path)
            assert closed is closes
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and wire in head + b"\r\n"
            assert b"Content-Type: text/event-stream\r\n" in head + b"\r\n" and b"X-Upstream: yes" in head
            chunk = b"d\r\n" + body + b"\r\n"
            expected = {"length": body, "close": body, "chunked": chunk + b"0\r\n\r\n", "cut": chunk}[framing]
            assert rest == expected, (framing, path, rest)
    with pytest.raises(ValueError, match="framing must be one of"):
        ScriptedResponse.raw(b"", framing="lines")


def test_a_cut_raw_stream_fails_the_real_client_read() -> None:
    """What the gateway and the wrappers are tested against: the openai client's read of a cut body fails."""
    with ScriptedOpenAIServer() as server:
        server.enqueue(ScriptedResponse.raw(b'{"id": "c1", "choices": [', framing="cut"))
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="m", messages=USER)


def test_routes_answer_first_with_path_params_query_and_fall_through() -> None:
    """A test's own routes: ``{name}`` segments and the query reach the handler; ``None`` is the built-in."""
    seen: list[tuple[str, str, dict]] = []

    def job(request, id: str) -> ScriptedResponse | None:
        seen.append((request.method, id, request.query))
        return None if id == "builtin" else ScriptedResponse.json_body({"id": id}, status=201)

    def chat(request) -> ScriptedResponse | None:
        return None if request.json else ScriptedResponse.error(418, "not JSON")

    gone = lambda request: ScriptedResponse.json_body({"gone": request.path})  # noqa: E731
    routes = {"* /v1/jobs/{id}/events": job, "POST /v1/chat/completions": chat, "DELETE *": gone}
    with ScriptedOpenAIServer(routes=routes) as server:
        with urllib.request.urlopen(urllib.request.Request(server.url + "/a/b/c", method="DELETE")) as r:
            assert json.loads(r.read()) == {"gone": "/a/b/c"}  # the path * : every path
        with urllib.request.urlopen(server.base_url + "/jobs/j-1/events?limit=2&after=e-9") as r:
            assert (r.status, json.loads(r.read())) == (201, {"id": "j-1"})
        with pytest.raises(urllib.error.HTTPError) as info:  # the handler's None: the built-in 404
            urllib.request.urlopen(server.base_url + "/jobs/builtin/events")
        assert info.value.code == 404
        assert seen == [("GET", "j-1", {"limit": "2", "after": "e-9"}), ("GET", "builtin", {})]
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
        bad = urllib.request.Request(
            server.base_url + "/chat/completions", data=b"[" * 100_000, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:  # nested past the parser: json is None
            urllib.request.urlopen(bad)
        assert info.value.code == 418 and server.requests[-1].json is None
    with pytest.raises(ValueError, match="METHOD /path"):
        ScriptedOpenAIServer(routes={"/v1/x": job})


def test_raw_parts_are_sent_as_they_are_produced() -> None:
    """A raw reply's parts go out one by one: the client reads the first while the route still waits."""
    go_on, waited = threading.Event(), []

    def parts():
        yield b"data: first\n\n"
        waited.append(go_on.wait(30))
        yield b"data: second\n\n"

    def stream(request) -> ScriptedResponse:
        return ScriptedResponse.raw(parts(), content_type="text/event-stream", framing="chunked")

    with ScriptedOpenAIServer(routes={"POST /v1/stream": stream}) as server:
        req = urllib.request.Request(server.base_url + "/stream", data=b"{}", method="POST")
        with urllib.request.urlopen(req) as r:
            assert r.readline() == b"data: first\n"
            go_on.set()
            assert r.read() == b"\ndata: second\n\n" and waited == [True]
    with pytest.raises(ValueError, match="in one piece"):
        ScriptedResponse.raw(iter([b"x"]))
