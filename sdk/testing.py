"""A scripted OpenAI-compatible HTTP server for tests, examples and benchmarks (standard library only).

Serves ``POST /v1/chat/completions`` and ``POST /v1/responses`` (JSON or SSE), ``GET /v1/models`` and
``GET /health``; replies are deterministic text, tool calls, logprobs, usage, vLLM-style token ids or errors
(a chat request with ``n`` > 1 gets the reply ``n`` times, one choice per index, interleaved when streamed).
``python -m sdk.testing [--host H] [--port N]`` serves in the foreground and prints one line,
``tracerl test server listening on http://127.0.0.1:PORT/v1``.

Example:
    >>> with ScriptedOpenAIServer() as server:  # doctest: +SKIP
    ...     server.enqueue(ScriptedResponse.text("hi"))
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import socket
import sys
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sdk.capture import tool_call
from sdk.messages import flatten_content
from sdk.openai_wire import (
    SSE_DONE,
    assistant_message,
    chat_choice,
    chat_chunk,
    chat_completion,
    chunk_choice,
    error_body,
    sse,
)
from sdk.openai_wire import usage as chat_usage

__all__ = [
    "RecordedRequest",
    "ScriptedOpenAIServer",
    "ScriptedResponse",
    "default_policy",
    "fake_tokenize",
    "main",
    "synthesize_arguments",
]

Token = tuple[str, int]
_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_FINGERPRINT = {"system_fingerprint": "fp_tracerl", "service_tier": "default"}
_MARKERS = {"FAIL_400": 400, "FAIL_429": 429, "FAIL_500": 500}
_ERRORS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    409: ("conflict_error", "conflict"),
    422: ("invalid_request_error", "unprocessable_entity"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def _error_kind(status: int) -> tuple[str, str | None]:
    fallback = ("server_error", "server_error") if status >= 500 else ("invalid_request_error", None)
    return _ERRORS.get(status, fallback)


@dataclass
class RecordedRequest:
    """One HTTP request the server received.

    Attributes:
        method: HTTP method, e.g. ``"POST"``.
        path: Path without the query string, e.g. ``"/v1/chat/completions"``.
        headers: Request headers, lower-case keys.
        json: Parsed JSON body, or ``None`` when empty or not JSON.
        body: Raw body bytes.
        time: ``time.time()`` when the request was read.

    Example:
        >>> server.requests[-1].json["model"]  # doctest: +SKIP
        'gpt-test'
    """

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    body: bytes = b""
    time: float = 0.0


@dataclass(frozen=True)
class ScriptedResponse:
    """The server's answer to one request; build it with :meth:`text`, :meth:`tool_calls` or :meth:`error`.

    Attributes:
        kind: ``"text"``, ``"tool_calls"`` or ``"error"``.
        content: Assistant text (``None`` in a tool-call-only turn).
        reasoning_content: Optional reasoning text (chat: ``message.reasoning_content``; Responses: a
            ``reasoning`` item); counted as reasoning tokens.
        finish_reason: Chat finish reason; ``"length"`` makes a Responses reply ``incomplete``.
        calls: ``({"name", "arguments", "id"?}, ...)``; arguments are a dict or a raw JSON string.
        status: HTTP status (errors).
        error_message: Error ``message``.
        error_type: Error ``type``.

    Example:
        >>> ScriptedResponse.text("hi").content
        'hi'
    """

    kind: str
    content: str | None = None
    reasoning_content: str | None = None
    finish_reason: str = "stop"
    calls: tuple[dict[str, Any], ...] = ()
    status: int = 200
    error_message: str = ""
    error_type: str | None = None

    @classmethod
    def text(
        cls, content: str, *, finish_reason: str = "stop", reasoning_content: str | None = None
    ) -> ScriptedResponse:
        """An assistant text reply.

        Args:
            content: The text.
            finish_reason: Chat finish reason, e.g. ``"stop"`` or ``"length"``.
            reasoning_content: Optional reasoning text sent alongside.

        Returns:
            The scripted response.

        Example:
            >>> ScriptedResponse.text("Paris", reasoning_content="hmm").kind
            'text'
        """
        return cls("text", content=content, reasoning_content=reasoning_content, finish_reason=finish_reason)

    @classmethod
    def tool_calls(
        cls, calls: list[dict[str, Any]], content: str | None = None, *, reasoning_content: str | None = None
    ) -> ScriptedResponse:
        """An assistant turn that calls tools (``finish_reason="tool_calls"``).

        Args:
            calls: ``[{"name": ..., "arguments": dict | str, "id": optional}]``; a string is sent verbatim
                (so invalid JSON can be scripted); missing ids are derived from the request.
            content: Optional text sent before the calls.
            reasoning_content: Optional reasoning text.

        Returns:
            The scripted response.

        Example:
            >>> ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 1, "b": 2}}]).finish_reason
            'tool_calls'
        """
        calls_ = tuple(dict(c) for c in calls)
        return cls("tool_calls", content, reasoning_content, "tool_calls", calls_)

    @classmethod
    def error(cls, status: int, message: str, type: str | None = None) -> ScriptedResponse:
        """An HTTP error with an OpenAI-style ``{"error": {message, type, param, code}}`` body.

        Args:
            status: HTTP status, e.g. 400, 429 or 500.
            message: Error message.
            type: Error type; defaults from the status (``invalid_request_error``, ``rate_limit_error``,
                ``server_error`` for 5xx, ...).

        Returns:
            The scripted response.

        Example:
            >>> ScriptedResponse.error(429, "slow down").error_type
            'rate_limit_error'
        """
        return cls("error", status=status, error_message=message, error_type=type or _error_kind(status)[0])


# --------------------------------------------------------------------------- fake tokenizer and policy


def fake_tokenize(text: str) -> list[Token]:
    """Split text into deterministic ``(piece, token_id)`` pairs whose pieces concatenate back to ``text``.

    Pieces are words or punctuation with their leading whitespace; ids are ``crc32(piece) % 50000``.

    Args:
        text: Any string.

    Returns:
        The tokens.

    Example:
        >>> [p for p, _ in fake_tokenize("Hi, you")]
        ['Hi', ',', ' you']
    """
    return [(p, zlib.crc32(p.encode("utf-8")) % 50000) for p in _TOKEN_RE.findall(text)]


def synthesize_arguments(schema: dict[str, Any] | None) -> dict[str, Any]:
    """Deterministic arguments for a JSON schema: numbers 2, 3, 4, ... in order, strings ``"Paris"``.

    Every property is filled: enums take their first value, booleans ``True``, arrays one element,
    ``anyOf``/``oneOf`` their first non-null option; local ``$ref`` s are resolved.

    Args:
        schema: An ``object`` JSON schema (a tool's ``parameters``).

    Returns:
        The arguments.

    Example:
        >>> synthesize_arguments({"type": "object", "properties": {"a": {"type": "integer"},
        ...     "b": {"type": "number"}, "city": {"type": "string"}}})
        {'a': 2, 'b': 3, 'city': 'Paris'}
    """
    root = schema or {}
    numbers = iter(range(2, 1 << 30))

    def value(s: Any, depth: int = 0) -> Any:
        if not isinstance(s, dict) or depth > 8:
            return "Paris"
        if isinstance(s.get("$ref"), str) and s["$ref"].startswith("#/"):
            target: Any = root
            for part in s["$ref"][2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            return value(target, depth + 1)
        if "const" in s:
            return s["const"]
        if s.get("enum"):
            return s["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            options = [o for o in s.get(key) or [] if not (isinstance(o, dict) and o.get("type") == "null")]
            if options:
                return value(options[0], depth + 1)
        kind = s.get("type", "object" if "properties" in s else "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if kind in ("integer", "number"):
            return next(numbers)
        if kind in ("boolean", "array", "object", "null"):
            return {
                "boolean": lambda: True,
                "array": lambda: [value(s.get("items", {}), depth + 1)],
                "object": lambda: {k: value(v, depth + 1) for k, v in (s.get("properties") or {}).items()},
                "null": lambda: None,
            }[kind]()
        return "Paris"

    result = value(root)
    return result if isinstance(result, dict) else {}


def _text_of(content: Any) -> str:
    # The scripted server stands in for vLLM: it sees list content as vLLM renders it (sdk.messages rule).
    return flatten_content(content) or ""


def _conversation(req: dict, endpoint: str) -> list[tuple[str, str]]:
    """Normalise a request's messages to ``(role, text)`` pairs; tool results get role ``tool``."""
    out: list[tuple[str, str]] = []
    if endpoint == "chat.completions":
        for m in req.get("messages") or []:
            calls = json.dumps(m["tool_calls"], sort_keys=True) if m.get("tool_calls") else ""
            out.append((str(m.get("role", "user")), _text_of(m.get("content")) + calls))
        return out
    if req.get("instructions"):
        out.append(("system", str(req["instructions"])))
    items = req.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        kind = item.get("type", "message")
        if kind == "function_call_output":
            out.append(("tool", _text_of(item.get("output"))))
        elif kind == "function_call":
            out.append(("assistant", json.dumps([item.get("name"), item.get("arguments")])))
        elif kind == "message" or "role" in item:
            out.append((str(item.get("role", "user")), _text_of(item.get("content"))))
    return out


def _function_tools(req: dict, endpoint: str) -> list[tuple[str, dict]]:
    tools = []
    for t in req.get("tools") or []:
        if isinstance(t, dict) and t.get("type", "function") == "function":
            fn = t.get("function", t) if endpoint == "chat.completions" else t
            if fn.get("name"):
                tools.append((str(fn["name"]), fn.get("parameters") or {}))
    return tools


def default_policy(request: dict, endpoint: str) -> ScriptedResponse:
    """The deterministic policy that drives agent loops against the server.

    1. ``FAIL_400`` / ``FAIL_429`` / ``FAIL_500`` in the last user message → that error.
    2. Function tools given, ``tool_choice`` not ``"none"``, and no tool result after the last user
       message → call the first tool (or the one ``tool_choice`` names) with :func:`synthesize_arguments`.
    3. A tool result after the last user message → ``"Tool result: <last result>"``.
    4. Otherwise → ``"You said: <last user text>"``.

    Args:
        request: The parsed request body.
        endpoint: ``"chat.completions"`` or ``"responses"``.

    Returns:
        The response to send.

    Example:
        >>> default_policy({"messages": [{"role": "user", "content": "hi"}]}, "chat.completions").content
        'You said: hi'
    """
    msgs = _conversation(request, endpoint)
    last_user = max((i for i, (role, _) in enumerate(msgs) if role == "user"), default=-1)
    user_text = msgs[last_user][1] if last_user >= 0 else ""
    for marker, status in _MARKERS.items():
        if marker in user_text:
            return ScriptedResponse.error(status, f"Scripted failure: {marker} in the last user message.")
    results = [text for role, text in msgs[last_user + 1 :] if role in ("tool", "function")]
    tools, choice = _function_tools(request, endpoint), request.get("tool_choice")
    if isinstance(choice, dict):
        wanted = (choice.get("function") or choice).get("name")
        tools = [t for t in tools if t[0] == wanted] or tools
    if tools and not results and choice != "none":
        name, schema = tools[0]
        return ScriptedResponse.tool_calls([{"name": name, "arguments": synthesize_arguments(schema)}])
    return ScriptedResponse.text(f"Tool result: {results[-1]}" if results else f"You said: {user_text}")


# --------------------------------------------------------------------------- rendering


def _render_prompt(req: dict, endpoint: str) -> str:
    parts = [f"<|{role}|>{text}<|end|>\n" for role, text in _conversation(req, endpoint)]
    if req.get("tools"):
        parts.append("<|tools|>" + json.dumps(req["tools"], sort_keys=True) + "<|end|>\n")
    return "".join(parts) + "<|assistant|>"


def _logprob(piece: str, n_top: int) -> dict[str, Any]:
    lp = -round((zlib.crc32(piece.encode("utf-8") + b"#") % 2000) / 1000.0, 3)
    top = [(piece, lp)] + [(f"{piece}~{k}", round(lp - 0.5 * k - 0.25, 3)) for k in range(1, n_top)]
    alts = [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in top[:n_top]]
    return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "top_logprobs": alts}


@dataclass
class _Turn:
    """A scripted reply expanded into fake tokens; shared by the chat and Responses renderers."""

    reasoning: list[Token]
    content: list[Token]
    calls: list[dict[str, Any]]  # {id, name, arguments, name_tokens, arg_tokens}
    text: str | None
    finish_reason: str
    prompt_ids: list[int]
    model: str
    logprobs: bool
    n_top: int
    token_ids: bool
    seed: str

    @property
    def completion(self) -> list[Token]:
        tools = [t for c in self.calls for t in c["name_tokens"] + c["arg_tokens"]]
        return self.reasoning + self.content + tools

    def lp(self, tokens: list[Token]) -> list[dict[str, Any]]:
        return [_logprob(p, self.n_top) for p, _ in tokens]


def _build_turn(resp: ScriptedResponse, req: dict, endpoint: str, model_suffix: str) -> _Turn:
    prompt = _render_prompt(req, endpoint)
    seed = hashlib.sha1(f"{endpoint}|{prompt}".encode()).hexdigest()  # same conversation → same ids
    calls = []
    for i, c in enumerate(resp.calls):
        args = c.get("arguments", {})
        args, name = (args if isinstance(args, str) else json.dumps(args)), str(c.get("name", ""))
        cid = c.get("id") or "call_" + hashlib.sha1(f"{seed}|{i}".encode()).hexdigest()[:24]
        calls.append({"id": cid, "name": name, "arguments": args, "name_tokens": fake_tokenize(name),
                      "arg_tokens": fake_tokenize(args)})  # fmt: skip
    if endpoint == "chat.completions":
        want_lp = bool(req.get("logprobs"))
    else:
        include = req.get("include") or []
        want_lp = "message.output_text.logprobs" in include or req.get("top_logprobs") is not None
    return _Turn(
        reasoning=fake_tokenize(resp.reasoning_content or ""),
        content=fake_tokenize(resp.content or ""),
        calls=calls,
        text=resp.content,
        finish_reason=resp.finish_reason,
        prompt_ids=[i for _, i in fake_tokenize(prompt)],
        model=str(req.get("model") or "tracerl-test-model") + model_suffix,
        logprobs=want_lp,
        n_top=int(req.get("top_logprobs") or 0),
        token_ids=bool(req.get("return_token_ids")),
        seed=seed,
    )


def _chat_usage(t: _Turn, n: int = 1) -> dict[str, Any]:
    return chat_usage(len(t.prompt_ids), n * len(t.completion), reasoning_tokens=len(t.reasoning))


def _chat_completion(t: _Turn, cid: str, created: int, n: int = 1) -> dict[str, Any]:
    calls = [tool_call(c["id"], c["name"], c["arguments"]) for c in t.calls]
    reasoning = "".join(p for p, _ in t.reasoning) or None
    message = assistant_message(t.text, calls, reasoning_content=reasoning)
    token_ids = [i for _, i in t.completion] if t.token_ids else None
    # n > 1: the same scripted reply n times, one choice per index.
    choices = [
        chat_choice(i, message, t.finish_reason, logprobs=t.lp(t.completion) if t.logprobs else None,
                    token_ids=token_ids)
        for i in range(n)
    ]  # fmt: skip
    return chat_completion(
        cid, created, t.model, choices, usage=_chat_usage(t, n),
        prompt_token_ids=t.prompt_ids if t.token_ids else None, **_FINGERPRINT,
    )  # fmt: skip


def _set_token_ids(body: dict[str, Any], prompt: list[int], completion: list[int], logprobs: bool) -> None:
    """Put a token-ids hook's ids (and one logprob per completion id) into a chat completion body."""
    body["prompt_token_ids"] = list(prompt)
    choice = body["choices"][0]
    choice["token_ids"] = list(completion)
    if logprobs:
        entries = [{"token": f"token_id:{i}", "logprob": -round(((i * 7919) % 1000) / 1000.0 + 0.001, 3)}
                   for i in completion]  # fmt: skip
        choice["logprobs"] = {"content": entries, "refusal": None}
    n_in, n_out = len(prompt), len(completion)
    body["usage"].update(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)


def _chat_chunks(
    t: _Turn, cid: str, created: int, include_usage: bool, n: int = 1
) -> Iterator[dict[str, Any]]:
    envelope = chat_completion(cid, created, t.model, [], **_FINGERPRINT)
    extra = {"usage": None} if include_usage else {}

    def chunk(
        delta: dict[str, Any], tokens: list[Token], finish: str | None = None, index: int = 0
    ) -> dict[str, Any]:
        choice = chunk_choice(
            index,
            delta,
            finish,
            logprobs=t.lp(tokens) if t.logprobs and tokens else None,
            token_ids=[i for _, i in tokens] if t.token_ids else None,
        )
        return chat_chunk(envelope, [choice], **extra)

    def one_choice(index: int) -> Iterator[dict[str, Any]]:
        yield chunk({"role": "assistant", "content": ""}, [], index=index)
        for tok in t.reasoning:
            yield chunk({"reasoning_content": tok[0]}, [tok], index=index)
        for tok in t.content:
            yield chunk({"content": tok[0]}, [tok], index=index)
        for i, c in enumerate(t.calls):
            fn = {"name": c["name"], "arguments": ""}
            head = {"index": i, "id": c["id"], "type": "function", "function": fn}
            yield chunk({"tool_calls": [head]}, c["name_tokens"], index=index)
            for tok in c["arg_tokens"]:
                yield chunk(
                    {"tool_calls": [{"index": i, "function": {"arguments": tok[0]}}]}, [tok], index=index
                )
        yield chunk({}, [], t.finish_reason, index=index)

    # n > 1: the choices' chunks interleaved, as OpenAI sends them.
    streams = [one_choice(i) for i in range(n)]
    for seq, ev in enumerate(e for group in itertools.zip_longest(*streams) for e in group if e is not None):
        yield {**ev, "prompt_token_ids": t.prompt_ids} if seq == 0 and t.token_ids else ev
    if include_usage:
        yield {**chunk({}, []), "choices": [], "usage": _chat_usage(t, n)}


def _response_items(t: _Turn) -> list[dict[str, Any]]:
    h = t.seed[:24]
    items: list[dict[str, Any]] = []
    if t.reasoning:
        summary = [{"type": "summary_text", "text": "".join(p for p, _ in t.reasoning)}]
        items.append({"id": f"rs_{h}", "type": "reasoning", "summary": summary})
    if t.text is not None or not t.calls:
        part = {"type": "output_text", "text": t.text or "", "annotations": [],
                "logprobs": t.lp(t.content) if t.logprobs else []}  # fmt: skip
        items.append({"id": f"msg_{h}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [part]})  # fmt: skip
    for i, c in enumerate(t.calls):
        items.append({"id": f"fc_{h}{i}", "type": "function_call", "call_id": c["id"], "name": c["name"],
                      "arguments": c["arguments"], "status": "completed"})  # fmt: skip
    return items


def _response(t: _Turn, req: dict, rid: str, created: int, final: bool) -> dict[str, Any]:
    n_in, n_out = len(t.prompt_ids), len(t.completion)
    status = ("incomplete" if t.finish_reason == "length" else "completed") if final else "in_progress"
    usage = {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": len(t.reasoning)},
        "total_tokens": n_in + n_out,
    }
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": t.model,
        "output": _response_items(t) if final else [], "usage": usage if final else None,
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools") or [],
        "temperature": req.get("temperature", 1.0), "top_p": req.get("top_p", 1.0), "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.get("instructions"), "metadata": req.get("metadata") or {},
        "text": {"format": {"type": "text"}},
    }  # fmt: skip


def _response_events(t: _Turn, req: dict, rid: str, created: int) -> Iterator[dict[str, Any]]:
    yield {"type": "response.created", "response": _response(t, req, rid, created, final=False)}
    calls = iter(t.calls)
    for idx, item in enumerate(_response_items(t)):
        at = {"item_id": item["id"], "output_index": idx}
        if item["type"] == "message":
            part, at = item["content"][0], {**at, "content_index": 0}
            started = {**item, "status": "in_progress", "content": []}
            yield {"type": "response.output_item.added", "output_index": idx, "item": started}
            yield {"type": "response.content_part.added", **at, "part": {**part, "text": "", "logprobs": []}}
            for tok in t.content:
                lps = t.lp([tok]) if t.logprobs else []
                yield {"type": "response.output_text.delta", **at, "delta": tok[0], "logprobs": lps}
            text_done = {"text": part["text"], "logprobs": part["logprobs"]}
            yield {"type": "response.output_text.done", **at, **text_done}
            yield {"type": "response.content_part.done", **at, "part": part}
        elif item["type"] == "function_call":
            started = {**item, "arguments": "", "status": "in_progress"}
            yield {"type": "response.output_item.added", "output_index": idx, "item": started}
            for tok in next(calls)["arg_tokens"]:
                yield {"type": "response.function_call_arguments.delta", **at, "delta": tok[0]}
            done = {"name": item["name"], "arguments": item["arguments"]}
            yield {"type": "response.function_call_arguments.done", **at, **done}
        else:
            yield {"type": "response.output_item.added", "output_index": idx, "item": item}
        yield {"type": "response.output_item.done", "output_index": idx, "item": item}
    final = _response(t, req, rid, created, final=True)
    yield {"type": f"response.{final['status']}", "response": final}


# --------------------------------------------------------------------------- HTTP plumbing


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 4096
    allow_reuse_address = True
    owner: ScriptedOpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # clients hanging up is normal; stay quiet
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK stall every
    # keep-alive response by ~40 ms, which would swamp any latency measurement against this server.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        data = b""
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            data += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return data

    def _handle(self) -> None:
        owner, request_id = self.server.owner, "req_" + uuid.uuid4().hex
        path, body = self.path.split("?", 1)[0], self._read_body()
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        owner._record(RecordedRequest(self.command, path, headers, parsed, body, time.time()))
        if owner.latency_s > 0:
            time.sleep(owner.latency_s)
        route, get = (path[3:] if path.startswith("/v1/") else path).rstrip("/"), self.command == "GET"
        try:
            if get and route == "/models":
                data = [{"id": m, "object": "model", "created": 1767225600, "owned_by": "tracerl"}
                        for m in owner._models()]  # fmt: skip
                self._send_json(200, {"object": "list", "data": data}, request_id)
            elif get and route == "/health":
                self._send_json(200, {"status": "ok"}, request_id)
            elif self.command == "POST" and route in ("/chat/completions", "/responses"):
                if isinstance(parsed, dict):
                    self._complete(parsed, route.strip("/").replace("/", "."), request_id)
                else:
                    self._send_error(ScriptedResponse.error(400, "Body must be a JSON object."), request_id)
            else:
                self._send_error(ScriptedResponse.error(404, f"No route {self.command} {path}."), request_id)
        except OSError:
            self.close_connection = True
        except Exception as exc:  # a bug in this server: surface it to the client as a 500
            import traceback

            msg = f"tracerl test server error: {exc!r}\n{traceback.format_exc()}"
            self._send_error(ScriptedResponse.error(500, msg), request_id)

    def _complete(self, req: dict, endpoint: str, request_id: str) -> None:
        resp = self.server.owner._next_response(req, endpoint)
        if resp.kind == "error":
            return self._send_error(resp, request_id)
        t, created = _build_turn(resp, req, endpoint, self.server.owner.model_suffix), int(time.time())
        stream = bool(req.get("stream"))
        if endpoint == "chat.completions":
            cid = "chatcmpl-" + uuid.uuid4().hex
            n = max(1, int(req.get("n") or 1))
            if not stream:
                body = _chat_completion(t, cid, created, n)
                token_ids = self.server.owner.token_ids
                if token_ids is not None and t.token_ids:
                    _set_token_ids(body, *token_ids(req, resp), t.logprobs)
                return self._send_json(200, body, request_id)
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            chunks = ((None, c) for c in _chat_chunks(t, cid, created, include_usage, n))
            return self._send_sse(chunks, request_id, done_marker=True)
        rid = "resp_" + uuid.uuid4().hex
        if not stream:
            return self._send_json(200, _response(t, req, rid, created, final=True), request_id)
        events = ((e["type"], e) for e in _response_events(t, req, rid, created))
        return self._send_sse(events, request_id, done_marker=False)

    def _send_json(self, status: int, payload: Any, request_id: str) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", request_id)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, resp: ScriptedResponse, request_id: str) -> None:
        kind, code = _error_kind(resp.status)
        body = error_body(resp.error_message, resp.error_type or kind, code=code)
        self._send_json(resp.status, body, request_id)

    def _send_sse(self, events: Iterator[tuple[str | None, dict]], rid: str, done_marker: bool) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("x-request-id", rid)
        self.end_headers()
        pause = self.server.owner.stream_delay_s  # type: ignore[attr-defined]
        for seq, (event, payload) in enumerate(events):
            if pause and seq:
                time.sleep(pause)  # lets a client stop reading mid-stream (an abandoned stream)
            self.wfile.write(
                sse(payload) if event is None else sse({**payload, "sequence_number": seq}, event)
            )
        if done_marker:
            self.wfile.write(SSE_DONE)


# --------------------------------------------------------------------------- server


class ScriptedOpenAIServer:
    """An OpenAI-compatible HTTP server on a background thread, answering from a queue or a policy.

    Each reply comes from, in order: the FIFO queue filled by :meth:`enqueue` (shared by all endpoints);
    ``policy(request_json, endpoint)`` where ``endpoint`` is ``"chat.completions"`` or ``"responses"``
    (returning ``None`` falls through); :func:`default_policy`.

    Args:
        host: Interface to bind.
        port: Port; 0 picks a free one.
        model_suffix: Appended to the requested model in replies, so requested and returned models differ.
        latency_s: Seconds to sleep before answering each request.
        stream_delay_s: Seconds to sleep between the events of a streamed reply.
        token_ids: ``token_ids(request_json, response) -> (prompt_ids, completion_ids)``: the ids a
            non-streamed chat reply returns when asked (``return_token_ids``), instead of the fake
            tokenizer's, e.g. a real tokenizer's with a word spelled in unusual tokens; logprobs follow them.
        policy: Optional callable replacing the default policy.

    Example:
        >>> with ScriptedOpenAIServer(latency_s=0.01) as server:  # doctest: +SKIP
        ...     server.enqueue(ScriptedResponse.error(429, "slow down"))
        ...     print(server.base_url)
        http://127.0.0.1:54321/v1
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_suffix: str = "-2026-01-01",
        latency_s: float = 0.0,
        policy: Callable[[dict, str], ScriptedResponse | None] | None = None,
        stream_delay_s: float = 0.0,
        token_ids: Callable[[dict, ScriptedResponse], tuple[list[int], list[int]]] | None = None,
    ) -> None:
        self.host, self._port = host, port
        self.stream_delay_s = stream_delay_s
        self.token_ids = token_ids
        self.model_suffix, self.latency_s, self.policy = model_suffix, latency_s, policy
        self.requests: list[RecordedRequest] = []
        self._queue: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._seen_models: dict[str, None] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ScriptedOpenAIServer:
        """Bind and serve on a daemon thread (no-op when started).

        Returns:
            ``self``.

        Example:
            >>> server = ScriptedOpenAIServer().start()  # doctest: +SKIP
        """
        if self._httpd is None:
            self._httpd = _HTTPServer((self.host, self._port), _Handler)
            self._httpd.owner = self
            kwargs = {"poll_interval": 0.05}
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs=kwargs, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close open keep-alive connections (idempotent).

        Example:
            >>> server.stop()  # doctest: +SKIP
        """
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port; raises ``RuntimeError`` before :meth:`start`.

        Example:
            >>> server.port  # doctest: +SKIP
            54321
        """
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Root URL.

        Example:
            >>> server.url  # doctest: +SKIP
            'http://127.0.0.1:54321'
        """
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The openai client's ``base_url``.

        Example:
            >>> server.base_url  # doctest: +SKIP
            'http://127.0.0.1:54321/v1'
        """
        return self.url + "/v1"

    def enqueue(self, *responses: ScriptedResponse) -> None:
        """Queue replies for the next requests (FIFO, any endpoint), ahead of the policy.

        Example:
            >>> server.enqueue(ScriptedResponse.text("a"), ScriptedResponse.error(500, "x"))  # doctest: +SKIP
        """
        with self._lock:
            self._queue.extend(responses)

    def reset(self) -> None:
        """Clear the recorded requests and the queue.

        Example:
            >>> server.reset()  # doctest: +SKIP
        """
        with self._lock:
            self.requests.clear()
            self._queue.clear()

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)
            if isinstance(req.json, dict) and isinstance(req.json.get("model"), str):
                self._seen_models[req.json["model"]] = None

    def _models(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(["tracerl-test-model", *self._seen_models]))

    def _next_response(self, req: dict, endpoint: str) -> ScriptedResponse:
        with self._lock:
            queued = self._queue.popleft() if self._queue else None
        chosen = queued or (self.policy(req, endpoint) if self.policy is not None else None)
        return chosen or default_policy(req, endpoint)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until SIGINT/SIGTERM (``python -m sdk.testing``).

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        Exit status.

    Example:
        >>> main(["--port", "8765"])  # doctest: +SKIP
        tracerl test server listening on http://127.0.0.1:8765/v1
    """
    import signal

    parser = argparse.ArgumentParser(prog="python -m sdk.testing", description="Scripted OpenAI test server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to sleep per request")
    parser.add_argument("--model-suffix", default="-2026-01-01")
    args = parser.parse_args(argv)
    server = ScriptedOpenAIServer(
        args.host, args.port, model_suffix=args.model_suffix, latency_s=args.latency
    )

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    server.start()
    print(f"tracerl test server listening on {server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
