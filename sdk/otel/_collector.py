"""Hold OTLP spans per trace until the trace is complete, then write its GenAI chat spans into a store.

Shared by the standalone receiver (``python -m sdk.otel receive``) and the gateway's ``POST /v1/traces``
(``python -m sdk.gateway --otlp``). No web framework here; OpenTelemetry's protobuf package is imported
when a protobuf request arrives.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sdk.otel._ingest import (
    IngestSummary,
    OtelSpan,
    sessions_from_spans,
    spans_from_otlp_http,
    write_sessions,
)

__all__ = ["SpanCollector"]


class SpanCollector:
    """Holds spans by trace until the trace is complete, then writes its sessions into ``store``.

    ``store=None`` writes into the store this process is configured with (``sdk.configure``).

    Example:
        >>> import tempfile
        >>> c = SpanCollector(tempfile.mkdtemp())
        >>> c.add([]); c.flush(force=True)
        0
    """

    def __init__(
        self, store: str | os.PathLike[str] | None, *, linger: float = 1.0, timeout: float = 30.0
    ) -> None:
        self.store = Path(store) if store is not None else None
        self.linger = linger
        self.timeout = timeout
        self.summary = IngestSummary()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._traces: dict[str, list[OtelSpan]] = {}
        self._last: dict[str, float] = {}
        self._rooted: set[str] = set()
        self._written: dict[str, int] = {}

    def add(self, spans: list[OtelSpan]) -> None:
        """Hold ``spans`` until their traces are complete."""
        now = time.monotonic()
        with self._lock:
            for s in spans:
                self._traces.setdefault(s.trace_id, []).append(s)
                self._last[s.trace_id] = now
                if s.is_root:
                    self._rooted.add(s.trace_id)

    def receive(self, body: bytes, content_type: str, content_encoding: str = "") -> tuple[int, bytes, str]:
        """Take one OTLP/HTTP export request; return the HTTP answer ``(status, body, media type)``.

        Protobuf or JSON (by ``content_type``), gzip or deflate encoded. Undecodable input is a 400 with a
        one-line reason, counted as ``undecodable_requests``; nothing is raised.
        """
        ctype = content_type.split(";")[0].strip()
        try:
            spans = spans_from_otlp_http(body, ctype, content_encoding)
        except Exception as exc:  # undecodable input: the OTLP answer is 400, the receiver goes on
            self.summary.skipped["undecodable_requests"] += 1
            reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
            return 400, f"cannot decode the request: {reason}".encode(), "text/plain"
        self.add(spans)
        if ctype == "application/json":
            return 200, b"{}", "application/json"
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        return 200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"

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
