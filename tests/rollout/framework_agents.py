"""Agents written as a framework's own examples write them, for the runner's output tests.

``llama_index_per_call`` builds its LlamaIndex model and ``FunctionAgent`` inside every call (LlamaIndex's
examples do): each call's ``AsyncOpenAI`` client ends up in reference cycles, freed by the garbage
collector at some later time. The scripted OpenAI server's address comes from ``TRACERL_POLICY_BASE_URL``.
"""

from __future__ import annotations

import os
from typing import Any


def to_celsius(f: float) -> float:
    """Convert a temperature in degrees Fahrenheit to degrees Celsius."""
    return (f - 32) * 5 / 9


def km_from_miles(m: float) -> float:
    """Convert a distance in miles to kilometres."""
    return m * 1.609344


async def llama_index_per_call(task: dict[str, Any]) -> str:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.llms.openai import OpenAI

    from integrations.llama_index import instrument_llama_index

    instrument_llama_index()  # idempotent
    llm = OpenAI(
        model="gpt-4o-mini",  # LlamaIndex's OpenAI checks the name; the scripted server answers any
        api_base=os.environ["TRACERL_POLICY_BASE_URL"],
        api_key="x",
        max_retries=0,
        temperature=1.0,
    )
    # Not streamed: the scripted server closes a streamed reply's connection, the policy server (uvicorn)
    # keeps it open, and only open connections show what a late close does.
    agent = FunctionAgent(tools=[to_celsius, km_from_miles], llm=llm, streaming=False)
    return str(await agent.run(task["question"]))


def score(task: dict[str, Any], answer: Any) -> float:
    return float("Tool result" in str(answer))
