"""The evaluation summary of rollout results: pass@k, pass^k, maj@k with standard errors, rates, costs.

Every figure is a mean over tasks of a per-task estimate (a task counts once, whatever its number of
samples); its standard error is the standard deviation of the per-task estimates over ``sqrt(tasks)``.
Tasks are taken in id order, so shards merged in any order give the same numbers to the last digit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sdk._numbers import is_finite_number
from sdk.eval._estimators import _maj_all, ks_upto, mean_se, pass_at_k, pass_hat_k
from sdk.eval._results import EvalError, load_results
from sdk.eval._roles import role_figures

__all__ = ["EvalSummary", "TaskMetrics", "summarize"]

_FAILED = ("error", "timeout")
_RATES = ("error", "timeout", "reward_error", "no_reward", "no_answer")


@dataclasses.dataclass
class TaskMetrics:
    """One task's samples.

    Attributes:
        task_id: The task.
        n: Samples.
        correct: Successful samples.
        pass_at_1: ``correct / n``.
        mean_reward: Mean reward of the samples that have one.
        errors: Samples whose agent raised.
        timeouts: Samples past the runner's timeout.
        majority: The most frequent answer (``None`` when no sample answered).

    Example:
        >>> TaskMetrics("t1", n=4, correct=1, pass_at_1=0.25).pass_at_1
        0.25
    """

    task_id: str
    n: int
    correct: int
    pass_at_1: float
    mean_reward: float | None = None
    errors: int = 0
    timeouts: int = 0
    majority: str | None = None


@dataclasses.dataclass
class EvalSummary:
    """Evaluation figures over rollout results (see :func:`summarize`); ``*_se``: standard errors.

    Attributes:
        split: The results' split.
        tasks: Tasks.
        samples: Samples (task, sample pairs).
        samples_per_task: Fewest and most samples of a task.
        threshold: Reward counted as success (``None``: the runner's ``success`` field as recorded).
        pass_at_1 / pass_at_1_se: Mean success rate over tasks (avg@n).
        pass_at_k / pass_at_k_se: Unbiased pass@k by k.
        pass_hat_k / pass_hat_k_se: pass^k (all k succeed) by k.
        maj_at_k / maj_at_k_se: maj@k by k (empty when no sample recorded an answer).
        mean_reward / mean_reward_se: Mean over tasks of the task's mean reward.
        counts: Samples by runner status, plus ``no_answer`` (finished without an answer).
        rates: ``counts`` over ``samples`` for error, timeout, reward_error, no_reward, no_answer.
        per_sample: ``{"n", "mean", "p50", "p95"}`` of ``seconds`` (a sample's wall time) and, read
            from the store, ``calls``, ``prompt_tokens``, ``completion_tokens`` per sample and
            ``call_seconds`` (one LLM call's latency); ``n``: how many values (for the store's figures,
            the samples whose session was found).
        per_task: One :class:`TaskMetrics` per task, in id order.
        per_role: With ``by_role``: per agent name, ``{"samples", "mean_reward", "mean_reward_se"}`` of the
            role's own reward (see ``sdk.eval._roles``).
        task_set: Tasks in the whole task set the run drew from, when its results say (``sdk.rollout``
            writes it on each line); ``tasks`` below it means the results cover part of it (shards missing).
        shards: The shards (``"I/N"``) the results come from, when the run was sharded.
        warnings: What the reader should know (results covering part of the task set).

    Example:
        >>> s = summarize([{"task_id": "t", "sample": 0, "success": True}])
        >>> s.pass_at_1, s.tasks
        (1.0, 1)
    """

    split: str | None
    tasks: int
    samples: int
    samples_per_task: tuple[int, int]
    threshold: float | None
    pass_at_1: float
    pass_at_1_se: float | None
    pass_at_k: dict[int, float]
    pass_at_k_se: dict[int, float | None]
    pass_hat_k: dict[int, float]
    pass_hat_k_se: dict[int, float | None]
    maj_at_k: dict[int, float]
    maj_at_k_se: dict[int, float | None]
    mean_reward: float | None
    mean_reward_se: float | None
    counts: dict[str, int]
    rates: dict[str, float]
    per_sample: dict[str, dict[str, float | None]]
    per_task: list[TaskMetrics]
    per_role: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    task_set: int | None = None
    shards: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (what ``metrics.json`` and ``--json`` hold; k keys as strings).

        Example:
            >>> summarize([{"task_id": "t", "sample": 0, "success": False}]).as_dict()["pass_at_k"]
            {'1': 0.0}
        """
        out = dataclasses.asdict(self)
        for name, value in out.items():
            if isinstance(value, dict) and all(isinstance(k, int) for k in value):
                out[name] = {str(k): v for k, v in value.items()}
        out["samples_per_task"] = list(self.samples_per_task)
        return out

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`as_dict` as JSON to ``path``, atomically (a reader sees the old or the new file).

        Example:
            >>> summarize([{"task_id": "t", "sample": 0}]).write("metrics.json")  # doctest: +SKIP
        """
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def metric_lines(self) -> list[tuple[str, str]]:
        """The headline figures as (label, value) rows (the runner's summary adds these).

        Example:
            >>> summarize([{"task_id": "t", "sample": 0, "success": True}]).metric_lines()[0]
            ('pass@1', '100.0%  (1 task, 1 sample each)')
        """
        lo, hi = self.samples_per_task
        each = f"{lo} sample{'s' * (lo != 1)} each" if lo == hi else f"{lo}-{hi} samples each"
        tasks = f"{self.tasks} task{'s' * (self.tasks != 1)}"
        rows = [("pass@1", f"{_pct(self.pass_at_1, self.pass_at_1_se)}  ({tasks}, {each})")]
        if self.task_set is not None:
            shards = f"  (shards {', '.join(self.shards)})" if self.shards else ""
            rows.append(("task set covered", f"{self.tasks} of {self.task_set} tasks{shards}"))
        for label, values, ses in (
            ("pass@k", self.pass_at_k, self.pass_at_k_se),
            ("pass^k", self.pass_hat_k, self.pass_hat_k_se),
            ("maj@k", self.maj_at_k, self.maj_at_k_se),
        ):
            if values and (label != "pass@k" or len(values) > 1):
                rows.append((label, "   ".join(f"k={k} {_pct(v, ses[k])}" for k, v in values.items())))
        if self.mean_reward is not None:
            se = "" if self.mean_reward_se is None else f" ± {self.mean_reward_se:.3f}"
            rows.append(("mean reward (over tasks)", f"{self.mean_reward:.3f}{se}"))
        r = self.rates
        rows.append(
            (
                "errors / timeouts / no answer",
                f"{_pct(r['error'])} / {_pct(r['timeout'])} / {_pct(r['no_answer'])}",
            )
        )
        for name, label in (
            ("calls", "LLM calls per sample"),
            ("prompt_tokens", "prompt tokens per sample"),
            ("completion_tokens", "completion tokens per sample"),
            ("seconds", "seconds per sample"),
            ("call_seconds", "seconds per LLM call"),
        ):
            st = self.per_sample.get(name)
            if st and st["mean"] is not None:
                found = f"  ({st['n']} of {self.samples} samples in the store)" if name == "calls" else ""
                value = f"mean {_num(st['mean'])}  p50 {_num(st['p50'])}  p95 {_num(st['p95'])}"
                rows.append((label, value + (found if st["n"] < self.samples else "")))
        for role, f in self.per_role.items():
            se = "" if f["mean_reward_se"] is None else f" ± {f['mean_reward_se']:.3f}"
            rows.append(
                (f"role {role}: mean reward", f"{f['mean_reward']:.3f}{se}  ({f['samples']} samples)")
            )
        return rows

    def format_table(self, tasks: bool = True) -> str:
        """The figures, then (``tasks=True``) one row per task.

        Example:
            >>> s = summarize([{"task_id": "t", "sample": 0, "success": True}])
            >>> print(s.format_table())  # doctest: +SKIP
        """
        rows = self.metric_lines()
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        if tasks:
            lines += ["", _task_table(self.per_task)]
        return "\n".join(lines)


def summarize(
    results: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Sequence[dict[str, Any]],
    *,
    threshold: float | None = None,
    answer_fn: Callable[[Any], Any] | str | None = None,
    ks: Sequence[int] | None = None,
    store: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    by_role: bool = False,
) -> EvalSummary:
    """Evaluation figures over rollout results: one file, several shards, or result lines in memory.

    Args:
        results: A results file, several (shards of one run, merged), or result line dicts.
        threshold: A sample succeeds when its reward is at least this; ``None`` keeps the runner's
            ``success`` field.
        answer_fn: ``"module:function"`` or callable mapping a recorded answer to the answer maj@k votes
            on (e.g. the number at the end of a text); ``None`` (its result) means no answer.
        ks: The k values (default 1, 2, 4, … up to the fewest samples of a task, and that number).
        store: Store(s) the samples were recorded in, for calls and tokens per sample.
        by_role: Also each role's (agent name's) own mean reward, read from ``store`` (``per_role``).

    Returns:
        An :class:`EvalSummary`.

    Raises:
        EvalError: No results, unreadable or mismatched files, ``k < 1`` or more than a task's samples,
            a failing answer function, an unreadable store.

    Example:
        >>> rows = [{"task_id": "t1", "sample": k, "success": k < 3} for k in range(4)]
        >>> s = summarize(rows)
        >>> s.pass_at_k, s.pass_hat_k[2]
        ({1: 0.75, 2: 1.0, 4: 1.0}, 0.5)
    """
    rows = _rows(results)
    answer = _answer_fn(answer_fn)
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[str(r["task_id"])].append(r)
    tids = sorted(by_task)
    sizes = [len(by_task[t]) for t in tids]
    ks = _check_ks(ks, min(sizes))
    counts: Counter[str] = Counter()
    per_task: list[TaskMetrics] = []
    votes_by_task: list[list[tuple[Any, float]]] = []
    for tid in tids:
        group = sorted(by_task[tid], key=lambda r: r["sample"])
        oks = [_success(r, threshold) for r in group]
        votes = [(_vote_key(answer, r), float(ok)) for r, ok in zip(group, oks, strict=True)]
        for r, (key, _) in zip(group, votes, strict=True):
            counts[str(r.get("status", "ok"))] += 1
            counts["no_answer"] += key is None and r.get("status") not in _FAILED
        rewards = [float(r["reward"]) for r in group if is_finite_number(r.get("reward"))]
        keys = Counter(k for k, _ in votes if k is not None)
        per_task.append(
            TaskMetrics(
                task_id=tid,
                n=len(group),
                correct=sum(oks),
                pass_at_1=sum(oks) / len(group),
                mean_reward=statistics.fmean(rewards) if rewards else None,
                errors=sum(r.get("status") == "error" for r in group),
                timeouts=sum(r.get("status") == "timeout" for r in group),
                majority=keys.most_common(1)[0][0] if keys else None,
            )
        )
        votes_by_task.append(votes)
    if by_role and store is None:
        raise EvalError("--by-role reads each agent's rewards from the store: pass --store")
    summary = _assemble(rows, per_task, votes_by_task, ks, threshold, counts, store)
    summary.task_set, summary.shards, summary.warnings = _coverage(rows, len(tids))
    if by_role:
        summary.per_role = role_figures(_sessions(rows, store))
    return summary


def _assemble(
    rows: list[dict[str, Any]],
    per_task: list[TaskMetrics],
    votes_by_task: list[list[tuple[Any, float]]],
    ks: list[int],
    threshold: float | None,
    counts: Counter[str],
    store: Any,
) -> EvalSummary:
    p_at, p_at_se = _over_tasks(per_task, ks, pass_at_k)
    p_hat, p_hat_se = _over_tasks(per_task, ks, pass_hat_k)
    maj: dict[int, float] = {}
    maj_se: dict[int, float | None] = {}
    if any(key is not None for votes in votes_by_task for key, _ in votes):
        per = [_maj_all(votes, ks) for votes in votes_by_task]
        for k in ks:
            maj[k], maj_se[k] = _mean_se([m[k] for m in per])
    p1, p1_se = _mean_se([t.pass_at_1 for t in per_task])
    reward, reward_se = mean_se([t.mean_reward for t in per_task if t.mean_reward is not None])
    sizes = [t.n for t in per_task]
    splits = {r.get("split") for r in rows}
    return EvalSummary(
        split=str(splits.pop()) if len(splits) == 1 else None,
        tasks=len(per_task),
        samples=len(rows),
        samples_per_task=(min(sizes), max(sizes)),
        threshold=threshold,
        pass_at_1=p1,
        pass_at_1_se=p1_se,
        pass_at_k=p_at,
        pass_at_k_se=p_at_se,
        pass_hat_k=p_hat,
        pass_hat_k_se=p_hat_se,
        maj_at_k=maj,
        maj_at_k_se=maj_se,
        mean_reward=reward,
        mean_reward_se=reward_se,
        counts=dict(sorted(counts.items())),
        rates={name: counts.get(name, 0) / len(rows) for name in _RATES},
        per_sample=_per_sample(rows, store),
        per_task=per_task,
    )


def _coverage(rows: list[dict[str, Any]], tasks: int) -> tuple[int | None, list[str], list[str]]:
    """The task set's size and the shards the rows say they come from, and a warning when not all covered.

    ``sdk.rollout`` writes ``task_set: {"tasks": M, "shard": "I/N" | None}`` on each line; older lines
    (and rows built by hand) say nothing, and then nothing is claimed.
    """
    sizes: set[int] = set()
    shards: set[str] = set()
    for r in rows:
        ts = r.get("task_set")
        if isinstance(ts, dict):
            if isinstance(ts.get("tasks"), int):
                sizes.add(ts["tasks"])
            if isinstance(ts.get("shard"), str):
                shards.add(ts["shard"])
    given = sorted(shards, key=lambda sh: tuple(int(x) for x in sh.split("/") if x.isdigit()))
    if len(sizes) > 1:
        return None, given, [f"the results come from task sets of different sizes ({sorted(sizes)})"]
    if not sizes:
        return None, given, []
    total = sizes.pop()
    if tasks >= total:
        return total, given, []
    missing = ""
    counts = {sh.partition("/")[2] for sh in given}
    if len(counts) == 1 and counts.pop().isdigit():
        n = int(given[0].partition("/")[2])
        absent = [f"{i}/{n}" for i in range(1, n + 1) if f"{i}/{n}" not in shards]
        missing = f"; shards given {', '.join(given)}, missing {', '.join(absent)}" if absent else ""
    warning = (
        f"these results cover {tasks} of the task set's {total} tasks{missing}: the figures are not the "
        "whole run's"
    )
    return total, given, [warning]


def _over_tasks(
    per_task: list[TaskMetrics], ks: list[int], estimator: Callable[[int, int, int], float]
) -> tuple[dict[int, float], dict[int, float | None]]:
    means: dict[int, float] = {}
    ses: dict[int, float | None] = {}
    for k in ks:
        means[k], ses[k] = _mean_se([estimator(t.n, t.correct, k) for t in per_task])
    return means, ses


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    mean, se = mean_se(values)
    assert mean is not None  # every caller has at least one task
    return mean, se


def _rows(results: Any) -> list[dict[str, Any]]:
    if isinstance(results, (str, os.PathLike)):
        return load_results(results)
    items = list(results)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        return load_results(items)
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for r in items:
        if not isinstance(r, dict) or "task_id" not in r or not isinstance(r.get("sample"), int):
            raise EvalError(f"not a results line: {str(r)[:200]}")
        last[(str(r["task_id"]), r["sample"])] = r
    if not last:
        raise EvalError("no results given")
    return list(last.values())


def _check_ks(ks: Sequence[int] | None, fewest: int) -> list[int]:
    if ks is None:
        return ks_upto(fewest)
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise EvalError(f"k must be at least 1, got {ks[0] if ks else 'none'}")
    if ks[-1] > fewest:
        raise EvalError(f"k={ks[-1]} is more than the {fewest} samples of some task")
    return ks


def _answer_fn(spec: Callable[[Any], Any] | str | None) -> Callable[[Any], Any] | None:
    if spec is None or callable(spec):
        return spec
    from sdk._internal import load_function

    try:
        return load_function(spec, "answer function")
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _vote_key(answer_fn: Callable[[Any], Any] | None, row: dict[str, Any]) -> str | None:
    value = row.get("answer")
    if value is not None and answer_fn is not None:
        try:
            value = answer_fn(value)
        except Exception as exc:
            raise EvalError(
                f"the answer function failed on task {row['task_id']!r} sample {row['sample']}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if value is None:
        return None
    # Answers vote by their JSON text, so equal lists or dicts agree; a string votes as itself.
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)


def _success(row: dict[str, Any], threshold: float | None) -> bool:
    if threshold is None:
        return bool(row.get("success"))
    return is_finite_number(row.get("reward")) and float(row["reward"]) >= threshold


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p95": None}
    if len(values) == 1:
        return {"n": 1, "mean": values[0], "p50": values[0], "p95": values[0]}
    q = statistics.quantiles(sorted(values), n=100, method="inclusive")  # linear, as numpy's default
    return {"n": len(values), "mean": statistics.fmean(values), "p50": q[49], "p95": q[94]}


def _per_sample(rows: list[dict[str, Any]], store: Any) -> dict[str, dict[str, float | None]]:
    out = {"seconds": _stats([float(r["seconds"]) for r in rows if is_finite_number(r.get("seconds"))])}
    if store is None:
        return out
    sessions = _sessions(rows, store)
    out["calls"] = _stats([float(len(s.calls)) for s in sessions])
    for name in ("prompt_tokens", "completion_tokens"):
        out[name] = _stats([float(sum(_usage(c, name) for c in s.calls)) for s in sessions])
    out["call_seconds"] = _stats(
        [c["latency_s"] for s in sessions for c in s.calls if is_finite_number(c["latency_s"])]
    )
    return out


def _sessions(rows: list[dict[str, Any]], store: Any) -> list[Any]:
    """The stored sessions of the results' samples, in session id order."""
    from sdk.store import StoreReader

    wanted = {r["session_id"] for r in rows if r.get("session_id")}
    found: dict[str, Any] = {}
    for location in [store] if isinstance(store, (str, os.PathLike)) else store:
        if isinstance(location, (str, Path)) and "://" not in str(location) and not Path(location).is_dir():
            raise EvalError(f"no store at {location}")
        try:
            for s in StoreReader(location).sessions():
                if s.session_id in wanted:
                    found[s.session_id] = s
        except (OSError, ValueError) as exc:
            raise EvalError(f"cannot read the store {location}: {exc}") from None
    return [found[sid] for sid in sorted(found)]


def _usage(call: dict[str, Any], name: str) -> int:
    value = (call.get("usage") or {}).get(name)
    return value if isinstance(value, int) else 0


def _pct(value: float, se: float | None = None) -> str:
    return f"{100 * value:.1f}%" + ("" if se is None else f" ± {100 * se:.1f}")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _task_table(tasks: list[TaskMetrics]) -> str:
    head = ("task", "n", "correct", "pass@1", "reward", "errors", "timeouts", "majority answer")
    body = [
        (
            t.task_id[:40],
            str(t.n),
            str(t.correct),
            f"{100 * t.pass_at_1:.1f}%",
            "-" if t.mean_reward is None else f"{t.mean_reward:.3f}",
            str(t.errors),
            str(t.timeouts),
            "-" if t.majority is None else " ".join(t.majority.split())[:40],
        )
        for t in tasks
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *body]
    )
