"""Raw store segments written line by line, as the SDK writes them (the trainer's bad-input tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["SEGMENT", "call_line", "event_line", "good_store", "negative_token_id", "session_lines"]

SEGMENT = "20260101T000000-host-1-abcdef.00001.jsonl"
"""A segment file name as the SDK writes them."""


def event_line(event: dict[str, Any]) -> bytes:
    """One event as the SDK writes it: JSON with the format version, one line."""
    return json.dumps({"v": 1, **event}).encode() + b"\n"


def call_line(sid: str, call_id: str, content: str = "q", answer: str = "a", **token_data: Any) -> bytes:
    """One call event with one user message (``token_data``: e.g. ``completion_token_ids``)."""
    call = {
        **token_data,
        "event": "call",
        "call_id": call_id,
        "session_id": sid,
        "framework": "openai",
        "model": "tiny",
        "request": {"messages": [{"role": "user", "content": content}], "params": {}},
        "response": {"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"},
        "started_at": 2.0,
        "ended_at": 3.0,
    }
    return event_line(call)


def session_lines(
    sid: str, task: str, reward: float, content: str = "q", answer: str = "a", **token_data: Any
) -> bytes:
    """A complete one-call session, as the SDK writes it."""
    return b"".join(
        [
            event_line({"event": "session_start", "session_id": sid, "ts": 1.0, "task_id": task}),
            call_line(sid, f"c-{sid}", content, answer, **token_data),
            event_line({"event": "reward", "session_id": sid, "value": reward, "name": "reward", "ts": 4.0}),
            event_line({"event": "session_end", "session_id": sid, "ts": 5.0, "status": "ok"}),
        ]
    )


def good_store(path: Path) -> Path:
    """A store of two tasks, two one-call sessions each (rewards 0 and 1), in one segment under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    data = b"".join(session_lines(f"s{t}{i}", f"t{t}", float(i % 2)) for t in range(2) for i in range(2))
    (path / SEGMENT).write_bytes(data)
    return path


def negative_token_id(store: Path) -> None:
    """A server that returned -1 for a token it could not name (issue 24, item 17)."""
    ids = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [5, -1], "logprobs": [-0.5, -0.25]}
    with open(store / SEGMENT, "ab") as fh:
        fh.write(session_lines("neg", "t0", 1.0, **ids))
