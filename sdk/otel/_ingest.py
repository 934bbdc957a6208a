"""GenAI chat spans -> tracerl calls, grouped into sessions by ``gen_ai.conversation.id`` or trace.

Reads the three ways instrumentations record a chat call: the current attributes
(``gen_ai.input.messages`` / ``gen_ai.output.messages``, also inside
``gen_ai.client.inference.operation.details`` span events), the older per-message span events
(``gen_ai.user.message`` ... ``gen_ai.choice``) and OpenLLMetry's flat ``gen_ai.prompt.{i}.*``
attributes. Spans arrive as OTLP protobuf (the receiver) or OTLP JSON (files), decoded by
:mod:`sdk.otel._decode` (its names are re-exported here).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sdk.otel._decode import (
    DEFAULT_MAX_BODY_BYTES,
    OtelSpan,
    read_otlp_json,
    spans_from_otlp_http,
    spans_from_request,
)
from sdk.otel._messages import (
    FINISH_REASONS,
    flat_messages,
    flat_tools,
    from_parts,
    from_value,
    tools_from_definitions,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "IngestSummary",
    "OtelSpan",
    "SessionDraft",
    "ingest_file",
    "read_otlp_json",
    "sessions_from_spans",
    "spans_from_otlp_http",
    "span_problem",
    "spans_from_request",
    "write_sessions",
]

logger = logging.getLogger("tracerl")

_CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_PARAMS = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.presence_penalty": "presence_penalty",
}
# Keys session() takes as arguments, not metadata.
_RESERVED = frozenset({"task_id", "sample", "session_id"})


@dataclasses.dataclass
class IngestSummary:
    """What an ingest read and wrote.

    Attributes:
        spans: Spans read.
        chat_spans: Chat spans turned into calls.
        sessions: Sessions written.
        text_only_sessions: Sessions without token data (``metadata.text_only``).
        skipped: Counts of what could not be used, by reason.

    Example:
        >>> IngestSummary().format_line()
        'spans 0, chat spans 0, sessions 0 (0 text-only)'
    """

    spans: int = 0
    chat_spans: int = 0
    sessions: int = 0
    text_only_sessions: int = 0
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)

    def format_line(self) -> str:
        """One line for a CLI."""
        line = (
            f"spans {self.spans}, chat spans {self.chat_spans}, sessions {self.sessions} "
            f"({self.text_only_sessions} text-only)"
        )
        if self.skipped:
            line += "; skipped: " + ", ".join(f"{k} {v}" for k, v in self.skipped.most_common())
        return line


@dataclasses.dataclass
class SessionDraft:
    """A session to write: its calls (``CallRecord`` keyword arguments) in time order and its rewards.

    Example:
        >>> SessionDraft("s1").text_only
        True
    """

    session_id: str
    task_id: str | None = None
    sample: int | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rewards: list[tuple[str, float, str | None]] = dataclasses.field(default_factory=list)

    @property
    def text_only(self) -> bool:
        """No call carries token ids or logprobs."""
        return not any(c.get("completion_token_ids") or c.get("logprobs") for c in self.calls)


# ---------------------------------------------------------------------------------------------
# Spans -> calls
# ---------------------------------------------------------------------------------------------


def _chat_kind(span: OtelSpan) -> bool:
    a = span.attributes
    op = a.get("gen_ai.operation.name")
    if op is not None:
        return op in _CHAT_OPERATIONS
    if a.get("llm.request.type") in ("chat", "completion") or "gen_ai.prompt.0.role" in a:
        return True
    return "gen_ai.input.messages" in a or "gen_ai.output.messages" in a


def _details(span: OtelSpan) -> dict[str, Any]:
    """Span attributes merged with those of its ``operation.details`` events (Strands puts them there)."""
    merged = dict(span.attributes)
    for name, _, attrs in span.events:
        if name == _DETAILS_EVENT:
            merged.update(attrs)
    return merged


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
        except RecursionError:  # not a ValueError: without this, one span would stop a whole flush
            raise ValueError("JSON nested too deep") from None
    return value


def _system_messages(value: Any) -> list[dict[str, Any]]:
    parts = _json(value)
    if isinstance(parts, str):
        return [{"role": "system", "content": parts}]
    out = []
    for p in parts if isinstance(parts, list) else ():
        if isinstance(p, dict) and p.get("type") == "text":
            out.append({"role": "system", "content": str(p.get("content") or "")})
    return out


def _messages(
    a: dict[str, Any], span: OtelSpan
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """(request messages, response message, finish reason) from whichever form the span uses."""
    finish = None
    reasons = a.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, list) and reasons:
        finish = str(reasons[0])
    elif isinstance(reasons, str):
        finish = reasons
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        messages = _system_messages(a.get("gen_ai.system_instructions"))
        for m in _json(a.get("gen_ai.input.messages")) or ():
            if isinstance(m, dict):
                messages.extend(from_parts(m))
        response = None
        for m in _json(a.get("gen_ai.output.messages")) or ():
            if isinstance(m, dict):
                converted = [x for x in from_parts({**m, "role": m.get("role") or "assistant"})]
                response = next((x for x in converted if x["role"] == "assistant"), None)
                finish = finish or m.get("finish_reason")
                break  # the first choice
        return messages, response, finish
    if any(name in _MESSAGE_EVENTS or name == "gen_ai.choice" for name, _, _ in span.events):
        messages = []
        response = None
        for name, _, attrs in span.events:
            payload = attrs.get("content", attrs.get("gen_ai.event.content", attrs.get("message")))
            if name in _MESSAGE_EVENTS:
                role = _MESSAGE_EVENTS[name]
                if (
                    role == "tool"
                    and attrs.get("id")
                    and isinstance(payload, str)
                    and payload[:1] not in "[{"
                ):
                    messages.append({"role": "tool", "tool_call_id": attrs["id"], "content": payload})
                else:
                    messages.extend(from_value(role, payload))
            elif name == "gen_ai.choice" and response is None:
                body = _json(attrs.get("gen_ai.event.content"))
                if isinstance(body, dict):  # the v1.28 body: {"index", "finish_reason", "message": {...}}
                    finish = finish or body.get("finish_reason")
                    payload = body.get("message")
                converted = from_value("assistant", attrs.get("message") if payload is None else payload)
                response = next((x for x in converted if x["role"] == "assistant"), None)
                finish = finish or attrs.get("finish_reason")
        return messages, response, finish
    messages = flat_messages(a, "gen_ai.prompt.")
    completions = flat_messages(a, "gen_ai.completion.")
    response = None
    if completions:
        response = {**completions[0], "role": "assistant"}
        finish = finish or a.get("gen_ai.completion.0.finish_reason")
    return messages, response, finish


def _usage(a: dict[str, Any]) -> dict[str, int] | None:
    def first(*keys: str) -> int | None:
        for k in keys:
            v = a.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return int(v)
        return None

    prompt = first("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.usage.prompt_tokens")
    completion = first(
        "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.usage.completion_tokens"
    )
    total = first("gen_ai.usage.total_tokens", "llm.usage.total_tokens")
    if prompt is None and completion is None and total is None:
        return None
    if total is None:
        total = (prompt or 0) + (completion or 0)
    return {"prompt_tokens": prompt or 0, "completion_tokens": completion or 0, "total_tokens": total}


def _token_data(a: dict[str, Any]) -> dict[str, Any]:
    ids = a.get("tracerl.completion_token_ids")
    lps = a.get("tracerl.logprobs")
    toks = a.get("tracerl.completion_tokens")
    prompt = a.get("tracerl.prompt_token_ids")
    out: dict[str, Any] = {}
    if isinstance(ids, list):
        out["completion_token_ids"] = _token_ids(ids, "tracerl.completion_token_ids")
    if isinstance(prompt, list):
        out["prompt_token_ids"] = _token_ids(prompt, "tracerl.prompt_token_ids")
    if isinstance(lps, list):
        # -inf is a logprob a server may report; a non-number or NaN is not one.
        if not all(_is_number(lp) and not math.isnan(lp) for lp in lps):
            raise ValueError("tracerl.logprobs holds a value that is not a logprob")
        tokens = toks if isinstance(toks, list) and len(toks) == len(lps) else None
        out["logprobs"] = [
            {"token": tokens[i], "logprob": float(lp)} if tokens else {"logprob": float(lp)}
            for i, lp in enumerate(lps)
        ]
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _token_ids(values: list[Any], key: str) -> list[int]:
    """Token ids exactly as sent: ``1.5`` or ``"7"`` is no token id, and is never rounded into one."""
    ids = []
    for v in values:
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # a JSON exporter's 7.0
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{key} holds {v!r}, not an integer")
        ids.append(v)
    return ids


class _Trace:
    """Spans of one trace, for looking attributes up along a span's ancestors."""

    def __init__(self, spans: list[OtelSpan]) -> None:
        self.by_id = {s.span_id: s for s in spans}

    def ancestors(self, span: OtelSpan) -> Iterator[OtelSpan]:
        seen = set()
        parent = self.by_id.get(span.parent_id) if span.parent_id else None
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            yield parent
            parent = self.by_id.get(parent.parent_id) if parent.parent_id else None

    def lookup(self, span: OtelSpan, *keys: str) -> Any:
        for s in (span, *self.ancestors(span)):
            a = _details(s) if s is span else s.attributes
            for k in keys:
                if a.get(k) is not None:
                    return a[k]
        return None


def _call(span: OtelSpan, trace: _Trace, skipped: Counter[str]) -> dict[str, Any] | None:
    a = _details(span)
    messages, response, finish = _messages(a, span)
    if not messages and response is None:
        skipped["chat_span_without_messages"] += 1
        return None
    tools = tools_from_definitions(a.get("gen_ai.tool.definitions")) or flat_tools(a)
    if tools is None:
        tools = tools_from_definitions(trace.lookup(span, "gen_ai.tool.definitions"))
    if isinstance(finish, str):
        finish = FINISH_REASONS.get(finish, finish)
    params = {p: a[k] for k, p in _PARAMS.items() if a.get(k) is not None}
    call: dict[str, Any] = {
        "framework": "otel",
        "model": a.get("gen_ai.request.model") or a.get("gen_ai.response.model"),
        "messages": messages,
        "tools": tools,
        "params": params,
        "response_message": response,
        "finish_reason": finish if isinstance(finish, str) else None,
        "response_model": a.get("gen_ai.response.model"),
        "usage": _usage(a),
        "started_at": span.start,
        "ended_at": span.end,
        "agent": trace.lookup(span, "gen_ai.agent.name"),
        "extra": {
            "otel": {
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "provider": a.get("gen_ai.provider.name") or a.get("gen_ai.system"),
            }
        },
        **_token_data(a),
    }
    if isinstance(a.get("tracerl.call_id"), str):
        call["call_id"] = a["tracerl.call_id"]
    if span.error is not None:
        call["error"] = {"type": str(a.get("error.type") or "error"), "message": span.error}
    return call


def _reward_events(span: OtelSpan) -> list[tuple[str, float]]:
    out = []
    for name, _, attrs in span.events:
        if name != "gen_ai.evaluation.result":
            continue
        value = attrs.get("gen_ai.evaluation.score.value")
        if _is_number(value):
            if not math.isfinite(value):
                raise ValueError(f"gen_ai.evaluation.score.value is {value!r}, not a finite number")
            out.append((str(attrs.get("gen_ai.evaluation.name") or "reward"), float(value)))
    return out


def _chat_entry(span: OtelSpan, trace: _Trace, skipped: Counter[str]) -> dict[str, Any] | None:
    """What a chat span gives its session: the call, the session key, task, sample, metadata, rewards.

    Raises ``ValueError`` (or whatever a malformed attribute makes the decoders raise) for a bad span.
    """
    call = _call(span, trace, skipped)
    if call is None:
        return None
    meta = _json(trace.lookup(span, "tracerl.metadata"))
    return {
        "call": call,
        "key": trace.lookup(span, "tracerl.session_id", "gen_ai.conversation.id"),
        "task": trace.lookup(span, "tracerl.task_id"),
        "sample": trace.lookup(span, "tracerl.sample"),
        "meta": meta if isinstance(meta, dict) else {},
        "rewards": _reward_events(span),
    }


def _reason(span: OtelSpan, exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"span {span.span_id or '(no id)'}: {text[:200]}"


def span_problem(span: OtelSpan) -> str | None:
    """Why ``span`` cannot be ingested (one line), or ``None`` when it can.

    A receiver answers with it at once (OTLP's ``partial_success``); the span is skipped, and counted,
    when its trace is written. Only what the span itself holds is checked, not its ancestors.

    Example:
        >>> out = '[{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]'
        >>> bad = OtelSpan("ab" * 16, "cd" * 8, None, "chat", 0.0, 1.0,
        ...                {"gen_ai.output.messages": out, "tracerl.completion_token_ids": [1.5]})
        >>> span_problem(bad)
        'span cdcdcdcdcdcdcdcd: tracerl.completion_token_ids holds 1.5, not an integer'
    """
    try:
        if _chat_kind(span):
            _chat_entry(span, _Trace([span]), Counter())
        else:
            _reward_events(span)
    except Exception as exc:  # any decoder's error: the span is bad, the others go on
        return _reason(span, exc)
    return None


def _add_chat(draft: SessionDraft, entry: dict[str, Any], trace_id: str) -> None:
    call = entry["call"]
    draft.metadata.setdefault("trace_ids", [])
    if trace_id not in draft.metadata["trace_ids"]:
        draft.metadata["trace_ids"].append(trace_id)
    if entry["task"] is not None:
        draft.task_id = str(entry["task"])
    if isinstance(entry["sample"], int):
        draft.sample = entry["sample"]
    for k, v in entry["meta"].items():
        if k not in _RESERVED and k != "tracerl":
            draft.metadata.setdefault(k, v)
    draft.calls.append(call)
    for name, value in entry["rewards"]:
        draft.rewards.append((name, value, call.get("call_id")))


def sessions_from_spans(
    spans: Iterable[OtelSpan], summary: IngestSummary | None = None
) -> list[SessionDraft]:
    """Group chat spans into sessions (by ``gen_ai.conversation.id``, else trace), calls in time order.

    ``tracerl.*`` attributes an export wrote on the root span restore the session's id, task, sample and
    metadata; ``gen_ai.evaluation.result`` events become rewards (on a chat span: that call's reward).
    A span that cannot be read (a non-finite score, token ids that are not integers, JSON nested too
    deep, ...) is skipped and counted as ``rejected_spans``; the others are written.

    Example:
        >>> sessions_from_spans([])
        []
    """
    summary = summary if summary is not None else IngestSummary()
    by_trace: dict[str, list[OtelSpan]] = {}
    for s in spans:
        summary.spans += 1
        by_trace.setdefault(s.trace_id, []).append(s)
    drafts: dict[str, SessionDraft] = {}
    for trace_id, trace_spans in by_trace.items():
        trace = _Trace(trace_spans)
        chats = [s for s in trace_spans if _chat_kind(s)]
        chat_ids = {s.span_id for s in chats}
        # A chat span around another chat span (a framework span over the client's) is the same call:
        # keep the innermost, closest to the wire.
        outer = {a.span_id for s in chats for a in trace.ancestors(s) if a.span_id in chat_ids}
        if outer:
            summary.skipped["nested_chat_spans"] += len(outer)
        for span in chats:
            if span.span_id in outer:
                continue
            try:
                entry = _chat_entry(span, trace, summary.skipped)
            except Exception as exc:  # one bad span: skipped and counted, its trace's others go on
                summary.skipped["rejected_spans"] += 1
                logger.debug("tracerl: OTLP %s", _reason(span, exc))
                continue
            if entry is None:
                continue
            summary.chat_spans += 1
            key = entry["key"] or trace_id
            draft = drafts.get(key)
            if draft is None:
                draft = drafts[key] = SessionDraft(str(key))
            _add_chat(draft, entry, trace_id)
        roots = [s for s in trace_spans if s.is_root]
        root = roots[0] if roots else None
        if root is not None and not _chat_kind(root):
            key = (
                root.attributes.get("tracerl.session_id")
                or root.attributes.get("gen_ai.conversation.id")
                or trace_id
            )
            try:
                rewards = _reward_events(root)
            except ValueError:
                summary.skipped["rejected_spans"] += 1
                rewards = []
            if key in drafts:
                for name, value in rewards:
                    drafts[key].rewards.append((name, value, None))
    for d in drafts.values():
        d.calls.sort(key=lambda c: (c["started_at"], c["ended_at"]))
        d.metadata["source"] = "otel"
        d.metadata["text_only"] = d.text_only
    return list(drafts.values())


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _recording_into(store: str | os.PathLike[str] | None) -> Iterator[None]:
    """Record into ``store`` for the duration, then give the process back its previous store.

    The one internal this package uses: ``sdk._tracer.tracer.config`` (the public ``sdk.configure``
    returns the new configuration only, and there is no public getter for the current one).
    """
    import sdk
    from sdk._tracer import tracer

    if store is None:
        yield
        sdk.flush()
        return
    previous = tracer.config
    existed = previous.store.exists()
    sdk.configure(store=store, enabled=True)
    try:
        yield
    finally:
        sdk.flush()
        sdk.configure(store=previous.store, enabled=previous.enabled)
        if not existed:  # configure() created it; the writer opens lazily, so it is still empty
            with contextlib.suppress(OSError):
                previous.store.rmdir()


def _write(drafts: list[SessionDraft]) -> None:
    from sdk import session
    from sdk.capture import CallRecord, record_call

    for d in drafts:
        meta = {k: v for k, v in d.metadata.items() if k not in _RESERVED}
        with session(d.task_id, sample=d.sample, session_id=d.session_id, **meta) as s:
            for c in d.calls:
                record_call(CallRecord(**c), s)
            for name, value, call_id in d.rewards:
                try:
                    s.reward(value, name, call_id=call_id)
                except ValueError:  # checked when read; never lose the sessions after this one
                    logger.warning("tracerl: OTLP reward %r of session %s not written", value, d.session_id)


def write_sessions(
    drafts: list[SessionDraft],
    store: str | os.PathLike[str] | None = None,
    summary: IngestSummary | None = None,
) -> None:
    """Write sessions through the public recording path (``sdk.session`` + ``record_call``).

    Args:
        drafts: From :func:`sessions_from_spans`.
        store: Store directory; ``None`` records into the store this process is configured with.
        summary: Counts sessions written.

    Example:
        >>> write_sessions([])
    """
    with _recording_into(store):
        # A fresh context: the sessions are never nested in one the caller may have open.
        contextvars.Context().run(_write, drafts)
    if summary is not None:
        summary.sessions += len(drafts)
        summary.text_only_sessions += sum(d.text_only for d in drafts)


def ingest_file(
    path: str | os.PathLike[str], store: str | os.PathLike[str], summary: IngestSummary | None = None
) -> IngestSummary:
    """Read an OTLP/JSON file (or JSON lines of them) and write its chat spans into ``store`` as sessions.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for one that is not OTLP/JSON.

    Example:
        >>> ingest_file("spans.json", "traces").format_line()  # doctest: +SKIP
        'spans 12, chat spans 3, sessions 1 (1 text-only)'
    """
    summary = summary if summary is not None else IngestSummary()
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no file at {str(p)!r}")
    spans = read_otlp_json(p.read_bytes())
    write_sessions(sessions_from_spans(spans, summary), store, summary)
    return summary
