"""Bedrock content blocks -> OpenAI chat: the converters, checked against OpenAIModel's wire format."""

from __future__ import annotations

import base64
import copy
import json

import pytest

pytest.importorskip("strands")

from integrations.strands import (
    to_openai_messages,
    to_openai_response,
    to_openai_tools,
)
from sdk.capture import CallRecord

PNG = b"\x89PNG\r\n\x1a\nfake-image-bytes"


def test_text_only_user_message_is_a_string_and_system_prompt_leads() -> None:
    out = to_openai_messages([{"role": "user", "content": [{"text": "hi"}], "tracking_id": "x"}], "Be brief.")
    assert out == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_system_prompt_blocks_one_message_per_text_block_cache_points_dropped() -> None:
    system = [{"text": "a"}, {"cachePoint": {"type": "default"}}, {"text": "b"}]
    assert to_openai_messages([], system) == [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
    ]


def test_several_text_blocks_stay_parts() -> None:
    out = to_openai_messages(
        [{"role": "user", "content": [{"text": "a"}, {"cachePoint": {"type": "default"}}, {"text": "b"}]}]
    )
    assert out == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_tool_use_becomes_tool_calls_with_json_string_arguments_and_null_content() -> None:
    msg = {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 1, "b": "é"}}},
            {"toolUse": {"toolUseId": "t2", "name": "now", "input": {}}},
        ],
        "metadata": {"usage": {}},
    }
    (out,) = to_openai_messages([msg])
    assert out["content"] is None
    assert out["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": "é"}'}},
        {"id": "t2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": "é"}


def test_text_and_tool_use_keep_both() -> None:
    (out,) = to_openai_messages(
        [
            {
                "role": "assistant",
                "content": [
                    {"text": "Let me add."},
                    {"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 1}}},
                ],
            }
        ]
    )
    assert out["content"] == "Let me add."
    assert out["tool_calls"][0]["id"] == "t1"


def test_tool_results_become_tool_messages_before_the_rest_of_the_user_message() -> None:
    msg = {
        "role": "user",
        "content": [
            {"text": "and now?"},
            {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "3"}]}},
            {
                "toolResult": {
                    "toolUseId": "t2",
                    "status": "success",
                    "content": [{"json": {"b": 1, "city": "Zürich"}}, {"text": "done"}],
                }
            },
        ],
    }
    assert to_openai_messages([msg]) == [
        {"role": "tool", "tool_call_id": "t1", "content": "3"},
        {"role": "tool", "tool_call_id": "t2", "content": '{"b": 1, "city": "Zürich"}\ndone'},
        {"role": "user", "content": "and now?"},
    ]


def test_tool_result_only_user_message_leaves_no_empty_user_message() -> None:
    msg = {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": "t1", "status": "success", "content": []}}],
    }
    assert to_openai_messages([msg]) == [{"role": "tool", "tool_call_id": "t1", "content": ""}]


def test_tool_result_with_error_status_keeps_the_error_text() -> None:
    # Chat has no status field: the error text is what the model reads, exactly as OpenAIModel sends it.
    msg = {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "t1",
                    "status": "error",
                    "content": [{"text": "Error: ZeroDivisionError - division by zero"}],
                }
            }
        ],
    }
    assert to_openai_messages([msg]) == [
        {"role": "tool", "tool_call_id": "t1", "content": "Error: ZeroDivisionError - division by zero"}
    ]


def test_reasoning_content_becomes_reasoning_content() -> None:
    msg = {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "2 plus 2", "signature": "sig"}}},
            {"text": "4"},
        ],
    }
    assert to_openai_messages([msg]) == [
        {"role": "assistant", "content": "4", "reasoning_content": "2 plus 2"}
    ]
    assert to_openai_response(msg) == {"role": "assistant", "content": "4", "reasoning_content": "2 plus 2"}


def test_image_bytes_become_a_data_url() -> None:
    msg = {
        "role": "user",
        "content": [{"text": "what is this?"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
    }
    (out,) = to_openai_messages([msg])
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert out == {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    jpeg = to_openai_messages(
        [{"role": "user", "content": [{"image": {"format": "jpeg", "source": {"bytes": b"x"}}}]}]
    )
    assert jpeg[0]["content"][0]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_image_in_tool_result_moves_to_a_following_user_message() -> None:
    msg = {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "t1",
                    "status": "success",
                    "content": [{"text": "a chart"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
                }
            }
        ],
    }
    out = to_openai_messages([msg])
    assert out[0] == {"role": "tool", "tool_call_id": "t1", "content": "a chart"}
    assert out[1]["role"] == "user" and out[1]["content"][0]["type"] == "image_url"


def test_document_and_location_sources() -> None:
    msg = {
        "role": "user",
        "content": [
            {"document": {"format": "pdf", "name": "report", "source": {"bytes": b"%PDF"}}},
            {"image": {"format": "png", "source": {"location": {"type": "s3", "uri": "s3://b/k.png"}}}},
        ],
    }
    (out,) = to_openai_messages([msg])
    assert out["content"][0] == {
        "type": "file",
        "file": {"file_data": "data:application/pdf;base64,JVBERg==", "filename": "report"},
    }
    assert out["content"][1] == {"type": "image_url", "image_url": {"url": "s3://b/k.png"}}


def test_blocks_without_a_chat_equivalent_are_dropped_and_counted() -> None:
    import sdk

    before = sdk.stats().get("strands_blocks_dropped", 0)
    msg = {
        "role": "user",
        "content": [{"text": "watch"}, {"video": {"format": "mp4", "source": {"bytes": b"v"}}}],
    }
    assert to_openai_messages([msg]) == [{"role": "user", "content": "watch"}]
    assert sdk.stats()["strands_blocks_dropped"] == before + 1


def test_conversion_does_not_alias_the_input() -> None:
    history = [
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {"x": [1]}}}],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"json": {"y": [2]}}]}}
            ],
        },
    ]
    frozen = copy.deepcopy(history)
    out = to_openai_messages(history)
    history[0]["content"][0]["toolUse"]["input"]["x"].append(9)
    history[1]["content"][0]["toolResult"]["content"][0]["json"]["y"].append(9)
    assert out == to_openai_messages(frozen)


def test_response_with_only_tool_calls_and_empty_response() -> None:
    msg = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]}
    assert to_openai_response(msg)["content"] is None
    assert to_openai_response({"role": "assistant", "content": []}) == {"role": "assistant", "content": None}
    assert to_openai_response(None) == {"role": "assistant", "content": None}


def test_tools_become_function_schemas() -> None:
    specs = [
        {
            "name": "add",
            "description": "Add.",
            "inputSchema": {
                "json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
            },
        }
    ]
    assert to_openai_tools(specs) == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            },
        }
    ]
    assert to_openai_tools([]) is None


def test_matches_openai_model_wire_format_for_the_fingerprint() -> None:
    """Our last message and response line up with what OpenAIModel sends, so the transport join works."""
    from strands.models.openai import OpenAIModel

    history = [
        {"role": "user", "content": [{"text": "add 1 and 2"}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 1, "b": 2}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [{"text": "3"}, {"json": {"ok": True}}],
                    }
                }
            ],
        },
    ]
    wire = OpenAIModel.format_request_messages(history, "sys")
    ours = to_openai_messages(history, "sys")
    response = {"role": "assistant", "content": [{"text": "It is 3."}]}
    a = CallRecord(framework="strands", messages=ours, response_message=to_openai_response(response))
    b = CallRecord(
        framework="openai", messages=wire, response_message={"role": "assistant", "content": "It is 3."}
    )
    assert a.fingerprint() == b.fingerprint() is not None
    assert [m["role"] for m in ours] == [m["role"] for m in wire]
    for mine, theirs in zip(ours, wire, strict=True):
        assert mine.get("tool_calls") == theirs.get("tool_calls")
        if mine["role"] == "tool":
            assert mine == theirs
