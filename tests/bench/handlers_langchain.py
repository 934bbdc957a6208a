"""LangChain handler benchmark: what TracerlCallbackHandler adds to one chat-model call.

Run: ``python tests/bench/handlers_langchain.py [--calls N]`` (prints a table; record results in
tests/bench/RESULTS.md).

A fake chat model (no HTTP) returns a fixed AIMessage with usage and metadata, so the numbers isolate
callback cost. Each column times ``model.invoke(messages, config={"callbacks": [h]})`` with:

- ``none``: no callbacks at all (LangChain's own per-call cost);
- ``no-op``: a ``BaseCallbackHandler`` with empty ``on_chat_model_start`` / ``on_llm_end`` (LangChain's
  callback dispatch path; the baseline the ratio is taken against);
- ``tracerl``: :class:`TracerlCallbackHandler` inside a session, writing to a store in a temp directory
  (conversion to OpenAI format, the CallRecord, prefix deduplication and the store append included).

Three requests: a one-message prompt, and agent histories of 21 and 101 messages (5 and 33 tool-call
rounds) re-sent on every call, as an agent loop does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import sdk
from integrations.langchain import TracerlCallbackHandler


class FakeChat(BaseChatModel):
    """Returns the same assistant message every time, with the metadata ChatOpenAI would attach."""

    model_name: str = "fake-model"

    @property
    def _llm_type(self) -> str:
        return "bench-fake"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        msg = AIMessage(
            content="The answer is 42.",
            usage_metadata={"input_tokens": 120, "output_tokens": 6, "total_tokens": 126},
            response_metadata={"model_name": "fake-model-2026", "finish_reason": "stop", "id": "chatcmpl-1"},
        )
        return ChatResult(generations=[ChatGeneration(message=msg)])


class NoOpHandler(BaseCallbackHandler):
    """LangChain's callback path with nothing in it."""

    run_inline = True

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        """Do nothing."""

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        """Do nothing."""


def history(rounds: int) -> list[BaseMessage]:
    msgs: list[BaseMessage] = [
        SystemMessage(content="You are a careful assistant. " * 10),
        HumanMessage(content="Please add up these numbers one pair at a time. " * 4),
    ]
    for i in range(rounds):
        msgs.append(
            AIMessage(content="", tool_calls=[{"name": "add", "args": {"a": i, "b": i + 1}, "id": f"c{i}"}])
        )
        msgs.append(ToolMessage(content=str(2 * i + 1), tool_call_id=f"c{i}"))
        msgs.append(HumanMessage(content=f"Next pair {i}?"))
    return msgs


def time_rows(
    model: FakeChat, messages: list[BaseMessage], handlers: dict[str, Any], n: int, repeats: int
) -> dict[str, float]:
    """Median CPU µs per call for each handler (this thread's CPU time, so other processes on a shared
    machine do not inflate it; blocks are interleaved so what noise remains hits all handlers alike)."""
    configs = {k: ({"callbacks": [h]} if h is not None else {}) for k, h in handlers.items()}
    samples: dict[str, list[float]] = {k: [] for k in handlers}
    for config in configs.values():  # warm-up
        for _ in range(min(200, n)):
            model.invoke(messages, config=config)
    for _ in range(repeats):
        for k, config in configs.items():
            with sdk.session(task_id="bench"):
                t0 = time.thread_time()
                for _ in range(n):
                    model.invoke(messages, config=config)
                samples[k].append((time.thread_time() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per block (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=15, help="blocks per handler (default: %(default)s)")
    args = parser.parse_args(argv)
    sdk.configure(store=tempfile.mkdtemp(prefix="tracerl-bench-lc-"))
    model = FakeChat()
    rows = []
    for label, messages in (
        ("1 message", [HumanMessage(content="What is 6 x 7?")]),
        ("21 messages, 5 tool rounds", history(5)[:21]),
        ("101 messages, 33 tool rounds", history(33)[:101]),
    ):
        t = time_rows(
            model,
            messages,
            {"none": None, "no-op": NoOpHandler(), "tracerl": TracerlCallbackHandler()},
            args.calls,
            args.repeats,
        )
        rows.append((label, t["none"], t["no-op"], t["tracerl"]))
    sdk.flush()
    stats = sdk.stats()
    print(
        f"LangChain handler cost per chat-model call (fake model; CPU time, median of "
        f"{args.repeats} interleaved blocks of {args.calls} calls)"
    )
    print(f"{'request':<28} {'none µs':>9} {'no-op µs':>9} {'tracerl µs':>11} {'added µs':>9} {'ratio':>6}")
    for label, none, noop, ours in rows:
        print(f"{label:<28} {none:>9.1f} {noop:>9.1f} {ours:>11.1f} {ours - noop:>9.1f} {ours / noop:>6.2f}")
    print(
        f"calls recorded {stats['calls_recorded']}, internal errors {stats['internal_errors']}, "
        f"write failures {stats['write_failures']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
