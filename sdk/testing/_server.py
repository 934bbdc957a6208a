"""The scripted server itself: a threaded ``http.server`` answering from a queue or a policy, and its CLI.

Example:
    >>> ScriptedOpenAIServer(latency_s=0.5).latency_s
    0.5
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sdk.openai_wire import (
    SSE_DONE,
    MappingError,
    chat_request_of,
    error_body,
    message_events,
    message_of_chat,
    sse,
)
from sdk.testing._render import (
    _build_turn,
    _chat_chunks,
    _chat_completion,
    _response,
    _response_events,
    _set_token_ids,
)
from sdk.testing._responses import RecordedRequest, ScriptedResponse, _error_kind, default_policy

__all__ = ["Route", "ScriptedOpenAIServer", "main"]

Route = Callable[..., "ScriptedResponse | None"]
"""A route's handler: ``handler(request, **path_params)`` → its reply, or ``None`` for the built-in one."""

# --------------------------------------------------------------------------- HTTP plumbing


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 4096
    allow_reuse_address = True
    owner: ScriptedOpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # clients hanging up is normal; stay quiet
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK stall every
    # keep-alive response by ~40 ms, which would swamp any latency measurement against this server.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        data = b""
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            data += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return data

    def _handle(self) -> None:
        owner, request_id = self.server.owner, "req_" + uuid.uuid4().hex
        (path, _, query), body = self.path.partition("?"), self._read_body()
        try:
            parsed: Any = json.loads(body) if body else None
        except (ValueError, RecursionError):
            parsed = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = RecordedRequest(
            self.command, path, headers, parsed, body, time.time(), dict(urllib.parse.parse_qsl(query))
        )
        owner._record(request)
        self._unanswered = True  # counted in flight until its first byte goes out (or it fails)
        try:
            self._route(owner, request, request_id)
        finally:
            self._answering()

    def _answering(self) -> None:
        """The reply starts: the request no longer counts as in flight (before the client can see it)."""
        if getattr(self, "_unanswered", False):
            self._unanswered = False
            self.server.owner._answered()

    def _route(self, owner: ScriptedOpenAIServer, request: RecordedRequest, request_id: str) -> None:
        if owner.latency_s > 0:
            time.sleep(owner.latency_s)
        path, parsed = request.path, request.json
        route, get = (path[3:] if path.startswith("/v1/") else path).rstrip("/"), self.command == "GET"
        try:
            own = owner._own_route(request)
            if own is not None:
                self._send_reply(own, request_id)
            elif get and route == "/models":
                data = [{"id": m, "object": "model", "created": 1767225600, "owned_by": "tracerl"}
                        for m in owner._models()]  # fmt: skip
                self._send_json(200, {"object": "list", "data": data}, request_id)
            elif get and route == "/health":
                self._send_json(200, {"status": "ok"}, request_id)
            elif self.command == "POST" and route in ("/chat/completions", "/responses", "/messages"):
                if isinstance(parsed, dict):
                    self._complete(parsed, route.strip("/").replace("/", "."), request_id)
                else:
                    self._send_error(ScriptedResponse.error(400, "Body must be a JSON object."), request_id)
            else:
                self._send_error(ScriptedResponse.error(404, f"No route {self.command} {path}."), request_id)
        except OSError:
            self.close_connection = True
        except Exception as exc:  # a bug in this server: surface it to the client as a 500
            import traceback

            msg = f"tracerl test server error: {exc!r}\n{traceback.format_exc()}"
            self._send_error(ScriptedResponse.error(500, msg), request_id)

    def _complete(self, req: dict, endpoint: str, request_id: str) -> None:
        if endpoint == "messages":
            return self._anthropic(req, request_id)
        resp = self.server.owner._next_response(req, endpoint)
        if resp.kind == "error":
            return self._send_error(resp, request_id)
        if resp.kind == "raw":
            return self._send_raw(resp, request_id)
        t, created = _build_turn(resp, req, endpoint, self.server.owner.model_suffix), int(time.time())
        stream = bool(req.get("stream"))
        if endpoint == "chat.completions":
            cid = "chatcmpl-" + uuid.uuid4().hex
            n = max(1, int(req.get("n") or 1))
            if not stream:
                body = _chat_completion(t, cid, created, n)
                token_ids = self.server.owner.token_ids
                if token_ids is not None and t.token_ids:
                    _set_token_ids(body, *token_ids(req, resp), t.logprobs)
                return self._send_json(200, body, request_id)
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            stream_chunks = _chat_chunks(t, cid, created, include_usage, n)
            token_ids = self.server.owner.token_ids
            if token_ids is not None and t.token_ids and n == 1:
                stream_chunks = _stream_token_ids(stream_chunks, *token_ids(req, resp), t.logprobs)
            chunks = ((None, c) for c in stream_chunks)
            return self._send_sse(chunks, request_id, done_marker=True)
        rid = "resp_" + uuid.uuid4().hex
        if not stream:
            body = self._with_response_ids(_response(t, req, rid, created, final=True), req, resp)
            return self._send_json(200, body, request_id)
        events = (
            (e["type"], {**e, "response": self._with_response_ids(e["response"], req, resp)})
            if e["type"] in ("response.completed", "response.incomplete")
            else (e["type"], e)
            for e in _response_events(t, req, rid, created)
        )
        return self._send_sse(events, request_id, done_marker=False)

    def _with_response_ids(self, body: dict, req: dict, resp: ScriptedResponse) -> dict:
        """The token ids vLLM returns with ``enable_response_messages`` (from the token-ids hook)."""
        token_ids = self.server.owner.token_ids
        if token_ids is None or not req.get("enable_response_messages"):
            return body
        prompt, completion = token_ids(req, resp)
        raw = [
            {"type": "raw_message_tokens", "message": "", "tokens": list(ids)} for ids in (prompt, completion)
        ]
        return {**body, "input_messages": raw[:1], "output_messages": raw[1:]}

    def _anthropic(self, req: dict, request_id: str) -> None:
        """Anthropic's Messages API: the chat reply to the same conversation, as a message or its events."""
        try:
            chat = chat_request_of(req)
        except MappingError as exc:
            error = {"type": "invalid_request_error", "message": str(exc)}
            return self._send_json(400, {"type": "error", "error": error}, request_id)
        resp = self.server.owner._next_response(chat, "chat.completions")
        if resp.kind == "error":
            return self._send_error(resp, request_id)
        if resp.kind == "raw":
            return self._send_raw(resp, request_id)
        t = _build_turn(resp, chat, "chat.completions", self.server.owner.model_suffix)
        message = message_of_chat(_chat_completion(t, "c", int(time.time())), t.model)
        if not req.get("stream"):
            return self._send_json(200, message, request_id)
        return self._send_sse(iter(message_events(message)), request_id, done_marker=False, numbered=False)

    def _send_json(self, status: int, payload: Any, request_id: str) -> None:
        data = json.dumps(payload).encode("utf-8")
        self._answering()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", request_id)
        self.end_headers()
        self.wfile.write(data)

    def _send_reply(self, resp: ScriptedResponse, request_id: str) -> None:
        """A route's reply: an error or raw bytes (a completion a route wants is the built-in one)."""
        if resp.kind == "error":
            return self._send_error(resp, request_id)
        if resp.kind != "raw":
            raise TypeError(f"a route answers with ScriptedResponse.error, .raw or .json_body: {resp.kind}")
        return self._send_raw(resp, request_id)

    def _send_error(self, resp: ScriptedResponse, request_id: str) -> None:
        kind, code = _error_kind(resp.status)
        body = error_body(resp.error_message, resp.error_type or kind, code=code)
        self._send_json(resp.status, body, request_id)

    def _send_raw(self, resp: ScriptedResponse, request_id: str) -> None:
        """A :meth:`ScriptedResponse.raw` reply: its bytes as they are, delimited as it says."""
        self._answering()
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("x-request-id", request_id)
        for name, value in resp.headers:
            self.send_header(name, value)
        named = {name.lower() for name, _ in resp.headers}
        if resp.framing == "length" and "content-length" not in named:
            self.send_header("Content-Length", str(len(resp.body)))  # type: ignore[arg-type]
        elif resp.framing == "close":
            self.send_header("Connection", "close")
        elif resp.framing in ("chunked", "cut"):
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        parts: Iterable[bytes] = [resp.body] if isinstance(resp.body, bytes) else resp.body
        chunked = resp.framing in ("chunked", "cut")
        for part in filter(None, parts):  # an empty chunk would be the last one
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            self.wfile.flush()
        if resp.framing == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        if resp.framing in ("close", "cut"):  # the body ends with the connection (cut: before the last chunk)
            self.close_connection = True

    def _send_sse(
        self, events: Iterator[tuple[str | None, dict]], rid: str, done_marker: bool, numbered: bool = True
    ) -> None:
        self.close_connection = True
        self._answering()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("x-request-id", rid)
        self.end_headers()
        pause = self.server.owner.stream_delay_s  # type: ignore[attr-defined]
        for seq, (event, payload) in enumerate(events):
            if pause and seq:
                time.sleep(pause)  # lets a client stop reading mid-stream (an abandoned stream)
            if event is not None and numbered:  # the Responses API numbers its events
                payload = {**payload, "sequence_number": seq}
            self.wfile.write(sse(payload, event))
        if done_marker:
            self.wfile.write(SSE_DONE)


def _stream_token_ids(
    chunks: Iterator[dict], prompt: list[int], completion: list[int], logprobs: bool
) -> Iterator[dict]:
    """Chunks carrying a token-ids hook's ids: the prompt's on the first, the completion's on the finish."""
    for i, chunk in enumerate(chunks):
        chunk = {**chunk, "prompt_token_ids": list(prompt)} if i == 0 else chunk
        choices = []
        for choice in chunk.get("choices") or []:
            choice = {k: v for k, v in choice.items() if k not in ("token_ids", "logprobs")}
            if choice.get("finish_reason"):
                body = {"choices": [choice], "usage": {}}
                _set_token_ids(body, prompt, completion, logprobs)
                choice = body["choices"][0]
            choices.append(choice)
        yield {**chunk, "choices": choices}


# --------------------------------------------------------------------------- server


class ScriptedOpenAIServer:
    """An OpenAI-compatible HTTP server on a background thread, answering from a queue or a policy.

    Each reply comes from, in order: a route of its own (``routes``, see below; returning ``None`` falls
    through); the FIFO queue filled by :meth:`enqueue` (shared by all endpoints);
    ``policy(request_json, endpoint)`` where ``endpoint`` is ``"chat.completions"`` or ``"responses"``
    (returning ``None`` falls through); :func:`default_policy`.

    ``routes`` adds the rest of an API that a test stands in for (vLLM's adapter and weight routes, a
    fine-tuning API, an upstream that misbehaves) to this one server: keys are ``"METHOD /path"``, where
    ``METHOD`` may be ``*`` (any), a ``{name}`` path segment matches one segment, passed to the handler as
    a keyword, and the path ``*`` matches every path; routes are tried in order.
    ``handler(request, **params)`` gets the :class:`RecordedRequest` and answers with
    :meth:`ScriptedResponse.json_body`, :meth:`~ScriptedResponse.raw` (parts that wait make a slow or
    stalled reply) or :meth:`~ScriptedResponse.error`. Handlers run on the server's threads, one per
    request, so one may block (say, while a fake engine is paused).

    Args:
        host: Interface to bind.
        port: Port; 0 picks a free one.
        model_suffix: Appended to the requested model in replies, so requested and returned models differ.
        latency_s: Seconds to sleep before answering each request.
        stream_delay_s: Seconds to sleep between the events of a streamed reply.
        token_ids: ``token_ids(request_json, response) -> (prompt_ids, completion_ids)``: the ids a chat
            reply returns when asked (``return_token_ids``; streamed, the prompt's on the first chunk and
            the completion's on the finish chunk) and a Responses reply with ``enable_response_messages``,
            instead of the fake tokenizer's, e.g. a real tokenizer's with a word spelled in unusual
            tokens; chat logprobs follow them.
        policy: Optional callable replacing the default policy.
        routes: Routes of the test's own, ``{"POST /v1/jobs/{id}/cancel": handler}``, matched first.

    Example:
        >>> with ScriptedOpenAIServer(latency_s=0.01) as server:  # doctest: +SKIP
        ...     server.enqueue(ScriptedResponse.error(429, "slow down"))
        ...     print(server.base_url)
        http://127.0.0.1:54321/v1
        >>> ok = lambda request: ScriptedResponse.json_body({"world_size": 1})
        >>> ScriptedOpenAIServer(routes={"GET /get_world_size": ok}).routes[0][0]
        'GET'
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_suffix: str = "-2026-01-01",
        latency_s: float = 0.0,
        policy: Callable[[dict, str], ScriptedResponse | None] | None = None,
        stream_delay_s: float = 0.0,
        token_ids: Callable[[dict, ScriptedResponse], tuple[list[int], list[int]]] | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self.host, self._port = host, port
        self.routes = [_compile_route(key, handler) for key, handler in (routes or {}).items()]
        self.stream_delay_s = stream_delay_s
        self.token_ids = token_ids
        self.model_suffix, self.latency_s, self.policy = model_suffix, latency_s, policy
        self.requests: list[RecordedRequest] = []
        self._queue: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._in_flight = self._max_in_flight = 0
        self._seen_models: dict[str, None] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ScriptedOpenAIServer:
        """Bind and serve on a daemon thread (no-op when started).

        Returns:
            ``self``.

        Example:
            >>> server = ScriptedOpenAIServer().start()  # doctest: +SKIP
        """
        if self._httpd is None:
            self._httpd = _HTTPServer((self.host, self._port), _Handler)
            self._httpd.owner = self
            kwargs = {"poll_interval": 0.05}
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs=kwargs, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close open keep-alive connections (idempotent).

        Example:
            >>> server.stop()  # doctest: +SKIP
        """
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port; raises ``RuntimeError`` before :meth:`start`.

        Example:
            >>> server.port  # doctest: +SKIP
            54321
        """
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Root URL.

        Example:
            >>> server.url  # doctest: +SKIP
            'http://127.0.0.1:54321'
        """
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The openai client's ``base_url``.

        Example:
            >>> server.base_url  # doctest: +SKIP
            'http://127.0.0.1:54321/v1'
        """
        return self.url + "/v1"

    def enqueue(self, *responses: ScriptedResponse) -> None:
        """Queue replies for the next requests (FIFO, any endpoint), ahead of the policy.

        Example:
            >>> server.enqueue(ScriptedResponse.text("a"), ScriptedResponse.error(500, "x"))  # doctest: +SKIP
        """
        with self._lock:
            self._queue.extend(responses)

    def reset(self) -> None:
        """Clear the recorded requests, the queue and the peak of :attr:`max_in_flight`.

        Example:
            >>> server.reset()  # doctest: +SKIP
        """
        with self._lock:
            self.requests.clear()
            self._queue.clear()
            self._max_in_flight = self._in_flight

    @property
    def in_flight(self) -> int:
        """Requests received and not answered yet (a reply counts as answered once its first byte goes out).

        Example:
            >>> server.in_flight  # doctest: +SKIP
            0
        """
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most requests in flight at once since the start (or :meth:`reset`).

        Example:
            >>> server.max_in_flight  # doctest: +SKIP
            8
        """
        with self._lock:
            return self._max_in_flight

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            if isinstance(req.json, dict) and isinstance(req.json.get("model"), str):
                self._seen_models[req.json["model"]] = None

    def _answered(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _models(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(["tracerl-test-model", *self._seen_models]))

    def _own_route(self, request: RecordedRequest) -> ScriptedResponse | None:
        for method, pattern, handler in self.routes:
            match = pattern.fullmatch(request.path)
            if match and method in ("*", request.method):
                return handler(request, **match.groupdict())
        return None

    def _next_response(self, req: dict, endpoint: str) -> ScriptedResponse:
        with self._lock:
            queued = self._queue.popleft() if self._queue else None
        chosen = queued or (self.policy(req, endpoint) if self.policy is not None else None)
        return chosen or default_policy(req, endpoint)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)


def _compile_route(key: str, handler: Route) -> tuple[str, re.Pattern[str], Route]:
    """``"POST /v1/jobs/{id}"`` → its method and a pattern whose named groups are the ``{}`` segments."""
    method, _, path = key.partition(" ")
    if not path.startswith("/") and path != "*":
        raise ValueError(f"a route is 'METHOD /path', got {key!r}")
    pattern = ".*" if path == "*" else re.sub(r"\\{(\w+)\\}", r"(?P<\1>[^/]+)", re.escape(path))
    return method.upper(), re.compile(pattern), handler


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until SIGINT/SIGTERM (``python -m sdk.testing``).

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        Exit status.

    Example:
        >>> main(["--port", "8765"])  # doctest: +SKIP
        tracerl test server listening on http://127.0.0.1:8765/v1
    """
    import signal

    parser = argparse.ArgumentParser(prog="python -m sdk.testing", description="Scripted OpenAI test server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to sleep per request")
    parser.add_argument("--model-suffix", default="-2026-01-01")
    args = parser.parse_args(argv)
    server = ScriptedOpenAIServer(
        args.host, args.port, model_suffix=args.model_suffix, latency_s=args.latency
    )

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    server.start()
    print(f"tracerl test server listening on {server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
