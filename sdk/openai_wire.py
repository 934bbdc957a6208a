"""The OpenAI HTTP wire format, read and written in one place.

Reading: one converter from raw request and response bytes to a :class:`~sdk.capture.CallRecord`, for
every capture path that sees them: the in-process recording transport (``integrations.openai``) and the
recording gateway (``sdk.gateway``). Chat completions and the Responses API, plain JSON or SSE streams
(reassembled, every choice kept), compressed or not, error bodies too.

Writing: ``chat.completion`` bodies, ``chat.completion.chunk`` objects, SSE lines and error bodies, for the
servers that answer OpenAI clients: the policy server (``trainers.serve``), the scripted test server
(``sdk.testing``) and the gateway's own errors. What is written here reads back through
:func:`parse_exchange` to the same record, streamed or not (tested).

Standard library only: no ``openai`` or ``httpx`` import.

Example:
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

import gzip
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

from sdk import capture
from sdk.capture import CallRecord
from sdk.messages import MESSAGE_KEYS

__all__ = [
    "ENDPOINTS",
    "SSE_DONE",
    "assemble_chat_stream",
    "assistant_message",
    "chat_choice",
    "chat_chunk",
    "chat_completion",
    "chunk_choice",
    "decode_body",
    "error_body",
    "parse_exchange",
    "read_chat_completion",
    "sse",
    "stream_chunks",
    "usage",
]

ENDPOINTS = (("/chat/completions", "chat.completions"), ("/responses", "responses"))
"""URL path suffix → the endpoint name a record carries."""


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


def _responses_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    for item in items if isinstance(items, list) else []:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                texts = [p.get("text", "") for p in content if isinstance(p, dict) and "text" in p]
                content = "".join(texts) if len(texts) == len(content) else content
            role = item.get("role", "user")
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call = capture.tool_call(item.get("call_id"), item.get("name"), item.get("arguments") or "")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
    tools = None
    if body.get("tools"):
        tools = [
            {
                "type": "function",
                "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t},
            }
            if t.get("type") == "function"
            else t
            for t in body["tools"]
        ]
    params = {k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "model")}
    return messages, tools, params


def _responses_response(body: dict[str, Any], record: CallRecord) -> None:
    record.response_model = body.get("model")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    for item in body.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    texts.append(part.get("text", ""))
                    logprobs.extend(part.get("logprobs") or [])
        elif kind == "function_call":
            calls.append(
                capture.tool_call(item.get("call_id"), item.get("name"), item.get("arguments") or "")
            )
        elif kind == "reasoning":
            reasoning.extend(s.get("text", "") for s in item.get("summary") or [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    record.response_message = message
    status = body.get("status")
    record.finish_reason = "tool_calls" if calls else ("length" if status == "incomplete" else "stop")
    record.logprobs = capture.openai_logprobs(logprobs) if logprobs else None
    usage = body.get("usage")
    if usage:
        details = {k: v for k, v in usage.items() if k.endswith("_details")}  # Responses names, kept
        record.usage = {
            **capture.openai_usage(
                usage.get("input_tokens"), usage.get("output_tokens"), usage.get("total_tokens")
            ),
            **details,
        }
    if body.get("error"):
        record.error = {
            "type": (body["error"] or {}).get("code") or "response_failed",
            "message": (body["error"] or {}).get("message"),
            "status": None,
        }


def _sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            ev = json.loads(data)
        except ValueError:
            capture.count("stream_chunks_unparsed")
            continue
        if isinstance(ev, dict):
            events.append(ev)
    return events


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

    Returns:
        The call record.

    Example:
        >>> request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        >>> body = b'{"model": "m-1", "choices": [{"message": {"role": "assistant", "content": "yo"}}]}'
        >>> r = parse_exchange("chat.completions", request, 200, body)
        >>> r.response_message["content"], r.response_model
        ('yo', 'm-1')
    """
    if endpoint == "responses":
        messages, tools, params = _responses_request(request_body)
    else:
        messages, tools, params = _chat_request(request_body)
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
    if started_at is not None:
        record.started_at = started_at
    record.ended_at = ended_at if ended_at is not None else time.time()
    if status >= 400:
        record.error = _http_error(status, response_body)
    elif "text/event-stream" in content_type:
        _stream_response(endpoint, _sse_events(response_body), status, record)
    else:
        body = json.loads(response_body) if response_body else {}
        if endpoint == "responses":
            _responses_response(body, record)
        else:
            read_chat_completion(body, record)
    return record


def _http_error(status: int, body: bytes) -> dict[str, Any]:
    """The ``error`` of a call the server refused: its error object, else the start of its body."""
    error: dict[str, Any] = {"type": "http_error", "message": None, "status": status}
    try:
        payload = json.loads(body)
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
    final = next(
        (
            e["response"]
            for e in reversed(events)
            if e.get("type") in ("response.completed", "response.failed", "response.incomplete")
        ),
        None,
    )
    if final is None:
        record.error = {
            "type": "incomplete_stream",
            "message": "stream ended before response.completed",
            "status": status,
        }
        return
    _responses_response(final, record)


def decode_body(raw: bytes, encoding: str) -> bytes | None:
    """``raw`` decoded from its ``Content-Encoding`` (identity, gzip, deflate); ``None`` for another one.

    Example:
        >>> decode_body(gzip.compress(b"{}"), "gzip"), decode_body(b"x", "br")
        (b'{}', None)
    """
    encoding = encoding.lower().strip()
    if not encoding or encoding == "identity":
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        try:
            return zlib.decompress(raw)
        except zlib.error:
            return zlib.decompress(raw, -zlib.MAX_WBITS)
    return None


# --------------------------------------------------------------------------------------------- writing

SSE_DONE = b"data: [DONE]\n\n"
"""The line that ends a chat-completions SSE stream."""


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    r"""One server-sent event: ``data: <json>`` (with ``event:`` first for the Responses API).

    Example:
        >>> sse({"a": 1})
        b'data: {"a": 1}\n\n'
    """
    data = json.dumps(payload).encode("utf-8")
    head = f"event: {event}\n".encode() if event is not None else b""
    return head + b"data: " + data + b"\n\n"


def error_body(
    message: str, type: str = "invalid_request_error", *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI error body, ``{"error": {message, type, param, code}}``.

    Example:
        >>> error_body("no such model", code="model_not_found")["error"]["code"]
        'model_not_found'
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, *, reasoning_tokens: int = 0) -> dict[str, Any]:
    """A chat completion's ``usage``, with the details OpenAI sends.

    Example:
        >>> usage(3, 2)["total_tokens"]
        5
    """
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }  # fmt: skip


def assistant_message(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    reasoning_content: str | None = None,
) -> dict[str, Any]:
    """A chat completion's assistant ``message`` (tool calls as built by ``sdk.capture.tool_call``).

    Example:
        >>> assistant_message("hi")
        {'role': 'assistant', 'content': 'hi', 'refusal': None, 'annotations': []}
    """
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if reasoning_content:
        message["reasoning_content"] = reasoning_content
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": entries, "refusal": None} if entries is not None else None


def chat_choice(
    index: int,
    message: dict[str, Any],
    finish_reason: str | None,
    *,
    logprobs: list[dict[str, Any]] | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One ``choices`` entry of a chat completion; ``token_ids`` is vLLM's (``return_token_ids``).

    Args:
        index: The choice's index.
        message: The assistant message (see :func:`assistant_message`).
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``...
        logprobs: OpenAI per-token entries (``token``, ``logprob``, ``bytes``, ``top_logprobs``), or ``None``.
        token_ids: The completion's token ids, or ``None``.

    Example:
        >>> chat_choice(0, assistant_message("hi"), "stop", token_ids=[7])["token_ids"]
        [7]
    """
    choice = {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": _logprobs(logprobs),
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def _envelope(object: str, id: str, created: int, model: str, **extra: Any) -> dict[str, Any]:
    return {"id": id, "object": object, "created": created, "model": model, **extra}


def chat_completion(
    id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    prompt_token_ids: list[int] | None = None,
    system_fingerprint: str | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` body; ``prompt_token_ids`` is vLLM's top-level field (``return_token_ids``).

    Example:
        >>> body = chat_completion("c1", 0, "m", [chat_choice(0, assistant_message("hi"), "stop")])
        >>> body["object"], body["choices"][0]["message"]["content"]
        ('chat.completion', 'hi')
    """
    body = _envelope(
        "chat.completion",
        id,
        created,
        model,
        system_fingerprint=system_fingerprint,
        service_tier=service_tier,
    )
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    return body


def chunk_choice(
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    logprobs: list[dict[str, Any]] | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One ``choices`` entry of a ``chat.completion.chunk``: a ``delta`` and the tokens it carries.

    Example:
        >>> chunk_choice(0, {"content": "hi"}, logprobs=[{"token": "hi", "logprob": -0.5}])["logprobs"]
        {'content': [{'token': 'hi', 'logprob': -0.5}], 'refusal': None}
    """
    choice = {"index": index, "delta": delta, "logprobs": _logprobs(logprobs), "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def chat_chunk(head: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with the id, times and model of ``head`` (a completion or a chunk).

    ``extra`` adds top-level fields: ``usage`` (the last chunk's, with ``stream_options.include_usage``),
    ``prompt_token_ids`` (vLLM's, on the first chunk).

    Example:
        >>> head = chat_completion("c1", 0, "m", [])
        >>> chat_chunk(head, [chunk_choice(0, {"content": "hi"})])["object"]
        'chat.completion.chunk'
    """
    keep = {k: head[k] for k in ("system_fingerprint", "service_tier") if k in head}
    return {**_envelope("chat.completion.chunk", head["id"], head["created"], head["model"], **keep),
            "choices": choices, **extra}  # fmt: skip


def stream_chunks(completion: dict[str, Any], *, include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """Replay a finished ``chat.completion`` as its ``chat.completion.chunk`` objects, choice after choice.

    Text goes one chunk per token where the choice has logprobs (each chunk with its entry and token id),
    else in one chunk; each tool call as a head (id, name) and its arguments. Parsed back, the chunks give
    the completion's record (:func:`parse_exchange`).

    Example:
        >>> body = chat_completion("c1", 0, "m", [chat_choice(0, assistant_message("hi"), "stop")])
        >>> [c["choices"][0]["delta"] for c in stream_chunks(body)]
        [{'role': 'assistant', 'content': ''}, {'content': 'hi'}, {}]
    """
    for n, c in enumerate(completion["choices"]):
        i = c["index"]
        first = (
            {"prompt_token_ids": completion["prompt_token_ids"]}
            if n == 0 and "prompt_token_ids" in completion
            else {}
        )
        yield chat_chunk(completion, [chunk_choice(i, {"role": "assistant", "content": ""})], **first)
        for choice in _choice_chunks(c):
            yield chat_chunk(completion, [choice])
        yield chat_chunk(completion, [chunk_choice(i, {}, c["finish_reason"])])
    if include_usage:
        yield chat_chunk(completion, [], usage=completion.get("usage"))


def _choice_chunks(c: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The chunk choices that carry one choice's message and tokens, between its first and last chunk."""
    i, msg = c["index"], c["message"]
    lps, ids = (c.get("logprobs") or {}).get("content"), c.get("token_ids")
    if msg.get("reasoning_content"):
        yield chunk_choice(i, {"reasoning_content": msg["reasoning_content"]})
    if lps and not msg.get("tool_calls") and (ids is None or len(ids) == len(lps)):
        yield from _token_chunks(i, msg.get("content") or "", lps, ids)
        return
    tokens: dict[str, Any] = {"logprobs": lps, "token_ids": ids}  # with the first chunk that follows
    if msg.get("content") or not msg.get("tool_calls"):
        yield chunk_choice(i, {"content": msg.get("content") or ""}, **tokens)
        tokens = {}
    for k, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc["function"]
        head = {
            "index": k,
            "id": tc["id"],
            "type": "function",
            "function": {"name": fn["name"], "arguments": ""},
        }
        yield chunk_choice(i, {"tool_calls": [head]}, **tokens)
        tokens = {}
        yield chunk_choice(i, {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})


def _token_chunks(
    i: int, text: str, lps: list[dict[str, Any]], ids: list[int] | None
) -> Iterator[dict[str, Any]]:
    """One chunk per token, spelling the text.

    A token whose string does not continue the text (an end-of-turn token, a piece of a multi-byte
    character) carries none; what is left of the text goes with the last token.
    """
    sent = 0
    for k, entry in enumerate(lps):
        piece = entry.get("token")
        if isinstance(piece, str) and piece and text.startswith(piece, sent):
            sent += len(piece)
        else:
            piece = ""
        if k == len(lps) - 1 and sent < len(text):
            piece, sent = piece + text[sent:], len(text)
        one_id = [ids[k]] if ids is not None else None
        yield chunk_choice(i, {"content": piece}, logprobs=[entry], token_ids=one_id)
