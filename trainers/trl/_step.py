"""The padding-free training step of the replay trainer: passes planned on the host, a loss without syncs.

A micro-batch (TRL's per-device batch, length-sorted and stripped of padding columns) is split into
*passes*, planned once per generation batch on the host:

- ``varlen`` (a varlen flash attention is the model's attention: ``flash_attention_2``/``_3`` or a
  ``kernels`` flash-attn): the pass's sequences are packed into one row, position ids restart per sequence
  and the cumulative sequence lengths go to the kernel, so no token attends across sequences or to padding;
  ``micro_batch_tokens`` bounds the tokens of a pass.
- ``single`` (any other attention): one sequence per pass and no mask, so SDPA runs causal on its
  grouped-query path instead of a dense 4-D mask over padding.
- ``dense``: packed like ``varlen`` with a block-diagonal mask that transformers builds from the position
  ids. It skips nothing, so it is refused on CUDA; the CPU tests use it to check packing.

The log-probs of a pass are scattered back into the micro-batch's padded completion layout, so the loss
reads the same advantages, masks and behaviour log-probs as TRL's. The loss of a pass is normalised by the
whole micro-batch's denominators (sequences, tokens), so the passes' gradients add up to the micro-batch's.
All index tensors are on the device before the step starts: the step reads nothing back to the host, and
its metrics are device tensors read when the trainer logs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from trl.kernels import ChunkedLogProbFunction

__all__: list[str] = []

# TRL's own tile size for the chunked log-prob head (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE).
_CHUNK = 32768
# Loss types whose normalisation the step reproduces; anything else runs TRL's own loss.
_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
# Config attributes that change the logits (final soft-capping, logit scales): TRL's head handles them.
_LOGIT_CHANGERS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier")


@dataclass
class Pass:
    """One forward/backward pass: rows ``start:stop`` of a micro-batch, packed into one row of tokens."""

    start: int
    stop: int
    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T), restarting at 0 for every sequence
    src: torch.Tensor  # (K,) positions in the row whose hidden state predicts a completion token
    targets: torch.Tensor  # (K,) those completion tokens
    dst: torch.Tensor  # (K,) flat index into the pass's (rows, completion width) layout
    cu_seqlens: torch.Tensor  # (rows + 1,) int32
    max_len: int
    lengths: tuple[int, ...]  # real tokens per sequence (host), for FLOP counts


def attention_kind(model: Any, requested: str | None = None) -> str:
    """``varlen`` when the model's attention is a varlen flash kernel, else ``single``.

    ``requested`` (``dense``: CPU tests only) overrides the choice; ``dense`` is refused on CUDA.
    """
    if requested is not None:
        if requested == "dense" and next(model.parameters()).is_cuda:
            raise ValueError(
                "a dense block-diagonal mask skips nothing on CUDA: use a varlen flash attention"
            )
        return requested
    impl = str(getattr(model.config, "_attn_implementation", "") or "")
    return "varlen" if "flash" in impl and "flex" not in impl else "single"


def plan_passes(batch: dict[str, Any], kind: str, max_tokens: int | None) -> list[Pass] | None:
    """Split a stripped, length-sorted micro-batch into passes; ``None`` when it cannot be packed exactly.

    A row packs exactly when its prompt mask is one run of ones ending at the last prompt column, its
    completion mask one run starting at the first completion column, and its prompt is not empty. The host
    reads the masks here, once per generation batch; the tensors go to the batch's device.
    """
    pm, cm = batch["prompt_mask"].cpu(), batch["completion_mask"].cpu()
    P = pm.size(1)
    p_len, c_len = pm.sum(1).tolist(), cm.sum(1).tolist()
    for i, (p, c) in enumerate(zip(p_len, c_len, strict=True)):
        if p < 1 or not bool(pm[i, P - p :].all()) or bool(pm[i, : P - p].any()):
            return None
        if not bool(cm[i, :c].all()) or bool(cm[i, c:].any()):
            return None
    lengths = [p + c for p, c in zip(p_len, c_len, strict=True)]
    groups: list[tuple[int, int]] = []
    start = 0
    while start < len(lengths):
        stop, total = start + 1, lengths[start]
        while kind != "single" and stop < len(lengths):
            if max_tokens is not None and total + lengths[stop] > max_tokens:
                break
            total += lengths[stop]
            stop += 1
        groups.append((start, stop))
        start = stop
    prompt_ids, completion_ids = batch["prompt_ids"].cpu(), batch["completion_ids"].cpu()
    device = batch["prompt_ids"].device
    C = cm.size(1)
    passes = []
    for a, b in groups:
        ids, pos, src, dst, cu = [], [], [], [], [0]
        for row in range(a, b):
            p, c = p_len[row], c_len[row]
            offset = cu[-1]
            ids += [prompt_ids[row, P - p :], completion_ids[row, :c]]
            pos.append(torch.arange(p + c))
            src.append(torch.arange(offset + p - 1, offset + p + c - 1))
            dst.append(torch.arange(c) + (row - a) * C)
            cu.append(offset + p + c)
        input_ids = torch.cat(ids)
        moved = [
            _to(t, device)
            for t in (
                input_ids.unsqueeze(0),
                torch.cat(pos).unsqueeze(0),
                torch.cat(src),
                torch.cat([completion_ids[row, : c_len[row]] for row in range(a, b)]),
                torch.cat(dst),
                torch.tensor(cu, dtype=torch.int32),
            )
        ]
        passes.append(Pass(a, b, *moved, max_len=max(lengths[a:b]), lengths=tuple(lengths[a:b])))
    return passes


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def supported(trainer: Any, model: Any) -> str | None:
    """Why the step cannot run padding-free with this trainer's settings, or ``None`` when it can."""
    if trainer.accelerator.num_processes > 1:
        return "several processes (the step calls the model's backbone, not the distributed wrapper)"
    if trainer.loss_type not in _LOSS_TYPES:
        return f"loss_type {trainer.loss_type!r}"
    if trainer.importance_sampling_level != "token":
        return "sequence-level importance sampling"
    if trainer.off_policy_mask_threshold is not None or trainer.top_entropy_quantile < 1.0:
        return "off-policy or entropy masks"
    if trainer._entropy_bonus_enabled or trainer.aux_loss_enabled:
        return "an entropy bonus or an auxiliary loss"
    if trainer.use_vllm:
        return "vLLM generation"
    cfg = _causal_lm(model).config.get_text_config()
    if any(getattr(cfg, name, None) is not None for name in _LOGIT_CHANGERS):
        return "a model that scales or soft-caps its logits"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
        return "sliding-window layers"
    return None


def _causal_lm(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def pass_logps(trainer: Any, model: Any, p: Pass, kind: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of pass ``p``'s completion tokens in a ``(rows, width)`` padded layout."""
    lm = _causal_lm(model)
    cfg = lm.config.get_text_config()
    kw: dict[str, Any] = {}
    if kind == "varlen":
        kw = dict(
            position_ids=p.position_ids,
            cu_seq_lens_q=p.cu_seqlens,
            cu_seq_lens_k=p.cu_seqlens,
            max_length_q=p.max_len,
            max_length_k=p.max_len,
        )
    elif kind == "dense":
        kw = dict(position_ids=p.position_ids)  # transformers builds the block-diagonal mask from them
    layer_types = getattr(cfg, "layer_types", None)
    if kind != "dense" and layer_types:
        # Masks given as "none": transformers neither builds a mask nor inspects the position ids (a sync).
        # Only models with layer types (Qwen2/3, Gemma) take such a mapping; the others (Llama, Mistral:
        # SmolLM2) get no mask and build a causal one, at the cost of that sync on CUDA.
        kw["attention_mask"] = {t: None for t in set(layer_types)}
    with trainer.accelerator.autocast():
        hidden = lm.base_model(input_ids=p.input_ids, use_cache=False, **kw).last_hidden_state[0]
        h = hidden.index_select(0, p.src)
        head = lm.get_output_embeddings()
        fp32 = bool(trainer.args.cast_lm_head_to_fp32)  # as TRL's head: fp32 hidden states, no autocast
        with torch.autocast(h.device.type, enabled=False) if fp32 else contextlib.nullcontext():
            outputs = ("log_probs", "entropy")
            x = h.float() if fp32 else h
            lp, ent, *_ = ChunkedLogProbFunction.apply(
                x, head.weight, head.bias, p.targets, trainer.temperature, _CHUNK, None, 1.0, outputs
            )
    rows = p.stop - p.start
    logps = lp.new_zeros(rows * width).index_copy(0, p.dst, lp).view(rows, width)
    entropies = ent.detach().new_zeros(rows * width).index_copy(0, p.dst, ent.detach()).view(rows, width)
    return logps, entropies


def pass_loss(
    trainer: Any, inputs: dict[str, Any], p: Pass, logps: torch.Tensor, entropies: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's clipped GRPO loss of pass ``p`` (rows of ``inputs``), normalised over the whole micro-batch.

    Same formulas as ``GRPOTrainer._compute_loss`` for :data:`_LOSS_TYPES` at token-level importance
    sampling. Also returns the pass's metric statistics (device tensors) for :func:`log_metrics`.
    """
    rows = slice(p.start, p.stop)
    cm = inputs["completion_mask"]
    full_mask = cm * inputs["tool_mask"] if "tool_mask" in inputs else cm
    mask = full_mask[rows]
    adv = inputs["advantages"][rows]
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    old = inputs.get("old_per_token_logps")
    old = logps.detach() if old is None else old[rows]
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    clipped_1 = coef_1 if trainer.args.delta is None else torch.clamp(coef_1, max=trainer.args.delta)
    per_token = -torch.min(clipped_1 * adv, coef_2 * adv)
    kl = None
    if trainer.beta != 0.0:
        ref = inputs["ref_per_token_logps"][rows]
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        if trainer.args.use_bias_correction_kl:
            kl = kl * coef_1
        per_token = per_token + trainer.beta * kl
    ga = trainer.current_gradient_accumulation_steps
    masked = per_token * mask
    if trainer.loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / full_mask.size(0) / ga
    elif trainer.loss_type == "bnpo":
        loss = masked.sum() / full_mask.sum().clamp(min=1.0) / ga
    elif trainer.loss_type == "dr_grpo":
        loss = masked.sum() / (full_mask.size(0) * trainer.max_completion_length) / ga
    else:  # dapo: num_items_in_batch spans the generation batch
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        loss = masked.sum() / (normalizer * ga / trainer.args.steps_per_generation)
    return loss, _stats(trainer, mask, entropies, clipped_1, adv, kl)


def _stats(trainer: Any, mask: Any, entropies: Any, coef_1: Any, adv: Any, kl: Any) -> dict[str, Any]:
    """Masked sums (``sum/...``), the token count and per-sequence extremes of a pass, on the device."""
    low = ((coef_1 < 1 - trainer.epsilon_low) & (adv < 0)).float()
    high = ((coef_1 > 1 + trainer.epsilon_high) & (adv > 0)).float()
    per_seq = mask.sum(-1)
    inf = entropies.new_full((), float("inf"))  # a fill on the device, not a copy from the host
    out = {
        "tokens": mask.sum().detach(),
        "sum/entropy": (entropies * mask).sum().detach(),
        "sum/clip_ratio/low_mean": (low * mask).sum(),
        "sum/clip_ratio/high_mean": (high * mask).sum(),
        "sum/clip_ratio/region_mean": (torch.maximum(low, high) * mask).sum(),
        "min/clip_ratio/low_min": torch.where(
            per_seq > 0, (low * mask).sum(-1) / per_seq.clamp(min=1.0), inf
        ).min(),
        "max/clip_ratio/high_max": torch.where(
            per_seq > 0, (high * mask).sum(-1) / per_seq.clamp(min=1.0), -inf
        ).max(),
    }
    if kl is not None:
        out["sum/kl"] = (kl * mask).sum().detach()
    return out


def log_metrics(trainer: Any, stats: list[dict[str, Any]]) -> None:
    """TRL's step metrics of a micro-batch from its passes' statistics, appended as device tensors.

    Token means over the micro-batch (TRL's ``global_masked_mean``), and the per-sequence minimum and
    maximum of the clipped fractions; ``ReplayGRPOTrainer.log`` reads them all in one transfer.
    """
    m = trainer._metrics["train"]
    tokens = torch.stack([s["tokens"] for s in stats]).sum().clamp(min=1.0)
    for key in stats[0]:
        kind, _, name = key.partition("/")
        values = torch.stack([s[key] for s in stats])
        if kind == "sum":
            m[name].append(values.sum() / tokens)
        elif kind == "min":
            m[name].append(values.min())
        elif kind == "max":
            m[name].append(values.max())
