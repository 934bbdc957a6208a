"""A calculator agent for SmolLM2: LangChain ``create_agent`` with the tools ``add``, ``mul`` and ``sub``.

Tasks need one or two tool calls ("What is 17 * 23 - 45?": ``mul(17, 23)``, then ``sub(391, 45)``, then
the answer). The agent is ordinary LangChain code on ``ChatOpenAI``; it is captured by tracerl's LangChain
handler, and its HTTP client records the server's token ids so that training uses the exact ids. The
reward is 1.0 when the last integer of the final answer is the result; a final answer that still holds a
``<tool_call>`` the server could not parse (bad JSON, unknown shape) is a failure.

Example:
    >>> from examples.smollm2_agent.agent import make_tasks, reward_fn
    >>> train, held_out = make_tasks(seed=0)
    >>> t = train[0]
    >>> reward_fn(t, f"The answer is {t['answer']}.")
    1.0
"""

from __future__ import annotations

import json
import random
import re
import threading
from typing import Any

from trainers.models import tool_chat_template
from trainers.serve.policy import ENV_BASE_URL, ENV_MODEL

SYSTEM_PROMPT = "You are a calculator agent. Use the tools, then give the number."
OPS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "sub": lambda a, b: a - b}
SYMBOL = {"add": "+", "mul": "*", "sub": "-"}
DESCRIPTIONS = {"add": "Add.", "mul": "Multiply.", "sub": "Subtract b from a."}
MAX_TOKENS = 40  # a tool call is ~33 tokens with this tokenizer (one token per digit)
_INT = re.compile(r"-?\d+")

#: The chat template the example ships (SmolLM2's own ignores ``tools`` and ``tool_calls``): tracerl's
#: ChatML tool template, its system turn showing a call of this agent's ``add`` tool (what the policy server
#: parses); prefix-preserving, so one training sequence per episode.
CHAT_TEMPLATE = tool_chat_template('{"name": "add", "arguments": {"a": 1, "b": 2}}')


def calculator(name: str, arguments: Any) -> str:
    """Run a calculator tool the way the agent's tools do; bad input becomes an error message.

    Example:
        >>> calculator("sub", {"a": 391, "b": 45})
        '346'
    """
    try:
        return str(OPS[name](int(arguments["a"]), int(arguments["b"])))
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _task(rng: random.Random, kind: str) -> tuple[str, str, list[tuple[str, int, int]], int]:
    """(question, kind, the tool calls that solve it, answer) for one random task of ``kind``."""
    if kind in OPS:
        a, b = (
            (rng.randint(2, 19), rng.randint(11, 49))
            if kind == "mul"
            else (rng.randint(11, 99), rng.randint(11, 99))
        )
        return f"What is {a} {SYMBOL[kind]} {b}?", kind, [(kind, a, b)], OPS[kind](a, b)
    first, second = kind.split("-")  # e.g. "mul-sub": (a * b) - c
    a, b, c = rng.randint(2, 19), rng.randint(11, 49), rng.randint(11, 99)
    ab = OPS[first](a, b)
    q = f"What is {a} {SYMBOL[first]} {b} {SYMBOL[second]} {c}?"
    return q, kind, [(first, a, b), (second, ab, c)], OPS[second](ab, c)


KINDS = ("add", "mul", "sub", "mul-add", "mul-sub")
#: The demonstrations' kinds, mostly two-call. With the tasks' 3:2 mix of one- and two-call kinds in the
#: demonstrations too, the warm-started model answered after the first tool result even when a second call
#: was due (two-call held-out tasks: 0%), and RL had no success on two-call tasks to reinforce.
DEMO_KINDS = ("mul-add", "mul-sub", "add", "mul-add", "mul-sub", "mul", "sub")


def make_tasks(
    seed: int = 0, n_train: int = 120, n_eval: int = 60, n_sft: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | tuple[list[dict[str, Any]], ...]:
    """Disjoint training and held-out tasks (and ``n_sft`` demonstration tasks when asked), kinds mixed.

    Kinds: ``add``/``mul``/``sub`` (one call) and ``mul-add``/``mul-sub`` (two calls), in turn (the
    demonstrations: :data:`DEMO_KINDS`). No question appears in two sets; the sets are a pure function of
    ``seed``.

    Example:
        >>> train, held_out = make_tasks(0, n_train=10, n_eval=5)
        >>> len(train), len(held_out), held_out[0]["calls"][0][0] in ("add", "mul", "sub")
        (10, 5, True)
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    sets: list[list[dict[str, Any]]] = []
    for name, n in (("eval", n_eval), ("train", n_train), ("sft", n_sft)):
        rows: list[dict[str, Any]] = []
        while len(rows) < n:
            kinds = DEMO_KINDS if name == "sft" else KINDS
            q, kind, calls, answer = _task(rng, kinds[len(rows) % len(kinds)])
            if q in seen:
                continue
            seen.add(q)
            rows.append(
                {"id": f"{name}-{len(rows)}", "kind": kind, "question": q, "calls": calls, "answer": answer}
            )
        sets.append(rows)
    held_out, train, demo = sets
    return (train, held_out, demo) if n_sft else (train, held_out)


def demonstration(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI-format transcript that solves ``task`` with its tool calls (for the SFT warm start).

    Example:
        >>> msgs = demonstration({"question": "What is 2 + 3?", "calls": [("add", 2, 3)], "answer": 5})
        >>> [m["role"] for m in msgs], msgs[-1]["content"]
        (['system', 'user', 'assistant', 'tool', 'assistant'], 'The answer is 5.')
    """
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    for k, (name, a, b) in enumerate(task["calls"]):
        args = json.dumps({"a": a, "b": b})
        call = {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": args}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        msgs.append(
            {"role": "tool", "tool_call_id": f"call_{k}", "content": calculator(name, {"a": a, "b": b})}
        )
    msgs.append({"role": "assistant", "content": f"The answer is {task['answer']}."})
    return msgs


def lc_tools() -> list[Any]:
    """The LangChain tools ``add``, ``mul`` and ``sub`` (terse descriptions: they are in every prompt).

    Example:
        >>> [t.invoke({"a": 17, "b": 23}) for t in lc_tools()]
        [40, 391, -6]
    """
    from langchain_core.tools import StructuredTool

    def make(name: str) -> Any:
        def run(a: int, b: int) -> int:
            return int(OPS[name](a, b))

        return StructuredTool.from_function(run, name=name, description=DESCRIPTIONS[name])

    return [make(name) for name in OPS]


def make_agent(base_url: str, model: str = "policy", temperature: float = 1.0) -> Any:
    """The LangChain ``create_agent`` agent on ``ChatOpenAI``; token ids come through a recording client.

    Example:
        >>> agent = make_agent("http://127.0.0.1:8000/v1")  # doctest: +SKIP
    """
    from examples.arithmetic.agent import make_langchain_agent
    from integrations.openai import recording_http_client

    http = recording_http_client()
    return make_langchain_agent(
        base_url, model, temperature, MAX_TOKENS, http, tools=lc_tools(), system_prompt=SYSTEM_PROMPT
    )


_AGENTS: dict[tuple[str, str], tuple[Any, list[Any]]] = {}
_LOCK = threading.Lock()


def solve(task: dict[str, Any]) -> str | None:
    """Run the agent on one task (the loop's entry point); its final answer, or None if it did not finish.

    The policy endpoint comes from ``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL`` (set by the loop).
    At most three model calls (two tool rounds and the answer); a run that goes past them has no answer.

    Example:
        >>> solve({"id": "t", "question": "What is 2 + 3?", "answer": 5})  # doctest: +SKIP
        'The answer is 5.'
    """
    import os

    from langchain_core.messages import AIMessage
    from langgraph.errors import GraphRecursionError

    from integrations.langchain import TracerlCallbackHandler

    key = (os.environ[ENV_BASE_URL], os.environ.get(ENV_MODEL, "policy"))
    with _LOCK:
        if key not in _AGENTS:
            _AGENTS[key] = (make_agent(*key), [TracerlCallbackHandler()])
        agent, callbacks = _AGENTS[key]
    try:
        out = agent.invoke(
            {"messages": [{"role": "user", "content": task["question"]}]},
            config={"recursion_limit": 6, "callbacks": callbacks},
        )
    except GraphRecursionError:  # more tool rounds than the task needs: no answer (reward 0)
        return None
    last = out["messages"][-1]
    if not isinstance(last, AIMessage) or last.tool_calls:
        return None
    return last.content if isinstance(last.content, str) else None


def reward_fn(task: dict[str, Any], answer: Any) -> float:
    """1.0 when the last integer of the final answer is the result; unparsed tool-call text scores 0.

    Example:
        >>> reward_fn({"answer": 346}, "The answer is 346.")
        1.0
        >>> reward_fn({"answer": 5}, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}</tool_call> 5')
        0.0
    """
    if not isinstance(answer, str) or "<tool_call>" in answer:
        return 0.0
    found = _INT.findall(answer)
    return 1.0 if found and int(found[-1]) == int(task["answer"]) else 0.0
