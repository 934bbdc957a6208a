"""The per-task estimators: unbiased pass@k, pass^k, maj@k, and the mean with its standard error.

Each takes one task's samples (``n`` attempts, ``c`` of them successful) and returns the probability that
a uniformly random ``k``-subset of those samples has the property, computed exactly with
:func:`math.comb` (no sampling). Averaging a task's estimate over tasks gives the benchmark's figure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence

__all__ = ["ks_upto", "maj_at_k", "mean_se", "pass_at_k", "pass_hat_k"]


def _check(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if k > n:
        raise ValueError(f"k={k} is more than the n={n} samples of a task")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: the chance that at least one of ``k`` samples (of ``n``, ``c`` correct) succeeds.

    ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").
    pass@1 is ``c / n``.

    Raises:
        ValueError: ``k < 1``, ``k > n`` or counts out of range.

    Example:
        >>> pass_at_k(4, 1, 2)
        0.5
    """
    _check(n, c, k)
    if n - c < k:
        return 1.0
    total = math.comb(n, k)
    # One int / int division: correctly rounded in Python, however large the binomials.
    return (total - math.comb(n - c, k)) / total


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: the chance that all of ``k`` samples (of ``n``, ``c`` correct) succeed, ``C(c, k) / C(n, k)``.

    The reliability figure of τ-bench (Yao et al. 2024); pass^1 equals pass@1. Same arguments and errors
    as :func:`pass_at_k`.

    Example:
        >>> pass_hat_k(4, 3, 2), pass_hat_k(4, 1, 2)
        (0.5, 0.0)
    """
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def maj_at_k(votes: Sequence[tuple[Hashable | None, float]], k: int) -> float:
    """maj@k: how often the most frequent answer among ``k`` of the task's samples is correct.

    Args:
        votes: One ``(answer, success)`` pair per sample; ``answer`` is any hashable key (``None``: the
            sample gave no answer and does not vote), ``success`` 0/1 (or a fraction).
        k: Samples per vote.

    Returns:
        The expectation, over all ``C(n, k)`` subsets of ``k`` samples, of the majority answer's
        correctness. An answer's correctness is the mean success of the samples that gave it (0 or 1 when
        the reward depends on the answer alone). When several answers tie for the most votes, the subset
        scores the mean correctness of the tied answers (what a random tie-break gets on average); a
        subset in which nobody answered scores 0.

    Raises:
        ValueError: ``k < 1`` or ``k`` more than the samples.

    Example:
        >>> maj_at_k([("4", 1), ("4", 1), ("5", 0)], 3)
        1.0
        >>> maj_at_k([("4", 1), ("5", 0)], 2)  # a tie: half the time right
        0.5
    """
    return _maj_all(votes, [k])[k]


def _maj_all(votes: Sequence[tuple[Hashable | None, float]], ks: Sequence[int]) -> dict[int, float]:
    """maj@k for every k in ``ks`` from one pass (a dynamic programme over the answer groups).

    A subset is described by how many samples it takes from each answer group; the number of subsets with
    given counts ``j_g`` is the product of ``C(m_g, j_g)``. The state after some groups is (samples taken,
    the largest count so far, how many groups have it) and holds the number of subsets ``W`` and the sum
    over them of the correctness summed over the groups at the largest count ``S``; a finished subset
    scores ``S / ties``.
    """
    n = len(votes)
    for k in ks:
        _check(n, 0, k)
    kmax = max(ks)
    groups: dict[Hashable, list[float]] = {}
    silent = 0
    for answer, ok in votes:
        if answer is None:
            silent += 1
        else:
            groups.setdefault(answer, []).append(float(ok))
    # Samples without an answer: any number of them may be in the subset; they never lead.
    states: dict[tuple[int, int, int], list[float]] = {}
    for j in range(min(silent, kmax) + 1):
        states[(j, 0, 0)] = [math.comb(silent, j), 0.0]
    for oks in groups.values():
        m, r = len(oks), statistics.fmean(oks)
        nxt: dict[tuple[int, int, int], list[float]] = {}
        for (total, top, ties), (w, s) in states.items():
            for j in range(min(m, kmax - total) + 1):
                ways = math.comb(m, j)
                if j > top:
                    key, ns = (total + j, j, 1), w * ways * r
                elif j == top and j > 0:
                    key, ns = (total + j, top, ties + 1), s * ways + w * ways * r
                else:
                    key, ns = (total + j, top, ties), s * ways
                cell = nxt.setdefault(key, [0, 0.0])
                cell[0] += w * ways
                cell[1] += ns
        states = nxt
    out: dict[int, float] = {}
    for k in ks:
        score = sum(s / ties for (total, _, ties), (_, s) in states.items() if total == k and ties)
        out[k] = score / math.comb(n, k)
    return out


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean and its standard error ``stdev / sqrt(len)`` (``None`` where undefined).

    Example:
        >>> mean_se([1.0, 0.0, 1.0, 1.0])
        (0.75, 0.25)
    """
    if not values:
        return None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def ks_upto(n: int) -> list[int]:
    """The k values reported for ``n`` samples per task: 1, 2, 4, … up to ``n``, and ``n`` itself.

    Example:
        >>> ks_upto(6)
        [1, 2, 4, 6]
    """
    ks = [1 << i for i in range(n.bit_length())]
    return ks + [n] if ks and ks[-1] != n else ks
