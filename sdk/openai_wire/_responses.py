"""The Responses API read as chat messages: request items merged the way the serving engine renders them.

Part of :mod:`sdk.openai_wire`. The mapping (documented in the README, "Wire formats"):

- ``instructions`` → a system message; a string ``input`` → one user message; ``developer`` → ``system``.
- Items are merged into the previous assistant message as vLLM does when it renders a Responses request
  (``construct_chat_messages_with_tool_call``): a ``function_call`` (or ``custom_tool_call``) joins the
  previous assistant message's ``tool_calls``; an assistant ``message`` fills the previous assistant
  message's content when it has none; a ``reasoning`` item fills its ``reasoning_content`` when it has
  none. So a response's text, reasoning and calls sent back as items become the one assistant message the
  response was stored as, and the thread continues.
- ``function_call_output`` / ``custom_tool_call_output`` → a tool message.
- ``previous_response_id`` is not resolved (the conversation before it is kept by the server, not sent):
  such a call is counted (``responses_previous_id``) and stored without messages, its request kept raw,
  so that no episode is built on a prompt that is not the one the server rendered.
- Any other item type cannot be mapped faithfully: :class:`MappingError`.

Token ids: vLLM returns them with ``enable_response_messages: true``: ``input_messages`` and
``output_messages`` of ``raw_message_tokens`` (the prompt's and the completion's ids).

Example:
    >>> items = [{"role": "user", "content": "hi"},
    ...          {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    ...          {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    >>> [(m["role"], m["content"], len(m.get("tool_calls") or [])) for m in responses_messages(items)]
    [('user', 'hi', 0), ('assistant', 'ok', 1)]
"""

from __future__ import annotations

import json
from typing import Any

from sdk import capture
from sdk.capture import CallRecord

__all__ = ["MappingError", "read_response", "read_response_stream", "responses_messages", "responses_request"]


class MappingError(ValueError):
    """A request that the documented mapping cannot turn into chat messages faithfully.

    Example:
        >>> str(MappingError("input[0]: unknown item type 'x'"))
        "input[0]: unknown item type 'x'"
    """


def _text(content: Any) -> Any:
    """A content list of text parts as one string; other lists (images) as they are."""
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and "text" in p]
        return "".join(texts) if len(texts) == len(content) else content
    return content


def _previous_assistant(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    last = messages[-1] if messages else None
    return last if last is not None and last.get("role") == "assistant" else None


def _item_message(item: dict[str, Any], messages: list[dict[str, Any]], where: str) -> dict[str, Any] | None:
    """The message ``item`` adds, or ``None`` when it merged into the previous assistant message."""
    kind = item.get("type", "message")
    prev = _previous_assistant(messages)
    if kind in ("function_call", "custom_tool_call"):
        args = item.get("arguments") or ""
        if kind == "custom_tool_call":  # vLLM renders a free-form call as a function call of {"input": ...}
            args = json.dumps({"input": item.get("input")})
        call = capture.tool_call(item.get("call_id"), item.get("name"), args)
        if prev is not None:
            prev["tool_calls"] = [*(prev.get("tool_calls") or []), call]
            return None
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = _text(item.get("output"))
        text = output if isinstance(output, str) else json.dumps(output)
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": text}
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        text = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
        if prev is not None and prev.get("reasoning_content") is None:
            prev["reasoning_content"] = text
            return None
        return {"role": "assistant", "content": None, "reasoning_content": text}
    if kind == "message":
        role, content = item.get("role", "user"), _text(item.get("content"))
        if role == "assistant" and prev is not None and prev.get("content") is None:
            prev["content"] = content
            return None
        return {"role": "system" if role == "developer" else role, "content": content}
    raise MappingError(f"{where}: unknown item type {kind!r}")


def responses_messages(items: Any) -> list[dict[str, Any]]:
    """Responses ``input`` items as chat messages, merged as the serving engine renders them.

    Raises:
        MappingError: An item that is not an object, or of a type the mapping does not know.

    Example:
        >>> responses_messages("hi")
        [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            raise MappingError(f"input[{i}] is a {type(item).__name__}, not an object")
        message = _item_message(item, messages, f"input[{i}]")
        if message is not None:
            messages.append(message)
    return messages


def responses_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """A Responses request as ``(messages, tools, params)`` in chat format.

    Example:
        >>> responses_request({"model": "m", "instructions": "be brief", "input": "hi"})[0][0]
        {'role': 'system', 'content': 'be brief'}
    """
    if body.get("previous_response_id"):
        capture.count("responses_previous_id")
        raise MappingError(
            "previous_response_id: the conversation before it is kept by the server, not in the request"
        )
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    messages += responses_messages(body.get("input"))
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


def _raw_tokens(entries: Any) -> list[int] | None:
    """The ids of vLLM's ``raw_message_tokens`` list when it holds exactly one entry, else ``None``."""
    if not isinstance(entries, list) or not entries:
        return None
    if (
        len(entries) != 1
        or not isinstance(entries[0], dict)
        or not isinstance(entries[0].get("tokens"), list)
    ):
        capture.count("responses_token_ids_unused")  # several generations in one response: not one turn
        return None
    return [int(t) for t in entries[0]["tokens"]]


def read_response(body: dict[str, Any], record: CallRecord) -> None:
    """Fill ``record``'s response parts from a Responses ``response`` object (token ids when vLLM sent them).

    Example:
        >>> rec = CallRecord(framework="openai")
        >>> read_response({"output": [{"type": "function_call", "call_id": "c", "name": "f",
        ...                            "arguments": "{}"}]}, rec)
        >>> rec.finish_reason, rec.response_message["tool_calls"][0]["function"]["name"]
        ('tool_calls', 'f')
    """
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
            parts = item.get("content") or item.get("summary") or []
            reasoning.append("\n".join(s.get("text", "") for s in parts))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    record.response_message = message
    status = body.get("status")
    record.finish_reason = "tool_calls" if calls else ("length" if status == "incomplete" else "stop")
    record.logprobs = capture.openai_logprobs(logprobs) if logprobs else None
    record.prompt_token_ids = _raw_tokens(body.get("input_messages"))
    record.completion_token_ids = _raw_tokens(body.get("output_messages"))
    ids = record.completion_token_ids
    if ids is not None and record.logprobs is not None and len(record.logprobs) != len(ids):
        # Output-text logprobs leave out the tool calls' tokens: not one per completion token, not kept.
        capture.count("responses_logprobs_partial")
        record.logprobs = None
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


def read_response_stream(events: list[dict[str, Any]], status: int, record: CallRecord) -> None:
    """Fill ``record`` from a streamed response's events (its final ``response.*`` event).

    Example:
        >>> rec = CallRecord(framework="openai")
        >>> read_response_stream([{"type": "response.created"}], 200, rec)
        >>> rec.error["type"]
        'incomplete_stream'
    """
    final = next(
        (
            e["response"]
            for e in reversed(events)
            if e.get("type") in ("response.completed", "response.failed", "response.incomplete")
            and isinstance(e.get("response"), dict)
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
    read_response(final, record)
