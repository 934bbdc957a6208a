"""``python -m sdk.view EPISODES_OR_STORE [--out report.html]``: write the episode viewer.

Example:
    $ python -m sdk.view ./traces --out report.html
    $ python -m sdk.view episodes.parquet --out report.html --tokenizer Qwen/Qwen3-0.6B
"""

from __future__ import annotations

import argparse
import sys

from sdk._cli import command_parser, error_exit

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "view",
        "sdk.view",
        description="Write one self-contained HTML file showing episodes: task groups, rewards, advantages, "
        "conversations, and the trained tokens with their behaviour logprobs.",
        epilog="Exit status: 0 on success, 1 when there is no episode, 2 on an error (one line on stderr).",
    )
    p.add_argument("source", metavar="EPISODES_OR_STORE", help="episode Parquet file or store directory")
    p.add_argument(
        "--out", default="report.html", metavar="FILE", help="HTML file to write (default report.html)"
    )
    p.add_argument("--title", help="page title (default: the source's name)")
    p.add_argument(
        "--tokenizer", metavar="NAME_OR_PATH", help="local tokenizer to show token text for a Parquet source"
    )
    p.add_argument("--split", help="only this split (session metadata 'split'; a glob like 'train-*' too)")
    p.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the viewer CLI; return the exit status.

    Example:
        >>> main(["traces", "--out", "report.html"])  # doctest: +SKIP
        0
    """
    args = _parser().parse_args(argv)
    try:
        from sdk.view import build_report

        summary = build_report(
            args.source, args.out, title=args.title, tokenizer=args.tokenizer, split=args.split
        )
    except (Exception, KeyboardInterrupt) as exc:
        return error_exit(exc, traceback=args.traceback, extra="episodes")
    malformed = (
        f"; {summary.malformed} malformed message/tool fields shown as-is" if summary.malformed else ""
    )
    print(
        # The names and counts of `tracerl inspect`: tasks, and the task groups they form (per split)
        f"tracerl view: {summary.episodes} episodes of {summary.tasks} tasks in {summary.groups} task groups "
        f"({summary.token_episodes} with token data{malformed}) -> {summary.out}"
    )
    if not summary.episodes:
        print("warning: no episode to show", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
