"""``tracerl train --loop loop.yaml --check``: a few samples on the loop's own policy server before a run.

The check starts the policy server the loop would start (on ``model``), runs the first training tasks
``group_size`` times each (a store of their own in ``OUT/check``: nothing of it is trained on), then as many
held-out tasks the same way, stops the server and prints :class:`sdk.rollout.RolloutCheck`'s lines with the
loop's settings: how long one round's collection and a validation take at this pace, peak memory of the
loop's process and its server, how the held-out tasks score against the training ones, and a verdict naming
what to change (warm start, temperature, timeout, group size, a task file whose first tasks were
demonstrated).

Example:
    >>> print(check_loop(LoopConfig.from_yaml("loop.yaml")).format())  # doctest: +SKIP
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

from trainers.errors import UserError

__all__ = ["check_loop", "held_out_notes"]

#: A round's rollouts longer than this are worth a line in the verdict (minutes).
_LONG_ROUND_MIN = 15.0
#: Held-out tasks scoring this much below the training tasks' mean reward get a line in the verdict.
_HELD_OUT_GAP = 0.25


def check_loop(cfg: Any, *, tasks: int = 2) -> Any:
    """Run ``tasks`` training tasks ``cfg.group_size`` times on the loop's policy server; the report.

    Args:
        cfg: A :class:`trainers.loop.LoopConfig`.
        tasks: Training tasks to run (the first ones of ``cfg.tasks``).

    Returns:
        A :class:`sdk.rollout.RolloutCheck` with the loop's projections and notes.

    Raises:
        UserError: Bad settings, a policy server that would not start, an agent that cannot be imported.

    Example:
        >>> check_loop(LoopConfig(agent="a:f", tasks="t.jsonl", model="m"))  # doctest: +SKIP
    """
    import sdk
    from sdk.rollout import RolloutError, check_rollout
    from sdk.rollout._check import took
    from trainers.loop.collect import rollout_spec
    from trainers.loop.config import check_before_loading
    from trainers.loop.pools import load_pools
    from trainers.loop.training import start_policy
    from trainers.quiet import quiet_libraries
    from trainers.serve.policy import export_env, make_policy

    check_before_loading(cfg)
    pool, eval_pool = load_pools(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    quiet_libraries()
    G, C = cfg.group_size, cfg.concurrency
    projections = [("one round's collection", min(cfg.tasks_per_round, len(pool)) * G, C)]
    if eval_pool:
        subset = getattr(cfg, "eval_subset", None)
        during = min(subset, len(eval_pool)) if subset else len(eval_pool)
        projections.append(("a validation", during * cfg.eval_samples, C))
        if during < len(eval_pool):
            projections.append(("first/last validation", len(eval_pool) * cfg.eval_samples, C))
    # The check's store is OUT/check/store; configured before the check so that the check, which configures
    # the store it found back when it ends, leaves no default ./.tracerl behind in the user's directory.
    sdk.configure(store=out / "check" / "store")
    policy = make_policy(cfg.policy, cfg.model, log_dir=str(out / "check"))
    try:
        start_policy(policy, None)
        export_env(policy)
        report = check_rollout(
            rollout_spec(cfg), pool, check_tasks=tasks, workdir=out / "check", projections=projections
        )
        # The training tasks a check runs first may be ones the warm start was taught (the loop takes them
        # in file order): the held-out tasks say where the policy stands.
        held = None
        if eval_pool:
            where = out / "check" / "held-out"
            held = check_rollout(rollout_spec(cfg), eval_pool, check_tasks=tasks, workdir=where)
    except RolloutError as exc:
        raise UserError(str(exc)) from None
    finally:
        policy.stop()
        sdk.flush()
    # The server ran in a child process, now stopped and waited for: its peak counts among the children's.
    scale = 1 if sys.platform == "darwin" else 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
    report.peak_child_rss_bytes = max(report.peak_child_rss_bytes, child)
    report.child = "the policy server"
    rollouts = report.project_s(projections[0][1], C) or 0.0
    if len(projections) > 1:
        rollouts += report.project_s(projections[1][1], C) or 0.0
    report.notes.append(
        f"one round takes ~{took(rollouts)} of rollouts (collection and a validation at "
        f"tasks_per_round {cfg.tasks_per_round}, group_size {G}, concurrency {C}) plus its training"
    )
    if held is not None:
        report.notes += held_out_notes(report, held)
    if rollouts / 60 > _LONG_ROUND_MIN:
        report.notes.append(
            "that is long: fewer tasks_per_round, a smaller eval_subset, or more concurrency if the server "
            "keeps up"
        )
    return report


def held_out_notes(train: Any, held: Any) -> list[str]:
    """The verdict's lines on the held-out tasks' samples (``held``) beside the training tasks' (``train``).

    Example:
        >>> from sdk.rollout import RolloutCheck
        >>> g = lambda rewards: {"task_id": "t", "rewards": rewards, "mean": sum(rewards) / 2, "spread": 0.5}
        >>> notes = held_out_notes(RolloutCheck(samples=2, group_size=2, groups=[g([1.0, 1.0])]),
        ...                        RolloutCheck(samples=2, group_size=2, groups=[g([0.0, 0.0])]))
        >>> notes[0]
        'held-out: 1 task x 2 samples, mean reward 0.00 (training tasks 1.00)'
    """
    mean = _mean_reward(held)
    if mean is None:
        return []
    base = _mean_reward(train)
    share = held.malformed_share
    n = len(held.groups)
    line = f"held-out: {n} task{'s' * (n != 1)} x {held.group_size} samples, mean reward {mean:.2f}"
    line += "" if base is None else f" (training tasks {base:.2f})"
    line += "" if not share else f", {100 * share:.0f}% of tool calls malformed"
    notes = [line]
    if base is not None and base - mean > _HELD_OUT_GAP:
        notes.append(
            "the held-out tasks score far below the first training tasks: if those were demonstrated in "
            "the warm start, the first rounds train on what the model already knows; shuffle the task file "
            "and keep the demonstrated tasks out of it"
        )
    return notes


def _mean_reward(check: Any) -> float | None:
    rewards = [x for g in check.groups for x in g["rewards"]]
    return sum(rewards) / len(rewards) if rewards else None
