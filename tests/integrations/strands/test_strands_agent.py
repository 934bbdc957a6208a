"""A real strands.Agent (OpenAIModel, @tool functions) against the scripted loopback server, with the hook."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("strands")

import openai
from strands import Agent, tool
from strands.hooks import AfterModelCallEvent, BeforeModelCallEvent
from strands.models.openai import OpenAIModel

import sdk
from integrations.openai import instrument_openai, uninstrument_openai, wrap_openai
from integrations.strands import TracerlHookProvider, instrument_strands, uninstrument_strands
from sdk.capture import MissingDependency
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

REPO = Path(__file__).resolve().parents[3]
SYSTEM = "You are a careful calculator."


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


def _model(server: ScriptedOpenAIServer, *, stream: bool = True, **params: Any) -> OpenAIModel:
    return OpenAIModel(
        client_args={"base_url": server.base_url, "api_key": "x", "max_retries": 0},
        model_id="gpt-4o-mini",
        params={"temperature": 0.0, **params},
        stream=stream,
    )


def _agent(model: Any, *, hooks: list[Any] | None = None, name: str = "calc", **kwargs: Any) -> Agent:
    return Agent(
        model=model,
        tools=[add, multiply],
        system_prompt=SYSTEM,
        callback_handler=None,
        hooks=[TracerlHookProvider()] if hooks is None else hooks,
        name=name,
        **kwargs,
    )


def _script_two_tools(server: ScriptedOpenAIServer) -> None:
    server.enqueue(
        ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]),
        ScriptedResponse.tool_calls([{"name": "multiply", "arguments": {"a": 5, "b": 4}}]),
        ScriptedResponse.text("The answer is 20."),
    )


def _sessions(store: Path) -> list[Any]:
    sdk.flush()
    return list(StoreReader(store).sessions())


def _session(store: Path, task_id: str) -> Any:
    (s,) = [s for s in _sessions(store) if s.task_id == task_id]
    return s


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return content or ""


def _norm(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Messages up to presentation: content parts vs strings, argument formatting, reasoning (not sent)."""
    out = []
    for m in messages:
        calls = tuple(
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in m.get("tool_calls") or ()
        )
        out.append((m["role"], _text(m.get("content")), calls, m.get("tool_call_id")))
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_tool_loop_records_each_model_call(
    store: Path, openai_server: ScriptedOpenAIServer, stream: bool
) -> None:
    _script_two_tools(openai_server)
    agent = _agent(_model(openai_server, stream=stream))
    with sdk.session(task_id="calc-1") as s:
        result = agent("What is (2 + 3) * 4?")
    assert str(result).strip() == "The answer is 20."
    assert s.num_calls == 3

    calls = _session(store, "calc-1").calls
    wire = [r.json for r in openai_server.requests if r.path.endswith("/chat/completions")]
    assert len(calls) == len(wire) == 3
    for call, body in zip(calls, wire, strict=True):
        assert call["framework"] == "strands" and call["source"] == "framework"
        assert call["model"] == "gpt-4o-mini" and call["agent"] == "calc"
        assert call["stream"] is stream and body["stream"] is stream
        assert call["request"]["params"]["temperature"] == 0.0
        # The recorded request is the request the server received.
        assert _norm(call["request"]["messages"]) == _norm(body["messages"])
        assert call["request"]["tools"] == body["tools"]
        assert call["started_at"] <= call["ended_at"]
        assert call["error"] is None
        usage = call["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0

    first, second, third = calls
    assert first["request"]["messages"][:2] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is (2 + 3) * 4?"},
    ]
    assert [t["function"]["name"] for t in first["request"]["tools"]] == ["add", "multiply"]
    add_call = first["response"]["message"]["tool_calls"][0]
    assert first["response"]["message"]["content"] is None
    assert add_call["function"]["name"] == "add" and json.loads(add_call["function"]["arguments"]) == {
        "a": 2,
        "b": 3,
    }
    assert [c["response"]["finish_reason"] for c in calls] == ["tool_calls", "tool_calls", "stop"]
    assert [c["extra"]["stop_reason"] for c in calls] == ["tool_use", "tool_use", "end_turn"]
    assert second["request"]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": add_call["id"],
        "content": "5",
    }
    assert third["request"]["messages"][-1]["content"] == "20"
    assert third["response"]["message"] == {"role": "assistant", "content": "The answer is 20."}

    # Tool runs are reported on the call whose request carries their results.
    assert "tool_executions" not in (first["extra"] or {})
    (run,) = second["extra"]["tool_executions"]
    assert run["tool_call_id"] == add_call["id"] and run["name"] == "add" and run["status"] == "success"
    assert run["duration_s"] >= 0 and run["started_at"] is not None
    assert third["extra"]["tool_executions"][0]["name"] == "multiply"


def test_multi_turn_requests_extend_the_previous_request_and_response(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    openai_server.enqueue(
        ScriptedResponse.text("Four.", reasoning_content="2 + 2 = 4"), ScriptedResponse.text("Eight.")
    )
    agent = _agent(_model(openai_server), hooks=[TracerlHookProvider()])
    with sdk.session(task_id="turns"):
        agent("2 + 2?")
        agent("and doubled?")
    first, second = _session(store, "turns").calls
    assert first["response"]["message"] == {
        "role": "assistant",
        "content": "Four.",
        "reasoning_content": "2 + 2 = 4",
    }
    n = len(first["request"]["messages"])
    assert second["request"]["messages"][: n + 1] == [
        *first["request"]["messages"],
        first["response"]["message"],
    ]
    assert second["request"]["messages"][-1] == {"role": "user", "content": "and doubled?"}


def test_stream_async_and_concurrent_agents_keep_their_sessions(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    # Default policy: call the first tool, then answer with its result (no shared queue between agents).
    async def run(task: str, question: str) -> str:
        agent = _agent(_model(openai_server), name=f"agent-{task}")
        async with sdk.session(task_id=task):
            text = ""
            async for event in agent.stream_async(question):
                text += event.get("data", "") if isinstance(event.get("data"), str) else ""
            return text

    async def main() -> list[str]:
        return await asyncio.gather(run("a", "question a"), run("b", "question b"))

    texts = asyncio.run(main())
    assert texts == ["Tool result: 5", "Tool result: 5"]
    for task in ("a", "b"):
        calls = _session(store, task).calls
        assert len(calls) == 2
        assert {c["agent"] for c in calls} == {f"agent-{task}"}
        assert calls[0]["request"]["messages"][-1] == {"role": "user", "content": f"question {task}"}
        assert calls[1]["request"]["messages"][-1]["role"] == "tool"


def test_model_error_propagates_unchanged_and_is_recorded(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    seen: list[BaseException] = []

    def spy(event: AfterModelCallEvent) -> None:
        if event.exception is not None:
            seen.append(event.exception)

    agent = _agent(_model(openai_server), hooks=[TracerlHookProvider(), spy])
    with sdk.session(task_id="err"):
        with pytest.raises(openai.BadRequestError) as excinfo:
            agent("Please FAIL_400 now.")
    assert seen and excinfo.value is seen[0]  # the model's own exception object, not a wrapper
    (call,) = _session(store, "err").calls
    assert call["error"]["type"] == "BadRequestError" and call["error"]["status"] == 400
    assert "FAIL_400" in call["error"]["message"]
    assert call["response"]["message"] is None
    assert call["request"]["messages"][-1] == {"role": "user", "content": "Please FAIL_400 now."}


@pytest.mark.parametrize("where", ["before", "input", "after", "tool"])
def test_a_hook_bug_does_not_break_the_agent(
    store: Path, openai_server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import integrations.strands as mod

    monkeypatch.delenv("TRACERL_RAISE_INTERNAL", raising=False)
    _script_two_tools(openai_server)
    baseline = str(_agent(_model(openai_server), hooks=[])("What is (2 + 3) * 4?"))
    baseline_bodies = [r.json for r in openai_server.requests]
    openai_server.reset()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracerl bug")

    target = {
        "before": (mod, "capture_target"),
        "input": (mod._Call, "snapshot"),
        "after": (mod, "to_openai_response"),
        "tool": (mod._Tools, "__init__"),
    }[where]
    monkeypatch.setattr(*target, boom)
    errors = sdk.stats()["internal_errors"]
    _script_two_tools(openai_server)
    with sdk.session(task_id="bug"):
        result = _agent(_model(openai_server))("What is (2 + 3) * 4?")
    assert str(result) == baseline
    assert [r.json for r in openai_server.requests] == baseline_bodies
    assert sdk.stats()["internal_errors"] > errors


def test_recording_client_is_merged_into_one_call_with_logprobs_and_token_ids(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    _script_two_tools(openai_server)
    client = wrap_openai(openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    model = OpenAIModel(
        client=client,
        model_id="gpt-4o-mini",
        params={"logprobs": True, "top_logprobs": 2, "extra_body": {"return_token_ids": True}},
    )
    with sdk.session(task_id="merged") as s:
        assert str(_agent(model)("What is (2 + 3) * 4?")).strip() == "The answer is 20."
    assert s.num_calls == 3
    calls = _session(store, "merged").calls
    assert len(calls) == 3
    for call in calls:
        assert call["framework"] == "strands" and call["source"] == "transport"
        assert len(call["merged_call_ids"]) == 1
        assert call["response_model"] == "gpt-4o-mini-2026-01-01"
        assert call["logprobs"] and call["logprobs"][0]["top_logprobs"]
        assert call["prompt_token_ids"] and call["completion_token_ids"]
        assert call["request_id"].startswith("req_")
        assert call["agent"] == "calc"
    assert calls[1]["extra"]["tool_executions"][0]["name"] == "add"  # what only the hook knows


# What a model may emit: key order, spacing and escapes that a parse + re-serialise does not keep.
RAW_ARGUMENTS = '{"b":3,   "a": 2, "note": "Z\\u00fcrich"}'


@pytest.mark.parametrize("recording_client", [False, True], ids=["hook-only", "recording-client"])
def test_tool_call_arguments_are_byte_exact_only_with_a_recording_client(
    store: Path, openai_server: ScriptedOpenAIServer, recording_client: bool
) -> None:
    """Documented limit and its workaround: Strands hands hooks parsed arguments, which the hook re-serialises."""

    @tool
    def add(a: int, b: int, note: str = "") -> int:
        """Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
            note: Ignored.
        """
        return a + b

    openai_server.enqueue(
        ScriptedResponse.tool_calls([{"name": "add", "arguments": RAW_ARGUMENTS}]), ScriptedResponse.text("5")
    )
    if recording_client:
        client = wrap_openai(openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
        model = OpenAIModel(client=client, model_id="gpt-4o-mini", params={})
    else:
        model = _model(openai_server)
    with sdk.session(task_id="args"):
        Agent(model=model, tools=[add], hooks=[TracerlHookProvider()], callback_handler=None)("add 2 and 3")
    first = _session(store, "args").calls[0]
    stored = first["response"]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(stored) == json.loads(RAW_ARGUMENTS)
    if recording_client:
        assert stored == RAW_ARGUMENTS  # the bytes the model produced
    else:
        assert stored == '{"b": 3, "a": 2, "note": "Zürich"}'  # json.dumps of Strands' parsed dict


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_instrument_openai_client_built_by_strands_is_merged(
    store: Path, openai_server: ScriptedOpenAIServer, stream: bool
) -> None:
    instrument_openai()  # OpenAIModel(client_args=...) builds a fresh AsyncOpenAI per request
    try:
        _script_two_tools(openai_server)
        with sdk.session(task_id="inst"):
            _agent(_model(openai_server, stream=stream, logprobs=True))("What is (2 + 3) * 4?")
    finally:
        uninstrument_openai()
    calls = _session(store, "inst").calls
    assert [c["framework"] for c in calls] == ["strands"] * 3
    assert all(c["logprobs"] and c["merged_call_ids"] for c in calls)


def test_strands_events_do_not_carry_logprobs_token_ids_or_returned_model(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    """Documented limit: OpenAIModel drops them before any hook runs; only a recording client keeps them."""
    model = _model(openai_server, logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True})
    agent = Agent(model=model, hooks=[TracerlHookProvider()], callback_handler=None)
    with sdk.session(task_id="limits"):
        agent("hello")
    assert openai_server.requests[0].json["logprobs"] is True  # asked for, and the server sent them
    (call,) = _session(store, "limits").calls
    assert call["response"]["message"] == {"role": "assistant", "content": "You said: hello"}
    assert call["logprobs"] is None
    assert call["prompt_token_ids"] is None and call["completion_token_ids"] is None
    assert call["response_model"] is None and call["request_id"] is None
    assert call["model"] == "gpt-4o-mini"  # the configured model id only
    assert call["extra"]["metrics"]["latencyMs"] == 0  # Strands' own latency for OpenAIModel; ours is timed
    assert call["ended_at"] >= call["started_at"]


@pytest.mark.parametrize("use_middleware", [True, False])
def test_input_middleware_changes_are_captured_only_with_the_middleware(
    store: Path, openai_server: ScriptedOpenAIServer, use_middleware: bool
) -> None:
    from strands.middleware import InvokeModelStage

    agent = Agent(
        model=_model(openai_server),
        system_prompt=SYSTEM,
        callback_handler=None,
        hooks=[TracerlHookProvider(use_middleware=use_middleware)],
    )
    agent.add_middleware(InvokeModelStage.Input, lambda ctx: ctx.replace(system_prompt="Be concise."))
    with sdk.session(task_id="mw"):
        agent("hi")
    assert openai_server.requests[0].json["messages"][0] == {"role": "system", "content": "Be concise."}
    (call,) = _session(store, "mw").calls
    recorded = call["request"]["messages"][0]["content"]
    # Without the middleware, a Before-hook snapshot cannot see what Input middleware changes afterwards.
    assert recorded == ("Be concise." if use_middleware else SYSTEM)


def test_cancelled_model_call_is_not_recorded(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    def deny(event: BeforeModelCallEvent) -> None:
        event.cancel = "denied by policy"

    agent = Agent(model=_model(openai_server), hooks=[deny, TracerlHookProvider()], callback_handler=None)
    with sdk.session(task_id="cancel") as s:
        assert str(agent("hi")).strip() == "denied by policy"
    assert s.num_calls == 0 and openai_server.requests == []


def test_calls_outside_a_session_go_to_the_implicit_session(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    Agent(model=_model(openai_server), hooks=[TracerlHookProvider()], callback_handler=None)("hi")
    (implicit,) = [s for s in _sessions(store) if s.implicit]
    assert len(implicit.calls) == 1


def test_instrument_strands_is_idempotent_and_undoable(
    store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    original = Agent.__init__
    provider = instrument_strands()
    patched = Agent.__init__
    assert instrument_strands() is provider and Agent.__init__ is patched is not original

    auto = Agent(model=_model(openai_server), callback_handler=None)
    own = TracerlHookProvider()
    both = Agent(model=_model(openai_server), hooks=[own], callback_handler=None)  # + the global one: skipped
    both.hooks.add_hook(own)  # and added twice: skipped
    with sdk.session(task_id="inst") as s:
        auto("one")
        both("two")
    assert s.num_calls == 2
    assert [c["request"]["messages"][-1]["content"] for c in _session(store, "inst").calls] == ["one", "two"]

    uninstrument_strands()
    uninstrument_strands()
    assert Agent.__init__ is original
    later = Agent(model=_model(openai_server), callback_handler=None)
    with sdk.session(task_id="after") as s:
        later("three")  # created after: no provider
        auto("four")  # the shared provider is switched off
        both("five")  # its own provider keeps working
    assert s.num_calls == 1

    assert instrument_strands() is provider  # re-instrumenting switches the shared provider back on
    with sdk.session(task_id="again") as s:
        auto("six")
    assert s.num_calls == 1


def test_missing_framework_names_the_extra() -> None:
    blocked = {name: None for name in ("strands", "strands.agent", "strands.agent.agent", "strands.hooks")}
    with mock.patch.dict(sys.modules, {**blocked, "integrations.strands": None}):
        del sys.modules["integrations.strands"]
        with pytest.raises(MissingDependency, match=r"pip install 'tracerl\[strands\]'") as excinfo:
            importlib.import_module("integrations.strands")
    assert isinstance(excinfo.value, ImportError)
    assert "strands-agents" in str(excinfo.value)


def test_example_runs(tmp_path: Path) -> None:
    store = tmp_path / "example_store"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    env["TRACERL_STORE"] = str(store)
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "strands_agent.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("strands example:") and "calls=3" in line, proc.stdout
    (session,) = [s for s in StoreReader(store).sessions() if not s.implicit]
    assert session.task_id == "strands-demo-1" and len(session.calls) == 3 and session.reward == 1.0


def test_an_abandoned_stream_leaves_no_state_behind(store: Path, openai_server: ScriptedOpenAIServer) -> None:
    provider = TracerlHookProvider()
    agent = Agent(model=_model(openai_server), hooks=[provider], callback_handler=None)

    async def stop_early() -> None:
        openai_server.enqueue(ScriptedResponse.text("one two three four five six seven"))
        events = agent.stream_async("hi")
        async for event in events:
            if "data" in event:
                break  # the model call never reaches AfterModelCallEvent
        await events.aclose()

    asyncio.run(stop_early())
    assert not provider._calls and not provider._tools  # cleared by AfterInvocationEvent
    with sdk.session(task_id="next") as s:
        assert str(agent("again")).strip() == "You said: again"
    assert s.num_calls == 1
