"""Three agents written for the benchmark, one per framework (LangChain, LlamaIndex, Strands), on the recipes.

Each is a unit-conversion assistant with two tools, ``to_celsius(fahrenheit)`` and ``km_from_miles(miles)``:
the right one depends on the question, and the answer is the tool's number. ``make(seed)`` writes what a
user would: training and held-out tasks and at most 24 demonstrations, some flawed (the wrong tool, or a
wrong number in the answer), in OpenAI format with the tools as that framework sends them.

    python tests/bench/framework_agents.py --agent langchain --seed 0 --out runs/fw   # the files only

Example:
    >>> train, held_out, demos = make(0)
    >>> len(train), len(held_out), len(demos) <= 24, score(train[0], f"It is {train[0]['answer']}.")
    (60, 40, True, 1.0)
"""

from __future__ import annotations

import json
import random
import re
import threading
from typing import Any

AGENTS = ("langchain", "llama_index", "strands")
SYSTEM = "You convert units. Call the right tool, then answer with its number."
MAX_TOKENS = 64
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def to_celsius(fahrenheit: float) -> float:
    """Convert a temperature from degrees Fahrenheit to degrees Celsius.

    Args:
        fahrenheit: The temperature in degrees Fahrenheit.
    """
    return round((float(fahrenheit) - 32) * 5 / 9, 1)


def km_from_miles(miles: float) -> float:
    """Convert a distance from miles to kilometres.

    Args:
        miles: The distance in miles.
    """
    return round(float(miles) * 1.609344, 1)


TOOLS = {"to_celsius": to_celsius, "km_from_miles": km_from_miles}
ARG = {"to_celsius": "fahrenheit", "km_from_miles": "miles"}
PLACES = ["Madrid", "Oslo", "Lima", "Cairo", "Perth", "Quito", "Hanoi", "Accra", "Tunis", "Riga"]
QUESTIONS = {
    "to_celsius": [
        "It is {x} °F in {p}. What is that in °C?",
        "The oven in {p} is at {x} F. How many Celsius?",
    ],
    "km_from_miles": [
        "The trail near {p} is {x} miles long. How many km is that?",
        "{p} is {x} mi away: in km?",
    ],
}


def make(
    seed: int, n_train: int = 60, n_eval: int = 40, n_demo: int = 16, flawed: int = 6
) -> tuple[list, ...]:
    """(training tasks, held-out tasks, demonstration tasks), disjoint, a pure function of ``seed``.

    ``flawed`` of the demonstrations are wrong the way a user's would be, half of them the other tool and half
    a wrong number, and half on each tool's questions. Six of sixteen, because with three the warm-started
    model already answered 62–90% of the held-out tasks and the gain RL could show was bounded by what was
    left. Split between the tools, because drawn over all sixteen, seed 2 put all three wrong-tool flaws
    on °C questions: every warm start then answered 0–1 of 20 °C questions, and whether RL recovered
    depended on one sample happening to try the other tool (``tests/bench/RESULTS.md``).

    Example:
        >>> demo = make(2)[2]
        >>> sorted(d["tool"] for d in demo if d.get("flaw") == "wrong_tool")
        ['km_from_miles', 'km_from_miles', 'to_celsius']
    """
    assert n_demo <= 24
    rng = random.Random(seed)
    seen: set[str] = set()
    sets: list[list[dict[str, Any]]] = []
    for name, n in (("eval", n_eval), ("train", n_train), ("demo", n_demo)):
        rows: list[dict[str, Any]] = []
        while len(rows) < n:
            tool = ("to_celsius", "km_from_miles")[len(rows) % 2]
            x = rng.randint(40, 110) if tool == "to_celsius" else rng.randint(2, 60)
            question = rng.choice(QUESTIONS[tool]).format(x=x, p=rng.choice(PLACES))
            if question in seen:
                continue
            seen.add(question)
            rows.append({"id": f"{name}-{len(rows)}", "question": question, "tool": tool, "x": x,
                         "answer": TOOLS[tool](x)})  # fmt: skip
        sets.append(rows)
    held_out, train, demo = sets
    # Each tool's questions get half the flaws, the flaw types alternating from a different end for each
    # tool, so neither kind of question gets all the wrong-tool flaws (3 wrong-tool flaws: 2 and 1).
    first = rng.randrange(2)
    for t, tool in enumerate(TOOLS):
        mine = [k for k, row in enumerate(demo) if row["tool"] == tool]
        share = flawed // 2 + (flawed % 2 if t == 0 else 0)
        for j, k in enumerate(sorted(rng.sample(mine, share))):
            demo[k]["flaw"] = ("wrong_tool", "wrong_number")[(j + t + first) % 2]
    return train, held_out, demo


def score(task: dict[str, Any], answer: Any) -> float:
    """1.0 when the answer's last number is the conversion (to 0.1); raw tool-call text scores 0.

    Example:
        >>> score({"answer": 30.0}, "That is 30.0 °C."), score({"answer": 30.0}, "<tool_call>30.0")
        (1.0, 0.0)
    """
    text = str(answer or "")
    found = _NUMBER.findall(text)
    return (
        1.0 if "<tool_call>" not in text and found and abs(float(found[-1]) - task["answer"]) < 0.051 else 0.0
    )


def openai_tools(agent: str) -> list[dict[str, Any]]:
    """The tools as ``agent``'s framework sends them (what the demonstrations must show the model)."""
    if agent == "langchain":
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return [convert_to_openai_tool(t) for t in _lc_tools()]
    if agent == "llama_index":
        return [t.metadata.to_openai_tool() for t in _li_tools()]
    from integrations.strands import to_openai_tools

    return to_openai_tools([t.tool_spec for t in _strands_tools()]) or []


def demonstration(task: dict[str, Any], agent: str) -> dict[str, Any]:
    """The conversation that answers ``task`` with a tool call (flawed as the task says), for ``tracerl sft``."""
    tool = task["tool"]
    if task.get("flaw") == "wrong_tool":
        tool = next(t for t in TOOLS if t != tool)
    result = TOOLS[tool](task["x"])
    answer = result + 1 if task.get("flaw") == "wrong_number" else result
    call = {"id": "call_0", "type": "function",
            "function": {"name": tool, "arguments": json.dumps({ARG[tool]: task["x"]})}}  # fmt: skip
    return {
        "tools": openai_tools(agent),
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task["question"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": str(result)},
            {"role": "assistant", "content": f"It is {answer}."},
        ],
    }


# ------------------------------------------------------------------------------------------------------
# The agents, as a user would write them on each framework's recipe
# ------------------------------------------------------------------------------------------------------

_BUILT: dict[str, Any] = {}
_LOCK = threading.Lock()


def _once(name: str, build: Any) -> Any:
    with _LOCK:
        if name not in _BUILT:
            _BUILT[name] = build()
        return _BUILT[name]


def _lc_tools() -> list[Any]:
    from langchain_core.tools import tool

    return [tool(f) for f in TOOLS.values()]


def solve_langchain(task: dict[str, Any]) -> str:
    """LangChain ``create_agent`` on ``policy_chat_model``."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langgraph.errors import GraphRecursionError

    from integrations.langchain import policy_chat_model

    agent = _once("langchain", lambda: create_agent(
        model=policy_chat_model(max_tokens=MAX_TOKENS), tools=_lc_tools(), system_prompt=SYSTEM))  # fmt: skip
    try:
        out = agent.invoke({"messages": [("user", task["question"])]}, config={"recursion_limit": 6})
    except GraphRecursionError:
        return ""
    last = out["messages"][-1]
    return last.content if isinstance(last, AIMessage) and isinstance(last.content, str) else ""


def _li_tools() -> list[Any]:
    from llama_index.core.tools import FunctionTool

    return [FunctionTool.from_defaults(fn=f) for f in TOOLS.values()]


async def solve_llama_index(task: dict[str, Any]) -> str:
    """LlamaIndex ``FunctionAgent`` on ``policy_llm`` (async: the runner awaits it on its loop)."""
    from llama_index.core.agent import FunctionAgent

    from integrations.llama_index import policy_llm

    agent = _once("llama_index", lambda: FunctionAgent(
        tools=_li_tools(), llm=policy_llm(max_tokens=MAX_TOKENS), system_prompt=SYSTEM))  # fmt: skip
    try:
        return str(await agent.run(task["question"], max_iterations=3))
    except Exception as exc:  # past max_iterations: no answer
        if "max iterations" in str(exc).lower():
            return ""
        raise


def _strands_tools() -> list[Any]:
    from strands import tool

    return [tool(f) for f in TOOLS.values()]


def solve_strands(task: dict[str, Any]) -> str:
    """A Strands ``Agent`` on ``policy_model`` (a new agent per task: it keeps its conversation)."""
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    from integrations.strands import TracerlHookProvider, policy_model

    model = _once("strands", lambda: policy_model(params={"max_tokens": MAX_TOKENS}))
    agent = Agent(model=model, tools=_strands_tools(), system_prompt=SYSTEM, callback_handler=None,
                  hooks=[TracerlHookProvider()])  # fmt: skip
    try:
        return str(agent(task["question"]))
    except MaxTokensReachedException:
        return ""


if __name__ == "__main__":
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser()
    p.add_argument("--agent", choices=AGENTS, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/framework-agent")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out, demo = make(a.seed)
    for name, rows in (("train", train), ("eval", held_out)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))
    (out / "demos.jsonl").write_text("".join(json.dumps(demonstration(t, a.agent)) + "\n" for t in demo))
