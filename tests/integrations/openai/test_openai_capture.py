"""The raw OpenAI client, captured through the recording transport, against the loopback server."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from integrations.openai import (  # noqa: E402
    _transport_classes,
    instrument_openai,
    parse_exchange,
    uninstrument_openai,
    wrap_openai,
)
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedResponse  # noqa: E402
from tests.support.tools import ADD_TOOL  # noqa: E402

TOOLS = [ADD_TOOL]


def _calls(store: Path) -> list[dict]:
    sdk.flush()
    return [c for s in StoreReader(store).sessions() for c in s.calls]


def test_chat_tool_loop_keeps_logprobs_token_ids_and_returned_model(store: Path, openai_server) -> None:
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="sk-secret", max_retries=0))
    with sdk.session(task_id="t1") as s:
        messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "add 2 and 3"}]
        first = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            tools=TOOLS,
            logprobs=True,
            top_logprobs=2,
            extra_body={"return_token_ids": True},
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        final = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            tools=TOOLS,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
    c1, c2 = _calls(store)
    assert c1["session_id"] == s.session_id and c1["framework"] == "openai"
    assert c1["model"] == "gpt-4o-mini" and c1["response_model"] == first.model != "gpt-4o-mini"
    assert c1["request"]["tools"] == TOOLS
    assert c1["response"]["finish_reason"] == "tool_calls"
    assert c1["response"]["message"]["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(c1["response"]["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert len(c1["logprobs"]) == len(c1["completion_token_ids"]) == first.usage.completion_tokens
    assert (
        c1["logprobs"][0]["top_logprobs"] and c1["prompt_token_ids"] == first.model_extra["prompt_token_ids"]
    )
    assert c1["usage"]["total_tokens"] == first.usage.total_tokens
    assert c2["request"]["messages"] == messages  # rebuilt in full from the deduplicated store
    assert c2["response"]["message"]["content"] == final.choices[0].message.content
    assert c2["latency_s"] >= 0 and c2["request_id"]


def test_streaming_chat_is_reassembled(store: Path, openai_server) -> None:
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    with sdk.session(task_id="t"):
        with client.chat.completions.stream(
            model="m",
            messages=[{"role": "user", "content": "add"}],
            tools=TOOLS,
            stream_options={"include_usage": True},
            logprobs=True,
            extra_body={"return_token_ids": True},
        ) as stream:
            done = stream.get_final_completion()
        text = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hello there"}],
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
        )
        pieces = "".join(ch.choices[0].delta.content or "" for ch in text if ch.choices)
    tool_call, reply = _calls(store)
    assert tool_call["stream"] and tool_call["response"]["message"]["tool_calls"][0]["function"][
        "arguments"
    ] == (done.choices[0].message.tool_calls[0].function.arguments)
    assert tool_call["usage"]["completion_tokens"] == done.usage.completion_tokens
    assert len(tool_call["completion_token_ids"]) == len(tool_call["logprobs"])
    assert reply["response"]["message"]["content"] == pieces and len(reply["logprobs"]) > 0


def test_streamed_chat_with_n_choices_keeps_every_choice_as_non_streamed_does(
    store: Path, openai_server
) -> None:
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "add"}],
        "tools": TOOLS,
        "n": 3,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    with sdk.session(task_id="t"):
        plain = client.chat.completions.create(**request)
        chunks = list(client.chat.completions.create(**request, stream=True))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2}  # interleaved by the server
    plain_call, streamed_call = _calls(store)
    assert streamed_call["stream"] and not plain_call["stream"]
    assert streamed_call["response"] == plain_call["response"]  # choice 0, not mixed with the others

    def shape(choice: dict) -> tuple:
        msg, lp = choice["message"], choice.get("logprobs") or {}
        return (choice["index"], msg.get("content"), msg.get("tool_calls"), choice["finish_reason"],
                [e["token"] for e in lp.get("content") or []], choice.get("token_ids"))  # fmt: skip

    plain_others = [shape(c) for c in plain_call["extra"]["other_choices"]]
    assert [shape(c) for c in streamed_call["extra"]["other_choices"]] == plain_others
    assert [i for i, *_ in plain_others] == [1, 2] and all(tc for _, _, tc, *_ in plain_others)
    assert plain_others[0][1:] == shape({**plain.choices[0].model_dump(), "index": 0})[1:]


def test_async_client_and_responses_api(store: Path, openai_server) -> None:
    async def run() -> tuple[str, str]:
        client = wrap_openai(openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
        async with sdk.session(task_id="t"):
            r = await client.responses.create(
                model="m",
                instructions="Be brief.",
                input="hi",
                tools=[{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}],
            )
            call = r.output[0]
            r2 = await client.responses.create(
                model="m",
                input=[
                    {"role": "user", "content": "hi"},
                    {
                        "type": "function_call",
                        "call_id": call.call_id,
                        "name": call.name,
                        "arguments": call.arguments,
                    },
                    {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
                ],
            )
            async with client.responses.stream(model="m", input="stream me") as stream:
                final = await stream.get_final_response()
            return r2.output_text, final.output_text

    text, streamed = asyncio.run(run())
    first, second, third = _calls(store)
    assert first["endpoint"] == "responses" and first["request"]["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    assert first["request"]["tools"][0]["function"]["name"] == "add"
    assert first["response"]["message"]["tool_calls"][0]["function"]["name"] == "add"
    assert [m["role"] for m in second["request"]["messages"]] == ["user", "assistant", "tool"]
    assert second["response"]["message"]["content"] == text
    assert third["stream"] and third["response"]["message"]["content"] == streamed
    assert third["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    ("marker", "exc_name", "status"),
    [
        ("FAIL_400", "BadRequestError", 400),
        ("FAIL_429", "RateLimitError", 429),
        ("FAIL_500", "InternalServerError", 500),
    ],
)
def test_errors_are_recorded_and_raised_unchanged(
    store: Path, openai_server, marker, exc_name, status
) -> None:
    plain = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    wrapped = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    errors = []
    for client in (plain, wrapped):
        with sdk.session(task_id="t"):
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": marker}])
            errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and type(errors[1]).__name__ == exc_name
    assert errors[0].body == errors[1].body and errors[1].status_code == status
    [call] = _calls(store)
    assert call["error"]["status"] == status and call["error"]["message"] == errors[1].body["message"]
    assert call["response"]["message"] is None


def test_connection_errors_are_recorded_and_propagate(store: Path) -> None:
    client = wrap_openai(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0))
    with sdk.session(task_id="t"), pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    [call] = _calls(store)
    assert call["error"]["type"] == "ConnectError"


def test_results_are_identical_with_and_without_capture(store: Path, openai_server) -> None:
    kwargs = dict(model="m", messages=[{"role": "user", "content": "add please"}], tools=TOOLS, logprobs=True)
    plain = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    wrapped = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    a = plain.chat.completions.create(**kwargs).model_dump(exclude={"id", "created"})
    b = wrapped.chat.completions.create(**kwargs).model_dump(exclude={"id", "created"})
    assert a == b


def test_no_api_key_or_authorization_header_reaches_the_store(store: Path, openai_server) -> None:
    secret = "sk-proj-THIS-MUST-NEVER-BE-STORED-1234"
    client = wrap_openai(
        openai.OpenAI(
            base_url=openai_server.base_url,
            api_key=secret,
            max_retries=0,
            default_headers={"X-Custom-Auth": f"Bearer {secret}"},
        )
    )
    with sdk.session(task_id="t", note="keys stay out"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"Authorization": f"Bearer {secret}"},
        )
        with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as s:
            s.get_final_completion()
    sdk.flush()
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {secret}"  # it was really sent
    for f in store.iterdir():
        data = f.read_bytes()
        assert secret.encode() not in data and b"Bearer" not in data and b"authorization" not in data.lower()


def test_instrument_openai_captures_every_new_client_and_is_idempotent(store: Path, openai_server) -> None:
    instrument_openai()
    instrument_openai()
    try:
        client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
        wrap_openai(client)  # wrapping twice never records twice
        with sdk.session(task_id="t"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        uninstrument_openai()
    later = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    with sdk.session(task_id="t"):
        later.chat.completions.create(model="m", messages=[{"role": "user", "content": "not recorded"}])
    assert len(_calls(store)) == 1


def test_non_model_endpoints_pass_through_unrecorded(store: Path, openai_server) -> None:
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    assert client.models.list().data
    assert _calls(store) == []


def test_httpx2_transport_records_too(store: Path, openai_server) -> None:
    """openai 3.x runs on httpx2: the same transport, built on httpx2, records the same way."""
    httpx2 = pytest.importorskip("httpx2")
    sync_cls, _ = _transport_classes("httpx2")
    with httpx2.Client(transport=sync_cls()) as http, sdk.session(task_id="t"):
        r = http.post(
            f"{openai_server.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
        assert r.status_code == 200 and b"[DONE]" in r.read()
    [call] = _calls(store)
    assert call["stream"] and call["response"]["message"]["content"]


def test_parse_exchange_tolerates_odd_bodies() -> None:
    rec = parse_exchange("chat.completions", {"model": "m", "messages": []}, 502, b"<html>bad gateway</html>")
    assert rec.error == {"type": "http_error", "message": "<html>bad gateway</html>", "status": 502}
    rec = parse_exchange(
        "chat.completions",
        {"model": "m", "messages": []},
        200,
        b"data: {not json\n\ndata: [DONE]\n",
        content_type="text/event-stream",
    )
    assert rec.response_message == {"role": "assistant", "content": None}


def test_missing_openai_gives_the_install_hint() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "try:\n    import integrations.openai\nexcept ImportError as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'tracerl[openai]'" in out


def test_sdk_failure_never_breaks_the_call(
    store: Path, openai_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRACERL_RAISE_INTERNAL")
    mod = importlib.import_module("integrations.openai")
    monkeypatch.setattr(mod, "parse_exchange", lambda *a, **k: 1 / 0)
    before = sdk.stats()["internal_errors"]
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    with sdk.session(task_id="t"):
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content
    assert sdk.stats()["internal_errors"] == before + 1
    openai_server.enqueue(ScriptedResponse.text("still fine"))
