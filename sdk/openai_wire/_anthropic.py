"""Anthropic's Messages API read as chat messages, and translated to and from chat completions.

Part of :mod:`sdk.openai_wire`. A Messages call is recorded as the call it is (endpoint ``"messages"``,
its own parameters) with its conversation in OpenAI chat format, by this mapping (also in the README,
"Wire formats"):

- ``system`` (a string or text blocks) → one system message, the blocks' texts joined; a ``system`` turn
  among the messages (Claude Code sends one) → a system message there.
- A user turn's ``text`` blocks → the user message's text (joined); ``image`` blocks → ``image_url`` parts
  (base64 sources as data URLs), the text then stays a list of parts; each ``tool_result`` block → a tool
  message (``tool_call_id`` = ``tool_use_id``), before the rest of the turn's content.
- An assistant turn's ``text`` blocks → its content; ``tool_use`` → ``tool_calls`` (``input`` dumped as JSON
  arguments); ``thinking`` → ``reasoning_content`` (the signature is not kept).
- ``tools`` → function tools (``input_schema`` → ``parameters``); server tools are kept as they are.
- A response's ``stop_reason``: ``end_turn``/``stop_sequence`` → ``stop``, ``max_tokens`` → ``length``,
  ``tool_use`` → ``tool_calls``, ``refusal`` → ``content_filter``.

Anything else in a conversation (an unknown block type, a block that is not an object) is a
:class:`MappingError`: the call is stored without messages, its request kept raw, never guessed at. In a
stream, an event without an ``event:`` name is ignored, as the ``anthropic`` SDKs ignore it (counted,
``anthropic_stream_events_unnamed``): the record is what the client read.

Example:
    >>> body = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    >>> messages, tools, params = anthropic_request(body)
    >>> messages, params
    ([{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'hi'}], {'max_tokens': 9})
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sdk import capture
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk.capture import CallRecord
from sdk.openai_wire._responses import MappingError
from sdk.openai_wire._shape import MalformedStream, chat_problem

__all__ = [
    "ChatStreamTranslator",
    "anthropic_request",
    "chat_request_of",
    "message_events",
    "message_of_chat",
    "read_message",
    "read_message_stream",
]

_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
         "refusal": "content_filter", "pause_turn": "stop"}  # fmt: skip
_STOP_BACK = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise MappingError(f"{where}.content is a {type(content).__name__}, not a string or a list")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise MappingError(f"{where}.content[{j}] is not a content block (an object with a type)")
    return content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type')};base64,{src.get('data')}"
    elif src.get("type") == "url":
        url = src.get("url")
    else:
        raise MappingError(f"{where}: image source {src.get('type')!r} cannot be mapped")
    return {"type": "image_url", "image_url": {"url": url}}


def _joined(parts: list[dict[str, Any]]) -> Any:
    """Text parts as one string (as chat templates render them); with an image, the list of parts."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        parts = [
            {"type": "text", "text": b.get("text", "")} if b["type"] == "text" else _image(b, where)
            for b in _blocks(content, where)
        ]
        content = _joined(parts)
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}


def _user_turn(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.content[{j}]"
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            tools.append(_tool_result(block, at))
        else:
            raise MappingError(f"{at}: block type {kind!r} cannot be mapped to a chat message")
    return tools + ([{"role": "user", "content": _joined(parts)}] if parts else [])


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind == "thinking":
            thinking.append(block.get("thinking", ""))
        elif kind == "tool_use":
            args = json.dumps(block.get("input") if block.get("input") is not None else {})
            calls.append(capture.tool_call(block.get("id"), block.get("name"), args))
        else:
            raise MappingError(
                f"{where}.content[{j}]: block type {kind!r} cannot be mapped to a chat message"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def _system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "".join(b["text"] for b in _blocks(system, "system") if b["type"] == "text")


def anthropic_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """An Anthropic Messages request as ``(messages, tools, params)`` in chat format (the module's mapping).

    Raises:
        MappingError: A turn or block the mapping cannot represent.

    Example:
        >>> turn = {"role": "assistant", "content": [{"type": "text", "text": "Let me add."},
        ...         {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]}
        >>> anthropic_request({"messages": [{"role": "user", "content": "1+?"}, turn]})[0][1]["tool_calls"]
        [{'id': 't1', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1}'}}]
    """
    messages: list[dict[str, Any]] = []
    system = _system(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    turns = body.get("messages")
    if not isinstance(turns, list):
        raise MappingError(f"messages is a {type(turns).__name__}, not a list")
    for i, turn in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant", "system"):
            raise MappingError(f"{where} is not a user, assistant or system turn")
        blocks = _blocks(turn.get("content"), where)
        if turn["role"] == "system":  # Claude Code sends some context as a system turn mid-conversation
            messages.append({"role": "system", "content": _system(blocks) or ""})
        elif turn["role"] == "user":
            messages += _user_turn(blocks, where)
        else:
            messages.append(_assistant_turn(blocks, where))
    tools = None
    if body.get("tools") is not None:
        if not isinstance(body["tools"], list) or not all(isinstance(t, dict) for t in body["tools"]):
            raise MappingError("tools is not a list of objects")
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    **({"description": t["description"]} if "description" in t else {}),
                    "parameters": t.get("input_schema") or {},
                },
            }
            if t.get("type") in (None, "custom")
            else t
            for t in body["tools"]
        ]
    params = {k: v for k, v in body.items() if k not in ("messages", "system", "tools", "model")}
    return messages, tools, params


def read_message(body: dict[str, Any], record: CallRecord) -> None:
    """Fill ``record``'s response parts from an Anthropic ``message`` body.

    Example:
        >>> rec = CallRecord(framework="anthropic")
        >>> read_message({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}, rec)
        >>> rec.response_message["content"], rec.finish_reason
        ('hi', 'stop')
    """
    record.response_model = body.get("model")
    blocks = [b for b in body.get("content") or [] if isinstance(b, dict) and isinstance(b.get("type"), str)]
    known = [b for b in blocks if b["type"] in ("text", "thinking", "tool_use")]
    if len(known) < len(blocks):  # e.g. redacted thinking or a server tool: not part of the chat turn
        capture.count("anthropic_blocks_unmapped")
    record.response_message = _assistant_turn(known, "response")
    stop = body.get("stop_reason")
    record.finish_reason = _STOP.get(stop, stop) if isinstance(stop, str) else None
    usage = body.get("usage") or {}
    if usage:
        n_in, n_out = usage.get("input_tokens"), usage.get("output_tokens")
        total = n_in + n_out if isinstance(n_in, int) and isinstance(n_out, int) else None
        record.usage = capture.openai_usage(
            n_in,
            n_out,
            total,
            cached_tokens=usage.get("cache_read_input_tokens"),
            cache_write_tokens=usage.get("cache_creation_input_tokens"),
        )
    # A vLLM-style server may add token ids (as on chat completions): kept when present.
    record.prompt_token_ids = body.get("prompt_token_ids")
    record.completion_token_ids = body.get("token_ids")


def _assemble(events: list[dict[str, Any]]) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """Fold stream events into a message body: ``(body, complete, error event)``."""
    body: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    complete, error = False, None
    for ev in events:
        kind = ev.get("type")
        if kind == "message_start" and isinstance(ev.get("message"), dict):
            body = {k: v for k, v in ev["message"].items() if k != "content"}
        elif kind == "content_block_start" and isinstance(ev.get("content_block"), dict):
            blocks[ev.get("index", len(blocks))] = dict(ev["content_block"])
        elif kind == "content_block_delta" and isinstance(ev.get("delta"), dict):
            block, delta = blocks.setdefault(ev.get("index", 0), {"type": "text", "text": ""}), ev["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif delta.get("type") == "input_json_delta":
                partial.setdefault(ev.get("index", 0), []).append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            body.update((ev.get("delta") or {}).items())
            body["usage"] = {**(body.get("usage") or {}), **(ev.get("usage") or {})}
        elif kind == "message_stop":
            complete = True
        elif kind == "error":
            error = ev.get("error") if isinstance(ev.get("error"), dict) else {"message": str(ev)}
        elif kind not in ("ping", "content_block_stop"):
            capture.count("anthropic_stream_events_unknown")  # new event types are to be ignored (API docs)
    for index, parts in partial.items():
        try:
            blocks[index]["input"] = parse_untrusted("".join(parts)) if "".join(parts) else {}
        except UntrustedJSONError:
            complete = False  # arguments cut off: never a complete turn
    body["content"] = [blocks[i] for i in sorted(blocks)]
    return body, complete, error


def read_message_stream(events: list[dict[str, Any]], status: int, record: CallRecord) -> None:
    """Fill ``record`` from a Messages stream's events; one without ``message_stop`` is an incomplete stream.

    Example:
        >>> rec = CallRecord(framework="anthropic")
        >>> read_message_stream([{"type": "message_start", "message": {"model": "m"}}], 200, rec)
        >>> rec.error["type"]
        'incomplete_stream'
    """
    body, complete, error = _assemble(events)
    read_message(body, record)
    if error is not None:
        record.error = {"type": error.get("type") or "stream_error", "message": error.get("message"),
                        "status": status}  # fmt: skip
    elif not complete:
        record.finish_reason = None  # the text so far is kept; never trained as a complete turn
        record.error = {
            "type": "incomplete_stream",
            "message": f"stream closed before message_stop ({len(events)} events read)",
            "status": status,
        }


# -- translation to chat completions (the gateway in front of an OpenAI-compatible upstream) -------------


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")


def chat_request_of(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request that asks an OpenAI-compatible server what ``body`` asks (not streamed).

    Raises:
        MappingError: As :func:`anthropic_request`.

    Example:
        >>> chat_request_of({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        ...                  "stop_sequences": ["x"]})
        {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 5, 'stop': ['x']}
    """
    messages, tools, _ = anthropic_request(body)
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for src, dst in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("stop_sequences", "stop")):  # fmt: skip
        if body.get(src) is not None:
            out[dst] = body[src]
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
    return out


def message_of_chat(chat: dict[str, Any], model: Any) -> dict[str, Any]:
    """An Anthropic ``message`` body with what a ``chat.completion`` body says (its first choice).

    Example:
        >>> chat = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        ...         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        >>> m = message_of_chat(chat, "m")
        >>> m["content"], m["stop_reason"], m["usage"]
        ([{'type': 'text', 'text': 'hi'}], 'end_turn', {'input_tokens': 3, 'output_tokens': 1})
    """
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            args = parse_untrusted(fn.get("arguments") or "{}")
        except UntrustedJSONError:
            args = None
        if not isinstance(args, dict):
            capture.count("anthropic_arguments_not_object")  # the client gets {}: the record keeps the text
            args = {}
        content.append({"type": "tool_use", "id": tc.get("id"), "name": fn.get("name"), "input": args})
    usage = chat.get("usage") or {}
    finish = choice.get("finish_reason")
    return {
        "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": _STOP_BACK.get(finish, "end_turn"), "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens") or 0,
                  "output_tokens": usage.get("completion_tokens") or 0},
    }  # fmt: skip


def message_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The stream events (``(event name, payload)``) that deliver ``message``, as Anthropic sends them.

    Example:
        >>> [name for name, _ in message_events({"content": [{"type": "text", "text": "hi"}]})]
        ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', \
'message_delta', 'message_stop']
    """
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**(message.get("usage") or {}), "output_tokens": 0}}  # fmt: skip
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        empty = {"text": {"text": ""}, "thinking": {"thinking": ""}, "tool_use": {"input": {}}}.get(kind, {})
        head = {**block, **empty}
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": head})
        )
        if kind == "text":
            delta = {"type": "text_delta", "text": block.get("text", "")}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block.get("thinking", "")}
        else:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    out_tokens = (message.get("usage") or {}).get("output_tokens", 0)
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": out_tokens}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class ChatStreamTranslator:
    """Translates ``chat.completion.chunk`` objects into Anthropic stream events as they arrive.

    Choice 0 only. Reasoning, text and each tool call become content blocks in the order they start; the
    final ``message_delta`` and ``message_stop`` come from :meth:`finish`, once the upstream's stream ended
    (the gateway sends them after the call is stored). A chunk of the wrong shape (:func:`chat_problem`)
    raises :class:`MalformedStream` before any of it is read.

    Example:
        >>> t = ChatStreamTranslator("m")
        >>> [n for n, _ in t.feed({"choices": [{"delta": {"content": "hi"}}]})]
        ['message_start', 'content_block_start', 'content_block_delta']
        >>> [n for n, _ in t.feed({"choices": [{"delta": {}, "finish_reason": "stop"}]})]
        []
        >>> [n for n, _ in t.finish()]
        ['content_block_stop', 'message_delta', 'message_stop']
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.started = False
        self.index = -1  # the open block's index (-1: none)
        self.kind: str | None = None  # the open block's type
        self.tool: Any = None  # the chat tool-call index of the open tool_use block
        self.args = False  # the open tool_use block got arguments
        self.stop: str | None = None
        self.usage: dict[str, Any] = {}

    def _open(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        self.index, self.kind, self.args = self.index + 1, kind, False
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "tool_use" and not self.args:  # a call without arguments: its input is {}
            out.append(self._delta({"type": "input_json_delta", "partial_json": "{}"}))
        self.kind = None
        return [*out, ("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The events one chunk adds (:class:`MalformedStream` if it is not a chunk)."""
        problem = chat_problem(chunk, "delta")
        if problem is not None:
            raise MalformedStream(problem)
        out: list[tuple[str, dict[str, Any]]] = []
        if not self.started:
            self.started = True
            message = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                       "model": chunk.get("model") or self.model, "content": [], "stop_reason": None,
                       "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
            out.append(("message_start", {"type": "message_start", "message": message}))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = next((c for c in chunk.get("choices") or [] if (c.get("index") or 0) == 0), None)
        if choice is None:
            return out
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            if self.kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            if self.kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for tc in delta.get("tool_calls") or []:
            fn = tc.get("function") or {}
            if self.kind != "tool_use" or tc.get("index", 0) != self.tool:
                self.tool = tc.get("index", 0)
                out += self._open("tool_use", {"type": "tool_use", "id": tc.get("id"), "name": fn.get("name"),
                                               "input": {}})  # fmt: skip
            if fn.get("arguments"):
                self.args = True
                out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        if choice.get("finish_reason"):
            self.stop = choice["finish_reason"]
        return out

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        """The events that end the message: the open block's end, ``message_delta``, ``message_stop``."""
        out = self.feed({}) if not self.started else []
        out += self._close()
        delta = {"stop_reason": _STOP_BACK.get(self.stop or "stop", "end_turn"), "stop_sequence": None}
        usage = {"output_tokens": self.usage.get("completion_tokens") or 0}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        return [*out, ("message_stop", {"type": "message_stop"})]
