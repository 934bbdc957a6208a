"""``python -m sdk.rollout`` / ``tracerl rollout``: the command line of the runner.

Example:
    >>> build_parser().parse_args(["m:f", "t.jsonl", "-G", "4"]).group_size
    4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import typing
from typing import Any

from sdk._cli import OneLineParser, command_parser, new_directories, remove_empty
from sdk.eval import parse_shard
from sdk.rollout._continuous import run_continuous
from sdk.rollout._resume import _current_store
from sdk.rollout._run import run_rollout
from sdk.rollout._spec import RolloutSpec
from sdk.rollout._summary import RolloutSummary
from sdk.rollout._tasks import RolloutError

__all__ = ["build_parser", "main"]

_SHORT = {"group_size": ("-G",), "concurrency": ("-c",)}  # the short flags of the spec's settings
_METAVAR = {
    "group_size": "G",
    "concurrency": "N",
    "timeout": "SECONDS",
    "reward_fn": "MODULE:FUNCTION",
    "id_field": "FIELD",
    "success_threshold": "REWARD",
}


def build_parser() -> OneLineParser:
    """The ``python -m sdk.rollout`` argument parser.

    Example:
        >>> build_parser().parse_args(["m:f", "t.jsonl"]).group_size
        1
    """
    p = command_parser(
        "rollout",
        "sdk.rollout",
        description="Run an agent over a task set (G samples per task, each in a session); resumable.",
    )
    fields = {f.name: f for f in dataclasses.fields(RolloutSpec)}
    p.add_argument("agent", help=fields.pop("agent").metadata["help"].rstrip("."))
    p.add_argument("tasks", help="tasks: .jsonl, .parquet, a saved datasets directory or hf:NAME[:SPLIT]")
    hints = typing.get_type_hints(RolloutSpec)
    for name, f in fields.items():  # the spec's settings: the flag, its type, default and help from the field
        kind = next(t for t in (int, float, str) if hints[name] is t or t in typing.get_args(hints[name]))
        default = "" if f.default is None else f" (default {f.default})"
        flags = [f"--{name.replace('_', '-')}", *_SHORT.get(name, ())]
        text = f.metadata["help"].rstrip(".") + default
        p.add_argument(*flags, type=kind, default=f.default, metavar=_METAVAR.get(name), help=text)
    p.add_argument(
        "--split", default="train", help="session metadata split (default train; eval: no training)"
    )
    p.add_argument("--store", default=None, help="store directory (default $TRACERL_STORE or ./.tracerl)")
    p.add_argument(
        "--results",
        default=None,
        help="results file (default <store>-rollout-<split>.jsonl next to the store)",
    )
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the samples as Ray tasks on this cluster (auto, ray://head:10001, host:6379)",
    )
    p.add_argument(
        "--ray-working-dir",
        default=None,
        metavar="DIR",
        help="directory shipped to the Ray workers (runtime_env working_dir), e.g. . for the agent's code",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run the I-th of N disjoint slices of the tasks (by task id); sdk.eval summarize merges them",
    )
    p.add_argument(
        "--continuous",
        action="store_true",
        help="keep --concurrency samples in flight, cycling over the tasks with fresh sample indices, until "
        "SIGINT/SIGTERM; then finish the samples in flight and exit 0",
    )
    p.add_argument(
        "--check",
        nargs="?",
        type=int,
        const=2,
        default=None,
        metavar="TASKS",
        help="run the first TASKS tasks (default 2) G times each in a store of their own and say whether a "
        "run can learn: calls per sample, tool calls parsed / malformed, reward spread per group, seconds "
        "per call, the time the whole rollout will take, peak memory, a verdict; then exit 0",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0, 2 on bad input (one ``error:`` line), 130 when interrupted.

    Example:
        >>> main(["my_agent:solve", "tasks.jsonl", "--group-size", "4"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    import sdk

    made = new_directories(args.store)  # removed again if the run fails to start (a bad agent, say)
    try:
        if args.store is not None:
            sdk.configure(store=args.store)
        store = _current_store()
        shard = "" if args.shard is None else "-shard-" + "-of-".join(map(str, parse_shard(args.shard)))
        results = args.results or str(
            store.parent / f"{store.name.lstrip('.') or 'store'}-rollout-{args.split}{shard}.jsonl"
        )
        spec = RolloutSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RolloutSpec)})
        if args.check is not None:
            return _check(args, spec)
        output = {"split": args.split, "results": results, "progress": not args.no_progress and not args.json}
        summary = (_continuous if args.continuous else _batch)(args, spec, output)
    except (RolloutError, ValueError) as exc:
        remove_empty(made)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        got = exc.args[0] if exc.args and isinstance(exc.args[0], RolloutSummary) else None
        if got is not None:
            print(got.format_table(), file=sys.stderr)
        else:
            print("interrupted: re-run the same command to continue", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        print(summary.format_table())
    return 0


def _check(args: argparse.Namespace, spec: RolloutSpec) -> int:
    """``--check``: a handful of samples and what they say about the run; 0 after printing."""
    from sdk.rollout._check import check_rollout
    from sdk.rollout._tasks import load_tasks

    everything = len(load_tasks(args.tasks, spec.id_field)) * spec.group_size
    report = check_rollout(
        spec, args.tasks, check_tasks=args.check,
        projections=[("the whole rollout", everything, spec.concurrency)],
    )  # fmt: skip
    print(json.dumps(report.as_dict()) if args.json else report.format())
    return 0


def _batch(args: argparse.Namespace, spec: RolloutSpec, output: dict[str, Any]) -> RolloutSummary:
    env = {"working_dir": args.ray_working_dir} if args.ray_working_dir else None
    return run_rollout(spec, args.tasks, ray=args.ray, ray_runtime_env=env, shard=args.shard, **output)


def _continuous(args: argparse.Namespace, spec: RolloutSpec, output: dict[str, Any]) -> RolloutSummary:
    """``--continuous``: cycle over the tasks until SIGINT/SIGTERM, then finish the samples in flight."""
    if args.ray is not None or args.shard is not None:
        raise RolloutError("--continuous runs here over the whole task set: drop --ray and --shard")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # the second signal: stop now (in-flight samples end as interrupted)
        stop.set()
        os.write(2, b"stopping: finishing the samples in flight (signal again to stop now)\n")

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run_continuous(spec, args.tasks, stop=stop, **output)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
