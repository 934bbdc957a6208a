"""Episodes: turn a tracerl store into validated, OpenAI-format training episodes (Parquet).

A session splits into threads: a call continues a thread when its request extends that thread's
previous request plus response, otherwise it starts a new one (another agent, a truncated or
summarised context). Each thread is one episode. Rewards come from the store (session,
per-call and named rewards) and from reward functions applied at export; every episode is validated,
and invalid ones are rejected with a reason and counted, never dropped silently.

polars is needed only to write or read Parquet (``pip install 'tracerl[episodes]'``).

Example:
    >>> from sdk.episodes import build_episodes, export
    >>> for ep in build_episodes("traces"):  # doctest: +SKIP
    ...     print(ep["episode_id"], ep["reward"], len(ep["messages"]))
    >>> summary = export("traces", "episodes.parquet")  # doctest: +SKIP
    >>> print(summary.format_table())  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sdk._internal import logger
from sdk.episodes._advantage import group_advantages
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
from sdk.episodes._rewards import RewardError, llm_judge_reward, resolve_reward_fns
from sdk.episodes._schema import SCHEMA_VERSION
from sdk.episodes._summary import ExportSummary
from sdk.episodes._validate import PROBLEM_CODES, EpisodeError, Problem, validate_episode

__all__ = [
    "PROBLEM_CODES",
    "SCHEMA_VERSION",
    "EpisodeError",
    "ExportSummary",
    "Problem",
    "RewardError",
    "build_episodes",
    "export",
    "group_advantages",
    "llm_judge_reward",
    "read_episodes",
    "validate_episode",
    "write_parquet",
]


def build_episodes(
    source: Any,
    *,
    reward_fns: Any = None,
    group_reward_fns: Mapping[str, Callable[..., Any]] | None = None,
    reward_name: str = "reward",
    models: Iterable[str] = (),
    agents: Iterable[str] = (),
    splits: Iterable[str] = (),
    split_by: Iterable[str] = (),
    require_reward: bool = True,
    on_invalid: str = "skip",
    summary: ExportSummary | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the episodes of a store, one per agent thread, streaming (memory: the sessions still open).

    Args:
        source: A store directory, a ``StoreReader``, or an iterable of ``StoredSession``.
        reward_fns: Post-hoc rewards: a callable ``fn(episode) -> float | {name: float} | None`` (named
            ``"reward"``), a ``"[name=]module:function"`` string, a ``{name: fn}`` mapping, or a list of
            those. A function that raises rejects that episode (``reward_fn_error``), nothing more.
        group_reward_fns: ``{name: fn(episodes_of_one_task) -> [value, ...]}``, e.g. a partial of
            :func:`llm_judge_reward`. Holds all episodes in memory until the store is read.
        reward_name: Which named reward is the episode ``reward``.
        models: Keep only calls whose requested or returned model matches one of these glob patterns.
        agents: Keep only calls whose agent name matches one of these glob patterns.
        splits: Keep only sessions whose metadata ``split`` is one of these (e.g. ``["train"]``).
        split_by: ``"agent"`` and/or ``"model"``: a call never continues a thread of another agent/model.
        require_reward: Treat an episode without a reward as invalid.
        on_invalid: ``"skip"`` (default; skipped episodes are counted in ``summary`` and logged once at
            the end), ``"keep"`` (yield them too; check with :func:`validate_episode`) or ``"raise"``
            (``EpisodeError`` at the first problem, store problems included).
        summary: An :class:`ExportSummary` to fill with every count (sessions, calls, rejects by reason).

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
    pipeline = Pipeline(
        source,
        reward_fns=reward_fns,
        group_reward_fns=group_reward_fns,
        reward_name=reward_name,
        models=models,
        agents=agents,
        splits=splits,
        split_by=split_by,
        require_reward=require_reward,
        strict=on_invalid == "raise",
        summary=summary,
    )
    return _yield(pipeline, on_invalid)


def _yield(pipeline: Pipeline, on_invalid: str) -> Iterator[dict[str, Any]]:
    for ep, problems in pipeline:
        if on_invalid == "keep" or not any(p.is_error for p in problems):
            yield ep
    s = pipeline.summary
    if on_invalid == "skip" and s.rejected:
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
    *,
    rejects: str | os.PathLike[str] | None | bool = True,
    strict: bool = False,
    reward_fns: Any = None,
    group_reward_fns: Mapping[str, Callable[..., Any]] | None = None,
    reward_name: str = "reward",
    models: Iterable[str] = (),
    agents: Iterable[str] = (),
    splits: Iterable[str] = (),
    split_by: Iterable[str] = (),
    require_reward: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    workers: int = 1,
) -> ExportSummary:
    """Store → episodes → one zstd Parquet file, streaming; invalid episodes go to a rejects file.

    Takes the same episode options as :func:`build_episodes`.

    Args:
        store: A store directory or object-store URI (``s3://bucket/prefix``), or a ``StoreReader`` /
            iterable of ``StoredSession``.
        out: Output ``.parquet`` path, replaced atomically when the export completes.
        rejects: Rejects file (JSON lines with reasons, problems and the episode); ``True`` (default)
            for ``<out stem>.rejects.jsonl``; ``None``/``False`` to only count rejects.
        strict: Raise ``EpisodeError`` at the first problem (invalid episode or store problem); the
            output file is then not written.
        reward_fns: See :func:`build_episodes`.
        group_reward_fns: See :func:`build_episodes`.
        reward_name: See :func:`build_episodes`.
        models: See :func:`build_episodes`.
        agents: See :func:`build_episodes`.
        splits: See :func:`build_episodes`.
        split_by: See :func:`build_episodes`.
        require_reward: See :func:`build_episodes`.
        batch_size: Episodes per in-memory batch (memory is bounded by a batch, not the store).
        progress: Show a tqdm progress bar on stderr.
        workers: Processes to export with (default 1: this one). ``N > 1`` splits a store written by
            several processes across this process and ``N - 1`` worker processes (~200 MB each; they
            share one reward index on disk): this one writes its share straight into the output, then
            appends the workers' parts. ``0`` picks ``min(CPUs, 8)`` when the store has 16 MB per
            process. Parallel export needs a store path, picklable reward functions (module-level, or
            ``module:function`` strings) and no ``group_reward_fns``; otherwise it runs in this process.
            The output is the same either way.

    Returns:
        The :class:`ExportSummary`.

    Example:
        >>> from sdk.episodes import export
        >>> s = export("traces", "episodes.parquet", reward_fns="proj.rewards:exact")  # doctest: +SKIP
        >>> s.written, dict(s.rejected), s.reward_stats()  # doctest: +SKIP
        (96, {'missing_reward': 4}, {'gsm8k-17': (8, 0.625, 0.484)})
    """
    if isinstance(store, str) and "://" in store and not store.startswith("file://"):
        from sdk.store._remote import fetch_store

        store = fetch_store(store)  # an object-store store: its segments copied locally (changed ones only)
    if isinstance(store, (str, os.PathLike)) and rejects:
        rejects_path = default_rejects_path(out) if rejects is True else Path(rejects)
        if rejects_path.resolve().parent == Path(store).resolve():
            # The reader takes every *.jsonl file in the store for a segment.
            raise ValueError(
                f"the rejects file {str(rejects_path)!r} would be inside the store and read back as a "
                "segment; write the output elsewhere or pass another rejects path"
            )
    fns = resolve_reward_fns(reward_fns)
    options: dict[str, Any] = {
        "reward_fns": fns,
        "reward_name": reward_name,
        "models": tuple(models),
        "agents": tuple(agents),
        "splits": tuple(splits),
        "split_by": tuple(split_by),
        "require_reward": require_reward,
        "strict": strict,
    }
    shares = plan_workers(
        store, workers, group_rewards=bool(group_reward_fns), unpicklable=not picklable(fns)
    )
    if shares is not None:
        return export_parallel(
            store, out, shares, rejects=rejects, progress=progress, options=options, batch_size=batch_size
        )
    summary = ExportSummary()
    pipeline = Pipeline(store, group_reward_fns=group_reward_fns, summary=summary, **options)
    total = pipeline.reader.total_bytes() if progress and pipeline.reader is not None else None
    update, close = progress_bar(progress, total)
    pipeline.progress = update
    try:
        with gc_paced():
            return write_pairs(pipeline, out, summary=summary, rejects=rejects, batch_size=batch_size)
    finally:
        close()
