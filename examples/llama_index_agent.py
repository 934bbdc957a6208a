"""A LlamaIndex ``FunctionAgent`` with a calculator tool, every LLM call captured by tracerl.

Run against any OpenAI-compatible server, or with no argument against a scripted local one::

    python examples/llama_index_agent.py [BASE_URL]      # or set OPENAI_BASE_URL

It prints one line: the answer, how many LLM calls were recorded, and where the store is.
Environment: ``OPENAI_API_KEY`` (default ``"x"``), ``TRACERL_EXAMPLE_MODEL`` (default ``gpt-4o-mini``),
``TRACERL_STORE`` (default ``./.tracerl``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import sdk
from integrations.llama_index import instrument_llama_index
from sdk.testing import ScriptedOpenAIServer


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run_agent(base_url: str, question: str) -> tuple[str, sdk.Session]:
    from llama_index.core.agent import FunctionAgent
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(
        model=os.environ.get("TRACERL_EXAMPLE_MODEL", "gpt-4o-mini"),
        api_base=base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "x"),
        max_retries=0,
    )
    agent = FunctionAgent(tools=[add], llm=llm, system_prompt="Use the add tool for arithmetic.")
    with sdk.session(task_id="llama-index-demo", question=question) as s:
        answer = await agent.run(question)
        s.reward(1.0 if "5" in str(answer) else 0.0)
    return str(answer), s


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    base_url = args[0] if args else os.environ.get("OPENAI_BASE_URL")
    instrument_llama_index()  # the one line that attaches tracerl to every LlamaIndex LLM call
    server = None if base_url else ScriptedOpenAIServer().start()
    try:
        answer, s = asyncio.run(run_agent(base_url or server.base_url, "What is 2 + 3?"))
    finally:
        if server is not None:
            server.stop()
    sdk.flush()
    store = sdk.stats()["store"]
    print(f"answer={answer!r} calls_recorded={s.num_calls} session={s.session_id} store={store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
