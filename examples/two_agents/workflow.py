"""The two-agent workflow: a router picks the specialist operation, a calculator agent computes.

The user asks ``"What is the sum of 23 and 45?"`` (or ``"the product of 6 and 7"``). The **router** (agent
``router``) answers with one word, ``add`` or ``mul``; the **math** agent (agent ``math``, the arithmetic
agent of ``examples.arithmetic``) is then asked ``"What is 23 plus 45?"`` in the routed operation's words and
must call the calculator tool and copy its result. Each role is scored on its own job (named rewards
``router`` and ``math``) and the session on the end result (``reward``):

- ``router``: 1 when it picked the operation the question asks for;
- ``math``: 1 when its answer is right for the question it was given (a wrong route is not its fault);
- ``reward``: 1 when the final answer is the answer to the user's question.

Both agents are ordinary raw-``openai`` code; ``wrap_openai(client, agent=...)`` gives each one its name,
which is the role per-agent training trains a policy for.

Example:
    >>> t = RoutedTask("t", "mul", 6, 7)
    >>> t.question, router_demo(t, random.Random(0))[-1]["content"]
    ('What is the product of 6 and 7?', 'mul')
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import sdk
from examples.arithmetic.agent import run_openai
from examples.arithmetic.task import Task, demonstration, make_splits, parse_answer

ROUTER_PROMPT = "You are a router. Reply add or mul."
_WORDS = {"add": "sum", "mul": "product"}


@dataclass(frozen=True)
class RoutedTask:
    """One user question for the workflow.

    Example:
        >>> RoutedTask("t", "add", 2, 3).answer
        5
    """

    task_id: str
    op: str
    a: int
    b: int

    @property
    def question(self) -> str:
        """What the user asks the router."""
        return f"What is the {_WORDS[self.op]} of {self.a} and {self.b}?"

    @property
    def answer(self) -> int:
        """The right final answer."""
        return Task(self.task_id, self.op, self.a, self.b).answer

    def routed(self, op: str) -> Task:
        """The question the math agent gets when the router picked ``op``."""
        return Task(self.task_id, op, self.a, self.b)


def make_tasks(seed: int, n_train: int, n_eval: int, n_sft: int) -> dict[str, list[RoutedTask]]:
    """Disjoint SFT / train / held-out splits (those of ``examples.arithmetic.task.make_splits``).

    Example:
        >>> {k: len(v) for k, v in make_tasks(0, n_train=2, n_eval=3, n_sft=4).items()}
        {'eval': 3, 'train': 2, 'sft': 4}
    """
    splits = make_splits(seed=seed, n_train=n_train, n_eval=n_eval, n_sft=n_sft)
    return {k: [RoutedTask(t.task_id, t.op, t.a, t.b) for t in v] for k, v in splits.items()}


def router_messages(task: RoutedTask) -> list[dict[str, Any]]:
    """The router's prompt."""
    return [{"role": "system", "content": ROUTER_PROMPT}, {"role": "user", "content": task.question}]


def router_demo(task: RoutedTask, rng: random.Random, p_good: float = 1.0) -> list[dict[str, Any]]:
    """A router transcript; with probability ``1 - p_good`` it routes to the wrong operation.

    Example:
        >>> router_demo(RoutedTask("t", "add", 2, 3), random.Random(0), p_good=0.0)[-1]["content"]
        'mul'
    """
    op = task.op if rng.random() < p_good else ("mul" if task.op == "add" else "add")
    return [*router_messages(task), {"role": "assistant", "content": op}]


def math_demo(task: Task, rng: random.Random, p_good: float = 1.0) -> list[dict[str, Any]]:
    """A math transcript; with probability ``1 - p_good`` it guesses without the tool or passes a wrong
    argument. It never calls the other operation: choosing the operation is the router's job, and a math
    agent that flips it would cancel the router's mistakes by chance.

    Example:
        >>> math_demo(Task("t", "add", 2, 3), random.Random(0))[-1]
        {'role': 'assistant', 'content': '5'}
    """
    good = demonstration(task, rng, p_good=1.0)
    if rng.random() < p_good:
        return good
    if rng.random() < 0.5:
        guess = task.answer + rng.choice((-10, -2, -1, 1, 2, 10))
        return [*good[:2], {"role": "assistant", "content": str(guess)}]
    wrong = demonstration(Task(task.task_id, task.op, task.a + rng.choice((-1, 1)), task.b), rng, p_good=1.0)
    return [*good[:2], *wrong[2:]]


def run_workflow(
    router: Any,
    math: Any,
    task: RoutedTask,
    *,
    temperature: float = 1.0,
    models: tuple[str, str] = ("router", "math"),
) -> dict[str, float]:
    """Run both agents on ``task`` inside the current session and record the rewards.

    Args:
        router: The router's ``openai.OpenAI`` client (wrapped with ``agent="router"``).
        math: The math agent's client (``agent="math"``).
        task: The user's question.
        temperature: Sampling temperature of both agents.
        models: Model names the two agents request.

    Returns:
        ``{"router": 0/1, "math": 0/1 or NaN when it did not run, "reward": 0/1}``.

    Example:
        >>> with sdk.session(task_id="t"):  # doctest: +SKIP
        ...     run_workflow(router_client, math_client, RoutedTask("t", "add", 2, 3))
    """
    reply = router.chat.completions.create(
        model=models[0],
        messages=router_messages(task),
        temperature=temperature,
        max_tokens=4,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    op = (reply.choices[0].message.content or "").strip()
    scores = {"router": float(op == task.op), "math": float("nan"), "reward": 0.0}
    if op in _WORDS:
        out = run_openai(math, task.routed(op), model=models[1], temperature=temperature)
        scores["math"] = out["reward"]
        scores["reward"] = float(parse_answer(out["answer"]) == task.answer)
        sdk.reward(scores["math"], name="math")
    sdk.reward(scores["router"], name="router")
    sdk.reward(scores["reward"])
    return scores
