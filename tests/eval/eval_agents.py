"""An agent whose answer depends on the task and the sample, for the runner tests of ``sdk.eval``.

The scripted OpenAI server (``TRACERL_POLICY_BASE_URL``) echoes the prompt, so the answer of sample k of
a task with ``x`` is ``(x * (k + 1)) % 3``: some tasks always right, some sometimes, some never.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import sdk

_lock = threading.Lock()
_clients: dict[str, Any] = {}


def _client() -> Any:
    import openai

    from integrations.openai import wrap_openai

    base = os.environ["TRACERL_POLICY_BASE_URL"]
    with _lock:
        if base not in _clients:
            _clients[base] = wrap_openai(openai.OpenAI(base_url=base, api_key="x", max_retries=0))
        return _clients[base]


def solve(task: dict[str, Any]) -> str | None:
    session = sdk.current_session()
    k = session.sample if session is not None else 0
    if task.get("fail") and k == 0:
        raise RuntimeError("the first sample of this task fails")
    resp = _client().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": f"the answer is {(task['x'] * (k + 1)) % 3}"}]
    )
    return resp.choices[0].message.content


def final(answer: str) -> str:
    return answer.split()[-1]


def score(task: dict[str, Any], answer: Any) -> float:
    return 1.0 if final(answer) == "0" else 0.0
