"""Gateway benchmark: what the recording gateway adds to a call, and how many calls/s it carries.

Run: ``python tests/bench/gateway.py [--calls 500] [--seconds 10] [--upstream fast|scripted]`` (prints a
table; record results in tests/bench/RESULTS.md). The upstream, the gateway (``python -m sdk.gateway``)
and the load generators are separate processes on 127.0.0.1. The default upstream is
tests/bench/gateway_upstream.py (canned answers on uvicorn), so that the numbers are the gateway's;
``--upstream scripted`` uses ``python -m sdk.testing`` (exact, but ~150 calls/s on two cores).

1. Latency, one call at a time on a keep-alive connection, direct and through a one-worker gateway
   (interleaved): p50/p99 per call, and for streamed calls the time to the first body bytes.
2. Throughput through one gateway with two workers: load processes (aiohttp), each with many concurrent
   sessions (``X-Tracerl-Session``), half the calls streamed; calls/s direct and through the gateway,
   and lost = responses received in full but not in the store (must be 0).

Wall-clock numbers depend on what else runs on the machine; the CPU time per call of each process
(gateway workers, upstream, load generators; from /proc) does much less, so both are printed.
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


def _spawn(cmd: list[str], root: Path = ROOT) -> tuple[subprocess.Popen[str], str]:
    """Start ``cmd`` with ``root`` (a checkout) first on the path; its URL from its first line."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
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
    """User + system CPU seconds of ``pid`` and all its descendants still running."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _wait_for_workers(base: str, workers: int, timeout: float = 120.0) -> None:
    import httpx

    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(pids) < workers and time.monotonic() < deadline:
        with httpx.Client() as http:  # a new connection each time: the kernel picks a worker
            pids.add(http.get(base.removesuffix("/v1") + "/stats", timeout=60).json()["worker_pid"])
    assert len(pids) >= workers, f"only {len(pids)} of {workers} workers answered"


def bench_latency(direct: str, through: str, n: int, pids: dict[str, int]) -> dict[str, dict[str, float]]:
    import httpx

    times: dict[str, list[float]] = {k: [] for k in ("direct", "gateway", "direct_ttfc", "gateway_ttfc")}
    stream_body = {**BODY, "stream": True}
    cpu0: dict[str, float] = {}
    with httpx.Client(timeout=30) as http:
        for i in range(n + 50):
            if i == 50:
                cpu0 = {k: _cpu_s(p) for k, p in pids.items()}
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
    out = {k: {"p50": statistics.median(v), "p99": _pct(v, 0.99)} for k, v in times.items()}
    # CPU time per call (plain and streamed, mean): what contention from other processes does not inflate.
    # The gateway sees 2n calls, the upstream 4n (direct and through the gateway).
    out["cpu_ms_per_call"] = {
        "gateway": (_cpu_s(pids["gateway"]) - cpu0["gateway"]) / (2 * n) * 1e3,
        "upstream": (_cpu_s(pids["upstream"]) - cpu0["upstream"]) / (4 * n) * 1e3,
    }
    out["added"] = {q: out["gateway"][q] - out["direct"][q] for q in ("p50", "p99")}
    out["added_ttfc"] = {q: out["gateway_ttfc"][q] - out["direct_ttfc"][q] for q in ("p50", "p99")}
    return out


LOAD = r"""
import asyncio, json, os, sys, time, uuid
import aiohttp

base, seconds, concurrency, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body = json.loads(sys.argv[5])
plain = json.dumps(body).encode()
streamed = json.dumps({**body, "stream": True}).encode()
url = base + "/chat/completions"
received = []

async def agent(http, i, deadline):
    headers = {"X-Tracerl-Session": uuid.uuid4().hex, "Content-Type": "application/json"}
    k = 0
    while time.perf_counter() < deadline:
        k += 1
        async with http.post(url, data=streamed if (i + k) % 2 else plain, headers=headers) as r:
            async for _ in r.content.iter_any():
                pass
            assert r.status == 200, r.status
            received.append(r.headers["x-request-id"])

async def main():
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        t0 = time.perf_counter()
        cpu0 = sum(os.times()[:2])
        await asyncio.gather(*(agent(http, i, t0 + seconds) for i in range(concurrency)))
        elapsed = time.perf_counter() - t0
        cpu = sum(os.times()[:2]) - cpu0
    with open(out, "w") as f:
        json.dump({"received": received, "elapsed": elapsed, "cpu_s": cpu}, f)

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


def bench_throughput(
    base: str, seconds: float, pids: dict[str, int], procs: int = 2, concurrency: int = 32
) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-gw-load-"))
    script = tmp / "load.py"
    script.write_text(LOAD)
    outs = [tmp / f"out{i}.json" for i in range(procs)]
    cpu0 = {k: _cpu_s(p) for k, p in pids.items()}
    running = [
        subprocess.Popen(
            [sys.executable, str(script), base, str(seconds), str(concurrency), str(o), json.dumps(BODY)]
        )
        for o in outs
    ]
    for p in running:
        assert p.wait(timeout=seconds + 120) == 0
    cpu = {k: _cpu_s(p) - cpu0[k] for k, p in pids.items()}
    results = [json.loads(o.read_text()) for o in outs]
    received = [rid for r in results for rid in r["received"]]
    elapsed = max(r["elapsed"] for r in results)
    cpu["load"] = sum(r["cpu_s"] for r in results)
    n = len(received)
    return {
        "calls": n,
        "calls_per_s": n / elapsed,
        "received": received,
        "cpu_ms_per_call": {k: v / n * 1e3 for k, v in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--upstream", choices=["fast", "scripted"], default="fast")
    parser.add_argument("--load-procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32, help="sessions per load process")
    args = parser.parse_args()
    from sdk.store import StoreReader

    store = Path(tempfile.mkdtemp(prefix="tracerl-gw-bench-"))
    up_cmd = (
        [sys.executable, str(ROOT / "tests/bench/gateway_upstream.py"), "--port", "0"]
        if args.upstream == "fast"
        else [sys.executable, "-m", "sdk.testing", "--port", "0"]
    )
    upstream, direct = _spawn(up_cmd)
    gw_cmd = [sys.executable, "-m", "sdk.gateway", "--upstream", direct, "--port", "0"]
    load_args = {"seconds": args.seconds, "procs": args.load_procs, "concurrency": args.concurrency}
    try:
        gw1, through1 = _spawn([*gw_cmd, "--store", str(store / "latency")])
        try:
            _wait_for_workers(through1, 1)
            lat = bench_latency(direct, through1, args.calls, {"gateway": gw1.pid, "upstream": upstream.pid})
        finally:
            _stop(gw1)
        plain = bench_throughput(direct, pids={"upstream": upstream.pid}, **load_args)
        gw2, through2 = _spawn([*gw_cmd, "--store", str(store / "load"), "--workers", "2"])
        try:
            _wait_for_workers(through2, 2)
            load = bench_throughput(
                through2, pids={"gateway": gw2.pid, "upstream": upstream.pid}, **load_args
            )
        finally:
            _stop(gw2)
    finally:
        _stop(upstream)
    reader = StoreReader(store / "load")
    stored = {c["request_id"] for s in reader.sessions() for c in s.calls}
    lost = len(set(load["received"]) - stored)  # type: ignore[call-overload]
    chains = len(reader.segments())

    print(f"gateway benchmark ({args.upstream} upstream), {args.calls} calls each way (ms), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'':28}{'p50':>9}{'p99':>9}")
    for key, label in (("direct", "direct call"), ("gateway", "through the gateway"), ("added", "added"),
                       ("direct_ttfc", "direct first chunk"), ("gateway_ttfc", "gateway first chunk"),
                       ("added_ttfc", "added to first chunk")):  # fmt: skip
        print(f"{label:28}{lat[key]['p50']:9.3f}{lat[key]['p99']:9.3f}")
    cpu = lat["cpu_ms_per_call"]
    print(f"CPU per call, one at a time: gateway {cpu['gateway']:.3f} ms, upstream {cpu['upstream']:.3f} ms")
    print(f"\nthroughput, {args.load_procs} load processes x {args.concurrency} sessions, "
          f"{args.seconds:.0f} s, half streamed")  # fmt: skip
    for name, r in (("direct", plain), ("gateway (2 workers)", load)):
        c = r["cpu_ms_per_call"]
        cpus = ", ".join(f"{k} {v:.3f}" for k, v in c.items())  # type: ignore[union-attr]
        print(f"{name:20} {r['calls_per_s']:8.0f} calls/s ({r['calls']} calls); CPU ms per call: {cpus}")
    gw_cpu = load["cpu_ms_per_call"]["gateway"]  # type: ignore[index]
    print(f"gateway: lost {lost}, segment chains {chains}, sessions {reader.num_sessions}, "
          f"problems {dict(reader.problems)}; two free cores at {gw_cpu:.3f} ms CPU per call "
          f"carry ~{2000 / gw_cpu:.0f} calls/s")  # fmt: skip
    print(json.dumps({"latency_ms": lat, "direct": {k: v for k, v in plain.items() if k != "received"},
                      "gateway": {k: v for k, v in load.items() if k != "received"}, "lost": lost,
                      "run": uuid.uuid4().hex[:6]}))  # fmt: skip


if __name__ == "__main__":
    main()
