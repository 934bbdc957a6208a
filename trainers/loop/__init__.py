"""The in-situ training loop: rollout → export → train → serve → validate, round after round.

``python -m trainers.loop CONFIG.yaml`` (or :func:`run_loop`) points the loop at any agent function and
task file. Each round:

1. the policy server serves the current weights (:mod:`trainers.serve.policy`; agents read its address from
   ``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL``);
2. ``sdk.rollout`` runs the agent ``group_size`` times on each of this round's training tasks (split
   ``round-N``);
3. the round's groups with reward spread (:class:`~trainers.data.stream.StreamingSource` on the store, no
   staleness: collection waits while a version trains) become episodes in memory;
4. one training round on the loop's resident trainer (:mod:`trainers.loop.training`: built at the first
   round and kept, so the model, optimizer, schedule and RNG carry over; ``train:`` holds the keys of
   ``python -m sdk.train``'s ``--config`` file); ``backend: ray`` trains a new run per round instead, on
   the round's episodes written to ``episodes/round-N.parquet``;
5. the new weights are pushed to the policy server as tensors (LoRA: the adapter's only), and every
   ``checkpoint_every`` rounds (1) a recovery checkpoint is written and the round committed;
6. every ``eval_every`` rounds (and before the first), the runner evaluates the validation tasks
   (split ``eval-round-N``; nothing is trained on them).

``mode: async`` (or ``--mode async``) is the same loop with collection and training overlapping: groups at
most ``max_staleness`` versions old, truncated importance sampling on the stored tokens
(:mod:`trainers.loop.driver` says both modes' rules).

Curriculum (``curriculum: true``, the keys ``tracerl train`` has, counted in rounds here): a round draws its
tasks from the easiest ``curriculum_start`` share of the training tasks, ranked by their mean reward in
earlier rounds (tasks not tried yet rank with the average), and the share widens by
``curriculum_expand_by`` every ``curriculum_expand_every`` rounds.

Malformed tool calls (a call whose answer opens a ``<tool_call>`` the policy server could not parse: the
agent's framework takes the text as its answer; ``sdk.messages.malformed_tool_call``) are counted: the
table's ``malformed val/train`` column and each row's ``malformed_share`` / ``malformed_tool_calls`` (training
samples) and ``val_malformed_share`` (validation). ``malformed_tool_call_penalty: 0.5`` subtracts 0.5 from
the reward of a training sample with one, so RL learns the call format as well as the decision (off by
default; validation is never shaped).

Outputs in ``out``: ``metrics.jsonl`` (one line per round, appended as it finishes), ``progress.png``
(train reward and validation success per round), ``state.json`` (the last committed round, its version
and checkpoint: re-running the same command continues after it), ``trained_samples.jsonl`` /
``dropped_samples.jsonl`` (each sample trained once, by which version, or dropped with its reason),
``store/``, ``rollouts/`` (the runner's results files) and ``train/`` (the trainer's log,
``checkpoint-<step>/``, ``final/``).

Config keys: see :class:`LoopConfig` (``tracerl train --loop --help`` lists them). Example ``loop.yaml``::

    agent: my_agent:solve
    tasks: data/train.jsonl
    eval_tasks: data/eval.jsonl
    reward_fn: my_agent:score
    model: ./my-model
    out: runs/loop
    rounds: 6
    tasks_per_round: 32
    group_size: 8
    curriculum: true
    train: {lora: true, grpo: {learning_rate: 1e-5, beta: 0}}

Example:
    >>> from trainers.loop import run_loop
    >>> result = run_loop("loop.yaml")  # doctest: +SKIP
    >>> result["rows"][-1]["val_success"]  # doctest: +SKIP
    0.62

The package: :mod:`~trainers.loop.config` (settings and checks), :mod:`~trainers.loop.driver` (the loop,
both modes), :mod:`~trainers.loop.rounds` (what only lock-step rounds have), :mod:`~trainers.loop.collect`
(the asynchronous collector's process), :mod:`~trainers.loop.run` (a run's files, clock and training
side), :mod:`~trainers.loop.training` (the resident trainer), :mod:`~trainers.loop.validation`,
:mod:`~trainers.loop.table` (the table and plot), :mod:`~trainers.loop.pools` (task pools),
:mod:`~trainers.loop.check` (``--check``) and :mod:`~trainers.loop.cli` (the command).
"""

from __future__ import annotations

from trainers.loop.cli import main
from trainers.loop.config import LoopConfig, check_before_loading
from trainers.loop.driver import run_loop
from trainers.loop.rounds import select_tasks

__all__ = ["LoopConfig", "check_before_loading", "main", "run_loop", "select_tasks"]
