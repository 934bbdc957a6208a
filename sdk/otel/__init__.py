"""OpenTelemetry GenAI spans out of and into tracerl.

Export episodes (a store or an episode Parquet file) as OTLP traces any GenAI-aware backend shows
(Arize Phoenix, Langfuse, MLflow): one trace per episode, an ``invoke_agent`` root, a ``chat`` span per
call, ``execute_tool`` spans, rewards as ``gen_ai.evaluation.result`` events. Ingest GenAI chat spans
(a file of OTLP/JSON, or live through the OTLP/HTTP receiver) into a store as calls, so that episodes
can be built from any instrumented agent. Needs ``pip install 'tracerl[otel]'``.

Example:
    >>> from sdk.otel import export_otlp, ingest_file
    >>> export_otlp("traces", "http://127.0.0.1:6006/v1/traces")  # doctest: +SKIP
    >>> ingest_file("spans.json", store="traces")  # doctest: +SKIP

CLI: ``python -m sdk.otel export|ingest|receive --help``.
"""

from __future__ import annotations

from sdk.otel._export import OtlpExportSummary, export_otlp, make_exporter, record_episode
from sdk.otel._ingest import (
    IngestSummary,
    OtelSpan,
    SessionDraft,
    ingest_file,
    read_otlp_json,
    sessions_from_spans,
    spans_from_request,
    write_sessions,
)

__all__ = [
    "IngestSummary",
    "OtelSpan",
    "OtlpExportSummary",
    "SessionDraft",
    "export_otlp",
    "ingest_file",
    "make_exporter",
    "read_otlp_json",
    "record_episode",
    "sessions_from_spans",
    "spans_from_request",
    "write_sessions",
]
