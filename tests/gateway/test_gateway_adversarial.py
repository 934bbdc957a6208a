"""The gateway against adversarial clients (issue items 1-7), each against a real gateway process.

Every test names its item: a client gone before its answer, session-id decoding, deep JSON, gzip bodies,
malformed messages, hop-by-hop headers and WebSocket, and the doors (token, bind, secrets, /stats, end).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from sdk.episodes import ExportSummary, build_episodes  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import ROOT, Gateway, new_id, start_gateway  # noqa: E402

_ANSWER = {
    "id": "chatcmpl-raw",
    "object": "chat.completion",
    "model": "m-raw",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "raw answer"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}


def _raw_answer(request: RecordedRequest) -> ScriptedResponse:
    """Every request, whatever its body (gzip, nested past any parser): 200 and one chat completion."""
    # A header this hop names as its own (RFC 9110 §7.6.1): never forwarded to the client.
    hop = {"Connection": "keep-alive, X-Upstream-Hop", "X-Upstream-Hop": "secret", "X-Upstream-Kept": "yes"}
    return ScriptedResponse.json_body(_ANSWER, headers=hop)


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[ScriptedOpenAIServer]:
    """The scripted server answering :func:`_raw_answer`; its ``requests`` are what went upstream."""
    routes = {"* /v1/chat/completions": _raw_answer, "* /v1/models": _raw_answer}
    with ScriptedOpenAIServer(routes=routes) as server:
        yield server


@pytest.fixture(scope="module")
def raw_gateway(
    raw_upstream: ScriptedOpenAIServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """One worker (its /stats are the whole gateway's) in front of the raw upstream."""
    gw = start_gateway(raw_upstream.base_url, tmp_path_factory.mktemp("raw-gateway") / "store")
    try:
        yield gw
    finally:
        gw.stop()


def _stats(gw: Gateway) -> dict[str, Any]:
    return httpx.get(gw.url + "/stats", timeout=30).json()


def _chat(gw: Gateway, path: str, text: str = "hi", **kwargs: Any) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return httpx.post(gw.url + path, json=body, timeout=30, **kwargs)


def _sessions(gw: Gateway) -> dict[str, Any]:
    return {s.session_id: s for s in StoreReader(gw.store).sessions()}


# --- 1. a client gone before its non-streamed answer ---------------------------------------------------


def test_item1_client_timeout_before_non_streamed_answer_is_a_failed_call_never_an_episode(
    tmp_path: Path,
) -> None:
    with ScriptedOpenAIServer(latency_s=3.0) as slow:
        gw = start_gateway(slow.base_url, tmp_path / "store")
        try:
            sid = new_id()
            client = openai.OpenAI(base_url=gw.base(sid), api_key="sk-test", timeout=0.4, max_retries=2)
            with pytest.raises(openai.APITimeoutError):
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            deadline = time.monotonic() + 20
            while _stats(gw)["client_disconnects"] < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            gw.reward(sid, 1.0)
            gw.end(sid)
            s = gw.session(sid)
            assert len(s.calls) == 3  # the client's first try and its 2 retries
            assert [c["error"]["type"] for c in s.calls] == ["ConnectionAbortedError"] * 3
            assert all("client disconnected" in c["error"]["message"] for c in s.calls)
            assert all((c.get("response") or {}).get("message") is None for c in s.calls)
            summary = ExportSummary()
            assert list(build_episodes(gw.store, summary=summary)) == []
            assert not any("Traceback" in line or "Exception" in line for line in gw.output)
        finally:
            gw.stop()


# --- 2. one session id, one decoding ------------------------------------------------------------------


def test_item2_encoded_slash_in_url_gives_two_sessions_and_reward_is_handled(raw_gateway: Gateway) -> None:
    gw, p = raw_gateway, new_id()
    assert _chat(gw, f"/sessions/{p}a%2Fb/v1/chat/completions").status_code == 200
    assert _chat(gw, f"/sessions/{p}a%2Fc/v1/chat/completions").status_code == 200
    r = httpx.post(gw.url + f"/sessions/{p}a%2Fb/reward", json={"value": 0.5}, timeout=30)
    assert r.status_code == 200 and r.json()["session_id"] == f"{p}a/b"  # handled here, not proxied
    for sid in (f"{p}a%2Fb", f"{p}a%2Fc"):
        assert httpx.post(gw.url + f"/sessions/{sid}/end", timeout=30).status_code == 200
    sessions = _sessions(gw)
    ab, ac = sessions[f"{p}a/b"], sessions[f"{p}a/c"]
    assert (len(ab.calls), len(ac.calls), ab.status, ac.status) == (1, 1, "ok", "ok")
    assert ab.named_rewards == {"reward": 0.5} and not ac.named_rewards
    assert f"{p}a" not in sessions


def test_item2_spaces_in_url_id_are_kept_for_calls_reward_and_end(raw_gateway: Gateway) -> None:
    gw, p = raw_gateway, new_id()
    enc = f"%20{p}%20"
    assert _chat(gw, f"/sessions/{enc}/v1/chat/completions").status_code == 200
    assert httpx.post(gw.url + f"/sessions/{enc}/reward", json={"value": 1}, timeout=30).status_code == 200
    assert httpx.post(gw.url + f"/sessions/{enc}/end", timeout=30).status_code == 200
    s = _sessions(gw)[f" {p} "]
    assert (len(s.calls), s.named_rewards, s.status) == (1, {"reward": 1.0}, "ok")
    assert p not in _sessions(gw)


def test_item2_utf8_id_in_header_is_the_same_session_as_in_url(raw_gateway: Gateway) -> None:
    gw, sid = raw_gateway, f"café-{new_id()}"
    assert (
        _chat(gw, "/v1/chat/completions", headers={"X-Tracerl-Session": sid.encode("utf-8")}).status_code
        == 200
    )
    url_id = sid.replace("é", "%C3%A9")
    assert _chat(gw, f"/sessions/{url_id}/v1/chat/completions").status_code == 200
    assert httpx.post(gw.url + f"/sessions/{url_id}/end", timeout=30).status_code == 200
    assert len(_sessions(gw)[sid].calls) == 2


def test_item2_session_id_that_is_not_utf8_is_refused_on_every_route(
    raw_gateway: Gateway, raw_upstream: ScriptedOpenAIServer
) -> None:
    gw = raw_gateway
    before = len(raw_upstream.requests)
    assert _chat(gw, "/sessions/bad%FF/v1/chat/completions").status_code == 400
    assert httpx.post(gw.url + "/sessions/bad%FF/reward", json={"value": 1}, timeout=30).status_code == 400
    assert httpx.post(gw.url + "/sessions/bad%FF/end", timeout=30).status_code == 400
    r = _chat(gw, "/v1/chat/completions", headers={"X-Tracerl-Session": b"bad\xff"})
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    assert len(raw_upstream.requests) == before  # nothing went upstream


# --- 3. deep JSON -------------------------------------------------------------------------------------


def test_item3_deep_metadata_header_still_routes_to_the_named_session(raw_gateway: Gateway) -> None:
    gw = raw_gateway
    deep = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"  # past Python's parser
    parsed = '{"a": ' + "[" * 200 + "]" * 200 + "}"  # parsed, but past what the store is given
    sids = [new_id(), new_id(), new_id()]
    for sid, meta in zip(sids, (deep, deep, parsed), strict=True):
        r = _chat(gw, f"/sessions/{sid}/v1/chat/completions", headers={"X-Tracerl-Metadata": meta})
        assert r.status_code == 200
        gw.end(sid)
    for sid in sids:
        s = gw.session(sid)
        assert (len(s.calls), s.metadata) == (1, {})
    assert _stats(gw)["store"]["gateway_bad_headers"] >= 3
    time.sleep(0.2)  # the log line is written by the gateway process
    warnings = [line for line in gw.output if "x-tracerl-metadata" in line]
    assert len(warnings) == 1 and "nested too deeply" in warnings[0]
    assert not any("Traceback" in line for line in gw.output)


@pytest.mark.parametrize("depth", [100_000, 500], ids=["past-the-parser", "past-the-store"])
def test_item3_request_body_nested_deep_is_forwarded_and_answered(
    raw_gateway: Gateway, raw_upstream: ScriptedOpenAIServer, depth: int
) -> None:
    gw = raw_gateway
    body = b'{"model": "m", "messages": [], "x": ' + b"[" * depth + b"]" * depth + b"}"
    before = _stats(gw)["store"]
    r = httpx.post(gw.url + "/v1/chat/completions", content=body, timeout=30)
    assert r.status_code == 200 and r.json() == _ANSWER
    assert raw_upstream.requests[-1].body == body
    after = _stats(gw)["store"]
    assert after["gateway_unrecorded_requests"] == before.get("gateway_unrecorded_requests", 0) + 1
    assert after["internal_errors"] == before["internal_errors"]


def test_item3_reward_huge_integer_or_deep_body_is_a_400(raw_gateway: Gateway) -> None:
    gw, sid = raw_gateway, new_id()
    url = gw.url + f"/sessions/{sid}/reward"
    huge = httpx.post(url, content=b'{"value": 1' + b"0" * 400 + b"}", timeout=30)
    assert huge.status_code == 400 and "finite" in huge.json()["error"]["message"]
    longer = httpx.post(url, content=b'{"value": 1' + b"0" * 5000 + b"}", timeout=30)
    assert longer.status_code == 400 and "not valid JSON" in longer.json()["error"]["message"]
    deep = httpx.post(url, content=b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", timeout=30)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]


# --- 4. gzip request bodies ---------------------------------------------------------------------------


def test_item4_gzip_request_body_is_recorded_and_forwarded_as_sent(
    raw_gateway: Gateway, raw_upstream: ScriptedOpenAIServer
) -> None:
    gw, sid = raw_gateway, new_id()
    plain = json.dumps({"model": "m", "messages": [{"role": "user", "content": "zipped"}]}).encode()
    sent = gzip.compress(plain)
    r = httpx.post(
        gw.base(sid) + "/chat/completions",
        content=sent,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200
    headers, got = raw_upstream.requests[-1].headers, raw_upstream.requests[-1].body
    assert got == sent and headers["content-encoding"] == "gzip"
    gw.end(sid)
    [call] = gw.session(sid).calls
    assert call["request"]["messages"][-1]["content"] == "zipped"
    assert call["response"]["message"]["content"] == "raw answer"


def test_item4_gzip_bomb_is_forwarded_not_recorded(raw_gateway: Gateway) -> None:
    gw = raw_gateway
    bomb = gzip.compress(b'{"model": "m", "messages": [], "pad": "' + b"0" * (65 * 1024 * 1024) + b'"}')
    before = _stats(gw)["store"].get("gateway_unrecorded_requests", 0)
    r = httpx.post(
        gw.url + "/v1/chat/completions", content=bomb, headers={"Content-Encoding": "gzip"}, timeout=60
    )
    assert r.status_code == 200
    assert _stats(gw)["store"]["gateway_unrecorded_requests"] == before + 1


# --- 5. answered calls with malformed messages are stored ---------------------------------------------


@pytest.mark.parametrize(
    "messages", ["just a string", [1, "two"], [{"role": 5, "content": "x"}]], ids=["string", "items", "role"]
)
def test_item5_answered_call_with_malformed_messages_is_stored_and_never_an_episode(
    raw_gateway: Gateway, messages: Any
) -> None:
    gw, sid = raw_gateway, new_id()
    r = httpx.post(gw.base(sid) + "/chat/completions", json={"model": "m", "messages": messages}, timeout=30)
    assert r.status_code == 200
    gw.reward(sid, 1.0)
    gw.end(sid)
    s = gw.session(sid)
    [call] = s.calls
    assert call["request"]["messages"] == []
    assert call["extra"]["malformed_request"]["request"]["messages"] == messages
    assert call["response"]["message"]["content"] == "raw answer"
    summary = ExportSummary()
    assert list(build_episodes([s], summary=summary)) == []
    assert sum(summary.rejected.values()) == 1


# --- 6. hop-by-hop headers and WebSocket --------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"], ids=["recorded", "passthrough"])
def test_item6_headers_named_in_connection_are_dropped_both_ways(
    raw_gateway: Gateway, raw_upstream: ScriptedOpenAIServer, path: str
) -> None:
    gw = raw_gateway
    headers = {"Connection": "keep-alive, X-Client-Hop", "X-Client-Hop": "secret", "X-Client-Kept": "yes"}
    r = _chat(gw, path, headers=headers) if "chat" in path else httpx.get(gw.url + path, headers=headers)
    assert r.status_code == 200
    seen = raw_upstream.requests[-1].headers
    assert seen.get("x-client-kept") == "yes" and "x-client-hop" not in seen
    assert r.headers.get("x-upstream-kept") == "yes" and "x-upstream-hop" not in r.headers


def test_item6_websocket_upgrade_is_answered_501(raw_gateway: Gateway) -> None:
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    r = httpx.get(raw_gateway.url + "/v1/realtime", headers=upgrade, timeout=30)
    assert r.status_code == 501 and "WebSocket is not supported" in r.json()["error"]["message"]


# --- 7. the doors -------------------------------------------------------------------------------------


def test_item7_token_is_checked_on_every_route(tmp_path: Path, upstream: ScriptedOpenAIServer) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok-" + new_id() + "\n")
    token = token_file.read_text().strip()
    gw = start_gateway(upstream.base_url, tmp_path / "store", args=("--auth-token-file", str(token_file)))
    try:
        sid = new_id()
        routes = [
            ("POST", f"/sessions/{sid}/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("POST", f"/sessions/{sid}/reward"),
            ("POST", f"/sessions/{sid}/end"),
            ("GET", "/stats"),
            ("POST", "/v1/traces"),
        ]
        for method, path in routes:
            for headers in (
                {},
                {"X-Tracerl-Gateway-Token": token + "x"},
                {"Authorization": f"Bearer {token}"},
            ):
                r = httpx.request(method, gw.url + path, headers=headers, json={"value": 1}, timeout=30)
                assert r.status_code == 401, (method, path, headers)
        assert httpx.get(gw.url + "/stats", headers={"X-Tracerl-Gateway-Token": token}).status_code == 200
        # A client that sets only a base URL and the upstream's API key: the token in the base URL.
        client = openai.OpenAI(base_url=f"{gw.url}/token/{token}/sessions/{sid}/v1", api_key="sk-upstream")
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "You said: hi"
        assert upstream.requests[-1].path == "/v1/chat/completions"
        assert not any("tracerl" in k for k in upstream.requests[-1].headers)
        assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream"
        r = httpx.post(f"{gw.url}/sessions/{sid}/end", headers={"X-Tracerl-Gateway-Token": token}, timeout=30)
        assert r.status_code == 200
        assert len(gw.session(sid).calls) == 1
        assert not any(token in line for line in gw.output)
    finally:
        gw.stop()


def test_item7_token_from_environment_in_header_or_path(
    tmp_path: Path, upstream: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "env-" + new_id()
    monkeypatch.setenv("TRACERL_GATEWAY_TOKEN", token)
    gw = start_gateway(upstream.base_url, tmp_path / "store")
    try:
        assert "gateway token required" in gw.output[0] and token not in gw.output[0]
        assert httpx.get(gw.url + "/v1/models", timeout=30).status_code == 401
        assert httpx.get(gw.url + "/token/wrong/v1/models", timeout=30).status_code == 401
        assert httpx.get(gw.url + f"/token/{token}/v1/models", timeout=30).status_code == 200
        headers = {"X-Tracerl-Gateway-Token": f"Bearer {token}"}
        assert httpx.get(gw.url + "/v1/models", headers=headers, timeout=30).status_code == 200
    finally:
        gw.stop()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sdk.gateway", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_item7_non_loopback_bind_without_token_is_refused_and_secrets_never_printed(tmp_path: Path) -> None:
    upstream = "http://user:pa55word@127.0.0.1:9/v1"
    r = _cli("--upstream", upstream, "--host", "0.0.0.0", "--port", "0", "--store", str(tmp_path / "s"))
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and "--allow-unauthenticated" in line and "pa55word" not in line
    bad = _cli("--upstream", "ftp://user:pa55word@h/v1", "--store", str(tmp_path / "s"))
    assert bad.returncode == 2 and "pa55word" not in bad.stderr and "user:***@" in bad.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = _cli("--upstream", upstream, "--auth-token-file", str(empty), "--store", str(tmp_path / "s"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "empty" in r.stderr
    gw = start_gateway(upstream, tmp_path / "store")
    try:
        assert "user:***@127.0.0.1:9" in gw.output[0] and "pa55word" not in gw.output[0]
    finally:
        gw.stop()


def test_item7_stats_show_no_absolute_store_path(raw_gateway: Gateway) -> None:
    text = httpx.get(raw_gateway.url + "/stats", timeout=30).text
    assert str(raw_gateway.store) not in text
    assert json.loads(text)["store"]["store"] == raw_gateway.store.name


def test_item7_end_of_unknown_session_is_404_and_creates_nothing(raw_gateway: Gateway) -> None:
    sid = "never-seen-" + new_id()
    r = httpx.post(raw_gateway.url + f"/sessions/{sid}/end", timeout=30)
    assert r.status_code == 404 and sid in r.json()["error"]["message"]
    assert sid not in _sessions(raw_gateway)
