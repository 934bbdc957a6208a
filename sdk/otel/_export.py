"""Episodes -> OpenTelemetry traces with the GenAI semantic conventions, through the OTel SDK.

One trace per episode: an ``invoke_agent`` root span, one ``chat`` span per call (its request in
``gen_ai.input.messages``, its response in ``gen_ai.output.messages``, tools, model, usage, finish
reason), ``execute_tool`` spans where the store has tool timings, and each named reward as a
``gen_ai.evaluation.result`` event on the root. Token ids and logprobs go under ``tracerl.*`` and only
when asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

from sdk._sources import SourcedEpisode, episode_metadata, episodes_with_calls
from sdk.otel._messages import to_output_parts, to_parts, tools_to_definitions

__all__ = ["OtlpExportSummary", "export_otlp", "make_exporter", "record_episode"]

_NS = 1_000_000_000
_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


@dataclasses.dataclass
class OtlpExportSummary:
    """What an export sent.

    Attributes:
        episodes: Episodes exported (one trace each).
        spans: Spans the exporter accepted.
        failed_spans: Spans the exporter reported as failed (endpoint down, rejected).
        skipped: Counts of what was left out, by reason.

    Example:
        >>> OtlpExportSummary(episodes=2, spans=7).format_line()
        'episodes 2, spans 7 sent, 0 failed'
    """

    episodes: int = 0
    spans: int = 0
    failed_spans: int = 0
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)

    def format_line(self) -> str:
        """One line for a CLI."""
        line = f"episodes {self.episodes}, spans {self.spans} sent, {self.failed_spans} failed"
        if self.skipped:
            line += "; skipped: " + ", ".join(f"{k} {v}" for k, v in self.skipped.most_common())
        return line


def _ns(t: Any, default: float) -> int:
    return int((t if isinstance(t, (int, float)) and not isinstance(t, bool) else default) * _NS)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _numbers(values: Any, kind: type) -> list[Any] | None:
    """A homogeneous list for an OTel array attribute, or ``None`` when a value is missing or odd."""
    if not isinstance(values, list) or not values:
        return None
    out = []
    for v in values:
        if isinstance(v, dict):
            v = v.get("logprob")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        out.append(kind(v))
    return out


def _token_attrs(
    ids: Any, logprobs: Any, prompt_ids: Any, tokens: Any, skipped: Counter[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, values, kind in (
        ("tracerl.completion_token_ids", ids, int),
        ("tracerl.logprobs", logprobs, float),
        ("tracerl.prompt_token_ids", prompt_ids, int),
    ):
        if values is None:
            continue
        checked = _numbers(values, kind)
        if checked is None:
            skipped[f"{key}_not_numeric"] += 1
        else:
            out[key] = checked
    if isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens):
        out["tracerl.completion_tokens"] = tokens
    return out


@dataclasses.dataclass
class _ChatCall:
    messages: list[dict[str, Any]]
    response: dict[str, Any] | None
    start: int
    end: int
    model: Any = None
    response_model: Any = None
    finish_reason: Any = None
    usage: Any = None
    params: Any = None
    error: Any = None
    call_id: Any = None
    tools: Any = None
    token: dict[str, Any] = dataclasses.field(default_factory=dict)
    tool_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _calls_from_store(se: SourcedEpisode, token_data: bool, skipped: Counter[str]) -> list[_ChatCall]:
    out = []
    now = time.time()
    for c in se.calls or ():
        req = c.get("request") or {}
        resp = c.get("response") or {}
        t0 = c.get("started_at")
        token: dict[str, Any] = {}
        if token_data:
            entries = c.get("logprobs")
            tokens = (
                [e.get("token") for e in entries if isinstance(e, dict)]
                if isinstance(entries, list)
                else None
            )
            token = _token_attrs(
                c.get("completion_token_ids"), entries, c.get("prompt_token_ids"), tokens, skipped
            )
        extra = c.get("extra") if isinstance(c.get("extra"), dict) else {}
        out.append(
            _ChatCall(
                messages=req.get("messages") or [],
                response=resp.get("message"),
                start=_ns(t0, now),
                end=_ns(c.get("ended_at"), t0 if isinstance(t0, (int, float)) else now),
                model=c.get("model"),
                response_model=c.get("response_model"),
                finish_reason=resp.get("finish_reason"),
                usage=c.get("usage"),
                params=req.get("params"),
                error=c.get("error"),
                call_id=c.get("call_id"),
                tools=req.get("tools"),
                token=token,
                tool_runs=[r for r in extra.get("tool_executions") or () if isinstance(r, dict)],
            )
        )
    return out


def _calls_from_episode(ep: dict[str, Any], token_data: bool, skipped: Counter[str]) -> list[_ChatCall]:
    """One chat span per assistant turn the thread generated (context turns are input, not calls)."""
    meta = episode_metadata(ep)
    context = set((meta.get("tracerl") or {}).get("context_assistant_messages") or ())
    messages = ep.get("messages") or []
    turns = {t.get("message_index"): t for t in ep.get("turns") or () if isinstance(t, dict)}
    generated = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i not in context]
    now = time.time()
    t0 = ep.get("started_at") if isinstance(ep.get("started_at"), (int, float)) else now
    t1 = ep.get("ended_at") if isinstance(ep.get("ended_at"), (int, float)) else t0
    # The episode keeps only its first start and last end: the calls share that span evenly (marked).
    step = (t1 - t0) / max(len(generated), 1)
    tools = json.loads(ep["tools"]) if isinstance(ep.get("tools"), str) and ep["tools"] else None
    out = []
    for k, i in enumerate(generated):
        turn = turns.get(i) or {}
        token = (
            _token_attrs(
                turn.get("token_ids"), turn.get("logprobs"), turn.get("prompt_token_ids"), None, skipped
            )
            if token_data
            else {}
        )
        out.append(
            _ChatCall(
                messages=[{k2: v for k2, v in m.items() if v is not None} for m in messages[:i]],
                response={k2: v for k2, v in messages[i].items() if v is not None},
                start=_ns(t0 + k * step, now),
                end=_ns(t0 + (k + 1) * step, now),
                model=ep.get("model"),
                finish_reason=(meta.get("tracerl") or {}).get("finish_reason")
                if k == len(generated) - 1
                else None,
                tools=tools or None,
                token=token,
            )
        )
    return out


def _tool_spans(tracer: Any, ctx: Any, call: _ChatCall, trace_mod: Any) -> int:
    """``execute_tool`` spans for the tool runs whose results this call's request carries."""
    args: dict[Any, Any] = {}
    results: dict[Any, Any] = {}
    for m in call.messages:
        for tc in m.get("tool_calls") or ():
            args[tc.get("id")] = (tc.get("function") or {}).get("arguments")
        if m.get("role") == "tool":
            results[m.get("tool_call_id")] = m.get("content")
    n = 0
    for run in call.tool_runs:
        started, duration = run.get("started_at"), run.get("duration_s")
        if not isinstance(started, (int, float)):
            continue
        name = run.get("name") or "tool"
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": str(name),
            "gen_ai.tool.type": "function",
        }
        tc_id = run.get("tool_call_id")
        if tc_id is not None:
            attrs["gen_ai.tool.call.id"] = str(tc_id)
            if args.get(tc_id) is not None:
                attrs["gen_ai.tool.call.arguments"] = str(args[tc_id])
            if results.get(tc_id) is not None:
                r = results[tc_id]
                attrs["gen_ai.tool.call.result"] = r if isinstance(r, str) else _dumps(r)
        span = tracer.start_span(
            f"execute_tool {name}",
            context=ctx,
            kind=trace_mod.SpanKind.INTERNAL,
            attributes=attrs,
            start_time=_ns(started, 0),
        )
        error = run.get("error")
        if isinstance(error, dict):
            span.set_attribute("error.type", str(error.get("type") or "error"))
            span.set_status(trace_mod.Status(trace_mod.StatusCode.ERROR, str(error.get("message") or "")))
        end = started + duration if isinstance(duration, (int, float)) else started
        span.end(end_time=_ns(end, 0))
        n += 1
    return n


def _chat_attrs(call: _ChatCall, conversation: str) -> dict[str, Any]:
    a: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": conversation}
    if call.model is not None:
        a["gen_ai.request.model"] = str(call.model)
    if call.response_model is not None:
        a["gen_ai.response.model"] = str(call.response_model)
    a["gen_ai.input.messages"] = _dumps([to_parts(m) for m in call.messages if isinstance(m, dict)])
    if call.response is not None:
        a["gen_ai.output.messages"] = _dumps([to_output_parts(call.response, call.finish_reason)])
    if call.finish_reason:
        a["gen_ai.response.finish_reasons"] = [str(call.finish_reason)]
    definitions = tools_to_definitions(call.tools)
    if definitions:
        a["gen_ai.tool.definitions"] = _dumps(definitions)
    usage = call.usage if isinstance(call.usage, dict) else {}
    for key, attr in (
        ("prompt_tokens", "gen_ai.usage.input_tokens"),
        ("completion_tokens", "gen_ai.usage.output_tokens"),
    ):
        if isinstance(usage.get(key), int) and not isinstance(usage.get(key), bool):
            a[attr] = usage[key]
    for key, attr in _PARAMS.items():
        v = (call.params or {}).get(key) if isinstance(call.params, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            a[attr] = v
    stop = (call.params or {}).get("stop") if isinstance(call.params, dict) else None
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and stop:
        a["gen_ai.request.stop_sequences"] = stop
    if isinstance(call.call_id, str):
        a["tracerl.call_id"] = call.call_id
    a.update(call.token)
    return a


def _root_attrs(ep: dict[str, Any], session_id: str) -> dict[str, Any]:
    """The ``invoke_agent`` span's attributes (GenAI semantic conventions and ``tracerl.*``)."""
    meta = episode_metadata(ep)
    agent = ep.get("agent")
    root_attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": session_id,
        "tracerl.session_id": session_id,
        "tracerl.episode_id": str(ep.get("episode_id")),
        "tracerl.status": str(ep.get("status") or "ok"),
        "tracerl.token_faithful": bool(ep.get("token_faithful")),
        "tracerl.metadata": _dumps({k: v for k, v in meta.items() if k != "tracerl"}),
    }
    if agent:
        root_attrs["gen_ai.agent.name"] = str(agent)
    if ep.get("model"):
        root_attrs["gen_ai.request.model"] = str(ep["model"])
    if ep.get("task_id") is not None:
        root_attrs["tracerl.task_id"] = str(ep["task_id"])
    if isinstance(ep.get("sample"), int):
        root_attrs["tracerl.sample"] = ep["sample"]
    if isinstance(ep.get("thread"), int):
        root_attrs["tracerl.thread"] = ep["thread"]
    if isinstance(ep.get("reward"), (int, float)):
        root_attrs["tracerl.reward"] = float(ep["reward"])
    usage = ep.get("usage") if isinstance(ep.get("usage"), dict) else {}
    if isinstance(usage.get("prompt_tokens"), int):
        root_attrs["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
        root_attrs["gen_ai.usage.output_tokens"] = usage.get("completion_tokens") or 0
    definitions = tools_to_definitions(
        json.loads(ep["tools"]) if isinstance(ep.get("tools"), str) else ep.get("tools")
    )
    if definitions:
        root_attrs["gen_ai.tool.definitions"] = _dumps(definitions)
    return root_attrs


def record_episode(
    tracer: Any, se: SourcedEpisode, *, token_data: bool = False, skipped: Counter[str] | None = None
) -> int:
    """Record one episode as one trace with ``tracer`` (an OpenTelemetry SDK tracer); return its spans.

    Args:
        tracer: ``TracerProvider.get_tracer(...)``.
        se: The episode, with its calls when read from a store (see ``sdk._sources.episodes_with_calls``).
        token_data: Also write token ids / logprobs under ``tracerl.*``.
        skipped: Counts what was left out.

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> ep = {"episode_id": "s1:0", "session_id": "s1", "messages": [
        ...     {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        >>> record_episode(TracerProvider().get_tracer("t"), SourcedEpisode(ep))
        2
    """
    from opentelemetry import context as context_api
    from opentelemetry import trace as trace_mod

    skipped = skipped if skipped is not None else Counter()
    ep = se.episode
    calls = (
        _calls_from_store(se, token_data, skipped)
        if se.calls is not None
        else _calls_from_episode(ep, token_data, skipped)
    )
    now = time.time()
    session_id = str(ep.get("session_id") or ep.get("episode_id") or "")
    start = min([_ns(ep.get("started_at"), now)] + [c.start for c in calls])
    end = max([_ns(ep.get("ended_at"), now if not calls else 0)] + [c.end for c in calls])
    agent = ep.get("agent")
    root_attrs = _root_attrs(ep, session_id)
    root = tracer.start_span(
        f"invoke_agent {agent}" if agent else "invoke_agent",
        context=context_api.Context(),  # a new trace, whatever the caller has open
        kind=trace_mod.SpanKind.INTERNAL,
        attributes=root_attrs,
        start_time=start,
    )
    ctx = trace_mod.set_span_in_context(root)
    n = 1
    for call in calls:
        n += _tool_spans(tracer, ctx, call, trace_mod)
        span = tracer.start_span(
            f"chat {call.model}" if call.model else "chat",
            context=ctx,
            kind=trace_mod.SpanKind.CLIENT,
            attributes=_chat_attrs(call, session_id),
            start_time=call.start,
        )
        if se.calls is None:
            span.set_attribute("tracerl.timing_estimated", True)
        if isinstance(call.error, dict):
            span.set_attribute("error.type", str(call.error.get("type") or "error"))
            span.set_status(
                trace_mod.Status(trace_mod.StatusCode.ERROR, str(call.error.get("message") or ""))
            )
        span.end(end_time=max(call.end, call.start))
        n += 1
    for r in ep.get("rewards") or ():
        if isinstance(r, dict) and isinstance(r.get("value"), (int, float)):
            root.add_event(
                "gen_ai.evaluation.result",
                {
                    "gen_ai.evaluation.name": str(r.get("name")),
                    "gen_ai.evaluation.score.value": float(r["value"]),
                },
                timestamp=end,
            )
    if ep.get("status") == "error":
        root.set_status(trace_mod.Status(trace_mod.StatusCode.ERROR, "session error"))
    root.end(end_time=end)
    return n


def make_exporter(
    endpoint: str,
    protocol: str = "http",
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Any:
    """An OTLP span exporter of the OpenTelemetry SDK for ``endpoint``.

    ``http``: an endpoint without a path gets ``/v1/traces``. ``grpc``: ``http://`` means insecure.
    ``headers=None`` lets the exporter read ``OTEL_EXPORTER_OTLP_HEADERS``.

    Example:
        >>> make_exporter("http://127.0.0.1:6006")._endpoint
        'http://127.0.0.1:6006/v1/traces'
    """
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint if urlparse(endpoint).path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        return GrpcExporter(
            endpoint=parsed.netloc, insecure=parsed.scheme != "https", headers=headers, timeout=timeout
        )
    raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")


def _processor(exporter: Any, summary: OtlpExportSummary, batch: int) -> Any:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExportResult

    class _SyncBatch(SpanProcessor):
        """Exports every ``batch`` ended spans on the caller's thread.

        The SDK's BatchSpanProcessor drops spans once its queue is full; a bulk export produces spans
        faster than any endpoint takes them, so this one waits instead and counts each failure.
        """

        def __init__(self) -> None:
            self.pending: list[Any] = []

        def on_end(self, span: Any) -> None:
            self.pending.append(span)
            if len(self.pending) >= batch:
                self.force_flush()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            spans, self.pending = self.pending, []
            if not spans:
                return True
            ok = exporter.export(spans) == SpanExportResult.SUCCESS
            if ok:
                summary.spans += len(spans)
            else:
                summary.failed_spans += len(spans)
            return ok

        def shutdown(self) -> None:
            self.force_flush()
            exporter.shutdown()

    return _SyncBatch()


def export_otlp(
    source: str | os.PathLike[str] | Iterable[SourcedEpisode],
    endpoint: str | None = None,
    *,
    protocol: str = "http",
    token_data: bool = False,
    headers: dict[str, str] | None = None,
    service_name: str = "tracerl",
    resource_attributes: dict[str, Any] | None = None,
    exporter: Any = None,
    batch_size: int = 256,
) -> OtlpExportSummary:
    """Export the episodes of a store or Parquet file as OTLP traces (one per episode).

    Args:
        source: A store directory, an episode Parquet file, or ``SourcedEpisode`` objects.
        endpoint: The OTLP endpoint, e.g. ``http://127.0.0.1:6006/v1/traces`` (Phoenix) or
            ``https://cloud.langfuse.com/api/public/otel/v1/traces`` (Langfuse, with an Authorization header).
        protocol: ``http`` (OTLP/HTTP protobuf) or ``grpc``.
        token_data: Also export token ids and logprobs (``tracerl.completion_token_ids``,
            ``tracerl.logprobs``, ``tracerl.prompt_token_ids``, ``tracerl.completion_tokens``). Off by
            default: they are large and no viewer shows them.
        headers: Extra request headers (e.g. authorization); default ``OTEL_EXPORTER_OTLP_HEADERS``.
        service_name: The ``service.name`` resource attribute.
        resource_attributes: More resource attributes (e.g. ``{"openinference.project.name": "rl"}``).
        exporter: Any OpenTelemetry ``SpanExporter`` instead of an OTLP one (``endpoint`` is then unused).
        batch_size: Spans per export request.

    Returns:
        An :class:`OtlpExportSummary`; ``failed_spans`` counts what the endpoint did not take.

    Example:
        >>> s = export_otlp("traces", "http://127.0.0.1:6006/v1/traces")  # doctest: +SKIP
        >>> s.format_line()  # doctest: +SKIP
        'episodes 96, spans 412 sent, 0 failed'
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if exporter is None:
        if not endpoint:
            raise ValueError("an OTLP endpoint (or an exporter) is needed")
        exporter = make_exporter(endpoint, protocol, headers=headers)
    summary = OtlpExportSummary()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, **(resource_attributes or {})})
    )
    provider.add_span_processor(_processor(exporter, summary, batch_size))
    tracer = provider.get_tracer("tracerl.otel")
    episodes: Iterable[SourcedEpisode] = (
        episodes_with_calls(source) if isinstance(source, (str, os.PathLike)) else source
    )
    try:
        for se in episodes:
            record_episode(tracer, se, token_data=token_data, skipped=summary.skipped)
            summary.episodes += 1
    finally:
        provider.shutdown()
    return summary


def _parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"a header is KEY=VALUE, got {p!r}")
        out[key.strip()] = value.strip()
    return out
