"""Scaling-out benchmarks: Ray scheduling overhead per rollout unit, and export of an s3:// store vs local disk.

1. ``sdk.rollout`` with a no-op agent (``builtins:len``, no reward function), N units, locally and as Ray tasks
   on a local Ray head (``ray.init(num_cpus=2)``); overhead per unit = (Ray wall time - local wall time) / N.
2. A store of ``--calls`` calls (``tests/bench/export.py``'s generator) exported from local disk and from moto's
   S3 server on 127.0.0.1 after uploading it (cold read cache: the export's time includes the download);
   target: the s3:// export within 1.5x of the local one. Runs are interleaved.

Usage::

    PYTHONPATH=. python tests/bench/ray_s3.py --units 200 --calls 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def bench_rollout(units: int, concurrency: int) -> dict:
    # A token of this run's own: a fresh local cluster would otherwise write one to ~/.ray/auth_token.
    # Set before Ray is imported: it reads RAY_AUTH_MODE at import.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_TOKEN", os.urandom(16).hex())
    import ray

    from sdk.rollout import RolloutSpec, run_rollout

    tmp = Path(tempfile.mkdtemp())
    tasks = [{"id": f"t{i}"} for i in range(units)]
    spec = RolloutSpec("builtins:len", concurrency=concurrency)
    t0 = time.perf_counter()
    run_rollout(spec, tasks, store=tmp / "s1", results=tmp / "r1.jsonl")
    local = time.perf_counter() - t0
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        kw = {"store": tmp / "s2", "ray": "auto"}
        run_rollout(spec, tasks[:4], results=tmp / "warm.jsonl", **kw)  # workers started
        t0 = time.perf_counter()
        run_rollout(spec, tasks, results=tmp / "r2.jsonl", **kw)
        on_ray = time.perf_counter() - t0
    finally:
        ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "units": units,
        "concurrency": concurrency,
        "local_s": round(local, 3),
        "ray_s": round(on_ray, 3),
        "ray_ms_per_unit": round(1000 * on_ray / units, 2),
        "overhead_ms_per_unit": round(1000 * (on_ray - local) / units, 2),
    }


def bench_s3_export(calls: int, repeat: int) -> dict:
    import fsspec
    from export import make_store  # tests/bench/export.py
    from moto.server import ThreadedMotoServer

    from sdk.episodes import export

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_ENDPOINT_URL=f"http://{host}:{port}"
    )
    tmp = Path(tempfile.mkdtemp())
    os.environ["TRACERL_SPOOL"] = str(tmp / "cache")
    try:
        store = tmp / "store"
        make_store(store, calls, "openai")
        size = sum(p.stat().st_size for p in store.glob("*.jsonl"))
        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        fs.put([str(p) for p in store.glob("*.jsonl")], "bench/store/")
        local_t, s3_t = [], []
        for i in range(repeat):
            t0 = time.perf_counter()
            export(store, tmp / f"l{i}.parquet", workers=1)
            local_t.append(time.perf_counter() - t0)
            shutil.rmtree(tmp / "cache", ignore_errors=True)  # cold: download included
            t0 = time.perf_counter()
            export("s3://bench/store", tmp / f"s{i}.parquet", workers=1)
            s3_t.append(time.perf_counter() - t0)
        return {
            "calls": calls,
            "store_mb": round(size / 2**20, 1),
            "local_s": [round(x, 2) for x in local_t],
            "s3_s": [round(x, 2) for x in s3_t],
            "ratio_median": round(statistics.median(s3_t) / statistics.median(local_t), 3),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--units", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--calls", type=int, default=100000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps({"rollout": bench_rollout(args.units, args.concurrency)}), flush=True)
    print(json.dumps({"s3_export": bench_s3_export(args.calls, args.repeat)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
