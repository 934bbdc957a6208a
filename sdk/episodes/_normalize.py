"""The loose message equality used to follow threads; the message forms themselves are in ``sdk.messages``."""

from __future__ import annotations

import json
from typing import Any

from sdk.messages import flatten_content

__all__ = ["same_message"]


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
