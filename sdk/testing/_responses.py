"""What the scripted server answers: scripted replies, recorded requests, fake tokens, the default policy.

Example:
    >>> [t for t, _ in fake_tokenize("Hi there")]
    ['Hi', ' there']
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sdk.messages import flatten_content

__all__ = ["RecordedRequest", "ScriptedResponse", "default_policy", "fake_tokenize", "synthesize_arguments"]

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
        json: Parsed JSON body, or ``None`` when empty, not JSON or nested too deeply to parse.
        body: Raw body bytes.
        time: ``time.time()`` when the request was read.
        query: The query string's parameters (the last value of a repeated one).

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
    query: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedResponse:
    """The server's answer to one request: :meth:`text`, :meth:`tool_calls`, :meth:`error` or :meth:`raw`.

    Attributes:
        kind: ``"text"``, ``"tool_calls"``, ``"error"`` or ``"raw"``.
        content: Assistant text (``None`` in a tool-call-only turn).
        reasoning_content: Optional reasoning text (chat: ``message.reasoning_content``; Responses: a
            ``reasoning`` item); counted as reasoning tokens.
        finish_reason: Chat finish reason; ``"length"`` makes a Responses reply ``incomplete``.
        calls: ``({"name", "arguments", "id"?}, ...)``; arguments are a dict or a raw JSON string.
        status: HTTP status (errors and raw replies).
        error_message: Error ``message``.
        error_type: Error ``type``.
        body: The bytes a ``raw`` reply sends as they are, or an iterable of parts, each sent (and flushed)
            when it is produced.
        content_type: A ``raw`` reply's ``Content-Type``.
        headers: A ``raw`` reply's further headers, ``((name, value), ...)``.
        framing: How a ``raw`` body is delimited: ``"length"``, ``"close"``, ``"chunked"`` or ``"cut"``.

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
    body: bytes | Iterable[bytes] = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    framing: str = "length"

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

    @classmethod
    def raw(
        cls,
        body: bytes | Iterable[bytes],
        *,
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        framing: str = "length",
    ) -> ScriptedResponse:
        """Bytes sent as they are, for what no well-formed reply can script: a broken stream, a bad body.

        Args:
            body: The reply's body, e.g. an SSE stream whose third event is cut off; or its parts (say, a
                generator that waits between two events), each sent when it is produced.
            status: HTTP status.
            content_type: ``Content-Type`` header.
            headers: Further headers, sent as they are (a ``Content-Length`` here overrides the real one).
            framing: ``"length"`` (``Content-Length``; ``body`` in one piece), ``"close"`` (no length; the
                connection closes after the body), ``"chunked"`` (a chunk per part, then the last) or
                ``"cut"`` (a chunk per part, then the connection closes without the last: the client's
                read fails).

        Returns:
            The scripted response.

        Raises:
            ValueError: An unknown ``framing``, or parts with ``"length"``.

        Example:
            >>> ScriptedResponse.raw(b'{"choices": [', framing="cut").framing
            'cut'
        """
        if framing not in _FRAMINGS:
            raise ValueError(f"framing must be one of {', '.join(_FRAMINGS)}, got {framing!r}")
        if framing == "length" and not isinstance(body, bytes):
            raise ValueError("framing 'length' sends the body in one piece: give bytes, or framing 'close'")
        extra = tuple((headers or {}).items())
        return cls("raw", status=status, body=body, content_type=content_type, headers=extra, framing=framing)

    @classmethod
    def json_body(
        cls, payload: Any, *, status: int = 200, headers: dict[str, str] | None = None
    ) -> ScriptedResponse:
        """Any JSON document as the reply (a :meth:`raw` reply), for a route's own API.

        Args:
            payload: The JSON-serialisable body.
            status: HTTP status.
            headers: Further headers.

        Returns:
            The scripted response.

        Example:
            >>> ScriptedResponse.json_body({"status": "paused"}).body
            b'{"status": "paused"}'
        """
        return cls.raw(json.dumps(payload).encode("utf-8"), status=status, headers=headers)


_FRAMINGS = ("length", "close", "chunked", "cut")


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
