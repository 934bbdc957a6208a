"""The agent and reward the loop tests point at: one raw openai call to the loop's policy server."""

from __future__ import annotations

import os
import random
import threading
from typing import Any

_lock = threading.Lock()
_clients: dict[str, Any] = {}
_rng = random.Random(0)


def solve(task: dict[str, Any], seed: int | None = None) -> str | None:
    import openai

    from integrations.openai import wrap_openai

    base = os.environ["TRACERL_POLICY_BASE_URL"]
    with _lock:
        if base not in _clients:
            _clients[base] = wrap_openai(openai.OpenAI(base_url=base, api_key="x", max_retries=0))
    resp = _clients[base].chat.completions.create(
        model=os.environ["TRACERL_POLICY_MODEL"],
        messages=[{"role": "user", "content": f"What is {task['q']}?"}],
        max_tokens=8,
        temperature=1.0,
        seed=seed,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    return resp.choices[0].message.content


def coin(task: dict[str, Any], answer: Any) -> float:
    """A coin flip: the tiny random model never answers right, and groups need reward spread to train."""
    with _lock:
        return float(_rng.random() < 0.5)


def solve_seeded(task: dict[str, Any]) -> str | None:
    """``solve`` with a seed from the task and the sample: two runs of a loop sample the same tokens."""
    import zlib

    return solve(task, seed=zlib.crc32(f"{task['id']}:{_sample_index()}".encode()))


def even_length(task: dict[str, Any], answer: Any) -> float:
    """1 when the answer has an even number of characters: a reward that only the sampled text decides."""
    return float(len(answer or "") % 2 == 0)


def coin_until_flat(task: dict[str, Any], answer: Any) -> float:
    """``coin`` until ``LOOP_TEST_FLAT`` is set, then 0 for every sample: groups without reward spread."""
    return 0.0 if os.environ.get("LOOP_TEST_FLAT") else coin(task, answer)


def training_tasks_only(task: dict[str, Any], answer: Any) -> float:
    """1 on a training task (id ``train-*``), 0 on a held-out one: a warm start that learned its tasks only."""
    return float(str(task["id"]).startswith("train"))


def skill(task: dict[str, Any]) -> int:
    """No LLM: answers with the skill the test sets (``LOOP_TEST_SKILL``); tasks below it are solved."""
    return int(os.environ.get("LOOP_TEST_SKILL", "0"))


def below_skill(task: dict[str, Any], answer: Any) -> float:
    return float(int(task["q"]) < int(answer))


def _sample_index() -> int:
    import sdk

    s = sdk.current_session()
    return int(s.sample or 0) if s is not None else 0


def solve_or_hold(task: dict[str, Any]) -> str | None:
    """``solve``, but the last sample of each group of 4 is held while the file ``LOOP_TEST_HOLD`` names
    exists (at most 120 s): a kill then leaves every group part-done."""
    import time

    hold = os.environ.get("LOOP_TEST_HOLD")
    deadline = time.monotonic() + 120
    while hold and _sample_index() % 4 == 3 and os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    return solve(task)


def solve_reward_3_of_4(task: dict[str, Any]) -> str | None:
    """``solve`` rewarded by a coin flip from inside the agent, except the last sample of each group of 4,
    which never gets a reward."""
    import sdk

    answer = solve(task)
    if _sample_index() % 4 != 3:
        sdk.reward(coin(task, answer))
    return answer


def broken_until_fixed(task: dict[str, Any]) -> str | None:
    """Fails every sample (as an agent pointed at a dead server) until ``LOOP_AGENT_FIXED`` is set."""
    if not os.environ.get("LOOP_AGENT_FIXED"):
        raise ConnectionError("connection refused")
    return solve(task)


def solve_or_malformed(task: dict[str, Any]) -> str | None:
    """``solve`` on even samples; odd ones get a tool call the server could not parse, as text.

    The odd samples' model is a scripted server at ``LOOP_TEST_MALFORMED_URL`` answering as vLLM does
    when a ``<tool_call>`` does not parse (content, no ``tool_calls``).
    """
    import openai

    from integrations.openai import wrap_openai

    if _sample_index() % 2 == 0:
        return solve(task)
    # Closed after its one call: a client per sample left open is a ResourceWarning when collected.
    with wrap_openai(openai.OpenAI(base_url=os.environ["LOOP_TEST_MALFORMED_URL"], api_key="x")) as client:
        resp = client.chat.completions.create(
            model=os.environ["TRACERL_POLICY_MODEL"],
            messages=[{"role": "user", "content": f"What is {task['q']}?"}],
        )
    return resp.choices[0].message.content


def zero(task: dict[str, Any], answer: Any) -> float:
    """0 for every answer: without shaping, no group has reward spread."""
    return 0.0
