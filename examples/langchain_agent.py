"""Capture a LangChain ``create_agent`` agent that uses a tool, then print what the store holds.

Runs end to end on this machine: with no ``--base-url`` it starts a local scripted OpenAI-compatible
server on 127.0.0.1. Point ``--base-url`` (or ``$OPENAI_BASE_URL``) at any OpenAI-compatible endpoint, e.g.
vLLM, to use a real model; ``--token-ids`` then also records vLLM token ids through a recording client.

Run: ``python -m examples.langchain_agent [--store DIR] [--base-url URL --model NAME] [--token-ids]``
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import sdk
from integrations.langchain import TracerlCallbackHandler
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer

TASKS = {"add-2-3": (2, 3), "add-4-5": (4, 5)}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main(argv: list[str] | None = None) -> int:
    """Run the example; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", default="runs/langchain-store", help="store directory (default: %(default)s)"
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="an OpenAI-compatible endpoint; default: a local scripted server",
    )
    parser.add_argument("--model", default="gpt-4o-mini", help="model name (default: %(default)s)")
    parser.add_argument(
        "--token-ids",
        action="store_true",
        help="ask for vLLM token ids and record them through a recording http client",
    )
    args = parser.parse_args(argv)

    sdk.configure(store=args.store)
    server = None if args.base_url else ScriptedOpenAIServer().start()
    base_url = args.base_url or server.base_url  # type: ignore[union-attr]
    extra: dict[str, Any] = {}
    if args.token_ids or server is not None:
        from integrations.openai import recording_http_client

        extra = {"extra_body": {"return_token_ids": True}, "http_client": recording_http_client()}
    llm = ChatOpenAI(
        model=args.model,
        base_url=base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "x"),
        max_retries=0,
        logprobs=True,
        **extra,
    )
    agent = create_agent(llm, tools=[add], system_prompt="Use the add tool, then state the result.")
    handler = TracerlCallbackHandler()  # the one line: pass it per call (or instrument_langchain() once)
    try:
        for task_id, (a, b) in TASKS.items():
            with sdk.session(task_id=task_id, split="train") as s:
                out = agent.invoke(
                    {"messages": [("user", f"What is {a} + {b}?")]}, config={"callbacks": [handler]}
                )
                numbers = [int(x) for x in re.findall(r"-?\d+", out["messages"][-1].content)]
                s.reward(1.0 if numbers and numbers[-1] == a + b else 0.0)
    finally:
        if server is not None:
            server.stop()
    sdk.shutdown()

    reader = StoreReader(args.store)
    sessions = [s for s in reader.sessions() if not s.implicit]
    calls = [c for s in sessions for c in s.calls]
    tool_calls = sum(len((c["response"]["message"] or {}).get("tool_calls") or []) for c in calls)
    with_ids = sum(1 for c in calls if c.get("completion_token_ids"))
    rewards = [s.reward for s in sessions if s.reward is not None]
    print(
        f"store {Path(args.store).resolve()}: {len(sessions)} sessions, {len(calls)} calls "
        f"(framework {sorted({c['framework'] for c in calls})}), {tool_calls} tool calls, "
        f"{with_ids} with token ids, mean reward {sum(rewards) / max(1, len(rewards)):.2f}, "
        f"problems {dict(reader.problems) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
