"""A check before a run: a handful of samples, and a few lines that say whether the run can learn.

``tracerl rollout AGENT TASKS --check`` and ``tracerl train --loop loop.yaml --check`` run the first tasks
``group_size`` times each (into a store of their own, so nothing of the check is trained on) and report
what decides whether GRPO gets a signal: how many model calls a sample makes, how many tool calls the
model made and how many it wrote so that the server could not parse them, the reward's mean and spread in
each group (a group whose samples all score the same teaches nothing), seconds per call, how long a run at
these settings will take, peak memory, and a verdict naming what to change.

Example:
    >>> report = check_rollout(RolloutSpec("my_agent:solve", group_size=4), "tasks.jsonl")  # doctest: +SKIP
    >>> print(report.format())  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sdk.rollout._spec import RolloutSpec
from sdk.rollout._summary import RolloutSummary, read_results

__all__ = ["RolloutCheck", "check_rollout"]

#: Below this sampling temperature a group's samples tend to be one answer: no reward spread.
_LOW_TEMPERATURE = 0.7
#: A malformed share above this is worth a warm start on the tool-call format.
_MALFORMED_LIMIT = 0.05


@dataclasses.dataclass
class RolloutCheck:
    """What a check's samples showed (see :func:`check_rollout`); :meth:`format` prints it.

    Attributes:
        samples: Samples run; ``statuses`` counts them by status (``ok``, ``error``, ``timeout``, ...).
        group_size: Samples per task.
        groups: ``{"task_id", "rewards", "mean", "spread"}`` per task (spread: population std of rewards).
        calls_per_sample: Mean model calls per sample (from the store).
        tool_calls / malformed_tool_calls: Tool calls the server parsed; answers that opened a tool call it
            could not parse (``sdk.messages.malformed_tool_call``), which the agent takes as plain text.
        tools_offered: Whether any call offered tools to the model.
        seconds_per_call: Mean seconds of a model call; ``seconds_per_sample``: of a whole sample.
        wall_s: Wall time of the check's samples; ``concurrency``: samples it ran at once.
        temperatures: Sampling temperatures the agent sent (None: the server's default).
        first_error: The first failed sample's error.
        timeout: The per-sample timeout used.
        peak_rss_bytes: Peak resident memory of this process; ``peak_child_rss_bytes``: of its largest
            finished child process (a policy server the check started and stopped), 0 if none; ``child``
            names it.
        projections: ``(what, samples, concurrency)`` to project: each becomes a line with its minutes.
        notes: Lines the caller adds to the verdict (e.g. the loop's round time). Notes alone are not a
            problem: the verdict still says "ready" when nothing else is wrong.

    Example:
        >>> RolloutCheck(samples=0, group_size=2).verdict()[0]
        'no sample ran: nothing to judge'
    """

    samples: int
    group_size: int
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)
    groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    calls_per_sample: float | None = None
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    tools_offered: bool = False
    seconds_per_call: float | None = None
    seconds_per_sample: float | None = None
    wall_s: float = 0.0
    concurrency: int = 1
    temperatures: list[float | None] = dataclasses.field(default_factory=list)
    first_error: str | None = None
    timeout: float | None = None
    peak_rss_bytes: int = 0
    peak_child_rss_bytes: int = 0
    projections: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    child: str = "its largest child process"

    @property
    def malformed_share(self) -> float | None:
        """Malformed tool calls over all tool-call attempts; ``None`` without any.

        Example:
            >>> RolloutCheck(samples=4, group_size=2, tool_calls=3, malformed_tool_calls=1).malformed_share
            0.25
        """
        attempts = self.tool_calls + self.malformed_tool_calls
        return self.malformed_tool_calls / attempts if attempts else None

    @property
    def groups_with_spread(self) -> int:
        """Groups whose rewards differ (GRPO learns from these only).

        Example:
            >>> check = RolloutCheck(samples=2, group_size=2, groups=[{"spread": 0.5}, {"spread": 0.0}])
            >>> check.groups_with_spread
            1
        """
        return sum(g["spread"] > 0 for g in self.groups)

    def project_s(self, samples: int, concurrency: int) -> float | None:
        """Seconds ``samples`` samples take at ``concurrency``, at the check's pace per sample slot.

        Example:
            >>> RolloutCheck(samples=4, group_size=2, wall_s=10.0, concurrency=4).project_s(8, 4)
            20.0
        """
        if not self.samples or self.wall_s <= 0:
            return None
        # Waves of `concurrency` samples; a wave took the check's wall time over its waves. A server that
        # batches more calls at a higher concurrency answers each a little slower: a floor, roughly.
        waves = math.ceil(self.samples / max(1, self.concurrency))
        return math.ceil(samples / max(1, concurrency)) * self.wall_s / waves

    def verdict(self) -> list[str]:
        """Plain lines: what is wrong and what to change, else that the run can learn.

        Example:
            >>> RolloutCheck(samples=2, group_size=2, statuses={"ok": 2},
            ...              groups=[{"task_id": "t", "rewards": [1.0, 0.0], "mean": 0.5, "spread": 0.5}],
            ...              ).verdict()[-1]
            'ready: 1 of 1 groups have reward spread, so GRPO gets a signal'
        """
        if not self.samples:
            return ["no sample ran: nothing to judge"]
        out: list[str] = []
        failed = self.statuses.get("error", 0) + self.statuses.get("reward_error", 0)
        timeouts = self.statuses.get("timeout", 0)
        if failed:
            out.append(
                f"fix the agent or reward function: {failed} of {self.samples} samples failed "
                f"(first: {self.first_error})"
            )
            if self.first_error and "timeout" in self.first_error.lower():
                out.append(
                    "the agent's model client gave up waiting: give it a longer timeout (a local "
                    "policy server queues calls; e.g. timeout=600 on the client)"
                )
        if timeouts:
            out.append(
                f"{timeouts} of {self.samples} samples hit the timeout ({self.timeout} s): raise timeout"
            )
        share = self.malformed_share
        if share is not None and share > _MALFORMED_LIMIT:
            out.append(
                f"{100 * share:.0f}% of the model's tool calls were malformed (text the server could "
                "not parse, taken by the agent as its answer): warm-start on demonstrations of the "
                "call format (tracerl sft), and/or set malformed_tool_call_penalty in the loop"
            )
        elif self.tools_offered and not self.tool_calls and not self.malformed_tool_calls:
            out.append(
                "the model never called a tool although tools were offered: warm-start it on "
                "demonstrations that call them (tracerl sft)"
            )
        rewards = [x for g in self.groups for x in g["rewards"]]
        flat = [g for g in self.groups if g["spread"] == 0]
        if rewards and len(flat) == len(self.groups):
            if max(rewards) == min(rewards) == 0:
                out.append(
                    "no group has reward spread and no sample scored: nothing to learn from; warm "
                    "start (tracerl sft) or easier tasks"
                )
            elif len({*rewards}) == 1:
                out.append(f"every sample scored {rewards[0]:g}: no group has reward spread; harder tasks")
            else:
                out.append(
                    "no group has reward spread (each task's samples score alike): raise the "
                    "temperature or group_size"
                )
        elif flat and len(flat) * 2 > len(self.groups):
            out.append(
                f"only {self.groups_with_spread} of {len(self.groups)} groups have reward spread: a "
                "larger group_size gives more groups a signal"
            )
        low = sorted({t for t in self.temperatures if t is not None and t < _LOW_TEMPERATURE})
        if low and (flat or not self.groups):
            out.append(
                f"the agent samples at temperature {', '.join(f'{t:g}' for t in low)}: set 1.0 on its "
                "model (LlamaIndex defaults to 0.1), or its samples hardly differ"
            )
        if not out:
            out.append(
                f"ready: {self.groups_with_spread} of {len(self.groups)} groups have reward spread, "
                "so GRPO gets a signal"
            )
        never = [str(g["task_id"]) for g in self.groups if g["rewards"] and max(g["rewards"]) <= 0]
        if never and len(never) < len(self.groups):
            # Not a blocker (hard tasks are normal), but the failure the other lines cannot show: a kind of
            # task the warm start never gets right stays wrong, since GRPO reinforces only what a sample did.
            out.append(
                f"{len(never)} of {len(self.groups)} groups never scored ({', '.join(never[:3])}"
                f"{', ...' if len(never) > 3 else ''}): RL cannot learn what no sample does; if such tasks "
                "are of one kind, add demonstrations of it (tracerl sft) or raise group_size"
            )
        out += self.notes
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (``--json``), with the malformed share and the verdict.

        Example:
            >>> RolloutCheck(samples=0, group_size=2).as_dict()["verdict"]
            ['no sample ran: nothing to judge']
        """
        out = dataclasses.asdict(self)
        out["malformed_share"] = self.malformed_share
        out["groups_with_spread"] = self.groups_with_spread
        out["projected_s"] = {what: self.project_s(n, c) for what, n, c in self.projections}
        out["verdict"] = self.verdict()
        return out

    def format(self) -> str:
        """The report: a few lines of figures, then the verdict.

        Example:
            >>> print(RolloutCheck(samples=0, group_size=2).format())  # doctest: +ELLIPSIS
            check: 0 samples (0 tasks x 2)...
        """
        lines = [
            f"check: {self.samples} samples ({len(self.groups)} tasks x {self.group_size}), "
            f"{self.wall_s:.1f} s at concurrency {self.concurrency}; "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()) if v)
        ]
        cps = "-" if self.calls_per_sample is None else f"{self.calls_per_sample:.1f}"
        spc = "-" if self.seconds_per_call is None else f"{self.seconds_per_call:.2f}"
        lines.append(f"  model calls per sample  {cps} ({spc} s per call)")
        share = self.malformed_share
        bad = "" if share is None else f" ({100 * share:.0f}% malformed)"
        lines.append(
            f"  tool calls              {self.tool_calls} parsed, {self.malformed_tool_calls} malformed{bad}"
        )
        for g in self.groups:
            signal = "" if g["spread"] > 0 else "  no spread: no signal"
            lines.append(
                f"  group {str(g['task_id'])[:24]:<24}  reward mean {g['mean']:.2f}, spread "
                f"{g['spread']:.2f}{signal}"
            )
        for what, samples, concurrency in self.projections:
            s = self.project_s(samples, concurrency)
            if s is not None:
                lines.append(f"  {what:<22}  ~{took(s)} ({samples} samples at concurrency {concurrency})")
        mem = f"  peak memory             {self.peak_rss_bytes / 1e9:.2f} GB this process"
        if self.peak_child_rss_bytes:
            mem += f", {self.peak_child_rss_bytes / 1e9:.2f} GB {self.child}"
        lines.append(mem)
        lines += [f"verdict: {v}" for v in self.verdict()]
        return "\n".join(lines)


def took(seconds: float) -> str:
    """``42 s`` or ``3.5 min``.

    Example:
        >>> took(42.4), took(210)
        ('42 s', '3.5 min')
    """
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def check_rollout(
    spec: RolloutSpec,
    tasks: str | os.PathLike[str] | Iterable[dict[str, Any]],
    *,
    check_tasks: int = 2,
    workdir: str | os.PathLike[str] | None = None,
    projections: list[tuple[str, int, int]] | None = None,
) -> RolloutCheck:
    """Run the first ``check_tasks`` tasks ``spec.group_size`` times each and report what the samples show.

    The samples go to a store and results file of their own (``workdir``, default a temporary directory
    removed afterwards), so nothing of the check is exported or trained on.

    Args:
        spec: What runs, as for :func:`sdk.rollout.run_rollout` (its ``group_size``: the run's G); at most
            ``spec.concurrency`` samples at once.
        tasks: The task set; only its first ``check_tasks`` tasks run.
        check_tasks: Tasks to run.
        workdir: Where the check's store and results go (kept); default: a temporary directory.
        projections: ``(what, samples, concurrency)`` runs to project at the check's pace.

    Returns:
        A :class:`RolloutCheck`.

    Raises:
        RolloutError: Bad agent, reward function, tasks or settings (as the runner raises them).

    Example:
        >>> spec = RolloutSpec("my_agent:solve", group_size=4)
        >>> print(check_rollout(spec, "tasks.jsonl").format())  # doctest: +SKIP
    """
    import sdk
    from sdk.rollout._run import run_rollout
    from sdk.rollout._tasks import RolloutError, load_tasks

    if check_tasks < 1:
        raise RolloutError(f"check_tasks must be at least 1, got {check_tasks}")
    chosen = load_tasks(tasks, spec.id_field)[:check_tasks]
    if not chosen:
        raise RolloutError("no tasks to check")
    temp = tempfile.TemporaryDirectory(prefix="tracerl-check-") if workdir is None else None
    where = Path(temp.name if temp is not None else workdir)  # type: ignore[arg-type]
    where.mkdir(parents=True, exist_ok=True)
    results, store = where / "check.jsonl", where / "store"
    # A check runs its samples again every time: the runner would resume them from an earlier check.
    results.unlink(missing_ok=True)
    shutil.rmtree(store, ignore_errors=True)
    from sdk._tracer import tracer

    before = tracer.config  # put back afterwards: the check's store is not the caller's
    # At most the check's samples at once; the chosen tasks carry their id under "id" now.
    spec = dataclasses.replace(
        spec, concurrency=min(spec.concurrency, len(chosen) * spec.group_size), id_field="id"
    )
    try:
        t0 = time.monotonic()
        summary = run_rollout(spec, chosen, split="check", results=results, store=store)
        wall = time.monotonic() - t0
        report = _report(read_results(results), summary, store, spec, wall)
    finally:
        sdk.flush()
        tracer.restore(before)
        if temp is not None:
            temp.cleanup()
    report.projections = list(projections or [])
    return report


def _report(
    rows: list[dict[str, Any]], summary: RolloutSummary, store: Path, spec: RolloutSpec, wall: float
) -> RolloutCheck:
    """The check's figures: the counts and means ``summary`` has, the groups and the calls' settings."""
    from sdk.store import StoreReader

    by_task: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if isinstance(r.get("reward"), (int, float)):
            by_task[str(r["task_id"])].append(float(r["reward"]))
    groups = [
        {"task_id": tid, "rewards": v, "mean": statistics.fmean(v), "spread": statistics.pstdev(v)}
        for tid, v in by_task.items()
    ]
    # What the calls offered and how they sampled: the only figures the summary does not have.
    wanted = {r["session_id"] for r in rows if r.get("session_id")}
    offered = False
    temperatures: set[float | None] = set()
    for s in StoreReader(store).sessions() if store.is_dir() else ():
        if s.session_id not in wanted:
            continue
        for c in s.calls:
            request = c.get("request") or {}
            offered = offered or bool(request.get("tools"))
            t = (request.get("params") or {}).get("temperature")
            temperatures.add(float(t) if isinstance(t, (int, float)) else None)
    # The summary's evaluation figures read the same store for calls per sample and seconds per call.
    per_sample = summary.metrics.per_sample if summary.metrics is not None else {}
    mean = {name: (per_sample.get(name) or {}).get("mean") for name in ("calls", "call_seconds", "seconds")}
    errors = [r["error"] for r in rows if r.get("error") and r.get("status") != "timeout"]
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kilobytes on Linux
    return RolloutCheck(
        samples=summary.done,
        group_size=spec.group_size,
        statuses={k: v for k, v in summary.counts.items() if v},
        groups=groups,
        calls_per_sample=mean["calls"],
        tool_calls=summary.tool_calls,
        malformed_tool_calls=summary.malformed_tool_calls,
        tools_offered=offered,
        seconds_per_call=mean["call_seconds"],
        seconds_per_sample=mean["seconds"],
        wall_s=wall,
        concurrency=spec.concurrency,
        temperatures=sorted(temperatures, key=lambda t: (t is None, t or 0.0)),
        first_error=errors[0] if errors else None,
        timeout=spec.timeout,
        peak_rss_bytes=self_rss * scale,
        peak_child_rss_bytes=child_rss * scale,
    )
