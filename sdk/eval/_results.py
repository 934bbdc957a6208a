"""Reading rollout results files (one or several shards) and the stable task-set shards.

A results file is what ``python -m sdk.rollout`` writes: one JSON line per finished (task, sample) with
``task_id``, ``sample``, ``split``, ``status``, ``reward``, ``success``, ``answer``, ``session_id`` and
``seconds``. The line written last for a (task, sample) wins, as in the runner.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["EvalError", "load_results", "metrics_path", "parse_shard", "shard_of"]


class EvalError(ValueError):
    """Bad input to an evaluation: no results, mismatched files, a bad ``k`` or shard, an unreadable file.

    Example:
        >>> raise EvalError("no results in empty.jsonl")  # doctest: +SKIP
    """


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` (1 ≤ I ≤ N) as ``(I, N)``.

    Raises:
        EvalError: Not of that form.

    Example:
        >>> parse_shard("2/4")
        (2, 4)
    """
    head, sep, tail = str(spec).partition("/")
    try:
        i, n = int(head), int(tail)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise EvalError(f"a shard is I/N with 1 <= I <= N (e.g. 1/4), got {spec!r}")
    return i, n


def shard_of(task_id: str, n: int) -> int:
    """The shard (1 … ``n``) a task belongs to: a SHA-256 of its id, so every machine and run agrees.

    Example:
        >>> shard_of("task-1", 4) == shard_of("task-1", 4)
        True
        >>> shard_of("task-1", 1)
        1
    """
    digest = hashlib.sha256(str(task_id).encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % n


def metrics_path(results: str | os.PathLike[str]) -> Path:
    """Where the runner writes the figures of a results file: ``<results stem>.metrics.json`` beside it.

    Example:
        >>> metrics_path("out/eval.jsonl").name
        'eval.metrics.json'
    """
    p = Path(results)
    return p.with_name(f"{p.stem}.metrics.json")


def load_results(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The result lines of one or more results files (shards of one run), merged.

    Within a file the last line of a (task, sample) wins; a (task, sample) in two files, or files of
    different splits, are an error (they are not shards of one run). A torn last line (the runner was
    killed while writing it) is skipped; other unreadable lines are an error.

    Raises:
        EvalError: A file is missing or unreadable, holds no results, or the files do not fit together.

    Example:
        >>> load_results("missing.jsonl")  # doctest: +SKIP
        Traceback (most recent call last):
        sdk.eval._results.EvalError: cannot read missing.jsonl: No such file or directory
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    origin: dict[tuple[str, int], str] = {}
    splits: dict[str, str] = {}
    for path in paths:
        rows = _read_one(Path(path))
        for key, row in rows.items():
            if key in merged:
                raise EvalError(
                    f"task {key[0]!r} sample {key[1]} is in both {origin[key]} and {path}: "
                    "these are not disjoint shards of one run"
                )
            merged[key], origin[key] = row, str(path)
            splits.setdefault(str(row.get("split")), str(path))
    if not merged:
        raise EvalError("no results given")
    if len(splits) > 1:
        where = ", ".join(f"{s!r} ({p})" for s, p in splits.items())
        raise EvalError(f"the results mix splits: {where}")
    return list(merged.values())


def _read_one(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise EvalError(f"cannot read {path}: {reason}") from None
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # no newline after it: the line being written when the runner died
                continue
            raise EvalError(f"{path}:{n}: not a results line (invalid JSON)") from None
        if not isinstance(row, dict) or "task_id" not in row or not isinstance(row.get("sample"), int):
            raise EvalError(f"{path}:{n}: not a results line (needs task_id and an integer sample)")
        out[(str(row["task_id"]), row["sample"])] = row
    if not out:
        raise EvalError(f"no results in {path}")
    return out
