"""The OpenAI wire format, written: ``chat.completion`` bodies, chunks, SSE lines and error bodies.

Part of :mod:`sdk.openai_wire` (which re-exports every name here; import them from there), split from the
reading side to keep each module short. What is written here reads back through
``sdk.openai_wire.parse_exchange`` to the same record, streamed or not (tested).

Example:
    >>> body = chat_completion("c1", 0, "m", [chat_choice(0, assistant_message("yo"), "stop")])
    >>> body["choices"][0]["message"]["content"]
    'yo'
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = [
    "SSE_DONE",
    "assistant_message",
    "chat_choice",
    "chat_chunk",
    "chat_completion",
    "chunk_choice",
    "error_body",
    "sse",
    "stream_chunks",
    "usage",
]

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
    keep = {k: head[k] for k in ("system_fingerprint", "service_tier", "policy_version") if k in head}
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
