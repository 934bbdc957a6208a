"""Quickstart: capture a tool-using agent written with the raw OpenAI client, then look at the store.

Runs end to end on this machine: it starts a local OpenAI-compatible server (scripted, on 127.0.0.1),
runs a small calculator agent on a few tasks inside sessions, scores each session, and prints what
the store now holds. Point ``--base-url`` at any OpenAI-compatible endpoint (vLLM, …) to use a real model.

Run: ``python -m examples.quickstart [--store DIR] [--base-url URL --model NAME]``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import openai

import sdk
from integrations.openai import wrap_openai
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TASKS = {"add-2-3": (2, 3), "add-2-3-again": (2, 3), "add-4-5": (4, 5)}


def run_agent(client: openai.OpenAI, model: str, question: str) -> str:
    """An ordinary tool-calling loop: ask, run the tools the model asks for, answer."""
    messages: list[dict] = [
        {"role": "system", "content": "Use the add tool, then state the result."},
        {"role": "user", "content": question},
    ]
    for _ in range(4):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, logprobs=True)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return ""


def main(argv: list[str] | None = None) -> int:
    """Run the quickstart; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", default="runs/quickstart-store", help="store directory (default: %(default)s)"
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint; default: a local scripted server")
    parser.add_argument("--model", default="gpt-4o-mini", help="model name (default: %(default)s)")
    parser.add_argument(
        "--group-size", type=int, default=2, help="samples per task, G (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    sdk.configure(store=args.store)
    server = None if args.base_url else ScriptedOpenAIServer().start()
    base_url = args.base_url or server.base_url  # type: ignore[union-attr]
    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))  # the one line
    try:
        for task_id, (a, b) in TASKS.items():
            for sample in range(args.group_size):
                with sdk.session(task_id=task_id, sample=sample, split="train") as s:
                    answer = run_agent(client, args.model, f"What is {a} + {b}?")
                    numbers = [int(x) for x in re.findall(r"-?\d+", answer)]
                    s.reward(1.0 if numbers and numbers[-1] == a + b else 0.0)
    finally:
        if server is not None:
            server.stop()
    sdk.shutdown()

    reader = StoreReader(args.store)
    sessions = list(reader.sessions())
    calls = sum(len(s.calls) for s in sessions)
    rewards = [s.reward for s in sessions if s.reward is not None]
    by_task = Counter(s.task_id for s in sessions)
    print(
        f"store {Path(args.store).resolve()}: {len(sessions)} sessions, {calls} calls, "
        f"{len(by_task)} tasks, mean reward {sum(rewards) / max(1, len(rewards)):.2f}, "
        f"problems {dict(reader.problems) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
