"""The OpenAI HTTP wire format, read and written in one place.

Reading: one converter from raw request and response bytes to a :class:`~sdk.capture.CallRecord`, for
every capture path that sees them: the in-process recording transports (``integrations.openai``,
``integrations.anthropic``) and the recording gateway (``sdk.gateway``). Chat completions, the Responses
API (``_responses``) and Anthropic's Messages API (``_anthropic``), plain JSON or SSE streams (reassembled,
every choice kept), error bodies too. The two other APIs are recorded as the calls they
are (their endpoint, their parameters) with the conversation mapped to OpenAI chat messages by one
documented mapping each (the submodules' docstrings; the README's "Wire formats"). A request the mapping
cannot represent is stored without messages, the request kept under ``extra.malformed_request``.

Writing: ``chat.completion`` bodies, ``chat.completion.chunk`` objects, SSE lines and error bodies, for the
servers that answer OpenAI clients: the policy server (``trainers.serve``), the scripted test server
(``sdk.testing``) and the gateway's own errors. What is written here reads back through
:func:`parse_exchange` to the same record, streamed or not (tested).

Standard library only: no ``openai`` or ``httpx`` import.

Example:
    >>> import json
    >>> request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    >>> body = chat_completion("c1", 0, "m", [chat_choice(0, assistant_message("yo"), "stop")])
    >>> rec = parse_exchange("chat.completions", request, 200, json.dumps(body).encode())
    >>> rec.response_message["content"], rec.finish_reason
    ('yo', 'stop')
    >>> stream = b"".join(sse(chunk) for chunk in stream_chunks(body)) + SSE_DONE
    >>> streamed = parse_exchange("chat.completions", request, 200, stream, content_type="text/event-stream")
    >>> streamed.response_message == rec.response_message
    True
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from sdk import capture
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk._openai_write import (
    SSE_DONE,
    assistant_message,
    chat_choice,
    chat_chunk,
    chat_completion,
    chunk_choice,
    error_body,
    sse,
    stream_chunks,
    usage,
)
from sdk.capture import CallRecord
from sdk.messages import MESSAGE_KEYS
from sdk.openai_wire._anthropic import (
    ChatStreamTranslator,
    anthropic_request,
    chat_request_of,
    message_events,
    message_of_chat,
    read_message,
    read_message_stream,
)
from sdk.openai_wire._responses import (
    MappingError,
    read_response,
    read_response_stream,
    responses_messages,
    responses_request,
)
from sdk.openai_wire._shape import MalformedStream, chat_problem

__all__ = [
    "ENDPOINTS",
    "MESSAGES_ENDPOINT",
    "SSE_DONE",
    "VERSION_HEADER",
    "ChatStreamTranslator",
    "MalformedStream",
    "MappingError",
    "anthropic_request",
    "assemble_chat_stream",
    "assistant_message",
    "chat_choice",
    "chat_chunk",
    "chat_completion",
    "chat_problem",
    "chat_request_of",
    "chunk_choice",
    "error_body",
    "message_events",
    "message_of_chat",
    "parse_exchange",
    "policy_version_of",
    "read_chat_completion",
    "read_message",
    "read_response",
    "responses_messages",
    "responses_request",
    "sse",
    "sse_events",
    "stream_chunks",
    "usage",
]

ENDPOINTS = (("/chat/completions", "chat.completions"), ("/responses", "responses"))
"""URL path suffix → the endpoint name a record carries (OpenAI's APIs)."""

MESSAGES_ENDPOINT = ("/v1/messages", "messages")
"""Anthropic's Messages API: the path suffix (``/v1/...``: OpenAI's ``/threads/<id>/messages`` is not one)."""

_CONVERSATION_KEYS = ("messages", "input", "instructions", "system", "tools")

VERSION_HEADER = "X-Tracerl-Policy-Version"
"""Response header of ``sdk.serve``: the policy version of the weights that produced the response."""

_MODEL_VERSION = re.compile(r"@v(\d+)$")


def _as_version(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def policy_version_of(body: Any, headers: Mapping[str, str] | None = None) -> int | None:
    """The policy version a response (or a stream chunk) says produced it, or None when it does not say.

    Read from the body's ``policy_version`` field (``sdk.serve``), else the ``X-Tracerl-Policy-Version``
    header, else a ``@v<N>`` suffix of the returned ``model`` (a vLLM LoRA adapter the loop named so).

    Example:
        >>> policy_version_of({"model": "policy", "policy_version": 3})
        3
        >>> policy_version_of({"model": "policy"}, {"x-tracerl-policy-version": "2"})
        2
        >>> policy_version_of({"model": "router@v7"}), policy_version_of({"model": "policy"})
        (7, None)
    """
    if isinstance(body, dict):
        version = _as_version(body.get("policy_version"))
        if version is not None:
            return version
    if headers:
        wanted = VERSION_HEADER.lower()
        for key, value in headers.items():
            if isinstance(key, str) and key.lower() == wanted:
                version = _as_version(value)
                if version is not None:
                    return version
    model = body.get("model") if isinstance(body, dict) else None
    match = _MODEL_VERSION.search(model) if isinstance(model, str) else None
    return int(match.group(1)) if match else None


def _clean_message(msg: dict[str, Any]) -> dict[str, Any]:
    out = {k: msg[k] for k in MESSAGE_KEYS if msg.get(k) is not None}
    out.setdefault("role", "assistant")
    if "content" not in out:
        out["content"] = None
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": tc.get("id"),
                "type": tc.get("type") or "function",
                "function": {
                    "name": (tc.get("function") or {}).get("name"),
                    "arguments": (tc.get("function") or {}).get("arguments") or "",
                },
            }
            for tc in out["tool_calls"]
        ]
    return out


def _chat_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    params = {k: v for k, v in body.items() if k not in ("messages", "tools", "model")}
    return list(body.get("messages") or []), body.get("tools"), params


def read_chat_completion(body: dict[str, Any], record: CallRecord) -> None:
    """Fill ``record``'s response parts from a ``chat.completion`` body (other choices go to ``extra``).

    Example:
        >>> rec = CallRecord(framework="openai")
        >>> body = {"model": "m", "choices": [{"message": {"content": "hi"}, "token_ids": [7]}]}
        >>> read_chat_completion(body, rec)
        >>> rec.response_message["content"], rec.completion_token_ids
        ('hi', [7])
    """
    record.response_model = body.get("model")
    record.policy_version = policy_version_of(body)
    record.usage = body.get("usage")
    choices = body.get("choices") or []
    if choices:
        first = choices[0]
        record.response_message = _clean_message(first.get("message") or {})
        record.finish_reason = first.get("finish_reason")
        record.logprobs = capture.openai_logprobs((first.get("logprobs") or {}).get("content"))
        record.completion_token_ids = first.get("token_ids")
        if len(choices) > 1:
            record.extra = {**(record.extra or {}), "other_choices": choices[1:]}
    record.prompt_token_ids = body.get("prompt_token_ids")


def assemble_chat_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold ``chat.completion.chunk`` objects into one ``chat.completion`` body, every choice kept.

    Example:
        >>> chunks = [{"choices": [{"delta": {"content": "h"}}]}, {"choices": [{"delta": {"content": "i"}}]}]
        >>> assemble_chat_stream(chunks)["choices"][0]["message"]["content"]
        'hi'
    """
    choices: dict[int, dict[str, Any]] = {}
    body: dict[str, Any] = {}
    for ev in events:
        if ev.get("model"):
            body["model"] = ev["model"]
        if ev.get("usage"):
            body["usage"] = ev["usage"]
        if ev.get("prompt_token_ids") is not None:
            body["prompt_token_ids"] = ev["prompt_token_ids"]
        if ev.get("policy_version") is not None:
            body.setdefault("policy_version", ev["policy_version"])
        for ch in ev.get("choices") or []:
            index = ch.get("index") or 0
            acc = choices.get(index)
            if acc is None:
                acc = choices[index] = {
                    "content": [], "reasoning": [], "tool_calls": {}, "logprobs": None, "token_ids": None,
                    "finish": None,
                }  # fmt: skip
            delta = ch.get("delta") or {}
            if delta.get("content"):
                acc["content"].append(delta["content"])
            if delta.get("reasoning_content"):
                acc["reasoning"].append(delta["reasoning_content"])
            for tc in delta.get("tool_calls") or []:
                slot = acc["tool_calls"].setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            lp = (ch.get("logprobs") or {}).get("content")
            if lp:
                acc["logprobs"] = (acc["logprobs"] or []) + lp
            if ch.get("token_ids"):
                acc["token_ids"] = (acc["token_ids"] or []) + list(ch["token_ids"])
            if ch.get("finish_reason"):
                acc["finish"] = ch["finish_reason"]
    body["choices"] = [_assembled_choice(i, choices[i]) for i in sorted(choices)] or [
        _assembled_choice(0, None)
    ]
    return body


def _assembled_choice(index: int, acc: dict[str, Any] | None) -> dict[str, Any]:
    """One choice of a reassembled stream, shaped as in a non-streamed chat.completion."""
    if acc is None:  # a stream with no choice chunks: an empty reply, as before
        return {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": None}
    content, reasoning, tool_calls = acc["content"], acc["reasoning"], acc["tool_calls"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": acc["finish"]}
    if acc["logprobs"] is not None:
        choice["logprobs"] = {"content": acc["logprobs"]}
    if acc["token_ids"] is not None:
        choice["token_ids"] = acc["token_ids"]
    return choice


_REQUESTS = {"responses": responses_request, "messages": anthropic_request}


def sse_events(raw: bytes) -> list[tuple[str | None, bytes]]:
    r"""The events of SSE bytes as ``(event name or None, data)``; events without data are left out.

    As the SSE specification (and the official clients) read them: an event ends at a blank line
    (``\n``, ``\r\n`` or ``\r`` line ends), and one that does not end (a stream cut mid-event) is no event;
    several ``data:`` lines are joined by ``\n``; comments are skipped.

    Example:
        >>> sse_events(b'event: message_stop\ndata: {"type": "message_stop"}\n\n: ping\n\ndata: [DONE]\n\nda')
        [('message_stop', b'{"type": "message_stop"}'), (None, b'[DONE]')]
    """
    out: list[tuple[str | None, bytes]] = []
    blocks = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n")
    for block in blocks[:-1]:  # the last one has not ended
        name: str | None = None
        data: list[bytes] = []
        for line in block.split(b"\n"):
            field, _, value = line.partition(b":")
            value = value[1:] if value[:1] == b" " else value
            if field == b"event":
                name = value.decode("utf-8", "replace")
            elif field == b"data":
                data.append(value)
        if data:
            out.append((name, b"\n".join(data)))
    return out


def _sse_events(endpoint: str, raw: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The JSON objects of a stream's events, and why the first event that cannot be read could not be.

    An event whose data is not a JSON object tracerl reads (:func:`sdk._json.parse_untrusted`; for chat
    completions, :func:`chat_problem`) makes the call failed, as it fails the official clients, which parse
    every event. An Anthropic event without a name is ignored, as the ``anthropic`` SDKs ignore it.
    """
    events: list[dict[str, Any]] = []
    problem = None
    for name, data in sse_events(raw):
        data = data.strip()
        if not data or data == b"[DONE]":
            continue
        if endpoint == MESSAGES_ENDPOINT[1] and name is None:
            capture.count("anthropic_stream_events_unnamed")
            continue
        try:
            ev = parse_untrusted(data)
            why = chat_problem(ev, "delta") if endpoint == "chat.completions" else None
            if why is None and not isinstance(ev, dict):
                why = f"it is a {type(ev).__name__}, not an object"
        except UntrustedJSONError as exc:
            why = str(exc)
        if why is not None:
            capture.count("stream_chunks_unparsed")
            problem = problem or f"event {len(events)} cannot be read: {why}"
            continue
        events.append(ev)
    return events, problem


def parse_exchange(
    endpoint: str,
    request_body: dict[str, Any],
    status: int,
    response_body: bytes,
    *,
    content_type: str = "application/json",
    started_at: float | None = None,
    ended_at: float | None = None,
    request_id: str | None = None,
    framework: str = "openai",
    headers: Mapping[str, str] | None = None,
) -> CallRecord:
    """Build a :class:`CallRecord` from one HTTP exchange with an OpenAI-compatible server.

    Args:
        endpoint: ``"chat.completions"`` or ``"responses"``.
        request_body: The parsed request JSON.
        status: HTTP status code.
        response_body: The raw (decoded) response body; SSE streams are reassembled.
        content_type: The response's content type.
        started_at: Unix time the request was sent.
        ended_at: Unix time the response finished.
        request_id: The server's ``x-request-id``.
        framework: Recorded as the call's framework.
        headers: The response's headers (for the policy version a server sends there).

    Returns:
        The call record.

    Example:
        >>> request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        >>> body = b'{"model": "m-1", "choices": [{"message": {"role": "assistant", "content": "yo"}}]}'
        >>> r = parse_exchange("chat.completions", request, 200, body)
        >>> r.response_message["content"], r.response_model
        ('yo', 'm-1')
    """
    problem = None
    try:
        messages, tools, params = _REQUESTS.get(endpoint, _chat_request)(request_body)
    except MappingError as exc:  # stored as it came, without messages: never guessed at
        capture.count("requests_unmapped")
        problem, tools = str(exc), None
        messages, params = [], {k: v for k, v in request_body.items() if k not in _CONVERSATION_KEYS}
    record = CallRecord(
        framework=framework,
        model=request_body.get("model"),
        messages=messages,
        tools=tools,
        params=params,
        endpoint=endpoint,
        stream=bool(request_body.get("stream")),
        request_id=request_id,
        source="transport",
    )
    if problem is not None:
        record.extra = {"malformed_request": {"problem": problem, "request": request_body}}
    if started_at is not None:
        record.started_at = started_at
    record.ended_at = ended_at if ended_at is not None else time.time()
    if status >= 400:
        record.error = _http_error(status, response_body)
    else:
        _read_response(endpoint, response_body, content_type, status, record)
    if status < 400 and record.policy_version is None:  # the body did not say: the header, the model
        record.policy_version = policy_version_of({"model": record.response_model}, headers)
    return record


def _read_response(endpoint: str, raw: bytes, content_type: str, status: int, record: CallRecord) -> None:
    """Fill ``record`` from a response that is not an HTTP error; an unreadable one is a failed call."""
    try:
        if "text/event-stream" in content_type:
            events, problem = _sse_events(endpoint, raw)
            _stream_response(endpoint, events, status, record)
            if problem is not None:  # what the client saw is not known: never a complete turn
                record.finish_reason = None
                record.error = {"type": "malformed_stream", "message": problem, "status": status}
        else:
            _read_body(endpoint, raw, status, record)
    # A field of an unexpected type in an answer or event (the checked chat shapes aside): the readers
    # take the documented shapes, and an answer outside them is stored as a failed call, never lost.
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        capture.count("responses_malformed")
        record.finish_reason = None
        message = f"the response cannot be read: {type(exc).__name__}: {str(exc)[:500]}"
        record.error = {"type": "malformed_response", "message": message, "status": status}


def _read_body(endpoint: str, response_body: bytes, status: int, record: CallRecord) -> None:
    """Fill ``record`` from a non-streamed response body; one that is not a JSON object is a failed call."""
    body, why = _json_object(response_body), None
    if body is not None and endpoint not in ("responses", "messages"):
        why = chat_problem(body, "message")
        why = None if why is None else f"not a chat completion: {why}"
    if body is None or why is not None:  # cut off mid-JSON (a timeout, a dropped connection) or not JSON
        text = response_body[:200].decode("utf-8", "replace")
        why = why or f"not a JSON object ({len(response_body)} bytes): {text}"
        record.error = {"type": "invalid_body", "message": f"the response body is {why}", "status": status}
    elif endpoint == "responses":
        read_response(body, record)
    elif endpoint == "messages":
        read_message(body, record)
    else:
        read_chat_completion(body, record)


def _json_object(body: bytes) -> dict[str, Any] | None:
    """A response body parsed as a JSON object (``{}`` when empty); ``None`` when it is not one."""
    if not body:
        return {}
    try:
        parsed = parse_untrusted(body)
    except UntrustedJSONError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _http_error(status: int, body: bytes) -> dict[str, Any]:
    """The ``error`` of a call the server refused: its error object, else the start of its body."""
    error: dict[str, Any] = {"type": "http_error", "message": None, "status": status}
    try:
        payload = parse_untrusted(body)
        e = payload.get("error", payload) if isinstance(payload, dict) else {}
        if isinstance(e, dict):
            error.update(type=e.get("type") or error["type"], message=e.get("message"), code=e.get("code"))
        else:
            error["message"] = str(e)
    except ValueError:
        error["message"] = body[: capture.MAX_ERROR_MESSAGE].decode("utf-8", "replace")
    return error


def _stream_response(endpoint: str, events: list[dict[str, Any]], status: int, record: CallRecord) -> None:
    """Fill ``record`` from a streamed response's events."""
    if endpoint == "messages":
        read_message_stream(events, status, record)
        return
    if endpoint != "responses":
        read_chat_completion(assemble_chat_stream(events), record)
        if record.finish_reason is None:
            # Closed before its finish chunk (the client stopped reading, or the connection broke): the
            # text so far is kept, marked so that it is never trained as a complete turn.
            record.error = {
                "type": "incomplete_stream",
                "message": f"stream closed before its finish chunk ({len(events)} chunks read)",
                "status": status,
            }
        return
    read_response_stream(events, status, record)
