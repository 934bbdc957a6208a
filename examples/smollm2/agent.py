"""A one-call agent for SmolLM2: add two small numbers (raw ``openai`` client, captured with ``wrap_openai``).

SmolLM2-135M-Instruct starts weak here: asked "What is 3 + 4? Answer with the number only." it rambles
("To solve this logic puzzle involving 3 + 5, ...") and its last number is the sum in about one reply of
five or six. ``reward_fn`` gives 1.0 when the last integer of the reply is the sum.

Example:
    >>> from examples.smollm2.agent import make_tasks, reward_fn
    >>> train, held_out = make_tasks(seed=0)
    >>> reward_fn(train[0], f"so {train[0]['a'] + train[0]['b']}.")
    1.0
"""

from __future__ import annotations

import os
import random
import re
import threading
from typing import Any

from trainers.serve.policy import ENV_BASE_URL, ENV_MODEL

_CLIENTS: dict[str, Any] = {}
_LOCK = threading.Lock()
_INT = re.compile(r"-?\d+")


def make_tasks(seed: int = 0, n_eval: int = 40) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The 100 sums ``a + b`` with ``0 <= a, b <= 9``, shuffled into disjoint training and held-out tasks.

    Example:
        >>> [len(x) for x in make_tasks(0, n_eval=40)]
        [60, 40]
    """
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    tasks = [{"id": f"sum-{a}-{b}", "a": a, "b": b} for a, b in pairs]
    return tasks[n_eval:], tasks[:n_eval]


def solve(task: dict[str, Any]) -> str | None:
    """Ask the policy (``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL``) once; return its reply.

    Example:
        >>> solve({"id": "sum-3-4", "a": 3, "b": 4})  # doctest: +SKIP
        '3 + 4 = 7.'
    """
    import openai

    from integrations.openai import wrap_openai

    base_url = os.environ[ENV_BASE_URL]
    with _LOCK:
        client = _CLIENTS.get(base_url)
        if client is None:
            client = _CLIENTS[base_url] = wrap_openai(
                openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
            )
    resp = client.chat.completions.create(
        model=os.environ.get(ENV_MODEL, "policy"),
        messages=[
            {"role": "user", "content": f"What is {task['a']} + {task['b']}? Answer with the number only."}
        ],
        temperature=1.0,
        max_tokens=16,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    return resp.choices[0].message.content


def reward_fn(task: dict[str, Any], answer: Any) -> float:
    """1.0 when the last integer in the reply is ``a + b``.

    Example:
        >>> reward_fn({"id": "t", "a": 3, "b": 4}, "3 + 4 = 7.")
        1.0
    """
    found = _INT.findall(answer) if isinstance(answer, str) else []
    return 1.0 if found and int(found[-1]) == int(task["a"]) + int(task["b"]) else 0.0
