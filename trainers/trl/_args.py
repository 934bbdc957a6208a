"""``trl.GRPOConfig`` keyword arguments from a :class:`~trainers.trl.config.TRLGRPOConfig`."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainers.data import PreparedData
from trainers.errors import UserError
from trainers.settings import coerce, field_types, unknown_settings
from trainers.trl.config import _OWNED, GRPOShortcuts, TRLGRPOConfig

__all__ = ["check_grpo_keys", "resolve_grpo_kwargs"]


def check_grpo_keys(config: TRLGRPOConfig) -> dict[str, Any]:
    """The user's ``grpo`` mapping, checked against ``trl.GRPOConfig``'s fields and coerced to their types.

    Loads no model: the loop calls it before its first rollout, so a typo costs no round.

    Raises:
        UserError: Unknown keys (with suggestions), values of the wrong type, or keys that conflict with
            top-level fields.

    Example:
        >>> check_grpo_keys(TRLGRPOConfig(grpo={"learning_rate": "1e-5"}))
        {'learning_rate': 1e-05}
    """
    from trl import GRPOConfig

    types = field_types(GRPOConfig)
    user = dict(config.grpo or {})
    if set(user) - set(types):
        raise unknown_settings(set(user) - set(types), types, "GRPOConfig field(s)")
    user = {key: coerce(f"grpo.{key}", value, types[key]) for key, value in user.items()}
    for key, attr in _OWNED.items():
        if key in user and user[key] != getattr(config, attr):
            raise UserError(
                f"set {attr} at the top level of the config (--{attr.replace('_', '-')}), not in grpo"
            )
    return user


def resolve_grpo_kwargs(config: TRLGRPOConfig, prepared: PreparedData) -> dict[str, Any]:
    """Resolve the ``GRPOConfig`` keyword arguments: the user's ``grpo`` mapping over tracerl's defaults.

    Defaults set only when the user did not: those of :class:`~trainers.trl.config.GRPOShortcuts`,
    ``per_device_train_batch_size`` = G × up to 8/G groups, ``bf16`` when CUDA supports it, gradient
    checkpointing only on GPU, ``use_cpu`` without CUDA, and ``max_completion_length`` = the longest
    completion (only the ``dr_grpo`` normaliser reads it; replayed completions are cut when building
    sequences).

    Raises:
        UserError: Unknown ``grpo`` keys (with suggestions) or conflicts with top-level fields.

    Example:
        >>> resolve_grpo_kwargs(TRLGRPOConfig(grpo={"lr": 1}), prepared)  # doctest: +SKIP
        Traceback (most recent call last):
        trainers.errors.UserError: unknown GRPOConfig field(s): lr (did you mean learning_rate?)
    """
    import torch

    user = check_grpo_keys(config)
    cuda = torch.cuda.is_available()
    G = config.group_size
    n_units = max(1, len(prepared.groups))
    kw: dict[str, Any] = {
        **{k: v for k, v in dataclasses.asdict(GRPOShortcuts()).items() if v is not None},
        "output_dir": config.output_dir,
        "seed": config.seed,
        "num_generations": G,
        "per_device_train_batch_size": G * max(1, min(max(1, 8 // G), n_units)),
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "use_cpu": not cuda,
        "max_completion_length": max(
            [len(s.completion_ids) for g in prepared.groups for s in g.sequences] or [1]
        ),
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
    padding_free = config.padding_free or config.micro_batch_tokens is not None
    if padding_free and "logging_nan_inf_filter" not in user:
        # The Trainer's NaN/inf check of every step's loss reads it back to the host (a sync per step).
        kw["logging_nan_inf_filter"] = False
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
    if config.micro_batch_tokens is not None and config.micro_batch_tokens < 1:
        raise UserError(f"micro_batch_tokens must be at least 1, got {config.micro_batch_tokens}")
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


def _grpo_args(config: TRLGRPOConfig, prepared: PreparedData) -> tuple[dict[str, Any], Any]:
    """The resolved ``GRPOConfig`` keyword arguments and the ``trl.GRPOConfig`` built from them."""
    from trl import GRPOConfig

    kw = resolve_grpo_kwargs(config, prepared)
    try:
        return kw, GRPOConfig(**kw)
    except (ValueError, TypeError) as exc:
        raise UserError(f"invalid GRPO settings: {str(exc).splitlines()[0]}") from exc


def _check_generation_batch(generation_batch_size: int, group_size: int, units: int) -> None:
    per_gen_units = generation_batch_size // group_size
    if per_gen_units > units:
        raise UserError(
            f"a generation batch needs {per_gen_units} groups (generation_batch_size "
            f"{generation_batch_size} / group_size {group_size}) but only {units} exist; lower "
            "per_device_train_batch_size or steps_per_generation"
        )
