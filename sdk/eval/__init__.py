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
run (``python -m sdk.rollout --shard I/N``) are merged by passing all their results files (a summary of some
shards says how much of the task set it covers and names the missing ones). Standard library only:
importing it costs nothing.

Every figure is computed per task from its ``n`` samples (``c`` successful: reward ≥ the success threshold)
and averaged over tasks, so every task weighs the same; ``±`` is the standard error across tasks. Errors and
timeouts are failed samples. pass@k and pass^k are exact averages over all ``C(n, k)`` subsets; maj@k votes
on the returned answer (or what ``--answer-fn`` extracts), ties averaged, samples without an answer not
voting. How to read them: pass@1 ± se is the agent's quality; two runs are compared with :func:`compare`
(both share the tasks), not by overlapping intervals: it pairs them task by task, gives the mean difference,
a 95% paired-bootstrap interval (10,000 resamples, seeded) and a sign-flip permutation p-value, and counts
tasks better / worse / the same. An interval that excludes 0 means B differs beyond what the choice of tasks
and sampling explain; a wide one means more tasks are needed. A rising pass@k with a flat pass@1 means
training made the agent more diverse, not more accurate; pass^k rising towards pass@1, more reliable.

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
