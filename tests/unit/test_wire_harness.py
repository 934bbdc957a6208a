"""The wire module's Anthropic and Responses mappings, and what it writes reading back to the same record."""

from __future__ import annotations

import json

import pytest

from sdk.openai_wire import (
    ChatStreamTranslator,
    MappingError,
    anthropic_request,
    assistant_message,
    chat_choice,
    chat_completion,
    message_events,
    message_of_chat,
    parse_exchange,
    responses_messages,
    sse,
    stream_chunks,
)

CALL = {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}


def test_anthropic_blocks_map_to_chat_messages() -> None:
    body = {
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]},
                {"type": "text", "text": "and?"},
            ]},
        ],
        "tools": [{"name": "add", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "w"}],
        "max_tokens": 9,
    }  # fmt: skip
    messages, tools, params = anthropic_request(body)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
        ]},
        {"role": "assistant", "content": "Adding.", "tool_calls": [CALL], "reasoning_content": "hmm"},
        {"role": "tool", "tool_call_id": "t1", "content": "2"},  # tool results first, then the rest of the turn
        {"role": "user", "content": "and?"},
    ]  # fmt: skip
    assert tools[0] == {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    assert tools[1]["type"] == "web_search_20250305" and params == {"max_tokens": 9}


@pytest.mark.parametrize(
    "turn",
    [
        {"role": "user", "content": [{"type": "document", "source": {}}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]},
        {"role": "tool", "content": "x"},
        "hi",
    ],
)
def test_what_the_anthropic_mapping_cannot_represent_is_refused(turn: object) -> None:
    with pytest.raises(MappingError):
        anthropic_request({"messages": [turn]})
    rec = parse_exchange("messages", {"model": "m", "messages": [turn]}, 400, b"{}")
    assert rec.messages == [] and rec.extra["malformed_request"]["request"]["messages"] == [turn]


def test_responses_items_merge_as_vllm_renders_them() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** patch"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "patched"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
    ]
    out = responses_messages(items)
    assert [m["role"] for m in out] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "assistant",
    ]
    merged = out[2]
    assert merged["content"] == "ok" and merged["reasoning_content"] == "think"
    assert [tc["function"]["name"] for tc in merged["tool_calls"]] == ["f", "apply_patch"]
    assert json.loads(merged["tool_calls"][1]["function"]["arguments"]) == {"input": "*** patch"}
    assert [m["content"] for m in out[5:]] == ["a", "b"]  # a message with content starts a new one
    with pytest.raises(MappingError, match="unknown item type 'local_shell_call'"):
        responses_messages([{"type": "local_shell_call"}])


def test_responses_token_ids_from_vllm_response_messages() -> None:
    raw = lambda ids: [{"type": "raw_message_tokens", "message": "", "tokens": ids}]  # noqa: E731
    body = {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi", "logprobs": [
            {"token": "hi", "logprob": -0.1, "bytes": [104, 105], "top_logprobs": []}]}]}],
        "input_messages": raw([1, 2, 3]), "output_messages": raw([7, 8]),
    }  # fmt: skip
    rec = parse_exchange("responses", {"model": "m", "input": "x"}, 200, json.dumps(body).encode())
    assert rec.prompt_token_ids == [1, 2, 3] and rec.completion_token_ids == [7, 8]
    assert rec.logprobs is None  # one logprob for two completion ids: not kept
    body["output_messages"] = raw([7]) + raw([9])  # several generations: not one turn's ids
    rec = parse_exchange("responses", {"model": "m", "input": "x"}, 200, json.dumps(body).encode())
    assert rec.completion_token_ids is None


def _chat_body() -> dict:
    calls = [{"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]
    message = assistant_message("Adding.", calls, reasoning_content="hmm")
    return chat_completion(
        "c",
        0,
        "m",
        [chat_choice(0, message, "tool_calls")],
        usage={"prompt_tokens": 3, "completion_tokens": 4},
    )


def test_a_chat_reply_written_as_anthropic_reads_back_the_same() -> None:
    chat = _chat_body()
    request = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "add"}]}
    expected = parse_exchange(
        "chat.completions", {"messages": request["messages"]}, 200, json.dumps(chat).encode()
    )
    message = message_of_chat(chat, "m")
    plain = parse_exchange("messages", request, 200, json.dumps(message).encode())
    events = b"".join(sse(p, n) for n, p in message_events(message))
    streamed = parse_exchange(
        "messages", {**request, "stream": True}, 200, events, content_type="text/event-stream"
    )
    # The chat stream translated chunk by chunk, as the gateway does with --anthropic-to-chat.
    translator = ChatStreamTranslator("m")
    live = [e for chunk in stream_chunks(chat) for e in translator.feed(chunk)] + translator.finish()
    translated = parse_exchange(
        "messages", {**request, "stream": True}, 200, b"".join(sse(p, n) for n, p in live),
        content_type="text/event-stream",
    )  # fmt: skip
    for rec in (plain, streamed, translated):
        assert rec.response_message == expected.response_message
        assert rec.finish_reason == "tool_calls" and rec.error is None
    assert plain.usage["prompt_tokens"] == 3 and plain.usage["completion_tokens"] == 4


def test_an_anthropic_stream_without_message_stop_is_incomplete() -> None:
    message = message_of_chat(_chat_body(), "m")
    events = message_events(message)[:-1]  # no message_stop
    rec = parse_exchange(
        "messages", {"model": "m", "messages": [], "stream": True}, 200, b"".join(sse(p, n) for n, p in events),
        content_type="text/event-stream",
    )  # fmt: skip
    assert rec.error["type"] == "incomplete_stream" and rec.finish_reason is None
    assert rec.response_message["content"] == "Adding."  # what was said so far is kept
