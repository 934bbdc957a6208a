"""Anthropic Messages calls answered from an OpenAI-compatible upstream's chat completions.

With ``--anthropic-to-chat``, the request is translated by the wire module's one mapping
(:func:`sdk.openai_wire.chat_request_of`), sent upstream, recorded as the Messages call it is (the chat
exchange's token ids kept), and answered as an Anthropic ``message`` body, or, streamed, translated event by
event as the upstream's chunks arrive (:class:`sdk.openai_wire.ChatStreamTranslator`).

Example:
    >>> error_name(TimeoutError())
    'ReadTimeout'
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from yarl import URL

from sdk._decompress import decompress
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk._token_data import token_data_params
from sdk.gateway._http import send_json
from sdk.gateway._sse import error_event
from sdk.openai_wire import (
    ChatStreamTranslator,
    MalformedStream,
    MappingError,
    anthropic_request,
    chat_problem,
    chat_request_of,
    message_events,
    message_of_chat,
    sse,
    sse_events,
)

__all__ = ["anthropic_error", "as_messages_call", "error_name", "translated"]

# The body sent is the translation, plain JSON: the client's own content headers describe another one.
_NOT_FORWARDED = ("content-encoding", "content-type", "x-api-key", "anthropic-version")
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


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

    A streamed call is streamed from the upstream and translated event by event; its ``message_stop``
    waits until the call is stored. The record is the chat exchange (its token ids) under the Messages
    call's name and parameters: the conversation is the same, mapped once (``sdk.openai_wire``).

    Example:
        >>> await translated(gateway, send, call, watch, headers)  # doctest: +SKIP
    """
    try:
        chat = chat_request_of(call.payload)
    except MappingError as exc:
        watch.stop()
        gw.record_failure(call, "UnmappableRequest", exc)
        return await anthropic_error(send, 400, f"tracerl gateway: cannot translate the request: {exc}")
    if call.payload.get("stream"):
        chat = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    if gw.config.token_data:
        chat = token_data_params("chat.completions", chat)[0]
    url = URL(gw.origin + gw.base_path + "/chat/completions", encoded=True)
    try:
        data = json.dumps(chat).encode()
        resp = await gw.client().request("POST", url, headers=_headers(headers), data=data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return await _failed(gw, send, call, watch, exc)
    async with resp:
        if resp.status < 400 and "text/event-stream" in resp.headers.get("content-type", ""):
            return await _stream(gw, send, call, watch, resp, chat)
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return await _failed(gw, send, call, watch, exc)
    watch.stop()
    gw.record(call, resp, raw, upstream=chat)  # before the client gets a byte of the answer
    try:
        answer = parse_untrusted(decompress(raw, resp.headers.get("content-encoding", "")) or b"")
        problem = None if resp.status >= 400 else chat_problem(answer, "message")
    except ValueError as exc:  # not JSON (UntrustedJSONError), or a corrupt compressed body
        answer, problem = None, f"not JSON tracerl reads: {exc}"
    if resp.status >= 400 or problem is not None:
        gw.stats.upstream_errors += 1
        error = answer.get("error") if isinstance(answer, dict) else None
        text = error.get("message") if isinstance(error, dict) else None
        if text is None:
            text = (
                f"tracerl gateway: the upstream's answer is {problem}"
                if problem
                else raw[:500].decode("utf-8", "replace")
            )
        return await anthropic_error(send, resp.status if resp.status >= 400 else 502, str(text))
    message = message_of_chat(answer, answer.get("model") or call.payload.get("model"))
    if not call.payload.get("stream"):
        return await send_json(send, 200, message)
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    await send({"type": "http.response.body", "body": _sse(message_events(message))})


async def _failed(gw: Any, send: Any, call: Any, watch: Any, exc: BaseException) -> None:
    watch.stop()
    gw.stats.upstream_errors += 1
    gw.record_failure(call, error_name(exc), exc)
    await anthropic_error(send, 502, f"tracerl gateway: upstream failed: {error_name(exc)}")


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(sse(payload, name) for name, payload in events)


def _chunks(data: bytes) -> list[Any]:
    """The chunks of complete SSE events (``data: [DONE]`` skipped); :class:`MalformedStream` if unreadable.

    The translator checks each chunk's shape; the record reads the same bytes the same way.
    """
    out = []
    for _, payload in sse_events(data):
        payload = payload.strip()
        if payload and payload != b"[DONE]":
            try:
                out.append(parse_untrusted(payload))
            except UntrustedJSONError as exc:
                raise MalformedStream(f"an event cannot be read: {exc}") from None
    return out


async def _stream(gw: Any, send: Any, call: Any, watch: Any, resp: Any, chat: dict[str, Any]) -> None:
    """Translate the upstream's chat stream as it arrives; the call is stored before ``message_stop``."""
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    watch.start()  # a stream sent to a client that left would otherwise go on to its end unseen
    translator = ChatStreamTranslator(call.payload.get("model"))
    received: list[bytes] = []
    pending = b""
    try:
        async for piece in resp.content.iter_any():
            received.append(piece)
            pending += piece.replace(b"\r\n", b"\n")
            cut = pending.rfind(b"\n\n")
            if cut < 0:
                continue
            ready, pending = pending[: cut + 2], pending[cut + 2 :]
            out = _sse([e for chunk in _chunks(ready) for e in translator.feed(chunk)])
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except (aiohttp.ClientError, TimeoutError) as exc:
        watch.stop()
        gw.stats.upstream_errors += 1
        gw.record_failure(call, error_name(exc), exc)
        # The client sees its stream fail with an error event (not a broken connection and a traceback in
        # the gateway's log): the SDKs raise it to the agent.
        message = f"tracerl gateway: the upstream's stream broke: {error_name(exc)}"
        return await send({"type": "http.response.body", "body": error_event("messages", message)})
    except MalformedStream as exc:
        watch.stop()
        gw.stats.upstream_errors += 1
        # Stored as the forwarded route stores it: what arrived, the unreadable chunk making it a failed call.
        gw.record(call, resp, b"".join(received), upstream=chat)
        message = f"tracerl gateway: the upstream sent a chunk that cannot be read: {exc}"
        return await send({"type": "http.response.body", "body": error_event("messages", message)})
    watch.stop()
    gw.record(call, resp, b"".join(received), upstream=chat)
    # An unterminated last event (``pending``) is not an event (the SSE specification; clients drop it).
    # A stream that ended without its finish chunk ends without message_stop: the client sees it cut.
    end = _sse(translator.finish()) if translator.stop is not None else b""
    await send({"type": "http.response.body", "body": end, "more_body": False})
