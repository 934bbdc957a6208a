"""A loopback stand-in for the OpenAI fine-tuning REST API (files, jobs, events, cancel): routes on
``sdk.testing``'s scripted server.

Implements the documented endpoints the ``openai`` client calls: ``POST /v1/files`` (multipart, purpose
``fine-tune``; the JSONL is checked line by line against the documented SFT and DPO formats),
``POST /v1/fine_tuning/jobs``, ``GET /v1/fine_tuning/jobs/{id}`` (each poll advances the job:
validating_files → queued → running with one ``metrics`` event per step → succeeded),
``GET /v1/fine_tuning/jobs/{id}/events`` (newest first, ``after`` pages towards older events, ``limit``,
``has_more``) and ``POST /v1/fine_tuning/jobs/{id}/cancel``. Bearer-key auth (401 with OpenAI's error
shape) and scripted 429 responses with ``Retry-After``.
"""

from __future__ import annotations

import json
import threading
import time
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from sdk.testing import RecordedRequest, Route, ScriptedOpenAIServer, ScriptedResponse

TERMINAL = {"succeeded", "failed", "cancelled"}


def _error(
    status: int, message: str, type_: str, code: str | None = None, headers: dict[str, str] | None = None
) -> ScriptedResponse:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return ScriptedResponse.json_body(body, status=status, headers=headers)


def _form(request: RecordedRequest) -> dict[str, Any]:
    """A ``multipart/form-data`` body: ``{name: text}``, a file field as ``(filename, bytes)``."""
    head = f"Content-Type: {request.headers.get('content-type', '')}\r\n\r\n".encode()
    fields: dict[str, Any] = {}
    for part in BytesParser(policy=HTTP).parsebytes(head + request.body).iter_parts():
        name, data = part.get_param("name", header="content-disposition"), part.get_payload(decode=True)
        fields[name] = (part.get_filename(), data) if part.get_filename() else data.decode()
    return fields


def check_sft_line(obj: dict[str, Any]) -> str | None:
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "missing messages"
    if not any(m.get("role") == "assistant" for m in msgs):
        return "no assistant message"
    for m in msgs:
        problem = check_message(m)
        if problem:
            return problem
    if "tools" in obj and not all(
        t.get("type") == "function" and "name" in t["function"] for t in obj["tools"]
    ):
        return "invalid tools"
    return None


def check_message(m: dict[str, Any]) -> str | None:
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        return f"invalid role {role!r}"
    if any(v is None for v in m.values()):
        return "null field"
    if role == "tool" and not m.get("tool_call_id"):
        return "tool message without tool_call_id"
    for c in m.get("tool_calls", []) or []:
        if not isinstance(c["function"]["arguments"], str):
            return "tool call arguments must be a JSON string"
        json.loads(c["function"]["arguments"])
    if role == "assistant" and "content" not in m and not m.get("tool_calls"):
        return "assistant message without content or tool_calls"
    return None


def check_dpo_line(obj: dict[str, Any]) -> str | None:
    inp = obj.get("input")
    if not isinstance(inp, dict) or not isinstance(inp.get("messages"), list) or not inp["messages"]:
        return "missing input.messages"
    for m in inp["messages"]:
        problem = check_message(m)
        if problem:
            return problem
    for key in ("preferred_output", "non_preferred_output"):
        out = obj.get(key)
        if not isinstance(out, list) or len(out) != 1 or out[0].get("role") != "assistant":
            return f"{key} must be a list with one assistant message"
        problem = check_message(out[0])
        if problem:
            return problem
    return None


class FakeOpenAI:
    """The fake API's state, served by a started :class:`ScriptedOpenAIServer` on 127.0.0.1."""

    def __init__(self, api_key: str = "sk-test-key", steps: int = 3) -> None:
        self.api_key = api_key
        self.steps = steps
        self.files: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.rate_limit: dict[str, int] = {}  # "POST /v1/files" -> number of 429s still to send
        self.hold = False  # keep running jobs from finishing
        self.max_page = 100  # events per page at most (small values exercise pagination)
        self.lock = threading.Lock()
        self._n = 0
        routes = {
            "POST /v1/files": self._create_file,
            "POST /v1/fine_tuning/jobs": self._create_job,
            "GET /v1/fine_tuning/jobs/{job_id}": self._get_job,
            "GET /v1/fine_tuning/jobs/{job_id}/events": self._list_events,
            "POST /v1/fine_tuning/jobs/{job_id}/cancel": self._cancel,
        }
        routes = {key: self._gate(handler) for key, handler in routes.items()}
        self.server = ScriptedOpenAIServer(routes=routes).start()
        self.port = self.server.port
        self.base_url = self.server.base_url

    @property
    def requests(self) -> list[str]:
        """Every request received, as ``"METHOD /path"``."""
        return [f"{r.method} {r.path}" for r in self.server.requests]

    def stop(self) -> None:
        self.server.stop()

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n:06d}"

    def _event(self, job_id: str, message: str, type_: str = "message", data: Any = None) -> None:
        self.events[job_id].append(
            {
                "id": self._id("ftevent"),
                "object": "fine_tuning.job.event",
                "created_at": int(time.time()),
                "level": "info",
                "message": message,
                "type": type_,
                "data": data,
            }
        )

    def _advance(self, job: dict[str, Any]) -> None:
        jid = job["id"]
        if job["status"] == "validating_files":
            job["status"] = "queued"
            self._event(jid, "Validating training file: done")
        elif job["status"] == "queued":
            job["status"] = "running"
            self._event(jid, "Fine-tuning job started")
        elif job["status"] == "running":
            if job["_step"] < self.steps:
                job["_step"] += 1
                step = job["_step"]
                self._event(
                    jid,
                    f"Step {step}/{self.steps}: training loss={1.0 / step:.3f}",
                    "metrics",
                    {"step": step, "train_loss": 1.0 / step, "train_mean_token_accuracy": 0.5 + 0.1 * step},
                )
            elif not self.hold:
                job["status"] = "succeeded"
                job["finished_at"] = int(time.time())
                job["fine_tuned_model"] = f"ft:{job['model']}:tracerl::{jid[-6:]}"
                job["trained_tokens"] = 1234
                job["result_files"] = [self._id("file")]
                self._event(jid, "The job has successfully completed")

    @staticmethod
    def _public(item: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse.json_body({k: v for k, v in item.items() if not k.startswith("_")})

    def _gate(self, handler: Route) -> Route:
        """Every route: the bearer key first, then any scripted 429s for it."""

        def gated(request: RecordedRequest, **params: str) -> ScriptedResponse:
            key = f"{request.method} {request.path}"
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            with self.lock:
                limited = self.rate_limit.get(key, 0) > 0
                if limited:
                    self.rate_limit[key] -= 1
            if limited:
                return _error(
                    429,
                    "Rate limit reached for requests",
                    "requests",
                    "rate_limit_exceeded",
                    {"retry-after": "0"},
                )
            return handler(request, **params)

        return gated

    def _create_file(self, request: RecordedRequest) -> ScriptedResponse:
        form = _form(request)
        purpose = form.get("purpose")
        if purpose != "fine-tune":
            return _error(400, f"invalid purpose {purpose!r}", "invalid_request_error")
        filename, data = form["file"]
        content = data.decode()
        kinds = set()
        for n, line in enumerate(content.splitlines(), start=1):
            obj = json.loads(line)
            kind = "dpo" if "input" in obj else "supervised"
            problem = (check_dpo_line if kind == "dpo" else check_sft_line)(obj)
            if problem:
                return _error(400, f"line {n}: {problem}", "invalid_request_error", "invalid_file")
            kinds.add(kind)
        with self.lock:
            fid = self._id("file")
            self.files[fid] = {
                "id": fid,
                "object": "file",
                "bytes": len(content),
                "created_at": int(time.time()),
                "filename": filename,
                "purpose": "fine-tune",
                "status": "processed",
                "_content": content,
                "_kinds": kinds,
            }
        return self._public(self.files[fid])

    def _create_job(self, request: RecordedRequest) -> ScriptedResponse:
        body = request.json or {}
        f = self.files.get(body.get("training_file"))
        if f is None:
            return _error(400, "invalid training_file", "invalid_request_error", "invalid_file")
        if body.get("model") not in ("gpt-4.1-mini-2025-04-14", "gpt-4.1-2025-04-14"):
            return _error(
                400, f"Model {body.get('model')} is not available for fine-tuning", "invalid_request_error"
            )
        method = body.get("method") or {"type": "supervised"}
        if f["_kinds"] != {method["type"]}:
            return _error(400, f"file does not match method {method['type']}", "invalid_request_error")
        with self.lock:
            jid = self._id("ftjob")
            self.jobs[jid] = {
                "id": jid,
                "object": "fine_tuning.job",
                "created_at": int(time.time()),
                "error": None,
                "fine_tuned_model": None,
                "finished_at": None,
                "hyperparameters": method.get(method["type"], {}).get("hyperparameters", {}),
                "model": body["model"],
                "organization_id": "org-test",
                "result_files": [],
                "seed": body.get("seed", 0),
                "status": "validating_files",
                "trained_tokens": None,
                "training_file": body["training_file"],
                "validation_file": None,
                "method": method,
                "_step": 0,
                "_body": body,
            }
            self.events[jid] = []
            self._event(jid, "Created fine-tuning job")
        return self._public(self.jobs[jid])

    def _get_job(self, request: RecordedRequest, job_id: str) -> ScriptedResponse:
        job = self.jobs.get(job_id)
        if job is None:
            return _error(404, "job not found", "invalid_request_error")
        with self.lock:
            self._advance(job)
        return self._public(job)

    def _list_events(self, request: RecordedRequest, job_id: str) -> ScriptedResponse:
        if job_id not in self.jobs:
            return _error(404, "job not found", "invalid_request_error")
        after, limit = request.query.get("after"), int(request.query.get("limit", 20))
        with self.lock:
            newest_first = list(reversed(self.events[job_id]))
        if after is not None:
            idx = next(i for i, e in enumerate(newest_first) if e["id"] == after)
            newest_first = newest_first[idx + 1 :]
        page = newest_first[: min(limit, self.max_page)]
        return ScriptedResponse.json_body(
            {"object": "list", "data": page, "has_more": len(newest_first) > len(page)}
        )

    def _cancel(self, request: RecordedRequest, job_id: str) -> ScriptedResponse:
        job = self.jobs.get(job_id)
        if job is None:
            return _error(404, "job not found", "invalid_request_error")
        with self.lock:
            if job["status"] not in TERMINAL:
                job["status"] = "cancelled"
                job["finished_at"] = int(time.time())
                self._event(job_id, "Job cancelled")
        return self._public(job)
