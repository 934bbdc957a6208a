"""Arithmetic-with-a-calculator task: task sets, tool schemas, demonstrations and the reward.

The agent gets a question such as ``"What is 23 plus 45?"``, must call the calculator tool
``add(a=23, b=45)`` (or ``mul`` for "times"), read the tool result and answer with the number alone.
A tiny model cannot add in its head, so success needs a correct tool call *and* a faithful copy of
the tool result. Everything is deterministic given a seed; no file or network access.

Example:
    >>> from examples.arithmetic.task import make_splits, reward
    >>> splits = make_splits(seed=0)
    >>> t = splits["train"][0]
    >>> reward(t, str(t.answer))
    1.0
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = "You are a calculator agent."

#: OpenAI function schemas, byte-identical to what LangChain's ``convert_to_openai_tool`` produces for
#: the ``add``/``mul`` tools in ``examples.arithmetic.agent`` (checked in tests/test_serve.py).
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
    for name, desc in (("add", "Add two integers."), ("mul", "Multiply two integers."))
]

OPS = {"add": ("plus", lambda a, b: a + b), "mul": ("times", lambda a, b: a * b)}


@dataclass(frozen=True)
class Task:
    """One arithmetic question.

    Example:
        >>> Task("t1", "add", 2, 3).question
        'What is 2 plus 3?'
    """

    task_id: str
    op: str
    a: int
    b: int

    @property
    def question(self) -> str:
        """The user message."""
        return f"What is {self.a} {OPS[self.op][0]} {self.b}?"

    @property
    def answer(self) -> int:
        """The correct result."""
        return int(OPS[self.op][1](self.a, self.b))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (for dataset rows and metadata)."""
        return {**asdict(self), "question": self.question, "answer": self.answer}


def calculator(name: str, arguments: dict[str, Any]) -> str:
    """Run the calculator tool the way the agent does; errors become a message.

    Example:
        >>> calculator("mul", {"a": 6, "b": 7})
        '42'
    """
    try:
        return str(OPS[name][1](int(arguments["a"]), int(arguments["b"])))
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _sample(rng: random.Random) -> tuple[str, int, int]:
    op = rng.choice(("add", "mul"))
    if op == "add":
        return op, rng.randint(10, 99), rng.randint(10, 99)
    return op, rng.randint(2, 19), rng.randint(2, 19)


def make_splits(
    seed: int = 0, n_train: int = 64, n_eval: int = 100, n_sft: int = 2000
) -> dict[str, list[Task]]:
    """Disjoint task sets: ``sft`` (demonstrations), ``train`` (RL) and ``eval`` (held out).

    Args:
        seed: RNG seed; the splits are a pure function of it.
        n_train: RL training tasks.
        n_eval: held-out evaluation tasks (never seen in SFT or RL).
        n_sft: questions for supervised warm-start demonstrations.

    Returns:
        ``{"sft": [...], "train": [...], "eval": [...]}``.

    Example:
        >>> s = make_splits(0, n_train=4, n_eval=4, n_sft=8)
        >>> [len(s[k]) for k in ("sft", "train", "eval")]
        [8, 4, 4]
    """
    rng = random.Random(seed)
    seen: set[tuple[str, int, int]] = set()
    out: dict[str, list[Task]] = {}
    for split, n in (("eval", n_eval), ("train", n_train), ("sft", n_sft)):
        tasks: list[Task] = []
        while len(tasks) < n:
            key = _sample(rng)
            if key in seen:
                continue
            seen.add(key)
            tasks.append(Task(f"{split}-{len(tasks)}", *key))
        out[split] = tasks
    return out


def parse_answer(text: str | None) -> int | None:
    """The integer in a final answer (the whole stripped text must be an integer)."""
    if text is None:
        return None
    text = text.strip().rstrip(".")
    try:
        return int(text)
    except ValueError:
        return None


def reward(task: Task, final_text: str | None) -> float:
    """1.0 if the final assistant text is exactly the correct number, else 0.0.

    Example:
        >>> reward(Task("t", "add", 2, 3), " 5 ")
        1.0
    """
    return 1.0 if parse_answer(final_text) == task.answer else 0.0


def demonstration(task: Task, rng: random.Random, p_good: float = 1.0) -> list[dict[str, Any]]:
    """An OpenAI-format transcript solving ``task``; with prob. ``1 - p_good`` a flawed one.

    Flawed demonstrations imitate a mediocre agent: it answers without the tool (a guess), calls the
    wrong operation, or calls the tool with a wrong argument, and answers with whatever it got.

    Example:
        >>> msgs = demonstration(Task("t", "add", 2, 3), random.Random(0))
        >>> msgs[-1]
        {'role': 'assistant', 'content': '5'}
    """
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.question},
    ]
    op, a, b = task.op, task.a, task.b
    if rng.random() >= p_good:
        kind = rng.choice(("guess", "wrong_op", "wrong_arg"))
        if kind == "guess":
            guess = task.answer + rng.choice((-10, -2, -1, 1, 2, 10))
            return [*msgs, {"role": "assistant", "content": str(guess)}]
        if kind == "wrong_op":
            op = "mul" if op == "add" else "add"
        else:
            a = a + rng.choice((-1, 1))
    args = {"a": a, "b": b}
    result = calculator(op, args)
    call = {"id": "call_0", "type": "function", "function": {"name": op, "arguments": json.dumps(args)}}
    return [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "name": op, "content": result},
        {"role": "assistant", "content": result},
    ]


def task_from_dict(task: dict[str, Any]) -> Task:
    """The :class:`Task` of a task-file row (``{"id", "op", "a", "b", ...}``).

    Example:
        >>> task_from_dict({"id": "t", "op": "add", "a": 2, "b": 3}).answer
        5
    """
    return Task(str(task["id"]), str(task["op"]), int(task["a"]), int(task["b"]))


def task_row(task: Task) -> dict[str, Any]:
    """A task-file row: ``id``, ``op``, ``a``, ``b``, ``question``, ``answer``.

    Example:
        >>> task_row(Task("t", "mul", 6, 7))["question"]
        'What is 6 times 7?'
    """
    row = task.to_dict()
    return {"id": row.pop("task_id"), **row}


def write_tasks(tasks: list[Task], path: str | Path) -> str:
    """Write a JSON-lines task file (one :func:`task_row` per line) for ``sdk.rollout``.

    Example:
        >>> write_tasks(make_splits(0, 2, 2, 2)["eval"], "/tmp/eval.jsonl")  # doctest: +SKIP
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(task_row(t)) + "\n" for t in tasks))
    return str(path)


def reward_fn(task: dict[str, Any], answer: Any) -> float:
    """``sdk.rollout`` reward function: 1.0 when the agent's final answer is the right number.

    Example:
        >>> reward_fn({"id": "t", "op": "add", "a": 2, "b": 3}, "5")
        1.0
    """
    return reward(task_from_dict(task), answer if isinstance(answer, str) else None)
