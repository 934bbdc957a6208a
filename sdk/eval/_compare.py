"""Is B better than A? The paired difference in pass@1 over shared tasks, its interval and p-value.

Both runs attempted the same tasks, so the comparison is paired: per task, ``d = pass@1(B) - pass@1(A)``.
The interval is a percentile bootstrap over tasks (resampling tasks with replacement, which carries both
the choice of tasks and each task's sampling noise); the p-value is a paired sign-flip permutation test
(under "no difference", A and B are exchangeable within a task, so each ``d`` is as likely to have the
opposite sign). Both are seeded: the same inputs give the same numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

from sdk.eval._estimators import mean_se
from sdk.eval._results import EvalError
from sdk.eval._summary import EvalSummary, summarize

__all__ = ["Comparison", "compare"]


@dataclasses.dataclass
class Comparison:
    """The paired comparison of two evaluations (see :func:`compare`); B minus A throughout.

    Attributes:
        tasks: Tasks both runs have (the comparison uses these only).
        only_a / only_b: Task ids only one run has (left out).
        a_pass_at_1 / b_pass_at_1: pass@1 of each run over the shared tasks.
        difference: ``b_pass_at_1 - a_pass_at_1``.
        se: Standard error of the paired difference (over tasks).
        ci_low / ci_high: The bootstrap interval of the difference at ``confidence``.
        confidence: Interval coverage (0.95).
        p_value: Two-sided p-value of the sign-flip test (exact when the tasks that differ are few).
        wins / losses / ties: Tasks where B's pass@1 is higher / lower / equal.
        resamples: Bootstrap resamples (and permutation draws).
        seed: The random seed.
        per_task: ``{"task_id", "a", "b"}`` (pass@1 of each), in task id order.
        warnings: What the reader should know (task sets or splits differ, a run covers part of its task set).

    Example:
        >>> c = compare([{"task_id": "t", "sample": 0, "success": False}],
        ...             [{"task_id": "t", "sample": 0, "success": True}], resamples=100)
        >>> c.difference, c.wins
        (1.0, 1)
    """

    tasks: int
    only_a: list[str]
    only_b: list[str]
    a_pass_at_1: float
    b_pass_at_1: float
    difference: float
    se: float | None
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    wins: int
    losses: int
    ties: int
    resamples: int
    seed: int
    per_task: list[dict[str, Any]]
    warnings: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (``--json``).

        Example:
            >>> c = compare([{"task_id": "t", "sample": 0, "success": True}] * 1,
            ...             [{"task_id": "t", "sample": 0, "success": True}], resamples=10)
            >>> c.as_dict()["p_value"]
            1.0
        """
        return dataclasses.asdict(self)

    def format_table(self, tasks: bool = True) -> str:
        """The comparison, then (``tasks=True``) the tasks whose pass@1 differs, largest gain first.

        Example:
            >>> c = compare([{"task_id": "t", "sample": 0, "success": True}],
            ...             [{"task_id": "t", "sample": 0, "success": True}], resamples=10)
            >>> print(c.format_table())  # doctest: +SKIP
        """
        left = f" ({len(self.only_a)} only in A, {len(self.only_b)} only in B: left out)"
        se = "" if self.se is None else f" ± {100 * self.se:.1f}"
        level = f"{100 * self.confidence:g}%"
        rows = [
            ("tasks compared", f"{self.tasks}{left if self.only_a or self.only_b else ''}"),
            ("pass@1 A", f"{100 * self.a_pass_at_1:.1f}%"),
            ("pass@1 B", f"{100 * self.b_pass_at_1:.1f}%"),
            ("difference B - A", f"{100 * self.difference:+.1f} points{se}"),
            (
                f"{level} interval",
                f"[{100 * self.ci_low:+.1f}, {100 * self.ci_high:+.1f}] points "
                f"(paired bootstrap over tasks, {self.resamples} resamples, seed {self.seed})",
            ),
            ("p-value", f"{self.p_value:.4g} (paired sign-flip permutation test)"),
            ("tasks B better / worse / same", f"{self.wins} / {self.losses} / {self.ties}"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        changed = sorted((t for t in self.per_task if t["a"] != t["b"]), key=lambda t: t["a"] - t["b"])
        if tasks and changed:
            w = max(4, *(len(t["task_id"][:40]) for t in changed))
            lines += ["", f"{'task':<{w}}  {'A':>6}  {'B':>6}  {'B - A':>6}"]
            for t in changed:
                a, b = 100 * t["a"], 100 * t["b"]
                lines.append(f"{t['task_id'][:40]:<{w}}  {a:5.1f}%  {b:5.1f}%  {b - a:+6.1f}")
        return "\n".join(lines)


def _warnings(sa: EvalSummary, sb: EvalSummary, only_a: list, only_b: list, shared: int) -> list[str]:
    """What makes two runs' comparison doubtful: different task sets (named by split too), partial shards.

    The task sets decide, not the split names: the loop names each validation by its round
    (``eval-round-0``, ``eval-round-1``) over one task set, and those compare as they are. Other split
    names are worth a word only when the tasks differ as well.
    """
    out = []
    same_tasks = not (only_a or only_b) and (
        sa.task_set is None or sb.task_set is None or sa.task_set == sb.task_set
    )
    if sa.split is not None and sb.split is not None and sa.split != sb.split and not same_tasks:
        out.append(
            f"the runs are of different splits: A {sa.split!r}, B {sb.split!r}, over different tasks; the "
            "figures compare different evaluations"
        )
    out += [f"A: {w}" for w in sa.warnings] + [f"B: {w}" for w in sb.warnings]
    if only_a or only_b:
        out.append(
            f"the task sets differ: {len(only_a)} task(s) only in A, {len(only_b)} only in B; "
            f"comparing the {shared} shared tasks"
        )
    return out


def compare(
    a: EvalSummary | Any,
    b: EvalSummary | Any,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    threshold: float | None = None,
) -> Comparison:
    """Compare two evaluations task by task: B's pass@1 minus A's, with an interval and a p-value.

    Args:
        a: The baseline: an :class:`EvalSummary`, or what :func:`summarize` takes (files, rows).
        b: The candidate, likewise.
        resamples: Bootstrap resamples and permutation draws.
        seed: Seed of the resampling (``random.Random(seed)``).
        confidence: Coverage of the interval.
        threshold: Passed to :func:`summarize` for inputs that are not summaries yet.

    Returns:
        A :class:`Comparison` over the tasks both have (a warning in ``warnings`` when the sets differ).

    Raises:
        EvalError: No shared task, ``resamples < 1`` or ``confidence`` outside (0, 1), bad input files.

    Example:
        >>> base = [{"task_id": f"t{i}", "sample": 0, "success": i < 5} for i in range(10)]
        >>> new = [{"task_id": f"t{i}", "sample": 0, "success": i < 8} for i in range(10)]
        >>> c = compare(base, new, resamples=1000)
        >>> round(c.difference, 2), c.ci_low > 0, c.wins, c.losses
        (0.3, True, 3, 0)
    """
    if resamples < 1:
        raise EvalError(f"resamples must be at least 1, got {resamples}")
    if not 0 < confidence < 1:
        raise EvalError(f"confidence must be between 0 and 1, got {confidence}")
    sa = a if isinstance(a, EvalSummary) else summarize(a, threshold=threshold)
    sb = b if isinstance(b, EvalSummary) else summarize(b, threshold=threshold)
    pa = {t.task_id: t.pass_at_1 for t in sa.per_task}
    pb = {t.task_id: t.pass_at_1 for t in sb.per_task}
    shared = sorted(pa.keys() & pb.keys())
    if not shared:
        raise EvalError("the two runs share no task: nothing to compare")
    only_a, only_b = sorted(pa.keys() - pb.keys()), sorted(pb.keys() - pa.keys())
    warnings = _warnings(sa, sb, only_a, only_b, len(shared))
    d = [pb[t] - pa[t] for t in shared]
    diff, se = mean_se(d)
    assert diff is not None
    rng = random.Random(seed)
    low, high = bootstrap_interval(d, resamples, confidence, rng)
    return Comparison(
        tasks=len(shared),
        only_a=only_a,
        only_b=only_b,
        a_pass_at_1=math.fsum(pa[t] for t in shared) / len(shared),
        b_pass_at_1=math.fsum(pb[t] for t in shared) / len(shared),
        difference=diff,
        se=se,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        p_value=sign_flip_p_value(d, resamples, rng),
        wins=sum(x > 0 for x in d),
        losses=sum(x < 0 for x in d),
        ties=sum(x == 0 for x in d),
        resamples=resamples,
        seed=seed,
        per_task=[{"task_id": t, "a": pa[t], "b": pb[t]} for t in shared],
        warnings=warnings,
    )


def bootstrap_interval(
    d: Sequence[float], resamples: int, confidence: float, rng: random.Random
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``d`` (tasks resampled with replacement).

    Example:
        >>> bootstrap_interval([0.0, 0.0], 100, 0.95, random.Random(0))
        (0.0, 0.0)
    """
    n = len(d)
    means = sorted(math.fsum(rng.choices(d, k=n)) / n for _ in range(resamples))
    alpha = 1 - confidence
    return _quantile(means, alpha / 2), _quantile(means, 1 - alpha / 2)


def sign_flip_p_value(d: Sequence[float], draws: int, rng: random.Random) -> float:
    """Two-sided p-value that the mean of ``d`` is 0: each ``d`` flips sign with probability 1/2.

    Exact (all ``2**m`` sign patterns of the ``m`` non-zero differences) when that is at most ``draws``;
    otherwise ``draws`` random patterns, with ``(1 + hits) / (1 + draws)`` so it is never 0.

    Example:
        >>> sign_flip_p_value([1.0, 1.0, 1.0], 1000, random.Random(0))  # 2 of the 8 patterns are as extreme
        0.25
    """
    x = [v for v in d if v != 0]
    if not x:
        return 1.0
    total = math.fsum(x)
    observed = abs(total) - 1e-9 * max(1.0, abs(total))  # as extreme, up to rounding
    m = len(x)
    if 2**m <= draws:
        hits = sum(
            abs(total - 2 * math.fsum(itertools.compress(x, flips))) >= observed
            for flips in itertools.product((0, 1), repeat=m)
        )
        return hits / 2**m
    hits = 0
    for _ in range(draws):
        flips = map(int, format(rng.getrandbits(m), f"0{m}b"))
        hits += abs(total - 2 * math.fsum(itertools.compress(x, flips))) >= observed
    return (1 + hits) / (1 + draws)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default ``linear`` method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
