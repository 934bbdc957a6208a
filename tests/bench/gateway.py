"""Gateway benchmark: what the recording gateway adds to a call, and how many calls/s it carries.

Run: ``python tests/bench/gateway.py [--calls 500] [--seconds 8]`` (prints a table; record results in
tests/bench/RESULTS.md). The upstream (``python -m sdk.testing``), the gateway (``python -m sdk.gateway``)
and the load generators are separate processes on 127.0.0.1.

1. Latency, one call at a time on a keep-alive connection, direct and through a one-worker gateway
   (interleaved): p50/p99 per call, and for streamed calls the time to the first body bytes.
2. Throughput through one gateway with two workers: two load processes, each with many concurrent
   sessions (``X-Tracerl-Session``), half the calls streamed; calls/s direct and through the gateway,
   and lost = responses received in full but not in the store (must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BODY = {
    "model": "m",
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}],
}


def _spawn(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = next(w for w in line.split() if w.startswith("http://"))
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_for_workers(base: str, workers: int, timeout: float = 120.0) -> None:
    import httpx

    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(pids) < workers and time.monotonic() < deadline:
        with httpx.Client() as http:  # a new connection each time: the kernel picks a worker
            pids.add(http.get(base.removesuffix("/v1") + "/stats", timeout=60).json()["worker_pid"])
    assert len(pids) >= workers, f"only {len(pids)} of {workers} workers answered"


def bench_latency(direct: str, through: str, n: int, gateway_pid: int) -> dict[str, dict[str, float]]:
    import httpx

    times: dict[str, list[float]] = {k: [] for k in ("direct", "gateway", "direct_ttfc", "gateway_ttfc")}
    stream_body = {**BODY, "stream": True}
    with httpx.Client(timeout=30) as http:
        cpu0 = 0.0
        for i in range(n + 50):
            if i == 50:
                cpu0 = _cpu_s(gateway_pid)
            for name, base in (("direct", direct), ("gateway", through)):
                t0 = time.perf_counter()
                r = http.post(base + "/chat/completions", json=BODY)
                t1 = time.perf_counter()
                assert r.status_code == 200
                with http.stream("POST", base + "/chat/completions", json=stream_body) as s:
                    it = s.iter_raw()
                    next(it)
                    t2 = time.perf_counter()
                    for _ in it:
                        pass
                if i >= 50:  # warm-up
                    times[name].append((t1 - t0) * 1e3)
                    times[name + "_ttfc"].append((t2 - t1) * 1e3)
        cpu = _cpu_s(gateway_pid) - cpu0
    out = {k: {"p50": statistics.median(v), "p99": _pct(v, 0.99)} for k, v in times.items()}
    out["gateway_cpu_ms_per_call"] = {
        "mean": cpu / (2 * n) * 1e3
    }  # CPU time: what contention does not inflate
    out["added"] = {q: out["gateway"][q] - out["direct"][q] for q in ("p50", "p99")}
    out["added_ttfc"] = {q: out["gateway_ttfc"][q] - out["direct_ttfc"][q] for q in ("p50", "p99")}
    return out


LOAD = r"""
import asyncio, json, sys, time, uuid
import httpx

base, seconds, concurrency, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body = json.loads(sys.argv[5])
received = []

async def agent(http, i, deadline):
    headers = {"X-Tracerl-Session": uuid.uuid4().hex}
    k = 0
    while time.perf_counter() < deadline:
        k += 1
        if (i + k) % 2:
            async with http.stream("POST", base + "/chat/completions", json={**body, "stream": True}, headers=headers) as r:
                async for _ in r.aiter_raw():
                    pass
        else:
            r = await http.post(base + "/chat/completions", json=body, headers=headers)
            await r.aread()
        assert r.status_code == 200, r.status_code
        received.append(r.headers["x-request-id"])

async def main():
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(http, i, t0 + seconds) for i in range(concurrency)))
        elapsed = time.perf_counter() - t0
    with open(out, "w") as f:
        json.dump({"received": received, "elapsed": elapsed}, f)

asyncio.run(main())
"""


def bench_throughput(base: str, seconds: float, procs: int = 2, concurrency: int = 32) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-gw-load-"))
    script = tmp / "load.py"
    script.write_text(LOAD)
    outs = [tmp / f"out{i}.json" for i in range(procs)]
    running = [
        subprocess.Popen(
            [sys.executable, str(script), base, str(seconds), str(concurrency), str(o), json.dumps(BODY)]
        )
        for o in outs
    ]
    for p in running:
        assert p.wait(timeout=seconds + 120) == 0
    results = [json.loads(o.read_text()) for o in outs]
    received = [rid for r in results for rid in r["received"]]
    elapsed = max(r["elapsed"] for r in results)
    return {"calls": len(received), "calls_per_s": len(received) / elapsed, "received": received}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    from sdk.store import StoreReader

    store = Path(tempfile.mkdtemp(prefix="tracerl-gw-bench-"))
    upstream, direct = _spawn([sys.executable, "-m", "sdk.testing", "--port", "0"])
    try:
        gw1, through1 = _spawn([sys.executable, "-m", "sdk.gateway", "--upstream", direct, "--port", "0",
                                "--store", str(store / "latency")])  # fmt: skip
        try:
            _wait_for_workers(through1, 1)
            lat = bench_latency(direct, through1, args.calls, gw1.pid)
        finally:
            _stop(gw1)
        plain = bench_throughput(direct, args.seconds)
        gw2, through2 = _spawn([sys.executable, "-m", "sdk.gateway", "--upstream", direct, "--port", "0",
                                "--store", str(store / "load"), "--workers", "2"])  # fmt: skip
        try:
            _wait_for_workers(through2, 2)
            load = bench_throughput(through2, args.seconds)
        finally:
            _stop(gw2)
    finally:
        _stop(upstream)
    reader = StoreReader(store / "load")
    stored = {c["request_id"] for s in reader.sessions() for c in s.calls}
    lost = len(set(load["received"]) - stored)  # type: ignore[arg-type]
    chains = len(reader.segments())

    print(f"gateway benchmark, {args.calls} calls each way (ms)")
    print(f"{'':28}{'p50':>9}{'p99':>9}")
    for key, label in (("direct", "direct call"), ("gateway", "through the gateway"), ("added", "added"),
                       ("direct_ttfc", "direct first chunk"), ("gateway_ttfc", "gateway first chunk"),
                       ("added_ttfc", "added to first chunk")):  # fmt: skip
        print(f"{label:28}{lat[key]['p50']:9.3f}{lat[key]['p99']:9.3f}")
    print(
        f"gateway CPU per call (mean of plain and streamed): {lat['gateway_cpu_ms_per_call']['mean']:.3f} ms"
    )
    print(f"\nthroughput, 2 load processes x 32 sessions, {args.seconds:.0f} s, half streamed")
    print(f"direct:              {plain['calls_per_s']:8.0f} calls/s")
    print(f"gateway (2 workers): {load['calls_per_s']:8.0f} calls/s, {load['calls']} calls, lost {lost}, "
          f"segment chains {chains}, sessions {reader.num_sessions}, problems {dict(reader.problems)}")  # fmt: skip
    print(json.dumps({"latency_ms": lat, "direct_calls_per_s": plain["calls_per_s"],
                      "gateway_calls_per_s": load["calls_per_s"], "lost": lost, "run": uuid.uuid4().hex[:6]}))  # fmt: skip


if __name__ == "__main__":
    main()
