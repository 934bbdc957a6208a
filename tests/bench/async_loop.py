"""The main job in lock-step and asynchronous mode, same sample budget, with a per-tool-call latency.

Each run is ``python -m examples.main --agent openai --seed S [--async]`` in a fresh process whose
calculator tool sleeps ``L`` seconds per call (``ARITHMETIC_TOOL_LATENCY_S``; the raw ``openai`` agent).
Reported per (latency, mode, seed): the loop's wall time (``wall_s`` of its last metrics row: the part the
two modes differ in), the process's (the SFT warm start is the same in every run of a seed, so it is made by
the seed's first run and reused; the process time of that run includes it), held-out success before and
after, samples collected, and for async the staleness of the trained groups (versions behind: groups) and
the samples dropped, by reason. Then per (latency, seed), the time at which each mode's validation first
reached the lock-step final success less two standard errors, over the lock-step loop's wall time. The
tables are printed as Markdown; ``--json`` writes every figure.

Full benchmark (issue 25's target: at 0.3 s async reaches the lock-step final success within 2 standard
errors in <= 0.6x its wall time; at 0 s no worse than 1.1x)::

    python tests/bench/async_loop.py --seeds 0 1 2 --latencies 0 0.3 1 --out /tmp/bench-async

Reduced (one seed, two latencies)::

    python tests/bench/async_loop.py --seeds 0 --latencies 0 0.3 --out /tmp/bench-async
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child(latency: float, argv: list[str]) -> None:
    """Run the main job in this process with a slow calculator tool.

    The latency goes through the environment (``ARITHMETIC_TOOL_LATENCY_S``): the async loop's collector and
    validation run in spawned processes, which a patch of this process's modules would not reach.
    """
    sys.path.insert(0, str(ROOT))
    os.environ["ARITHMETIC_TOOL_LATENCY_S"] = str(latency)
    from examples.main import main

    main(argv)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summarize_run(out: Path, wall: float) -> dict[str, Any]:
    """Figures of one finished run directory."""
    res = json.loads((out / "results.json").read_text())
    rows = _jsonl(out / "metrics.jsonl")
    rollouts = out / "rollouts"
    train_files = [p for p in rollouts.glob("*.jsonl") if not p.name.startswith("eval")]
    samples = sum(len(_jsonl(p)) for p in train_files)
    staleness: Counter[int] = Counter()
    last = {r["policy_version"]: r for r in rows if r.get("kind") == "train"}
    for r in last.values():
        staleness.update({int(k): v for k, v in (r.get("staleness_hist") or {}).items()})
    dropped = Counter(d["reason"] for d in _jsonl(out / "dropped_samples.jsonl"))
    evals = [r for r in rows if r.get("val_success") is not None]
    final = evals[-1] if evals else {}
    # When the validated weights were served: async, the publish of the version a validation measured
    # (version 0 at the start); lock-step, the end of the round's training, i.e. before its validation.
    published = {0: 0.0}
    for r in rows:
        if r.get("kind") == "train":
            published.setdefault(int(r["policy_version"]), float(r["wall_s"]))

    def served_at(r: dict[str, Any]) -> float | None:
        if r.get("kind") == "eval":
            return published.get(int(r.get("policy_version") or 0))
        return round(float(r["wall_s"]) - float(r.get("eval_s") or 0), 1) if r.get("wall_s") else None

    se = final.get("val_success_se", final.get("val_pass_at_1_se"))
    return {
        "wall_s": round(wall, 1),
        "loop_s": max((float(r.get("wall_s") or 0) for r in rows), default=None),
        "validations": [(r.get("wall_s"), r["val_success"]) for r in evals],
        "validations_served": [(served_at(r), r["val_success"]) for r in evals],
        "pre": res["summary"]["pre"],
        "post": res["summary"]["post"],
        "post_se": se,
        "samples": samples,
        "versions_or_rounds": len(last) or len([r for r in rows if r.get("round", 0) > 0]),
        "staleness": dict(sorted(staleness.items())),
        "dropped": dict(dropped),
    }


def run_one(
    latency: float, seed: int, mode: str, out: Path, extra: list[str], sft: Path | None = None
) -> dict[str, Any]:
    """One run in a fresh process; ``sft``: an SFT checkpoint of the same settings to reuse (main reuses it)."""
    argv = ["--agent", "openai", "--seed", str(seed), "--out", str(out), "--no-plot", *extra]
    if sft is not None and (sft / "sft-settings.json").is_file() and not (out / "sft").exists():
        shutil.copytree(sft, out / "sft")
    if mode == "async":
        argv.append("--async")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    cmd = [sys.executable, __file__, "--child", str(latency), "--", *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"latency": latency, "seed": seed, "mode": mode, **summarize_run(out, wall)}


def time_to_target(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (latency, seed): when each mode's validation first reached the lock-step final success less 2 se.

    ``ratio`` is the async time to that target over the lock-step loop's whole wall time (the issue's
    measure); ``ratio_same_rule`` divides by the lock-step loop's own time to the target. Both read the time
    at which a validation *ended*; ``ratio_served`` reads the time at which the weights it validated were
    served (an asynchronous validation runs beside training and collection and takes 6-9 s, a lock-step
    one ~3 s with the machine to itself).
    """
    out = []
    runs = {(r["latency"], r["seed"], r["mode"]): r for r in results}
    for (latency, seed, mode), sync in sorted(runs.items()):
        other = runs.get((latency, seed, "async"))
        if mode != "sync" or other is None or not sync["validations"]:
            continue
        target = sync["post"] - 2 * (sync["post_se"] or 0.0)
        reach = {
            m: next((t for t, v in r["validations"] if t is not None and v >= target), None)
            for m, r in (("sync", sync), ("async", other))
        }
        served = next(
            (t for t, v in other.get("validations_served") or [] if t is not None and v >= target), None
        )
        row = {"latency": latency, "seed": seed, "target": round(target, 3), "sync_loop_s": sync["loop_s"]}
        row.update({f"{m}_reach_s": t for m, t in reach.items()})
        a, s_all, s_reach = reach["async"], sync["loop_s"], reach["sync"]
        row["ratio"] = round(a / s_all, 2) if a is not None and s_all else None
        row["ratio_same_rule"] = round(a / s_reach, 2) if a is not None and s_reach else None
        row["loop_ratio"] = round(other["loop_s"] / s_all, 2) if other["loop_s"] and s_all else None
        row["async_served_s"] = served
        row["ratio_served"] = round(served / s_all, 2) if served is not None and s_all else None
        out.append(row)
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| tool latency | mode | seed | loop s | process s | held-out before → after (± se) | samples | "
        "staleness | dropped |",
        "|---:|---|---:|---:|---:|---|---:|---|---|",
    ]
    for r in results:
        se = f" ± {100 * r['post_se']:.1f}" if r.get("post_se") is not None else ""
        lines.append(
            f"| {r['latency']} | {r['mode']} | {r['seed']} | {r['loop_s']} | {r['wall_s']} | "
            f"{100 * r['pre']:.1f}% → {100 * r['post']:.1f}%{se} | {r['samples']} | {r['staleness'] or '-'} | "
            f"{r['dropped'] or '-'} |"
        )
    lines += [
        "",
        "| tool latency | seed | target | lock-step loop s | lock-step reached s | async reached s | "
        "async / lock-step loop | same rule | async loop / lock-step loop | async weights served s | "
        "served / lock-step loop |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in time_to_target(results):
        lines.append(
            f"| {t['latency']} | {t['seed']} | {100 * t['target']:.1f}% | {t['sync_loop_s']} | "
            f"{t['sync_reach_s']} | {t['async_reach_s'] if t['async_reach_s'] is not None else 'not reached'} | "
            f"{t['ratio']} | {t['ratio_same_rule']} | {t['loop_ratio']} | {t['async_served_s']} | "
            f"{t['ratio_served']} |"
        )
    return "\n".join(lines)


def _check_main_flags(p: argparse.ArgumentParser, flags: list[str]) -> None:
    """Bad main-job flags are one ``error:`` line now, not a failed run minutes later."""
    from examples.main import build_parser

    main_parser = build_parser()
    main_parser.error = lambda message: p.error(f"main-job flags: {message}")  # type: ignore[method-assign]
    main_parser.parse_args(flags)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python tests/bench/async_loop.py", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.3, 1.0])
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    p.add_argument("--out", default="runs/bench-async")
    p.add_argument("--json", default=None, help="write all figures to this file")
    p.add_argument(
        "--async-extra",
        default="",
        help="main-job flags for the async runs only, written with '=': --async-extra='--workers 64'",
    )
    p.add_argument(
        "--summarize",
        action="store_true",
        help="print the tables from the run directories already in --out (process s: the job's own wall_s)",
    )
    p.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    if args.child is not None:
        child(args.child, rest)
        return 0
    _check_main_flags(p, rest + args.async_extra.split())
    if args.summarize:
        results = []
        for latency in args.latencies:
            for seed in args.seeds:
                for mode in args.modes:
                    out = Path(args.out) / f"L{latency}-s{seed}-{mode}"
                    if (out / "results.json").is_file():
                        wall = json.loads((out / "results.json").read_text())["summary"]["wall_s"]
                        results.append(
                            {"latency": latency, "seed": seed, "mode": mode, **summarize_run(out, wall)}
                        )
        print(table(results))
        return 0
    results = []
    sft: dict[int, Path] = {}  # the SFT warm start is the same in every run of a seed: made once
    for latency in args.latencies:
        for seed in args.seeds:
            for mode in args.modes:  # interleaved, so the machine's load hits both modes alike
                out = Path(args.out) / f"L{latency}-s{seed}-{mode}"
                extra = rest + (args.async_extra.split() if mode == "async" else [])
                r = run_one(latency, seed, mode, out, extra, sft.get(seed))
                sft.setdefault(seed, out / "sft")
                print(json.dumps(r), flush=True)
                results.append(r)
    print(table(results))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": results, "time_to_target": time_to_target(results)}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
