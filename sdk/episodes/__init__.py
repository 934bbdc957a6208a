"""Episodes: turn a tracerl store into validated, OpenAI-format training episodes (Parquet).

A session splits into threads: a call continues a thread when its request extends that thread's
previous request plus response, otherwise it starts a new one (another agent, a truncated or
summarised context). Each thread is one episode. Rewards come from the store (session,
per-call and named rewards) and from reward functions applied at export; every episode is validated,
and invalid ones are rejected with a reason and counted, never dropped silently.

polars is needed only to write or read Parquet (``pip install 'tracerl[episodes]'``).

Rewards: session rewards (the last value per name), per-call rewards (summed over the thread unless the
session gives a reward of that name) and named rewards come from the store; reward functions run at export
(``--reward-fn [NAME=]module:function`` or a callable ``fn(episode) -> float | {name: float}``; one that
raises rejects only that episode), and :func:`llm_judge_reward` (``--judge-model``) scores each task's
episodes against each other with an LLM judge on any OpenAI-compatible endpoint (RULER-style). The episode
reward is the one named ``reward_name`` (``reward``); :func:`role_reward` credits one agent of a multi-agent
episode (its own named reward, else the session's).

Validation (:func:`validate_episode`): role order, a tool result without its call, a tool call never
answered, invalid JSON arguments, a missing or non-finite reward, an empty episode, duplicate ids, negative
token ids, an unknown schema version, ``previous_response_id`` calls; what rejects an episode is the
caller's :class:`ValidationPolicy` (the export's, training's, a remote upload's). Invalid episodes are
skipped and written with their reason to a rejects file (``--strict``: stop at the first); episodes built =
written + rejected, and store problems (torn or corrupt lines) are listed by reason. Options (reward
functions, selection, thread splitting, ``require_reward``) are one record, :class:`EpisodeOptions`;
:func:`open_episodes` reads any source (a Parquet file or directory, a store, a store URI, episodes in
memory). The Parquet schema (version 2, zstd; ``messages`` in TRL's conversational format) is defined
once in ``sdk.episodes._schema`` and printed by ``tracerl inspect --schema``.

An export streams: memory holds a batch of episodes, one Parquet row group and the sessions still open, not
the store; late rewards go to an index that moves to a temporary SQLite file past 100k entries. ``--workers
N`` splits a store written by several processes across N processes (the file is the same as with one);
orjson and pyarrow (the ``episodes`` extra) make it faster without changing the output. Figures:
``tests/bench/RESULTS.md``.

Example:
    >>> from sdk.episodes import build_episodes, export
    >>> for ep in build_episodes("traces"):  # doctest: +SKIP
    ...     print(ep["episode_id"], ep["reward"], len(ep["messages"]))
    >>> summary = export("traces", "episodes.parquet")  # doctest: +SKIP
    >>> print(summary.format_table())  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sdk._internal import logger
from sdk.episodes._advantage import group_advantages
from sdk.episodes._faithful import token_faithful, untrained_messages
from sdk.episodes._options import EpisodeOptions, episode_options
from sdk.episodes._parallel import export_parallel, picklable, plan_workers
from sdk.episodes._parquet import (
    DEFAULT_BATCH_SIZE,
    default_rejects_path,
    progress_bar,
    read_episodes,
    write_pairs,
    write_parquet,
)
from sdk.episodes._pipeline import Pipeline, gc_paced
from sdk.episodes._rewards import RewardError, llm_judge_reward, resolve_reward_fns, role_reward
from sdk.episodes._schema import READ_SCHEMA_VERSIONS, SCHEMA_VERSION
from sdk.episodes._source import parquet_files, peek, source_kind
from sdk.episodes._summary import ExportSummary
from sdk.episodes._validate import PROBLEM_CODES, EpisodeError, Problem, ValidationPolicy, validate_episode
from sdk.store import StoredSession, StoreReader
from sdk.store._remote import is_store_uri

__all__ = [
    "PROBLEM_CODES",
    "READ_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "EpisodeError",
    "EpisodeOptions",
    "ExportSummary",
    "Problem",
    "RewardError",
    "build_episodes",
    "export",
    "group_advantages",
    "llm_judge_reward",
    "open_episodes",
    "read_episodes",
    "role_reward",
    "token_faithful",
    "untrained_messages",
    "ValidationPolicy",
    "validate_episode",
    "write_parquet",
]


def build_episodes(
    source: Any,
    options: EpisodeOptions | None = None,
    *,
    on_invalid: str = "skip",
    summary: ExportSummary | None = None,
    **option_kwargs: Any,
) -> Iterator[dict[str, Any]]:
    """Yield the episodes of a store, one per agent thread, streaming (memory: the sessions still open).

    Args:
        source: A store directory or URI (``s3://bucket/prefix``), a ``StoreReader``, or an iterable of
            ``StoredSession``.
        options: How sessions become episodes (selection, thread splitting, rewards, validation); see
            :class:`EpisodeOptions`.
        on_invalid: ``"skip"`` (default; skipped episodes are counted in ``summary``, or without one
            logged once at the end), ``"keep"`` (yield them too; check with :func:`validate_episode`) or
            ``"raise"`` (``EpisodeError`` at the first problem, store problems included).
        summary: An :class:`ExportSummary` to fill with every count (sessions, calls, rejects by reason).
        **option_kwargs: Any :class:`EpisodeOptions` field by name (``models=["gpt-*"]``), applied over
            ``options``.

    Returns:
        An iterator of episode dicts with the Parquet columns as keys (``tools`` and ``metadata`` are
        JSON strings).

    Raises:
        FileNotFoundError: ``source`` is not a store directory (raised at the call, not on iteration).

    Example:
        >>> from sdk.episodes import ExportSummary, build_episodes
        >>> summary = ExportSummary()
        >>> eps = list(build_episodes("traces", summary=summary))  # doctest: +SKIP
        >>> summary.written == len(eps)  # doctest: +SKIP
        True
    """
    if on_invalid not in ("skip", "keep", "raise"):
        raise ValueError(f"on_invalid must be 'skip', 'keep' or 'raise', got {on_invalid!r}")
    options = episode_options(options, option_kwargs)
    pipeline = Pipeline(source, options, strict=on_invalid == "raise", summary=summary)
    return _yield(pipeline, on_invalid, say=summary is None)


def open_episodes(
    source: Any,
    options: EpisodeOptions | None = None,
    *,
    on_invalid: str = "skip",
    summary: ExportSummary | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the episodes of any source: the one way in for trainers, the viewer and the exporters.

    Sources: an episode Parquet file (local or a ``.parquet`` object-store URI), a directory of episode
    Parquet files, a store directory, a store URI (``s3://bucket/prefix``, fetched once by
    ``StoreReader``), a ``StoreReader``, an iterable of ``StoredSession``, or an iterable of episode dicts
    (or a polars / pandas DataFrame of them). A store's episodes are built as by :func:`build_episodes`;
    episodes that are already built (Parquet, dicts) are yielded as they are (as :func:`read_episodes`
    reads them), so for those ``options`` must stay at their defaults and ``summary`` is not filled.

    Args:
        source: Where the episodes are (see above).
        options: How a store's sessions become episodes (:class:`EpisodeOptions`).
        on_invalid: For a store: ``"skip"``, ``"keep"`` or ``"raise"`` (see :func:`build_episodes`).
        summary: For a store: an :class:`ExportSummary` to fill with every count.

    Returns:
        An iterator of episode dicts (the Parquet columns; ``tools`` and ``metadata`` JSON strings).

    Raises:
        FileNotFoundError: Nothing at a path ``source`` (raised at the call, not on iteration).
        EpisodeError: A file that is not an episode Parquet file.
        ValueError: ``options`` other than the defaults for a source of built episodes (they would not
            apply).

    Example:
        >>> eps = [{"episode_id": "e1", "task_id": "t", "messages": [], "reward": 1.0}]
        >>> [ep["episode_id"] for ep in open_episodes(eps)]
        ['e1']
        >>> n = sum(1 for _ in open_episodes("traces", EpisodeOptions(splits=["train"])))  # doctest: +SKIP
    """
    options = options if options is not None else EpisodeOptions()
    kind = source_kind(source)
    if kind == "missing":
        raise FileNotFoundError(f"no store directory or episode file at {str(source)!r}")
    if kind in ("store", "store_uri", "reader"):
        return build_episodes(source, options, on_invalid=on_invalid, summary=summary)
    if kind == "iterable":
        if hasattr(source, "to_dicts"):  # a polars DataFrame
            source = source.to_dicts()
        elif hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
            source = source.to_dict(orient="records")
        first, items = peek(source)
        if first is None:  # nothing to build or read: no sessions, no episodes (an empty store, say)
            return iter(())
        if isinstance(first, StoredSession):
            return build_episodes(items, options, on_invalid=on_invalid, summary=summary)
        source = items
    if not options.is_default:
        raise ValueError(
            f"episode options apply when episodes are built from a store; {kind.replace('_', ' ')} "
            "sources hold built episodes (pass default options)"
        )
    if kind == "iterable":
        return (ep if type(ep) is dict else dict(ep) for ep in source)
    return _read_parquet(source, kind)


def _read_parquet(source: Any, kind: str) -> Iterator[dict[str, Any]]:
    if kind == "parquet_uri":  # one episode file on object storage: read from a local copy
        yield from _read_remote_parquet(str(source))
        return
    for path in parquet_files(source):
        yield from read_episodes(path)


def _read_remote_parquet(uri: str) -> list[dict[str, Any]]:
    import tempfile

    import fsspec

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "episodes.parquet"
        try:
            fsspec.core.url_to_fs(uri)[0].get_file(uri, str(local))
        except (FileNotFoundError, OSError) as exc:
            raise FileNotFoundError(f"cannot read {uri}: {exc}") from None
        return read_episodes(local)


def _yield(pipeline: Pipeline, on_invalid: str, *, say: bool) -> Iterator[dict[str, Any]]:
    """The pipeline's episodes; ``say``: log the skipped ones once (a caller with a summary counts them)."""
    for ep, problems in pipeline:
        if on_invalid == "keep" or not any(p.is_error for p in problems):
            yield ep
    s = pipeline.summary
    if say and on_invalid == "skip" and s.rejected:
        reasons = ", ".join(f"{k} {v}" for k, v in s.rejected.most_common())
        logger.warning(
            "tracerl: build_episodes skipped %d invalid episode(s) (%s); pass summary=ExportSummary() to "
            "see every count, or export() to get a rejects file",
            s.rejected_total,
            reasons,
        )


def export(
    store: Any,
    out: str | os.PathLike[str],
    options: EpisodeOptions | None = None,
    *,
    rejects: str | os.PathLike[str] | None | bool = True,
    strict: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    workers: int = 1,
    **option_kwargs: Any,
) -> ExportSummary:
    """Store → episodes → one zstd Parquet file, streaming; invalid episodes go to a rejects file.

    Args:
        store: A store directory or object-store URI (``s3://bucket/prefix``), or a ``StoreReader`` /
            ``TailUpdate`` (the sessions that ended since a ``StoreTail``'s previous read) / iterable of
            ``StoredSession``.
        out: Output ``.parquet`` path, replaced atomically when the export completes.
        options: How sessions become episodes (:class:`EpisodeOptions`), as for :func:`build_episodes`.
        rejects: Rejects file (JSON lines with reasons, problems and the episode); ``True`` (default)
            for ``<out stem>.rejects.jsonl``; ``None``/``False`` to only count rejects.
        strict: Raise ``EpisodeError`` at the first problem (invalid episode or store problem); the
            output file is then not written.
        batch_size: Episodes per in-memory batch (memory is bounded by a batch, not the store).
        progress: Show a tqdm progress bar on stderr.
        workers: Processes to export with (default 1: this one). ``N > 1`` splits a store written by
            several processes across this process and ``N - 1`` worker processes (~200 MB each; they
            share one reward index on disk): this one writes its share straight into the output, then
            appends the workers' parts. ``0`` picks ``min(CPUs, 8)`` when the store has 16 MB per
            process. Parallel export needs a store path, picklable reward functions (module-level, or
            ``module:function`` strings) and no ``group_reward_fns``; otherwise it runs in this process.
            The output is the same either way.
        **option_kwargs: Any :class:`EpisodeOptions` field by name, applied over ``options``.

    Returns:
        The :class:`ExportSummary`.

    Example:
        >>> from sdk.episodes import export
        >>> s = export("traces", "episodes.parquet", reward_fns="proj.rewards:exact")  # doctest: +SKIP
        >>> s.written, dict(s.rejected), s.reward_stats()  # doctest: +SKIP
        (96, {'missing_reward': 4}, {'gsm8k-17': (8, 0.625, 0.484)})
    """
    options = episode_options(options, option_kwargs)
    if is_store_uri(store):
        store = StoreReader(store)  # fetches the object-store store once; everything below reads that copy
    local = store.path if isinstance(store, StoreReader) else store
    _check_rejects_path(local, out, rejects)
    options = options.replace(reward_fns=resolve_reward_fns(options.reward_fns))
    shares = plan_workers(
        local,
        workers,
        group_rewards=bool(options.group_reward_fns),
        unpicklable=not picklable(options.reward_fns),
    )
    if shares is not None:
        return export_parallel(
            local,
            out,
            shares,
            rejects=rejects,
            progress=progress,
            options=options,
            strict=strict,
            batch_size=batch_size,
        )
    summary = ExportSummary()
    pipeline = Pipeline(store, options, strict=strict, summary=summary)
    total = pipeline.reader.total_bytes() if progress and pipeline.reader is not None else None
    update, close = progress_bar(progress, total)
    pipeline.progress = update
    try:
        with gc_paced():
            return write_pairs(pipeline, out, summary=summary, rejects=rejects, batch_size=batch_size)
    finally:
        close()


def _check_rejects_path(store: Any, out: str | os.PathLike[str], rejects: Any) -> None:
    """Refuse a rejects file inside the store directory: the reader takes every *.jsonl file for a segment."""
    if isinstance(store, (str, os.PathLike)) and rejects:
        rejects_path = default_rejects_path(out) if rejects is True else Path(rejects)
        if rejects_path.resolve().parent == Path(store).resolve():
            raise ValueError(
                f"the rejects file {str(rejects_path)!r} would be inside the store and read back as a "
                "segment; write the output elsewhere or pass another rejects path"
            )
