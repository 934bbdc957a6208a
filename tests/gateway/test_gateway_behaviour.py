"""The gateway's guarantees with the real openai client: routing, pass-through, errors, secrets, token data."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from sdk.store import StoreReader, add_reward  # noqa: E402
from sdk.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import Gateway, new_id, start_gateway  # noqa: E402


def _client(base_url: str, **kwargs: Any) -> Any:
    return openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, **kwargs)


def test_chat_and_responses_streamed_and_not_in_one_session(
    gateway: Gateway, upstream: ScriptedOpenAIServer
) -> None:
    upstream.reset()
    sid = new_id()
    c = _client(gateway.base(sid))
    assert (
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        .choices[0]
        .message.content
        == "You said: a"
    )
    chunks = list(
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}], stream=True)
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "You said: b"
    assert c.responses.create(model="m", input="c").output_text == "You said: c"
    events = list(c.responses.create(model="m", input="d", stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "You said: d"
    gateway.end(sid)
    s = gateway.session(sid)
    got = [(c["endpoint"], c["stream"], c["response"]["message"]["content"]) for c in s.calls]
    assert got == [
        ("chat.completions", False, "You said: a"),
        ("chat.completions", True, "You said: b"),
        ("responses", False, "You said: c"),
        ("responses", True, "You said: d"),
    ]
    assert all(c["response_model"] == "m-2026-01-01" for c in s.calls)
    assert [bool(c["usage"]) for c in s.calls] == [
        True,
        False,
        True,
        True,
    ]  # a chat stream has none unless asked


def test_session_from_headers_and_implicit_session(gateway: Gateway) -> None:
    sid = new_id()
    headers = {
        "X-Tracerl-Session": sid,
        "X-Tracerl-Task": "task-7",
        "X-Tracerl-Sample": "3",
        "X-Tracerl-Metadata": json.dumps({"split": "train"}),
    }
    c = _client(gateway.base(), default_headers=headers)
    for text in ("one", "two"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    marker = new_id()
    _client(gateway.base()).chat.completions.create(model="m", messages=[{"role": "user", "content": marker}])
    gateway.end(sid)
    sessions = list(StoreReader(gateway.store).sessions())
    [s] = [s for s in sessions if s.session_id == sid]
    assert (s.task_id, s.sample, s.metadata, s.status, len(s.calls)) == (
        "task-7",
        3,
        {"split": "train"},
        "ok",
        2,
    )
    implicit = [
        s for s in sessions if any(c["request"]["messages"][-1]["content"] == marker for c in s.calls)
    ]
    assert len(implicit) == 1 and implicit[0].implicit


def test_agent_header_names_the_calls_agent(gateway: Gateway) -> None:
    sid = new_id()
    for agent in ("router", "math", None):
        headers = {"X-Tracerl-Agent": agent} if agent else {}
        c = _client(gateway.base(sid), default_headers=headers)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hi {agent}"}])
    gateway.end(sid)
    assert [c.get("agent") for c in gateway.session(sid).calls] == ["router", "math", None]


def test_rewards_over_http_and_in_process(gateway: Gateway) -> None:
    sid = new_id()
    _client(gateway.base(sid)).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    gateway.reward(sid, 0.25, name="format")
    gateway.reward(sid, 1.0)
    assert gateway.post(f"/sessions/{sid}/reward", {"value": "nan"}).status_code == 400
    inf = httpx.post(gateway.url + f"/sessions/{sid}/reward", content=b'{"value": Infinity}')
    assert inf.status_code == 400 and "finite" in inf.json()["error"]["message"]
    assert gateway.post(f"/sessions/{sid}/reward", [1]).status_code == 400
    gateway.end(sid)
    add_reward(gateway.store, sid, 2.0, name="judge")  # a scoring job after the run, in-process API
    s = gateway.session(sid)
    assert s.named_rewards == {"format": 0.25, "reward": 1.0, "judge": 2.0}


def test_many_calls_of_one_session_over_two_workers_read_as_one_session(gateway: Gateway) -> None:
    sid = new_id()
    for i in range(24):
        with httpx.Client() as http:  # a new connection per call: the kernel spreads them over the workers
            r = http.post(
                gateway.base(sid) + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
            )
            assert r.status_code == 200
    gateway.end(sid)
    reader = StoreReader(gateway.store)
    [s] = [s for s in reader.sessions() if s.session_id == sid]
    assert [c["request"]["messages"][-1]["content"] for c in s.calls] == [f"q{i}" for i in range(24)]
    assert s.status == "ok"
    parts = sum(sid.encode() in f.read_bytes() for chain in reader.segments() for f in chain)
    assert parts >= 1  # usually 2; the merge itself is pinned by test_spread_sessions


def test_other_paths_pass_through_and_are_not_recorded(
    gateway: Gateway, upstream: ScriptedOpenAIServer
) -> None:
    upstream.reset()
    sid = new_id()
    direct = httpx.get(upstream.base_url + "/models").json()
    assert httpx.get(gateway.base(sid) + "/models").json() == direct
    missing = httpx.post(gateway.base(sid) + "/embeddings?x=1", json={"input": "a"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}  # outside /v1: the origin's path
    assert [r.path for r in upstream.requests] == ["/v1/models", "/v1/models", "/v1/embeddings", "/health"]
    # Headers go through as the client sent them, its accepted encodings included (the body is not read).
    assert upstream.requests[1].headers["accept-encoding"] == upstream.requests[0].headers["accept-encoding"]
    assert all(s.session_id != sid for s in StoreReader(gateway.store).sessions())


def test_upstream_errors_pass_through_unchanged_and_are_recorded(
    gateway: Gateway, upstream: ScriptedOpenAIServer
) -> None:
    sid = new_id()
    body = {"model": "m", "messages": [{"role": "user", "content": "FAIL_429 please"}]}
    direct = httpx.post(upstream.base_url + "/chat/completions", json=body)
    through = httpx.post(gateway.base(sid) + "/chat/completions", json=body)
    assert (
        (through.status_code, through.json()) == (direct.status_code, direct.json()) == (429, direct.json())
    )
    with pytest.raises(openai.InternalServerError):
        _client(gateway.base(sid)).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "FAIL_500"}]
        )
    gateway.end(sid)
    errors = [c["error"] for c in gateway.session(sid).calls]
    assert [(e["status"], e["type"]) for e in errors] == [(429, "rate_limit_error"), (500, "server_error")]


def test_unreachable_upstream_is_a_502_and_a_recorded_failure(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    gw = start_gateway(f"http://127.0.0.1:{port}/v1", tmp_path / "store")
    try:
        r = httpx.post(
            gw.base("s1") + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 502 and "upstream request failed" in r.json()["error"]["message"]
        gw.end("s1")
        [call] = gw.session("s1").calls
        assert call["error"]["type"] == "ConnectError"
    finally:
        gw.stop()


def test_keys_and_auth_headers_reach_upstream_and_are_never_stored(
    gateway: Gateway, upstream: ScriptedOpenAIServer
) -> None:
    upstream.reset()
    sid = new_id()
    secret = "sk-" + new_id()
    c = openai.OpenAI(
        base_url=gateway.base(sid),
        api_key=secret,
        max_retries=0,
        default_headers={"X-Api-Key": secret + "-x"},
    )
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    list(c.responses.create(model="m", input="hi", stream=True))
    gateway.end(sid)
    assert all(
        r.headers["authorization"] == f"Bearer {secret}" and r.headers["x-api-key"] == secret + "-x"
        for r in upstream.requests
    )
    assert all("x-tracerl-session" not in r.headers for r in upstream.requests)
    for f in gateway.store.glob("*.jsonl"):
        assert secret.encode() not in f.read_bytes()


def test_token_data_added_for_the_store_and_stripped_for_the_client(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as up:
        gw = start_gateway(up.base_url, tmp_path / "store", args=("--token-data", "--strip-token-data"))
        try:
            sid = new_id()
            c = _client(gw.base(sid))
            r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].logprobs is None and "token_ids" not in r.choices[0].model_extra
            assert "prompt_token_ids" not in (r.model_extra or {})
            chunks = list(
                c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "yo"}], stream=True
                )
            )
            assert all(
                ch.choices[0].logprobs is None and "token_ids" not in ch.choices[0].model_extra
                for ch in chunks
                if ch.choices
            )
            resp = c.responses.create(model="m", input="hey")
            assert resp.output[0].content[0].logprobs == []
            # What the client asked for itself is left alone.
            asked = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], logprobs=True
            )
            assert asked.choices[0].logprobs is not None
            gw.end(sid)
            assert up.requests[0].json["logprobs"] is True and up.requests[0].json["return_token_ids"] is True
            assert "message.output_text.logprobs" in up.requests[2].json["include"]
            calls = gw.session(sid).calls
            assert all(c["logprobs"] for c in calls)
            assert calls[0]["completion_token_ids"] and calls[0]["prompt_token_ids"]
            assert calls[1]["completion_token_ids"] and calls[1]["prompt_token_ids"]
        finally:
            gw.stop()


def test_a_store_that_cannot_be_written_never_fails_the_client(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as up:
        gw = start_gateway(up.base_url, store)
        try:
            shutil.rmtree(store)
            store.write_text("not a directory")  # every write now fails
            c = _client(gw.base("s1"))
            for _ in range(3):
                assert (
                    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                    .choices[0]
                    .message.content
                )
            stats = httpx.get(gw.url + "/stats").json()
            assert (
                stats["calls"] == 3 and stats["store_failures"] >= 1 and stats["store"]["write_failures"] >= 1
            )
            assert (
                stats["store"]["events_spilled"] >= 4
            )  # session_start + 3 calls, kept in memory for a retry
        finally:
            gw.stop()
        assert "cannot write to the store" in "".join(gw.output)


def _sse_chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    ev = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "slow",
          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(ev).encode() + b"\n\n"


def test_stream_chunks_are_forwarded_as_they_arrive(tmp_path: Path) -> None:
    """The upstream holds the rest of its stream until the client has read the first chunk: a gateway that
    buffered the stream would hold that chunk back, and the upstream would give up waiting."""
    client_has_first, released = threading.Event(), []

    def slow_stream(request: RecordedRequest) -> ScriptedResponse:
        def parts() -> Iterator[bytes]:
            yield _sse_chunk("first")
            released.append(client_has_first.wait(30))
            yield _sse_chunk(" second") + _sse_chunk(None, "stop") + b"data: [DONE]\n\n"

        return ScriptedResponse.raw(parts(), content_type="text/event-stream", framing="close")

    with ScriptedOpenAIServer(routes={"POST /v1/chat/completions": slow_stream}) as slow:
        gw = start_gateway(slow.base_url, tmp_path / "store")
        try:
            c = _client(gw.base("s1"))
            stream = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True
            )
            first = next(iter(stream))
            client_has_first.set()
            rest = list(stream)
            assert first.choices[0].delta.content == "first" and released == [True]
            assert "".join(ch.choices[0].delta.content or "" for ch in rest) == " second"
            gw.end("s1")
            [call] = gw.session("s1").calls
            assert call["response"]["message"]["content"] == "first second" and call["stream"]
        finally:
            gw.stop()


def test_bad_command_lines_exit_2_with_one_error_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.support.gateway import ROOT

    for args in (
        ["--upstream", "ftp://x"],
        ["--upstream", "http://h/v1", "--workers", "0"],
        ["--upstream", "https://api.openai.com/v1", "--token-data"],
        ["--upstream", "http://h/v1", "--store", str(tmp_path / "f" / "x")],
    ):
        if "--store" in args:
            (tmp_path / "f").write_text("a file")
        r = subprocess.run(
            [sys.executable, "-m", "sdk.gateway", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
