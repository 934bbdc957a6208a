"""GRPO on stored episodes with TRL's ``GRPOTrainer`` (replay: no generation during training).

How it works. TRL 1.16.0's ``rollout_func`` contract (``_generate`` in ``trl/trainer/grpo_trainer.py``): it is
called once per generation batch with the dataset prompts already repeated G times in contiguous blocks; it
returns ``prompt_ids``, ``completion_ids`` and ``logprobs`` (``None`` allowed) for every prompt; an
``env_mask`` becomes TRL's ``tool_mask`` (``loss_mask = completion_mask * tool_mask``); extra keys reach the
reward functions as keyword arguments. ``logprob_token_ids`` is not returned: TRL 1.16 reads no such key
from a ``rollout_func`` (only its docstring names it), so it would only reach reward functions. On top of it:

- Each task group of ``group_size`` (G) episodes is one dataset row (a *unit*). TRL's ``RepeatSampler``
  repeats every row G times in a contiguous block; the ``rollout_func`` answers slot ``i`` of a block with the
  group's ``i``-th stored episode: ``prompt_ids``, ``completion_ids``, ``env_mask`` (1 = model token, 0 = tool
  result / template glue: no gradient), behaviour ``logprobs`` and the stored reward, which a reward function
  returns as is. TRL then computes group-relative advantages and the clipped GRPO loss.
- Without vLLM, TRL uses rollout logprobs only for ``off_policy_mask_threshold`` and sets the "old" policy to
  the current one (ratio 1). :class:`~trainers.trl.replay.ReplayGRPOTrainer` (private API, hence the tested
  trl/transformers ranges and the contract check of :mod:`trainers._compat`) makes the clipped ratio
  ``π_θ / π_behaviour`` when the stored episodes are token-faithful, which also makes ``num_iterations > 1``
  meaningful. Tokens without a known behaviour logprob fall back to the policy's own log-prob at generation
  time (ratio 1).
- Episodes that are not append-only under the target template become per-turn sequences; their group's
  advantages are computed here (:func:`sdk.episodes.group_advantages`, following ``scale_rewards``) and
  packed G per row, padded with fully masked dummies; the subclass overrides TRL's advantages for those rows.

Multi-GPU: ``accelerate launch -m sdk.train --data ... --model ...`` (one process per GPU; groups never
straddle processes incorrectly because slot indices use the process index; ``trained_episodes.jsonl`` records
every process's share of each generation batch). On CUDA the defaults are: ``bf16`` autocast when supported,
activation checkpointing on, liger's layer kernels when ``liger-kernel`` is installed, and for LoRA a bf16
frozen base with LoRA inputs kept in bf16 (see ``trainers.trl._args._lora_inputs_in_autocast_dtype``). On
CPU none of these apply. ``micro_batch_size`` splits each device's batch into length-sorted micro-batches
without padding columns (same update; less activation memory, so checkpointing can be turned off).
``padding_free`` / ``micro_batch_tokens`` run each micro-batch as padding-free passes (packed rows with a
varlen flash attention, else one sequence per pass) with a loss that reads nothing back to the host
(``replay`` and ``_step``).

Modules: ``config`` (:class:`TRLGRPOConfig`, importable without torch), ``trainer`` (:class:`TRLGRPOTrainer`),
``replay`` (``ReplayGRPOTrainer``, imports torch and TRL: only imported when training), ``_step`` (its
padding-free passes and loss), ``_flops`` (MFU counts), ``_units`` (groups
→ dataset rows and the rollout function), ``_sampler``, ``_callbacks``, ``_args`` (``GRPOConfig`` kwargs).
This package imports neither torch nor TRL until a trainer is built.
"""

from trainers.trl._args import check_grpo_keys, resolve_grpo_kwargs
from trainers.trl._callbacks import evaluate_units
from trainers.trl._sampler import replay_sampler
from trainers.trl._units import build_units, make_rollout_func, stored_reward
from trainers.trl.config import TRLGRPOConfig
from trainers.trl.trainer import BuiltTrainer, TRLGRPOTrainer

__all__ = [
    "BuiltTrainer",
    "TRLGRPOConfig",
    "TRLGRPOTrainer",
    "build_units",
    "check_grpo_keys",
    "evaluate_units",
    "make_rollout_func",
    "replay_sampler",
    "resolve_grpo_kwargs",
    "stored_reward",
]
