"""Run an agent over a task set: G samples per task, each in its own session, resumable.

``python -m sdk.rollout AGENT TASKS`` (or :func:`run_rollout` in Python) calls the agent function
``module:function`` once per (task, sample) inside ``sdk.session(task_id=..., sample=k, split=...)``, so
whatever the agent's integration captures lands in the store grouped for GRPO. The agent takes the task
dict and returns an answer (scored by ``--reward-fn module:function(task, answer)``) or calls
``sdk.reward`` itself. Sync and ``async def`` agents both work; sync ones run in a thread each.

Every finished sample appends one line to the results file (JSON lines); re-running the same command skips
the (task, sample) pairs already there, so an interrupted run (Ctrl-C, a crash, a kill) continues where
it stopped. Sessions of a (task, sample) cut short by that interruption are marked superseded in the store
when the pair runs again (see :func:`sdk.store._events.supersede`): the export trains each pair once.
Agent exceptions and timeouts end the sample's session with an error (recorded in the store)
and are counted; they never stop the run. ``--split eval`` is the same runner used for evaluation.

On a Ray cluster (``--ray ADDRESS``, e.g. ``--ray auto`` on a cluster node or ``--ray ray://head:10001``)
every (task, sample) is a Ray task, at most ``--concurrency`` at once; each worker process writes its own
store segments (to a shared directory, or an ``s3://`` store whose segments every worker ships) and flushes
them before its sample counts as done. The results file stays with this process, so re-running skips what is
done, as locally. The agent's code must be importable on the workers (installed there, or shipped with
``--ray-working-dir .``); ``TRACERL_*`` environment variables are passed on to them.

The summary adds the :mod:`sdk.eval` figures (pass@1 ± standard error, pass@k, pass^k, maj@k, rates,
calls/tokens/latency per sample), also written to ``<results>.metrics.json``. ``--shard I/N`` runs the
I-th of N disjoint slices of the tasks (by a hash of the task id), so N machines cover the task set;
``python -m sdk.eval summarize`` merges their results files into the numbers of one run.

Usage::

    python -m sdk.rollout my_agent:solve tasks.jsonl --group-size 8 --concurrency 16 --timeout 120
        --reward-fn my_agent:score --store .tracerl --split train
    python -m sdk.rollout my_agent:solve eval.jsonl --split eval --json

Task files: JSON lines, Parquet, a directory saved with ``datasets.save_to_disk``, or ``hf:NAME[:SPLIT]``
(``datasets.load_dataset``). Each task is a dict with an id (``--id-field``, default ``id``, else
``task_id``).

Results line fields: ``task_id``, ``sample``, ``split``, ``status`` (``ok``, ``error``, ``timeout``,
``reward_error``, ``no_reward``), ``reward``, ``rewards`` (named values), ``success``, ``answer``,
``error``, ``session_id``, ``seconds``, ``ts``.

Example:
    >>> from sdk.rollout import run_rollout
    >>> tasks = [{"id": "t1", "x": 2}]
    >>> summary = run_rollout(lambda t: t["x"] * 2, tasks, group_size=2,  # doctest: +SKIP
    ...                       reward_fn=lambda t, a: float(a == 4), results="r.jsonl")
    >>> summary.success_rate  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import inspect
import json
import math
import os
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk import _env
from sdk._internal import load_function as _load_function
from sdk.eval import EvalError, EvalSummary, metrics_path, parse_shard, shard_of
from sdk.eval import summarize as _eval_summary

__all__ = [
    "RolloutError",
    "RolloutSummary",
    "SampleTimeout",
    "load_function",
    "load_tasks",
    "read_results",
    "run_rollout",
    "summarize",
]

_STATUSES = ("ok", "error", "timeout", "reward_error", "no_reward")


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


# -------------------------------------------------------------------------------------------- results


def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The result lines of a results file (a torn last line from a kill is skipped).

    Example:
        >>> read_results("missing.jsonl")
        []
    """
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.is_file():
        return out
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # only the line being written when the process died can be torn
            if isinstance(row, dict) and "task_id" in row and "sample" in row:
                out.append(row)
    return out


@dataclasses.dataclass
class RolloutSummary:
    """What a rollout produced, over every line of its results file (earlier runs included).

    Attributes:
        split: The split the samples were recorded under.
        results_path: The results file.
        total: (task, sample) pairs of the task set.
        done: Pairs with a result line.
        ran: Pairs run by this call (the rest were done before).
        counts: Samples by status (``ok``, ``error``, ``timeout``, ``reward_error``, ``no_reward``).
        mean_reward: Mean reward of samples that have one.
        success_rate: Share of done samples with ``reward >= success_threshold``.
        task_rewards: Mean reward per task.
        tasks_always / tasks_sometimes / tasks_never: Tasks whose every / some / no sample succeeded.
        mean_task_std: Mean over tasks of the standard deviation of their samples' rewards (GRPO signal).
        seconds: Wall time of this call.
        interrupted: The run stopped early (Ctrl-C); re-run the same command to continue.
        metrics: pass@k, pass^k, maj@k with standard errors, rates and per-sample costs
            (:class:`sdk.eval.EvalSummary`; also written to ``<results>.metrics.json``).

    Example:
        >>> RolloutSummary(split="eval", results_path="r.jsonl").success_rate
        0.0
    """

    split: str
    results_path: str
    total: int = 0
    done: int = 0
    ran: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(_STATUSES, 0))
    mean_reward: float | None = None
    success_rate: float = 0.0
    task_rewards: dict[str, float] = dataclasses.field(default_factory=dict)
    tasks_always: int = 0
    tasks_sometimes: int = 0
    tasks_never: int = 0
    mean_task_std: float | None = None
    seconds: float = 0.0
    interrupted: bool = False
    metrics: EvalSummary | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (``--json``); per-task rewards included.

        Example:
            >>> RolloutSummary(split="eval", results_path="r.jsonl").as_dict()["done"]
            0
        """
        out = dataclasses.asdict(self)
        out["metrics"] = None if self.metrics is None else self.metrics.as_dict()
        return out

    def format_table(self) -> str:
        """A plain-text summary table.

        Example:
            >>> print(RolloutSummary(split="eval", results_path="r.jsonl").format_table())  # doctest: +SKIP
        """

        def pct(x: float) -> str:
            return f"{100 * x:.1f}%"

        mr = "-" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        sd = "-" if self.mean_task_std is None else f"{self.mean_task_std:.3f}"
        c = self.counts
        rows = [
            ("split", self.split),
            ("samples done", f"{self.done}/{self.total} ({self.ran} run now, {self.seconds:.1f} s)"),
            ("mean reward", mr),
            ("success rate", pct(self.success_rate)),
            (
                "tasks: all / some / no samples succeed",
                f"{self.tasks_always} / {self.tasks_sometimes} / {self.tasks_never}",
            ),
            ("per-task reward std (mean)", sd),
            ("errors", str(c.get("error", 0))),
            ("timeouts", str(c.get("timeout", 0))),
            ("reward function failures", str(c.get("reward_error", 0))),
            ("samples without a reward", str(c.get("no_reward", 0))),
            *(self.metrics.metric_lines() if self.metrics is not None else []),
            ("results", self.results_path),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        if self.interrupted:
            lines.append("interrupted: re-run the same command to continue")
        return "\n".join(lines)


def summarize(
    rows: list[dict[str, Any]], *, split: str, results_path: str, total: int, success_threshold: float = 1.0
) -> RolloutSummary:
    """Build a :class:`RolloutSummary` from result lines (the last line of a pair wins).

    Example:
        >>> summarize([], split="eval", results_path="r.jsonl", total=4).done
        0
    """
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        last[(str(r["task_id"]), int(r["sample"]))] = r
    s = RolloutSummary(split=split, results_path=results_path, total=total, done=len(last))
    per_task: dict[str, list[float]] = defaultdict(list)
    successes: dict[str, list[bool]] = defaultdict(list)
    rewards: list[float] = []
    for (tid, _), r in last.items():
        status = r.get("status", "ok")
        s.counts[status] = s.counts.get(status, 0) + 1
        ok = bool(r.get("success"))
        successes[tid].append(ok)
        if isinstance(r.get("reward"), (int, float)):
            rewards.append(float(r["reward"]))
            per_task[tid].append(float(r["reward"]))
    if rewards:
        s.mean_reward = statistics.fmean(rewards)
    if last:
        s.success_rate = sum(ok for v in successes.values() for ok in v) / len(last)
    s.task_rewards = {t: statistics.fmean(v) for t, v in per_task.items()}
    stds = [statistics.pstdev(v) for v in per_task.values() if len(v) > 1]
    s.mean_task_std = statistics.fmean(stds) if stds else None
    for v in successes.values():
        if all(v):
            s.tasks_always += 1
        elif any(v):
            s.tasks_sometimes += 1
        else:
            s.tasks_never += 1
    return s


# --------------------------------------------------------------------------------------------- runner


def _run_key(results: Path) -> str:
    """Identifies one results file's samples in the store (session metadata ``rollout``)."""
    return hashlib.sha1(str(results.resolve()).encode()).hexdigest()[:12]


def _json_safe(value: Any, limit: int = 2000) -> Any:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)[:limit]
    return value if len(text) <= limit else text[:limit]


def _recover_from_store(
    store: str | Path,
    key: str,
    split: str,
    done: set[tuple[str, int]],
    tasks: dict[str, dict[str, Any]],
    attempts: list[tuple[tuple[str, int], str]] | None = None,
) -> list[dict[str, Any]]:
    """Result lines for samples whose session ended in the store but whose line was not written.

    Only a kill between a session's end and its result line leaves such a sample; writing its line from
    the store (instead of running it again) keeps every (task, sample) once in the store's finished
    sessions. Sessions cut short (no end, or interrupted) are run again. ``attempts`` receives
    ``((task, sample), session_id)`` of every session of this run's tasks not yet marked superseded.
    """
    from sdk.store import StoreReader

    if isinstance(store, Path) and not store.is_dir():
        return []
    try:
        reader = StoreReader(store)
    except FileNotFoundError:  # an object-store store nothing was shipped to yet
        return []
    out: list[dict[str, Any]] = []
    for s in reader.sessions():
        md = s.metadata or {}
        if md.get("rollout") != key or md.get("split") != split or s.sample is None:
            continue
        pair = (str(s.task_id), int(s.sample))
        if attempts is not None and pair[0] in tasks and not s.superseded:
            attempts.append((pair, s.session_id))
        if pair in done or pair[0] not in tasks or s.status not in ("ok", "error") or s.superseded:
            continue
        err = s.error or {}
        if s.status == "error" and err.get("type") in ("CancelledError", "KeyboardInterrupt"):
            continue
        named = {r["name"]: r["value"] for r in s.rewards if r.get("call_id") is None}
        reward = named.get("reward")
        status = s.status
        if status == "error" and err.get("type") == SampleTimeout.__name__:  # as the live run counts it
            status = "timeout"
        elif status == "ok" and reward is None:
            status = "no_reward"
        out.append(
            {
                "task_id": pair[0],
                "sample": pair[1],
                "split": split,
                "status": status,
                "reward": reward,
                "rewards": named,
                "success": None,  # filled in by the caller (threshold)
                "answer": None,
                "error": None if not err else f"{err.get('type')}: {err.get('message')}",
                "session_id": s.session_id,
                "seconds": None if s.ended_at is None or s.started_at is None else s.ended_at - s.started_at,
                "ts": s.ended_at,
                "recovered": True,
            }
        )
        done.add(pair)
    return out


class _Progress:
    """tqdm bar (done / total, success so far, ETA) on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar: Any = None
        self.ok = 0
        self.n = 0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, initial=initial, desc="rollout", unit="sample", file=sys.stderr)

    def update(self, success: bool) -> None:
        self.n += 1
        self.ok += success
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"success {100 * self.ok / self.n:.0f}%", refresh=False)

    def say(self, message: str) -> None:
        """One line on stderr that does not break the bar."""
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_rollout(
    agent: str | Callable[..., Any],
    tasks: str | os.PathLike[str] | Iterable[dict[str, Any]],
    *,
    group_size: int = 1,
    concurrency: int = 8,
    timeout: float | None = None,
    reward_fn: str | Callable[..., Any] | None = None,
    split: str = "train",
    results: str | os.PathLike[str] = "rollout-results.jsonl",
    store: str | os.PathLike[str] | None = None,
    id_field: str = "id",
    success_threshold: float = 1.0,
    progress: bool = False,
    metadata: dict[str, Any] | None = None,
    ray: str | None = None,
    ray_runtime_env: dict[str, Any] | None = None,
    shard: str | tuple[int, int] | None = None,
    samples: int | None = None,
) -> RolloutSummary:
    """Run ``agent`` ``group_size`` times on every task, each run in its own session; resumable.

    Args:
        agent: ``"module:function"`` or a callable (sync or async) taking the task dict and returning an
            answer; it may call ``sdk.reward`` itself.
        tasks: Tasks (see :func:`load_tasks`).
        group_size: Samples per task (the GRPO group size G).
        concurrency: Samples running at once.
        timeout: Seconds per sample; a sample past it ends its session with ``TimeoutError``. A sync
            agent's thread cannot be stopped: it runs on in the background until it returns.
        reward_fn: ``"module:function"`` or callable ``(task, answer) -> float | dict``; a dict gives
            named rewards, its ``"reward"`` entry is the episode reward. Async functions work too.
        split: Recorded as session metadata ``split`` (``export(splits=[...])`` selects by it).
        results: The results file (JSON lines); pairs already in it are skipped.
        store: Store directory (``sdk.configure(store=...)``); default: the current configuration.
        id_field: Task id field.
        success_threshold: A sample succeeds when its reward is at least this.
        progress: Show a progress bar on stderr.
        metadata: Extra session metadata.
        ray: Run the samples as tasks on the Ray cluster at this address (``ray.init(address=...)``);
            ``concurrency`` bounds the tasks in flight. The store must be reachable from the workers (a
            shared directory or an object-store URI).
        ray_runtime_env: Ray runtime environment for the workers (e.g. ``{"working_dir": "."}``); the
            ``TRACERL_*`` environment variables of this process are added to its ``env_vars``.
        shard: ``"I/N"`` or ``(I, N)``: run only the I-th of N disjoint slices of the tasks (by a hash of
            the task id, the same on every machine); ``python -m sdk.eval summarize`` merges the shards'
            results files.
        samples: Deprecated spelling of ``group_size`` (a ``DeprecationWarning``; removed in a later release).

    Returns:
        A :class:`RolloutSummary` over the whole results file.

    Raises:
        RolloutError: Bad agent, reward function, tasks or settings.
        KeyboardInterrupt: On Ctrl-C, after in-flight samples were cancelled (their sessions end as
            interrupted) and every finished one is in the results file.

    Example:
        >>> run_rollout("my_agent:solve", "tasks.jsonl", group_size=4, results="out.jsonl")  # doctest: +SKIP
    """
    import sdk

    if samples is not None:
        warnings.warn("run_rollout(samples=) is deprecated: use group_size", DeprecationWarning, stacklevel=2)
        group_size = samples
    if group_size < 1 or concurrency < 1:
        raise RolloutError("group_size and concurrency must be at least 1")
    if timeout is not None and timeout <= 0:
        raise RolloutError(f"timeout must be positive, got {timeout}")
    fn = load_function(agent, "agent")
    score = load_function(reward_fn, "reward function") if reward_fn is not None else None
    task_list = load_tasks(tasks, id_field)
    if not task_list:
        named = isinstance(tasks, (str, os.PathLike))
        raise RolloutError(f"no tasks in {os.fspath(tasks)}" if named else "no tasks given")
    if shard is not None:
        task_list = _shard_tasks(task_list, shard)
    results_path = Path(results)
    if store is not None and _current_store().resolve() != Path(store).resolve():
        sdk.configure(store=store)
    store_path = _current_store()
    if results_path.resolve().parent == store_path.resolve():
        raise RolloutError(f"the results file {results_path} must not be inside the store {store_path}")
    results_path.parent.mkdir(parents=True, exist_ok=True)
    key = _run_key(results_path)
    location = _store_location()
    rows = _resume(results_path, location, key, split, task_list, success_threshold)
    done = {(str(r["task_id"]), int(r["sample"])) for r in rows}
    jobs = [(t, k) for t in task_list for k in range(group_size) if (t["id"], k) not in done]
    total = len(task_list) * group_size
    started = time.monotonic()
    bar = _Progress(progress, total, total - len(jobs))
    extra = {**(metadata or {}), "split": split, "rollout": key}
    interrupted = False
    new_rows: list[dict[str, Any]] = []
    try:
        if ray is not None:
            _run_on_ray(
                ray,
                ray_runtime_env,
                (agent, reward_fn, timeout, extra, success_threshold, location),
                jobs,
                concurrency,
                results_path,
                new_rows,
                bar,
            )
        else:
            asyncio.run(
                _run_all(
                    fn,
                    score,
                    jobs,
                    concurrency,
                    timeout,
                    extra,
                    success_threshold,
                    results_path,
                    new_rows,
                    bar,
                )
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        sdk.flush()
    summary = summarize(
        rows + new_rows,
        split=split,
        results_path=str(results_path),
        total=total,
        success_threshold=success_threshold,
    )
    summary.ran = len(new_rows)
    summary.seconds = time.monotonic() - started
    summary.interrupted = interrupted
    summary.metrics = _write_metrics(rows + new_rows, location, results_path)
    if interrupted:
        raise KeyboardInterrupt(summary)
    return summary


def _resume(
    results_path: Path,
    location: str | Path,
    key: str,
    split: str,
    task_list: list[dict[str, Any]],
    success_threshold: float,
) -> list[dict[str, Any]]:
    """The rows of an earlier run of this results file, plus the samples its store holds but it lacks."""
    rows = read_results(results_path)
    if not results_path.exists():
        results_path.touch()  # a run killed before its first line is resumed too (its attempts superseded)
        return rows
    done = {(str(r["task_id"]), int(r["sample"])) for r in rows}
    attempts: list[tuple[tuple[str, int], str]] = []
    # A run killed between a session's end and its results line: the store has the sample, so take it
    # from there rather than run it again.
    for r in _recover_from_store(location, key, split, done, {t["id"]: t for t in task_list}, attempts):
        r["success"] = r["reward"] is not None and r["reward"] >= success_threshold
        rows.append(r)
        _append(results_path, r)
    _supersede(attempts, rows, key)
    return rows


def _shard_tasks(tasks: list[dict[str, Any]], shard: str | tuple[int, int]) -> list[dict[str, Any]]:
    try:
        i, n = parse_shard(shard if isinstance(shard, str) else "/".join(map(str, shard)))
    except EvalError as exc:
        raise RolloutError(str(exc)) from None
    return [t for t in tasks if shard_of(t["id"], n) == i]


def _write_metrics(rows: list[dict[str, Any]], store: str | Path, results: Path) -> EvalSummary | None:
    """The :mod:`sdk.eval` figures of the run, also written beside the results; never fails the run."""
    try:
        metrics = _eval_summary(rows, store=store) if rows else None
        if metrics is not None:
            metrics.write(metrics_path(results))
    except Exception as exc:  # e.g. an unreadable store: the samples are safe, only the figures lack
        print(f"warning: no evaluation figures: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return metrics


def _supersede(attempts: list[tuple[tuple[str, int], str]], rows: list[dict[str, Any]], key: str) -> None:
    """Mark in the store every attempt that is not its (task, sample)'s result: each pair is trained once.

    Such attempts were cut short (killed, interrupted) and their pair is run again now, or was run again
    by an earlier resume that did not mark them. An agent may have given its reward before the cut, so
    without the mark the export would train the cut attempt beside the finished one.
    """
    from sdk._tracer import tracer
    from sdk.store import _events as events

    result = {(str(r["task_id"]), int(r["sample"])): r.get("session_id") for r in rows}
    stale = [sid for pair, sid in attempts if pair not in result or result[pair] not in (None, sid)]
    now = time.time()
    for sid in stale:
        tracer.append(events.supersede(sid, reason="rerun", ts=now, run=key))
    if stale:
        tracer.flush()


def _current_store() -> Path:
    from sdk._tracer import tracer

    return Path(tracer.config.store)


def _store_location() -> str | Path:
    """The store as other processes name it: its object-store URI, or its absolute directory."""
    from sdk._tracer import tracer

    return tracer.config.store_uri or Path(tracer.config.store).resolve()


def _run_on_ray(
    address: str,
    runtime_env: dict[str, Any] | None,
    spec: tuple[Any, ...],
    jobs: list[tuple[dict[str, Any], int]],
    concurrency: int,
    results: Path,
    out: list[dict[str, Any]],
    bar: _Progress,
) -> None:
    """Run ``jobs`` as Ray tasks, at most ``concurrency`` in flight; append each row as its task ends."""
    try:
        import ray
    except ImportError as exc:
        raise RolloutError("--ray needs Ray: pip install 'tracerl[ray]'") from exc
    env = dict(runtime_env or {})
    env_vars = {k: v for k, v in os.environ.items() if k.startswith(_env.PREFIX) and k != _env.TRACERL_STORE}
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
            while todo and len(pending) < concurrency:
                task, k = todo.pop(0)
                pending[remote.remote(spec, task, k)] = (task["id"], k)
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
                _append(results, row)
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


def _ray_sample(spec: tuple[Any, ...], task: dict[str, Any], k: int) -> dict[str, Any]:
    """One (task, sample) in a Ray worker: the same sample as locally, in this worker's store segments."""
    import sdk
    from sdk._tracer import tracer

    agent, reward_fn, timeout, metadata, threshold, store = spec
    current = tracer.config.store_uri or Path(tracer.config.store).resolve()
    if str(current) != str(store):
        sdk.configure(store=str(store))
    fn = load_function(agent, "agent")
    score = load_function(reward_fn, "reward function") if reward_fn is not None else None
    quiet = _Progress(False, 0, 0)  # warnings go to the worker log
    row = asyncio.run(_one_sample(fn, score, task, k, timeout, metadata, threshold, set(), quiet))
    sdk.flush()  # in the store (and shipped to an object store) before the sample counts as done
    return row


def _append(path: Path, row: dict[str, Any]) -> None:
    # One write of one line to an O_APPEND file: a kill leaves at most a torn last line (skipped on read).
    data = (json.dumps(row, default=repr) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def _run_all(
    fn: Callable[..., Any],
    score: Callable[..., Any] | None,
    jobs: list[tuple[dict[str, Any], int]],
    concurrency: int,
    timeout: float | None,
    metadata: dict[str, Any],
    threshold: float,
    results: Path,
    out: list[dict[str, Any]],
    bar: _Progress,
) -> None:
    sem = asyncio.Semaphore(concurrency)
    warned: set[str] = set()

    async def one(task: dict[str, Any], k: int) -> None:
        async with sem:
            row = await _one_sample(fn, score, task, k, timeout, metadata, threshold, warned, bar)
            # No await between the session's end and this line: a cancelled sample has no line.
            _append(results, row)
            out.append(row)
            bar.update(bool(row["success"]))

    await asyncio.gather(*(one(t, k) for t, k in jobs))


async def _one_sample(
    fn: Callable[..., Any],
    score: Callable[..., Any] | None,
    task: dict[str, Any],
    k: int,
    timeout: float | None,
    metadata: dict[str, Any],
    threshold: float,
    warned: set[str],
    bar: _Progress,
) -> dict[str, Any]:
    import sdk

    t0 = time.monotonic()
    row: dict[str, Any] = {
        "task_id": task["id"],
        "sample": k,
        "split": metadata["split"],
        "status": "ok",
        "reward": None,
        "rewards": {},
        "success": False,
        "answer": None,
        "error": None,
        "session_id": None,
    }
    try:
        async with sdk.session(task_id=task["id"], sample=k, **metadata) as s:
            row["session_id"] = s.session_id
            try:
                answer = await asyncio.wait_for(_call(fn, task), timeout)
            except asyncio.TimeoutError:
                raise SampleTimeout(f"sample took longer than {timeout} s") from None
            row["answer"] = _json_safe(answer)
            if score is not None:
                try:
                    got = score(task, answer)
                    if inspect.isawaitable(got):
                        got = await got
                    named = _named_rewards(got)
                    for name, value in named.items():
                        s.reward(value, name)
                except Exception as exc:
                    row["status"] = "reward_error"
                    row["error"] = f"reward function failed: {type(exc).__name__}: {exc}"
                    if "reward" not in warned:
                        warned.add("reward")
                        bar.say(
                            f"error: the reward function failed on task {task['id']!r} sample {k}: "
                            f"{type(exc).__name__}: {exc} (counted as reward_error; further failures only "
                            "counted)"
                        )
            named = {n: v for n, v, call_id in s.rewards if call_id is None}
            row["rewards"] = named
            row["reward"] = named.get("reward")
            if row["reward"] is None and row["status"] == "ok":
                row["status"] = "no_reward"
    except SampleTimeout as exc:
        row["status"], row["error"] = "timeout", str(exc)
    except Exception as exc:
        row["status"] = "error"
        row["error"] = f"{type(exc).__name__}: {exc}"
        if "agent" not in warned:
            warned.add("agent")
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            bar.say(
                f"warning: the agent raised on task {task['id']!r} sample {k}: {tb} (counted as error; "
                "further errors only counted)"
            )
    row["success"] = row["reward"] is not None and row["reward"] >= threshold
    row["seconds"] = round(time.monotonic() - t0, 3)
    row["ts"] = time.time()
    return row


async def _call(fn: Callable[..., Any], task: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(task)
    got = await _in_thread(fn, task)
    if inspect.isawaitable(got):
        got = await got
    return got


def _in_thread(fn: Callable[..., Any], task: dict[str, Any]) -> asyncio.Future[Any]:
    """Run a sync agent in a daemon thread, in a copy of this context (so the session is current there).

    Not an executor: a sync agent past its timeout cannot be stopped, and an executor's threads are
    joined at exit, so one hung agent would hang the run's end.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if fut.done():
            return  # timed out or cancelled meanwhile
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def run() -> None:
        value, error = None, None
        try:
            value = ctx.run(fn, task)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed (interrupted run)
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="tracerl-rollout-sample", daemon=True).start()
    return fut


def _named_rewards(value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        if "reward" not in value:
            raise ValueError(f"a reward dict needs a 'reward' entry, got keys {sorted(value)}")
        return {str(k): float(v) for k, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a float or a dict of floats, got {type(value).__name__} {value!r}")
    return {"reward": float(value)}


# ------------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sdk.rollout`` argument parser.

    Example:
        >>> build_parser().parse_args(["m:f", "t.jsonl"]).group_size
        1
    """
    p = argparse.ArgumentParser(
        prog="python -m sdk.rollout",
        description="Run an agent over a task set (G samples per task, each in a session); resumable.",
    )
    p.add_argument("agent", help="agent entry point module:function (takes the task dict)")
    p.add_argument("tasks", help="tasks: .jsonl, .parquet, a saved datasets directory or hf:NAME[:SPLIT]")
    p.add_argument(
        "--group-size", "-G", type=int, default=1, help="samples per task, the GRPO group size G (default 1)"
    )
    # Deprecated spelling of --group-size: still works, with a one-line notice.
    p.add_argument("--samples", dest="samples_deprecated", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", "-c", type=int, default=8, help="samples at once (default 8)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per sample (default: none)")
    p.add_argument("--reward-fn", default=None, help="module:function(task, answer) -> float | dict")
    p.add_argument(
        "--split", default="train", help="session metadata split (default train; eval: no training)"
    )
    p.add_argument("--store", default=None, help="store directory (default $TRACERL_STORE or ./.tracerl)")
    p.add_argument(
        "--results",
        default=None,
        help="results file (default <store>-rollout-<split>.jsonl next to the store)",
    )
    p.add_argument("--id-field", default="id", help="task id field (default id, else task_id)")
    p.add_argument("--success-threshold", type=float, default=1.0, help="reward counted as success")
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the samples as Ray tasks on this cluster (auto, ray://head:10001, host:6379)",
    )
    p.add_argument(
        "--ray-working-dir",
        default=None,
        metavar="DIR",
        help="directory shipped to the Ray workers (runtime_env working_dir), e.g. . for the agent's code",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run the I-th of N disjoint slices of the tasks (by task id); sdk.eval summarize merges them",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0, 2 on bad input (one ``error:`` line), 130 when interrupted.

    Example:
        >>> main(["my_agent:solve", "tasks.jsonl", "--group-size", "4"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    import sdk

    if args.samples_deprecated is not None:
        print("tracerl: --samples is deprecated; use --group-size", file=sys.stderr)
        args.group_size = args.samples_deprecated
    try:
        if args.store is not None:
            sdk.configure(store=args.store)
        store = _current_store()
        shard = "" if args.shard is None else "-shard-" + "-of-".join(map(str, parse_shard(args.shard)))
        results = args.results or str(
            store.parent / f"{store.name.lstrip('.') or 'store'}-rollout-{args.split}{shard}.jsonl"
        )
        summary = run_rollout(
            args.agent,
            args.tasks,
            group_size=args.group_size,
            concurrency=args.concurrency,
            timeout=args.timeout,
            reward_fn=args.reward_fn,
            split=args.split,
            results=results,
            id_field=args.id_field,
            success_threshold=args.success_threshold,
            progress=not args.no_progress and not args.json,
            ray=args.ray,
            ray_runtime_env={"working_dir": args.ray_working_dir} if args.ray_working_dir else None,
            shard=args.shard,
        )
    except (RolloutError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        got = exc.args[0] if exc.args and isinstance(exc.args[0], RolloutSummary) else None
        if got is not None:
            print(got.format_table(), file=sys.stderr)
        else:
            print("interrupted: re-run the same command to continue", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        print(summary.format_table())
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
