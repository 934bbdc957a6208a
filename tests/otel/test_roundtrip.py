"""Store -> OTLP (the OTel SDK's exporters) -> receiver / file -> store gives the same episodes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sdk.otel import (
    IngestSummary,
    export_otlp,
    ingest_file,
    sessions_from_spans,
    spans_from_request,
    write_sessions,
)
from tests.support.otel import TOOLS, episodes_of, make_store, text_level


def _spans(store: Path, **kwargs: Any) -> list[Any]:
    exporter = InMemorySpanExporter()
    export_otlp(store, exporter=exporter, **kwargs)
    return list(exporter.get_finished_spans())


def test_trace_shape_follows_genai_conventions(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store", tasks=1, samples=1)
    spans = _spans(store)
    assert len({s.context.trace_id for s in spans}) == 1  # one trace per episode
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["tracerl.task_id"] == "task-0"
    evals = {
        e.attributes["gen_ai.evaluation.name"]: e.attributes["gen_ai.evaluation.score.value"]
        for e in root.events
    }
    assert evals == {"reward": 1.0, "format": 0.5}
    assert all(e.name == "gen_ai.evaluation.result" for e in root.events)
    chats = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time)
    assert [c.name for c in chats] == ["chat tiny-1", "chat tiny-1"]
    assert all(c.parent.span_id == root.context.span_id for c in chats)
    first, second = chats
    assert json.loads(first.attributes["gen_ai.input.messages"])[1] == {
        "role": "user",
        "parts": [{"type": "text", "content": "What is 0 + 0?"}],
    }
    out = json.loads(first.attributes["gen_ai.output.messages"])
    assert out == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_00", "name": "add", "arguments": {"a": 0, "b": 0}}],
            "finish_reason": "tool_call",
        }
    ]
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert first.attributes["gen_ai.usage.input_tokens"] == 12
    assert first.attributes["gen_ai.usage.output_tokens"] == 3
    assert first.attributes["gen_ai.request.temperature"] == 0.7
    assert json.loads(first.attributes["gen_ai.tool.definitions"]) == [
        {"type": "function", **TOOLS[0]["function"]}
    ]
    assert json.loads(second.attributes["gen_ai.input.messages"])[3]["parts"] == [
        {"type": "tool_call_response", "id": "call_00", "response": "0"}
    ]
    # Token data is off by default.
    token_keys = {
        "tracerl.completion_token_ids",
        "tracerl.logprobs",
        "tracerl.prompt_token_ids",
        "tracerl.completion_tokens",
    }
    assert not token_keys & {k for s in spans for k in s.attributes}
    (tool,) = [s for s in spans if s.name == "execute_tool add"]
    assert tool.attributes["gen_ai.tool.call.id"] == "call_00"
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"a": 0, "b": 0}'
    assert tool.attributes["gen_ai.tool.call.result"] == "0"
    assert tool.end_time - tool.start_time == pytest.approx(0.1e9, rel=1e-3)


def test_token_data_only_when_asked(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store", tasks=1, samples=1)
    chats = sorted(
        (s for s in _spans(store, token_data=True) if s.name.startswith("chat")), key=lambda s: s.start_time
    )
    assert tuple(chats[1].attributes["tracerl.completion_token_ids"]) == (11, 12, 13, 14)
    assert tuple(chats[1].attributes["tracerl.logprobs"]) == (-0.31, -0.05, -0.01, -1.25)
    # Token strings are not stored beside ids (the ids decode to them): nothing to export.
    assert "tracerl.completion_tokens" not in chats[1].attributes
    assert tuple(chats[0].attributes["tracerl.prompt_token_ids"]) == (1, 2, 3)


def test_round_trip_through_the_otlp_http_receiver(tmp_path: Path, receiver: Any) -> None:
    store = make_store(tmp_path / "store")
    r, received = receiver
    import httpx

    # Bad input gets the OTLP answer (400) and the receiver goes on.
    bad = httpx.post(r.url, content=b"\xff not protobuf", headers={"content-type": "application/x-protobuf"})
    assert bad.status_code == 400
    summary = export_otlp(store, r.url, protocol="http")
    assert summary.failed_spans == 0 and summary.episodes == 4
    log = r.stop()
    assert "sessions 4" in log
    before, after = episodes_of(store), episodes_of(received)
    assert text_level(after) == text_level(before)
    # Session ids come back too (tracerl.session_id), and the episodes are marked text-only.
    assert sorted(e["session_id"] for e in after) == sorted(e["session_id"] for e in before)
    assert all(json.loads(e["metadata"])["text_only"] for e in after)
    assert not any(e["token_faithful"] for e in after)


def test_round_trip_with_token_data_keeps_the_tokens(tmp_path: Path, receiver: Any) -> None:
    store = make_store(tmp_path / "store", tasks=1, samples=2)
    r, received = receiver
    export_otlp(store, r.url, token_data=True)
    r.stop()
    after = episodes_of(received)
    assert all(e["token_faithful"] for e in after)
    assert [t["token_ids"] for t in after[0]["turns"]] == [[901, 902], [11, 12, 13, 14]]
    assert not json.loads(after[0]["metadata"])["text_only"]


def test_grpc_export_reaches_a_grpc_collector(tmp_path: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: list[Any] = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            got.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        store = make_store(tmp_path / "store", tasks=1, samples=2)
        summary = export_otlp(store, f"http://127.0.0.1:{port}", protocol="grpc")
    finally:
        server.stop(None)
    assert summary.failed_spans == 0 and summary.spans == 8
    spans = [s for req in got for s in spans_from_request(req)]
    out = tmp_path / "from-grpc"
    write_sessions(sessions_from_spans(spans), out)
    assert text_level(episodes_of(out)) == text_level(episodes_of(store))


def _otlp_json(spans: list[Any]) -> dict[str, Any]:
    """OTLP/JSON as a collector's file exporter writes it (hex ids), from the SDK's own encoder."""
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = json_format.MessageToDict(encode_spans(spans))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
    return doc


def test_ingest_an_otlp_json_file(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(_otlp_json(_spans(store))))
    summary = ingest_file(path, tmp_path / "ingested")
    assert (summary.spans, summary.chat_spans, summary.sessions, summary.text_only_sessions) == (16, 8, 4, 4)
    assert text_level(episodes_of(tmp_path / "ingested")) == text_level(episodes_of(store))


def test_ingest_json_lines_and_cli(tmp_path: Path) -> None:
    from sdk.otel.__main__ import main

    store = make_store(tmp_path / "store", tasks=1, samples=2)
    spans = _spans(store)
    path = tmp_path / "spans.jsonl"
    half = len(spans) // 2
    path.write_text(json.dumps(_otlp_json(spans[:half])) + "\n" + json.dumps(_otlp_json(spans[half:])) + "\n")
    assert main(["ingest", str(path), "--store", str(tmp_path / "cli")]) == 0
    assert text_level(episodes_of(tmp_path / "cli")) == text_level(episodes_of(store))
    summary = IngestSummary()
    assert summary.format_line().startswith("spans 0")


def test_export_from_parquet_matches_export_from_store(tmp_path: Path, receiver: Any) -> None:
    pytest.importorskip("polars")
    from sdk.episodes import export

    store = make_store(tmp_path / "store")
    export(store, tmp_path / "eps.parquet", rejects=False)
    r, received = receiver
    summary = export_otlp(tmp_path / "eps.parquet", r.url)
    assert summary.episodes == 4
    r.stop()
    assert text_level(episodes_of(received)) == text_level(episodes_of(store))


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdk.otel.__main__ import main

    assert main(["export", str(tmp_path / "missing"), "--otlp", "http://127.0.0.1:9"]) == 2
    assert main(["ingest", str(tmp_path / "missing.json"), "--store", str(tmp_path / "s")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "otlp"}')
    assert main(["ingest", str(bad), "--store", str(tmp_path / "s")]) == 2
    bad.write_text("garbage{")
    assert main(["ingest", str(bad), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert [line.startswith("error: ") for line in err.strip().splitlines()] == [True] * 4
    assert "Traceback" not in err


def test_unreachable_endpoint_is_counted_not_raised(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store", tasks=1, samples=1)
    summary = export_otlp(store, "http://127.0.0.1:9/v1/traces")
    assert summary.failed_spans == 4 and summary.spans == 0
