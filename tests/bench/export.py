"""Export benchmark: calls/s from a store to Parquet, and peak RSS as the store grows.

Run: ``python tests/bench/export.py`` (prints a table; record results in tests/bench/RESULTS.md).
Options: ``--calls 100000,1000000`` store sizes, ``--profiles openai,vllm``, ``--workers 1``,
``--keep DIR`` to keep the generated stores.

Stores are generated in the writer's exact format: one real session is recorded through ``sdk`` (an
agent with a system prompt, a question and three tool rounds: 4 calls, prefix-deduplicated), then its
lines are replicated with fresh session/call ids, task ids and rewards, into 4 process chains (segments
rotate at 64 MB), as parallel rollout workers would write them. Profiles:

- ``openai``: what an OpenAI-style API returns (messages, tools, usage; no token data);
- ``vllm``: plus per-token logprobs and completion token ids (40 per call) and the prompt token ids of
  every call (250-550 ids), as a vLLM server returns them for RL.

Each export runs in a fresh subprocess that reports its own wall time, CPU time and peak RSS
(``ru_maxrss``, largest of itself and its workers); the parent samples the RSS of the whole process tree
(psutil) for the all-processes peak. calls/s is calls / wall time; calls/CPU-s divides by the CPU time of
the export and its workers, which stays meaningful on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CALLS_PER_SESSION = 4
PROCESSES = 4
SEGMENT_MAX = 64 * 1024 * 1024
WORDS = "the quick brown fox jumps over the lazy dog while agents call tools and read results".split()
SID = "S" * 32
TASK = "TASKPLACEHOLDER"


def _text(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n))


def _template(profile: str) -> list[bytes]:
    """Record one session through the SDK and return its segment lines (with placeholder ids)."""
    import sdk
    from sdk.capture import CallRecord, record_call

    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{k}",
                "description": _text(20, k),
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for k in range(3)
    ]
    with tempfile.TemporaryDirectory() as d:
        sdk.configure(store=d)
        with sdk.session(task_id=TASK, session_id=SID, split="train") as s:
            msgs = [{"role": "system", "content": _text(200, 0)}, {"role": "user", "content": _text(40, 1)}]
            for k in range(CALLS_PER_SESSION):
                last = k == CALLS_PER_SESSION - 1
                if last:
                    reply = {"role": "assistant", "content": _text(40, k)}
                else:
                    args = json.dumps({"q": _text(6, k)})
                    reply = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{k}",
                                "type": "function",
                                "function": {"name": f"tool_{k}", "arguments": args},
                            }
                        ],
                    }
                extra = {}
                if profile == "vllm":
                    n = 40
                    extra = {
                        "logprobs": [{"token": f"tok{i}", "logprob": -0.01 * (i + 1)} for i in range(n)],
                        "completion_token_ids": [1000 + i for i in range(n)],
                        "prompt_token_ids": list(range(250 + 100 * k)),
                    }
                record_call(
                    CallRecord(
                        framework="openai",
                        model="policy",
                        messages=list(msgs),
                        tools=tools,
                        response_message=reply,
                        finish_reason="stop" if last else "tool_calls",
                        call_id=f"C{k}" * 16,
                        usage={
                            "prompt_tokens": 250 + 100 * k,
                            "completion_tokens": 40,
                            "total_tokens": 290 + 100 * k,
                        },
                        **extra,
                    )
                )
                msgs.append(reply)
                if not last:
                    msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": _text(60, k + 7)})
            s.reward(0.123456789)
        sdk.shutdown()
        [seg] = Path(d).glob("*.jsonl")
        return seg.read_bytes().splitlines(keepends=True)


def make_store(path: Path, calls: int, profile: str) -> int:
    """Write a store of about ``calls`` calls; return the number of calls written."""
    lines = _template(profile)
    rng = random.Random(0)
    path.mkdir(parents=True, exist_ok=True)
    files = [None] * PROCESSES
    sizes = [0] * PROCESSES
    seqs = [0] * PROCESSES
    sessions = calls // CALLS_PER_SESSION
    for i in range(sessions):
        p = i % PROCESSES
        if files[p] is None or sizes[p] >= SEGMENT_MAX:
            if files[p] is not None:
                files[p].close()
            seqs[p] += 1
            files[p] = open(path / f"20260101T000000-bench-{p}-abcdef.{seqs[p]:05d}.jsonl", "wb")
            sizes[p] = 0
        sid = f"{i:032x}".encode()
        task = f"task-{i % 1000:05d}".encode()
        reward = f"{rng.random():.6f}".encode()
        chunk = b"".join(lines).replace(SID.encode(), sid).replace(TASK.encode(), task)
        for k in range(CALLS_PER_SESSION):
            chunk = chunk.replace((f"C{k}" * 16).encode(), f"{i:030x}{k:02d}".encode())
        chunk = chunk.replace(b"0.123456789", reward)
        files[p].write(chunk)
        sizes[p] += len(chunk)
    for f in files:
        if f is not None:
            f.close()
    return sessions * CALLS_PER_SESSION


_CHILD = """
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from sdk.episodes import export
s = export(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
children = resource.getrusage(resource.RUSAGE_CHILDREN)
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children.ru_maxrss) / 1024
print(json.dumps({"calls": s.calls, "episodes": s.written, "rejected": s.rejected_total, "wall": wall,
                  "cpu": cpu + children.ru_utime + children.ru_stime, "rss_mb": rss}))
"""


def _tree_rss_mb(pid: int) -> float:
    """RSS of a process and its children (worker processes), in MB; 0 without psutil."""
    try:
        import psutil
    except ImportError:
        return 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs) / 1e6
    except psutil.Error:
        return 0.0


def run_export(store: Path, out: Path, workers: int) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(store), str(out), str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    peak_total = 0.0
    while proc.poll() is None:
        peak_total = max(peak_total, _tree_rss_mb(proc.pid))
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"export failed: {stderr.strip().splitlines()[-1]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["rss_total_mb"] = peak_total
    return result


def python_speed() -> float:
    """Seconds for a fixed pure-Python loop (best of 3): how fast this machine runs Python right now.

    Shared vCPUs run Python faster or slower from hour to hour: compare calls/s across runs only together
    with this figure.
    """
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", default="100000,1000000", help="comma-separated store sizes in calls")
    p.add_argument("--profiles", default="openai,vllm", help="comma-separated: openai, vllm")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts for export(workers=...)")
    p.add_argument("--keep", metavar="DIR", help="generate stores under DIR and keep them")
    args = p.parse_args(argv)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tracerl-bench-"))
    rows = []
    try:
        for profile in args.profiles.split(","):
            for calls in (int(c) for c in args.calls.split(",")):
                store = base / f"{profile}-{calls}"
                if not store.exists():
                    t0 = time.perf_counter()
                    make_store(store, calls, profile)
                    print(f"generated {store} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                size = sum(f.stat().st_size for f in store.glob("*.jsonl"))
                for workers in (int(w) for w in args.workers.split(",")):
                    out = base / f"{profile}-{calls}-w{workers}.parquet"
                    r = run_export(store, out, workers)
                    rows.append(
                        (
                            profile,
                            r["calls"],
                            workers,
                            size / 1e6,
                            out.stat().st_size / 1e6,
                            r["episodes"],
                            r["wall"],
                            r["calls"] / r["wall"],
                            r["calls"] / r["cpu"],
                            r["rss_mb"],
                            r["rss_total_mb"],
                        )
                    )
                    out.unlink()
                    print(f"{profile} {calls} w{workers}: {r}", file=sys.stderr)
    finally:
        if not args.keep:
            for f in sorted(base.rglob("*"), reverse=True):
                f.rmdir() if f.is_dir() else f.unlink()
            base.rmdir()
    load = os.getloadavg()[0]
    speed = python_speed()
    print(
        f"\nexport benchmark ({os.cpu_count()} CPUs, load average {load:.1f}, "
        f"Python speed: 10M-add loop {speed:.2f} s)\n"
    )
    head = (
        "profile",
        "calls",
        "workers",
        "store MB",
        "parquet MB",
        "episodes",
        "wall s",
        "calls/s",
        "calls/CPU-s",
        "peak RSS MB (largest process)",
        "peak RSS MB (all processes)",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print(
            f"| {r[0]} | {r[1]:,} | {r[2]} | {r[3]:,.0f} | {r[4]:,.1f} | {r[5]:,} | {r[6]:.1f} | "
            f"{r[7]:,.0f} | {r[8]:,.0f} | {r[9]:,.0f} | {r[10]:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
