"""An OTLP/HTTP trace receiver (``POST /v1/traces``) that writes GenAI chat spans into a store.

A standalone fastapi app. Spans are held per trace until the trace's root span has arrived (it ends,
and so is exported, last) and nothing new came for ``linger`` seconds, or for ``timeout`` seconds
without a root; then the trace's chat spans are written as calls. Everything still held is written at
shutdown. A session is written once: a conversation whose traces are written at different times gets
one session per write (``<id>.1``, ``<id>.2``, ...; the conversation id is in the metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import threading
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

# At module level: fastapi resolves the endpoints' (string) annotations in this module's globals.
from fastapi import FastAPI, Request, Response

from sdk.otel._ingest import (
    IngestSummary,
    OtelSpan,
    read_otlp_json,
    sessions_from_spans,
    spans_from_request,
    write_sessions,
)

__all__ = ["SpanCollector", "create_app"]

logger = logging.getLogger("tracerl")


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


def _decode_body(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


def create_app(
    store: str | os.PathLike[str], *, linger: float = 1.0, timeout: float = 30.0, poll: float = 0.5
) -> Any:
    """The fastapi app: ``POST /v1/traces`` (OTLP protobuf or JSON), ``GET /healthz``.

    It configures this process to record into ``store`` (``sdk.configure``): the app is meant to be its
    own process (``python -m sdk.otel receive``).

    Example:
        >>> app = create_app("traces")  # doctest: +SKIP
        >>> import uvicorn; uvicorn.run(app, port=4318)  # doctest: +SKIP
    """
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    import sdk

    sdk.configure(store=store, enabled=True)
    collector = SpanCollector(None, linger=linger, timeout=timeout)

    async def _flusher() -> None:
        while True:
            await asyncio.sleep(poll)
            try:
                await asyncio.to_thread(collector.flush)
            except Exception:  # a bad batch must not stop the receiver: logged, the next ones go on
                logger.exception("tracerl: the OTLP receiver could not write a batch")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(_flusher())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            collector.flush(force=True)
            logger.warning("tracerl: OTLP receiver wrote %s", collector.summary.format_line())

    app = FastAPI(title="tracerl OTLP receiver", lifespan=lifespan)
    app.state.collector = collector

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        s = collector.summary
        return {"ok": True, "spans": s.spans, "chat_spans": s.chat_spans, "sessions": s.sessions}

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        ctype = (request.headers.get("content-type") or "").split(";")[0].strip()
        try:
            body = _decode_body(await request.body(), request.headers.get("content-encoding", ""))
            if ctype == "application/json":
                spans = read_otlp_json(body)
            else:
                spans = spans_from_request(ExportTraceServiceRequest.FromString(body))
        except Exception as exc:  # undecodable input: the OTLP answer is 400, the receiver goes on
            collector.summary.skipped["undecodable_requests"] += 1
            return Response(
                f"cannot decode the request: {str(exc).splitlines()[0] if str(exc) else exc!r}", 400
            )
        collector.add(spans)
        if ctype == "application/json":
            return Response("{}", media_type="application/json")
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    return app
