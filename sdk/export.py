"""``python -m sdk.export``: turn a tracerl store into OpenAI-format episodes in one Parquet file.

Example:
    $ python -m sdk.export --store ./traces --out episodes.parquet --reward-fn myproj.rewards:exact
    $ python -m sdk.export --store ./traces --out train.parquet --split train --strict
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

from sdk._cli import command_parser, error_exit

__all__ = ["main"]

_EPILOG = """\
Rewards: the episode reward is the named reward --reward-name ("reward" by default), from the session
(s.reward(...)), summed per-call rewards, or --reward-fn functions (fn(episode) -> float | {name: float}
| None); a function that raises rejects only that episode.

Invalid episodes (role order, unmatched or unanswered tool calls, invalid JSON arguments, missing or
non-finite reward, empty, duplicate ids, unknown schema version) are written with their reasons to the
rejects file and counted in the summary; --strict stops at the first problem instead.

Exit status: 0 on success, 1 when no episode was written, 2 on an error (one line on stderr)."""


def _add_reward_args(rw: Any) -> None:
    """The ``rewards`` options: reward functions, group rewards and the LLM judge."""
    rw.add_argument(
        "--reward-fn",
        action="append",
        default=[],
        metavar="[NAME=]MODULE:FUNCTION",
        help="post-hoc reward function (repeatable; NAME defaults to 'reward')",
    )
    rw.add_argument(
        "--reward-name",
        default="reward",
        metavar="NAME",
        help="named reward used as the episode reward (default: reward)",
    )
    rw.add_argument(
        "--judge-model",
        metavar="MODEL",
        help="score each task's episodes against each other with this LLM judge (RULER-style; "
        "holds all episodes in memory)",
    )
    rw.add_argument("--judge-base-url", metavar="URL", help="OpenAI-compatible base URL of the judge")
    rw.add_argument(
        "--judge-api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding the judge's API key (default: OPENAI_API_KEY)",
    )
    rw.add_argument(
        "--judge-name",
        default="judge",
        metavar="NAME",
        help="reward name of the judge score (default: judge; use 'reward' to make it the reward)",
    )
    rw.add_argument("--judge-rubric", metavar="FILE", help="text file with the judge rubric")


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "export",
        "sdk.episodes",
        description="Turn a tracerl store into OpenAI-format episodes (one Parquet row per agent thread).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    io = p.add_argument_group("input and output")
    io.add_argument("--store", required=True, metavar="DIR", help="tracerl store directory to read")
    io.add_argument("--out", required=True, metavar="FILE", help="Parquet file to write (zstd)")
    io.add_argument("--rejects", metavar="FILE", help="rejects file (default: <out stem>.rejects.jsonl)")
    io.add_argument("--no-rejects", action="store_true", help="count rejected episodes but do not write them")
    io.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON ('-' for stdout)")

    sel = p.add_argument_group("selection")
    sel.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATTERN",
        help="keep calls whose requested or returned model matches (glob; repeatable)",
    )
    sel.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="PATTERN",
        help="keep calls whose agent name matches (glob; repeatable)",
    )
    sel.add_argument(
        "--split",
        action="append",
        default=[],
        metavar="NAME",
        help="keep sessions whose metadata split is NAME (repeatable)",
    )
    sel.add_argument(
        "--split-threads-by",
        action="append",
        default=[],
        choices=["agent", "model"],
        help="never continue a thread across agents / models (repeatable)",
    )

    _add_reward_args(p.add_argument_group("rewards"))

    val = p.add_argument_group("validation")
    val.add_argument("--strict", action="store_true", help="fail at the first problem instead of rejecting")
    val.add_argument(
        "--allow-missing-reward", action="store_true", help="keep episodes without a reward (e.g. for SFT)"
    )

    out = p.add_argument_group("output")
    out.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary table")
    out.add_argument("--max-tasks", type=int, default=20, metavar="N", help="tasks shown in the summary")
    out.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes over a store written by several processes: this one and N-1 workers "
        "(default 1; 0: automatic); ~200 MB each",
    )
    out.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        metavar="N",
        help="episodes per in-memory batch and Parquet row group (default: 1000)",
    )
    out.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    return p


def print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    """Print ``(label, value)`` rows as a table on stdout (rich when installed)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        width = max((len(k) for k, _ in rows), default=0)
        print(title)
        for k, v in rows:
            print(f"{k.ljust(width)}  {v}".rstrip())
        return
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    Console(file=sys.stdout, soft_wrap=False).print(table)


def _judge(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.judge_model:
        if args.judge_base_url:
            raise ValueError("--judge-base-url needs --judge-model")
        return None
    if not args.judge_base_url:
        raise ValueError("--judge-model needs --judge-base-url")
    from sdk.episodes import llm_judge_reward
    from sdk.episodes._rewards import DEFAULT_RUBRIC

    rubric = DEFAULT_RUBRIC
    if args.judge_rubric:
        try:
            with open(args.judge_rubric, encoding="utf-8") as fh:
                rubric = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read --judge-rubric {args.judge_rubric!r}: {exc.strerror}") from None
    fn = functools.partial(
        llm_judge_reward,
        model=args.judge_model,
        base_url=args.judge_base_url,
        api_key=os.environ.get(args.judge_api_key_env) or "",
        rubric=rubric,
    )
    return {args.judge_name: fn}


def _options(args: argparse.Namespace) -> Any:
    """The ``EpisodeOptions`` the command line asks for (reward functions resolved: a bad one fails here)."""
    from sdk.episodes import EpisodeOptions
    from sdk.episodes._rewards import resolve_reward_fns

    return EpisodeOptions(
        reward_fns=resolve_reward_fns(args.reward_fn),
        group_reward_fns=_judge(args),
        reward_name=args.reward_name,
        models=tuple(args.model),
        agents=tuple(args.agent),
        splits=tuple(args.split),
        split_by=tuple(args.split_threads_by),
        require_reward=not args.allow_missing_reward,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the export CLI; return the exit status.

    Example:
        >>> main(["--store", "traces", "--out", "episodes.parquet", "--quiet"])  # doctest: +SKIP
        0
    """
    args = _parser().parse_args(argv)
    try:
        from sdk.episodes import export

        rejects: Any = False if args.no_rejects else (args.rejects or True)
        summary = export(
            args.store,
            args.out,
            _options(args),
            rejects=rejects,
            strict=args.strict,
            batch_size=max(1, args.batch_size),
            progress=not args.quiet and sys.stderr.isatty(),
            workers=max(0, args.workers),
        )
    except (Exception, KeyboardInterrupt) as exc:
        return error_exit(exc, traceback=args.traceback, extra="episodes")
    if not args.quiet:
        print_rows("tracerl export", summary.rows(args.max_tasks))
    if args.summary_json:
        text = json.dumps(summary.to_dict(), indent=2, default=str)
        if args.summary_json == "-":
            print(text)
        else:
            with open(args.summary_json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    if summary.written == 0:
        why = (
            f"{summary.rejected_total} rejected, see {summary.rejects_path}"
            if summary.rejected_total and summary.rejects_path
            else f"{summary.rejected_total} rejected"
            if summary.rejected_total
            else "the store holds no calls"
            if summary.calls == 0
            else "every call was filtered out"
        )
        print(f"warning: no episode was written ({why})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
