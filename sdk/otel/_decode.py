"""OTLP trace export requests (OTLP/HTTP bodies, protobuf messages, OTLP/JSON files) -> :class:`OtelSpan`.

Bodies are decompressed a bounded piece at a time (:mod:`sdk._decompress`), so a gzip bomb costs at most
the configured limit. Both encodings are decoded with ``opentelemetry-proto`` (imported when needed).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import Any

from sdk._decompress import BodyTooLarge, decompress

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "OtelSpan",
    "read_otlp_json",
    "spans_from_otlp_http",
    "spans_from_request",
]

DEFAULT_MAX_BODY_BYTES = 64 << 20
"""The most bytes an OTLP/HTTP request body may hold, before and after decompression (64 MiB)."""


@dataclasses.dataclass
class OtelSpan:
    """One decoded span: ids as hex, times in Unix seconds, attributes as plain Python values.

    Example:
        >>> OtelSpan("ab" * 16, "cd" * 8, None, "chat", 0.0, 1.0).is_root
        True
    """

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: float
    end: float
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    events: list[tuple[str, float, dict[str, Any]]] = dataclasses.field(default_factory=list)
    error: str | None = None  # the status description when the status is ERROR

    @property
    def is_root(self) -> bool:
        """Whether the span has no parent (a trace's root arrives last: it ends last)."""
        return not self.parent_id


# ---------------------------------------------------------------------------------------------
# Decoding OTLP
# ---------------------------------------------------------------------------------------------


def spans_from_otlp_http(
    body: bytes,
    content_type: str,
    content_encoding: str = "",
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> list[OtelSpan]:
    """Decode the body of an OTLP/HTTP ``/v1/traces`` request (protobuf or JSON, gzip/deflate) into spans.

    Args:
        body: The request body as received.
        content_type: ``application/json`` or ``application/x-protobuf``.
        content_encoding: ``gzip``, ``deflate`` or empty.
        max_bytes: The most bytes the body may hold, compressed or decompressed.

    Raises:
        BodyTooLarge: The body (or what it decompresses to) is over ``max_bytes``.
        Exception: Whatever the decoders raise on a bad body (a corrupt compressed body, JSON,
            protobuf's ``DecodeError``);
            the receivers answer those with a 400.

    Example:
        >>> spans_from_otlp_http(b'{"resourceSpans": []}', "application/json")
        []
    """
    if len(body) > max_bytes:
        raise BodyTooLarge(max_bytes)
    decoded = decompress(body, content_encoding, max_bytes)
    if decoded is None:
        encoding = content_encoding.strip().lower()
        raise ValueError(f"unsupported Content-Encoding {encoding!r} (gzip or deflate)")
    body = decoded
    if content_type.split(";")[0].strip() == "application/json":
        return read_otlp_json(body)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return spans_from_request(ExportTraceServiceRequest.FromString(body))


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return getattr(v, kind)


def _attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def spans_from_request(request: Any) -> list[OtelSpan]:
    """The spans of an ``ExportTraceServiceRequest`` (protobuf message) as :class:`OtelSpan`.

    Spans without a trace id get one made up for this request: the id-less spans of two requests (two
    clients) never fall into one trace, and so never into one session.

    Example:
        >>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        >>> spans_from_request(ExportTraceServiceRequest())
        []
    """
    out = []
    no_trace_id = ""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                trace_id = sp.trace_id.hex()
                if not trace_id:
                    no_trace_id = no_trace_id or uuid.uuid4().hex
                    trace_id = no_trace_id
                out.append(
                    OtelSpan(
                        trace_id=trace_id,
                        span_id=sp.span_id.hex(),
                        parent_id=sp.parent_span_id.hex() or None,
                        name=sp.name,
                        start=sp.start_time_unix_nano / 1e9,
                        end=sp.end_time_unix_nano / 1e9,
                        attributes=_attrs(sp.attributes),
                        events=[(e.name, e.time_unix_nano / 1e9, _attrs(e.attributes)) for e in sp.events],
                        error=(sp.status.message or "error") if sp.status.code == 2 else None,
                    )
                )
    return out


def _hex_to_b64(obj: dict[str, Any], key: str) -> None:
    value = obj.get(key)
    if isinstance(value, str) and value:
        try:
            obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
        except ValueError:
            pass  # already base64 (protobuf's own JSON mapping)


def _request_from_json(data: Any) -> Any:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    # OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64 for bytes.
    for rs in data.get("resourceSpans") or data.get("resource_spans") or ():
        for ss in rs.get("scopeSpans") or rs.get("scope_spans") or ():
            for sp in ss.get("spans") or ():
                for key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
                    _hex_to_b64(sp, key)
                for link in sp.get("links") or ():
                    for key in ("traceId", "spanId", "trace_id", "span_id"):
                        _hex_to_b64(link, key)
    return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)


def read_otlp_json(data: bytes | str) -> list[OtelSpan]:
    """Spans of OTLP/JSON: one ``{"resourceSpans": [...]}`` document or JSON lines of them.

    Raises ``ValueError`` when the text is neither.

    Example:
        >>> read_otlp_json('{"resourceSpans": []}')
        []
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        docs = [json.loads(text)]
    except ValueError:
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise ValueError(f"not OTLP/JSON: {exc}") from None
    spans: list[OtelSpan] = []
    for doc in docs:
        if not isinstance(doc, dict) or not ("resourceSpans" in doc or "resource_spans" in doc):
            raise ValueError("not OTLP/JSON: no resourceSpans")
        try:
            spans.extend(spans_from_request(_request_from_json(doc)))
        except Exception as exc:  # json_format.ParseError and friends: one line, not a traceback
            raise ValueError(f"not OTLP/JSON: {str(exc).splitlines()[0]}") from None
    return spans
