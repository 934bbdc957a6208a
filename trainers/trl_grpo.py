"""GRPO on stored episodes with TRL's ``GRPOTrainer`` (replay: no generation during training).

How it works. TRL 1.16.0's ``rollout_func`` contract (``_generate`` in ``trl/trainer/grpo_trainer.py``): it is
called once per generation batch with the dataset prompts already repeated G times in contiguous blocks; it
returns ``prompt_ids``, ``completion_ids`` and ``logprobs`` (``None`` allowed) for every prompt; an
``env_mask`` becomes TRL's ``tool_mask`` (``loss_mask = completion_mask * tool_mask``); extra keys reach the
reward functions as keyword arguments. ``logprob_token_ids`` is not returned: TRL 1.16 reads no such key
from a ``rollout_func`` (only its docstring names it), so it would only reach reward functions. On top of it:

- Each task group of ``num_generations`` (G) episodes is one dataset row (a *unit*). TRL's ``RepeatSampler``
  repeats every row G times in a contiguous block; the ``rollout_func`` answers slot ``i`` of a block with the
  group's ``i``-th stored episode: ``prompt_ids``, ``completion_ids``, ``env_mask`` (1 = model token, 0 = tool
  result / template glue: no gradient), behaviour ``logprobs`` and the stored reward, which a reward function
  returns as is. TRL then computes group-relative advantages and the clipped GRPO loss.
- Without vLLM, TRL uses rollout logprobs only for ``off_policy_mask_threshold`` and sets the "old" policy to
  the current one (ratio 1). :class:`ReplayGRPOTrainer` (private API, hence pinned ``trl==1.16.0``,
  ``transformers==5.23.0`` and a contract test) makes the clipped ratio ``π_θ / π_behaviour`` when the stored
  episodes are token-faithful, which also makes ``num_iterations > 1`` meaningful. Tokens without a known
  behaviour logprob fall back to the policy's own log-prob at generation time (ratio 1).
- Episodes that are not append-only under the target template become per-turn sequences; their group's
  advantages are computed here (:func:`sdk.episodes.group_advantages`, following ``scale_rewards``) and
  packed G per row, padded with fully masked dummies; the subclass overrides TRL's advantages for those rows.

Multi-GPU: ``accelerate launch -m sdk.train --data ... --model ...`` (one process per GPU; groups never
straddle processes incorrectly because slot indices use the process index; ``trained_episodes.jsonl`` records
every process's share of each generation batch). On CUDA the defaults are: ``bf16`` autocast when supported,
activation checkpointing on, liger's layer kernels when ``liger-kernel`` is installed, and for LoRA a bf16
frozen base with LoRA inputs kept in bf16 (see :func:`_lora_inputs_in_autocast_dtype`). On CPU none of these
apply. ``micro_batch_size`` splits each device's batch into length-sorted micro-batches without padding
columns (same update; less activation memory, so checkpointing can be turned off).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sdk.episodes import group_advantages
from trainers.base import PreparedData, TrainerConfig, TrainResult, prepare_data
from trainers.data import Group, TrainingSequence
from trainers.errors import UserError

__all__ = [
    "TRLGRPOConfig",
    "TRLGRPOTrainer",
    "build_units",
    "make_rollout_func",
    "replay_sampler",
    "replay_trainer_class",
]

# Fields tracerl owns at the top level of the config; in `grpo` they must agree with it.
_OWNED = {"output_dir": "output_dir", "seed": "seed", "num_generations": "num_generations"}


@dataclass
class TRLGRPOConfig(TrainerConfig):
    """Configuration of the ``trl`` backend: :class:`~trainers.base.TrainerConfig` plus TRL specifics.

    Parameters that control the policy update:
        behaviour_logprobs: clip against the stored behaviour logprobs of token-faithful episodes.
        min_advantage: clamp advantages from below (0.0 = positive-only); None = signed GRPO advantages.
        grpo: any ``trl.GRPOConfig`` field, passed through (e.g. ``learning_rate``, ``loss_type``,
            ``beta``, ``num_iterations``, ``epsilon_high``, ``max_steps``, ``per_device_train_batch_size``,
            ``save_steps``).

    Parameters that control speed and memory (results stay the same within tolerance):
        micro_batch_size: split each device's batch into micro-batches of this many sequences, sorted by
            length and stripped of padding columns (gradient accumulation inside a GRPO group).
        bf16_weights: load the weights in bf16 (halves weight, gradient and optimizer memory).

    Parameters that control LoRA (peft):
        lora, lora_r, lora_alpha, lora_dropout, lora_target_modules.

    Example:
        >>> cfg = TRLGRPOConfig(model="./tiny", grpo={"learning_rate": 1e-5, "max_steps": 10}, lora=True)
        >>> cfg.grpo["max_steps"], cfg.lora_r
        (10, 16)
    """

    behaviour_logprobs: bool = field(
        default=True,
        metadata={
            "help": "Use stored behaviour logprobs of token-faithful episodes as the clipping reference "
            "(π_θ/π_behaviour); otherwise the ratio starts at 1 each update."
        },
    )
    min_advantage: float | None = field(
        default=None,
        metadata={
            "help": "Clamp advantages from below (e.g. 0.0: reinforce better-than-group episodes and never "
            "push failed ones down, a filtered-behaviour-cloning-like variant that is stabler for small "
            "models); None keeps GRPO's signed advantages."
        },
    )
    micro_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Sequences per forward/backward pass: each device's batch (whole GRPO groups) is "
            "sorted by length, split into micro-batches of this size and stripped of padding columns; the "
            "gradient is accumulated over them, so one optimizer step still sees whole groups. Smaller "
            "micro-batches need less activation memory (activation_checkpointing=false on a GPU). "
            "None: one pass."
        },
    )
    bf16_weights: bool = field(
        default=False,
        metadata={
            "help": "Load the weights in bf16 instead of fp32 (model_init_kwargs dtype). Halves weight, "
            "gradient and AdamW-state memory for full fine-tuning, but updates smaller than bf16's "
            "resolution (about 1/256 of the weight) are rounded away, which matters at small learning "
            "rates. With --lora the frozen base is loaded in bf16 on CUDA anyway (adapters stay fp32)."
        },
    )
    lora: bool = field(
        default=False, metadata={"help": "Train a LoRA adapter (peft) instead of all weights."}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={
            "help": "LoRA target modules: 'all-linear' or a comma-separated list (e.g. q_proj,v_proj)."
        },
    )
    grpo: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "trl.GRPOConfig fields passed through (CLI: --grpo KEY=VALUE, repeatable; YAML: a "
            "'grpo:' mapping)."
        },
    )


# ------------------------------------------------------------------------------------------------- units


@dataclass
class _Seq:
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float] | None
    reward: float
    advantage: float | None  # None: TRL computes it from the block's rewards
    episode_id: str
    group_id: str


@dataclass
class _Unit:
    group: Group
    seqs: list[_Seq]


def _seq(s: TrainingSequence, reward: float, advantage: float | None) -> _Seq:
    return _Seq(
        list(s.prompt_ids),
        list(s.completion_ids),
        list(s.loss_mask),
        None if s.logprobs is None else list(s.logprobs),
        reward,
        advantage,
        s.episode_id,
        s.group_id,
    )


def build_units(
    groups: list[Group], num_generations: int, *, scale_rewards: str = "group", eos_token_id: int = 0
) -> list[_Unit]:
    """Pack groups into dataset rows of exactly ``num_generations`` sequences each.

    A group whose episodes are one sequence each is one unit (TRL computes its advantages). A group with
    per-turn sequences is spread over several units with precomputed advantages, padded with fully masked
    dummy sequences.

    Example:
        >>> from trainers.data import ConvertedEpisode
        >>> def ep(i):
        ...     seq = TrainingSequence("t", f"e{i}", [1], [2], [1])
        ...     return ConvertedEpisode(f"e{i}", "t", float(i), [seq])
        >>> eps = [ep(0), ep(1)]
        >>> [len(u.seqs) for u in build_units([Group("t", "t", eps)], 2)]
        [2]
    """
    G = num_generations
    all_rewards = [r for g in groups for r in g.rewards]
    batch_std = statistics.stdev(all_rewards) if len(all_rewards) > 1 else 0.0
    units: list[_Unit] = []
    for g in groups:
        if not g.per_turn:
            seqs = [_seq(s, float(ep.reward or 0.0), None) for ep in g.episodes for s in ep.sequences]
            units.append(_Unit(g, seqs))
            continue
        rewards = [float(ep.reward or 0.0) for ep in g.episodes]
        std = batch_std if scale_rewards == "batch" else None
        advantages = group_advantages(rewards, scale=str(scale_rewards) in ("group", "batch"), std=std)
        seqs = []
        for ep, r, adv in zip(g.episodes, rewards, advantages, strict=True):
            seqs += [_seq(s, r, adv) for s in ep.sequences]
        mean = g.mean_reward
        while len(seqs) % G:
            # A one-token, fully masked sequence: fills the block; no gradient and no trained tokens.
            seqs.append(_Seq(seqs[0].prompt_ids, [eos_token_id], [0], None, mean, 0.0, "<pad>", g.group_id))
        units += [_Unit(g, seqs[i : i + G]) for i in range(0, len(seqs), G)]
    return units


def _write_episode_paths(path: Path, prepared: Any) -> None:
    """Write one line per grouped episode: how it became tokens, and whether its behaviour logprobs count.

    ``path``: ``exact_ids``, ``rerender_match``, ``rerender_differs`` (``differs`` says why) or ``template``.
    """
    seen: set[str] = set()
    with path.open("w") as f:
        for group in [*prepared.groups, *prepared.eval_groups]:
            for ep in group.episodes:
                if ep.episode_id in seen:  # resampling can repeat an episode in its group
                    continue
                seen.add(ep.episode_id)
                row = {
                    "episode_id": ep.episode_id,
                    "task_id": ep.task_id,
                    "path": ep.path,
                    "differs": ep.differs,
                    "faithful": ep.faithful,
                    "per_turn": ep.per_turn,
                    "sequences": len(ep.sequences),
                }
                f.write(json.dumps(row) + "\n")


def make_rollout_func(units: list[_Unit], num_generations: int, *, behaviour_logprobs: bool = True) -> Any:
    """Build the ``rollout_func`` that replays ``units`` (dataset column ``unit`` indexes them).

    The prompts arrive repeated G times in contiguous blocks; slot ``(process_index * len(prompts) + i) % G``
    of the block gets the unit's sequence at that index, so a block never mixes groups across processes.

    Example:
        >>> fn = make_rollout_func([], 4)
        >>> callable(fn)
        True
    """
    G = num_generations

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
            "env_mask": [s.env_mask for s in picked],
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


# ------------------------------------------------------------------------------- TRL subclass and callbacks


@functools.cache
def replay_trainer_class() -> type:
    """Return ``ReplayGRPOTrainer``, a ``trl.GRPOTrainer`` subclass (built lazily: imports torch and TRL).

    It (1) exposes the dataset rows of the current batch to the rollout function, (2) replaces TRL's
    advantages by precomputed ones where the rollout supplies them (per-turn units), (3) uses the stored
    behaviour logprobs as ``old_per_token_logps`` so the clipped ratio is ``π_θ / π_behaviour``, and (4)
    uses :func:`replay_sampler` (epoch-seeded, exact resume; curriculum when configured). It overrides
    private TRL methods: keep the versions pinned.

    Example:
        >>> cls = replay_trainer_class()  # doctest: +SKIP
        >>> cls.__mro__[1].__name__  # doctest: +SKIP
        'GRPOTrainer'
    """
    import torch
    from trl import GRPOTrainer

    class ReplayGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def __init__(
            self,
            *args: Any,
            replay_behaviour: bool = True,
            curriculum: Any = None,
            min_advantage: float | None = None,
            length_grouped: bool = False,
            episodes_log: Path | None = None,
            **kw: Any,
        ):
            self._replay_behaviour = replay_behaviour
            self._min_advantage = min_advantage
            self._curriculum = curriculum
            self._length_grouped = length_grouped
            self._episodes_log = episodes_log
            self._replay_rows: list[dict[str, Any]] = []
            super().__init__(*args, **kw)

        def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
            if not (self._length_grouped and self.model.training):
                return super()._prepare_inputs(generation_batch)
            # TRL's loop, with its row shuffle replaced by a length sort and each micro-batch stripped of the
            # padding columns it does not need: similar lengths share a pass, so almost no compute is padding.
            from trl.trainer.utils import split_tensor_dict

            spg = self.args.steps_per_generation
            if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
                batch = _sort_by_length(self._generate_and_score_completions(generation_batch))
                self._buffered_inputs = [_strip_padding(b) for b in split_tensor_dict(batch, spg)]
            return self._buffered_inputs[self._step % spg]

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            return replay_sampler(
                len(dataset if dataset is not None else self.train_dataset),
                mini_repeat_count=self.num_generations,
                batch_size=self.args.generation_batch_size // self.num_generations,
                repeat_count=self.num_iterations * self.args.steps_per_generation,
                shuffle=bool(self.shuffle_dataset),
                seed=self.args.seed,
                curriculum=self._curriculum,
            )

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            self._replay_rows = inputs
            out = super()._generate_and_score_completions(inputs)
            mode = "train" if self.model.training else "eval"
            if mode == "train" and self._episodes_log is not None:
                self._log_episodes([str(x.get("episode_id")) for x in inputs])
            _use_replay_advantages(inputs, out, self._min_advantage)
            if self._replay_behaviour:
                frac = _use_behaviour_logps(out, lambda: self._replay_policy_logps(out))
                if frac is not None:
                    self._metrics[mode]["replay/behaviour_token_frac"].append(frac)
            return out

        def _log_episodes(self, episode_ids: list[str]) -> None:
            # Every process's share of this generation batch, written by the main process only: which
            # episodes trained at which step, and proof that the processes' shares are disjoint whole groups.
            from accelerate.utils import gather_object

            shares = gather_object([(self.accelerator.process_index, episode_ids)])
            if self.accelerator.is_main_process and self._episodes_log is not None:
                row = {"step": int(self.state.global_step), "shares": [ids for _, ids in sorted(shares)]}
                with self._episodes_log.open("a") as f:
                    f.write(json.dumps(row) + "\n")

        def _replay_policy_logps(self, out: dict[str, Any]) -> Any:
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    ids,
                    mask,
                    out["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
            return logps

    return ReplayGRPOTrainer


def _sort_by_length(batch: dict[str, Any]) -> dict[str, Any]:
    """Reorder the rows of a generation batch by real length (prompt + completion tokens), longest first.

    Longest first makes the first micro-batch the largest, so a batch that does not fit fails at once.
    """
    import torch

    lengths = batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    rows = lengths.size(0)

    def pick(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.size(0) == rows:
            return v[order.to(v.device)]
        if isinstance(v, list) and len(v) == rows:
            return [v[i] for i in order.tolist()]
        return v

    return {k: pick(v) for k, v in batch.items()}


# Keys shaped like the prompt (left-padded) or the completion (right-padded); anything else stops stripping.
_PROMPT_KEYS = {"prompt_ids", "prompt_mask"}
_COMPLETION_KEYS = {
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "advantages",
}


def _strip_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop the columns that are padding in every row of a micro-batch (prompts' left, completions' right).

    Nothing a loss reads changes: masked positions contribute nothing, ``num_items_in_batch`` counts real
    tokens and ``dr_grpo`` divides by ``max_completion_length``, not by the tensor width. Positions shift by
    the same amount in every row, which rotary attention does not see. Batches with other per-token tensors
    (vision inputs) are returned as they are.
    """
    import torch

    rows = batch["prompt_mask"].size(0)
    per_token = {
        k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.ndim == 2 and v.size(0) == rows
    }
    if per_token - _PROMPT_KEYS - _COMPLETION_KEYS:
        return batch
    P, C = batch["prompt_mask"].size(1), batch["completion_mask"].size(1)
    used_p = torch.nonzero(batch["prompt_mask"].sum(0)).flatten()
    used_c = torch.nonzero(batch["completion_mask"].sum(0)).flatten()
    start = int(used_p[0]) if used_p.numel() else P
    end = int(used_c[-1]) + 1 if used_c.numel() else 1
    out = dict(batch)
    for k in per_token:
        v = batch[k]
        if k in _PROMPT_KEYS:
            out[k] = v[:, start:]
        elif k in _COMPLETION_KEYS and v.size(1) == C:
            out[k] = v[:, :end]
    return out


def _use_replay_advantages(
    inputs: list[dict[str, Any]], out: dict[str, Any], min_advantage: float | None
) -> None:
    """Put the precomputed advantages of per-turn rows into the batch ``out``; clamp at ``min_advantage``."""
    import torch

    # Extra rollout keys were merged into `inputs` by TRL; per-turn rows carry their own advantages.
    pre = torch.tensor(
        [float(x.get("replay_advantage", math.nan)) for x in inputs], device=out["advantages"].device
    )
    known = ~torch.isnan(pre)
    if known.any():
        out["advantages"] = torch.where(known, pre.to(out["advantages"].dtype), out["advantages"])
    if min_advantage is not None:
        out["advantages"] = out["advantages"].clamp(min=min_advantage)


def _use_behaviour_logps(out: dict[str, Any], policy_logps: Callable[[], Any]) -> float | None:
    """Make the stored sampling logprobs TRL's "old" policy, so the clipped ratio is ``π_θ / π_behaviour``.

    Trained tokens without a stored logprob take TRL's old log-probs or, without those, ``policy_logps()``
    (ratio 1). Returns the share of trained tokens that had a stored logprob, or ``None`` when the batch has
    no sampling logprobs.
    """
    import torch

    sampling = out.get("sampling_per_token_logps")
    if sampling is None:
        return None
    loss_mask = out["completion_mask"]
    if "tool_mask" in out:
        loss_mask = loss_mask * out["tool_mask"]
    unknown = torch.isnan(sampling) & loss_mask.bool()
    behaviour = torch.nan_to_num(sampling, nan=0.0)
    if unknown.any():
        fallback = out.get("old_per_token_logps")
        if fallback is None:
            fallback = policy_logps()
        behaviour = torch.where(unknown, fallback, behaviour)
    out["old_per_token_logps"] = behaviour
    out["sampling_per_token_logps"] = behaviour
    n = loss_mask.sum().clamp(min=1)
    return float(((~unknown) & loss_mask.bool()).sum() / n)


class _Curriculum:
    """Easy-first schedule: units sorted by group mean reward (descending), a growing prefix is sampled."""

    def __init__(self, order: list[int], start: float, expand_every: int, expand_by: float, seed: int):
        self.order, self.start, self.every, self.by, self.seed = order, start, expand_every, expand_by, seed
        self.step = 0  # updated by a callback at every optimizer step

    def available(self, step: int | None = None) -> int:
        s = self.step if step is None else step
        frac = min(1.0, self.start + self.by * (s // max(1, self.every)))
        return max(1, min(len(self.order), math.ceil(frac * len(self.order))))


def replay_sampler(
    num_rows: int,
    *,
    mini_repeat_count: int,
    batch_size: int,
    repeat_count: int,
    shuffle: bool = True,
    seed: int = 0,
    curriculum: _Curriculum | None = None,
) -> Any:
    """TRL's ``RepeatSampler`` block structure, reseeded per epoch (exact resume), optionally easy-first.

    Rows are drawn in chunks of ``batch_size`` (rows per generation batch); each row is repeated
    ``mini_repeat_count`` (G) times in a contiguous block and each chunk ``repeat_count`` times. Unlike TRL's
    sampler, the permutation depends only on ``(seed, epoch)`` (``set_epoch`` is called by the Trainer), so a
    resumed run replays exactly the batches an uninterrupted run would have. With a curriculum, each chunk is
    drawn from the currently unlocked easiest rows (read when the batch is drawn; the dataloader may prefetch
    one batch ahead).

    Example:
        >>> s = replay_sampler(3, mini_repeat_count=2, batch_size=1, repeat_count=1, shuffle=False)
        >>> list(s)
        [0, 0, 1, 1, 2, 2]
    """
    import random

    from torch.utils.data import Sampler

    class ReplayRepeatSampler(Sampler):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def _chunks(self) -> Any:
            rng = random.Random(seed * 1_000_003 + self.epoch)
            n = num_rows // batch_size
            if curriculum is None:
                rows = list(range(num_rows))
                if shuffle:
                    rng.shuffle(rows)
                yield from (rows[i * batch_size : (i + 1) * batch_size] for i in range(n))
                return
            for _ in range(n):
                yield rng.sample(curriculum.order[: max(batch_size, curriculum.available())], batch_size)

        def __iter__(self) -> Any:
            for chunk in self._chunks():
                for _ in range(repeat_count):
                    for index in chunk:
                        for _ in range(mini_repeat_count):
                            yield index

        def __len__(self) -> int:
            return (num_rows // batch_size) * batch_size * mini_repeat_count * repeat_count

    return ReplayRepeatSampler()


def _is_main_process() -> bool:
    # Before the Trainer (and its Accelerator) exists, the launcher's RANK tells which process writes files.
    return int(os.environ.get("RANK", "0")) == 0


def _pad_batch(seqs: list[_Seq], pad_id: int) -> tuple[Any, Any, Any, int]:
    import torch

    P = max(len(s.prompt_ids) for s in seqs)
    C = max(len(s.completion_ids) for s in seqs)
    ids = torch.full((len(seqs), P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), P + C), dtype=torch.long)
    loss = torch.zeros((len(seqs), C), dtype=torch.float32)
    for i, s in enumerate(seqs):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        # Prompts left-padded, completions right-padded, as TRL lays them out.
        ids[i, P - p : P] = torch.tensor(s.prompt_ids)
        ids[i, P : P + c] = torch.tensor(s.completion_ids)
        attn[i, P - p : P + c] = 1
        loss[i, :c] = torch.tensor(s.env_mask, dtype=torch.float32)
    return ids, attn, loss, C


def _callbacks(
    writer_path: Path, curriculum: _Curriculum | None, eval_units: list[_Unit], eval_steps: int, resume: bool
) -> tuple[list[Any], Any]:
    """Metrics writer, curriculum stepper and held-out evaluation, as transformers callbacks."""
    from transformers import TrainerCallback

    class MetricsWriter(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.path = writer_path
            self.trainer: Any = None
            if not resume and _is_main_process():
                self.path.unlink(missing_ok=True)

        def write(self, state: Any, logs: dict[str, Any]) -> None:
            if not state.is_world_process_zero:
                return
            row = {"step": state.global_step, "time": round(time.time(), 3)}
            row.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool)) or v is None})
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            if logs:
                self.write(state, logs)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if curriculum is not None:
                curriculum.step = state.global_step

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if curriculum is not None:
                curriculum.step = state.global_step
            self._evaluate(state)

        def on_evaluate_replay(self, state: Any) -> None:
            self._evaluate(state)

        def _evaluate(self, state: Any) -> None:
            if not eval_units or self.trainer is None:
                return
            if getattr(self, "_last_eval_step", None) == state.global_step:
                return
            self._last_eval_step = state.global_step
            self.write(state, evaluate_units(self.trainer, eval_units))

    writer = MetricsWriter()

    class HeldOutEval(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if eval_units and eval_steps > 0 and state.global_step % eval_steps == 0:
                writer.on_evaluate_replay(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            writer.on_evaluate_replay(state)

    # The curriculum logger runs before the writer so that its key lands in the same metrics row.
    first = [_curriculum_logger(curriculum)] if curriculum is not None else []
    return [*first, writer, HeldOutEval()], writer


def evaluate_units(trainer: Any, units: list[_Unit], batch_size: int = 8) -> dict[str, float]:
    """Score held-out replay groups with the current policy (no generation, no reward model).

    Measures, on the held-out groups' model tokens: ``eval/logp_mean`` (token-weighted mean log-prob),
    ``eval/logp_gap`` (mean per-sequence log-prob of above-average-reward episodes minus below-average ones:
    rising means the policy moves toward better episodes) and ``eval/adv_weighted_logp`` (mean of advantage ×
    per-sequence mean log-prob; the negative of a GRPO surrogate loss at ratio 1). These are proxies: the
    reward of fresh rollouts needs an environment, which replay does not have.

    Example:
        >>> evaluate_units(None, [])
        {}
    """
    if not units or not any(sum(s.env_mask) for u in units for s in u.seqs):
        return {}
    import torch

    seqs: list[tuple[_Seq, float]] = []
    for u in units:
        eps = u.group.episodes
        advantages = group_advantages([e.reward or 0.0 for e in eps])
        adv = dict(zip([e.episode_id for e in eps], advantages, strict=True))
        seqs += [(s, adv[s.episode_id]) for s in u.seqs if sum(s.env_mask)]
    model = trainer.model
    was_training = model.training
    model.eval()
    tok_sum = tok_n = 0.0
    per_seq: list[tuple[float, float]] = []
    pad = trainer.processing_class.pad_token_id or 0
    try:
        with torch.no_grad():
            for i in range(0, len(seqs), batch_size):
                chunk = seqs[i : i + batch_size]
                ids, attn, loss_mask, C = _pad_batch([s for s, _ in chunk], pad)
                dev = trainer.accelerator.device
                logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids.to(dev), attn.to(dev), C)
                logps = logps.float().cpu() * loss_mask
                tok_sum += float(logps.sum())
                tok_n += float(loss_mask.sum())
                for j, (_, adv) in enumerate(chunk):
                    per_seq.append((float(logps[j].sum() / loss_mask[j].sum().clamp(min=1)), adv))
    finally:
        model.train(was_training)
    pos = [lp for lp, a in per_seq if a > 0]
    neg = [lp for lp, a in per_seq if a < 0]
    out = {
        "eval/logp_mean": tok_sum / max(tok_n, 1.0),
        "eval/adv_weighted_logp": statistics.fmean(lp * a for lp, a in per_seq),
        "eval/sequences": float(len(per_seq)),
    }
    if pos and neg:
        out["eval/logp_gap"] = statistics.fmean(pos) - statistics.fmean(neg)
    return out


# --------------------------------------------------------------------------------------------- GRPOConfig


def _coerce(value: Any, type_str: str) -> Any:
    # YAML 1.1 reads "1e-5" as a string; numeric GRPOConfig fields get numbers.
    if isinstance(value, str) and re.search(r"\b(float|int)\b", type_str) and "str" not in type_str:
        try:
            return int(value) if re.fullmatch(r"[+-]?\d+", value.strip()) else float(value)
        except ValueError:
            return value
    return value


def resolve_grpo_kwargs(config: TRLGRPOConfig, prepared: PreparedData) -> dict[str, Any]:
    """Resolve the ``GRPOConfig`` keyword arguments: the user's ``grpo`` mapping over tracerl's defaults.

    Defaults set only when the user did not: ``per_device_train_batch_size`` = G × up to 8/G groups,
    ``logging_steps=1``, ``report_to="none"``, ``bf16`` when CUDA supports it, gradient checkpointing only on
    GPU, ``use_cpu`` without CUDA, and ``max_completion_length`` = the longest completion (only the
    ``dr_grpo`` normaliser reads it; replayed completions are cut when building sequences).

    Raises:
        UserError: Unknown ``grpo`` keys (with suggestions) or conflicts with top-level fields.

    Example:
        >>> resolve_grpo_kwargs(TRLGRPOConfig(grpo={"lr": 1}), prepared)  # doctest: +SKIP
        Traceback (most recent call last):
        trainers.errors.UserError: unknown GRPOConfig field 'lr' (did you mean: learning_rate?)
    """
    import torch
    from trl import GRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    user = dict(config.grpo or {})
    for key in list(user):
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f" (did you mean: {', '.join(close)}?)" if close else ""
            raise UserError(f"unknown GRPOConfig field {key!r}{hint}")
        user[key] = _coerce(user[key], str(fields[key].type))
    for key, attr in _OWNED.items():
        if key in user and user[key] != getattr(config, attr):
            raise UserError(
                f"set {key} at the top level of the config (--{key.replace('_', '-')}), not in grpo"
            )
    cuda = torch.cuda.is_available()
    G = config.num_generations
    n_units = max(1, len(prepared.groups))
    kw: dict[str, Any] = {
        "output_dir": config.output_dir,
        "seed": config.seed,
        "num_generations": G,
        "per_device_train_batch_size": G * max(1, min(max(1, 8 // G), n_units)),
        "logging_steps": 1,
        "report_to": "none",
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "use_cpu": not cuda,
        "max_completion_length": max(
            [len(s.completion_ids) for g in prepared.groups for s in g.sequences] or [1]
        ),
        "save_strategy": "steps",
        "save_steps": 50,
    }
    if "gradient_checkpointing" not in user and "activation_checkpointing" not in user:
        # transformers 5.23 renamed it; setting the new name avoids a deprecation warning on every run.
        kw["activation_checkpointing"] = cuda
    if cuda and "use_liger_kernel" not in user and _liger_installed():
        # Liger's RMSNorm/SwiGLU/RoPE kernels (TRL 1.16 keeps its own chunked log-prob head and refuses
        # liger's fused linear cross-entropy): 18.2k -> 23.5k tokens/s on a 1.5B model, H100.
        kw["use_liger_kernel"] = True
    kw.update(user)
    if user.get("fp16") and "bf16" not in user:
        kw["bf16"] = False  # the user asked for fp16 mixed precision: don't also default bf16 on
    _weights_dtype(kw, config, user, cuda)
    _micro_batches(kw, config)
    return kw


def _liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def _weights_dtype(kw: dict[str, Any], config: TRLGRPOConfig, user: dict[str, Any], cuda: bool) -> None:
    """Set ``model_init_kwargs["dtype"]`` for ``bf16_weights`` and for a LoRA base under bf16 autocast."""
    init = dict(kw.get("model_init_kwargs") or {})
    if isinstance(kw.get("model_init_kwargs"), str):
        return  # a JSON string: TRL parses it; the user chose everything
    want = None
    if config.bf16_weights:
        want = "bfloat16"
    elif config.lora and cuda and kw.get("bf16"):
        # A frozen base gains nothing from fp32 master weights: autocast runs its matmuls on bf16 copies made
        # at every forward (and again at every recomputation). Loading it in bf16 removes those casts and
        # half the weight memory; TRL's LoRA adapters stay fp32 (peft upcasts them).
        want = "bfloat16"
    if want is None:
        return
    have = init.get("dtype")
    if have is not None and str(have).replace("torch.", "") != want:
        if config.bf16_weights:
            raise UserError(f"bf16_weights conflicts with grpo model_init_kwargs dtype={have!r}")
        return  # the user's explicit dtype wins over the LoRA default
    init["dtype"] = want
    kw["model_init_kwargs"] = init


def _micro_batches(kw: dict[str, Any], config: TRLGRPOConfig) -> None:
    """Turn ``micro_batch_size`` into TRL's batch size, gradient accumulation and steps per generation.

    The generation batch (what the rollout function replays and TRL computes advantages over) stays the
    same size, so it still holds whole groups; only the forward/backward passes get smaller. Applying it to
    already-split settings (a rerun of a resolved ``config.yaml``) changes nothing.
    """
    m = config.micro_batch_size
    if m is None:
        return
    batch = int(kw["per_device_train_batch_size"])
    if m < 1 or batch % m:
        raise UserError(
            f"micro_batch_size {m} must divide the per-device batch size {batch} (whole GRPO groups)"
        )
    if kw.get("generation_batch_size") is not None:
        raise UserError("set micro_batch_size or generation_batch_size, not both")
    k = batch // m
    accumulation = int(kw.get("gradient_accumulation_steps") or 1)
    per_generation = int(kw.get("steps_per_generation") or accumulation)
    kw["per_device_train_batch_size"] = m
    kw["gradient_accumulation_steps"] = accumulation * k
    kw["steps_per_generation"] = per_generation * k


def _lora_inputs_in_autocast_dtype(model: Any) -> int:
    """Stop peft from casting every LoRA layer's input to the adapters' fp32 under mixed precision.

    Why LoRA ran slower than full fine-tuning on an H100 (1.5B: 12.8k vs 18.2k tokens/s): peft's LoRA
    ``Linear.forward`` casts its input to the adapter weights' dtype (fp32) before dropout and ``lora_A``,
    and autocast casts it back to bf16 for the matmul. For each of the 7 adapted projections of every layer
    that is two full-size copies of the activations plus an fp32 dropout (the MLP input is 8960 wide), and
    it happens again when activation checkpointing recomputes the layer. The adapter matmuls are run in
    bf16 by autocast anyway, so keeping the input in bf16 gives the same values without the copies; the
    fp32 adapter weights (what the optimizer updates) are unchanged. Returns the number of layers changed.
    """
    n = 0
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
            n += 1
    return n


def _lora_config(config: TRLGRPOConfig) -> Any:
    if not config.lora:
        return None
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise UserError("LoRA needs peft: pip install 'tracerl[train]'") from exc
    targets: Any = config.lora_target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in str(targets).split(",") if t.strip()]
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
    )


# ------------------------------------------------------------------------------------------------ trainer


class TRLGRPOTrainer:
    """The ``trl`` backend: GRPO with TRL's ``GRPOTrainer`` replaying stored episodes.

    Example:
        >>> from trainers.trl_grpo import TRLGRPOConfig, TRLGRPOTrainer
        >>> cfg = TRLGRPOConfig(model="./tiny", output_dir="runs/demo", grpo={"max_steps": 20})
        >>> result = TRLGRPOTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
        >>> result.checkpoint  # doctest: +SKIP
        PosixPath('runs/demo/final')
    """

    name: ClassVar[str] = "trl"
    config_class: ClassVar[type[TrainerConfig]] = TRLGRPOConfig

    def prepare(self, data: Any, config: TrainerConfig, *, tokenizer: Any = None) -> PreparedData:
        """Load, convert and group the data (``--dry-run`` stops here).

        Example:
            >>> TRLGRPOTrainer().prepare("episodes.parquet", TRLGRPOConfig(model="./tiny"))  # doctest: +SKIP
        """
        grpo = getattr(config, "grpo", {}) or {}
        mcl = grpo.get("max_completion_length")
        return prepare_data(
            data, config, tokenizer=tokenizer, max_completion_length=None if mcl is None else int(mcl)
        )

    def train(
        self,
        data: Any,
        config: TrainerConfig,
        *,
        tokenizer: Any = None,
        prepared: PreparedData | None = None,
        callbacks: list[Any] | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> TrainResult:
        """Train on ``data`` and save the model/adapter, metrics, plots and resolved config.

        Args:
            data: Episodes (anything ``load_episodes`` accepts) or a list of :class:`TrainingSequence`.
            config: A :class:`TRLGRPOConfig`.
            tokenizer: Use this tokenizer instead of loading one from ``config.model``.
            prepared: Already prepared data (skips :meth:`prepare`).
            callbacks: Extra ``transformers.TrainerCallback`` s.
            extra_config: Extra keys written to ``config.yaml`` (the CLI adds ``backend`` and ``data``).

        Returns:
            A :class:`~trainers.base.TrainResult`.

        Raises:
            UserError: Bad data, model, or settings (see :func:`trainers.base.prepare_data`).
        """
        trainer, run = self.build_trainer(
            data,
            config,
            tokenizer=tokenizer,
            prepared=prepared,
            callbacks=callbacks,
            extra_config=extra_config,
        )
        prepared, out_dir, metrics_path, config_path, resume = (
            run["prepared"],
            run["output_dir"],
            run["metrics_path"],
            run["config_path"],
            run["resume"],
        )
        try:
            train_out = trainer.train(resume_from_checkpoint=resume)
        except ValueError as exc:
            if "checkpoint" in str(exc).lower():
                raise UserError(f"cannot resume: {str(exc).splitlines()[0]}") from exc
            raise

        final = out_dir / "final"
        trainer.save_model(str(final))
        is_adapter = config.lora
        plots: list[Path] = []
        if trainer.accelerator.is_main_process:
            from trainers._plots import plot_metrics

            plots = plot_metrics(metrics_path, out_dir)
        metrics = self._summary(trainer, train_out)
        return TrainResult(
            output_dir=out_dir,
            checkpoint=final,
            adapter=is_adapter,
            metrics_path=metrics_path,
            plots=plots,
            config_path=config_path,
            global_step=int(trainer.state.global_step),
            metrics=metrics,
            report=prepared.report,
        )

    def build_trainer(
        self,
        data: Any,
        config: TrainerConfig,
        *,
        tokenizer: Any = None,
        prepared: PreparedData | None = None,
        callbacks: list[Any] | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Prepare the data and build the ``ReplayGRPOTrainer`` without training (used by tests and benches).

        Returns:
            ``(trainer, run)`` where ``run`` holds ``prepared``, ``output_dir``, ``metrics_path``,
            ``config_path``, ``resume``, ``units`` and ``eval_units``.

        Example:
            >>> trainer, run = TRLGRPOTrainer().build_trainer("e.parquet", cfg)  # doctest: +SKIP
            >>> trainer.train()  # doctest: +SKIP
        """
        if not isinstance(config, TRLGRPOConfig):
            raise UserError(f"the trl backend needs a TRLGRPOConfig, got {type(config).__name__}")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
        prepared = prepared or self.prepare(data, config, tokenizer=tokenizer)
        tok = prepared.tokenizer if prepared.tokenizer is not None else tokenizer
        if tok is None:
            from trainers.base import load_tokenizer

            tok = load_tokenizer(config)

        out_dir = Path(config.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        kw, args = _grpo_args(config, prepared)
        G = config.num_generations
        eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else 0
        units = build_units(prepared.groups, G, scale_rewards=str(args.scale_rewards), eos_token_id=eos)
        eval_units = build_units(prepared.eval_groups, G, scale_rewards="group", eos_token_id=eos)
        _check_generation_batch(args.generation_batch_size, G, len(units))
        curriculum = _make_curriculum(units, config)

        from datasets import Dataset

        dataset = Dataset.from_dict(
            {"prompt": [f"replay-unit-{i}" for i in range(len(units))], "unit": list(range(len(units)))}
        )
        metrics_path = out_dir / "metrics.jsonl"
        resume = self._resume_arg(config, out_dir)
        cbs, writer = _callbacks(metrics_path, curriculum, eval_units, config.eval_steps, resume is not None)
        config_path = self._write_config(out_dir, config, kw, prepared, extra_config)

        episodes_log = out_dir / "trained_episodes.jsonl"
        if resume is None and _is_main_process():
            episodes_log.unlink(missing_ok=True)
        cls = replay_trainer_class()
        try:
            with warnings.catch_warnings():
                # TRL 1.16 deprecates use_liger_kernel for Hub kernels, which need a download at start-up.
                warnings.filterwarnings("ignore", message=".*use_liger_kernel=True. is deprecated")
                trainer = cls(
                    model=config.model,
                    reward_funcs=[stored_reward],
                    args=args,
                    train_dataset=dataset,
                    processing_class=tok,
                    peft_config=_lora_config(config),
                    rollout_func=make_rollout_func(units, G, behaviour_logprobs=config.behaviour_logprobs),
                    callbacks=[*cbs, *(callbacks or [])],
                    replay_behaviour=config.behaviour_logprobs,
                    curriculum=curriculum,
                    min_advantage=config.min_advantage,
                    length_grouped=config.micro_batch_size is not None,
                    episodes_log=episodes_log,
                )
        except OSError as exc:
            raise UserError(
                f"cannot load model {config.model!r}: {str(exc).strip().splitlines()[0]}"
            ) from exc
        writer.trainer = trainer
        if config.lora and (args.bf16 or args.fp16):
            _lora_inputs_in_autocast_dtype(trainer.model)
        run = {
            "prepared": prepared,
            "output_dir": out_dir,
            "metrics_path": metrics_path,
            "config_path": config_path,
            "resume": resume,
            "units": units,
            "eval_units": eval_units,
        }
        return trainer, run

    @staticmethod
    def _resume_arg(config: TrainerConfig, out_dir: Path) -> str | bool | None:
        if not config.resume:
            return None
        if config.resume in ("latest", "true", "True"):
            from transformers.trainer_utils import get_last_checkpoint

            last = get_last_checkpoint(str(out_dir)) if out_dir.is_dir() else None
            if last is None:
                raise UserError(f"--resume: no checkpoint-* directory in {out_dir} to resume from")
            return last
        path = Path(config.resume).expanduser()
        if not path.is_dir():
            raise UserError(f"--resume: checkpoint not found: {path}")
        return str(path)

    @staticmethod
    def _write_config(
        out_dir: Path,
        config: TRLGRPOConfig,
        kw: dict[str, Any],
        prepared: PreparedData,
        extra: dict[str, Any] | None,
    ) -> Path:
        import yaml

        path = out_dir / "config.yaml"
        if not _is_main_process():
            return path
        resolved = {**(extra or {}), **dataclasses.asdict(config), "grpo": kw}
        # Device-dependent defaults stay out (unless the user set them) so the file can be rerun elsewhere.
        device_keys = {"bf16", "use_cpu", "activation_checkpointing", "use_liger_kernel", "model_init_kwargs"}
        device_keys -= set(config.grpo or {})
        resolved["grpo"] = {k: v for k, v in kw.items() if k not in _OWNED and k not in device_keys}
        header = (
            "# Resolved configuration of this run; rerun with: python -m sdk.train --config config.yaml\n"
            "# (device-dependent defaults bf16/use_cpu/activation_checkpointing/use_liger_kernel and a LoRA\n"
            "# base's dtype are chosen at run time)\n"
        )
        path.write_text(header + yaml.safe_dump(resolved, sort_keys=False))
        (out_dir / "data_report.json").write_text(
            json.dumps({"report": prepared.report.as_dict(), "stats": prepared.stats()}, indent=2)
        )
        _write_episode_paths(out_dir / "episode_paths.jsonl", prepared)
        return path

    @staticmethod
    def _summary(trainer: Any, train_out: Any) -> dict[str, Any]:
        hist = trainer.state.log_history
        out: dict[str, Any] = {}
        for key in ("train_runtime", "train_loss", "train_steps_per_second"):
            if key in train_out.metrics:
                out[key] = float(train_out.metrics[key])
        for key in ("reward", "loss", "clip_ratio/region_mean", "replay/behaviour_token_frac"):
            vals = [h[key] for h in hist if isinstance(h.get(key), (int, float))]
            if vals:
                out[f"last_{key}"] = float(vals[-1])
        return out


def _grpo_args(config: TRLGRPOConfig, prepared: PreparedData) -> tuple[dict[str, Any], Any]:
    """The resolved ``GRPOConfig`` keyword arguments and the ``trl.GRPOConfig`` built from them."""
    from trl import GRPOConfig

    kw = resolve_grpo_kwargs(config, prepared)
    try:
        return kw, GRPOConfig(**kw)
    except (ValueError, TypeError) as exc:
        raise UserError(f"invalid GRPO settings: {str(exc).splitlines()[0]}") from exc


def _check_generation_batch(generation_batch_size: int, num_generations: int, units: int) -> None:
    per_gen_units = generation_batch_size // num_generations
    if per_gen_units > units:
        raise UserError(
            f"a generation batch needs {per_gen_units} groups (generation_batch_size "
            f"{generation_batch_size} / num_generations {num_generations}) but only {units} exist; lower "
            "per_device_train_batch_size or steps_per_generation"
        )


def _make_curriculum(units: list[Any], config: TRLGRPOConfig) -> _Curriculum | None:
    """The easy-first schedule over ``units`` (highest group mean reward first), or ``None`` when off."""
    if not config.curriculum:
        return None
    order = sorted(range(len(units)), key=lambda i: (-units[i].group.mean_reward, units[i].group.group_id))
    return _Curriculum(
        order,
        config.curriculum_start,
        config.curriculum_expand_every,
        config.curriculum_expand_by,
        config.seed,
    )


def _curriculum_logger(curriculum: _Curriculum) -> Any:
    from transformers import TrainerCallback

    class CurriculumLogger(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            if logs is not None:
                logs["curriculum/groups_available"] = curriculum.available(state.global_step)

    return CurriculumLogger()
