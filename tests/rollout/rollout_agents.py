"""Agent and reward functions the runner tests point ``sdk.rollout`` at (real openai clients, wrapped).

The scripted OpenAI server's address comes from ``TRACERL_POLICY_BASE_URL``. Task fields steer the agent:
``sleep`` (seconds before answering), ``fail`` (raise), ``hang`` (sleep far past any timeout).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

_lock = threading.Lock()
_clients: dict[str, Any] = {}
running = 0
peak = 0


def _client(kind: str, base: str | None = None) -> Any:
    import openai

    from integrations.openai import wrap_openai

    base = base or os.environ["TRACERL_POLICY_BASE_URL"]
    with _lock:
        if (kind, base) not in _clients:
            cls = openai.AsyncOpenAI if kind == "async" else openai.OpenAI
            _clients[(kind, base)] = wrap_openai(cls(base_url=base, api_key="x", max_retries=0))
        return _clients[(kind, base)]


def chat(task: dict[str, Any]) -> str | None:
    global running, peak
    with _lock:
        running += 1
        peak = max(peak, running)
    try:
        time.sleep(float(task.get("sleep", 0)))
        if task.get("hang"):
            time.sleep(60)
        if task.get("fail"):
            raise RuntimeError(f"agent failed on {task['id']}")
        resp = _client("sync").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"task {task['id']}"}]
        )
        return resp.choices[0].message.content
    finally:
        with _lock:
            running -= 1


async def achat(task: dict[str, Any]) -> str | None:
    await asyncio.sleep(float(task.get("sleep", 0)))
    if task.get("hang"):
        await asyncio.sleep(60)
    resp = await _client("async").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": f"task {task['id']}"}]
    )
    return resp.choices[0].message.content


def policy_chat(task: dict[str, Any]) -> str | None:
    """One call to the policy the runner named at this sample's start (``sdk.rollout.policy_endpoint``)."""
    from sdk.rollout import policy_endpoint

    endpoint = policy_endpoint()
    resp = _client("sync", endpoint.base_url).chat.completions.create(
        model=endpoint.model or "policy", messages=[{"role": "user", "content": f"task {task['id']}"}]
    )
    return resp.choices[0].message.content


def self_rewarding(task: dict[str, Any]) -> str:
    import sdk

    chat(task)
    sdk.reward(0.25)
    sdk.reward(1.0, name="format")
    return "done"


def reward_then_work(task: dict[str, Any]) -> str:
    """Rewards itself as soon as it has its answer, then keeps working (``work`` seconds) before returning."""
    import sdk

    answer = chat(task)
    sdk.reward(1.0)
    time.sleep(float(task.get("work", 0)))
    return answer or ""


def score(task: dict[str, Any], answer: Any) -> float:
    if task.get("bad_score"):
        raise ValueError("cannot score this one")
    return 1.0 if isinstance(answer, str) and int(task["id"].split("-")[1]) % 2 == 0 else 0.0


def named(task: dict[str, Any], answer: Any) -> dict[str, float]:
    return {"reward": 0.5, "length": float(len(answer or ""))}


def bad_type(task: dict[str, Any], answer: Any) -> str:
    return "high"


def unreachable(task: dict[str, Any]) -> str | None:
    """A real openai client to a closed port; the error re-raised with a note, as LangGraph does."""
    import socket

    import openai

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    try:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    except Exception as exc:
        exc.add_note("During task with name 'model' and id 'abc'")
        raise
    return None
