"""The OpenAI wire module writes what it reads: every written body, chunk stream and error parses back
through ``parse_exchange`` to the same record (text, tool calls, reasoning, logprobs, token ids, usage)."""

from __future__ import annotations

import json

import pytest

from sdk import openai_wire as wire
from sdk.capture import CallRecord, tool_call

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "stream": False}


def _lp(token: str, logprob: float) -> dict:
    alts = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alts}


def _parse(body: dict | bytes, *, status: int = 200, stream: bool = False) -> CallRecord:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    content_type = "text/event-stream" if stream else "application/json"
    return wire.parse_exchange("chat.completions", {**REQUEST, "stream": stream}, status, raw,
                               content_type=content_type)  # fmt: skip


def _stream(body: dict, include_usage: bool = True) -> bytes:
    return (
        b"".join(wire.sse(c) for c in wire.stream_chunks(body, include_usage=include_usage)) + wire.SSE_DONE
    )


def _response_parts(rec: CallRecord) -> dict:
    return {
        k: getattr(rec, k)
        for k in ("response_message", "finish_reason", "logprobs", "completion_token_ids", "prompt_token_ids",
                  "response_model", "usage", "error", "extra")
    }  # fmt: skip


CASES = {
    "text with logprobs and token ids": wire.chat_choice(
        0,
        wire.assistant_message("It is sunny."),
        "stop",
        logprobs=[
            _lp("It", -0.1),
            _lp(" is", -0.2),
            _lp(" sunny", -0.3),
            _lp(".", -0.4),
            _lp("<|im_end|>", -0.5),
        ],
        token_ids=[10, 11, 12, 13, 2],
    ),
    "tool calls with tokens": wire.chat_choice(
        0,
        wire.assistant_message(
            None, [tool_call("c1", "weather", '{"city": "Paris"}'), tool_call("c2", "time", "{}")]
        ),
        "tool_calls",
        logprobs=[_lp("<tool_call>", -0.01), _lp("{", -0.02)],
        token_ids=[100, 101],
    ),
    "text and a tool call": wire.chat_choice(
        0, wire.assistant_message("Let me check.", [tool_call("c1", "weather", "{}")]), "tool_calls"
    ),
    "reasoning, no token data": wire.chat_choice(
        0, wire.assistant_message("4", reasoning_content="2 plus 2 is 4"), "stop"
    ),
    "token strings that do not spell the text": wire.chat_choice(
        0,
        wire.assistant_message("héllo"),
        "length",
        logprobs=[_lp("h", -0.1), _lp("\ufffd", -0.2), _lp("llo", -0.3)],
        token_ids=[1, 2, 3],
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", CASES)
def test_written_completion_and_its_stream_parse_back_to_the_same_record(case: str) -> None:
    choice = CASES[case]
    body = wire.chat_completion(
        "chatcmpl-1", 1767225600, "m-served", [choice], usage=wire.usage(9, 5, reasoning_tokens=1),
        prompt_token_ids=list(range(9)), system_fingerprint="fp",
    )  # fmt: skip
    plain, streamed = _parse(body), _parse(_stream(body), stream=True)
    assert _response_parts(streamed) == _response_parts(plain)
    # ...and it is what was written.
    msg = choice["message"]
    assert plain.response_message["content"] == msg["content"]
    assert plain.response_message.get("tool_calls") == msg.get("tool_calls")
    assert plain.response_message.get("reasoning_content") == msg.get("reasoning_content")
    assert plain.finish_reason == choice["finish_reason"] and plain.error is None
    assert plain.completion_token_ids == choice.get("token_ids")
    lps = (choice["logprobs"] or {}).get("content")
    assert [e["logprob"] for e in plain.logprobs or []] == [e["logprob"] for e in lps or []]
    assert plain.prompt_token_ids == list(range(9)) and plain.response_model == "m-served"
    assert plain.usage == wire.usage(9, 5, reasoning_tokens=1)


def test_several_choices_round_trip() -> None:
    choices = [
        wire.chat_choice(i, wire.assistant_message(f"answer {i}"), "stop", token_ids=[i]) for i in range(3)
    ]
    body = wire.chat_completion("c", 0, "m", choices)
    plain, streamed = _parse(body), _parse(_stream(body, include_usage=False), stream=True)
    # Other choices are kept as the server sent them (a chunk stream's reassembled, a body's as written).
    others = [plain.extra.pop("other_choices"), streamed.extra.pop("other_choices")]
    assert _response_parts(streamed) == _response_parts(plain)
    for other in others:
        got = [(c["message"]["content"], c["finish_reason"], c["token_ids"]) for c in other]
        assert got == [("answer 1", "stop", [1]), ("answer 2", "stop", [2])]


def test_stream_chunks_are_openai_chunks_and_sse_lines() -> None:
    body = wire.chat_completion(
        "c", 7, "m", [CASES["text with logprobs and token ids"]], prompt_token_ids=[1]
    )
    chunks = list(wire.stream_chunks(body))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {("c", 7, "m")}
    assert chunks[0]["prompt_token_ids"] == [1] and "prompt_token_ids" not in chunks[1]
    text = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert text == ["It", " is", " sunny", ".", ""]  # one chunk per token; the end token carries no text
    assert [c["choices"][0]["token_ids"] for c in chunks[1:-1]] == [[10], [11], [12], [13], [2]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert wire.sse({"a": 1}, "response.created") == b'event: response.created\ndata: {"a": 1}\n\n'


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [(400, "invalid_request_error", None), (429, "rate_limit_error", "rate_limit_exceeded"), (502, "gateway_error", None)],
)  # fmt: skip
def test_written_errors_parse_back(status: int, kind: str, code: str | None) -> None:
    rec = _parse(wire.error_body("it went wrong", kind, code=code), status=status)
    assert rec.error == {"type": kind, "message": "it went wrong", "status": status, "code": code}
    assert rec.response_message is None
