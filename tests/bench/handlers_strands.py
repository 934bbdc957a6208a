"""Cost of tracerl's Strands hook per model call, relative to the same Strands agent without it.

The model is a ``strands.models.Model`` subclass that answers in memory (no HTTP, frameworks.md §9), so
the numbers are Strands' own per-call work plus ours. Each invocation is a tool loop (a tool call, then an
answer: two model calls); the history is reset before every invocation to a fixed length. The hook
writes to a real store in a temporary directory (``fsync="never"``).

Run::

    python tests/bench/handlers_strands.py [--invocations 300] [--repeats 5]

Prints a Markdown table: CPU µs per model call (best of the repeats; CPU time, because wall time on a
shared machine mostly measures the scheduler), overhead and ratio to the baseline, and wall µs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import tempfile
import time
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

from strands import Agent, tool
from strands.models import Model

import sdk
from integrations.strands import TracerlHookProvider


@tool
async def add(a: int, b: int) -> int:
    """Add two integers (async: no thread hop, which would dominate the timings with scheduler noise).

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class InMemoryModel(Model):
    """Calls ``add`` once, then answers with the tool result; no I/O."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {"model_id": "in-memory", "params": {"temperature": 0.0}}

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        return self.config

    async def structured_output(self, output_model: Any, prompt: Any, system_prompt: Any = None, **kw: Any):
        raise NotImplementedError
        yield  # pragma: no cover

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        usage = {"inputTokens": 50, "outputTokens": 8, "totalTokens": 58}
        yield {"messageStart": {"role": "assistant"}}
        results = [b["toolResult"] for b in messages[-1]["content"] if "toolResult" in b]
        if results:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": "The sum is "}}}
            yield {"contentBlockDelta": {"delta": {"text": results[-1]["content"][0]["text"]}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
        else:
            start = {"toolUse": {"toolUseId": f"t{len(messages)}", "name": "add"}}
            yield {"contentBlockStart": {"start": start}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"a": 2, "b": 3})}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 0}}}


def _history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append({"role": "user", "content": [{"text": f"Question {i}: what is {i} + {i}? " * 4}]})
        out.append({"role": "assistant", "content": [{"text": f"It is {2 * i}. " * 8}]})
    return out


async def _run(agent: Agent, history: list[dict[str, Any]], invocations: int) -> tuple[float, float]:
    """(CPU, wall) seconds per model call for ``invocations`` tool-loop invocations (2 model calls each)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(invocations):
        agent.messages = copy.deepcopy(history)
        await agent.invoke_async("Add 2 and 3.")
    n = 2 * invocations
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


def _agent(hooks: list[Any]) -> Agent:
    return Agent(
        model=InMemoryModel(),
        tools=[add],
        system_prompt="You add numbers.",
        hooks=hooks,
        callback_handler=None,
    )


def measure(turns: int, invocations: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Best-of-``repeats`` (CPU, wall) µs per model call for each configuration."""
    history = _history(turns)
    # name -> (agent factory, capture enabled); with capture disabled the hook still converts every call,
    # so that row separates the integration's own cost from the store's (record_call).
    configs = {
        "strands, no hook": (lambda: _agent([]), True),
        "+ TracerlHookProvider()": (lambda: _agent([TracerlHookProvider()]), True),
        "+ TracerlHookProvider(use_middleware=False)": (
            lambda: _agent([TracerlHookProvider(use_middleware=False)]),
            True,
        ),
        "+ TracerlHookProvider(), store disabled": (lambda: _agent([TracerlHookProvider()]), False),
    }
    best = {name: (float("inf"), float("inf")) for name in configs}

    async def main() -> None:
        agents = {name: make() for name, (make, _) in configs.items()}
        for agent in agents.values():  # warm up (imports, caches, lazy middleware install)
            await _run(agent, history, 5)
        for _ in range(repeats):  # interleaved, so that load on the machine hits every row alike
            for name, agent in agents.items():
                sdk.configure(enabled=configs[name][1])
                with sdk.session(task_id="bench"):
                    cpu, wall = await _run(agent, history, invocations)
                best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
        sdk.configure(enabled=True)

    asyncio.run(main())
    return {name: (cpu * 1e6, wall * 1e6) for name, (cpu, wall) in best.items()}


class _FakeAgent:
    """Just what the callbacks read from an agent."""

    def __init__(self, history: list[dict[str, Any]]) -> None:
        self.name = "bench"
        self.messages = history
        self.system_prompt = "You add numbers."
        self.system_prompt_content = [{"text": self.system_prompt}]
        self.model = InMemoryModel()
        self.tool_registry = SimpleNamespace(get_all_tool_specs=lambda: [add.tool_spec])


def measure_callbacks(turns: int, calls: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` µs per model call spent in the provider's own callbacks (private API, on purpose).

    Fake events carry a real-shaped history (``turns`` exchanges + one tool round trip); the agent run
    above includes this plus the extra middleware layer's per-event cost.
    """
    use = {"toolUseId": "t1", "name": "add", "input": {"a": 2, "b": 3}}
    result = {"toolUseId": "t1", "status": "success", "content": [{"text": "5"}]}
    history = [
        *_history(turns),
        {"role": "user", "content": [{"text": "Add 2 and 3."}]},
        {"role": "assistant", "content": [{"toolUse": use}]},
        {"role": "user", "content": [{"toolResult": result}]},
    ]
    agent = _FakeAgent(history)
    state: dict[str, Any] = {}
    message = {
        "role": "assistant",
        "content": [{"text": "The sum is 5"}],
        "metadata": {"usage": {"inputTokens": 50, "outputTokens": 8, "totalTokens": 58}, "metrics": {}},
    }
    before = SimpleNamespace(agent=agent, invocation_state=state, cancel=False)
    after = SimpleNamespace(
        agent=agent,
        invocation_state=state,
        stop_response=SimpleNamespace(message=message, stop_reason="end_turn"),
        exception=None,
    )
    context = SimpleNamespace(
        agent=agent,
        invocation_state=state,
        messages=copy.deepcopy(history),
        system_prompt=agent.system_prompt_content,
        tool_specs=[add.tool_spec],
        tool_choice=None,
        model=agent.model,
    )
    with_mw, without_mw = TracerlHookProvider(), TracerlHookProvider(use_middleware=False)
    with_mw._equipped.add(agent)  # as if the middleware had been added at the first call

    def via_middleware() -> None:
        with_mw._before_model_call(before)  # type: ignore[arg-type]
        with_mw._on_model_input(context)
        with_mw._after_model_call(after)  # type: ignore[arg-type]

    def via_hooks_only() -> None:
        without_mw._before_model_call(before)  # type: ignore[arg-type]
        without_mw._after_model_call(after)  # type: ignore[arg-type]

    rows = {
        "middleware snapshot + store": (via_middleware, True),
        "Before snapshot + store": (via_hooks_only, True),
        "middleware snapshot, store disabled": (via_middleware, False),
    }
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(repeats):  # many short bursts: the best one is the least disturbed by other processes
        for name, (fn, enabled) in rows.items():
            sdk.configure(enabled=enabled)
            with sdk.session(task_id="bench-callbacks"):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / calls)
    sdk.configure(enabled=True)
    return {name: v * 1e6 for name, v in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Strands hook overhead per model call")
    parser.add_argument("--invocations", type=int, default=300, help="tool-loop invocations per measurement")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as store:
        sdk.configure(store=store, fsync="never")
        print("| history (messages) | configuration | CPU µs / model call | overhead µs | ratio | wall µs |")
        print("|---:|---|---:|---:|---:|---:|")
        for turns in (0, 10, 50):
            results = measure(turns, args.invocations, args.repeats)
            base = results["strands, no hook"][0]
            for name, (us, wall) in results.items():
                row = (
                    f"| {2 * turns} | {name} | {us:.1f} | {us - base:+.1f} | {us / base:.2f}x | {wall:.0f} |"
                )
                print(row)
        print()
        print("| history (messages) | tracerl callbacks alone | µs / model call |")
        print("|---:|---|---:|")
        for turns in (0, 10, 50):
            for name, us in measure_callbacks(turns, 100, 10 * args.repeats).items():
                print(f"| {2 * turns + 3} | {name} | {us:.1f} |")
        sdk.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
