"""Loading episodes (Parquet file or directory, store directory or URI, DataFrame, dicts) as row dicts."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from sdk.episodes import READ_SCHEMA_VERSIONS, SCHEMA_VERSION, EpisodeError, ExportSummary, open_episodes
from sdk.episodes._source import source_kind
from sdk.store._remote import is_store_uri
from trainers.data._report import DataReport
from trainers.errors import UserError

__all__ = ["REQUIRED_COLUMNS", "check_task_sizes", "episodes_by_task", "load_episodes", "recorded_group_size"]


#: Columns without which an episode cannot be trained on.
REQUIRED_COLUMNS: tuple[str, ...] = ("episode_id", "task_id", "messages", "reward")


def _to_records(obj: Any) -> list[dict[str, Any]]:
    """Coerce what ``build_episodes`` (or a user) may hand us into a list of row dicts."""
    if obj is None:
        return []
    if isinstance(obj, (str, os.PathLike)):
        return load_episodes(obj)
    if hasattr(obj, "to_dicts"):  # polars.DataFrame
        return list(obj.to_dicts())
    if hasattr(obj, "collect") and hasattr(obj, "lazy"):  # polars.LazyFrame
        return list(obj.collect().to_dicts())
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # pandas.DataFrame
        return list(obj.to_dict(orient="records"))
    rows: list[dict[str, Any]] = []
    for item in obj:
        if isinstance(item, Mapping):
            rows.append(dict(item))
        elif is_dataclass(item) and not isinstance(item, type):
            rows.append(asdict(item))
        elif hasattr(item, "to_dict"):
            rows.append(dict(item.to_dict()))
        elif hasattr(item, "model_dump"):
            rows.append(dict(item.model_dump()))
        else:
            raise UserError(f"cannot read an episode from a {type(item).__name__}; expected a dict")
    return rows


def _open(source: Any, report: DataReport | None, strict: bool) -> list[dict[str, Any]]:
    """Episodes of a path or URI through ``sdk.episodes.open_episodes``, problems counted in ``report``."""
    kind = source_kind(source)
    if kind == "missing":
        path = Path(source).expanduser()
        if path.exists():
            raise UserError(f"data path is neither a file nor a directory: {path}")
        raise UserError(f"data path not found: {path}")
    store = kind in ("store", "store_uri")
    summary = ExportSummary()
    try:
        rows = list(open_episodes(source, on_invalid="raise" if strict else "skip", summary=summary))
    except ImportError as exc:  # pragma: no cover - polars is in the train extra
        raise UserError("reading episodes needs polars: pip install 'tracerl[episodes]'") from exc
    except EpisodeError as exc:  # one line that names the file and what is wrong with it
        if store:
            raise UserError(f"{exc}; without --strict such problems are counted and skipped") from None
        raise UserError(f"cannot read Parquet file: {exc}") from None
    except OSError as exc:  # an unreadable store, segment or file: never read as empty
        raise UserError(f"cannot read {'the store ' if store else ''}{source}: {exc}") from None
    if report is not None and store:
        report.store_problems = dict(summary.store_problems)
        report.superseded = summary.skipped["sessions_superseded"]
        # Episodes the store builder rejected (e.g. a damaged thread) count as invalid ones.
        report.episodes += summary.rejected_total
        report.invalid += summary.rejected_total
        for code, n in summary.rejected.items():
            report.invalid_problems[code] = report.invalid_problems.get(code, 0) + n
    return rows


def load_episodes(
    data: Any, *, report: DataReport | None = None, strict: bool = False
) -> list[dict[str, Any]]:
    """Load episodes as a list of row dicts following the episode Parquet contract.

    Paths and URIs are read by :func:`sdk.episodes.open_episodes`: a directory holding store segments is a
    store (its episodes are built), one holding only Parquet files is a set of episode files.

    Args:
        data: A Parquet file, a directory of Parquet files, a tracerl store directory or store URI
            (``s3://bucket/prefix``; a ``.parquet`` URI is one Parquet file), a polars/pandas DataFrame, or
            an iterable of episode dicts.
        report: Where a store's problems (lines it could not use), superseded sessions and rejected
            episodes are counted.
        strict: Refuse a store with any problem or invalid episode instead of counting and skipping.

    Returns:
        One dict per episode.

    Raises:
        UserError: The path does not exist, cannot be read, or has incompatible columns.

    Example:
        >>> load_episodes([{"episode_id": "e1", "task_id": "t", "messages": [], "reward": 1.0}])[0]["task_id"]
        't'
    """
    if isinstance(data, (str, os.PathLike)) or is_store_uri(data):
        rows = _open(data, report, strict)
    else:
        rows = _to_records(data)
    _validate(rows)
    return rows


# Nested columns: a JSON string in their place (a hand-made Parquet file) is refused with its name.
_NESTED = ("messages", "turns", "rewards")


def _validate(rows: list[dict[str, Any]]) -> None:
    if not rows:
        raise UserError("no episodes found in the data")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise UserError(
            f"episodes lack required column(s) {', '.join(missing)}; "
            f"expected the episode schema v{SCHEMA_VERSION}"
        )
    for column in _NESTED:
        if any(isinstance(r.get(column), (str, bytes)) for r in rows):
            raise UserError(
                f"column {column!r} holds strings, expected lists of structs "
                f"(the episode schema v{SCHEMA_VERSION}; JSON text is not decoded)"
            )
    # Rows built in memory may carry no version: they are taken as the current one.
    versions = {r.get("schema_version") for r in rows} - {None, *READ_SCHEMA_VERSIONS}
    if versions:
        raise UserError(
            f"unsupported episode schema_version {sorted(versions)}; "
            f"this trainer reads versions {', '.join(map(str, READ_SCHEMA_VERSIONS))}"
        )


def episodes_by_task(episodes: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The episodes with a task id and a reward, by task id (in the order they come).

    Example:
        >>> sorted(episodes_by_task([{"task_id": "a", "reward": 1.0}, {"task_id": "b", "reward": None}]))
        ['a']
    """
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for ep in episodes:
        if ep.get("task_id") is not None and ep.get("reward") is not None:
            out[str(ep["task_id"])].append(ep)
    return dict(out)


def check_task_sizes(episodes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Count rewarded episodes per task and fail unless some task has at least two.

    Args:
        episodes: Episode dicts.

    Returns:
        ``{task_id: number of episodes with a reward}``.

    Raises:
        UserError: No task has ≥ 2 rewarded episodes; the message names the tasks and their counts.

    Example:
        >>> check_task_sizes([{"task_id": "a", "reward": 1.0}, {"task_id": "a", "reward": 0.0}])
        {'a': 2}
    """
    counts = {task: len(eps) for task, eps in episodes_by_task(episodes).items()}
    if not any(n >= 2 for n in counts.values()):
        if counts:
            shown = ", ".join(f"{t} ({n})" for t, n in sorted(counts.items())[:10])
            more = f", ... {len(counts) - 10} more" if len(counts) > 10 else ""
            detail = f"episodes per task: {shown}{more}"
        else:
            detail = "no episode has both a task_id and a reward"
        raise UserError(
            f"GRPO needs a task with at least 2 rewarded episodes, none has ({detail}); "
            "run each task several times inside session(task_id=...) and record a reward"
        )
    return dict(counts)


def recorded_group_size(episodes: Sequence[Mapping[str, Any]]) -> int | None:
    """The group size the episodes were collected with (``tracerl rollout`` records it), when all agree.

    Example:
        >>> recorded_group_size([{"metadata": '{"group_size": 8}'}, {"metadata": {"group_size": 8}}])
        8
        >>> recorded_group_size([{"metadata": None}]) is None
        True
    """
    import json

    sizes = set()
    for ep in episodes:
        meta = ep.get("metadata")
        if isinstance(meta, str):
            if '"group_size"' not in meta:
                return None
            try:
                meta = json.loads(meta)
            except json.JSONDecodeError:
                return None
        size = meta.get("group_size") if isinstance(meta, Mapping) else None
        if not isinstance(size, int) or isinstance(size, bool):
            return None
        sizes.add(size)
    return sizes.pop() if len(sizes) == 1 else None
