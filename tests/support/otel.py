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
from tests.support.tools import ADD_TOOL

REPO = Path(__file__).resolve().parents[2]

TOOLS = [ADD_TOOL]


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

    def __init__(self, store: Path, *args: str) -> None:
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
                *args,
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


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def gzip_bomb(gib: int = 1) -> bytes:
    """A gzip body of about 1 MiB that decompresses to ``gib`` GiB of zeros.

    After a full flush a deflate stream no longer refers back, so one compressed MiB of zeros repeated
    is a valid stream: built in a fraction of the seconds compressing 1 GiB would take.
    """
    import struct
    import zlib

    zeros = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.flush()
    crc = 0
    for _ in range(1024 * gib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + block * (1024 * gib) + end + struct.pack("<II", crc, (gib << 30) & 0xFFFFFFFF)


def _kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in attrs.items()]


def chat_span(
    trace_id: str,
    span_id: str,
    question: str,
    answer: str,
    attrs: dict[str, Any] | None = None,
    events: list[tuple[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """One GenAI chat span as OTLP/JSON (ids in hex, empty for none; values as OTLP ``AnyValue``)."""
    messages = {
        "gen_ai.operation.name": {"stringValue": "chat"},
        "gen_ai.request.model": {"stringValue": "tiny-1"},
        "gen_ai.input.messages": {
            "stringValue": json.dumps([{"role": "user", "parts": [{"type": "text", "content": question}]}])
        },
        "gen_ai.output.messages": {
            "stringValue": json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": answer}],
                        "finish_reason": "stop",
                    }
                ]
            )
        },
    }
    span: dict[str, Any] = {
        "name": "chat tiny-1",
        "startTimeUnixNano": str(time.time_ns()),
        "endTimeUnixNano": str(time.time_ns() + 1000),
        "attributes": _kv({**messages, **(attrs or {})}),
        "events": [
            {"name": n, "timeUnixNano": str(time.time_ns()), "attributes": _kv(a)} for n, a in events or ()
        ],
    }
    if trace_id:
        span["traceId"] = trace_id
    if span_id:
        span["spanId"] = span_id
    return span


def otlp_json(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An OTLP/JSON export request holding ``spans``."""
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}


def otlp_protobuf(doc: dict[str, Any]) -> bytes:
    """The same request as OTLP protobuf (hex ids to bytes, as the protobuf JSON mapping wants base64)."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = json.loads(json.dumps(doc))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId"):
                    if k in sp:
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()
