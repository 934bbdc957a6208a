"""Hold OTLP spans per trace until the trace is complete, then write its GenAI chat spans into a store.

Shared by the standalone receiver (``python -m sdk.otel receive``) and the gateway's ``POST /v1/traces``
(``python -m sdk.gateway --otlp``), the route itself too (:meth:`SpanCollector.answer`). No web framework
here (the route reads ASGI's ``receive``); OpenTelemetry's protobuf package is imported when a protobuf
request arrives.

What a request gets: 413 for a body over ``max_body_bytes`` (compressed or decompressed, decompressed a
bounded piece at a time), 400 for one that cannot be decoded, else 200, with OTLP's ``partial_success``
(the spans rejected and why) when some spans cannot be ingested. A span already received (same trace and
span id, e.g. an exporter's retry) is dropped and counted as ``duplicate_spans``: the ids of the last
``dedup_window`` spans are remembered, seeded at start from the chat spans in the store's newest segments
(so a retry that comes after a restart is dropped too).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from sdk._decompress import BodyTooLarge
from sdk.otel._decode import DEFAULT_MAX_BODY_BYTES, OtelSpan, spans_from_otlp_http
from sdk.otel._ingest import IngestSummary, sessions_from_spans, span_problem, write_sessions

# Ids of the spans received last, to drop an exporter's retries: about 200 bytes each (40 MB in all).
DEDUP_WINDOW = 200_000
# How much of the store's newest segments is read at start for the ids of the spans written before.
SEED_BYTES = 32 << 20

__all__ = ["SpanCollector"]


class SpanCollector:
    """Holds spans by trace until the trace is complete, then writes its sessions into ``store``.

    ``store=None`` writes into the store this process is configured with (``sdk.configure``).

    Args:
        store: The store directory.
        linger: Seconds to wait after a trace's root span before writing the trace.
        timeout: Seconds before a trace without root is written.
        max_body_bytes: The most bytes a request body may hold, compressed or decompressed.
        dedup_window: How many recent (trace id, span id) pairs are remembered to drop repeats.

    Example:
        >>> import tempfile
        >>> c = SpanCollector(tempfile.mkdtemp())
        >>> c.add([]); c.flush(force=True)
        0
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | None,
        *,
        linger: float = 1.0,
        timeout: float = 30.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        dedup_window: int = DEDUP_WINDOW,
    ) -> None:
        self.store = Path(store) if store is not None else None
        self.linger = linger
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.dedup_window = dedup_window
        self.summary = IngestSummary()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()  # trace id + span id
        for key in _stored_span_ids(self.store or _configured_store())[-dedup_window:]:
            self._seen[key] = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._traces: dict[str, list[OtelSpan]] = {}
        self._last: dict[str, float] = {}
        self._rooted: set[str] = set()
        self._written: dict[str, int] = {}

    def add(self, spans: list[OtelSpan]) -> None:
        """Hold ``spans`` until their traces are complete; drop those received already (counted)."""
        now = time.monotonic()
        with self._lock:
            for s in spans:
                if s.span_id:  # a span without id cannot be told from another: kept
                    key = f"{s.trace_id}/{s.span_id}"
                    if key in self._seen:
                        self._seen.move_to_end(key)
                        self.summary.skipped["duplicate_spans"] += 1
                        continue
                    self._seen[key] = None
                    if len(self._seen) > self.dedup_window:
                        self._seen.popitem(last=False)
                self._traces.setdefault(s.trace_id, []).append(s)
                self._last[s.trace_id] = now
                if s.is_root:
                    self._rooted.add(s.trace_id)

    def counts(self) -> dict[str, Any]:
        """What was received so far: spans, chat spans, sessions written and the skips by reason."""
        s = self.summary
        received = {"spans": s.spans, "chat_spans": s.chat_spans, "sessions": s.sessions}
        return {**received, "skipped": dict(s.skipped)}

    async def answer(
        self, receive: Callable[[], Awaitable[dict[str, Any]]], headers: Mapping[str, str]
    ) -> tuple[int, bytes, str]:
        """The answer ``(status, body, media type)`` to a ``POST /v1/traces`` (its ASGI ``receive``, headers).

        The body is read up to ``max_body_bytes`` (then 413, without reading on) and decoded in a worker
        thread (:meth:`receive`), so the server answers other requests meanwhile.
        """
        declared = headers.get("content-length") or ""
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return self.too_large()
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return self.too_large()
            more = message.get("more_body", False)
        ctype, encoding = headers.get("content-type") or "", headers.get("content-encoding") or ""
        return await asyncio.to_thread(self.receive, b"".join(chunks), ctype, encoding)

    def too_large(self) -> tuple[int, bytes, str]:
        """The answer to a body over ``max_body_bytes`` (413), counted as ``oversized_requests``."""
        self.summary.skipped["oversized_requests"] += 1
        return 413, str(BodyTooLarge(self.max_body_bytes)).encode(), "text/plain"

    def receive(self, body: bytes, content_type: str, content_encoding: str = "") -> tuple[int, bytes, str]:
        """Take one OTLP/HTTP export request; return the HTTP answer ``(status, body, media type)``.

        Protobuf or JSON (by ``content_type``), gzip or deflate encoded. A body over ``max_body_bytes`` is
        a 413; undecodable input is a 400 with a one-line reason, counted as ``undecodable_requests``;
        spans that cannot be ingested are named in the answer's ``partial_success``. Nothing is raised.
        """
        ctype = content_type.split(";")[0].strip()
        try:
            spans = spans_from_otlp_http(body, ctype, content_encoding, self.max_body_bytes)
        except BodyTooLarge:
            return self.too_large()
        except Exception as exc:  # undecodable input: the OTLP answer is 400, the receiver goes on
            self.summary.skipped["undecodable_requests"] += 1
            reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
            return 400, f"cannot decode the request: {reason}".encode(), "text/plain"
        # Checked here only to answer; the bad spans are held with the others (their attributes may
        # name the session of their children) and skipped, counted, when their trace is written.
        problems = [p for p in map(span_problem, spans) if p is not None]
        self.add(spans)
        return _answer(ctype, len(problems), problems[0] if problems else "")

    def flush(self, *, force: bool = False) -> int:
        """Write the complete traces (every trace with ``force``); return the sessions written."""
        now = time.monotonic()
        with self._lock:
            ready = [
                t
                for t, last in self._last.items()
                if force or (t in self._rooted and now - last >= self.linger) or now - last >= self.timeout
            ]
            spans = [s for t in ready for s in self._traces.pop(t)]
            for t in ready:
                del self._last[t]
                self._rooted.discard(t)
        if not spans:
            return 0
        with self._write_lock:
            drafts = sessions_from_spans(spans, self.summary)
            for d in drafts:
                n = self._written.get(d.session_id, 0)
                self._written[d.session_id] = n + 1
                if n:
                    d.metadata.setdefault("conversation_id", d.session_id)
                    d.session_id = f"{d.session_id}.{n}"
            write_sessions(drafts, self.store, self.summary)
        return len(drafts)


def _answer(ctype: str, rejected: int, first_problem: str) -> tuple[int, bytes, str]:
    """A 200 ``ExportTraceServiceResponse``, in the request's encoding, with ``partial_success`` if any."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        more = f" (and {rejected - 1} more)" if rejected > 1 else ""
        response.partial_success.error_message = f"{rejected} span(s) rejected: {first_problem}{more}"
    if ctype == "application/json":
        return 200, json_format.MessageToJson(response, indent=None).encode(), "application/json"
    return 200, response.SerializeToString(), "application/x-protobuf"


def _configured_store() -> Path:
    from sdk._tracer import tracer  # the store sdk.configure set (no public getter; see _ingest)

    return Path(tracer.config.store)


def _stored_span_ids(store: Path, budget: int = SEED_BYTES) -> list[str]:
    """``trace id/span id`` of the chat spans in the store's newest segment files, oldest first.

    Reads at most about ``budget`` bytes, and only parses the lines that hold an OTLP span's ids. Best
    effort: a store it cannot read gives what was read so far.
    """
    ids: list[str] = []
    try:
        files = sorted(
            (f for f in store.glob("*.jsonl") if f.is_file()), key=lambda f: f.stat().st_mtime, reverse=True
        )
        chosen, size = [], 0
        for f in files:
            if size >= budget:
                break
            chosen.append(f)
            size += f.stat().st_size
        for f in reversed(chosen):
            with f.open("rb") as fh:
                for line in fh:
                    if b'"otel":{"trace_id"' not in line:
                        continue
                    try:
                        otel = json.loads(line)["extra"]["otel"]
                        ids.append(f"{otel['trace_id']}/{otel['span_id']}")
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn or foreign line: nothing to remember
    except OSError:
        pass
    return ids
