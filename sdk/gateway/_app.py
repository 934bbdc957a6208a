"""The gateway's ASGI app: an OpenAI-compatible reverse proxy that records model calls into the store.

Model calls (``POST .../chat/completions`` and ``POST .../responses``) are recorded: the request JSON and
the response body (SSE streams forwarded event by event as they arrive, and reassembled for the record)
go through the same converter as the in-process OpenAI transport (:func:`sdk._openai_wire.parse_exchange`).
Every other request is passed through untouched. Headers are forwarded and never recorded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import sdk
from sdk._openai_wire import decode_body, parse_exchange
from sdk._token_data import strip_token_data, token_data_params
from sdk.capture import CallRecord, Session, capture_internal_exceptions, count, record_call
from sdk.gateway._sessions import SessionTable

__all__ = ["ENV_CONFIG", "GatewayConfig", "app_from_env", "create_app"]

logger = logging.getLogger("tracerl.gateway")

ENV_CONFIG = "TRACERL_GATEWAY_CONFIG"
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
        cut = max(self.buf.rfind(b"\n\n") + 2, self.buf.rfind(b"\r\n\r\n") + 4, 0)
        if cut == 0:
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
    if b"[DONE]" not in data and b"response." not in data:
        return -1
    offset = 0
    for ev in _events(data):
        for line in ev.split(b"\n"):
            line = line.strip()
            if line in (b"data: [DONE]", b"data:[DONE]"):
                return offset
            if line.startswith(b"event:") and line[6:].strip() in _TERMINAL_TYPES:
                return offset
            if line.startswith(b"data:") and any(
                b'"type":"' + t + b'"' in line or b'"type": "' + t + b'"' in line for t in _TERMINAL_TYPES
            ):
                return offset
        offset += len(ev)
    return -1


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


def create_app(config: GatewayConfig) -> FastAPI:
    """Build the gateway's ASGI app for one worker.

    Args:
        config: The gateway configuration; its store is configured here (``sdk.configure``).

    Returns:
        A FastAPI app; serve it with uvicorn (``python -m sdk.gateway`` does).

    Example:
        >>> app = create_app(GatewayConfig(upstream="http://127.0.0.1:8000/v1"))  # doctest: +SKIP
    """
    if config.store is not None:
        sdk.configure(store=config.store)
    upstream = httpx.URL(config.upstream.rstrip("/"))
    base_path = upstream.path.rstrip("/")  # e.g. "/v1"
    origin = upstream.copy_with(path="/", query=None)
    table = SessionTable(config.max_open_sessions)
    stats = _Stats()
    client: httpx.AsyncClient | None = None

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal client
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            follow_redirects=False,
        )
        try:
            yield
        finally:
            await client.aclose()
            # Open gateway sessions are not ended: a restarted gateway continues them (the reader merges
            # the parts). The implicit session of this worker ends, as at any process exit.
            sdk.shutdown()

    app = FastAPI(
        title="tracerl gateway",
        lifespan=_as_context(lifespan),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def target_url(path: str, query: bytes) -> httpx.URL:
        # /v1/<rest> -> <upstream>/<rest>; anything else -> the upstream's origin, path unchanged.
        if path == "/v1" or path.startswith("/v1/"):
            path = base_path + path[3:]
        return origin.copy_with(path=path or "/", query=query or None)

    def forward_headers(request: Request) -> list[tuple[str, str]]:
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k not in _HOP and not k.startswith("x-tracerl-") and k != "accept-encoding"
        ]
        # Loopback or LAN to the model server: an uncompressed body is cheaper than gzip, and can be
        # forwarded and recorded without decoding.
        headers.append(("accept-encoding", "identity"))
        return headers

    def response_headers(resp: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in resp.headers.items() if k not in _HOP}

    def session_for(request: Request, path_sid: str | None) -> Session | None:
        h = request.headers
        sid = path_sid or h.get(SESSION_HEADER)
        if not sid or not sid.strip():
            if h.get(TASK_HEADER):
                count("gateway_task_without_session")
            return None  # the worker's implicit session, as in-process capture
        with capture_internal_exceptions("gateway.session"):
            return table.get(
                sid.strip(),
                task_id=h.get(TASK_HEADER) or None,
                sample=_int_or_none(h.get(SAMPLE_HEADER)),
                metadata=_metadata(h.get(METADATA_HEADER)),
            )
        return None

    def store(record: CallRecord, s: Session | None) -> None:
        stats.calls += 1
        record_call(record, s)  # firewalled: a store failure is counted, never raised

    # -- the gateway's own endpoints -------------------------------------------------------------------

    @app.get("/stats")
    async def get_stats() -> dict[str, Any]:
        return stats.snapshot(table)

    @app.post("/sessions/{session_id}/reward")
    async def post_reward(session_id: str, request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or "value" not in body:
            return _error(400, 'expected a JSON object {"value": number, "name"?: str, "call_id"?: str}')
        try:
            table.reward(session_id, body["value"], body.get("name") or "reward", call_id=body.get("call_id"))
        except ValueError as exc:
            return _error(400, str(exc))
        return JSONResponse({"session_id": session_id, "ok": True})

    @app.post("/sessions/{session_id}/end")
    async def post_end(session_id: str, request: Request) -> Response:
        body = await _json_body(request)
        error = body.get("error") if isinstance(body, dict) else None
        with capture_internal_exceptions("gateway.end"):
            table.end(session_id, None if error is None else str(error))
        return JSONResponse({"session_id": session_id, "ok": True})

    # -- the proxy -------------------------------------------------------------------------------------

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def proxy(request: Request, path: str) -> Response:
        assert client is not None
        path_sid, rel = _split_session("/" + path)
        body = await request.body()
        url = target_url(rel, request.url.query.encode("latin-1"))
        headers = forward_headers(request)
        endpoint = None
        if request.method == "POST":
            route = rel.rstrip("/")
            endpoint = next((name for suffix, name in _ENDPOINTS if route.endswith(suffix)), None)
        payload: Any = None
        if endpoint is not None:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
        if not isinstance(payload, dict):
            return await _passthrough(request.method, url, headers, body)
        added: frozenset[str] = frozenset()
        if config.token_data:
            payload, added = token_data_params(endpoint, payload)
            if added:
                body = json.dumps(payload).encode("utf-8")
        strip = added if config.strip_token_data else frozenset()
        s = session_for(request, path_sid)
        started = time.time()
        try:
            resp = await client.send(
                client.build_request(request.method, url, headers=headers, content=body), stream=True
            )
        except httpx.HTTPError as exc:
            stats.upstream_errors += 1
            _record_failure(endpoint, payload, started, exc, s)
            return _error(502, f"tracerl gateway: upstream request failed: {type(exc).__name__}: {exc}")
        out_headers = response_headers(resp)
        content_type = resp.headers.get("content-type", "")
        if "text/event-stream" not in content_type:
            try:
                raw = b"".join([chunk async for chunk in resp.aiter_raw()])
            except httpx.HTTPError as exc:
                stats.upstream_errors += 1
                _record_failure(endpoint, payload, started, exc, s)
                return _error(502, f"tracerl gateway: upstream response failed: {type(exc).__name__}: {exc}")
            finally:
                await resp.aclose()
            if resp.status_code >= 400:
                stats.upstream_errors += 1
            _record(endpoint, payload, resp, raw, started, s)
            if strip and resp.status_code < 400 and not resp.headers.get("content-encoding"):
                raw = _strip_body(endpoint, raw, strip)
            return Response(raw, status_code=resp.status_code, headers=out_headers)
        return StreamingResponse(
            _stream(endpoint, payload, resp, started, s, strip),
            status_code=resp.status_code,
            headers=out_headers,
        )

    async def _passthrough(
        method: str, url: httpx.URL, headers: list[tuple[str, str]], body: bytes
    ) -> Response:
        assert client is not None
        stats.passthrough += 1
        try:
            resp = await client.send(
                client.build_request(method, url, headers=headers, content=body), stream=True
            )
        except httpx.HTTPError as exc:
            return _error(502, f"tracerl gateway: upstream request failed: {type(exc).__name__}: {exc}")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()

        return StreamingResponse(relay(), status_code=resp.status_code, headers=response_headers(resp))

    def _record(
        endpoint: str,
        payload: dict[str, Any],
        resp: httpx.Response,
        raw: bytes,
        started: float,
        s: Session | None,
    ) -> None:
        with capture_internal_exceptions("gateway.record"):
            decoded = decode_body(raw, resp.headers.get("content-encoding", ""))
            if decoded is None:
                count("gateway_undecodable_bodies")
                decoded = b""
            record = parse_exchange(
                endpoint,
                payload,
                resp.status_code,
                decoded,
                content_type=resp.headers.get("content-type", "application/json"),
                started_at=started,
                ended_at=time.time(),
                request_id=resp.headers.get("x-request-id"),
                framework="gateway",
            )
            store(record, s)

    def _record_failure(
        endpoint: str, payload: dict[str, Any], started: float, exc: BaseException, s: Session | None
    ) -> None:
        with capture_internal_exceptions("gateway.record"):
            record = parse_exchange(
                endpoint, payload, 599, b"", started_at=started, ended_at=time.time(), framework="gateway"
            )
            record.error = {"type": type(exc).__name__, "message": str(exc)[:2000], "status": None}
            store(record, s)

    async def _stream(
        endpoint: str,
        payload: dict[str, Any],
        resp: httpx.Response,
        started: float,
        s: Session | None,
        strip: frozenset[str],
    ) -> AsyncIterator[bytes]:
        forwarder = _SSEForwarder(endpoint, strip)
        chunks: list[bytes] = []
        recorded = False
        try:
            async for chunk in resp.aiter_raw():
                chunks.append(chunk)
                out = forwarder.feed(chunk)
                if out:
                    yield out
            _record(endpoint, payload, resp, b"".join(chunks), started, s)
            recorded = True
        except httpx.HTTPError as exc:
            stats.upstream_errors += 1
            _record_failure(endpoint, payload, started, exc, s)
            recorded = True
            raise  # the client sees the stream break, as it would without the gateway
        finally:
            if not recorded:  # the client went away (the response task was cancelled)
                stats.client_disconnects += 1
                _record_failure(endpoint, payload, started, ConnectionAbortedError("client disconnected"), s)
            await resp.aclose()
        rest = forwarder.rest()
        if rest:
            yield rest

    return app


def _strip_body(endpoint: str, raw: bytes, added: frozenset[str]) -> bytes:
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(strip_token_data(endpoint, payload, added)).encode("utf-8")


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "gateway_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def _as_context(lifespan: Any) -> Any:
    import contextlib

    return contextlib.asynccontextmanager(lifespan)


def app_from_env() -> FastAPI:
    """The app for one worker process, configured from ``$TRACERL_GATEWAY_CONFIG`` (set by the CLI).

    Example:
        >>> app = app_from_env()  # doctest: +SKIP
    """
    raw = os.environ.get(ENV_CONFIG)
    if not raw:
        raise RuntimeError(f"{ENV_CONFIG} is not set; start the gateway with `python -m sdk.gateway`")
    return create_app(GatewayConfig(**json.loads(raw)))
