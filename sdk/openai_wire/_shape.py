"""The shape of a chat completions answer or stream chunk, checked before any of it is read.

Part of :mod:`sdk.openai_wire`. An upstream's JSON is untrusted: ``choices: [1]``, ``"delta": "x"`` or
``"function": "x"`` parse as JSON but are not an answer. :func:`chat_problem` says what is wrong with one
(the types of the fields tracerl reads), so that the readers and the stream translator never meet a value
of the wrong type: such an answer is a failed call (:class:`MalformedStream` for a stream being translated),
never an ``AttributeError``.

Example:
    >>> chat_problem({"choices": [1]}, "delta")
    'choices[0] is a int, not an object'
"""

from __future__ import annotations

from typing import Any

__all__ = ["MalformedStream", "chat_problem"]


class MalformedStream(ValueError):
    """A stream event that cannot be read: not JSON tracerl reads, or not the shape of an event.

    Example:
        >>> str(MalformedStream("choices[0].delta is a str, not an object"))
        'choices[0].delta is a str, not an object'
    """


def _kind(value: Any) -> str:
    return type(value).__name__


def _wrong(value: Any, types: type) -> bool:
    """Whether ``value`` is set and not a ``types`` (``None`` is allowed: the field is absent)."""
    if value is None:
        return False
    return not isinstance(value, types) or (isinstance(value, bool) and types is int)


def chat_problem(body: Any, part: str) -> str | None:
    """What makes a ``chat.completion`` body (``part="message"``) or chunk (``part="delta"``) unreadable.

    ``None`` when every field tracerl reads has its type (absent fields are fine).

    Example:
        >>> chat_problem({"choices": [{"delta": {"content": "hi"}}]}, "delta") is None
        True
        >>> chat_problem({"choices": [{"delta": {"tool_calls": [{"function": "x"}]}}]}, "delta")
        'choices[0].delta.tool_calls[0].function is a str, not an object'
    """
    if not isinstance(body, dict):
        return f"the {'chunk' if part == 'delta' else 'answer'} is a {_kind(body)}, not an object"
    for key, types in (("usage", dict), ("model", str), ("prompt_token_ids", list)):
        if _wrong(body.get(key), types):
            return f"{key} is a {_kind(body[key])}"
    choices = body.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        return f"choices is a {_kind(choices)}, not a list"
    for i, choice in enumerate(choices):
        at = f"choices[{i}]"
        if not isinstance(choice, dict):
            return f"{at} is a {_kind(choice)}, not an object"
        for key, types in (("index", int), ("finish_reason", str), ("logprobs", dict), ("token_ids", list)):
            if _wrong(choice.get(key), types):
                return f"{at}.{key} is a {_kind(choice[key])}"
        if isinstance(choice.get("logprobs"), dict) and _wrong(choice["logprobs"].get("content"), list):
            return f"{at}.logprobs.content is not a list"
        msg = choice.get(part)
        if msg is None:
            continue
        if not isinstance(msg, dict):
            return f"{at}.{part} is a {_kind(msg)}, not an object"
        for key in ("role", "content", "reasoning_content"):
            if _wrong(msg.get(key), str):
                return f"{at}.{part}.{key} is a {_kind(msg[key])}, not a string"
        calls = msg.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            return f"{at}.{part}.tool_calls is a {_kind(calls)}, not a list"
        for j, call in enumerate(calls):
            where = f"{at}.{part}.tool_calls[{j}]"
            if not isinstance(call, dict):
                return f"{where} is a {_kind(call)}, not an object"
            for key, types in (("index", int), ("id", str), ("type", str)):
                if _wrong(call.get(key), types):
                    return f"{where}.{key} is a {_kind(call[key])}"
            fn = call.get("function")
            if fn is None:
                continue
            if not isinstance(fn, dict):
                return f"{where}.function is a {_kind(fn)}, not an object"
            for key in ("name", "arguments"):
                if _wrong(fn.get(key), str):
                    return f"{where}.function.{key} is a {_kind(fn[key])}, not a string"
    return None
