"""Run an agent over a task set: G samples per task, each in its own session, resumable.

``python -m sdk.rollout AGENT TASKS`` (or :func:`run_rollout` in Python, given a :class:`RolloutSpec`: the
agent, reward function, group size, concurrency and timeout, the CLI's flags of those names) calls the
agent function ``module:function`` once per (task, sample) inside ``sdk.session(task_id=..., sample=k,
split=...)``, so whatever the agent's integration captures lands in the store grouped for GRPO. The agent
takes the task dict and returns an answer (scored by ``--reward-fn module:function(task, answer)``) or calls
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

``--continuous`` (:func:`run_continuous` in Python) keeps ``--concurrency`` samples in flight, cycling over
the tasks (each visit of a task runs its next ``group_size`` samples, with fresh sample indices) until
SIGINT/SIGTERM or its ``stop`` event; the samples in flight then finish and it exits 0. Its results file and
store are the batch runner's and it resumes the same way, running the missing samples of the groups a kill
left part-done before anything else. Each sample reads ``TRACERL_POLICY_BASE_URL`` and
``TRACERL_POLICY_MODEL`` at its start (:func:`policy_endpoint`); the loop keeps both the same for the whole
run (a new version is served under the same name), so an agent need not read them per call.

The summary adds the :mod:`sdk.eval` figures (pass@1 ± standard error, pass@k, pass^k, maj@k, rates,
calls/tokens/latency per sample), also written to ``<results>.metrics.json``. ``--shard I/N`` runs the
I-th of N disjoint slices of the tasks (by a hash of the task id), so N machines cover the task set;
``python -m sdk.eval summarize`` merges their results files into the numbers of one run.

``--check`` runs the first two tasks ``--group-size`` times each in a store of its own and prints what
decides whether a run can learn: model calls per sample, tool calls parsed and malformed, each group's
reward mean and spread, seconds per call, how long the whole rollout will take, peak memory, and a verdict
(:func:`check_rollout`).

Usage::

    python -m sdk.rollout my_agent:solve tasks.jsonl --group-size 8 --concurrency 16 --timeout 120
        --reward-fn my_agent:score --store .tracerl --split train
    python -m sdk.rollout my_agent:solve eval.jsonl --split eval --json
    python -m sdk.rollout my_agent:solve tasks.jsonl --continuous --group-size 8 --concurrency 16

Task files: JSON lines, Parquet, a directory saved with ``datasets.save_to_disk``, or ``hf:NAME[:SPLIT]``
(``datasets.load_dataset``). Each task is a dict with an id (``--id-field``, default ``id``, else
``task_id``).

Results line fields: ``task_id``, ``sample``, ``split``, ``status`` (``ok``, ``error``, ``timeout``,
``reward_error``, ``no_reward``), ``reward``, ``rewards`` (named values), ``success``, ``answer``,
``error``, ``session_id``, ``seconds``, ``ts``, ``tool_calls`` (parsed by the server) and
``malformed_tool_calls`` (calls whose answer opened a tool call the server could not parse; the summary
shows their share). Session metadata :data:`MALFORMED_TOOL_CALL_PENALTY` (a number) lowers the reward of a
sample with such a call by that much (the loop's ``malformed_tool_call_penalty``).

Example:
    >>> from sdk.rollout import RolloutSpec, run_rollout
    >>> spec = RolloutSpec(lambda t: t["x"] * 2, group_size=2, reward_fn=lambda t, a: float(a == 4))
    >>> summary = run_rollout(spec, [{"id": "t1", "x": 2}], results="r.jsonl")  # doctest: +SKIP
    >>> summary.success_rate  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

from sdk.rollout._check import RolloutCheck, check_rollout
from sdk.rollout._cli import build_parser, main
from sdk.rollout._continuous import run_continuous
from sdk.rollout._run import run_rollout
from sdk.rollout._sample import MALFORMED_TOOL_CALL_PENALTY, PolicyEndpoint, policy_endpoint
from sdk.rollout._spec import RolloutSpec
from sdk.rollout._summary import RolloutSummary, read_results, summarize
from sdk.rollout._tasks import RolloutError, SampleTimeout, load_function, load_tasks

__all__ = [
    "MALFORMED_TOOL_CALL_PENALTY",
    "PolicyEndpoint",
    "RolloutCheck",
    "RolloutError",
    "RolloutSpec",
    "RolloutSummary",
    "SampleTimeout",
    "build_parser",
    "check_rollout",
    "load_function",
    "load_tasks",
    "main",
    "policy_endpoint",
    "read_results",
    "run_continuous",
    "run_rollout",
    "summarize",
]
