"""An agent and a server policy for the check tests: one task's samples all score 0 (no reward spread),
another's alternate between a tool call the server parsed and one it could not (returned as text)."""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from sdk.testing import ScriptedResponse

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "km_from_miles",
            "description": "Convert miles to kilometres.",
            "parameters": {"type": "object", "properties": {"m": {"type": "number"}}, "required": ["m"]},
        },
    }
]
_lock = threading.Lock()
_turns = itertools.count()


def policy(request: dict, endpoint: str) -> ScriptedResponse | None:
    """``mixed`` tasks: every other answer is a call the server could not parse (as vLLM returns it)."""
    text = str(request.get("messages", [{}])[-1].get("content"))
    if "mixed" not in text:
        return ScriptedResponse.text("I do not know.")
    with _lock:
        n = next(_turns)
    if n % 2:
        return ScriptedResponse.text(
            '<tool_call>{"name": "km_from_miles", "arguments": {"m": float(10, 6)}}</tool_call>'
        )
    return ScriptedResponse.tool_calls([{"name": "km_from_miles", "arguments": {"m": 10}}])


def solve(task: dict[str, Any]) -> bool:
    """One call with a tool offered, at temperature 1; True when the model called the tool."""
    import openai

    from integrations.openai import wrap_openai

    client = wrap_openai(
        openai.OpenAI(base_url=os.environ["TRACERL_POLICY_BASE_URL"], api_key="x", max_retries=0)
    )
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["question"]}], tools=TOOLS, temperature=1.0
    )
    return bool(reply.choices[0].message.tool_calls)


def score(task: dict[str, Any], answer: Any) -> float:
    return float(answer is True)
