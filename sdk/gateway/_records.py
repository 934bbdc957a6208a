"""What the gateway records of a model call's request: which bodies it reads, and malformed conversations.

The README promises that a call the upstream answered is stored. A request whose ``messages`` (or
Responses ``input``) is not a list of messages with string roles is stored too, without messages and with
the request as sent under ``extra.malformed_request``: the episode builder can then reject it with a
reason, and can never take its answer for the reply to some other prompt.
"""

from __future__ import annotations

import logging
from typing import Any

from sdk._decompress import decompress
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk.capture import CallRecord, count
from sdk.gateway._http import MAX_DECODED_BODY
from sdk.openai_wire import parse_exchange

__all__ = [
    "malformed_record",
    "recordable",
    "request_problem",
    "warn_once",
]

logger = logging.getLogger("tracerl.gateway")

_WARNED: set[str] = set()


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` happens in this worker (each time is counted elsewhere).

    Example:
        >>> warn_once("doc-example", "tracerl gateway: %s", "logged once")
    """
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(message + " (further ones are counted in /stats, not logged)", *args)


def recordable(endpoint: str | None, body: bytes, encoding: str) -> dict[str, Any] | None:
    """The request JSON of a model call to record, or ``None`` (the call is forwarded, not recorded).

    A compressed body is decompressed (bounded); one that cannot be read is forwarded and counted.

    Example:
        >>> recordable("chat.completions", b'{"model": "m"}', "")
        {'model': 'm'}
    """
    if encoding:
        try:
            decoded = decompress(body, encoding, MAX_DECODED_BODY)
            problem = f"Content-Encoding {encoding.strip().lower()!r} is not supported"
        except ValueError as exc:  # corrupt, truncated, or over the limit (a compression bomb)
            decoded, problem = None, str(exc)
        if decoded is None:
            count("gateway_unrecorded_requests")
            warn_once("encoding", "tracerl gateway: a request was forwarded but not recorded: %s", problem)
            return None
        body = decoded
    if not body:
        return None
    # The store's writers recurse into what they store: the depth is bounded before.
    try:
        payload = parse_untrusted(body)
    except UntrustedJSONError as exc:
        count("gateway_unrecorded_requests")
        warn_once("json", "tracerl gateway: a request was forwarded but not recorded: body %s", exc)
        return None
    return payload if isinstance(payload, dict) else None


def request_problem(endpoint: str, payload: dict[str, Any]) -> str | None:
    """What makes a request's messages unusable as a conversation, if anything.

    Example:
        >>> request_problem("chat.completions", {"messages": "hi"})
        'messages is a str, not a list'
    """
    key = "input" if endpoint == "responses" else "messages"
    items = payload.get(key)
    if items is None or (key == "input" and isinstance(items, str)):
        return None
    if not isinstance(items, list):
        return f"{key} is a {type(items).__name__}, not a list"
    for i, m in enumerate(items):
        if not isinstance(m, dict):
            return f"{key}[{i}] is a {type(m).__name__}, not an object"
        role = m.get("role")
        if not isinstance(role, str) and (key == "messages" or role is not None):
            return f"{key}[{i}].role is {type(role).__name__}, not a string"
    tools = payload.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "tools is not a list of objects"
    return None


def malformed_record(
    endpoint: str, payload: dict[str, Any], problem: str, status: int, body: bytes, kwargs: dict[str, Any]
) -> CallRecord:
    """A call whose request is not a conversation, stored as it came: no messages, the request kept raw.

    With no messages, the episode builder can never take its answer for a reply to some other prompt; the
    request as sent is under ``extra.malformed_request``.

    Example:
        >>> body = b'{"choices": [{"message": {"content": "yo"}, "finish_reason": "stop"}]}'
        >>> r = malformed_record("chat.completions", {"messages": "hi"}, "messages is a str", 200, body, {})
        >>> r.messages, r.response_message["content"], r.extra["malformed_request"]["request"]
        ([], 'yo', {'messages': 'hi'})
    """
    count("gateway_malformed_requests")
    warn_once("malformed", "tracerl gateway: stored a call whose request is malformed: %s", problem)
    clean = {k: v for k, v in payload.items() if k not in ("messages", "input", "tools")}
    try:
        record = parse_exchange(endpoint, clean, status, body, **kwargs)
    except Exception:  # the response cannot be parsed either: keep its bytes
        record = CallRecord(
            framework="gateway",
            model=str(clean.get("model")),
            messages=[],
            endpoint=endpoint,
            stream=bool(clean.get("stream")),
            source="transport",
            started_at=kwargs.get("started_at") or 0.0,
            ended_at=kwargs.get("ended_at"),
        )
        record.extra = {"response_body": body[:1_000_000].decode("utf-8", "replace")}
    record.extra = {**(record.extra or {}), "malformed_request": {"problem": problem, "request": payload}}
    return record
