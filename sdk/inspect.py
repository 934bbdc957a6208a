"""``python -m sdk.inspect PATH``: a quick summary of a tracerl store directory or an episode Parquet file.

Example:
    $ python -m sdk.inspect ./traces
    $ python -m sdk.inspect episodes.parquet --json
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["inspect_parquet", "inspect_store", "main", "task_groups"]


def _top(counter: Counter[Any], n: int = 5) -> str:
    if not counter:
        return "-"
    items = [f"{k} ({v})" for k, v in counter.most_common(n)]
    if len(counter) > n:
        items.append(f"… {len(counter) - n} more")
    return ", ".join(items)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    # Scaled by the largest magnitude: rewards of ±1e308 overflow a plain sum of squares.
    scale = max(abs(v) for v in values) or 1.0
    n = len(values)
    mean = math.fsum(v / scale for v in values) / n
    std = math.sqrt(math.fsum((v / scale - mean) ** 2 for v in values) / n)
    return f"{_num(mean * scale)} ± {_num(std * scale)} (n={n})"


def _num(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 1e9 else f"{x:.4g}"


#: What each of the store reader's problem counts means, and whether it matters (``tracerl inspect``).
_PROBLEM_MEANINGS = {
    "event_after_session_end": "records written for a session after it had ended, left out of its "
    "episode: usually the agent of a sample that timed out went on (a sync agent's thread cannot be "
    "stopped) and made another model call; a call still running when its session ends is recorded then, "
    "as cut short. The episode is what the session held at its end and a timed-out sample has no reward, "
    "so training is not affected; many of them mean the rollout's timeout is shorter than the agent needs",
    "missing_session_end": "sessions without an end (the process was killed or crashed mid-sample): "
    "read as incomplete; the rollout runner runs such samples again when resumed",
    "torn_line": "the last line of a segment was cut short (a kill mid-write): skipped, nothing else lost",
    "corrupt_line": "a line inside a segment that is not valid JSON: skipped (that call or event is lost)",
    "malformed_call": "call lines without the fields a call needs: skipped",
    "call_before_session_start": "calls whose session start was not seen (another process's segment, or "
    "a lost line): kept, in a session opened for them",
    "duplicate_session_start": "a session started twice: the second start is ignored",
    "session_end_before_session_start": "a session end without its start: counted, nothing kept",
    "reward_for_unknown_session": "rewards for sessions this store does not hold: not used",
    "invalid_reward": "rewards that are not finite numbers: not used",
    "missing_base": "calls stored relative to an earlier call that is missing: their requests are "
    "incomplete (and counted so in the export)",
    "base_after_damaged_line": "calls stored relative to the previous call after a damaged line: "
    "their requests are not rebuilt on a call that may be the wrong one (counted in the export)",
    "missing_token_base": "calls whose prompt token ids refer to a missing earlier call: token ids dropped",
}


def _task_key(task_id: Any) -> Any:
    # A task id that is not a string (a list, a dict) still names one task: counted by its JSON text.
    if task_id is None or isinstance(task_id, (str, int, float)):
        return task_id
    return json.dumps(task_id, sort_keys=True, default=str)


def task_groups(members: list[tuple[Any, Any, Any]]) -> int:
    """How many GRPO groups ``(split, task, agent)`` members make, as the trainer and the viewer group them.

    One group per task and split (an evaluation sample never joins a training group); a task several
    agents worked on (multi-agent) is one group per agent. ``tracerl view`` and ``tracerl inspect`` both
    count with this.

    Example:
        >>> one_agent = [("train", "t1", None), ("eval", "t1", None)]  # one task in two splits
        >>> task_groups(one_agent + [("train", "t2", "a"), ("train", "t2", "b")])  # t2: two agents
        4
    """
    agents: dict[tuple[Any, Any], set[Any]] = {}
    for split, task, agent in members:
        agents.setdefault((_task_key(split), _task_key(task)), set()).add(agent)
    return sum(max(1, len(a)) for a in agents.values())


def inspect_store(path: str | Path) -> dict[str, Any]:
    """Summarise a store directory or store URI (reads it once, streaming).

    ``tasks`` counts the sessions' task ids; ``task_groups`` the groups they form (:func:`task_groups`),
    the two counts ``tracerl view`` prints for the same store.

    Example:
        >>> import tempfile
        >>> inspect_store(tempfile.mkdtemp())["sessions"]
        0
    """
    from sdk.store import StoreReader

    reader = StoreReader(path)
    segments = [f for chain in reader.segments() for f in chain]
    status: Counter[str] = Counter()
    models: Counter[str] = Counter()
    frameworks: Counter[str] = Counter()
    agents: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    tasks: set[Any] = set()
    members: list[tuple[Any, Any, Any]] = []  # (split, task, agent) of each session's agents
    rewards: list[float] = []
    calls = with_logprobs = with_token_ids = 0
    tool_calls = malformed = sessions_malformed = 0
    first = last = None
    for s in reader.sessions():
        status[s.status] += 1
        marked = sum(bool(c.get("malformed_tool_call")) for c in s.calls)
        malformed += marked
        sessions_malformed += marked > 0
        tasks.add(_task_key(s.task_id))
        if s.task_id is not None:
            split = s.metadata.get("split")
            members += [(split, s.task_id, a) for a in {c.get("agent") for c in s.calls} or {None}]
        if s.reward is not None:
            rewards.append(s.reward)
        for c in s.calls:
            calls += 1
            models[str(c.get("model"))] += 1
            frameworks[str(c.get("framework"))] += 1
            if c.get("agent"):
                agents[str(c.get("agent"))] += 1
            if isinstance(c.get("error"), dict):
                errors[str(c["error"].get("type"))] += 1
            with_logprobs += bool(c.get("logprobs"))
            msg = (c.get("response") or {}).get("message")
            parsed = msg.get("tool_calls") if isinstance(msg, dict) else None
            tool_calls += len(parsed) if isinstance(parsed, list) else 0
            with_token_ids += bool(c.get("completion_token_ids"))
            t = c.get("started_at")
            if isinstance(t, (int, float)):
                first = t if first is None else min(first, t)
                last = t if last is None else max(last, t)
    return {
        "kind": "store",
        "path": str(path),
        "segments": len(segments),
        "bytes": sum(f.stat().st_size for f in segments),
        "sessions": sum(status.values()),
        "sessions_by_status": dict(status),
        "tasks": len(tasks - {None}),
        "task_groups": task_groups(members),
        "calls": calls,
        "calls_with_logprobs": with_logprobs,
        "calls_with_token_ids": with_token_ids,
        "failed_calls": dict(errors),
        "tool_calls": tool_calls,
        "malformed_tool_calls": malformed,
        "sessions_with_malformed_tool_calls": sessions_malformed,
        "models": dict(models),
        "frameworks": dict(frameworks),
        "agents": dict(agents),
        "session_reward": _mean_std(rewards),
        "sessions_with_reward": len(rewards),
        "first_call": first,
        "last_call": last,
        "problems": dict(reader.problems),
        "problem_examples": dict(reader.examples),
        "problem_meanings": {k: _PROBLEM_MEANINGS[k] for k in reader.problems if k in _PROBLEM_MEANINGS},
    }


# The columns a summary reads: small ones only (messages are measured by their lengths alone).
_SMALL_COLUMNS = ("schema_version", "episode_id", "task_id", "reward", "token_faithful", "status")
_SMALL_COLUMNS += ("num_calls", "model", "agent")


def _episode_schema(p: Path, first: Path) -> tuple[Any, Any]:
    """``(the file's schema, the episode schema it should have)``; raises ``EpisodeError`` if it is none."""
    import polars as pl

    from sdk.episodes import EpisodeError
    from sdk.episodes._schema import polars_schema

    try:
        schema = pl.read_parquet_schema(first)
    except Exception as exc:
        raise EpisodeError(f"{str(p)!r} is not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    turn = getattr(schema.get("turns"), "inner", None)
    has_versions = isinstance(turn, pl.Struct) and "policy_version" in turn.to_schema()
    expected = polars_schema(2 if has_versions or turn is None else 1)  # version 1: no turn policy_version
    if "episode_id" not in schema or "schema_version" not in schema:
        raise EpisodeError(f"{str(p)!r} is not a tracerl episode file (no episode_id/schema_version column)")
    return schema, expected


def inspect_parquet(path: str | Path) -> dict[str, Any]:
    """Summarise an episode Parquet file, or a directory of them (only small columns are read).

    Raises ``sdk.episodes.EpisodeError`` for a file that is not a readable episode file.

    Example:
        >>> inspect_parquet("episodes.parquet")["episodes"]  # doctest: +SKIP
        128
    """
    import polars as pl

    from sdk.episodes._schema import READ_SCHEMA_VERSIONS
    from sdk.episodes._source import parquet_files

    p = Path(path)
    files = parquet_files(p)
    schema, expected = _episode_schema(p, files[0])
    wanted = [c for c in _SMALL_COLUMNS if c in schema]
    lf = pl.scan_parquet(files).select(wanted)
    df = lf.collect()
    n = df.height
    versions = sorted(df["schema_version"].unique().to_list())
    rewards = [v for v in df["reward"].to_list() if v is not None] if "reward" in df.columns else []
    per_task: dict[Any, list[float]] = {}
    if "task_id" in df.columns and "reward" in df.columns:
        for t, r in zip(df["task_id"].to_list(), df["reward"].to_list(), strict=True):
            if r is not None:
                per_task.setdefault(_task_key(t), []).append(r)
    msg_stats: dict[str, Any] = {}
    if "messages" in schema:
        lengths = pl.scan_parquet(files).select(pl.col("messages").list.len()).collect().to_series()
        msg_stats = {"messages_mean": float(lengths.mean() or 0), "messages_max": int(lengths.max() or 0)}

    duplicates: dict[str, Any] = {"count": 0, "example": None}
    if "episode_id" in df.columns:  # as training counts them: each copy after the first of an id
        ids = df["episode_id"]
        repeated = ids.filter(ids.is_duplicated())
        if len(repeated):
            duplicates = {"count": n - ids.n_unique(), "example": repeated[0]}

    def counts(col: str) -> dict[str, int]:
        if col not in df.columns:
            return {}
        return {str(k): int(v) for k, v in df[col].value_counts(sort=True).iter_rows()}

    return {
        "kind": "parquet",
        "path": str(p),
        "bytes": sum(f.stat().st_size for f in files),
        "episodes": n,
        "schema_versions": versions,
        "schema_ok": set(versions) <= set(READ_SCHEMA_VERSIONS) and dict(schema) == dict(expected),
        "missing_columns": [c for c in expected if c not in schema],
        "extra_columns": [c for c in schema if c not in expected],
        "tasks": len({_task_key(t) for t in df["task_id"].to_list() if t is not None})
        if "task_id" in df.columns
        else 0,
        "reward": _mean_std(rewards),
        "reward_per_task": {str(t): _mean_std(v) for t, v in per_task.items()},
        "duplicate_episode_ids": duplicates,
        "token_faithful": int(df["token_faithful"].sum()) if "token_faithful" in df.columns else 0,
        "calls": int(df["num_calls"].sum()) if "num_calls" in df.columns else 0,
        "status": counts("status"),
        "models": counts("model"),
        "agents": counts("agent"),
        **msg_stats,
    }


def _duplicates(dup: dict[str, Any]) -> str:
    if not dup["count"]:
        return "none"
    return f"{dup['count']} (e.g. {dup['example']}; training drops every copy after the first)"


def _tool_calls(info: dict[str, Any]) -> str:
    # Malformed: an answer opened a <tool_call> the server could not parse (sdk.messages.malformed_tool_call)
    made, bad = info["tool_calls"], info["malformed_tool_calls"]
    if not bad:
        return f"{made} / 0"
    n = info["sessions_with_malformed_tool_calls"]
    return (
        f"{made} / {bad} ({100 * bad / (made + bad):.1f}% malformed, in {n} session{'s' * (n != 1)}: "
        "answers that opened a tool call the server could not parse, taken by the agent as text)"
    )


def _tasks(info: dict[str, Any]) -> str:
    # The viewer's words for the same two counts ("N episodes of K tasks in M task groups").
    groups = info["task_groups"]
    return f"{info['tasks']} ({groups} task groups: one per task and split, per agent if several)"


def _rows(info: dict[str, Any], max_tasks: int) -> list[tuple[str, str]]:
    if info["kind"] == "store":
        rows = [
            ("store", info["path"]),
            ("segments", f"{info['segments']} ({info['bytes'] / 1e6:.1f} MB)"),
            ("sessions", f"{info['sessions']} ({_top(Counter(info['sessions_by_status']))})"),
            ("tasks", _tasks(info)),
            ("calls", str(info["calls"])),
            ("  with logprobs", str(info["calls_with_logprobs"])),
            ("  with token ids", str(info["calls_with_token_ids"])),
            ("  failed", _top(Counter(info["failed_calls"]))),
            ("tool calls: parsed / malformed", _tool_calls(info)),
            ("models", _top(Counter(info["models"]))),
            ("frameworks", _top(Counter(info["frameworks"]))),
            ("agents", _top(Counter(info["agents"]))),
            ("session reward", info["session_reward"]),
        ]
        for k, v in Counter(info["problems"]).most_common():
            meaning = f": {_PROBLEM_MEANINGS[k]}" if k in _PROBLEM_MEANINGS else ""
            rows.append(
                (f"  problem: {k}", f"{v} (first at {info['problem_examples'].get(k, '?')}){meaning}")
            )
        if not info["problems"]:
            rows.append(("problems", "none"))
        return rows
    rows = [
        ("file", info["path"]),
        ("size", f"{info['bytes'] / 1e6:.2f} MB"),
        ("episodes", str(info["episodes"])),
        ("schema version", ", ".join(map(str, info["schema_versions"])) or "-"),
        (
            "schema",
            "ok"
            if info["schema_ok"]
            else f"differs (missing {info['missing_columns'] or '-'}, extra {info['extra_columns'] or '-'})",
        ),
        ("tasks", str(info["tasks"])),
        ("duplicate episode ids", _duplicates(info["duplicate_episode_ids"])),
        ("calls", str(info["calls"])),
        ("token-faithful", f"{info['token_faithful']} of {info['episodes']}"),
        (
            "messages per episode",
            f"{info.get('messages_mean', 0):.1f} mean, {info.get('messages_max', 0)} max",
        ),
        ("status", _top(Counter(info["status"]))),
        ("models", _top(Counter(info["models"]))),
        ("agents", _top(Counter(info["agents"]))),
        ("reward", info["reward"]),
    ]
    tasks = sorted(info["reward_per_task"].items())
    rows += [(f"  task {t}", v) for t, v in tasks[:max_tasks]]
    if len(tasks) > max_tasks:
        rows.append((f"  … {len(tasks) - max_tasks} more tasks", ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the inspect CLI; return the exit status.

    Example:
        >>> main(["episodes.parquet"])  # doctest: +SKIP
        0
    """
    from sdk._cli import command_parser

    parser = command_parser(
        "inspect",
        "sdk.inspect",
        description="Print a quick summary of a tracerl store directory or an episode Parquet file.",
    )
    parser.add_argument("path", nargs="?", help="store directory or URI, or .parquet file or directory")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--max-tasks", type=int, default=20, metavar="N", help="tasks shown (default: 20)")
    parser.add_argument("--schema", action="store_true", help="print the episode Parquet schema (markdown)")
    args = parser.parse_args(argv)
    if args.schema:
        from sdk.episodes._schema import schema_markdown

        print(schema_markdown())
        return 0
    if args.path is None:
        parser.error("give a store directory or a .parquet file (or --schema)")
    try:
        from sdk.episodes._source import source_kind

        kind = source_kind(args.path)
        if kind in ("parquet_file", "parquet_dir"):  # a directory of episode files: an export's parts, say
            info = inspect_parquet(args.path)
        elif kind in ("store", "store_uri"):
            info = inspect_store(args.path)
        else:
            raise FileNotFoundError(f"no store directory or Parquet file at {args.path!r}")
    except ImportError as exc:
        print(f"error: {exc} (pip install 'tracerl[episodes]')", file=sys.stderr)
        return 2
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    from sdk.export import print_rows

    print_rows(f"tracerl {info['kind']}", _rows(info, args.max_tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
