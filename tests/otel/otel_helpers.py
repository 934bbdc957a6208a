"""Helpers for the OTel tests: a small store with tool calls, token data and rewards; a receiver process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sdk
from sdk.capture import CallRecord, record_call
from sdk.episodes import build_episodes

REPO = Path(__file__).resolve().parents[2]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def make_store(path: Path, tasks: int = 2, samples: int = 2) -> Path:
    """Sessions of a tool-using agent: two calls each, token data, a tool timing, two named rewards."""
    sdk.configure(store=path)
    for t in range(tasks):
        for k in range(samples):
            with sdk.session(task_id=f"task-{t}", sample=k, split="train") as s:
                system = {"role": "system", "content": "You add numbers with the add tool."}
                user = {"role": "user", "content": f"What is {t} + {k}?"}
                call = {
                    "id": f"call_{t}{k}",
                    "type": "function",
                    "function": {"name": "add", "arguments": json.dumps({"a": t, "b": k})},
                }
                first = {"role": "assistant", "content": None, "tool_calls": [call]}
                result = {"role": "tool", "tool_call_id": f"call_{t}{k}", "content": str(t + k)}
                answer = {"role": "assistant", "content": f"The answer is {t + k}."}
                t0 = time.time()
                record_call(
                    CallRecord(
                        framework="custom",
                        model="tiny-1",
                        messages=[system, user],
                        tools=TOOLS,
                        params={"temperature": 0.7, "max_tokens": 64},
                        response_message=first,
                        finish_reason="tool_calls",
                        usage={"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
                        started_at=t0,
                        ended_at=t0 + 0.4,
                        logprobs=[{"token": "<tool>", "logprob": -0.11}, {"token": "add", "logprob": -0.02}],
                        completion_token_ids=[901, 902],
                        prompt_token_ids=[1, 2, 3],
                    ),
                    s,
                )
                record_call(
                    CallRecord(
                        framework="custom",
                        model="tiny-1",
                        messages=[system, user, first, result],
                        tools=TOOLS,
                        response_message=answer,
                        finish_reason="stop",
                        usage={"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
                        started_at=t0 + 0.6,
                        ended_at=t0 + 0.9,
                        logprobs=[
                            {"token": "The", "logprob": -0.31},
                            {"token": " answer", "logprob": -0.05},
                            {"token": " is", "logprob": -0.01},
                            {"token": f" {t + k}.", "logprob": -1.25},
                        ],
                        completion_token_ids=[11, 12, 13, 14],
                        prompt_token_ids=[1, 2, 3, 4, 5],
                        extra={
                            "tool_executions": [
                                {
                                    "tool_call_id": f"call_{t}{k}",
                                    "name": "add",
                                    "status": "success",
                                    "started_at": t0 + 0.45,
                                    "duration_s": 0.1,
                                }
                            ]
                        },
                    ),
                    s,
                )
                s.reward(float(k == 0))
                s.reward(0.5, "format")
    sdk.flush()
    return path


def text_level(episodes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Episodes up to what a text-level round trip keeps, in a stable order."""
    out = []
    for ep in episodes:
        msgs = tuple(
            (
                m["role"],
                m.get("content"),
                tuple(
                    (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in m.get("tool_calls") or ()
                ),
                m.get("tool_call_id"),
            )
            for m in ep["messages"]
        )
        rewards = tuple(sorted((r["name"], r["value"]) for r in ep["rewards"]))
        out.append((ep["task_id"], ep["sample"], msgs, json.loads(ep["tools"]), ep["reward"], rewards))
    return sorted(out, key=repr)


def episodes_of(store: Path) -> list[dict[str, Any]]:
    return list(build_episodes(store, require_reward=False, on_invalid="keep"))


class Receiver:
    """``python -m sdk.otel receive --port 0`` in a subprocess; ``stop()`` shuts it down gracefully."""

    def __init__(self, store: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sdk.otel",
                "receive",
                "--port",
                "0",
                "--store",
                str(store),
                "--linger",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(
                f"receiver did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        self.url = line.split("listening on ", 1)[1].split(",", 1)[0]
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        health = self.url.replace("/v1/traces", "/healthz")
        for _ in range(100):
            try:
                if httpx.get(health, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("receiver not ready")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=20)
        return err
