"""Anthropic Messages calls answered from an OpenAI-compatible upstream's chat completions.

With ``--anthropic-to-chat``, the request is translated by the wire module's one mapping
(:func:`sdk.openai_wire.chat_request_of`), sent upstream without streaming, recorded as the Messages call it
is (the chat exchange's token ids kept), and answered as an Anthropic ``message`` body, or as its stream
events when the client asked for a stream.

Example:
    >>> error_name(TimeoutError())
    'ReadTimeout'
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from yarl import URL

from sdk._token_data import token_data_params
from sdk.gateway._http import send_json
from sdk.openai_wire import (
    MappingError,
    anthropic_request,
    chat_request_of,
    decode_body,
    message_events,
    message_of_chat,
    sse,
)

__all__ = ["anthropic_error", "as_messages_call", "error_name", "translated"]

_NOT_FORWARDED = ("content-encoding", "x-api-key", "anthropic-version")


def error_name(exc: BaseException) -> str:
    """The recorded name of an upstream failure: httpx's names, whatever HTTP client the gateway uses.

    Example:
        >>> error_name(ValueError("x"))
        'ValueError'
    """
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"
    if isinstance(exc, TimeoutError):
        return "ReadTimeout"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "RemoteProtocolError"
    return type(exc).__name__


def as_messages_call(record: Any, payload: dict[str, Any]) -> Any:
    """A chat exchange's record made the Anthropic Messages call it answered (same conversation, its params).

    Example:
        >>> from sdk.capture import CallRecord
        >>> as_messages_call(CallRecord(framework="gateway"), {"messages": [], "max_tokens": 5}).params
        {'max_tokens': 5}
    """
    record.endpoint = "messages"
    record.model = payload.get("model")
    record.params = anthropic_request(payload)[2]
    record.stream = bool(payload.get("stream"))
    record.extra = {**(record.extra or {}), "upstream_endpoint": "chat.completions"}
    return record


async def anthropic_error(send: Any, status: int, message: str) -> None:
    """Answer with an Anthropic error body.

    Example:
        >>> import asyncio
        >>> sent = []
        >>> async def send(m): sent.append(m)
        >>> asyncio.run(anthropic_error(send, 400, "no"))
        >>> sent[0]["status"]
        400
    """
    kind = "invalid_request_error" if status < 500 else "api_error"
    await send_json(send, status, {"type": "error", "error": {"type": kind, "message": message}})


def _headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers for an OpenAI-compatible upstream: its Anthropic key as a bearer token."""
    out = [(k, v) for k, v in headers if k not in _NOT_FORWARDED]
    key = next((v for k, v in headers if k == "x-api-key"), None)
    if key and not any(k == "authorization" for k, _ in out):
        out.append(("authorization", f"Bearer {key}"))
    return [*out, ("content-type", "application/json")]


async def translated(gw: Any, send: Any, call: Any, watch: Any, headers: list[tuple[str, str]]) -> None:
    """Answer a Messages call (``call``) of gateway ``gw`` from its upstream's chat completions, recorded.

    The upstream is asked without streaming; a streamed call gets its events when the answer is complete.
    The record is the chat exchange (its token ids) under the Messages call's name and parameters: the
    conversation is the same, mapped once (``sdk.openai_wire``).

    Example:
        >>> await translated(gateway, send, call, watch, headers)  # doctest: +SKIP
    """
    try:
        chat = chat_request_of(call.payload)
    except MappingError as exc:
        watch.stop()
        gw.record_failure(call, "UnmappableRequest", exc)
        return await anthropic_error(send, 400, f"tracerl gateway: cannot translate the request: {exc}")
    if gw.config.token_data:
        chat = token_data_params("chat.completions", chat)[0]
    url = URL(gw.origin + gw.base_path + "/chat/completions", encoded=True)
    try:
        resp = await gw.client().request(
            "POST", url, headers=_headers(headers), data=json.dumps(chat).encode()
        )
        async with resp:
            raw = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        watch.stop()
        gw.stats.upstream_errors += 1
        gw.record_failure(call, error_name(exc), exc)
        return await anthropic_error(send, 502, f"tracerl gateway: upstream failed: {error_name(exc)}")
    watch.stop()
    gw.record(call, resp, raw, upstream=chat)  # before the client gets a byte of the answer
    try:
        answer = json.loads(decode_body(raw, resp.headers.get("content-encoding", "")) or b"")
    except ValueError:
        answer = None
    if resp.status >= 400 or not isinstance(answer, dict):
        gw.stats.upstream_errors += 1
        error = answer.get("error") if isinstance(answer, dict) else None
        text = error.get("message") if isinstance(error, dict) else raw[:500].decode("utf-8", "replace")
        return await anthropic_error(send, resp.status if resp.status >= 400 else 502, str(text))
    message = message_of_chat(answer, answer.get("model") or call.payload.get("model"))
    if not call.payload.get("stream"):
        return await send_json(send, 200, message)
    events = b"".join(sse(payload, name) for name, payload in message_events(message))
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": events})
