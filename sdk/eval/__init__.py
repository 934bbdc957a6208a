"""Evaluation you can trust: pass@k, pass^k and maj@k with standard errors, and "is B better than A?".

Over the results file(s) of ``python -m sdk.rollout`` (tasks × samples):

- **pass@1** (= avg@n, the mean success rate over tasks) with its standard error across tasks;
- **pass@k**, unbiased: ``1 - C(n-c, k) / C(n, k)`` per task (Chen et al. 2021), for k = 1, 2, 4, … ≤ n;
- **pass^k**: ``C(c, k) / C(n, k)``, all k samples succeed (τ-bench, Yao et al. 2024);
- **maj@k**: the most frequent answer among k samples is correct, ties averaged (see :func:`maj_at_k`);
- mean reward ± standard error, rates of errors / timeouts / no answer, and per sample the LLM calls,
  tokens and latency (p50 / p95) read from the store;
- :func:`compare`: the paired difference in pass@1 over shared tasks with a bootstrap interval and a
  permutation p-value.

``python -m sdk.eval summarize RESULTS...`` and ``python -m sdk.eval compare A B`` print them; shards of a
run (``python -m sdk.rollout --shard I/N``) are merged by passing all their results files. Standard
library only: importing it costs nothing.

Example:
    >>> from sdk.eval import compare, summarize
    >>> base = [{"task_id": f"t{i}", "sample": k, "success": i + k < 6} for i in range(8) for k in range(4)]
    >>> s = summarize(base)
    >>> round(s.pass_at_1, 3), round(s.pass_at_k[4], 3)
    (0.562, 0.75)
"""

from __future__ import annotations

from sdk.eval._compare import Comparison, compare
from sdk.eval._estimators import maj_at_k, mean_se, pass_at_k, pass_hat_k
from sdk.eval._results import EvalError, load_results, metrics_path, parse_shard, shard_of
from sdk.eval._summary import EvalSummary, TaskMetrics, summarize

__all__ = [
    "Comparison",
    "EvalError",
    "EvalSummary",
    "TaskMetrics",
    "compare",
    "load_results",
    "maj_at_k",
    "mean_se",
    "metrics_path",
    "parse_shard",
    "pass_at_k",
    "pass_hat_k",
    "shard_of",
    "summarize",
]
