"""Ingest of the other span shapes: OpenLLMetry's flat attributes and v1.28-style message event bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from sdk.otel import ingest_file, read_otlp_json, sessions_from_spans
from tests.support.otel import episodes_of

TRACE = "5b8efff798038103d269b633813fc60c"


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # OTLP/JSON writes int64 as a string
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _span(
    span_id: str, parent: str | None, name: str, start: int, attrs: dict[str, Any], events: Any = ()
) -> dict[str, Any]:
    sp: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(start * 10**9),
        "endTimeUnixNano": str(start * 10**9 + 5 * 10**8),
        "attributes": [_kv(k, v) for k, v in attrs.items()],
        "events": [
            {"timeUnixNano": str(start * 10**9), "name": n, "attributes": [_kv(k, v) for k, v in a.items()]}
            for n, a in events
        ],
        "status": {},
    }
    if parent:
        sp["parentSpanId"] = parent
    return sp


def _doc(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_kv("service.name", "agent")]},
                "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.openai"}, "spans": spans}],
            }
        ]
    }


OPENLLMETRY = [
    # The second call first in the file: calls are ordered by their start time.
    _span(
        "00f067aa0ba902b8",
        "00f067aa0ba902b6",
        "openai.chat",
        1_700_000_002,
        {
            "llm.request.type": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "What is 2 + 3?",
            "gen_ai.prompt.1.role": "assistant",
            "gen_ai.prompt.1.tool_calls.0.id": "call_1",
            "gen_ai.prompt.1.tool_calls.0.name": "add",
            "gen_ai.prompt.1.tool_calls.0.arguments": '{"a": 2, "b": 3}',
            "gen_ai.prompt.2.role": "tool",
            "gen_ai.prompt.2.content": "5",
            "gen_ai.prompt.2.tool_call_id": "call_1",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "2 + 3 = 5.",
            "gen_ai.completion.0.finish_reason": "stop",
            "gen_ai.usage.prompt_tokens": 30,
            "gen_ai.usage.completion_tokens": 6,
            "llm.request.functions.0.name": "add",
            "llm.request.functions.0.description": "Add two integers.",
            "llm.request.functions.0.parameters": '{"type": "object", "properties": {"a": {"type": "integer"}}}',
        },
    ),
    _span(
        "00f067aa0ba902b7",
        "00f067aa0ba902b6",
        "openai.chat",
        1_700_000_001,
        {
            "llm.request.type": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "What is 2 + 3?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "call_1",
            "gen_ai.completion.0.tool_calls.0.name": "add",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"a": 2, "b": 3}',
            "llm.request.functions.0.name": "add",
            "llm.request.functions.0.description": "Add two integers.",
            "llm.request.functions.0.parameters": '{"type": "object", "properties": {"a": {"type": "integer"}}}',
        },
    ),
    _span("00f067aa0ba902b6", None, "agent.workflow", 1_700_000_000, {"traceloop.span.kind": "workflow"}),
]


def test_openllmetry_flat_attributes(tmp_path: Path) -> None:
    path = tmp_path / "openllmetry.json"
    path.write_text(json.dumps(_doc(OPENLLMETRY)))
    summary = ingest_file(path, tmp_path / "store")
    assert (summary.spans, summary.chat_spans, summary.sessions, summary.text_only_sessions) == (3, 2, 1, 1)
    (ep,) = episodes_of(tmp_path / "store")
    assert ep["session_id"] == TRACE  # no conversation id: one session per trace
    assert [(m["role"], m["content"]) for m in ep["messages"]] == [
        ("user", "What is 2 + 3?"),
        ("assistant", None),
        ("tool", "5"),
        ("assistant", "2 + 3 = 5."),
    ]
    assert ep["messages"][1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert ep["messages"][2]["tool_call_id"] == "call_1"
    assert json.loads(ep["tools"])[0]["function"]["name"] == "add"
    assert ep["num_calls"] == 2 and ep["usage"]["prompt_tokens"] == 30
    meta = json.loads(ep["metadata"])
    assert meta["text_only"] is True and meta["source"] == "otel" and meta["trace_ids"] == [TRACE]
    assert not ep["token_faithful"]


def test_v1_28_event_bodies_and_conversation_id(tmp_path: Path) -> None:
    events = [
        ("gen_ai.system.message", {"gen_ai.event.content": json.dumps({"content": "Be brief."})}),
        ("gen_ai.user.message", {"gen_ai.event.content": json.dumps({"content": "Weather in Paris?"})}),
        (
            "gen_ai.choice",
            {
                "gen_ai.event.content": json.dumps(
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                                }
                            ]
                        },
                    }
                )
            },
        ),
    ]
    span = _span(
        "00f067aa0ba90201",
        None,
        "chat gpt-4o",
        1_700_000_000,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.conversation.id": "conv-42",
            "gen_ai.request.model": "gpt-4o",
        },
        events,
    )
    (draft,) = sessions_from_spans(read_otlp_json(json.dumps(_doc([span]))))
    assert draft.session_id == "conv-42"
    (call,) = draft.calls
    assert call["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert call["response_message"]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Paris"}',
    }
    assert call["finish_reason"] == "tool_calls"


def test_spans_that_are_not_chat_calls_are_ignored() -> None:
    spans = read_otlp_json(
        json.dumps(_doc([_span("00f067aa0ba90202", None, "GET /", 1_700_000_000, {"http.method": "GET"})]))
    )
    assert sessions_from_spans(spans) == []
