"""The gateway's request plumbing: the path's token and session id, headers, ASGI replies.

Every route reads a session id the same way: the ``<id>`` of ``/sessions/<id>/...`` is taken from the raw
(still percent-encoded) path and percent-decoded once, as UTF-8; the ``X-Tracerl-Session`` header is read
as UTF-8. An id is used exactly as decoded (never stripped); one that is not valid UTF-8 is refused (400)
on every route, rather than stored under a lossy replacement that two different ids could share.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from sdk.openai_wire import error_body

__all__ = [
    "HOP_BY_HOP",
    "MAX_DECODED_BODY",
    "BadRequest",
    "drop_connection_headers",
    "header_text",
    "read_body",
    "refuse_websocket",
    "send_error",
    "send_json",
    "split_session",
    "split_token",
    "token_matches",
]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_DECODED_BODY = 64 * 1024 * 1024
"""A compressed request body is decompressed for recording up to this size; a larger one is forwarded only."""

HOP_BY_HOP = frozenset(
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
    }
)
"""Headers that describe one connection, never forwarded (RFC 9110 §7.6.1), besides those named in
``Connection``."""


class BadRequest(ValueError):
    """A request the gateway refuses with a 400 and this message.

    Example:
        >>> str(BadRequest("session id is not valid UTF-8"))
        'session id is not valid UTF-8'
    """


def _decode_id(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the session id in the {where} is not valid UTF-8") from None


def split_token(raw_path: str) -> tuple[str | None, str]:
    """``/token/<token>/<rest>`` -> ``(token, /<rest>)``; other paths -> ``(None, path)``.

    For clients that can set only a base URL (and an API key that the upstream needs): the gateway token
    goes in the base URL, ``http://HOST:PORT/token/<token>/v1``.

    Example:
        >>> split_token("/token/s3cret/sessions/a/v1/models")
        ('s3cret', '/sessions/a/v1/models')
        >>> split_token("/v1/models")
        (None, '/v1/models')
    """
    if raw_path.startswith("/token/"):
        token, sep, rest = raw_path[len("/token/") :].partition("/")
        if token and sep:
            return unquote_to_bytes(token).decode("utf-8", "replace"), "/" + rest
    return None, raw_path


def split_session(raw_path: str) -> tuple[str | None, str]:
    """``/sessions/<id>/<rest>`` (raw path) -> ``(id, /<rest>)``, the id percent-decoded once as UTF-8.

    The rest stays percent-encoded, as the client sent it. Other paths -> ``(None, path)``. Raises
    :class:`BadRequest` for an id that is not UTF-8.

    Example:
        >>> split_session("/sessions/a%2Fb/v1/chat/completions")
        ('a/b', '/v1/chat/completions')
        >>> split_session("/sessions/caf%C3%A9/reward")
        ('café', '/reward')
    """
    if raw_path.startswith("/sessions/"):
        sid, sep, rest = raw_path[len("/sessions/") :].partition("/")
        if sid and sep:
            return _decode_id(unquote_to_bytes(sid), "URL"), "/" + rest
    return None, raw_path


def header_text(value: bytes, name: str) -> str:
    """A ``X-Tracerl-*`` header value as UTF-8 (:class:`BadRequest` if it is not).

    Example:
        >>> header_text("café".encode(), "x-tracerl-session")
        'café'
    """
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the {name} header is not valid UTF-8") from None


def drop_connection_headers(
    headers: list[tuple[str, Any]], connection: Iterable[str]
) -> list[tuple[str, Any]]:
    """``headers`` without those named in the ``Connection`` header values ``connection`` (RFC 9110 §7.6.1).

    Example:
        >>> drop_connection_headers([("x-a", "1"), ("x-b", "2")], ["close, X-A"])
        [('x-b', '2')]
    """
    named = {t.strip().lower() for value in connection for t in value.split(",")}
    named.discard("")
    return [(k, v) for k, v in headers if k not in named] if named else headers


def token_matches(sent: str | None, token: str) -> bool:
    """Whether a client's gateway token is ``token`` (constant-time; a ``Bearer`` prefix is allowed).

    Example:
        >>> token_matches("Bearer abc", "abc"), token_matches("abd", "abc"), token_matches(None, "abc")
        (True, False, False)
    """
    if sent is None:
        return False
    if sent[:7].lower() == "bearer ":
        sent = sent[7:].strip()
    return hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), token.encode("utf-8"))


# --- ASGI plumbing ---------------------------------------------------------------------------------------


async def refuse_websocket(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """A WebSocket upgrade: 501, the gateway proxies HTTP only (OpenAI's Realtime API is not recorded)."""
    error = {"message": "tracerl gateway: WebSocket is not supported (HTTP only)", "type": "gateway_error"}
    msg = json.dumps({"error": error}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(msg)).encode())]
    if scope["type"] == "http":
        await read_body(receive)
        await send({"type": "http.response.start", "status": 501, "headers": headers})
        return await send({"type": "http.response.body", "body": msg})
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 501, "headers": headers})
        return await send({"type": "websocket.http.response.body", "body": msg})
    await send({"type": "websocket.close", "code": 1003})


async def read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def send_json(send: Send, status: int, obj: Any) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode("latin-1"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, status: int, message: str) -> None:
    kind = "invalid_request_error" if status < 500 else "gateway_error"
    await send_json(send, status, error_body(message, kind))
