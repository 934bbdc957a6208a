"""The results file (one JSON line per finished sample) and the summary built from it.

Example:
    >>> summarize([{"task_id": "t", "sample": 0, "reward": 1.0, "success": True}],
    ...           split="eval", results_path="r.jsonl", total=1).success_rate
    1.0
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from sdk.eval import EvalSummary, metrics_path
from sdk.eval import summarize as _eval_summary

__all__ = ["RolloutSummary", "read_results", "summarize"]

_STATUSES = ("ok", "error", "timeout", "reward_error", "no_reward")


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
        tool_calls: Tool calls the server parsed, over the samples whose line counts them.
        malformed_tool_calls: Calls whose answer opened a tool call the server could not parse (returned
            as text: the agent's framework does not run it; ``sdk.messages.malformed_tool_call``).
        samples_with_malformed: Samples with at least one such call.
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
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    samples_with_malformed: int = 0
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
        out["malformed_share"] = self.malformed_share
        return out

    @property
    def malformed_share(self) -> float | None:
        """Malformed tool calls over all tool-call attempts (parsed + malformed); ``None`` without any.

        Example:
            >>> RolloutSummary("t", "r", tool_calls=3, malformed_tool_calls=1).malformed_share
            0.25
        """
        attempts = self.tool_calls + self.malformed_tool_calls
        return self.malformed_tool_calls / attempts if attempts else None

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
            ("tool calls: parsed / malformed", _tool_call_line(self)),
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


def _tool_call_line(s: RolloutSummary) -> str:
    share = s.malformed_share
    if share is None:
        return "0 / 0"
    return (
        f"{s.tool_calls} / {s.malformed_tool_calls} ({100 * share:.1f}% malformed, in "
        f"{s.samples_with_malformed} sample{'s' * (s.samples_with_malformed != 1)})"
    )


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
        malformed = r.get("malformed_tool_calls")
        if isinstance(malformed, int):  # lines of older runs do not count them
            s.tool_calls += int(r.get("tool_calls") or 0)
            s.malformed_tool_calls += malformed
            s.samples_with_malformed += malformed > 0
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


def _append(path: Path, row: dict[str, Any]) -> None:
    # One write of one line to an O_APPEND file: a kill leaves at most a torn last line (skipped on read).
    data = (json.dumps(row, default=repr) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
