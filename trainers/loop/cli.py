"""``python -m trainers.loop CONFIG.yaml`` (``python -m sdk.train --loop``, ``tracerl train --loop``)."""

from __future__ import annotations

import argparse
import sys

from sdk._cli import command_parser
from trainers.errors import UserError
from trainers.loop.config import LoopConfig, loop_keys, read_yaml
from trainers.loop.driver import run_loop
from trainers.loop.table import checkpoints_line, validation_change
from trainers.settings import add_flags

__all__ = ["main"]

# The keys with a flag (a run's usual overrides); every key is listed in the help's epilog.
_OVERRIDES = ("rounds", "out", "model", "mode", "seed")


def main(argv: list[str] | None = None) -> int:
    """``python -m trainers.loop CONFIG.yaml [--rounds N] [--out DIR] [--check]``; 0, 2 on bad input.

    130 on Ctrl-C. ``--check`` runs a few samples on the policy server and prints what they show.

    Example:
        >>> main(["examples/arithmetic/loop.yaml", "--rounds", "1"])  # doctest: +SKIP
        0
    """
    p = command_parser(
        "train --loop",
        "trainers.loop",
        description="rollout → export → train → reload → validate rounds",
        epilog=loop_keys(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # one key a line, as written
        argument_default=argparse.SUPPRESS,  # a flag not given leaves the file's key
    )
    p.add_argument("config", help="loop YAML file")
    keys = p.add_argument_group("the file's keys these flags override")
    add_flags(lambda name: keys, LoopConfig, only=_OVERRIDES)
    p.add_argument(
        "--check",
        nargs="?",
        type=int,
        const=2,
        default=None,
        metavar="TASKS",
        help="before a run: start the policy server, run the first TASKS training tasks (default 2) and "
        "as many held-out tasks group_size times each (nothing trained on) and say whether the run can "
        "learn: calls per sample, tool calls parsed / malformed, reward spread per group, held-out reward "
        "beside training reward, seconds per call, the time one round takes, peak memory, a verdict with "
        "what to change; then exit 0",
    )
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        data = read_yaml(args.config)
        # Overrides join the file's settings before validation: --rounds -1 is refused like rounds: -1.
        data.update({k: v for k, v in vars(args).items() if k in _OVERRIDES})
        if args.check is not None:
            from trainers.loop.check import check_loop

            print(check_loop(LoopConfig.from_mapping(data), tasks=args.check).format())
            return 0
        result = run_loop(LoopConfig.from_mapping(data))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: re-run the same command to continue after the last finished round", file=sys.stderr
        )
        return 130
    for line in (
        validation_change(result["out"], result["rows"]),
        checkpoints_line(result["out"], result["rows"]),
    ):
        if line is not None:
            print(line)
    return 0
