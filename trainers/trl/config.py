"""The ``trl`` backend's configuration; importable without torch or TRL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainers.base import TrainerConfig
from trainers.settings import context_default, setting

__all__ = ["GRPOShortcuts", "TRLGRPOConfig"]


# GRPOConfig fields tracerl owns at the top level of the config (GRPOConfig name: our name); in `grpo` they
# must agree with it.
_OWNED = {"output_dir": "output_dir", "seed": "seed", "num_generations": "group_size"}


@dataclass
class GRPOShortcuts:
    """The ``trl.GRPOConfig`` fields with a flag of their own, and the defaults tracerl gives them.

    They land in the config's ``grpo`` mapping (``--max-steps 10`` is ``grpo: {max_steps: 10}``); ``None``
    leaves TRL's default. Every other GRPOConfig field: ``--grpo KEY=VALUE`` or the ``grpo:`` mapping.
    The defaults that depend on the machine or the data (``bf16``, ``use_cpu``, the batch size, ...) are
    :func:`trainers.trl.resolve_grpo_kwargs`'s.

    Example:
        >>> GRPOShortcuts().save_steps
        50
    """

    max_steps: int | None = setting(None, help="Total optimizer steps (overrides --num-train-epochs).")
    num_train_epochs: float | None = setting(None, help="Passes over the training groups.")
    learning_rate: float | None = setting(None, help="Learning rate (TRL's default is 1e-6).")
    per_device_train_batch_size: int | None = setting(
        None, help="Sequences per device per step (a multiple of group_size; default G x up to 8/G groups)."
    )
    gradient_accumulation_steps: int | None = setting(None, help="Micro-batches per optimizer step.")
    loss_type: str | None = setting(
        None, help="grpo, dr_grpo, dapo (TRL default), bnpo, cispo, sapo, luspo, vespo."
    )
    beta: float | None = setting(None, help="KL coefficient (0 loads no reference model).")
    num_iterations: int | None = setting(
        None, help="Policy updates per replayed batch (μ); >1 uses behaviour-logprob clipping."
    )
    epsilon: float | None = setting(None, help="Clipping range ε.")
    temperature: float | None = setting(
        None, help="Sampling temperature of the stored episodes (divides logits)."
    )
    save_steps: int = setting(50, help="Save a resumable checkpoint every N steps.")
    logging_steps: int = setting(1, help="Log metrics every N steps.")
    report_to: str = setting("none", help="Where TRL reports metrics besides metrics.jsonl (e.g. wandb).")


@dataclass
class TRLGRPOConfig(TrainerConfig):
    """Configuration of the ``trl`` backend: :class:`~trainers.base.TrainerConfig` plus TRL specifics.

    Parameters that control the policy update:
        behaviour_logprobs: clip against the stored behaviour logprobs of token-faithful episodes.
        tis_cap: truncated importance sampling cap (off-policy data; see ``trainers.trl.replay``).
        min_advantage: clamp advantages from below (0.0 = positive-only); None = signed GRPO advantages.
        grpo: any ``trl.GRPOConfig`` field, passed through (e.g. ``learning_rate``, ``loss_type``,
            ``beta``, ``num_iterations``, ``epsilon_high``, ``max_steps``, ``per_device_train_batch_size``,
            ``save_steps``).

    Parameters that control speed and memory (results stay the same within tolerance):
        micro_batch_size: split each device's batch into micro-batches of this many sequences, sorted by
            length and stripped of padding columns (gradient accumulation inside a GRPO group).
        micro_batch_tokens: padding-free passes of at most this many tokens (see the field's help).
        padding_free: padding-free passes without a token budget.
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
    tis_cap: float | None = setting(
        context_default("tis_cap", "trainer"),
        help="Truncated importance sampling against the stored behaviour logprobs (the asynchronous loop "
        "turns it on with 2.0): clip π_θ/π_prox, the policy at the start of each generation batch, and "
        "weight each trained token's loss by min(π_prox/π_behaviour, tis_cap). None: clip π_θ/π_behaviour "
        "directly (behaviour_logprobs).",
        check=lambda v: v > 0,
        rule="> 0",
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
    micro_batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of a padding-free pass (implies padding_free): with a varlen flash "
            "attention (attn_implementation flash_attention_2/3 or a kernels flash-attn) a micro-batch's "
            "sequences are packed into rows of at most this many tokens, position ids restarting per "
            "sequence, so long and short groups fill the GPU alike; without one, every pass is one sequence "
            "(a sequence longer than the budget gets a pass of its own). The optimizer step still covers "
            "the whole batch."
        },
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Run each micro-batch as padding-free passes (packed rows with a varlen flash attention, "
            "else one sequence per pass, causal attention without a mask) with a loss and metrics that read "
            "nothing back to the host until a logging step. Settings it does not cover (several processes, "
            "loss types other than grpo/bnpo/dr_grpo/dapo, entropy bonus or masks, sequence-level importance "
            "sampling, soft-capped logits, sliding windows) run TRL's padded step."
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
    lora_dropout: float = field(
        default=0.0,
        metadata={
            "help": "LoRA dropout. 0 by default (TRL and peft use 0.05): a change of regularisation, made "
            "because dropout adds a kernel and an activation copy to every adapted projection; set 0.05 for "
            "the old behaviour."
        },
    )
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
