"""Canonical OpenAI chat messages for episodes, and the loose equality used to follow threads.

Episodes hold every message with the same six keys (``role, content, tool_calls, tool_call_id, name,
reasoning_content``) so the Parquet struct has one shape and a row read back equals the dict built.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["MESSAGE_KEYS", "flatten_content", "normalize_message", "same_message"]

MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})


def flatten_content(content: Any, stats: Counter[str] | None = None) -> str | None:
    r"""Return message content as text: list-of-parts content is joined, images are dropped (counted).

    Text parts are joined with ``"\n"``, as vLLM does when it renders list content for a text-only
    template, so the flattened text matches what the server most likely tokenised.
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                if stats is not None:
                    stats["content_parts_dropped"] += 1
                continue
            kind = part.get("type")
            if kind in _TEXT_PARTS or (kind is None and isinstance(part.get("text"), str)):
                texts.append(str(part.get("text") or ""))
            elif kind == "refusal":
                texts.append(str(part.get("refusal") or ""))
            elif stats is not None:
                stats["images_dropped" if kind in _IMAGE_PARTS else "content_parts_dropped"] += 1
        if stats is not None:
            stats["content_flattened"] += 1
        return "\n".join(texts)
    if stats is not None:
        stats["content_stringified"] += 1
    return json.dumps(content, ensure_ascii=False, default=str)


def _tool_calls(raw: Any, stats: Counter[str]) -> list[dict[str, Any]] | None:
    if not raw:
        return None
    if not isinstance(raw, list):
        raw = [raw]
    out: list[dict[str, Any]] = []
    for tc in raw:
        if not isinstance(tc, dict):
            tc = {}
            stats["invalid_tool_calls"] += 1
        fn = tc.get("function")
        if not isinstance(fn, dict):
            fn = {}
        args = fn.get("arguments")
        if args is None:
            args = ""
        elif not isinstance(args, str):
            # Some frameworks keep parsed arguments; the OpenAI format (and the schema) is a JSON string.
            args = json.dumps(args, ensure_ascii=False, default=str)
            stats["arguments_serialized"] += 1
        tc_id = tc.get("id")
        name = fn.get("name")
        out.append(
            {
                "id": tc_id if isinstance(tc_id, str) else None,
                "type": tc.get("type") if isinstance(tc.get("type"), str) else "function",
                "function": {"name": name if isinstance(name, str) else None, "arguments": args},
            }
        )
    return out


_PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool"})
_PLAIN_KEYS = frozenset({"role", "content", "tool_call_id", "name"})


def normalize_message(m: Any, stats: Counter[str]) -> dict[str, Any]:
    """Return the canonical six-key form of one OpenAI chat message (anomalies counted in ``stats``)."""
    # Fast path for the common shape: text content, a known role, nothing else to convert.
    if type(m) is dict and m.keys() <= _PLAIN_KEYS:
        role, content = m.get("role"), m.get("content")
        tcid, name = m.get("tool_call_id"), m.get("name")
        if (
            role in _PLAIN_ROLES
            and (content is None or type(content) is str)
            and (tcid is None or type(tcid) is str)
            and (name is None or type(name) is str)
        ):
            return {
                "role": role,
                "content": content,
                "tool_calls": None,
                "tool_call_id": tcid,
                "name": name,
                "reasoning_content": None,
            }
    if not isinstance(m, dict):
        stats["invalid_messages"] += 1
        return {
            "role": None,
            "content": flatten_content(m, stats),
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "reasoning_content": None,
        }
    role = m.get("role")
    if role == "developer":
        # Chat templates used for training know no "developer" role; OpenAI treats it as the system prompt.
        role = "system"
        stats["developer_as_system"] += 1
    reasoning = m.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = m.get("reasoning")  # vLLM >= 0.10 names it "reasoning"
        if not isinstance(reasoning, str):
            reasoning = None
    tool_call_id = m.get("tool_call_id")
    name = m.get("name")
    return {
        "role": role if isinstance(role, str) else None,
        "content": flatten_content(m.get("content"), stats),
        "tool_calls": _tool_calls(m.get("tool_calls"), stats),
        "tool_call_id": tool_call_id if isinstance(tool_call_id, str) else None,
        "name": name if isinstance(name, str) else None,
        "reasoning_content": reasoning,
    }


def _args_key(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), sort_keys=True) if args.strip() else ""
        except ValueError:
            return args
    return json.dumps(args, sort_keys=True, default=str) if args is not None else ""


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    role = m.get("role")
    if role == "developer":
        role = "system"
    content = flatten_content(m.get("content")) or ""
    tcs = m.get("tool_calls") or ()
    calls = tuple(
        (
            tc.get("id"),
            (tc.get("function") or {}).get("name"),
            _args_key((tc.get("function") or {}).get("arguments")),
        )
        if isinstance(tc, dict)
        else repr(tc)
        for tc in (tcs if isinstance(tcs, list) else [tcs])
    )
    return (role, content.strip(), calls, m.get("tool_call_id"))


def same_message(a: Any, b: Any) -> bool:
    """Whether two raw messages are the same turn, as re-sent by an agent framework.

    Frameworks re-serialise history between calls: they drop ``reasoning_content``, add ``refusal: None``
    or ``name``, turn ``content: None`` into ``""``, or re-dump tool arguments with other whitespace. Those
    differences must not split a thread, so messages compare on role, text, tool calls (arguments as
    parsed JSON) and ``tool_call_id`` only.
    """
    if a is b or a == b:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return _key(a) == _key(b)
