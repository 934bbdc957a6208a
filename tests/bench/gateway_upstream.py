"""A fast scripted upstream for the gateway benchmark: canned chat completions on uvicorn.

``sdk.testing``'s server (a threaded ``http.server``, one connection per stream) is built to be exact, not
fast: it caps direct calls at ~150/s on two cores, so a benchmark against it measures it. This one answers
``POST /v1/chat/completions`` (plain and streamed, keep-alive, a unique ``x-request-id`` per call) in the
same shapes, from a plain ASGI callable on uvicorn (uvloop + httptools when installed), and reports its
own CPU time on ``GET /cpu``.

Run: ``python tests/bench/gateway_upstream.py [--port 0]``; prints ``... listening on http://HOST:PORT/v1``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import uuid
from typing import Any

CONTENT = ["Hello", "!", " How", " can", " I", " help", " you", " today", "?"]


def _completion(cid: str) -> bytes:
    return json.dumps(
        {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "m-2026-01-01",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(CONTENT), "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": len(CONTENT),
                "total_tokens": 12 + len(CONTENT),
            },
        }
    ).encode()


def _chunks(cid: str) -> list[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        ev = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": "m-2026-01-01",
              "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}  # fmt: skip
        return b"data: " + json.dumps(ev).encode() + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""}, None)]
    out += [chunk({"content": c}, None) for c in CONTENT]
    out.append(chunk({}, "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    rid = ("req_" + uuid.uuid4().hex).encode()
    if scope["path"] == "/cpu":
        t = os.times()
        data = json.dumps({"cpu_s": t.user + t.system, "pid": os.getpid()}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": data})
        return
    cid = "chatcmpl-" + uuid.uuid4().hex
    if b'"stream": true' in body or b'"stream":true' in body:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-request-id", rid)]})  # fmt: skip
        chunks = _chunks(cid)
        # Two writes, as a model server sends the first token before the rest.
        await send({"type": "http.response.body", "body": chunks[0], "more_body": True})
        await send({"type": "http.response.body", "body": b"".join(chunks[1:]), "more_body": False})
        return
    data = _completion(cid)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"x-request-id", rid)]})  # fmt: skip
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY on accept
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    port = sock.getsockname()[1]
    print(f"bench upstream listening on http://127.0.0.1:{port}/v1", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            server_header=False, date_header=False, backlog=2048)  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
