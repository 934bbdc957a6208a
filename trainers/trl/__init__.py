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

Why the CUDA defaults. Activation checkpointing costs about a third more compute, but 8 sequences of 4.5k
tokens with a 152k vocabulary need more than 80 GB of activations without it. liger swaps only the layer
kernels (RMSNorm, SwiGLU, RoPE): TRL 1.16 already computes per-token log-probs with its own chunked head and
rejects liger's fused cross-entropy (``--grpo use_liger_kernel=false`` turns it off). LoRA keeps its inputs
in bf16 because peft casts each adapted projection's input to the adapters' fp32 and autocast casts it back:
two activation copies per projection, memory traffic rather than FLOPs; a frozen fp32 base gains nothing
over bf16 under autocast, so with ``--lora`` on CUDA the base loads in bf16 (adapters stay fp32, as bf16
masters would round away GRPO-sized updates, which is also why ``--bf16-weights`` is opt-in). LoRA dropout
is 0 by default (TRL and peft use 0.05; ``--lora-dropout 0.05`` restores it).

Starting points per model size (one 80 GB GPU, ~4k-token episodes, batch 8; from activation-memory
estimates, not all of them run on a GPU yet: measurements in ``tests/bench/RESULTS.md``):

- ≤ 0.5B full: ``--micro-batch-size 2 --grpo activation_checkpointing=false``;
- 1.5B full: ``--micro-batch-size 1 --grpo activation_checkpointing=false`` (or checkpointing at batch 8);
- 1.5B–3B LoRA: ``--lora --micro-batch-size 2 --grpo activation_checkpointing=false``;
- 7B LoRA: ``--lora`` (bf16 base); try ``--micro-batch-size 1 --grpo activation_checkpointing=false``;
- 7B full: several GPUs with FSDP or ZeRO-3.

Several GPUs: ``accelerate launch --num_processes 8 -m sdk.train ...`` (DDP), or ``--config_file
examples/accelerate/{ddp,fsdp,zero3}.yaml`` (with FSDP pass ``--grpo activation_checkpointing=false``: FSDP
checkpoints itself). ``per_device_train_batch_size`` should be a multiple of G so each process holds whole
groups; only the main process writes metrics, plots, checkpoints and the final model. Without a GPU,
``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m sdk.train ...`` runs two gloo
processes (how the multi-process path is tested). ``tests/bench/gpu_suite.sh`` is the one command for a GPU
machine (shapes, padded and padding-free, a profiler split, ``pytest -m gpu``); the padding-free step stays
opt-in until it has run there.

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
