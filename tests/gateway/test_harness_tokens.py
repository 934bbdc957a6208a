"""Harness calls become token-faithful training sequences: every generation trained once, on its prompt ids.

A vLLM-style scripted upstream returns token ids rendered with the tiny tokenizer's chat template from the
conversation as vLLM builds it (its own merge of Responses items, written here independently of tracerl).
Three harness shapes, each a tool-using session whose turns put text and a tool call in one output:

- the Responses API from the real openai client, recorded in process (issue 38, item 3);
- the Responses API through the gateway (``--token-data``: vLLM's ``enable_response_messages``);
- Anthropic's Messages API from the real anthropic client through the gateway, translated to chat
  completions for the OpenAI-compatible upstream (``--anthropic-to-chat --token-data``).

Each asserts from the trainer's sequences (``convert_episodes``) that the trained spans are exactly the
completions the server returned, each once, each preceded by exactly the prompt ids the server received.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("polars")
pytest.importorskip("transformers")
pytest.importorskip("aiohttp")

import sdk  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.messages import render_ids, template_messages  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.gateway import new_id, start_gateway  # noqa: E402
from tests.support.tools import ADD_TOOL, ANTHROPIC_ADD_TOOL  # noqa: E402
from trainers.data import convert_episodes, load_episodes  # noqa: E402

CHAT_TOOLS = [ADD_TOOL]
RESPONSES_TOOLS = [{"type": "function", **ADD_TOOL["function"]}]
ANTHROPIC_TOOLS = [ANTHROPIC_ADD_TOOL]
TASK = {"X-Tracerl-Task": "add"}
SCRIPT = [
    ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}], content="Let me add."),
    ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 5, "b": 10}}], content="Now add 10."),
    ScriptedResponse.text("The answer is 15."),
]


def _vllm_messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages as vLLM builds them from a request (Responses items merged as its renderer does)."""
    if "messages" in req:
        return req["messages"]
    msgs: list[dict[str, Any]] = (
        [{"role": "system", "content": req["instructions"]}] if req.get("instructions") else []
    )
    for item in req["input"]:
        prev = msgs[-1] if msgs and msgs[-1]["role"] == "assistant" else None
        kind = item.get("type", "message")
        if kind == "function_call":
            fn = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": fn}
            if prev is not None:
                prev["tool_calls"] = [*(prev.get("tool_calls") or []), call]
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif item["role"] == "assistant":
            text = item["content"][0]["text"] if isinstance(item["content"], list) else item["content"]
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
            else:
                msgs.append({"role": "assistant", "content": text})
        else:
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            msgs.append({"role": item["role"], "content": text})
    return msgs


class _Ids:
    """The upstream's token ids: the tiny tokenizer's rendering of what it was asked, as vLLM renders it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.served: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (prompt, completion) per request

    def __call__(self, req: dict[str, Any], resp: ScriptedResponse) -> tuple[list[int], list[int]]:
        msgs = template_messages(_vllm_messages(req))
        reply: dict[str, Any] = {"role": "assistant", "content": resp.content}
        if resp.calls:
            reply["tool_calls"] = [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for c in resp.calls
            ]
        prompt = render_ids(self.tok, msgs, tools=CHAT_TOOLS, add_generation_prompt=True)
        full = render_ids(
            self.tok, [*msgs, *template_messages([reply])], tools=CHAT_TOOLS, add_generation_prompt=False
        )
        completion = full[len(prompt) :]
        completion = completion[: completion.index(self.tok.eos_token_id) + 1]
        self.served.append((tuple(prompt), tuple(completion)))
        return prompt, completion


def _trained_spans(
    store: Path, tokenizer: Any
) -> tuple[Counter[tuple[tuple[int, ...], tuple[int, ...]]], Any]:
    """Every run of loss-bearing tokens in the trainer's sequences, with all the ids before it."""
    episodes = load_episodes(store)
    convs, report = convert_episodes(episodes, tokenizer)
    spans: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for conv in convs:
        for s in conv.sequences:
            ids, mask = s.prompt_ids + s.completion_ids, [0] * len(s.prompt_ids) + s.loss_mask
            i = 0
            while i < len(ids):
                if mask[i]:
                    j = i
                    while j < len(ids) and mask[j]:
                        j += 1
                    spans[(tuple(ids[:i]), tuple(ids[i:j]))] += 1
                    i = j
                else:
                    i += 1
    return spans, (episodes, convs, report)


def _assert_faithful(store: Path, tokenizer: Any, hook: _Ids) -> Any:
    spans, (episodes, convs, report) = _trained_spans(store, tokenizer)
    assert len(hook.served) == 3 and len(set(hook.served)) == 3
    assert spans == Counter(hook.served), "a generation trained twice, never, or on another prompt"
    assert len(episodes) == 1 and report.exact_ids == 1  # one thread, from the stored ids
    return episodes[0], convs[0]


def _responses_agent(client: Any) -> None:
    """A Codex-like loop: the output items go back as input, with the function call outputs."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3, then add 10"}]
    for n in range(3):
        kwargs = {"model": "policy", "instructions": "You add.", "input": items, "tools": RESPONSES_TOOLS}
        if n == 1:  # a streamed turn, as Codex streams: the ids come in the final event
            events = list(client.responses.create(stream=True, **kwargs))
            reply = events[-1].response
            assert events[-1].type == "response.completed"
        else:
            reply = client.responses.create(**kwargs)
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        for o in reply.output:
            if o.type == "function_call":
                args = json.loads(o.arguments)
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": o.call_id,
                        "output": str(args["a"] + args["b"]),
                    }
                )


def test_responses_text_and_call_in_one_output_trained_once_in_process(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    store = tmp_path / "store"
    sdk.configure(store=store, fsync="never")
    hook = _Ids(tiny_tokenizer)
    try:
        with ScriptedOpenAIServer(token_ids=hook) as server:
            server.enqueue(*SCRIPT)
            client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"), token_data=True)
            with sdk.session(task_id="add") as s:
                _responses_agent(client)
                s.reward(1.0)
        assert all(r.json["enable_response_messages"] is True for r in server.requests)
        # Output-text logprobs leave out the tool calls' tokens: not kept as behaviour logprobs, counted.
        assert sdk.stats()["responses_logprobs_partial"] >= 2
    finally:
        sdk.shutdown()
    ep, conv = _assert_faithful(store, tiny_tokenizer, hook)
    roles = [(m["role"], m["content"], bool(m.get("tool_calls"))) for m in ep["messages"]]
    assert roles == [
        ("system", "You add.", False),
        ("user", "add 2 and 3, then add 10", False),
        ("assistant", "Let me add.", True),  # text + function call: one message, as the server rendered it
        ("tool", "5", False),
        ("assistant", "Now add 10.", True),
        ("tool", "15", False),
        ("assistant", "The answer is 15.", False),
    ]


def test_responses_through_the_gateway_trained_once(tmp_path: Path, tiny_tokenizer: Any) -> None:
    hook = _Ids(tiny_tokenizer)
    with ScriptedOpenAIServer(token_ids=hook) as server:
        server.enqueue(*SCRIPT)
        gw = start_gateway(server.base_url, tmp_path / "store", args=("--token-data", "--strip-token-data"))
        try:
            sid = new_id()
            _responses_agent(
                openai.OpenAI(base_url=gw.base(sid), api_key="x", max_retries=0, default_headers=TASK)
            )
            gw.reward(sid, 1.0)
            gw.end(sid)
        finally:
            gw.stop()
    _assert_faithful(tmp_path / "store", tiny_tokenizer, hook)


def test_anthropic_harness_through_the_gateway_trained_once(tmp_path: Path, tiny_tokenizer: Any) -> None:
    hook = _Ids(tiny_tokenizer)
    with ScriptedOpenAIServer(token_ids=hook) as server:
        server.enqueue(*SCRIPT)
        args = ("--anthropic-to-chat", "--token-data")
        gw = start_gateway(server.base_url, tmp_path / "store", args=args)
        try:
            sid = new_id()
            client = anthropic.Anthropic(
                base_url=f"{gw.url}/sessions/{sid}", api_key="x", max_retries=0, default_headers=TASK
            )
            messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3, then add 10"}]
            for n in range(3):
                kwargs = {"model": "policy", "max_tokens": 64, "system": "You add.", "tools": ANTHROPIC_TOOLS}
                if n == 1:  # one streamed turn: the same record
                    with client.messages.stream(messages=messages, **kwargs) as stream:
                        reply = stream.get_final_message()
                else:
                    reply = client.messages.create(messages=messages, **kwargs)
                messages.append(
                    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
                )
                results = [
                    {"type": "tool_result", "tool_use_id": b.id, "content": str(b.input["a"] + b.input["b"])}
                    for b in reply.content
                    if b.type == "tool_use"
                ]
                if results:
                    messages.append({"role": "user", "content": results})
            gw.reward(sid, 1.0)
            gw.end(sid)
        finally:
            gw.stop()
    assert all(r.path == "/v1/chat/completions" and r.json["return_token_ids"] for r in server.requests)
    ep, _ = _assert_faithful(tmp_path / "store", tiny_tokenizer, hook)
    assert all(t["prompt_token_ids"] for t in ep["turns"] if t["token_ids"])
