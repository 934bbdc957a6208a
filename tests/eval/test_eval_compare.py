"""``sdk.eval.compare``: the paired bootstrap interval covers a known difference; the permutation p-value."""

from __future__ import annotations

import itertools
import random

import pytest

from sdk.eval import EvalError, compare, summarize
from sdk.eval._compare import sign_flip_p_value


def paired_runs(rng: random.Random, tasks: int, samples: int, delta: float) -> tuple[list, list]:
    """Results of A and B on the same tasks: task difficulty q ~ U(0.2, 0.6), B succeeds with q + delta."""
    a, b = [], []
    for t in range(tasks):
        q = rng.uniform(0.2, 0.6)
        for k in range(samples):
            a.append({"task_id": f"t{t}", "sample": k, "success": rng.random() < q})
            b.append({"task_id": f"t{t}", "sample": k, "success": rng.random() < q + delta})
    return a, b


def test_interval_covers_the_true_difference_in_at_least_90_percent_of_200_runs():
    rng = random.Random(2026)
    delta, covered, positive = 0.1, 0, 0
    for run in range(200):
        a, b = paired_runs(rng, tasks=50, samples=4, delta=delta)
        c = compare(a, b, resamples=1000, seed=run)
        covered += c.ci_low <= delta <= c.ci_high
        positive += c.ci_low > 0
    assert covered >= 180, covered  # nominal 95%
    assert positive >= 100  # and the interval usually excludes 0: the test has power at this size


def test_identical_runs_give_an_interval_containing_zero():
    rng = random.Random(1)
    a, _ = paired_runs(rng, tasks=30, samples=4, delta=0.0)
    c = compare(a, [dict(r) for r in a], resamples=500)
    assert c.difference == 0.0 and c.ci_low <= 0.0 <= c.ci_high and c.p_value == 1.0
    assert (c.wins, c.losses, c.ties) == (0, 0, 30) and c.warnings == []
    # Two runs of the same agent (no true difference): the interval contains 0.
    a, b = paired_runs(random.Random(5), tasks=60, samples=4, delta=0.0)
    c = compare(a, b, resamples=2000)
    assert c.ci_low <= 0.0 <= c.ci_high and c.p_value > 0.05


def test_seeded_and_paired_over_shared_tasks_with_a_warning():
    a, b = paired_runs(random.Random(3), tasks=20, samples=2, delta=0.2)
    a = [r for r in a if r["task_id"] != "t0"]  # A lacks t0, B lacks t1
    b = [r for r in b if r["task_id"] != "t1"]
    c1, c2 = compare(a, b, resamples=400, seed=9), compare(a, b, resamples=400, seed=9)
    assert c1 == c2  # same seed, same numbers
    assert c1.tasks == 18 and c1.only_a == ["t1"] and c1.only_b == ["t0"]
    assert "task sets differ" in c1.warnings[0]
    sa, sb = summarize(a), summarize(b)
    pa = {t.task_id: t.pass_at_1 for t in sa.per_task}
    pb = {t.task_id: t.pass_at_1 for t in sb.per_task}
    shared = sorted(pa.keys() & pb.keys())
    assert c1.difference == pytest.approx(sum(pb[t] - pa[t] for t in shared) / 18)
    assert c1.wins == sum(pb[t] > pa[t] for t in shared) and c1.losses == sum(pb[t] < pa[t] for t in shared)
    assert compare(sa, sb, resamples=400, seed=9) == c1  # summaries work as inputs too
    assert "tasks B better / worse / same" in c1.format_table()
    with pytest.raises(EvalError, match="share no task"):
        compare([{"task_id": "x", "sample": 0}], [{"task_id": "y", "sample": 0}])
    with pytest.raises(EvalError, match="resamples"):
        compare(a, b, resamples=0)


def test_sign_flip_p_value_exact_and_sampled():
    d = [0.5, 0.25, -0.25, 0.75, 0.0, 0.5]
    x = [v for v in d if v]
    obs = abs(sum(x))
    exact = sum(
        abs(sum(v * s for v, s in zip(x, signs, strict=True))) >= obs - 1e-12
        for signs in itertools.product((1, -1), repeat=len(x))
    ) / 2 ** len(x)
    assert sign_flip_p_value(d, 10_000, random.Random(0)) == pytest.approx(exact)
    sampled = sign_flip_p_value(d, 8, random.Random(0))  # fewer draws than patterns: Monte Carlo
    assert 0 < sampled <= 1
    many = [0.25] * 30 + [-0.25] * 5
    assert sign_flip_p_value(many, 4000, random.Random(0)) < 0.001
    assert sign_flip_p_value([0.0, 0.0], 100, random.Random(0)) == 1.0
