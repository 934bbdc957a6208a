"""Converted episodes → GRPO groups of G episodes per (task, role), with their advantages.

The role is the episode's agent name. A task whose episodes all have one role (single-agent data) keeps the
task id as group id; a task with several roles (a router thread and a specialist thread per session) gets one
group per role, ``f"{task}|{role}"``: comparing a router's reply with a specialist's says nothing.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from sdk.episodes import (
    group_advantages,
)
from trainers.data._report import DataReport
from trainers.data._sequence import ConvertedEpisode, Group
from trainers.errors import UserError

__all__ = ["build_groups"]


# ------------------------------------------------------------------------------------------------ grouping


def _by_sample(episodes: list[ConvertedEpisode], rep: DataReport) -> list[ConvertedEpisode]:
    """One group member per sample and role: the threads of one session's role merged (they share its reward).

    An agent that truncates or summarises its context, or hands work to a sub-agent, leaves one sample as
    several threads (episodes). Counted as several samples they would each carry the full reward, weigh
    that sample several times in the group's mean and standard deviation, and make group sizing count
    samples that were never run. Merged, the sample is one member whose sequences (each thread's, with its
    own ``episode_id``) share one advantage; its reward is the mean of its threads' rewards (the same
    value when the reward is the session's).
    """
    by_session: dict[tuple[str, str | None], list[ConvertedEpisode]] = defaultdict(list)
    out: list[ConvertedEpisode] = []
    for ep in episodes:
        if ep.session_id is None:
            out.append(ep)
        else:  # the threads of other roles are other group members (grouped per role)
            by_session[(ep.session_id, ep.role)].append(ep)
    for threads in by_session.values():
        if len(threads) == 1:
            out.append(threads[0])
            continue
        threads = sorted(threads, key=lambda e: e.episode_id)
        rep.multi_thread_samples += 1
        first = threads[0]
        rewards = [float(t.reward) for t in threads if t.reward is not None]
        out.append(
            ConvertedEpisode(
                episode_id=first.episode_id,
                task_id=first.task_id,
                reward=sum(rewards) / len(rewards) if rewards else None,
                sequences=[s for t in threads for s in t.sequences],
                per_turn=True,  # several sequences: spread over units with precomputed advantages
                faithful=all(t.faithful for t in threads),
                truncated=any(t.truncated for t in threads),
                path=first.path,
                session_id=first.session_id,
                threads=threads,
                role=first.role,
            )
        )
    return out


def _split_task(
    eps: list[ConvertedEpisode],
    G: int,
    overflow: Literal["split", "trim"],
    underflow: Literal["resample", "drop", "smaller"],
    rng: random.Random,
    rep: DataReport,
) -> list[list[ConvertedEpisode]]:
    """One task's episodes as chunks of at most G (more than G: split or trimmed, as ``overflow`` says)."""
    if len(eps) <= G:
        return [eps]
    rng.shuffle(eps)
    if overflow == "trim":
        rep.episodes_trimmed += len(eps) - G
        return [eps[:G]]
    chunks = [eps[i : i + G] for i in range(0, len(eps), G)]
    rep.groups_split += 1
    if len(chunks[-1]) < 2 or underflow == "drop" and len(chunks[-1]) < G:  # "smaller" keeps 2..G-1
        rep.episodes_trimmed += len(chunks[-1])
        chunks.pop()
    return chunks


def _by_task_and_role(
    episodes: Sequence[ConvertedEpisode],
) -> dict[str, tuple[str, list[ConvertedEpisode]]]:
    """Usable episodes keyed by group key: the task id, or ``task|role`` for a task with several roles."""
    by_task: dict[str, dict[str | None, list[ConvertedEpisode]]] = defaultdict(lambda: defaultdict(list))
    for ep in episodes:
        if ep.task_id is not None and ep.reward is not None and ep.sequences:
            by_task[ep.task_id][ep.role].append(ep)
    out: dict[str, tuple[str, list[ConvertedEpisode]]] = {}
    for task, roles in by_task.items():
        if len(roles) == 1:
            out[task] = (task, next(iter(roles.values())))
            continue
        for role, eps in roles.items():
            out[f"{task}|{role}"] = (task, eps)
    return out


def _assign(groups: list[Group]) -> None:
    """Give each group's sequences their group id, role and advantage (within the group)."""
    for g in groups:
        advantages = group_advantages([float(ep.reward or 0.0) for ep in g.episodes])
        for ep, adv in zip(g.episodes, advantages, strict=True):
            for s in ep.sequences:
                s.group_id = g.group_id
                s.advantage = adv
                s.role = ep.role


def build_groups(
    episodes: Sequence[ConvertedEpisode],
    group_size: int,
    *,
    overflow: Literal["split", "trim"] = "split",
    underflow: Literal["resample", "drop", "smaller"] = "resample",
    filter_zero_std: bool = True,
    seed: int = 0,
    report: DataReport | None = None,
) -> tuple[list[Group], DataReport]:
    """Group converted episodes by (task, role) into GRPO groups of exactly ``group_size`` episodes.

    A task with several roles (agent names) is grouped per role (group id ``task|role``); each sequence gets
    its group id, advantage and role. A group member is a sample (one session's threads of a role merged,
    :func:`_by_sample`). Tasks (per role) with fewer than 2 episodes are dropped.
    A task with more than G episodes is split into several groups of G (``overflow="split"``; leftovers
    fill a last group by resampling or are left out) or reduced to a random G (``"trim"``).
    A task with 2..G-1 episodes is filled up by resampling with replacement (``underflow="resample"``),
    dropped (``"drop"``), or kept as a smaller group (``"smaller"``: its advantages over its own episodes;
    the replay trainer fills its block with fully masked rows). Groups whose rewards are all equal carry no
    learning signal (zero advantage) and are dropped when ``filter_zero_std``. Every change is counted in the
    report; advantages come from :func:`sdk.episodes.group_advantages`.

    Args:
        episodes: Output of :func:`convert_episodes`.
        group_size: Group size G (≥ 2).
        overflow: Policy for tasks with more than G episodes.
        underflow: Policy for tasks with fewer than G episodes.
        filter_zero_std: Drop groups without reward spread.
        seed: Seed for the trimming/resampling choices (deterministic).
        report: Report to update (a new one when ``None``).

    Returns:
        ``(groups, report)``; groups are sorted by group id.

    Example:
        >>> from trainers.data import TrainingSequence
        >>> seq = lambda i: [TrainingSequence("t", f"e{i}")]
        >>> eps = [ConvertedEpisode(f"e{i}", "t", float(i % 2), seq(i)) for i in range(3)]
        >>> groups, rep = build_groups(eps, 4)
        >>> len(groups[0].episodes), rep.duplicates_added
        (4, 1)
    """
    if group_size < 2:
        raise UserError(f"group_size must be at least 2 for GRPO, got {group_size}")
    rep = report or DataReport()
    rng = random.Random(seed)
    usable = [ep for ep in episodes if ep.task_id is not None and ep.reward is not None and ep.sequences]
    by_task = _by_task_and_role(_by_sample(usable, rep))
    rep.tasks = len({task for task, _ in by_task.values()})
    G = group_size
    groups: list[Group] = []
    for key in sorted(by_task):
        task, eps = by_task[key]
        eps = sorted(eps, key=lambda e: e.episode_id)
        if len(eps) < 2:
            rep.tasks_too_small += 1
            continue
        chunks = _split_task(eps, G, overflow, underflow, rng, rep)
        for n, chunk in enumerate(chunks):
            if len(chunk) < G and underflow == "drop":
                rep.groups_dropped_small += 1
                continue
            if len(chunk) < G and underflow == "smaller":  # trained as it is (the replay pads its block)
                rep.groups_smaller += 1
            elif len(chunk) < G:
                extra = [rng.choice(chunk) for _ in range(G - len(chunk))]
                rep.groups_resampled += 1
                rep.duplicates_added += len(extra)
                chunk = chunk + extra
            gid = key if len(chunks) == 1 else f"{key}#{n}"
            groups.append(Group(gid, task, list(chunk)))
    if filter_zero_std:
        kept = [g for g in groups if g.reward_std > 1e-8]
        rep.groups_zero_std_filtered += len(groups) - len(kept)
        groups = kept
    _assign(groups)
    rep.groups = len(groups)
    return groups, rep
