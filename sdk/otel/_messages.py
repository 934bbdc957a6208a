"""OpenAI chat messages <-> OpenTelemetry GenAI message parts, and the older message shapes read on ingest.

The GenAI conventions (``gen_ai.input.messages`` / ``gen_ai.output.messages``) hold
``[{"role", "parts": [...]}]`` with ``text``, ``tool_call``, ``tool_call_response``, ``reasoning``,
``uri`` and ``blob`` parts; ``gen_ai.tool.definitions`` holds ``{"type": "function", "name",
"description", "parameters"}``. Ingest also reads the shapes instrumentations emitted before that:
Bedrock Converse content blocks (Strands' per-message span events), the v1.28 event bodies
(``{"content", "tool_calls"}``) and OpenLLMetry's flat ``gen_ai.prompt.{i}.*`` attributes.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "FINISH_REASONS",
    "flat_messages",
    "flat_tools",
    "from_parts",
    "from_value",
    "tools_from_definitions",
    "tools_to_definitions",
    "to_output_parts",
    "to_parts",
]

# Finish reasons of other vocabularies (GenAI output messages, Bedrock/Strands) -> OpenAI chat.
FINISH_REASONS = {
    "tool_call": "tool_calls",
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# ---------------------------------------------------------------------------------------------
# Export: OpenAI -> GenAI parts
# ---------------------------------------------------------------------------------------------


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if not isinstance(content, list):
        return [{"type": "text", "content": _dumps(content)}]
    parts: list[dict[str, Any]] = []
    for p in content:
        if isinstance(p, str):
            parts.append({"type": "text", "content": p})
        elif not isinstance(p, dict):
            continue
        elif p.get("type") in ("text", "input_text", "output_text") or "text" in p:
            parts.append({"type": "text", "content": str(p.get("text") or "")})
        elif p.get("type") == "image_url":
            url = (p.get("image_url") or {}).get("url") if isinstance(p.get("image_url"), dict) else None
            if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
                mime, data = url[5:].split(";base64,", 1)
                parts.append({"type": "blob", "modality": "image", "mime_type": mime, "content": data})
            elif isinstance(url, str):
                parts.append({"type": "uri", "modality": "image", "uri": url})
        else:
            parts.append(dict(p))  # a generic part: its own type and fields
    return parts


def to_parts(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message as a GenAI ``{"role", "parts"}`` message.

    Example:
        >>> to_parts({"role": "tool", "tool_call_id": "c1", "content": "5"})
        {'role': 'tool', 'parts': [{'type': 'tool_call_response', 'id': 'c1', 'response': '5'}]}
    """
    role = message.get("role") or "user"
    if role == "tool":
        content = message.get("content")
        response = content if isinstance(content, str) or content is None else _text_of(content)
        parts = [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": response}]
    else:
        parts = []
        if message.get("reasoning_content"):
            parts.append({"type": "reasoning", "content": message["reasoning_content"]})
        parts += _content_parts(message.get("content"))
        for tc in message.get("tool_calls") or ():
            fn = tc.get("function") or {}
            args = fn.get("arguments")
            parsed = _loads(args)
            # Arguments that are not a JSON object stay the string the model wrote.
            parts.append(
                {
                    "type": "tool_call",
                    "id": tc.get("id"),
                    "name": fn.get("name"),
                    "arguments": parsed if isinstance(parsed, dict) else args,
                }
            )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if message.get("name"):
        out["name"] = message["name"]
    return out


def to_output_parts(message: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    """The assistant response as a GenAI output message (with its finish reason when known).

    Example:
        >>> to_output_parts({"role": "assistant", "content": "4"}, "stop")["finish_reason"]
        'stop'
    """
    out = to_parts({**message, "role": message.get("role") or "assistant"})
    if finish_reason:
        out["finish_reason"] = "tool_call" if finish_reason == "tool_calls" else finish_reason
    return out


def tools_to_definitions(tools: Any) -> list[dict[str, Any]]:
    """OpenAI tool schemas -> ``gen_ai.tool.definitions`` entries (function fields lifted up).

    Example:
        >>> tools_to_definitions([{"type": "function", "function": {"name": "add", "parameters": {}}}])
        [{'type': 'function', 'name': 'add', 'parameters': {}}]
    """
    out = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and isinstance(t.get("function"), dict):
            out.append({"type": t.get("type") or "function", **t["function"]})
        elif isinstance(t, dict):
            out.append(dict(t))
    return out


# ---------------------------------------------------------------------------------------------
# Ingest: GenAI parts, Bedrock blocks, v1.28 bodies, OpenLLMetry attributes -> OpenAI
# ---------------------------------------------------------------------------------------------


def _text_of(value: Any) -> str:
    """Tool results and content in any of the shapes seen: a string, text parts, Bedrock blocks, JSON."""
    value = _loads(value) if isinstance(value, str) and value[:1] in "[{" else value
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for b in value:
            if isinstance(b, str):
                texts.append(b)
            elif isinstance(b, dict) and "text" in b:
                texts.append(str(b["text"]))
            elif isinstance(b, dict) and b.get("type") == "text" and "content" in b:
                texts.append(str(b["content"]))
            elif isinstance(b, dict) and "json" in b:
                texts.append(_dumps(b["json"]))
            else:
                texts.append(_dumps(b))
        return "\n".join(texts)
    return _dumps(value)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    arguments = _loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _assemble(
    role: str,
    texts: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    reasoning: list[str],
    results: list[dict[str, Any]],
    name: Any = None,
) -> list[dict[str, Any]]:
    # Tool results become their own ``tool`` messages, ahead of the rest of the message (as on the wire).
    out = list(results)
    content: Any = None
    if len(texts) == 1 and texts[0].get("type") == "text":
        content = texts[0]["text"]
    elif texts:
        content = texts
    if role == "assistant":
        if content is not None or calls or reasoning:
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            out.append(msg)
    elif content is not None:
        msg = {"role": role, "content": content}
        if name:
            msg["name"] = name
        out.append(msg)
    return out


def from_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A GenAI ``{"role", "parts"}`` message -> OpenAI chat message(s).

    Example:
        >>> from_parts({"role": "assistant", "parts": [
        ...     {"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 1}}]})[0]["tool_calls"]
        [{'id': 'c1', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1}'}}]
    """
    role = str(message.get("role") or "user")
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    results: list[dict[str, Any]] = []
    for p in message.get("parts") or ():
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "text":
            texts.append({"type": "text", "text": str(p.get("content") or "")})
        elif kind == "tool_call":
            calls.append(_tool_call(p.get("id"), p.get("name"), p.get("arguments")))
        elif kind == "tool_call_response":
            resp = p.get("response", p.get("result"))
            results.append({"role": "tool", "tool_call_id": p.get("id"), "content": _text_of(resp)})
        elif kind in ("reasoning", "reasoningContent"):
            c = p.get("content")
            if isinstance(c, dict):  # Strands' unmapped reasoningContent block
                c = (c.get("reasoningText") or {}).get("text")
            if c:
                reasoning.append(str(c))
        elif kind == "uri" and p.get("modality") == "image":
            texts.append({"type": "image_url", "image_url": {"url": p.get("uri")}})
        elif kind == "blob" and p.get("modality") == "image":
            url = f"data:{p.get('mime_type') or 'image/png'};base64,{p.get('content')}"
            texts.append({"type": "image_url", "image_url": {"url": url}})
    if role == "tool" and not results and texts:  # a tool message written as text
        return [{"role": "tool", "tool_call_id": message.get("id"), "content": _text_of(texts)}]
    return _assemble(role, texts, calls, reasoning, results, message.get("name"))


def _from_blocks(role: str, blocks: list[Any]) -> list[dict[str, Any]]:
    """Bedrock Converse content blocks (Strands' legacy span events) -> OpenAI message(s)."""
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    results: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, str):
            texts.append({"type": "text", "text": b})
        elif not isinstance(b, dict):
            continue
        elif "text" in b:
            texts.append({"type": "text", "text": str(b["text"])})
        elif "toolUse" in b:
            u = b["toolUse"] or {}
            calls.append(_tool_call(u.get("toolUseId"), u.get("name"), u.get("input")))
        elif "toolResult" in b:
            r = b["toolResult"] or {}
            results.append(
                {"role": "tool", "tool_call_id": r.get("toolUseId"), "content": _text_of(r.get("content"))}
            )
        elif "reasoningContent" in b:
            t = ((b["reasoningContent"] or {}).get("reasoningText") or {}).get("text")
            if t:
                reasoning.append(t)
        elif "type" in b:  # already GenAI parts
            return from_parts({"role": role, "parts": blocks})
    return _assemble(role, texts, calls, reasoning, results)


def from_value(role: str, value: Any) -> list[dict[str, Any]]:
    """One message given as a span event's payload, in any of the shapes seen -> OpenAI message(s).

    ``value`` may be plain text, a JSON string, Bedrock content blocks, GenAI parts, a GenAI message
    (``{"role", "parts"}``) or a v1.28 event body (``{"content", "tool_calls", "id"}``).

    Example:
        >>> from_value("user", '[{"text": "hi"}]')
        [{'role': 'user', 'content': 'hi'}]
    """
    value = _loads(value)
    if isinstance(value, str):
        if role == "tool":
            return [{"role": "tool", "tool_call_id": None, "content": value}]
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return _from_blocks(role, value)
    if isinstance(value, dict):
        if "parts" in value:
            return from_parts({"role": value.get("role") or role, **value})
        role = str(value.get("role") or role)
        content = value.get("content")
        if role == "tool":
            return [
                {
                    "role": "tool",
                    "tool_call_id": value.get("id") or value.get("tool_call_id"),
                    "content": _text_of(content),
                }
            ]
        msg: dict[str, Any] = {
            "role": role,
            "content": content if isinstance(content, str) or content is None else _text_of(content),
        }
        calls = [
            _tool_call(
                tc.get("id"),
                (tc.get("function") or {}).get("name"),
                (tc.get("function") or {}).get("arguments"),
            )
            for tc in value.get("tool_calls") or ()
            if isinstance(tc, dict)
        ]
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    return []


def tools_from_definitions(value: Any) -> list[dict[str, Any]] | None:
    """``gen_ai.tool.definitions`` (or Strands' ``inputSchema`` specs) -> OpenAI tool schemas.

    Example:
        >>> tools_from_definitions('[{"type": "function", "name": "add", "parameters": {}}]')
        [{'type': 'function', 'function': {'name': 'add', 'parameters': {}}}]
    """
    value = _loads(value)
    if not isinstance(value, list) or not value:
        return None
    out = []
    for d in value:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("function"), dict):  # already OpenAI
            out.append(d)
            continue
        fn = {k: v for k, v in d.items() if k not in ("type", "inputSchema", "outputSchema")}
        if "inputSchema" in d:  # Strands: {"name", "description", "inputSchema": {"json": schema}}
            schema = d.get("inputSchema") or {}
            fn["parameters"] = schema.get("json", schema) if isinstance(schema, dict) else schema
        out.append({"type": d.get("type") or "function", "function": fn})
    return out or None


def _indexed(attrs: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``{prefix}.{i}.{rest}`` attributes -> ``{i: {rest: value}}``."""
    out: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        head, _, rest = key[len(prefix) :].partition(".")
        if head.isdigit() and rest:
            out.setdefault(int(head), {})[rest] = value
    return out


def _flat_message(fields: dict[str, Any]) -> dict[str, Any]:
    role = str(fields.get("role") or "user")
    msg: dict[str, Any] = {"role": role, "content": fields.get("content")}
    if role == "tool":
        msg["tool_call_id"] = fields.get("tool_call_id")
    calls = _indexed(fields, "tool_calls.")
    if calls:
        msg["tool_calls"] = [
            _tool_call(c.get("id"), c.get("name"), c.get("arguments")) for _, c in sorted(calls.items())
        ]
    if fields.get("name") and role != "assistant":
        msg["name"] = fields["name"]
    return msg


def flat_messages(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenLLMetry's flat ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*`` attributes -> messages.

    Example:
        >>> flat_messages({"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hi"}, "gen_ai.prompt.")
        [{'role': 'user', 'content': 'hi'}]
    """
    return [_flat_message(f) for _, f in sorted(_indexed(attrs, prefix).items())]


def flat_tools(attrs: dict[str, Any]) -> list[dict[str, Any]] | None:
    """OpenLLMetry's ``llm.request.functions.{i}.*`` attributes -> OpenAI tool schemas."""
    fns = _indexed(attrs, "llm.request.functions.")
    out = []
    for _, f in sorted(fns.items()):
        fn: dict[str, Any] = {"name": f.get("name")}
        if f.get("description") is not None:
            fn["description"] = f["description"]
        if f.get("parameters") is not None:
            fn["parameters"] = _loads(f["parameters"])
        out.append({"type": "function", "function": fn})
    return out or None
