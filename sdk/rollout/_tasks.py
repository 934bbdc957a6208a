"""The runner's inputs: the agent and reward entry points, the task set, its shards, and the input errors.

Example:
    >>> load_tasks([{"task_id": "a"}])[0]["id"]
    'a'
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk._internal import load_function as _load_function
from sdk.eval import EvalError, parse_shard, shard_of

__all__ = ["RolloutError", "SampleTimeout", "load_function", "load_tasks"]


class SampleTimeout(TimeoutError):
    """A sample ran past the runner's timeout (recorded on its session under this name).

    Example:
        >>> isinstance(SampleTimeout("sample took longer than 60 s"), TimeoutError)
        True
    """


class RolloutError(ValueError):
    """Bad input to the runner (unloadable agent, unreadable task file, duplicate task ids, ...).

    Example:
        >>> raise RolloutError("task file not found: tasks.jsonl")  # doctest: +SKIP
    """


# --------------------------------------------------------------------------------------------- inputs


def load_function(spec: str | Callable[..., Any], what: str = "function") -> Callable[..., Any]:
    """Resolve ``"package.module:function"`` (or pass a callable through); :class:`RolloutError` if not.

    The current directory is importable, as with ``python -m``.

    Example:
        >>> load_function("json:dumps")([1])
        '[1]'
    """
    if callable(spec):
        return spec
    try:
        return _load_function(spec, what)
    except ValueError as exc:
        raise RolloutError(str(exc)) from None


def check_call(fn: Callable[..., Any], n_args: int, what: str, call: str) -> None:
    """Refuse ``fn`` when it cannot be called with ``n_args`` positional arguments (``call`` shows how).

    Checked before anything runs: an agent of the wrong signature would otherwise fail every sample.

    Example:
        >>> check_call(lambda task, extra: 0, 1, "agent", "solve(task)")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        sdk.rollout._tasks.RolloutError: the agent cannot be called as solve(task): missing a required ...
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check
        return
    try:
        signature.bind(*([None] * n_args))
    except TypeError as exc:
        raise RolloutError(f"the {what} cannot be called as {call}: {exc}") from None


def load_tasks(source: str | os.PathLike[str] | Iterable[dict[str, Any]], id_field: str = "id") -> list[dict]:
    """Read tasks and check that each has a unique id (``id_field``, else ``task_id``).

    Args:
        source: A ``.jsonl`` file, a ``.parquet`` file, a ``datasets.save_to_disk`` directory,
            ``hf:NAME[:SPLIT]`` for ``datasets.load_dataset``, or an iterable of dicts.
        id_field: The field holding the task id.

    Returns:
        The tasks as dicts, in file order, each with ``"id"`` set to its id as a string.

    Raises:
        RolloutError: Unreadable source, a task that is not a mapping, a missing or duplicate id.

    Example:
        >>> load_tasks([{"id": 1, "q": "2+2"}])
        [{'id': '1', 'q': '2+2'}]
    """
    if isinstance(source, (str, os.PathLike)):
        rows = _read_task_source(str(source))
    else:
        rows = list(source)
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise RolloutError(f"task {n} is not a mapping (got {type(row).__name__})")
        tid = row.get(id_field, row.get("task_id") if id_field == "id" else None)
        if tid is None or (isinstance(tid, float) and math.isnan(tid)) or str(tid) == "":
            raise RolloutError(f"task {n} has no {id_field!r} field")
        tid = str(tid)
        if tid in seen:
            raise RolloutError(f"task id {tid!r} appears twice (task {n})")
        seen.add(tid)
        tasks.append({**row, "id": tid})
    return tasks


def _read_task_source(src: str) -> list[Any]:
    if src.startswith("hf:"):
        name, _, split = src[3:].partition(":")
        try:
            import datasets
        except ImportError as exc:
            raise RolloutError("hf: task sources need the 'datasets' package") from exc
        try:
            ds = datasets.load_dataset(name, split=split or "train")
        except Exception as exc:
            raise RolloutError(f"cannot load dataset {name!r}: {type(exc).__name__}: {exc}") from exc
        return list(ds)
    path = Path(src).expanduser()
    if path.is_dir():
        try:
            import datasets
        except ImportError as exc:
            raise RolloutError(f"{path} is a directory: reading it needs the 'datasets' package") from exc
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise RolloutError(f"cannot read {path} as a saved dataset: {type(exc).__name__}: {exc}") from exc
        if isinstance(ds, datasets.DatasetDict):
            raise RolloutError(f"{path} holds several splits ({', '.join(ds)}): name one, e.g. {path}/train")
        return list(ds)
    if not path.is_file():
        raise RolloutError(f"task file not found: {path}")
    if path.suffix == ".parquet":
        try:
            import polars as pl
        except ImportError as exc:
            raise RolloutError("Parquet task files need polars: pip install 'tracerl[episodes]'") from exc
        try:
            return pl.read_parquet(path).to_dicts()
        except Exception as exc:
            raise RolloutError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    rows: list[Any] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RolloutError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def _shard_tasks(tasks: list[dict[str, Any]], shard: str | tuple[int, int]) -> list[dict[str, Any]]:
    try:
        i, n = parse_shard(shard if isinstance(shard, str) else "/".join(map(str, shard)))
    except EvalError as exc:
        raise RolloutError(str(exc)) from None
    return [t for t in tasks if shard_of(t["id"], n) == i]
