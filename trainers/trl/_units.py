"""Groups → units (dataset rows of G sequences) and the rollout function that replays them."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdk.episodes import group_advantages
from trainers.data import Group, TrainingSequence

__all__ = ["build_units", "make_rollout_func", "stored_reward"]


@dataclass
class _Unit:
    """One dataset row: the G sequences TRL sees as one block (a group, or a share of a per-turn group).

    A sequence's ``advantage`` is ``None`` when TRL computes it from the block's rewards (a whole group of
    one-sequence episodes), else precomputed (per-turn groups and their padding).
    """

    group: Group
    seqs: list[TrainingSequence]


def _replayed(s: TrainingSequence, reward: float | None, advantage: float | None) -> TrainingSequence:
    """``s`` as replayed: its episode's reward and the advantage TRL is given (``None``: TRL computes it)."""
    return dataclasses.replace(s, reward=float(reward or 0.0), advantage=advantage)


def build_units(
    groups: list[Group], group_size: int, *, scale_rewards: str = "group", eos_token_id: int = 0
) -> list[_Unit]:
    """Pack groups into dataset rows of exactly ``group_size`` sequences each.

    A group of G episodes of one sequence each is one unit (TRL computes its advantages). A group with
    per-turn sequences, or with fewer than G episodes, is spread over units with precomputed advantages,
    padded with fully masked dummy sequences.

    Example:
        >>> from trainers.data import ConvertedEpisode
        >>> def ep(i):
        ...     seq = TrainingSequence("t", f"e{i}", [1], [2], [1])
        ...     return ConvertedEpisode(f"e{i}", "t", float(i), [seq])
        >>> eps = [ep(0), ep(1)]
        >>> [len(u.seqs) for u in build_units([Group("t", "t", eps)], 2)]
        [2]
    """
    G = group_size
    all_rewards = [r for g in groups for r in g.rewards]
    batch_std = statistics.stdev(all_rewards) if len(all_rewards) > 1 else 0.0
    units: list[_Unit] = []
    for g in groups:
        if not g.per_turn and len(g.episodes) == G:
            seqs = [_replayed(s, ep.reward, None) for ep in g.episodes for s in ep.sequences]
            units.append(_Unit(g, seqs))
            continue
        # Per-turn sequences, or a group smaller than G: advantages over its own episodes, precomputed.
        rewards = [float(ep.reward or 0.0) for ep in g.episodes]
        std = batch_std if scale_rewards == "batch" else None
        advantages = group_advantages(rewards, scale=str(scale_rewards) in ("group", "batch"), std=std)
        seqs = []
        for ep, r, adv in zip(g.episodes, rewards, advantages, strict=True):
            seqs += [_replayed(s, r, adv) for s in ep.sequences]
        mean = g.mean_reward
        while len(seqs) % G:
            # A one-token, fully masked sequence: fills the block; no gradient and no trained tokens.
            pad = TrainingSequence(
                g.group_id, "<pad>", seqs[0].prompt_ids, [eos_token_id], [0], None, mean, 0.0
            )
            seqs.append(pad)
        units += [_Unit(g, seqs[i : i + G]) for i in range(0, len(seqs), G)]
    return units


def _write_episode_paths(path: Path, prepared: Any) -> None:
    """Write one line per grouped episode: how it became tokens, and whether its behaviour logprobs count.

    ``path``: ``exact_ids``, ``rerender_match``, ``rerender_differs`` (``differs`` says why) or ``template``.
    """
    seen: set[str] = set()
    with path.open("w") as f:
        for group in [*prepared.groups, *prepared.eval_groups]:
            # A sample of several threads is one group member; each thread is written.
            for ep in (t for member in group.episodes for t in member.threads or [member]):
                if ep.episode_id in seen:  # resampling can repeat an episode in its group
                    continue
                seen.add(ep.episode_id)
                row = {
                    "episode_id": ep.episode_id,
                    "session_id": ep.session_id,
                    "task_id": ep.task_id,
                    "path": ep.path,
                    "differs": ep.differs,
                    "faithful": ep.faithful,
                    # no token ids, mismatch (the ids differ from this tokenizer), logprobs_length_mismatch
                    "unfaithful_reason": None if ep.faithful else ep.unfaithful_reason,
                    "per_turn": ep.per_turn,
                    "sequences": len(ep.sequences),
                }
                f.write(json.dumps(row) + "\n")


def make_rollout_func(units: list[_Unit], group_size: int, *, behaviour_logprobs: bool = True) -> Any:
    """Build the ``rollout_func`` that replays ``units`` (dataset column ``unit`` indexes them).

    The prompts arrive repeated G times in contiguous blocks; slot ``(process_index * len(prompts) + i) % G``
    of the block gets the unit's sequence at that index, so a block never mixes groups across processes.

    Example:
        >>> fn = make_rollout_func([], 4)
        >>> callable(fn)
        True
    """
    G = group_size

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        rows = trainer._replay_rows
        base = trainer.accelerator.process_index * len(prompts)
        picked = [units[int(rows[i]["unit"])].seqs[(base + i) % G] for i in range(len(prompts))]
        logprobs = None
        if behaviour_logprobs and any(s.logprobs is not None for s in picked):
            # NaN = "unknown behaviour logprob": the trainer falls back to the policy's own log-prob there.
            logprobs = [
                s.logprobs if s.logprobs is not None else [math.nan] * len(s.completion_ids) for s in picked
            ]
        return {
            "prompt_ids": [s.prompt_ids for s in picked],
            "completion_ids": [s.completion_ids for s in picked],
            "env_mask": [s.loss_mask for s in picked],  # TRL's name for the loss mask
            "logprobs": logprobs,
            "stored_reward": [s.reward for s in picked],
            "replay_advantage": [math.nan if s.advantage is None else s.advantage for s in picked],
            "episode_id": [s.episode_id for s in picked],
        }

    return rollout_func


def stored_reward(
    prompts: Any = None, completions: Any = None, stored_reward: Any = None, **kwargs: Any
) -> list:
    """Reward function that returns the episode's stored reward (replay: nothing is re-scored).

    Example:
        >>> stored_reward(stored_reward=[1, 0.5])
        [1.0, 0.5]
    """
    return [float(r) for r in stored_reward]
