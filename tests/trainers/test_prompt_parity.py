"""The policy server's prompt and the trainer's re-rendering are the same token ids (one message contract).

Each case is sent to the server (``trainers.serve.Engine``, tiny model) and recorded into a real store as one
call; the store is exported to Parquet and read back by the trainer, whose per-turn sequence for that call
must start from exactly the ids the server returned as ``prompt_token_ids``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")

import sdk  # noqa: E402
from sdk.capture import CallRecord, record_call  # noqa: E402
from sdk.episodes import export  # noqa: E402
from tests.support.synth import WEATHER_TOOL  # noqa: E402
from trainers.data import convert_episodes, load_episodes  # noqa: E402
from trainers.serve import Engine  # noqa: E402

TOOLS = [WEATHER_TOOL]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}


def _call(arguments: object) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }


def _result(content: object) -> dict:
    return {"role": "tool", "tool_call_id": "c1", "content": content}


CASES: dict[str, list[dict]] = {
    "system-and-user": [SYSTEM, USER],
    "content-parts": [
        SYSTEM,
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "it?"}]},
    ],
    "developer-as-system": [{"role": "developer", "content": "Be brief."}, USER],
    "empty-arguments": [SYSTEM, USER, _call(""), _result("21 degrees")],
    "string-arguments": [SYSTEM, USER, _call('{"city": "Paris"}'), _result("21 degrees")],
    "dict-arguments": [SYSTEM, USER, _call({"city": "Paris"}), _result("21 degrees")],
    "tool-result-parts": [
        SYSTEM,
        USER,
        _call('{"city":"Paris"}'),
        _result([{"type": "text", "text": "21"}, {"type": "text", "text": "degrees"}]),
    ],
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> Engine:
    return Engine(tiny_model_dir, model_name="tiny")


def test_server_prompt_ids_equal_trainer_ids_after_export(engine: Engine, tmp_path) -> None:
    served: dict[str, list[int]] = {}
    sdk.configure(store=tmp_path / "store")
    try:
        for name, messages in CASES.items():
            body = {"messages": messages, "tools": TOOLS, "max_tokens": 2, "temperature": 0}
            resp = engine.chat({**body, "return_token_ids": True})
            served[name] = resp["prompt_token_ids"]
            with sdk.session(task_id=name) as s:
                record_call(
                    CallRecord(
                        framework="openai",
                        model="tiny",
                        messages=messages,
                        tools=TOOLS,
                        response_message={"role": "assistant", "content": "Done."},
                        finish_reason="stop",
                    )
                )
                s.reward(1.0)
    finally:
        sdk.shutdown()
    summary = export(tmp_path / "store", tmp_path / "episodes.parquet")
    assert summary.written == len(CASES), summary.format_table()

    rows = load_episodes(tmp_path / "episodes.parquet")
    convs, report = convert_episodes(rows, engine.tokenizer, per_turn="always")
    assert report.invalid == 0 and len(convs) == len(CASES)
    for conv in convs:
        last = conv.sequences[-1]  # the turn the server generated
        assert last.prompt_ids == served[conv.task_id], conv.task_id
    decoded = {c.task_id: engine.tokenizer.decode(c.sequences[-1].prompt_ids) for c in convs}
    assert "What is\nit?" in decoded["content-parts"]  # text parts joined as vLLM and the export join them
    assert '"arguments": {}' in decoded["empty-arguments"]  # what a model writes for a call without arguments
    assert decoded["dict-arguments"] == decoded["string-arguments"]
