"""The gateway and JSON nested without bound: forwarded (or a 400) and counted, never its own 500.

A recording gateway with ``--token-data --strip-token-data`` in front of a loopback server that returns
token ids; the agent is the real openai client. A reply nested 100,000 levels deep used to make the
gateway answer 500 itself (a recursion error re-encoding it); it is forwarded as the upstream sent it and
counted, and the session's other calls are trained exactly once on the prompt ids the server received.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")
pytest.importorskip("polars")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from sdk.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import new_id, start_gateway  # noqa: E402
from tests.support.trained_once import ServerIds, assert_trained_once, convert  # noqa: E402

DEPTH = 100_000
DEEP = b"[" * DEPTH + b"]" * DEPTH


def _deep_when_asked(request: RecordedRequest) -> ScriptedResponse | None:
    """A request whose last message says "deep" gets a reply nested 100,000 levels deep (JSON or one SSE
    event); a request that is not JSON (or nested past the parser) a plain answer; the rest the server's."""
    req = request.json
    if req is None:
        return ScriptedResponse.raw(b'{"choices": []}')
    if req["messages"][-1]["content"] != "deep":
        return None
    if req.get("stream"):
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}], "x": ' + DEEP + b"}\n\n"
        return ScriptedResponse.raw(event + b"data: [DONE]\n\n", content_type="text/event-stream")
    return ScriptedResponse.raw(b'{"choices": [], "x": ' + DEEP + b"}")


def test_deep_replies_and_bodies_are_forwarded_and_counted_and_the_rest_trained_once(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    ids = ServerIds(tiny_tokenizer)
    routes = {"POST /v1/chat/completions": _deep_when_asked}
    fine = lambda req, ep: ScriptedResponse.text("fine")  # noqa: E731
    with ScriptedOpenAIServer(token_ids=ids, policy=fine, routes=routes) as server:
        gw = start_gateway(server.base_url, tmp_path / "store", args=("--token-data", "--strip-token-data"))
        try:
            sid = new_id()
            client = openai.OpenAI(
                base_url=gw.base(sid), api_key="x", max_retries=0, default_headers={"x-tracerl-task": "t"}
            )
            msgs = [{"role": "user", "content": "first"}]
            reply = client.chat.completions.create(model="m", messages=msgs).choices[0].message
            msgs += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "second"}]
            client.chat.completions.create(model="m", messages=msgs)
            url = gw.base(sid) + "/chat/completions"
            deep_msgs = [{"role": "user", "content": "deep"}]
            for stream in (False, True):  # the reply nested too deeply to strip: forwarded as sent
                r = httpx.post(url, json={"model": "m", "messages": deep_msgs, "stream": stream}, timeout=30)
                assert r.status_code == 200 and DEEP in r.content
            body = b'{"model": "m", "messages": [], "x": ' + DEEP + b"}"  # past the parser: forwarded
            assert httpx.post(url, content=body, timeout=30).status_code == 200
            gw.reward(sid, 1.0)
            gw.end(sid)
            stats = httpx.get(gw.url + "/stats", timeout=30).json()["store"]
            time.sleep(0.2)  # log lines are written by the gateway process
            assert not any("Traceback" in line for line in gw.output)
        finally:
            gw.stop()
    assert stats["gateway_responses_not_stripped"] == 2 and stats["gateway_unrecorded_requests"] == 1
    assert stats["internal_errors"] == 0
    assert "prompt_token_ids" not in reply.model_dump()  # stripped where it could be
    convs, rep = convert(tmp_path / "store", tiny_tokenizer)
    assert_trained_once(convs, ids.generations)  # the two generations, once each, on their prompt ids
