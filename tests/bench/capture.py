"""Capture benchmark: what tracing costs the agent, and how much the store takes.

Run: ``python tests/bench/capture.py`` (prints a table; record results in tests/bench/RESULTS.md).

1. On-thread capture cost per call for a ~2k-token conversation (p50/p99): ``record_call`` alone (the
   framework-hook path) and parse + record (the recording-transport path).
2. Wall time of captured vs uncaptured OpenAI-client calls against the loopback server (ratio).
3. Sustained captured calls/s from 16 threads, and the count lost (must be 0).
4. Bytes stored for a 20-turn thread / bytes of its final conversation as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sdk
from sdk.capture import CallRecord, record_call
from sdk.store import StoreReader

WORDS = "the quick brown fox jumps over the lazy dog while agents call tools and read results".split()


def _text(tokens: int, seed: int) -> str:
    # ~1 token per word: a 2k-token conversation is ~2000 words.
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(tokens))


def _conversation(turns: int, tokens: int) -> list[dict]:
    per = tokens // (2 * turns + 1)
    msgs = [{"role": "system", "content": _text(per, 0)}]
    for t in range(turns):
        msgs.append({"role": "user", "content": _text(per, t + 1)})
        msgs.append({"role": "assistant", "content": _text(per, t + 2)})
    return msgs


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_on_thread(n: int = 3000) -> dict[str, float]:
    from integrations.openai import parse_exchange

    base = _conversation(turns=6, tokens=2000)
    first, cont, transport = [], [], []
    for i in range(n):
        with sdk.session(task_id="bench"):
            msgs = [*base, {"role": "user", "content": f"question {i}"}]
            reply = {"role": "assistant", "content": _text(40, i)}
            rec = CallRecord(framework="bench", model="m", messages=msgs, response_message=reply)
            t0 = time.perf_counter_ns()
            record_call(rec)
            first.append((time.perf_counter_ns() - t0) / 1000)
            msgs2 = [*msgs, reply, {"role": "user", "content": "and then?"}]
            rec2 = CallRecord(framework="bench", model="m", messages=msgs2, response_message=reply)
            t0 = time.perf_counter_ns()
            record_call(rec2)
            cont.append((time.perf_counter_ns() - t0) / 1000)
            body = json.dumps({"model": "m", "messages": msgs2}).encode()
            resp = json.dumps(
                {
                    "model": "m",
                    "choices": [{"message": reply, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 2000, "completion_tokens": 40},
                }
            ).encode()
            t0 = time.perf_counter_ns()
            record_call(parse_exchange("chat.completions", json.loads(body), 200, resp))
            transport.append((time.perf_counter_ns() - t0) / 1000)
    return {
        "first call p50 µs": _pct(first, 0.5),
        "first call p99 µs": _pct(first, 0.99),
        "next turn p50 µs": _pct(cont, 0.5),
        "next turn p99 µs": _pct(cont, 0.99),
        "transport path p50 µs": _pct(transport, 0.5),
        "transport path p99 µs": _pct(transport, 0.99),
    }


def bench_wall_ratio(n: int = 300) -> dict[str, float]:
    import openai

    from integrations.openai import wrap_openai
    from sdk.testing import ScriptedOpenAIServer

    with ScriptedOpenAIServer() as server:
        plain = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        traced = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0))
        msgs = [*_conversation(turns=6, tokens=2000), {"role": "user", "content": "go"}]
        times: dict[str, list[float]] = {"plain": [], "traced": []}
        with sdk.session(task_id="bench"):
            for _ in range(20):  # warm up connections
                plain.chat.completions.create(model="m", messages=msgs)
                traced.chat.completions.create(model="m", messages=msgs)
            for _ in range(n):  # interleaved so machine noise hits both alike
                for name, client in (("plain", plain), ("traced", traced)):
                    t0 = time.perf_counter()
                    client.chat.completions.create(model="m", messages=msgs)
                    times[name].append(time.perf_counter() - t0)
    p, t = statistics.median(times["plain"]), statistics.median(times["traced"])
    return {"uncaptured median ms": p * 1000, "captured median ms": t * 1000, "captured/uncaptured": t / p}


def bench_threads(store: Path, threads: int = 16, per_thread: int = 2000) -> dict[str, float]:
    msgs = _conversation(turns=2, tokens=300)
    start = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        start.wait()
        for i in range(per_thread):
            with sdk.session(task_id=f"t{k}"):
                record_call(
                    CallRecord(
                        framework="bench",
                        model="m",
                        messages=[*msgs, {"role": "user", "content": f"{k}/{i}"}],
                        response_message={"role": "assistant", "content": "ok"},
                    )
                )

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    sdk.flush()
    stored = sum(
        len(s.calls) for s in StoreReader(store).sessions() if s.task_id and s.task_id.startswith("t")
    )
    total = threads * per_thread
    return {"calls/s (16 threads, session per call)": total / elapsed, "calls lost": total - stored}


def bench_storage(store: Path, turns: int = 20, tool_words: int = 60) -> dict[str, float]:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    msgs = [{"role": "system", "content": _text(200, 0)}, {"role": "user", "content": _text(50, 1)}]
    before = sum(f.stat().st_size for f in store.glob("*.jsonl"))
    with sdk.session(task_id="storage"):
        for t in range(turns):
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {"name": "search", "arguments": json.dumps({"q": _text(5, t)})},
                    }
                ],
            }
            record_call(
                CallRecord(
                    framework="bench",
                    model="m",
                    messages=list(msgs),
                    tools=tools,
                    response_message=reply,
                    usage={"prompt_tokens": 1, "completion_tokens": 1},
                )
            )
            msgs = [
                *msgs,
                reply,
                {"role": "tool", "tool_call_id": f"call_{t}", "content": _text(tool_words, t)},
            ]
    sdk.flush()
    stored = sum(f.stat().st_size for f in store.glob("*.jsonl")) - before
    final = len(json.dumps({"messages": msgs, "tools": tools}, separators=(",", ":")).encode())
    label = f"20 turns, {tool_words}-word tool results"
    return {
        f"{label}: stored bytes": stored,
        f"{label}: final bytes": final,
        f"{label}: stored/final": stored / final,
    }


def main() -> None:
    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory() as d:
        store = Path(d)
        sdk.configure(store=store)
        targets = {
            "first call p50 µs": "≤ 50",
            "next turn p50 µs": "≤ 50",
            "first call p99 µs": "≤ 500",
            "next turn p99 µs": "≤ 500",
            "calls/s (16 threads, session per call)": "≥ 10000",
            "calls lost": "0",
        }
        targets.update({f"20 turns, {w}-word tool results: stored/final": "≤ 1.2" for w in (60, 250)})
        parts = (
            bench_on_thread(),
            bench_wall_ratio(),
            bench_threads(store),
            bench_storage(store, tool_words=60),
            bench_storage(store, tool_words=250),
        )
        for part in parts:
            rows.extend((k, v, targets.get(k, "")) for k, v in part.items())
        sdk.shutdown()
    width = max(len(r[0]) for r in rows)
    print(f"{'metric':<{width}}  {'value':>12}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>12.3f}  {target}")


if __name__ == "__main__":
    main()
