"""An office-directory assistant (raw openai client, two tools), as a user would write it for tracerl.

The task of ``tests/bench/own_agent.py``: questions about a person's phone number or office; the agent looks
them up with ``phone_of`` / ``office_of`` and answers. Reward 1 when the answer holds the right value.

Example:
    >>> score({"answer": "555-0101"}, "Ada's phone number is 555-0101.")
    1.0
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

FIRST = [
    "Ada",
    "Grace",
    "Linus",
    "Alan",
    "Barbara",
    "Edsger",
    "Donald",
    "Margaret",
    "Ken",
    "Dennis",
    "Frances",
    "John",
    "Radia",
    "Tim",
    "Shafi",
    "Leslie",
    "Niklaus",
    "Bjarne",
    "Guido",
    "Anita",
    "Katherine",
    "Hedy",
    "Claude",
    "Joan",
    "Ivan",
    "Sophie",
    "Robin",
    "Fran",
    "Adele",
    "Whitfield",
]
PHONES = {n: f"555-{100 + i:04d}" for i, n in enumerate(FIRST)}
OFFICES = {n: f"room {210 + 7 * i}" for i, n in enumerate(FIRST)}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "phone_of",
            "description": "Phone number of a person.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "office_of",
            "description": "Office room of a person.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    },
]
QUESTION = {"phone": "What is {}'s phone number?", "office": "Which office is {} in?"}


def lookup(tool: str, arguments: str) -> str:
    """Run a tool call; bad input is an answer the model sees, not an exception."""
    try:
        name = json.loads(arguments).get("name")
    except (ValueError, AttributeError):
        return "error: arguments must be a JSON object with a name"
    table = PHONES if tool == "phone_of" else OFFICES if tool == "office_of" else None
    return "error: unknown tool" if table is None else table.get(name, "unknown person")


def solve(task: dict[str, Any]) -> str:
    """Answer one question with the tools (the policy server's address is read at each call)."""
    import openai

    from integrations.openai import wrap_openai

    client = wrap_openai(
        openai.OpenAI(base_url=os.environ["TRACERL_POLICY_BASE_URL"], api_key="none", max_retries=0),
        token_data=True,
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = (
            client.chat.completions.create(
                model=os.environ.get("TRACERL_POLICY_MODEL", "policy"),
                messages=messages,
                tools=TOOLS,
                max_tokens=48,
                temperature=1.0,
            )
            .choices[0]
            .message
        )
        if not reply.tool_calls:
            return reply.content or ""
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            result = lookup(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def score(task: dict[str, Any], answer: Any) -> float:
    return 1.0 if task["answer"] in str(answer or "") else 0.0


def tasks(names: list[str]) -> list[dict[str, Any]]:
    """Both questions for each name."""
    return [
        {
            "id": f"{kind}-{n}",
            "question": QUESTION[kind].format(n),
            "answer": PHONES[n] if kind == "phone" else OFFICES[n],
        }
        for n in names
        for kind in ("phone", "office")
    ]


def demonstration(task: dict[str, Any], good: bool) -> dict[str, Any]:
    """The conversation that answers ``task`` with the right tool; ``good=False`` uses the other tool."""
    kind, name = task["id"].split("-", 1)
    tool = (
        ("phone_of" if kind == "phone" else "office_of")
        if good
        else ("office_of" if kind == "phone" else "phone_of")
    )
    result = lookup(tool, json.dumps({"name": name}))
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps({"name": name})},
    }
    answer = f"{name}'s phone number is {result}." if kind == "phone" else f"{name} is in {result}."
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": task["question"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "assistant", "content": answer},
        ],
    }


def splits(seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """(demonstration names, training names, held-out names), disjoint."""
    names = list(FIRST)
    random.Random(seed).shuffle(names)
    return names[:8], names[8:20], names[20:30]
