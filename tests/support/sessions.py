"""Helpers for episode tests: stores written through the SDK, and raw segment files for bad input."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import sdk
from sdk.capture import CallRecord, record_call


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def assistant(
    text: str | None = None, calls: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = calls
    m.update(extra)
    return m


def tool_call(
    call_id: str, name: str = "get_weather", arguments: str = '{"city": "Paris"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(call_id: str, text: str = "21C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def call(
    messages: list[dict[str, Any]],
    response: dict[str, Any] | None,
    *,
    n_tokens: int = 3,
    token_ids: bool = True,
    **kw: Any,
) -> CallRecord:
    """A CallRecord with logprobs and token ids of ``n_tokens`` tokens (when ``token_ids``)."""
    kw.setdefault("framework", "openai")
    kw.setdefault("model", "policy")
    kw.setdefault("tools", TOOLS)
    if response is not None and token_ids:
        kw.setdefault("logprobs", [{"token": f"t{i}", "logprob": -0.1 * (i + 1)} for i in range(n_tokens)])
        kw.setdefault("completion_token_ids", list(range(100, 100 + n_tokens)))
        kw.setdefault("prompt_token_ids", list(range(len(messages) * 4)))
    kw.setdefault(
        "usage", {"prompt_tokens": 10, "completion_tokens": n_tokens, "total_tokens": 10 + n_tokens}
    )
    kw.setdefault("finish_reason", "tool_calls" if response and response.get("tool_calls") else "stop")
    return CallRecord(messages=messages, response_message=response, **kw)


def weather_session(task_id: str = "t1", reward: float | None = 1.0, city: str = "Paris", **meta: Any) -> str:
    """One tool-using session (2 calls, one thread); returns its session id."""
    with sdk.session(task_id=task_id, **meta) as s:
        m1 = [system("You are helpful."), user(f"Weather in {city}?")]
        r1 = assistant(None, [tool_call("c1", arguments=json.dumps({"city": city}))])
        record_call(call(m1, r1))
        m2 = [*m1, r1, tool("c1")]
        record_call(call(m2, assistant(f"It is 21C in {city}.")))
        if reward is not None:
            s.reward(reward)
    return s.session_id


def close_store() -> None:
    """Flush and close the store so that readers see every event."""
    sdk.shutdown()


class RawStore:
    """Writes raw event lines into one segment file, for input the SDK would never produce."""

    def __init__(self, path: Path, process: str = "20260101T000000-host-1-abcdef") -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.file = path / f"{process}.00001.jsonl"

    def raw(self, data: bytes) -> RawStore:
        with open(self.file, "ab") as fh:
            fh.write(data)
        return self

    def line(self, event: Any) -> RawStore:
        text = event if isinstance(event, str) else json.dumps(event)
        return self.raw(text.encode("utf-8") + b"\n")

    def start(self, sid: str, task_id: str | None = "t1", **kw: Any) -> RawStore:
        return self.line(
            {"event": "session_start", "v": 1, "session_id": sid, "ts": 1.0, "task_id": task_id, **kw}
        )

    def call(
        self,
        sid: str,
        messages: list[Any],
        response: Any = None,
        *,
        call_id: str | None = None,
        **kw: Any,
    ) -> RawStore:
        request = kw.pop("request", None) or {
            "messages": messages,
            "tools": kw.pop("tools", None),
            "params": {},
        }
        event = {
            "event": "call",
            "v": 1,
            "call_id": call_id or uuid.uuid4().hex,
            "session_id": sid,
            "framework": "openai",
            "model": kw.pop("model", "policy"),
            "request": request,
            "response": {"message": response, "finish_reason": "stop"},
            "started_at": 2.0,
            "ended_at": 3.0,
            **kw,
        }
        return self.line(event)

    def reward(
        self, sid: str, value: Any = 1.0, name: str = "reward", call_id: str | None = None
    ) -> RawStore:
        return self.line(
            {
                "event": "reward",
                "v": 1,
                "session_id": sid,
                "value": value,
                "name": name,
                "call_id": call_id,
                "ts": 4.0,
            }
        )

    def end(self, sid: str, status: str = "ok") -> RawStore:
        return self.line({"event": "session_end", "v": 1, "session_id": sid, "ts": 5.0, "status": status})

    def session(
        self, sid: str, messages: list[Any], response: Any, *, reward: Any = 1.0, **kw: Any
    ) -> RawStore:
        """A complete one-call session."""
        self.start(sid, task_id=kw.pop("task_id", "t1"))
        self.call(sid, messages, response, **kw)
        if reward is not None:
            self.reward(sid, reward)
        return self.end(sid)
