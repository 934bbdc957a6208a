"""What tracerl's LlamaIndex handlers cost per LLM call, against LlamaIndex's own path without them.

Run: ``python tests/bench/handlers_llama_index.py [--calls N]`` (prints a table; no HTTP, no network).

An in-process fake chat LLM (a ``CustomLLM`` returning prebuilt OpenAI ``ChatCompletion`` /
``ChatCompletionChunk`` objects as ``raw``, exactly as ``llama_index.llms.openai.OpenAI`` does) is called
through LlamaIndex's normal instrumented path (span + ``llm_chat_callback`` events), and ``MockLLM``
(whose ``chat`` goes through ``complete``: two spans and both event kinds per call). Modes:

- ``baseline``: LlamaIndex with no tracerl handler attached;
- ``not captured``: handlers attached, the call outside any session with implicit sessions off (the
  handlers' floor: event dispatch and the span map, no conversion);
- ``captured``: handlers attached, inside a session: converted and written to a store
  (``fsync="never"``); ``added`` = captured - baseline.

The per-call cost is thread CPU time / calls (other processes do not count), the minimum over
interleaved repeats. Numbers vary by machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.llms import MockLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import sdk
from integrations.llama_index import instrument_llama_index, uninstrument_llama_index

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add(a: int, b: int) -> int\nAdd two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "title": "A"},
                    "b": {"type": "integer", "title": "B"},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            "strict": False,
        },
    }
]

COMPLETION = ChatCompletion.model_validate(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-2026-01-01",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "The answer is 20."},
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 300, "completion_tokens": 6, "total_tokens": 306},
    }
)


def _chunks(n: int) -> list[ChatCompletionChunk]:
    out = []
    for i in range(n):
        last = i == n - 1
        out.append(
            ChatCompletionChunk.model_validate(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "fake-2026-01-01",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {} if last else {"content": f" w{i}"},
                            "finish_reason": "stop" if last else None,
                        }
                    ],
                }
            )
        )
    return out


class FakeChatLLM(CustomLLM):
    """A chat model returning canned OpenAI objects as ``raw`` (no I/O)."""

    stream_chunks: int = 32

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="fake", is_chat_model=True, is_function_calling_model=True)

    @llm_chat_callback()
    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return ChatResponse(
            message=ChatMessage(role="assistant", content="The answer is 20."),
            raw=COMPLETION,
            additional_kwargs={"prompt_tokens": 300, "completion_tokens": 6, "total_tokens": 306},
        )

    @llm_chat_callback()
    def stream_chat(self, messages: Any, **kwargs: Any) -> Any:
        chunks = _CHUNKS[: self.stream_chunks]

        def gen() -> Any:
            text = ""
            for c in chunks:
                delta = c.choices[0].delta.content or ""
                text += delta
                yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=delta, raw=c)

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text="ok")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        def gen() -> Any:
            yield CompletionResponse(text="ok", delta="ok")

        return gen()


_CHUNKS = _chunks(32)


def agent_conversation(turns: int) -> list[ChatMessage]:
    """A FunctionAgent-shaped history: system, user, then ``turns`` tool call + tool result pairs."""
    msgs = [
        ChatMessage(role="system", content="You are a calculator agent. Use the tools. " * 8),
        ChatMessage(role="user", content="What is (2 + 3) * 4? Show your work. " * 4),
    ]
    for t in range(turns):
        call_id = f"call_{t}"
        msgs.append(
            ChatMessage(
                role="assistant",
                blocks=[
                    TextBlock(text=""),
                    ToolCallBlock(tool_call_id=call_id, tool_name="add", tool_kwargs='{"a": 2, "b": 3}'),
                ],
            )
        )
        msgs.append(ChatMessage(role="tool", content=str(5 + t), additional_kwargs={"tool_call_id": call_id}))
    return msgs


def _time(fn: Any, calls: int) -> float:
    # CPU time of this thread, not wall time: other processes on a loaded machine do not count.
    t0 = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - t0) / calls / 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    fake = FakeChatLLM()
    mock = MockLLM(max_tokens=8)
    short = [ChatMessage(role="user", content="hi")]
    history = agent_conversation(turns=8)  # 18 messages
    scenarios = {
        "chat, 1 message": lambda: fake.chat(short),
        "chat, 18-message agent history + tools": lambda: fake.chat(history, tools=TOOLS, tool_choice="auto"),
        "stream_chat, 18 messages, 32 chunks": lambda: [None for _ in fake.stream_chat(history, tools=TOOLS)],
        "MockLLM.chat (chat -> complete)": lambda: mock.chat(short),
    }
    store = tempfile.mkdtemp(prefix="tracerl-bench-")
    sdk.configure(store=store, fsync="never")
    modes = ("baseline", "not captured", "captured")
    results: dict[str, dict[str, float]] = {}
    for name, fn in scenarios.items():
        for _ in range(200):  # warm up LlamaIndex's own caches
            fn()
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.repeats):  # modes interleaved, so drift affects all of them alike
            for mode in modes:
                if mode == "baseline":
                    uninstrument_llama_index()
                else:
                    instrument_llama_index()
                if mode == "captured":
                    with sdk.session(task_id="bench"):
                        samples[mode].append(_time(fn, args.calls))
                else:  # outside any session, implicit sessions off: the handlers' dispatch floor
                    sdk.configure(implicit_sessions="off")
                    samples[mode].append(_time(fn, args.calls))
                    sdk.configure(implicit_sessions="process")
        uninstrument_llama_index()
        results[name] = {m: min(v) for m, v in samples.items()}  # min: the least-disturbed run
    sdk.flush()
    stats = sdk.stats()

    print(f"LlamaIndex handler cost per LLM call, thread CPU µs (min of {args.repeats} x {args.calls} calls)")
    cols = ("baseline", 9), ("not captured", 13), ("ratio", 6), ("captured", 9), ("ratio", 6), ("added", 6)
    print(f"{'scenario':42} " + " ".join(f"{c:>{w}}" for c, w in cols))
    for name, r in results.items():
        base, floor, full = r["baseline"], r["not captured"], r["captured"]
        print(
            f"{name:42} {base:9.1f} {floor:13.1f} {floor / base:6.2f} {full:9.1f} {full / base:6.2f} "
            f"{full - base:6.1f}"
        )
    print(f"calls recorded: {stats['calls_recorded']}, internal errors: {stats['internal_errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
