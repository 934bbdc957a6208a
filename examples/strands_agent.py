"""A Strands agent with a tool, captured by tracerl inside a session.

Usage::

    python examples/strands_agent.py                       # starts tracerl's scripted test server
    python examples/strands_agent.py --base-url http://127.0.0.1:8000/v1 --model my-model
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/strands_agent.py

Calls go to ``$TRACERL_STORE`` (default ``./.tracerl``); the last line printed is a one-line summary.
"""

from __future__ import annotations

import argparse
import os
import sys

from strands import Agent, tool
from strands.models.openai import OpenAIModel

import sdk
from integrations.strands import TracerlHookProvider
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def run(base_url: str, model_id: str, api_key: str) -> int:
    model = OpenAIModel(
        client_args={"base_url": base_url, "api_key": api_key, "max_retries": 0}, model_id=model_id
    )
    agent = Agent(
        model=model,
        tools=[add],
        system_prompt="Use the add tool for arithmetic, then state the result.",
        hooks=[TracerlHookProvider()],  # the one-line attach
        callback_handler=None,
    )
    with sdk.session(task_id="strands-demo-1", split="demo") as s:
        answer = str(agent("What is 2 + 3? Then add 4 to that.")).strip()
        s.reward(1.0 if answer else 0.0)
    sdk.flush()
    print(
        f"strands example: session={s.session_id} task={s.task_id} calls={s.num_calls} "
        f"answer={answer!r} store={sdk.stats()['store']}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL, else a local scripted server)",
    )
    parser.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args(argv)
    api_key = os.environ.get("OPENAI_API_KEY", "x")
    if args.base_url:
        return run(args.base_url, args.model, api_key)
    with ScriptedOpenAIServer() as server:
        # Script a two-step run: two tool calls, then the answer.
        server.enqueue(
            ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]),
            ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 5, "b": 4}}]),
            ScriptedResponse.text("2 + 3 = 5, and 5 + 4 = 9."),
        )
        return run(server.base_url, args.model, api_key)


if __name__ == "__main__":
    sys.exit(main())
