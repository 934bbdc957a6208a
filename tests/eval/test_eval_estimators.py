"""``sdk.eval`` estimators against direct enumeration of every k-subset and an independent exact formula.

The second computation is exact rational arithmetic (``fractions.Fraction``) with the product forms of the
estimators, which use no binomial at all: pass@k = 1 - prod_{i=n-c+1..n} (1 - k/i) (the form in Chen et al. 2021's code) and
pass^k = prod_{i<k} (c-i)/(n-i); the third is ``scipy.special.comb`` (scipy is in the ``dev`` extra).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from sdk.eval import EvalError, maj_at_k, mean_se, pass_at_k, pass_hat_k, summarize
from sdk.eval._estimators import ks_upto


def outcomes(n: int, c: int) -> list[int]:
    return [1] * c + [0] * (n - c)


def enum_pass_at_k(n: int, c: int, k: int) -> Fraction:
    subsets = list(itertools.combinations(outcomes(n, c), k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


def enum_pass_hat_k(n: int, c: int, k: int) -> Fraction:
    subsets = list(itertools.combinations(outcomes(n, c), k))
    return Fraction(sum(all(s) for s in subsets), len(subsets))


def product_pass_at_k(n: int, c: int, k: int) -> Fraction:
    if n - c < k:
        return Fraction(1)
    prod = Fraction(1)
    for i in range(n - c + 1, n + 1):
        prod *= 1 - Fraction(k, i)
    return 1 - prod


def product_pass_hat_k(n: int, c: int, k: int) -> Fraction:
    prod = Fraction(1)
    for i in range(k):
        prod *= Fraction(max(c - i, 0), n - i)
    return prod


def enum_maj_at_k(votes: list[tuple[str | None, float]], k: int) -> float:
    """Every k-subset: the answers with the most votes, their correctness averaged (ties)."""
    correctness: dict[str, list[float]] = {}
    for a, ok in votes:
        if a is not None:
            correctness.setdefault(a, []).append(ok)
    score = 0.0
    subsets = list(itertools.combinations(votes, k))
    for subset in subsets:
        counts = Counter(a for a, _ in subset if a is not None)
        if not counts:
            continue
        top = max(counts.values())
        tied = [a for a, m in counts.items() if m == top]
        score += sum(sum(correctness[a]) / len(correctness[a]) for a in tied) / len(tied)
    return score / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_and_pass_hat_k_match_enumeration_and_product_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(enum_pass_at_k(n, c, k)), abs=1e-15)
            assert pass_at_k(n, c, k) == pytest.approx(float(product_pass_at_k(n, c, k)), abs=1e-15)
            assert pass_hat_k(n, c, k) == pytest.approx(float(enum_pass_hat_k(n, c, k)), abs=1e-15)
            assert pass_hat_k(n, c, k) == pytest.approx(float(product_pass_hat_k(n, c, k)), abs=1e-15)


def test_large_n_matches_exact_rationals():
    # Binomials past 2**53: the estimator must still be the correctly rounded exact value.
    for n, c, k in [(200, 3, 50), (200, 150, 100), (1000, 1, 999), (64, 32, 32)]:
        assert pass_at_k(n, c, k) == float(product_pass_at_k(n, c, k))
        assert pass_hat_k(n, c, k) == float(product_pass_hat_k(n, c, k))


def test_against_scipy_when_installed():
    special = pytest.importorskip("scipy.special")
    for n, c, k in [(10, 3, 4), (16, 0, 8), (16, 16, 3), (50, 7, 20)]:
        expect = 1 - special.comb(n - c, k, exact=True) / special.comb(n, k, exact=True)
        assert pass_at_k(n, c, k) == pytest.approx(expect)
        assert pass_hat_k(n, c, k) == pytest.approx(
            special.comb(c, k, exact=True) / special.comb(n, k, exact=True)
        )


def test_edge_cases():
    assert pass_at_k(5, 5, 3) == pass_hat_k(5, 5, 5) == 1.0  # all correct
    assert pass_at_k(5, 0, 5) == pass_hat_k(5, 0, 1) == 0.0  # none correct
    assert pass_at_k(4, 1, 1) == pass_hat_k(4, 1, 1) == 0.25  # k = 1: the success rate
    assert pass_at_k(4, 2, 3) == 1.0  # fewer failures than k: some sample succeeds
    for fn in (pass_at_k, pass_hat_k):
        with pytest.raises(ValueError, match="more than"):
            fn(3, 1, 4)  # k > n
        with pytest.raises(ValueError, match="at least 1"):
            fn(3, 1, 0)
        with pytest.raises(ValueError):
            fn(3, 4, 1)
    with pytest.raises(ValueError):
        maj_at_k([("a", 1.0)], 2)
    assert ks_upto(1) == [1] and ks_upto(8) == [1, 2, 4, 8] and ks_upto(12) == [1, 2, 4, 8, 12]


def test_maj_at_k_matches_enumeration_with_ties_and_silent_samples():
    rng = random.Random(7)
    for _ in range(120):
        n = rng.randint(1, 9)
        votes = []
        for _ in range(n):
            a = rng.choice(["a", "b", "c", None])
            # Correctness by answer, with one answer sometimes judged differently (fractional groups).
            ok = float(a == "a") if rng.random() < 0.9 else float(rng.random() < 0.5)
            votes.append((a, ok))
        for k in range(1, n + 1):
            assert maj_at_k(votes, k) == pytest.approx(enum_maj_at_k(votes, k), abs=1e-12), (votes, k)


def test_maj_at_k_hand_cases():
    assert maj_at_k([("4", 1.0), ("5", 0.0)], 2) == 0.5  # a 1-1 tie: half right
    assert maj_at_k([("4", 1.0), ("5", 0.0), ("6", 0.0)], 3) == pytest.approx(1 / 3)
    assert maj_at_k([(None, 0.0), (None, 0.0)], 1) == 0.0  # nobody answered
    # k=1: pick one sample; silent ones score 0, so maj@1 is the share of correct answering samples.
    assert maj_at_k([("4", 1.0), (None, 0.0), ("5", 0.0), ("4", 1.0)], 1) == 0.5
    assert maj_at_k([("4", 1.0), ("4", 1.0), ("5", 0.0)], 3) == 1.0


def test_mean_se():
    assert mean_se([]) == (None, None)
    assert mean_se([0.5]) == (0.5, None)
    values = [0.0, 0.25, 1.0, 1.0, 0.5]
    m = sum(values) / 5
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / 4)
    assert mean_se(values) == pytest.approx((m, sd / math.sqrt(5)))


def test_summary_averages_the_per_task_estimates():
    rng = random.Random(3)
    rows, expect = [], {}
    for t in range(9):
        n = 6
        succ = [rng.random() < t / 9 for _ in range(n)]
        expect[f"t{t}"] = (n, sum(succ))
        rows += [{"task_id": f"t{t}", "sample": k, "success": s, "status": "ok"} for k, s in enumerate(succ)]
    rng.shuffle(rows)  # order of lines does not matter
    s = summarize(rows)
    assert list(s.pass_at_k) == [1, 2, 4, 6] and s.tasks == 9 and s.samples == 54
    for k in s.pass_at_k:
        per = [float(enum_pass_at_k(n, c, k)) for n, c in expect.values()]
        assert s.pass_at_k[k] == pytest.approx(sum(per) / 9)
        assert s.pass_at_k_se[k] == pytest.approx(mean_se(per)[1])
        hat = [float(enum_pass_hat_k(n, c, k)) for n, c in expect.values()]
        assert s.pass_hat_k[k] == pytest.approx(sum(hat) / 9)
    assert s.pass_at_1 == pytest.approx(s.pass_at_k[1]) and s.maj_at_k == {}  # no answers recorded
    assert s.pass_at_1_se == pytest.approx(s.pass_at_k_se[1])


def test_non_binary_rewards_threshold_and_mean_reward():
    rewards = {"t1": [0.2, 0.6, 0.9], "t2": [0.1, 0.1, 0.4], "t3": [0.7, None, 1.0]}
    rows = [
        {
            "task_id": t,
            "sample": k,
            "reward": r,
            "success": False,
            "status": "ok" if r is not None else "error",
        }
        for t, rs in rewards.items()
        for k, r in enumerate(rs)
    ]
    as_run = summarize(rows)  # the runner's success field: nothing succeeded
    assert as_run.pass_at_1 == 0.0
    s = summarize(rows, threshold=0.5)
    assert [t.correct for t in s.per_task] == [2, 0, 2]
    assert s.pass_at_1 == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)
    assert s.pass_at_k[3] == pytest.approx(2 / 3)  # t1 and t3 have a success among their 3
    means = [sum([0.2, 0.6, 0.9]) / 3, 0.2, 0.85]  # the errored sample has no reward: left out
    assert s.mean_reward == pytest.approx(sum(means) / 3)
    assert s.mean_reward_se == pytest.approx(mean_se(means)[1])
    assert s.rates["error"] == pytest.approx(1 / 9) and s.counts["error"] == 1


def test_maj_at_k_in_summary_uses_answers_and_answer_fn():
    rows = []
    for t, answers in {"t1": ["x 4", "y 4", "5"], "t2": ["7", "8", None]}.items():
        for k, a in enumerate(answers):
            ok = a is not None and a.endswith("4") if t == "t1" else a == "7"
            rows.append({"task_id": t, "sample": k, "answer": a, "success": ok, "status": "ok"})
    raw = summarize(rows)  # every raw text differs: t1 votes three ways
    assert raw.maj_at_k[1] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert raw.maj_at_k[3] == pytest.approx((2 / 3 + 1 / 2) / 2)
    s = summarize(rows, answer_fn=lambda a: a.split()[-1])  # the final token: "4" wins t1
    assert s.maj_at_k[3] == pytest.approx((1.0 + 0.5) / 2)
    assert s.per_task[0].majority == "4"
    assert s.rates["no_answer"] == pytest.approx(1 / 6)
    with pytest.raises(EvalError, match="answer function failed on task 't1' sample 0"):
        summarize(rows, answer_fn=lambda a: 1 / 0)
    with pytest.raises(EvalError, match="at least 1"):
        summarize(rows, ks=[0, 1])
    with pytest.raises(EvalError, match="more than the 3 samples"):
        summarize(rows, ks=[4])
