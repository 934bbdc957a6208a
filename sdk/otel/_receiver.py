"""An OTLP/HTTP trace receiver (``POST /v1/traces``) that writes GenAI chat spans into a store.

A standalone fastapi app (the gateway serves the same route with ``--otlp``). Spans are held per trace
(:class:`~sdk.otel._collector.SpanCollector`) until the trace's root span has arrived (it ends, and so is
exported, last) and nothing new came for ``linger`` seconds, or for ``timeout`` seconds without a root; then
the trace's chat spans are written as calls. Everything still held is written at shutdown. A session is
written once: a conversation whose traces are written at different times gets one session per write
(``<id>.1``, ``<id>.2``, ...; the conversation id is in the metadata).

A body is read up to ``max_body_bytes`` (then 413, without reading on) and decoded in a worker thread, so
``/healthz`` answers while a large request is decoded (:meth:`~sdk.otel._collector.SpanCollector.answer`,
which the gateway's route is too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

# At module level: fastapi resolves the endpoints' (string) annotations in this module's globals.
from fastapi import FastAPI, Request, Response

from sdk.otel._collector import SpanCollector
from sdk.otel._decode import DEFAULT_MAX_BODY_BYTES

__all__ = ["SpanCollector", "create_app"]

logger = logging.getLogger("tracerl")


def create_app(
    store: str | os.PathLike[str],
    *,
    linger: float = 1.0,
    timeout: float = 30.0,
    poll: float = 0.5,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Any:
    """The fastapi app: ``POST /v1/traces`` (OTLP protobuf or JSON), ``GET /healthz``.

    It configures this process to record into ``store`` (``sdk.configure``): the app is meant to be its
    own process (``python -m sdk.otel receive``).

    Example:
        >>> app = create_app("traces")  # doctest: +SKIP
        >>> import uvicorn; uvicorn.run(app, port=4318)  # doctest: +SKIP
    """
    import sdk

    sdk.configure(store=store, enabled=True)
    collector = SpanCollector(None, linger=linger, timeout=timeout, max_body_bytes=max_body_bytes)

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
        return {"ok": True, **collector.counts()}

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        status, data, media_type = await collector.answer(request.receive, request.headers)
        return Response(data, status, media_type=media_type)

    return app
