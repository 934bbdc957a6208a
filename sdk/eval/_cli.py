"""The ``python -m sdk.eval`` command (``tracerl eval``): ``summarize`` and ``compare``.

Example:
    $ python -m sdk.eval summarize eval-rollout.jsonl --answer-fn my_agent:final_number
    $ python -m sdk.eval summarize shard-1.jsonl shard-2.jsonl shard-3.jsonl --store .tracerl
    $ python -m sdk.eval summarize eval-rollout.jsonl --store .tracerl --by-role
    $ python -m sdk.eval compare base.jsonl trained.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sdk._cli import OneLineParser, command_parser, error_exit
from sdk.eval._compare import compare
from sdk.eval._results import EvalError
from sdk.eval._summary import summarize

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sdk.eval`` argument parser.

    Example:
        >>> build_parser().parse_args(["summarize", "r.jsonl"]).results
        ['r.jsonl']
    """
    p = command_parser("eval", "sdk.eval", description="Evaluation figures over rollout results.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    s = sub.add_parser("summarize", help="pass@k, pass^k, maj@k ± se, rates and costs, with a per-task table")
    s.add_argument("results", nargs="+", help="results file(s) of sdk.rollout; shards of one run are merged")
    s.add_argument("--k", default=None, help="k values, e.g. 1,4,16 (default 1, 2, 4, … up to n)")
    s.add_argument("--answer-fn", default=None, help="module:function(answer) -> the answer maj@k votes on")
    s.add_argument("--store", action="append", default=None, help="store(s) for calls/tokens per sample")
    s.add_argument("--no-tasks", action="store_true", help="no per-task table")
    s.add_argument("--by-role", action="store_true", help="each agent's own mean reward (needs --store)")
    c = sub.add_parser("compare", help="B vs A: paired difference in pass@1, 95%% interval, p-value")
    c.add_argument("a", help="baseline results file(s), comma-separated for shards")
    c.add_argument("b", help="candidate results file(s), comma-separated for shards")
    c.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    c.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")
    c.add_argument("--no-tasks", action="store_true", help="no table of the tasks that differ")
    for q in (s, c):
        q.add_argument(
            "--threshold", type=float, default=None, help="reward counted as success (default: as run)"
        )
        q.add_argument("--json", action="store_true", help="print JSON")
        q.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns 0, or 2 with one ``error:`` line on bad input.

    Example:
        >>> main(["summarize", "missing.jsonl"])  # doctest: +SKIP
        2
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "summarize":
            out: Any = summarize(
                args.results,
                threshold=args.threshold,
                answer_fn=args.answer_fn,
                ks=_ks(args.k),
                store=args.store,
                by_role=args.by_role,
            )
            for warning in out.warnings:
                print(f"warning: {warning}", file=sys.stderr)
        else:
            out = compare(
                _files(args.a),
                _files(args.b),
                resamples=args.resamples,
                seed=args.seed,
                threshold=args.threshold,
            )
            for warning in out.warnings:
                print(f"warning: {warning}", file=sys.stderr)
    except (Exception, KeyboardInterrupt) as exc:
        return error_exit(exc, traceback=args.traceback)
    if args.json:
        print(json.dumps(out.as_dict()))
    else:
        print(out.format_table(tasks=not args.no_tasks))
    return 0


def _ks(spec: str | None) -> list[int] | None:
    if spec is None:
        return None
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise EvalError(f"--k takes integers separated by commas, got {spec!r}") from None


def _files(spec: str) -> list[str]:
    files = [f for f in spec.split(",") if f]
    if not files:
        raise EvalError(f"no results file in {spec!r}")
    return files
