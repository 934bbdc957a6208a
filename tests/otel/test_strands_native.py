"""A Strands agent's native OTel tracing, exported by the OTel SDK into the receiver, gives the hook's episode.

One agent run records two ways at once: ``TracerlHookProvider`` into one store, and Strands' own GenAI
spans (exported over OTLP/HTTP by the OpenTelemetry SDK) through ``python -m sdk.otel receive`` into
another. Both the current attribute form (``gen_ai_latest_experimental``) and the older per-message span
events (Strands' default) are checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("strands")
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from strands import Agent, tool
from strands.models.openai import OpenAIModel

import sdk
from integrations.strands import TracerlHookProvider
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.otel import episodes_of


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def _conversation(ep: dict[str, Any]) -> tuple[Any, ...]:
    import json

    return (
        tuple(
            (
                m["role"],
                m["content"],
                tuple(
                    (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in m["tool_calls"] or ()
                ),
                m["tool_call_id"],
            )
            for m in ep["messages"]
        ),
        json.loads(ep["tools"]),
    )


@pytest.mark.parametrize("conventions", ["latest", "legacy-events"])
def test_native_spans_give_the_hook_episode(
    tmp_path: Path, receiver: Any, monkeypatch: pytest.MonkeyPatch, conventions: str
) -> None:
    import strands.telemetry.tracer as strands_tracer

    r, received = receiver
    opt_in = "gen_ai_tool_definitions" + (",gen_ai_latest_experimental" if conventions == "latest" else "")
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    # Strands' tracer is a process singleton that reads the opt-in when created: a fresh one, whose spans
    # go through this test's SDK provider (the global provider can be set only once per process).
    monkeypatch.setattr(strands_tracer, "_tracer_instance", None)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=r.url)))
    strands_tracer.get_tracer().tracer = provider.get_tracer(strands_tracer.__name__)

    hook_store = tmp_path / "hook"
    sdk.configure(store=hook_store)
    with ScriptedOpenAIServer() as server:
        server.enqueue(
            ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]),
            ScriptedResponse.tool_calls([{"name": "multiply", "arguments": {"a": 5, "b": 4}}]),
            ScriptedResponse.text("The answer is 20."),
        )
        model = OpenAIModel(
            client_args={"base_url": server.base_url, "api_key": "x", "max_retries": 0},
            model_id="gpt-4o-mini",
            params={"temperature": 0.0},
        )
        agent = Agent(
            model=model,
            tools=[add, multiply],
            system_prompt="You are a careful calculator.",
            callback_handler=None,
            hooks=[TracerlHookProvider()],
            name="calc",
        )
        with sdk.session(task_id="calc-1"):
            agent("What is (2 + 3) * 4?")
    provider.shutdown()
    sdk.shutdown()
    r.stop()

    (hooked,) = episodes_of(hook_store)
    (native,) = episodes_of(received)
    assert hooked["num_calls"] == native["num_calls"] == 3
    assert _conversation(native) == _conversation(hooked)
    assert [t["function"]["name"] for t in _conversation(native)[1]] == ["add", "multiply"]
    assert native["agent"] == "calc"
    assert native["usage"] == hooked["usage"]
