"""Training FLOPs of a step, counted two ways (no torch import): 6·N and 6·N plus attention.

``dense``: per trained token ``2·N`` forward, ``2·N`` backward through the activations and ``2·N_trainable``
for the weight gradients: ``6·N`` for full fine-tuning, ``4·N + 2·N_adapter`` for LoRA (the frozen base has
no weight gradients). ``attention``: the score and value products, ``12 · Σ n² · heads · head_dim · layers``
over the step's sequences (forward + backward, the causal half not discounted: the count verl's and
prime-rl's MFU figures use). With activation checkpointing the hardware does more (a second forward); MFU
counts the model's FLOPs, not the recomputation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["PEAK_BF16", "attention_flops", "dense_flops", "peak_flops"]

# Dense bf16 peak FLOP/s by GPU name (vendor datasheets, no sparsity); the first matching key wins.
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM / "H100 80GB HBM3"
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 125e12),
    ("RTX 4090", 165e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by name, or ``None`` when unknown (and on CPU).

    Example:
        >>> peak_flops("NVIDIA H100 80GB HBM3"), peak_flops("cpu")
        (989000000000000.0, None)
    """
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def dense_flops(tokens: int, params: int, trainable: int | None = None) -> float:
    """``(4·N + 2·N_trainable)`` per token: ``6·N`` for full fine-tuning, less for LoRA.

    Example:
        >>> dense_flops(10, 100), dense_flops(10, 100, trainable=1)
        (6000.0, 4020.0)
    """
    t = params if trainable is None else trainable
    return float(tokens) * (4.0 * params + 2.0 * t)


def attention_flops(seq_lens: Iterable[int], config: Any) -> float:
    """``12 · Σ n² · heads · head_dim · layers`` for the step's sequences of lengths ``seq_lens``.

    ``config`` is a transformers model config (``num_attention_heads``, ``num_hidden_layers`` and
    ``head_dim`` or ``hidden_size``).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> attention_flops([2, 3], NS(num_attention_heads=2, num_hidden_layers=1, hidden_size=8))
        1248.0
    """
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    square = sum(int(n) * int(n) for n in seq_lens)
    return 12.0 * square * heads * int(head_dim) * int(config.num_hidden_layers)
