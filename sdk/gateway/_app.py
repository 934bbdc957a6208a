"""The gateway's ASGI app: an OpenAI-compatible reverse proxy that records model calls into the store.

Model calls (``POST .../chat/completions`` and ``POST .../responses``) are recorded: the request JSON and
the response body (SSE streams forwarded event by event as they arrive, and reassembled for the record)
go through the same converter as the in-process OpenAI transport (:func:`sdk.openai_wire.parse_exchange`).
Every other request is passed through untouched. Headers are forwarded and never recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

import sdk
from sdk import _env
from sdk._token_data import strip_token_data, token_data_params
from sdk.capture import Session, capture_internal_exceptions, count, record_call
from sdk.gateway._sessions import SessionTable
from sdk.openai_wire import decode_body, error_body, parse_exchange

__all__ = ["ENV_CONFIG", "GatewayConfig", "app_from_env", "create_app"]

logger = logging.getLogger("tracerl.gateway")

ENV_CONFIG = _env.TRACERL_GATEWAY_CONFIG
"""How the command line hands its configuration to worker processes (JSON of :class:`GatewayConfig`)."""

SESSION_HEADER = "x-tracerl-session"
TASK_HEADER = "x-tracerl-task"
SAMPLE_HEADER = "x-tracerl-sample"
METADATA_HEADER = "x-tracerl-metadata"

_ENDPOINTS = (("/chat/completions", "chat.completions"), ("/responses", "responses"))
# Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy recomputes are never forwarded.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_TERMINAL_TYPES = (b"response.completed", b"response.failed", b"response.incomplete")
_TERMINAL_MARKS = (b"[DONE]", *_TERMINAL_TYPES)


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """What a gateway worker needs to know.

    Attributes:
        upstream: Base URL of the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000/v1``. A request to
            ``/v1/<rest>`` (or ``/sessions/<id>/v1/<rest>``) goes to ``<upstream>/<rest>``; any other path
            goes to the upstream's origin unchanged.
        store: Store directory (``None``: ``$TRACERL_STORE`` or ``./.tracerl``).
        token_data: Ask the upstream for logprobs (and vLLM token ids on chat completions).
        strip_token_data: Remove from responses the token data the client did not ask for.
        timeout_s: Upstream timeout in seconds (connect, read and write).
        max_open_sessions: Sessions a worker keeps open (least recently used ones are forgotten).
        otlp: Also take OTLP/HTTP trace exports at ``POST /v1/traces`` and write their GenAI chat spans
            into the store (as ``python -m sdk.otel receive`` does; needs ``tracerl[otel]``).

    Example:
        >>> GatewayConfig(upstream="http://127.0.0.1:8000/v1").token_data
        False
    """

    upstream: str
    store: str | None = None
    token_data: bool = False
    strip_token_data: bool = False
    timeout_s: float = 600.0
    max_open_sessions: int = 100_000
    otlp: bool = False


class _Stats:
    """This worker's counters, served on ``GET /stats``."""

    def __init__(self) -> None:
        self.calls = 0
        self.passthrough = 0
        self.upstream_errors = 0
        self.client_disconnects = 0
        self.started = time.time()

    def snapshot(self, table: SessionTable) -> dict[str, Any]:
        store = sdk.stats()
        failures = {k: store.get(k, 0) for k in ("write_failures", "events_dropped", "internal_errors")}
        return {
            "worker_pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            "calls": self.calls,
            "passthrough": self.passthrough,
            "upstream_errors": self.upstream_errors,
            "client_disconnects": self.client_disconnects,
            "open_sessions": len(table),
            "store_failures": sum(failures.values()),
            "store": store,
        }


def _split_session(path: str) -> tuple[str | None, str]:
    """``/sessions/<id>/<rest>`` -> ``(id, /<rest>)``; other paths -> ``(None, path)``."""
    if path.startswith("/sessions/"):
        sid, sep, rest = path[len("/sessions/") :].partition("/")
        if sid and sep:
            return sid, "/" + rest
    return None, path


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        count("gateway_bad_headers")
        logger.warning("tracerl gateway: ignoring %s=%r (not an integer)", SAMPLE_HEADER, value)
        return None


def _metadata(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        meta = json.loads(value)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        count("gateway_bad_headers")
        logger.warning("tracerl gateway: ignoring %s (not a JSON object): %.200s", METADATA_HEADER, value)
        return {}
    return meta


class _SSEForwarder:
    """Forwards an SSE stream event by event and holds back its terminal event until the call is stored.

    Bytes of an event are sent once the event is complete (a client cannot use half an event), so a chunk
    is forwarded as soon as it completes one. The terminal event (``data: [DONE]`` or a final
    ``response.*`` event) and anything after it wait for :meth:`rest`, called after the record is written:
    a client that saw the end of its stream can rely on the call being in the store.
    """

    __slots__ = ("buf", "held", "endpoint", "strip")

    def __init__(self, endpoint: str, strip: frozenset[str]) -> None:
        self.buf = b""
        self.held = False
        self.endpoint = endpoint
        self.strip = strip

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        if self.held:
            return b""
        lf, crlf = self.buf.rfind(b"\n\n"), self.buf.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if cut == 0:  # no complete event yet
            return b""
        ready, self.buf = self.buf[:cut], self.buf[cut:]
        term = _terminal_at(ready)
        if term >= 0:
            ready, self.buf, self.held = ready[:term], ready[term:] + self.buf, True
        return self._out(ready)

    def rest(self) -> bytes:
        out, self.buf = self.buf, b""
        return self._out(out)

    def _out(self, data: bytes) -> bytes:
        if not self.strip or not data:
            return data
        return b"".join(_strip_event(ev, self.endpoint, self.strip) for ev in _events(data))


def _events(data: bytes) -> list[bytes]:
    """Split complete SSE data into events, each with its terminating blank line."""
    out = []
    start = 0
    while start < len(data):
        end = data.find(b"\n\n", start)
        if end < 0:
            out.append(data[start:])
            break
        out.append(data[start : end + 2])
        start = end + 2
    return out


def _terminal_at(data: bytes) -> int:
    """Offset of the first terminal event in ``data`` (complete events), or -1."""
    # Events before the first place a terminal marker could be are not terminal: skip their lines.
    first = min((i for i in (data.find(n) for n in _TERMINAL_MARKS) if i >= 0), default=-1)
    if first < 0:
        return -1
    offset = 0
    for ev in _events(data):
        end = offset + len(ev)
        if end > first and _is_terminal(ev):
            return offset
        offset = end
    return -1


def _is_terminal(ev: bytes) -> bool:
    for line in ev.split(b"\n"):
        line = line.strip()
        if line in (b"data: [DONE]", b"data:[DONE]"):
            return True
        if line.startswith(b"event:") and line[6:].strip() in _TERMINAL_TYPES:
            return True
        if line.startswith(b"data:") and any(
            b'"type":"' + t + b'"' in line or b'"type": "' + t + b'"' in line for t in _TERMINAL_TYPES
        ):
            return True
    return False


def _strip_event(ev: bytes, endpoint: str, added: frozenset[str]) -> bytes:
    lines = ev.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            try:
                payload = json.loads(line[5:])
            except ValueError:
                continue
            payload = strip_token_data(endpoint, payload, added)
            lines[i] = b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return b"\n".join(lines)


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]
"""An ASGI application: ``await app(scope, receive, send)``."""


def create_app(config: GatewayConfig) -> ASGIApp:
    """Build the gateway's ASGI app for one worker.

    Args:
        config: The gateway configuration; its store is configured here (``sdk.configure``).

    Returns:
        A plain ASGI app; serve it with uvicorn (``python -m sdk.gateway`` does).

    Example:
        >>> app = create_app(GatewayConfig(upstream="http://127.0.0.1:8000/v1"))  # doctest: +SKIP
    """
    if config.store is not None:
        sdk.configure(store=config.store)
    return _Gateway(config)


class _Gateway:
    """The ASGI app of one worker.

    A plain ASGI callable rather than a framework's request and response objects: the proxy is the hot
    path, and it needs only the raw headers and body of a call (benchmark: tests/bench/gateway.py).
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        parts = urlsplit(config.upstream.rstrip("/"))
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")  # e.g. "/v1"
        self.table = SessionTable(config.max_open_sessions)
        self.stats = _Stats()
        self._client: aiohttp.ClientSession | None = None
        self.otlp: Any = None  # a SpanCollector with config.otlp, made at start-up
        self._otlp_flusher: asyncio.Task[None] | None = None

    # -- ASGI ------------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.config.otlp:
                    from sdk.otel._collector import SpanCollector

                    self.otlp = SpanCollector(None)  # this worker's configured store
                    self._otlp_flusher = asyncio.create_task(self._flush_otlp())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.close()
                if self._otlp_flusher is not None:
                    self._otlp_flusher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._otlp_flusher
                    with capture_internal_exceptions("gateway.otlp"):
                        self.otlp.flush(force=True)
                # Open gateway sessions are not ended: a restarted gateway continues them (the reader
                # merges the parts). The implicit session of this worker ends, as at any process exit.
                sdk.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the worker's running loop.
        if self._client is None:
            t = self.config.timeout_s
            self._client = aiohttp.ClientSession(
                # One pool for every client of this worker, unbounded as the clients' own concurrency is.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t),
                # Bodies and headers go through as they are: no decompression, no headers of our own,
                # no cookies carried from one client to another.
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._client

    async def _http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        method = scope["method"]
        path = scope["path"]
        if method == "GET" and path == "/stats":
            snapshot = self.stats.snapshot(self.table)
            if self.otlp is not None:
                o = self.otlp.summary
                snapshot["otlp"] = {"spans": o.spans, "chat_spans": o.chat_spans, "sessions": o.sessions}
                snapshot["otlp"]["skipped"] = dict(o.skipped)
            return await _send_json(send, 200, snapshot)
        if method == "POST" and path == "/v1/traces" and self.otlp is not None:
            return await self._traces(scope, receive, send)
        path_sid, rel = _split_session(path)
        if method == "POST" and path_sid is not None and rel in ("/reward", "/end"):
            body = _json_or_none(await _read_body(receive))
            if rel == "/reward":
                return await self._reward(send, path_sid, body)
            error = body.get("error") if isinstance(body, dict) else None
            with capture_internal_exceptions("gateway.end"):
                self.table.end(path_sid, None if error is None else str(error))
            return await _send_json(send, 200, {"session_id": path_sid, "ok": True})
        await self._proxy(scope, receive, send, path_sid, rel)

    async def _traces(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await _read_body(receive)
        status, data, media_type = await asyncio.to_thread(
            self.otlp.receive, body, headers.get("content-type", ""), headers.get("content-encoding", "")
        )
        out = [(b"content-type", media_type.encode()), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": data})

    async def _flush_otlp(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            with capture_internal_exceptions("gateway.otlp"):  # a bad batch never stops the gateway
                await asyncio.to_thread(self.otlp.flush)

    async def _reward(self, send: Send, session_id: str, body: Any) -> None:
        if not isinstance(body, dict) or "value" not in body:
            msg = 'expected a JSON object {"value": number, "name"?: str, "call_id"?: str}'
            return await _send_error(send, 400, msg)
        try:
            self.table.reward(
                session_id, body["value"], body.get("name") or "reward", call_id=body.get("call_id")
            )
        except ValueError as exc:
            return await _send_error(send, 400, str(exc))
        await _send_json(send, 200, {"session_id": session_id, "ok": True})

    # -- the proxy -------------------------------------------------------------------------------------

    def target_url(self, scope: dict[str, Any], path_sid: str | None) -> URL:
        # The raw (still percent-encoded) path goes upstream as the client sent it.
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if raw else scope["path"]
        if path_sid is not None:
            path = _split_session(path)[1]
        # /v1/<rest> -> <upstream>/<rest>; anything else -> the upstream's origin, path unchanged.
        if path == "/v1" or path.startswith("/v1/"):
            path = self.base_path + path[3:]
        query = scope.get("query_string")
        url = self.origin + (path or "/") + ("?" + query.decode("latin-1") if query else "")
        return URL(url, encoded=True)

    async def _proxy(
        self, scope: dict[str, Any], receive: Receive, send: Send, path_sid: str | None, rel: str
    ) -> None:
        method = scope["method"]
        headers: list[tuple[str, str]] = []
        tracerl: dict[str, str] = {}
        accept_encoding: list[tuple[str, str]] = []
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            if name.startswith("x-tracerl-"):
                tracerl[name] = v.decode("latin-1")
            elif name == "accept-encoding":
                accept_encoding.append((name, v.decode("latin-1")))
            elif name not in _HOP:
                headers.append((name, v.decode("latin-1")))
        body = await _read_body(receive)
        url = self.target_url(scope, path_sid)
        endpoint = None
        if method == "POST":
            route = rel.rstrip("/")
            endpoint = next((name for suffix, name in _ENDPOINTS if route.endswith(suffix)), None)
        payload: Any = _json_or_none(body) if endpoint is not None else None
        if endpoint is None or not isinstance(payload, dict):
            # Not recorded: the body is never read here, so the client's own encodings go through.
            return await self._passthrough(send, method, url, headers + accept_encoding, body)
        # Recorded: loopback or LAN to the model server, an uncompressed body is cheaper than gzip, and can
        # be forwarded and recorded without decoding.
        headers.append(("accept-encoding", "identity"))
        added: frozenset[str] = frozenset()
        if self.config.token_data:
            payload, added = token_data_params(endpoint, payload)
            if added:
                body = json.dumps(payload).encode("utf-8")
        strip = added if self.config.strip_token_data else frozenset()
        s = self.session_for(tracerl, path_sid)
        call = _Call(endpoint, payload, s, strip, time.time())
        try:
            resp = await self.client().request(method, url, headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return await self._failed(send, call, exc, "request")
        try:
            if "text/event-stream" in resp.headers.get("content-type", ""):
                await self._stream(receive, send, call, resp)
                return
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                return await self._failed(send, call, exc, "response")
        finally:
            resp.release()
        if resp.status >= 400:
            self.stats.upstream_errors += 1
        self.record(call, resp, raw)  # before the client gets a byte of the answer
        if strip and resp.status < 400 and not resp.headers.get("content-encoding"):
            raw = _strip_body(endpoint, raw, strip)
        out = _response_headers(resp)
        out.append((b"content-length", str(len(raw)).encode("latin-1")))
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        await send({"type": "http.response.body", "body": raw})

    async def _failed(self, send: Send, call: _Call, exc: BaseException, what: str) -> None:
        self.stats.upstream_errors += 1
        name = _error_name(exc)
        self.record_failure(call, name, exc)
        await _send_error(send, 502, f"tracerl gateway: upstream {what} failed: {name}: {exc}")

    async def _stream(self, receive: Receive, send: Send, call: _Call, resp: aiohttp.ClientResponse) -> None:
        """Forward an SSE response as it arrives; record it before its terminal event is sent."""
        await send({"type": "http.response.start", "status": resp.status, "headers": _response_headers(resp)})
        # A client that goes away mid-stream shows up only on `receive`: watch it, and stop this call
        # when it does (as a framework's streaming response would).
        task = asyncio.current_task()
        streaming = True

        def on_message(fut: asyncio.Future[dict[str, Any]]) -> None:
            if streaming and task is not None and not fut.cancelled() and fut.exception() is None:
                task.cancel()

        watch = asyncio.ensure_future(receive())
        watch.add_done_callback(on_message)
        forwarder = _SSEForwarder(call.endpoint, call.strip)
        chunks: list[bytes] = []
        recorded = False
        try:
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
                out = forwarder.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            self.record(call, resp, b"".join(chunks))
            recorded = True
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats.upstream_errors += 1
            self.record_failure(call, _error_name(exc), exc)
            recorded = True
            raise  # the client sees the stream break, as it would without the gateway
        finally:
            streaming = False
            if not recorded:  # the client went away (this task was cancelled)
                self.stats.client_disconnects += 1
                self.record_failure(
                    call, "ConnectionAbortedError", ConnectionAbortedError("client disconnected")
                )
            watch.cancel()
        await send({"type": "http.response.body", "body": forwarder.rest(), "more_body": False})

    async def _passthrough(
        self, send: Send, method: str, url: URL, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        self.stats.passthrough += 1
        try:
            resp = await self.client().request(
                method, url, headers=headers, data=body or None, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            msg = f"tracerl gateway: upstream request failed: {_error_name(exc)}: {exc}"
            return await _send_error(send, 502, msg)
        try:
            await send(
                {"type": "http.response.start", "status": resp.status, "headers": _response_headers(resp)}
            )
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            resp.release()

    # -- sessions and records --------------------------------------------------------------------------

    def session_for(self, h: dict[str, str], path_sid: str | None) -> Session | None:
        sid = path_sid or h.get(SESSION_HEADER)
        if not sid or not sid.strip():
            if h.get(TASK_HEADER):
                count("gateway_task_without_session")
            return None  # the worker's implicit session, as in-process capture
        with capture_internal_exceptions("gateway.session"):
            return self.table.get(
                sid.strip(),
                task_id=h.get(TASK_HEADER) or None,
                sample=_int_or_none(h.get(SAMPLE_HEADER)),
                metadata=_metadata(h.get(METADATA_HEADER)),
            )
        return None

    def record(self, call: _Call, resp: aiohttp.ClientResponse, raw: bytes) -> None:
        with capture_internal_exceptions("gateway.record"):
            decoded = decode_body(raw, resp.headers.get("content-encoding", ""))
            if decoded is None:
                count("gateway_undecodable_bodies")
                decoded = b""
            record = parse_exchange(
                call.endpoint,
                call.payload,
                resp.status,
                decoded,
                content_type=resp.headers.get("content-type", "application/json"),
                started_at=call.started,
                ended_at=time.time(),
                request_id=resp.headers.get("x-request-id"),
                framework="gateway",
            )
            self.stats.calls += 1
            record_call(record, call.session)  # firewalled: a store failure is counted, never raised

    def record_failure(self, call: _Call, name: str, exc: BaseException) -> None:
        with capture_internal_exceptions("gateway.record"):
            record = parse_exchange(
                call.endpoint,
                call.payload,
                599,
                b"",
                started_at=call.started,
                ended_at=time.time(),
                framework="gateway",
            )
            record.error = {"type": name, "message": str(exc)[:2000], "status": None}
            self.stats.calls += 1
            record_call(record, call.session)


@dataclasses.dataclass
class _Call:
    """A model call in flight."""

    endpoint: str
    payload: dict[str, Any]
    session: Session | None
    strip: frozenset[str]
    started: float


def _error_name(exc: BaseException) -> str:
    # Recorded names do not depend on the HTTP client the gateway uses (they are httpx's names).
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"
    if isinstance(exc, TimeoutError):
        return "ReadTimeout"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "RemoteProtocolError"
    return type(exc).__name__


def _response_headers(resp: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    out = []
    for k, v in resp.raw_headers:
        k = k.lower()
        if k.decode("latin-1") not in _HOP:
            out.append((k, v))
    return out


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


def _json_or_none(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def _send_json(send: Send, status: int, obj: Any) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode("latin-1"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_error(send: Send, status: int, message: str) -> None:
    kind = "invalid_request_error" if status < 500 else "gateway_error"
    await _send_json(send, status, error_body(message, kind))


def _strip_body(endpoint: str, raw: bytes, added: frozenset[str]) -> bytes:
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(strip_token_data(endpoint, payload, added)).encode("utf-8")


def app_from_env() -> ASGIApp:
    """The app for one worker process, configured from ``$TRACERL_GATEWAY_CONFIG`` (set by the CLI).

    Example:
        >>> app = app_from_env()  # doctest: +SKIP
    """
    raw = os.environ.get(ENV_CONFIG)
    if not raw:
        raise RuntimeError(f"{ENV_CONFIG} is not set; start the gateway with `python -m sdk.gateway`")
    return create_app(GatewayConfig(**json.loads(raw)))
