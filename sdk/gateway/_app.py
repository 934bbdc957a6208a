"""The gateway's ASGI app: an OpenAI-compatible reverse proxy that records model calls into the store.

Model calls (``POST .../chat/completions``, ``POST .../responses`` and Anthropic's ``POST .../v1/messages``)
are recorded: the request JSON and the response body (SSE streams forwarded event by event as they arrive,
and reassembled for the record) go through the same converter as the in-process transports
(:func:`sdk.openai_wire.parse_exchange`). With ``anthropic_to_chat`` a Messages call is answered from the
upstream's chat completions instead of being forwarded (``_translate``).
Every other request is passed through untouched. Headers are forwarded (hop-by-hop ones dropped) and
never recorded. Request parsing (session ids, tokens, hostile JSON, compressed bodies) is in ``_http``.
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
from sdk._decompress import decompress
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk._token_data import strip_token_data, token_data_params
from sdk.capture import CallRecord, Session, capture_internal_exceptions, count, record_call
from sdk.gateway._http import (
    HOP_BY_HOP,
    BadRequest,
    drop_connection_headers,
    header_text,
    read_body,
    refuse_websocket,
    send_error,
    send_json,
    split_session,
    split_token,
    token_matches,
)
from sdk.gateway._records import (
    malformed_record,
    recordable,
    request_problem,
    warn_once,
)
from sdk.gateway._sessions import SessionTable
from sdk.gateway._sse import SSEForwarder, error_event
from sdk.gateway._translate import anthropic_error, as_messages_call, error_name, translated
from sdk.openai_wire import ENDPOINTS, MESSAGES_ENDPOINT, parse_exchange

__all__ = ["ENV_CONFIG", "GatewayConfig", "app_from_env", "create_app"]

logger = logging.getLogger("tracerl.gateway")

ENV_CONFIG = _env.TRACERL_GATEWAY_CONFIG
"""How the command line hands its configuration to worker processes (JSON of :class:`GatewayConfig`)."""

SESSION_HEADER = "x-tracerl-session"
TASK_HEADER = "x-tracerl-task"
SAMPLE_HEADER = "x-tracerl-sample"
METADATA_HEADER = "x-tracerl-metadata"
AGENT_HEADER = "x-tracerl-agent"  # the agent name (role) of the call, for multi-agent programs
TOKEN_HEADER = "x-tracerl-gateway-token"
CONTROL_HEADER = "x-tracerl-control-token"

_ENDPOINTS = (*ENDPOINTS, MESSAGES_ENDPOINT)
# Hop-by-hop headers and those the proxy recomputes are never forwarded.
_HOP = HOP_BY_HOP | {"host", "content-length"}
_HOP_BYTES = frozenset(h.encode("latin-1") for h in _HOP)
_WATCH_AFTER_S = 0.05
"""A recorded call's client is watched for leaving from this long after its request went upstream."""


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
        auth_token: When set, every route answers 401 unless the request carries this token, in the
            ``X-Tracerl-Gateway-Token`` header or as the path prefix ``/token/<token>/``.
        control_token: When set, ``POST /sessions/<id>/reward`` and ``/end`` need this token in the
            ``X-Tracerl-Control-Token`` header (the gateway token is then not needed there): a client
            holding only the gateway token gets 403, one with neither 401, and nothing changes.
        sessions_dir: A directory the workers of one gateway share to tell each other which session ids
            they opened (``POST /sessions/<id>/end`` of an id none of them saw is a 404).
        anthropic_to_chat: Answer Anthropic Messages calls (``POST /v1/messages``) with the upstream's
            chat completions (an OpenAI-compatible upstream, e.g. vLLM with token ids); otherwise they are
            forwarded as they are to an Anthropic-compatible upstream.

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
    auth_token: str | None = dataclasses.field(default=None, repr=False)
    control_token: str | None = dataclasses.field(default=None, repr=False)
    sessions_dir: str | None = None
    anthropic_to_chat: bool = False


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
            # The store's name only: its absolute path tells a caller about the host, not the run.
            "store": {**store, "store": _store_name(store.get("store"))},
        }


def _store_name(store: Any) -> str | None:
    return None if store is None else str(store).rstrip("/").rsplit("/", 1)[-1]


def _header(h: dict[str, bytes], name: str) -> str | None:
    """A ``X-Tracerl-*`` header as UTF-8; one that is not UTF-8 is ignored and counted."""
    value = h.get(name)
    if value is None:
        return None
    try:
        return header_text(value, name)
    except BadRequest:
        count("gateway_bad_headers")
        warn_once(name, "tracerl gateway: ignoring %s (not UTF-8)", name)
        return None


def _header_value(scope: dict[str, Any], name: str) -> str | None:
    raw = name.encode("latin-1")
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == raw), None)


def _control_route(method: str, path: str) -> bool:
    """Whether a request rewards or ends a session (``POST /sessions/<id>/reward`` or ``/end``)."""
    if method != "POST":
        return False
    try:
        sid, rel = split_session(path)
    except BadRequest:
        return False
    return sid is not None and rel in ("/reward", "/end")


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        count("gateway_bad_headers")
        warn_once(SAMPLE_HEADER, "tracerl gateway: ignoring %s=%.100r (not an integer)", SAMPLE_HEADER, value)
        return None


def _metadata(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        meta, why = parse_untrusted(value), "not a JSON object"
    except UntrustedJSONError as exc:
        meta, why = None, str(exc)
    if not isinstance(meta, dict):
        count("gateway_bad_headers")
        warn_once(METADATA_HEADER, "tracerl gateway: ignoring %s (%s): %.200s", METADATA_HEADER, why, value)
        return {}
    return meta


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
        self.table = SessionTable(config.max_open_sessions, config.sessions_dir)
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
        elif kind == "websocket":
            await refuse_websocket(scope, receive, send)

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
        raw = scope.get("raw_path")
        # Routed on the raw path: a session id is percent-decoded once, by split_session, on every route.
        path = raw.decode("latin-1") if raw else scope["path"]
        authorized = True
        if self.config.auth_token is not None:
            sent, path = split_token(path)
            if sent is None:
                sent = _header_value(scope, TOKEN_HEADER)
            authorized = token_matches(sent, self.config.auth_token)
        if self.config.control_token is not None and _control_route(method, path):
            # Rewards and ends need the control token (the trainer's), whatever other token is sent: the
            # agent's token for model calls must not let it score or end its own sessions.
            if not token_matches(_header_value(scope, CONTROL_HEADER), self.config.control_token):
                msg = (
                    "tracerl gateway: rewarding and ending sessions needs the control token (send it in the"
                    " X-Tracerl-Control-Token header)"
                )
                return await send_error(send, 403 if authorized else 401, msg)
        elif not authorized:
            msg = (
                "tracerl gateway: missing or wrong gateway token (send it in the X-Tracerl-Gateway-Token"
                " header, or in the base URL as http://HOST:PORT/token/<token>/v1)"
            )
            is_messages = path.rstrip("/").endswith(MESSAGES_ENDPOINT[0])
            return await _route_error(send, "messages" if is_messages else None, 401, msg)
        if method == "GET" and path == "/stats":
            snapshot = self.stats.snapshot(self.table)
            if self.otlp is not None:
                snapshot["otlp"] = self.otlp.counts()
            return await send_json(send, 200, snapshot)
        if method == "POST" and path == "/v1/traces" and self.otlp is not None:
            return await self._traces(scope, receive, send)
        try:
            path_sid, rel = split_session(path)
        except BadRequest as exc:
            return await send_error(send, 400, f"tracerl gateway: {exc}")
        if method == "POST" and path_sid is not None and rel in ("/reward", "/end"):
            try:
                body = parse_untrusted(await read_body(receive) or b"{}")
            except UntrustedJSONError as exc:
                return await send_error(send, 400, f"tracerl gateway: the request body is {exc}")
            if rel == "/reward":
                return await self._reward(send, path_sid, body)
            return await self._end(send, path_sid, body)
        await self._proxy(scope, receive, send, path_sid, rel)

    async def _traces(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        status, data, media_type = await self.otlp.answer(receive, headers)
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
            return await send_error(send, 400, msg)
        try:
            self.table.reward(
                session_id, body["value"], body.get("name") or "reward", call_id=body.get("call_id")
            )
        except (ValueError, OverflowError) as exc:  # OverflowError: an integer beyond a float's range
            return await send_error(send, 400, f"reward must be a finite number: {str(exc)[:200]}")
        await send_json(send, 200, {"session_id": session_id, "ok": True})

    async def _end(self, send: Send, session_id: str, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        if not await asyncio.to_thread(self.table.known, session_id):
            return await send_error(send, 404, f"tracerl gateway: no session {session_id!r} to end")
        with capture_internal_exceptions("gateway.end"):
            self.table.end(session_id, None if error is None else str(error))
        await send_json(send, 200, {"session_id": session_id, "ok": True})

    # -- the proxy -------------------------------------------------------------------------------------

    def target_url(self, scope: dict[str, Any], rel: str) -> URL:
        # ``rel``: the raw (still percent-encoded) path after any session prefix, sent as the client sent it.
        # /v1/<rest> -> <upstream>/<rest>; anything else -> the upstream's origin, path unchanged.
        path = rel
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
        tracerl: dict[str, bytes] = {}
        accept_encoding: list[tuple[str, str]] = []
        connection: list[str] = []
        encoding = ""
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            if name.startswith("x-tracerl-"):
                tracerl[name] = v
            elif name == "accept-encoding":
                accept_encoding.append((name, v.decode("latin-1")))
            elif name not in _HOP:
                headers.append((name, v.decode("latin-1")))
                if name == "content-encoding":
                    encoding = v.decode("latin-1")
            elif name == "connection":
                connection.append(v.decode("latin-1"))
            elif name == "upgrade" and b"websocket" in v.lower():
                return await refuse_websocket(scope, receive, send)
        if connection:  # headers the client named as hop-by-hop for this connection (RFC 9110 §7.6.1)
            headers = drop_connection_headers(headers, connection)
            accept_encoding = drop_connection_headers(accept_encoding, connection)
        body = await read_body(receive)
        url = self.target_url(scope, rel)
        endpoint = None
        if method == "POST":
            route = rel.rstrip("/")
            endpoint = next((name for suffix, name in _ENDPOINTS if route.endswith(suffix)), None)
        payload = recordable(endpoint, body, encoding) if endpoint is not None else None
        if payload is None and endpoint == "messages" and self.config.anthropic_to_chat:
            # There is no Messages upstream to pass it to: refused in the route's format (counted above).
            msg = "tracerl gateway: the request body is not a JSON object the gateway can translate"
            return await anthropic_error(send, 400, msg)
        if payload is None:
            # Not recorded: the body is never read here, so the client's own encodings go through.
            return await self._passthrough(send, method, url, headers + accept_encoding, body)
        try:
            s = self.session_for(tracerl, path_sid)
        except BadRequest as exc:
            return await _route_error(send, endpoint, 400, f"tracerl gateway: {exc}")
        # Recorded: loopback or LAN to the model server, an uncompressed body is cheaper than gzip, and can
        # be forwarded and recorded without decoding.
        headers.append(("accept-encoding", "identity"))
        added: frozenset[str] = frozenset()
        if self.config.token_data:
            payload, added = token_data_params(endpoint, payload)
            if added:  # the body changes: sent as plain JSON, whatever encoding the client used
                body = json.dumps(payload).encode("utf-8")
                headers = [(k, v) for k, v in headers if k != "content-encoding"]
        strip = added if self.config.strip_token_data else frozenset()
        call = _Call(endpoint, payload, s, strip, time.time(), _header(tracerl, AGENT_HEADER) or None)
        watch = _ClientWatch(receive)
        try:
            if endpoint == "messages" and self.config.anthropic_to_chat:
                await translated(self, send, call, watch, headers)
            else:
                await self._exchange(send, call, watch, method, url, headers, body)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            # The client went away before its answer was delivered: a failed call, never a successful one
            # (it never saw the answer), and the upstream request is dropped with it.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.stats.client_disconnects += 1
            gone = ConnectionAbortedError("client disconnected before its response was delivered")
            self.record_failure(call, "ConnectionAbortedError", gone)
        finally:
            watch.stop()

    async def _exchange(
        self,
        send: Send,
        call: _Call,
        watch: _ClientWatch,
        method: str,
        url: URL,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        """Send a recorded call upstream, record it, and answer the client (``watch`` cancels it if gone)."""
        try:
            resp = await self.client().request(method, url, headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            watch.stop()
            return await self._failed(send, call, exc, "request")
        try:
            if "text/event-stream" in resp.headers.get("content-type", ""):
                await self._stream(send, call, watch, resp)
                return
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                watch.stop()
                return await self._failed(send, call, exc, "response")
        finally:
            resp.release()
        if resp.status >= 400:
            self.stats.upstream_errors += 1
        watch.stop()  # from here the call is recorded as answered
        self.record(call, resp, raw)  # before the client gets a byte of the answer
        if call.strip and resp.status < 400 and not resp.headers.get("content-encoding"):
            raw = _strip_body(call.endpoint, raw, call.strip)
        out = _response_headers(resp)
        out.append((b"content-length", str(len(raw)).encode("latin-1")))
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        await send({"type": "http.response.body", "body": raw})

    async def _failed(self, send: Send, call: _Call, exc: BaseException, what: str) -> None:
        self.stats.upstream_errors += 1
        name = error_name(exc)
        self.record_failure(call, name, exc)
        msg = f"tracerl gateway: upstream {what} failed: {name}: {exc}"
        await _route_error(send, call.endpoint, 502, msg)

    async def _stream(
        self, send: Send, call: _Call, watch: _ClientWatch, resp: aiohttp.ClientResponse
    ) -> None:
        """Forward an SSE response as it arrives; record it before its terminal event is sent."""
        await send({"type": "http.response.start", "status": resp.status, "headers": _response_headers(resp)})
        watch.start()  # a stream sent to a client that left would otherwise go on to its end unseen
        forwarder = SSEForwarder(call.endpoint, call.strip)
        chunks: list[bytes] = []
        try:
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
                out = forwarder.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except (aiohttp.ClientError, TimeoutError) as exc:
            watch.stop()
            self.stats.upstream_errors += 1
            self.record_failure(call, error_name(exc), exc)
            # The client sees its stream fail with an error event in its API's format, which its SDK raises
            # (re-raising here would only break the connection and log a traceback for an upstream's fault).
            message = f"tracerl gateway: the upstream's stream broke: {error_name(exc)}"
            return await send({"type": "http.response.body", "body": error_event(call.endpoint, message)})
        watch.stop()
        self.record(call, resp, b"".join(chunks))
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
            msg = f"tracerl gateway: upstream request failed: {error_name(exc)}: {exc}"
            return await send_error(send, 502, msg)
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

    def session_for(self, h: dict[str, bytes], path_sid: str | None) -> Session | None:
        """The call's session: the URL's id, else the header's (:class:`BadRequest` if not UTF-8)."""
        header = h.get(SESSION_HEADER)
        sid = path_sid if path_sid is not None else header_text(header, SESSION_HEADER) if header else None
        if not sid:
            if h.get(TASK_HEADER):
                count("gateway_task_without_session")
            return None  # the worker's implicit session, as in-process capture
        with capture_internal_exceptions("gateway.session"):
            return self.table.get(
                sid,
                task_id=_header(h, TASK_HEADER) or None,
                sample=_int_or_none(_header(h, SAMPLE_HEADER)),
                metadata=_metadata(_header(h, METADATA_HEADER)),
            )
        return None

    def record(
        self, call: _Call, resp: aiohttp.ClientResponse, raw: bytes, upstream: dict[str, Any] | None = None
    ) -> None:
        """Store an answered call (``upstream``: the chat request a translated Messages call was sent as)."""
        with capture_internal_exceptions("gateway.record"):
            decoded = decompress(raw, resp.headers.get("content-encoding", ""))
            if decoded is None:
                count("gateway_undecodable_bodies")
                decoded = b""
            kwargs: dict[str, Any] = {
                "content_type": resp.headers.get("content-type", "application/json"),
                "started_at": call.started,
                "ended_at": time.time(),
                "request_id": resp.headers.get("x-request-id"),
                "framework": "gateway",
                "headers": resp.headers,  # the policy version a server sends there
            }
            problem = request_problem(call.endpoint, call.payload)
            try:
                if problem is None and upstream is not None:
                    record = as_messages_call(
                        parse_exchange("chat.completions", upstream, resp.status, decoded, **kwargs),
                        call.payload,
                    )
                elif problem is None:
                    record = parse_exchange(call.endpoint, call.payload, resp.status, decoded, **kwargs)
            except Exception as exc:  # an answered call is stored even if it cannot be parsed
                problem = f"could not be parsed: {type(exc).__name__}: {str(exc)[:500]}"
            if problem is not None:
                record = malformed_record(call.endpoint, call.payload, problem, resp.status, decoded, kwargs)
            _warn_unmapped(record)
            record.agent = record.agent or call.agent
            self.stats.calls += 1
            record_call(record, call.session)  # firewalled: a store failure is counted, never raised

    def record_failure(self, call: _Call, name: str, exc: BaseException) -> None:
        with capture_internal_exceptions("gateway.record"):
            kwargs = {"started_at": call.started, "ended_at": time.time(), "framework": "gateway"}
            problem = request_problem(call.endpoint, call.payload)
            if problem is None:
                record = parse_exchange(call.endpoint, call.payload, 599, b"", **kwargs)
            else:
                record = malformed_record(call.endpoint, call.payload, problem, 599, b"", kwargs)
            record.error = {"type": name, "message": str(exc)[:2000], "status": None}
            _warn_unmapped(record)
            record.agent = record.agent or call.agent
            self.stats.calls += 1
            record_call(record, call.session)


class _ClientWatch:
    """Cancels the request's task if its client goes away (any ``receive`` message once the body is read).

    Watching starts :data:`_WATCH_AFTER_S` after the request went upstream, or when a streamed response
    starts: an answer that comes sooner is not slowed by a watcher task (which costs more than the
    proxying itself on a fast upstream), and a client that left before is seen at once when watching
    starts. It stops (:meth:`stop`) once the call is recorded as answered: from then on the client's
    leaving changes nothing in the store.
    """

    __slots__ = ("gone", "active", "task", "receive", "watch", "timer")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self.active = True
        self.task = asyncio.current_task()
        self.receive = receive
        self.watch: asyncio.Future[dict[str, Any]] | None = None
        self.timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            _WATCH_AFTER_S, self.start
        )

    def start(self) -> None:
        if self.active and self.watch is None:
            self.watch = asyncio.ensure_future(self.receive())
            self.watch.add_done_callback(self._on_message)

    def _on_message(self, fut: asyncio.Future[dict[str, Any]]) -> None:
        if self.active and self.task is not None and not fut.cancelled() and fut.exception() is None:
            self.gone = True
            self.task.cancel()

    def stop(self) -> None:
        self.active = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.watch is not None:
            self.watch.cancel()


@dataclasses.dataclass
class _Call:
    """A model call in flight."""

    endpoint: str
    payload: dict[str, Any]
    session: Session | None
    strip: frozenset[str]
    started: float
    agent: str | None = None


def _warn_unmapped(record: CallRecord) -> None:
    """One log line per kind of request the wire mapping stored without messages (each one is counted)."""
    bad = (record.extra or {}).get("malformed_request")
    problem = str(bad.get("problem")) if isinstance(bad, dict) else ""
    if problem.startswith("previous_response_id"):
        warn_once(
            "previous_response_id",
            "tracerl gateway: a Responses call continues a conversation the server keeps "
            "(previous_response_id); it is stored without messages and never trained (send the whole "
            "conversation in input instead)",
        )


async def _route_error(send: Send, endpoint: str | None, status: int, message: str) -> None:
    """An error answer in the format of the route's API: Anthropic's for Messages, else OpenAI's."""
    if endpoint == "messages":
        return await anthropic_error(send, status, message)
    await send_error(send, status, message)


def _response_headers(resp: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    out = []
    connection = None
    for k, v in resp.raw_headers:
        k = k.lower()
        if k not in _HOP_BYTES:
            out.append((k, v))
        elif k == b"connection":
            connection = (connection or []) + [v.decode("latin-1")]
    if connection:  # headers the upstream named as hop-by-hop (RFC 9110 §7.6.1)
        named = {t.strip().lower().encode("latin-1") for value in connection for t in value.split(",")}
        out = [(k, v) for k, v in out if k not in named]
    return out


def _strip_body(endpoint: str, raw: bytes, added: frozenset[str]) -> bytes:
    try:
        payload = parse_untrusted(raw)
    except UntrustedJSONError as exc:  # not JSON, or too deep to re-encode: forwarded as the upstream sent it
        count("gateway_responses_not_stripped")
        warn_once("strip", "tracerl gateway: a response was forwarded with its token data: body %s", exc)
        return raw
    return json.dumps(strip_token_data(endpoint, payload, added)).encode("utf-8")


def app_from_env() -> ASGIApp:
    """The app for one worker process, configured from ``$TRACERL_GATEWAY_CONFIG`` (set by the CLI).

    Example:
        >>> app = app_from_env()  # doctest: +SKIP
    """
    raw = os.environ.get(ENV_CONFIG)
    if not raw:
        raise RuntimeError(f"{ENV_CONFIG} is not set; start the gateway with `tracerl gateway`")
    return create_app(GatewayConfig(**json.loads(raw)))
