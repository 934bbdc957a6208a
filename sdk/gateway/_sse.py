"""Forwarding an SSE stream event by event, its terminal event held back until the call is stored."""

from __future__ import annotations

import json

from sdk._internal import count
from sdk._json import UntrustedJSONError, parse_untrusted
from sdk._openai_write import error_body, sse
from sdk._token_data import strip_token_data

__all__ = ["SSEForwarder", "error_event"]

# The Responses API's final events and Anthropic's ``message_stop``.
_TERMINAL_TYPES = (b"response.completed", b"response.failed", b"response.incomplete", b"message_stop")
_TERMINAL_MARKS = (b"[DONE]", *_TERMINAL_TYPES)


class SSEForwarder:
    r"""Forwards an SSE stream event by event and holds back its terminal event until the call is stored.

    Bytes of an event are sent once the event is complete (a client cannot use half an event), so a chunk
    is forwarded as soon as it completes one. The terminal event (``data: [DONE]``, a final
    ``response.*`` event or Anthropic's ``message_stop``) and anything after it wait for :meth:`rest`,
    called after the record is written: a client that saw the end of its stream can rely on the call
    being in the store.

    Example:
        >>> f = SSEForwarder("chat.completions", frozenset())
        >>> f.feed(b'data: {"choices": []}\n\ndata: [DONE]\n\n')
        b'data: {"choices": []}\n\n'
        >>> f.rest()
        b'data: [DONE]\n\n'
    """

    __slots__ = ("buf", "held", "endpoint", "strip")

    def __init__(self, endpoint: str, strip: frozenset[str]) -> None:
        self.buf = b""
        self.held = False
        self.endpoint = endpoint
        self.strip = strip

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        if self.held:
            return b""
        lf, crlf = self.buf.rfind(b"\n\n"), self.buf.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if cut == 0:  # no complete event yet
            return b""
        ready, self.buf = self.buf[:cut], self.buf[cut:]
        term = _terminal_at(ready)
        if term >= 0:
            ready, self.buf, self.held = ready[:term], ready[term:] + self.buf, True
        return self._out(ready)

    def rest(self) -> bytes:
        out, self.buf = self.buf, b""
        return self._out(out)

    def _out(self, data: bytes) -> bytes:
        if not self.strip or not data:
            return data
        return b"".join(_strip_event(ev, self.endpoint, self.strip) for ev in _events(data))


def error_event(endpoint: str, message: str) -> bytes:
    r"""The SSE event that ends a stream the gateway cannot finish, in the endpoint's own format.

    Each official SDK raises it to the agent: Anthropic's ``error`` event, the Responses API's ``error``
    event, and for chat completions a chunk with an ``error`` object (as vLLM sends).

    Example:
        >>> error_event("messages", "cut")
        b'event: error\ndata: {"type": "error", "error": {"type": "api_error", "message": "cut"}}\n\n'
    """
    if endpoint == "messages":
        return sse({"type": "error", "error": {"type": "api_error", "message": message}}, "error")
    if endpoint == "responses":
        return sse({"type": "error", "code": "gateway_error", "message": message, "param": None}, "error")
    return sse(error_body(message, "gateway_error"))


def _events(data: bytes) -> list[bytes]:
    """Split complete SSE data into events, each with its terminating blank line."""
    out = []
    start = 0
    while start < len(data):
        end = data.find(b"\n\n", start)
        if end < 0:
            out.append(data[start:])
            break
        out.append(data[start : end + 2])
        start = end + 2
    return out


def _terminal_at(data: bytes) -> int:
    """Offset of the first terminal event in ``data`` (complete events), or -1."""
    # Events before the first place a terminal marker could be are not terminal: skip their lines.
    first = min((i for i in (data.find(n) for n in _TERMINAL_MARKS) if i >= 0), default=-1)
    if first < 0:
        return -1
    offset = 0
    for ev in _events(data):
        end = offset + len(ev)
        if end > first and _is_terminal(ev):
            return offset
        offset = end
    return -1


def _is_terminal(ev: bytes) -> bool:
    for line in ev.split(b"\n"):
        line = line.strip()
        if line in (b"data: [DONE]", b"data:[DONE]"):
            return True
        if line.startswith(b"event:") and line[6:].strip() in _TERMINAL_TYPES:
            return True
        if line.startswith(b"data:") and any(
            b'"type":"' + t + b'"' in line or b'"type": "' + t + b'"' in line for t in _TERMINAL_TYPES
        ):
            return True
    return False


def _strip_event(ev: bytes, endpoint: str, added: frozenset[str]) -> bytes:
    lines = ev.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            try:
                payload = parse_untrusted(line[5:])
            except UntrustedJSONError:  # not JSON, or too deep to re-encode: forwarded as it came
                count("gateway_responses_not_stripped")
                continue
            payload = strip_token_data(endpoint, payload, added)
            lines[i] = b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return b"\n".join(lines)
