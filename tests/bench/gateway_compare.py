"""What two versions of the gateway add to a call, measured in one interleaved run.

Run: ``python tests/bench/gateway_compare.py --base-root DIR [--calls 400] [--rounds 5]`` where ``DIR`` is
another checkout (e.g. ``git worktree add /tmp/gw-base <commit>``). One upstream
(tests/bench/gateway_upstream.py) and two one-worker gateways, ``python -m sdk.gateway`` from ``DIR`` and
from this checkout, are separate processes on 127.0.0.1. Each round sends ``--calls`` calls (one plain and
one streamed each) one at a time on keep-alive connections, rotating the order direct / base / this on
every call, so that whatever else loads the machine hits all three alike. Printed: p50/p99 per call and
to the first streamed bytes, what each gateway adds (p50 minus direct), and each gateway's CPU per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway import BODY, ROOT, _cpu_s, _pct, _spawn, _stop, _wait_for_workers


def _one(http: httpx.Client, base: str) -> tuple[float, float]:
    """One plain call and one streamed call: (plain ms, ms to the first streamed bytes)."""
    t0 = time.perf_counter()
    r = http.post(base + "/chat/completions", json=BODY)
    t1 = time.perf_counter()
    assert r.status_code == 200, r.text
    with http.stream("POST", base + "/chat/completions", json={**BODY, "stream": True}) as s:
        it = s.iter_raw()
        next(it)
        t2 = time.perf_counter()
        for _ in it:
            pass
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-root", required=True, type=Path, help="the other checkout's root")
    parser.add_argument("--calls", type=int, default=400, help="calls per round to each target")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    store = Path(tempfile.mkdtemp(prefix="tracerl-gw-compare-"))
    upstream, direct = _spawn([sys.executable, str(ROOT / "tests/bench/gateway_upstream.py"), "--port", "0"])
    procs: dict[str, subprocess.Popen[str]] = {}
    targets = {"direct": direct}
    try:
        for name, root in (("base", args.base_root.resolve()), ("this", ROOT)):
            cmd = [sys.executable, "-m", "sdk.gateway", "--upstream", direct, "--port", "0"]
            procs[name], targets[name] = _spawn([*cmd, "--store", str(store / name)], root)
            _wait_for_workers(targets[name], 1)
        times: dict[str, list[float]] = {f"{k}{s}": [] for k in targets for s in ("", "_ttfc")}
        cpu = {k: 0.0 for k in procs}
        order = list(targets)
        with httpx.Client(timeout=30) as http:
            for k in order * 30:  # warm-up
                _one(http, targets[k])
            for _ in range(args.rounds):
                cpu0 = {k: _cpu_s(p.pid) for k, p in procs.items()}
                for i in range(args.calls):
                    for k in order[i % 3 :] + order[: i % 3]:
                        plain, ttfc = _one(http, targets[k])
                        times[k].append(plain)
                        times[k + "_ttfc"].append(ttfc)
                for k, p in procs.items():
                    cpu[k] += _cpu_s(p.pid) - cpu0[k]
    finally:
        for p in procs.values():
            _stop(p)
        _stop(upstream)
    n = args.calls * args.rounds
    stats = {k: {"p50": statistics.median(v), "p99": _pct(v, 0.99)} for k, v in times.items()}
    added = {
        k: {q: stats[k + s]["p50"] - stats["direct" + s]["p50"] for q, s in (("call", ""), ("ttfc", "_ttfc"))}
        for k in procs
    }
    cpu_ms = {k: v / (2 * n) * 1e3 for k, v in cpu.items()}
    print(
        f"gateway compare: {args.rounds} rounds x {args.calls} calls (plain + streamed) to each target, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'':26}{'p50':>9}{'p99':>9}")
    for k in times:
        print(f"{k:26}{stats[k]['p50']:9.3f}{stats[k]['p99']:9.3f}")
    for k in procs:
        print(
            f"{k}: added p50 {added[k]['call']:.3f} ms per call, {added[k]['ttfc']:.3f} ms to the first "
            f"chunk; CPU {cpu_ms[k]:.3f} ms per call"
        )
    ratio = {m: added["this"][m] / added["base"][m] for m in ("call", "ttfc")}
    print(f"this / base added: call {ratio['call']:.3f}, first chunk {ratio['ttfc']:.3f}; "
          f"CPU {cpu_ms['this'] / cpu_ms['base']:.3f}")  # fmt: skip
    print(json.dumps({"latency_ms": stats, "added_ms": added, "cpu_ms_per_call": cpu_ms, "ratio": ratio}))


if __name__ == "__main__":
    main()
