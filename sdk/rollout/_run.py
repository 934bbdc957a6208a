"""The batch runner: every task ``spec.group_size`` times, ``spec.concurrency`` at once, locally or on Ray.

Example:
    >>> from sdk.rollout import RolloutSpec, run_rollout
    >>> run_rollout(RolloutSpec("my_agent:solve"), "tasks.jsonl", results="out.jsonl")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Any

from sdk import _env
from sdk.eval import parse_shard
from sdk.rollout._resume import _current_store, _resume, _run_key, _store_location
from sdk.rollout._sample import TASK_SET as _TASK_SET
from sdk.rollout._sample import _one_sample, _Progress, _settle_loop
from sdk.rollout._spec import RolloutSpec
from sdk.rollout._summary import RolloutSummary, _append, _write_metrics, summarize
from sdk.rollout._tasks import RolloutError, _shard_tasks, check_call, load_function, load_tasks

__all__ = ["run_rollout"]


def run_rollout(
    spec: RolloutSpec,
    tasks: str | os.PathLike[str] | Iterable[dict[str, Any]],
    *,
    split: str = "train",
    results: str | os.PathLike[str] = "rollout-results.jsonl",
    store: str | os.PathLike[str] | None = None,
    progress: bool | str = False,
    metadata: dict[str, Any] | None = None,
    ray: str | None = None,
    ray_runtime_env: dict[str, Any] | None = None,
    shard: str | tuple[int, int] | None = None,
) -> RolloutSummary:
    """Run ``spec.agent`` ``spec.group_size`` times on every task, each run in its own session; resumable.

    Args:
        spec: What runs: the agent, its reward function, the group size, concurrency and timeout.
        tasks: Tasks (see :func:`load_tasks`).
        split: Recorded as session metadata ``split`` (``export(splits=[...])`` selects by it).
        results: The results file (JSON lines); pairs already in it are skipped.
        store: Store directory (``sdk.configure(store=...)``); default: the current configuration.
        progress: Show a progress bar on stderr when it is a terminal (never in a log); a string labels
            the bar and clears it when the run ends.
        metadata: Extra session metadata.
        ray: Run the samples as tasks on the Ray cluster at this address (``ray.init(address=...)``);
            ``spec.concurrency`` bounds the tasks in flight. The store must be reachable from the workers (a
            shared directory or an object-store URI).
        ray_runtime_env: Ray runtime environment for the workers (e.g. ``{"working_dir": "."}``); the
            ``TRACERL_*`` environment variables of this process are added to its ``env_vars``.
        shard: ``"I/N"`` or ``(I, N)``: run only the I-th of N disjoint slices of the tasks (by a hash of
            the task id, the same on every machine); ``python -m sdk.eval summarize`` merges the shards'
            results files.

    Returns:
        A :class:`RolloutSummary` over the whole results file.

    Raises:
        RolloutError: Bad agent, reward function, tasks or settings.
        KeyboardInterrupt: On Ctrl-C, after in-flight samples were cancelled (their sessions end as
            interrupted) and every finished one is in the results file.

    Example:
        >>> spec = RolloutSpec("my_agent:solve", group_size=4)
        >>> run_rollout(spec, "tasks.jsonl", results="out.jsonl")  # doctest: +SKIP
    """
    plan = _prepare(spec, tasks, split=split, results=results, store=store, metadata=metadata, shard=shard)
    G = spec.group_size
    done = {(str(r["task_id"]), int(r["sample"])) for r in plan.rows}
    jobs = [(t, k) for t in plan.tasks for k in range(G) if (t["id"], k) not in done]
    total = len(plan.tasks) * G
    bar = _Progress(progress, total, total - len(jobs))
    new_rows: list[dict[str, Any]] = []
    interrupted = _execute(plan, jobs, bar, new_rows, ray, ray_runtime_env)
    summary = _finish(plan, new_rows, total, interrupted)
    if interrupted:
        raise KeyboardInterrupt(summary)
    return summary


@dataclasses.dataclass
class _Plan:
    """A run's checked inputs: the functions, the tasks, the results file and what it already holds."""

    spec: RolloutSpec
    fn: Callable[..., Any]
    score: Callable[..., Any] | None
    tasks: list[dict[str, Any]]
    results: Path
    location: str | Path  # the store as other processes name it
    rows: list[dict[str, Any]]  # the results file's lines so far (samples recovered from the store included)
    metadata: dict[str, Any]  # every sample's session metadata, ``split`` and ``rollout`` (the run's key)
    started: float = dataclasses.field(default_factory=time.monotonic)


def _prepare(
    spec: RolloutSpec,
    tasks: str | os.PathLike[str] | Iterable[dict[str, Any]],
    *,
    split: str,
    results: str | os.PathLike[str],
    store: str | os.PathLike[str] | None,
    metadata: dict[str, Any] | None,
    shard: str | tuple[int, int] | None = None,
    task_ids: Container[str] | None = None,
) -> _Plan:
    """Load the functions, point the SDK at the store, resume the results file of the tasks (or task_ids)."""
    import sdk

    fn = load_function(spec.agent, "agent")
    score = load_function(spec.reward_fn, "reward function") if spec.reward_fn is not None else None
    check_call(fn, 1, "agent", f"{_name(spec.agent)}(task)")
    if score is not None:
        check_call(score, 2, "reward function", f"{_name(spec.reward_fn)}(task, answer)")
    task_list = load_tasks(tasks, spec.id_field)
    if not task_list and task_ids is None:
        named = isinstance(tasks, (str, os.PathLike))
        raise RolloutError(f"no tasks in {os.fspath(tasks)}" if named else "no tasks given")
    # Each result line says which task set (its size) and shard it belongs to: a summary of some shards
    # can then say how much of the task set it covers.
    task_set: dict[str, Any] = {"tasks": len(task_list), "shard": None}
    if shard is not None:
        task_list = _shard_tasks(task_list, shard)
        text = shard if isinstance(shard, str) else "/".join(map(str, shard))
        task_set["shard"] = "/".join(map(str, parse_shard(text)))
    results_path = Path(results)
    if store is not None and _current_store().resolve() != Path(store).resolve():
        sdk.configure(store=store)
    store_path = _current_store()
    if results_path.resolve().parent == store_path.resolve():
        raise RolloutError(f"the results file {results_path} must not be inside the store {store_path}")
    results_path.parent.mkdir(parents=True, exist_ok=True)
    key = _run_key(results_path)
    location = _store_location()
    ids = task_ids if task_ids is not None else {t["id"] for t in task_list}
    rows = _resume(results_path, location, key, split, ids, spec.success_threshold)
    # group_size: the trainer groups the episodes as they were collected (its dry run too).
    extra = {
        **(metadata or {}),
        "split": split,
        "rollout": key,
        _TASK_SET: task_set,
        "group_size": spec.group_size,
    }
    return _Plan(spec, fn, score, task_list, results_path, location, rows, extra)


def _execute(
    plan: _Plan,
    jobs: list[tuple[dict[str, Any], int]],
    bar: _Progress,
    out: list[dict[str, Any]],
    ray: str | None,
    ray_runtime_env: dict[str, Any] | None,
) -> bool:
    """Run ``jobs`` locally or on Ray, appending each row to ``out``; True when interrupted (Ctrl-C)."""
    import sdk

    try:
        if ray is not None:
            _run_on_ray(ray, ray_runtime_env, plan, jobs, out, bar)
        else:
            asyncio.run(_run_all(plan, jobs, out, bar))
    except KeyboardInterrupt:
        return True
    finally:
        bar.close()
        sdk.flush()
    return False


def _finish(plan: _Plan, new_rows: list[dict[str, Any]], total: int, interrupted: bool) -> RolloutSummary:
    """The summary over the whole results file; the evaluation figures written beside it."""
    rows = plan.rows + new_rows
    summary = summarize(
        rows,
        split=plan.metadata["split"],
        results_path=str(plan.results),
        total=total,
        success_threshold=plan.spec.success_threshold,
    )
    summary.ran = len(new_rows)
    summary.seconds = time.monotonic() - plan.started
    summary.interrupted = interrupted
    summary.metrics = _write_metrics(rows, plan.location, plan.results)
    return summary


def _run_on_ray(
    address: str,
    runtime_env: dict[str, Any] | None,
    plan: _Plan,
    jobs: list[tuple[dict[str, Any], int]],
    out: list[dict[str, Any]],
    bar: _Progress,
) -> None:
    """Run ``jobs`` as Ray tasks, at most ``spec.concurrency`` in flight; append each row as its task ends."""
    try:
        import ray
    except ImportError as exc:
        raise RolloutError("--ray needs Ray: pip install 'tracerl[ray]'") from exc
    env = dict(runtime_env or {})
    env_vars = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(_env.PREFIX) and k != _env.TRACERL_STORE and k not in _env.TRAINER_ONLY
    }
    env["env_vars"] = {**env_vars, **env.get("env_vars", {})}
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise RolloutError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from exc
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_sample)
    pending: dict[Any, tuple[str, int]] = {}
    todo = list(jobs)
    try:
        while todo or pending:
            while todo and len(pending) < plan.spec.concurrency:
                task, k = todo.pop(0)
                pending[remote.remote(plan.spec, plan.metadata, plan.location, task, k)] = (task["id"], k)
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                tid, k = pending.pop(ref)
                try:
                    row = ray.get(ref)
                except Exception as exc:  # the worker died: the sample has no result line and runs again
                    cause = [ln for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
                    print(
                        f"warning: the Ray task of task {tid!r} sample {k} failed: {cause[-1][:300]} "
                        "(re-run to retry it)",
                        file=sys.stderr,
                    )
                    continue
                _append(plan.results, row)
                out.append(row)
                bar.update(bool(row["success"]))
    except KeyboardInterrupt:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()


def _ray_sample(
    spec: RolloutSpec, metadata: dict[str, Any], store: str | Path, task: dict[str, Any], k: int
) -> dict[str, Any]:
    """One (task, sample) in a Ray worker: the same sample as locally, in this worker's store segments."""
    import sdk
    from sdk._tracer import tracer

    current = tracer.config.store_uri or Path(tracer.config.store).resolve()
    if str(current) != str(store):
        sdk.configure(store=str(store))
    fn = load_function(spec.agent, "agent")
    score = load_function(spec.reward_fn, "reward function") if spec.reward_fn is not None else None
    quiet = _Progress(False, 0, 0)  # warnings go to the worker log

    async def sample() -> dict[str, Any]:
        got = await _one_sample(fn, score, task, k, spec, metadata, set(), quiet)
        await _settle_loop()
        return got

    row = asyncio.run(sample())
    sdk.flush()  # in the store (and shipped to an object store) before the sample counts as done
    return row


async def _run_all(
    plan: _Plan, jobs: list[tuple[dict[str, Any], int]], out: list[dict[str, Any]], bar: _Progress
) -> None:
    sem = asyncio.Semaphore(plan.spec.concurrency)
    warned: set[str] = set()

    async def one(task: dict[str, Any], k: int) -> None:
        async with sem:
            row = await _one_sample(plan.fn, plan.score, task, k, plan.spec, plan.metadata, warned, bar)
            # No await between the session's end and this line: a cancelled sample has no line.
            _append(plan.results, row)
            out.append(row)
            bar.update(bool(row["success"]))

    await asyncio.gather(*(one(t, k) for t, k in jobs))
    await _settle_loop()


def _name(spec: Any) -> str:
    """``module:function`` as given, or a callable's name."""
    return spec if isinstance(spec, str) else getattr(spec, "__name__", "agent")
