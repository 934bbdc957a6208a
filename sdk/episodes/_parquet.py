"""Writing and reading episode Parquet files (polars, zstd, explicit schema, bounded memory)."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from sdk.episodes._frame import episodes_frame, sanitize
from sdk.episodes._pipeline import Pair, validate_only
from sdk.episodes._schema import (
    READ_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    as_schema_version,
    has_policy_versions,
    polars_schema,
)
from sdk.episodes._summary import ExportSummary
from sdk.episodes._validate import EpisodeError, Problem

__all__ = [
    "Rejects",
    "default_rejects_path",
    "pair_frames",
    "read_episodes",
    "reject_line",
    "sink",
    "write_pairs",
    "write_parquet",
]

DEFAULT_BATCH_SIZE = 1000
"""Episodes per in-memory batch: memory stays bounded by one batch whatever the store's size."""


MAX_BATCH_TOKEN_VALUES = 250_000
"""A batch is also cut at this many token ids + logprobs: as Python objects they take ~36 bytes each, and
vLLM-style prompt token ids (the whole prompt, every turn) would otherwise dominate memory."""


def _token_values(ep: dict[str, Any]) -> int:
    n = 0
    for t in ep.get("turns") or ():
        lps, ids, prompt = t.get("logprobs"), t.get("token_ids"), t.get("prompt_token_ids")
        if lps:
            n += len(lps)
        if ids:
            n += len(ids)
        if prompt:
            n += len(prompt)
    return n


def default_rejects_path(out: str | os.PathLike[str]) -> Path:
    """``episodes.parquet`` → ``episodes.rejects.jsonl`` (next to the output)."""
    p = Path(out)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(f"{stem}.rejects.jsonl")


def _file_metadata(version: int = SCHEMA_VERSION) -> dict[str, str]:
    from sdk import __version__

    return {"tracerl.schema_version": str(version), "tracerl.version": __version__}


ROW_GROUP_BYTES = 16 * 1024 * 1024
"""Target in-memory size of a row group (polars' estimate), between 1000 and 50 000 episodes."""


def _row_group_size(frame: Any) -> int:
    """Episodes per row group for frames like ``frame``: about :data:`ROW_GROUP_BYTES` each.

    The writer buffers a whole row group, so it must not be large (polars' default, hundreds of thousands
    of rows, would hold most of a large export in memory), but it also keeps ~80 KB of native memory per
    row group until the file is closed: with 1000-episode row groups, memory grew by ~30 MB per million
    calls (~10 MB with 32 MB row groups, which cost 55 MB more to start with).
    """
    per_episode = frame.estimated_size() / max(1, frame.height)
    return int(min(50_000, max(DEFAULT_BATCH_SIZE, ROW_GROUP_BYTES / max(1.0, per_episode))))


def sink(frames: Iterator[Any], path: Path, row_group_size: int | None = None) -> None:
    """Stream DataFrames into one zstd Parquet file at ``path`` (written to a temp file, then renamed).

    polars' IO-source plugin feeds our generator into ``sink_parquet``'s streaming engine, so only
    the batches in flight and one row group (by default sized from the first batch, see
    :func:`_row_group_size`) are in memory. Without it (older polars) batches go to part files that are
    then merged by a streaming scan: the same bounded memory, one extra pass over the data.

    The file is schema version 2 when its first batch has a policy version, else version 1 (exports of
    stores without versions stay as they were). Should a later batch bring versions to a version-1 file,
    what was written is read back as version 2 and the rest follows it: one extra pass, only then.
    """
    first = next(frames, None)
    if first is not None:
        frames = itertools.chain([first], frames)
    if row_group_size is None:
        row_group_size = _row_group_size(first) if first is not None and first.height else DEFAULT_BATCH_SIZE
    version = 2 if first is not None and has_policy_versions(first) else 1
    rest: list[Iterator[Any]] = []

    def until_versions() -> Iterator[Any]:
        for frame in frames:
            if version == 1 and has_policy_versions(frame):
                rest.append(itertools.chain([frame], frames))
                return
            yield as_schema_version(frame, version)

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    old = path.with_name(f".{path.name}.v1-{os.getpid()}")
    try:
        _sink_file(until_versions(), tmp, version, row_group_size)
        if rest:
            import polars as pl

            os.replace(tmp, old)
            written = pl.scan_parquet(old).collect_batches(chunk_size=DEFAULT_BATCH_SIZE)
            upgraded = (as_schema_version(f, 2) for f in itertools.chain(written, rest[0]))
            _sink_file(upgraded, tmp, 2, row_group_size)
        os.replace(tmp, path)
    finally:
        for f in (tmp, old):
            if f.exists():
                f.unlink()


def _sink_file(frames: Iterator[Any], tmp: Path, version: int, row_group_size: int) -> None:
    """Write ``frames`` (of schema ``version``) to the Parquet file ``tmp``."""
    import polars as pl

    schema = polars_schema(version)
    parts: Path | None = None
    try:
        try:
            from polars.io.plugins import register_io_source
        except ImportError:  # pragma: no cover - polars < 1.0
            register_io_source = None

        def source(*_: Any) -> Iterator[Any]:
            empty = True
            for frame in frames:
                empty = False
                yield frame
            if empty:  # a file with the schema and no rows, never a missing file
                yield pl.DataFrame(schema=schema)

        metadata = _file_metadata(version)
        if register_io_source is not None:
            lf = register_io_source(source, schema=schema)
            lf.sink_parquet(tmp, compression="zstd", metadata=metadata, row_group_size=row_group_size)
        else:  # pragma: no cover - exercised only with old polars
            parts = tmp.with_name(f"{tmp.name}.parts")
            parts.mkdir(exist_ok=True)
            names = []
            for i, frame in enumerate(source()):
                name = parts / f"{i:06d}.parquet"
                frame.write_parquet(name, compression="zstd")
                names.append(str(name))
            pl.scan_parquet(names, schema=schema).sink_parquet(
                tmp, compression="zstd", row_group_size=row_group_size
            )
    finally:
        if parts is not None:
            for f in parts.glob("*"):
                f.unlink()
            parts.rmdir()


def reject_line(ep: dict[str, Any], problems: list[Problem]) -> str:
    """One line of a rejects file: the episode's ids, its error codes, every problem and the episode."""
    record = {
        "episode_id": ep.get("episode_id"),
        "session_id": ep.get("session_id"),
        "task_id": ep.get("task_id"),
        "reasons": sorted({p.code for p in problems if p.is_error}),
        "problems": [p.to_dict() for p in problems],
        "episode": ep,
    }
    return json.dumps(record, ensure_ascii=False, default=str)


class Rejects:
    """The rejects file, created on the first reject (JSON lines: reasons, problems and the episode)."""

    def __init__(self, path: Path | None, summary: ExportSummary) -> None:
        self.path = path
        self.summary = summary
        self._fh: TextIO | None = None

    def write(self, ep: dict[str, Any], problems: list[Any]) -> None:
        """Append one rejected episode with its problems (nothing when there is no rejects path)."""
        if self.path is None:
            return
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # backslashreplace writes a lone surrogate as the JSON escape it came from.
            self._fh = open(self.path, "w", encoding="utf-8", errors="backslashreplace")
            self.summary.rejects_path = str(self.path)
        self._fh.write(reject_line(ep, problems) + "\n")

    def close(self) -> None:
        """Close the file; remove a stale one from an earlier run when nothing was rejected."""
        if self._fh is not None:
            self._fh.close()
        elif self.path is not None and self.path.exists():
            self.path.unlink()  # a stale rejects file from an earlier run would contradict the summary


def pair_frames(
    pairs: Iterable[Pair], summary: ExportSummary, rejects: Rejects, batch_size: int = DEFAULT_BATCH_SIZE
) -> Iterator[Any]:
    """DataFrames of the valid episodes of ``pairs``, a batch at a time; rejected ones go to ``rejects``."""

    def convert(batch: list[dict[str, Any]]) -> Any:
        try:
            return episodes_frame(batch)
        except (TypeError, ValueError, OverflowError):
            pass
        for ep in batch:
            faithful = ep.get("token_faithful")
            for fix in sanitize(ep):
                summary.warnings[fix] += 1
            if faithful and not ep.get("token_faithful"):
                summary.token_faithful -= 1
        return episodes_frame(batch)

    batch: list[dict[str, Any]] = []
    values = 0
    for ep, problems in pairs:
        if problems and any(p.is_error for p in problems):
            rejects.write(ep, problems)
            continue
        batch.append(ep)
        values += _token_values(ep)
        if len(batch) >= batch_size or values >= MAX_BATCH_TOKEN_VALUES:
            yield convert(batch)
            batch, values = [], 0
    if batch:
        yield convert(batch)


def write_pairs(
    pairs: Iterable[Pair],
    out: str | os.PathLike[str],
    *,
    summary: ExportSummary,
    rejects: str | os.PathLike[str] | None | bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    row_group_size: int | None = None,
) -> ExportSummary:
    """Write valid episodes to ``out`` and rejected ones to the rejects file; counts are in ``summary``.

    ``row_group_size``: episodes per Parquet row group (default: ~16 MB each, see :func:`sink`).
    """
    path = Path(out)
    if path.is_dir():
        raise IsADirectoryError(f"output {str(path)!r} is a directory; give a .parquet file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    rejects_path = default_rejects_path(path) if rejects is True else (Path(rejects) if rejects else None)
    sink_rejects = Rejects(rejects_path, summary)
    started = time.perf_counter()
    try:
        sink(pair_frames(pairs, summary, sink_rejects, batch_size), path, row_group_size)
    finally:
        sink_rejects.close()
    summary.out = str(path)
    summary.elapsed_s = time.perf_counter() - started
    return summary


def write_parquet(
    episodes: Iterable[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    require_reward: bool = True,
    rejects: str | os.PathLike[str] | None | bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ExportSummary:
    """Validate episodes and write the valid ones to a zstd Parquet file, streaming.

    Args:
        episodes: Episode dicts, e.g. from ``build_episodes(store, on_invalid="keep")`` or ``read_episodes``.
        path: Output ``.parquet`` file (replaced atomically when complete).
        strict: Raise ``EpisodeError`` at the first invalid episode instead of rejecting it.
        require_reward: Reject episodes without a reward (turn off for SFT data).
        rejects: Rejects file path; ``True`` (default) for ``<out stem>.rejects.jsonl``, ``None``/``False``
            to only count rejects.
        batch_size: Episodes per in-memory batch.

    Returns:
        The :class:`ExportSummary` (written, rejected by reason, reward stats per task).

    Example:
        >>> from sdk.episodes import build_episodes, write_parquet
        >>> summary = write_parquet(build_episodes("traces", on_invalid="keep"),  # doctest: +SKIP
        ...                         "episodes.parquet")
        >>> summary.written, dict(summary.rejected)  # doctest: +SKIP
        (128, {'missing_reward': 3})
    """
    summary = ExportSummary()
    pairs = validate_only(episodes, require_reward=require_reward, strict=strict, summary=summary)
    return write_pairs(pairs, path, summary=summary, rejects=rejects, batch_size=batch_size)


_REQUIRED = ("schema_version", "episode_id", "messages")


def read_episodes(path: str | os.PathLike[str], *, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Read an episode Parquet file back as a list of episode dicts (the shape ``build_episodes`` yields).

    Raises ``EpisodeError`` with a one-line message when the file is missing, not Parquet, not an
    episode file, or of a schema version this tracerl does not know.

    Args:
        path: A ``.parquet`` file written by ``export`` / ``write_parquet``.
        columns: Read only these columns.

    Example:
        >>> eps = read_episodes("episodes.parquet")  # doctest: +SKIP
        >>> eps[0]["messages"][0]["role"], eps[0]["reward"]  # doctest: +SKIP
        ('system', 1.0)
    """
    import polars as pl

    p = Path(path)
    if not p.is_file():
        raise EpisodeError(f"no episode file at {str(p)!r}")
    try:
        schema = pl.read_parquet_schema(p)
    except Exception as exc:
        raise EpisodeError(f"{str(p)!r} is not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    missing = [c for c in _REQUIRED if c not in schema]
    if missing:
        raise EpisodeError(f"{str(p)!r} is not a tracerl episode file (no {', '.join(missing)} column)")
    try:
        versions = pl.read_parquet(p, columns=["schema_version"])["schema_version"].unique().to_list()
        unknown = [v for v in versions if v not in READ_SCHEMA_VERSIONS]
        if unknown:
            raise EpisodeError(
                f"{str(p)!r} has unknown schema_version {unknown[0]!r} (this tracerl reads versions "
                f"{', '.join(map(str, READ_SCHEMA_VERSIONS))}); upgrade tracerl"
            )
        frame = pl.read_parquet(p, columns=columns)
        turn = getattr(frame.schema.get("turns"), "inner", None)
        if isinstance(turn, pl.Struct) and "policy_version" not in turn.to_schema():
            # Version 1: every turn reads with a null policy version, as a version-2 file would say.
            frame = frame.with_columns(pl.col("turns").cast(polars_schema(2)["turns"]))
        return frame.to_dicts()
    except EpisodeError:
        raise
    except Exception as exc:
        raise EpisodeError(f"cannot read {str(p)!r}: {str(exc).splitlines()[0]}") from None


def progress_bar(
    enabled: bool, total_bytes: int | None = None
) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A tqdm progress callback ``update(calls, bytes)`` on stderr and its closer.

    With ``total_bytes`` (a store's size) the bar shows the share of the store read and an ETA, with the
    calls read beside it; without, calls only. The callback is ``None`` when disabled or without tqdm.
    """
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, lambda: None
    if not total_bytes:
        bar = tqdm(unit="call", unit_scale=True, dynamic_ncols=True, leave=False, desc="export")

        def calls_only(calls: int, _bytes: int) -> None:
            bar.update(calls)

        return calls_only, bar.close
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        dynamic_ncols=True,
        leave=False,
        desc="export",
    )
    read = 0

    def update(calls: int, nbytes: int) -> None:
        nonlocal read
        read += calls
        bar.set_postfix_str(f"{read:,} calls", refresh=False)
        bar.update(nbytes)

    return update, bar.close
