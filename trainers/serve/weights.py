"""Weights pushed to the policy server as tensors: checked whole first, then copied in place.

The resident trainer (:mod:`trainers.trl.resident`) sends a version's weights without writing a checkpoint:
in the same process as a mapping of tensors, to a server process as one ``safetensors`` buffer over the
loopback (``POST /admin/weights``). Full weights are copied into the served model's own parameters; a LoRA
adapter's tensors (never a merged copy of the base) into the adapter's. Every name and shape is checked
before the first tensor is copied, so a push that does not fit changes nothing.

Example:
    >>> import torch
    >>> from trainers.serve.weights import check_full_weights
    >>> layer = torch.nn.Linear(2, 2)
    >>> check_full_weights(layer, {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)})
    2
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "check_full_weights",
    "copy_adapter_weights",
    "copy_full_weights",
    "decode_push",
    "encode_push",
    "new_adapter_config",
]


def check_full_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Check that ``tensors`` are ``model``'s whole state (names and shapes); returns how many there are.

    A name the model lacks, a shape that differs, or a parameter that is neither sent nor tied to one that
    is (tied embeddings are sent once) is a :class:`ValueError` naming it.

    Example:
        >>> check_full_weights(torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)})
        Traceback (most recent call last):
        ValueError: the pushed weights lack 'bias' (1 of 2 tensors missing)
    """
    target = model.state_dict()
    unknown = sorted(set(tensors) - set(target))
    if unknown:
        raise ValueError(f"the served model has no tensor {unknown[0]!r} ({len(unknown)} unknown names)")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise ValueError(
                f"{name!r} has shape {tuple(tensor.shape)}, the served model's {tuple(target[name].shape)}"
            )
    sent = {target[name].data_ptr() for name in tensors}
    missing = [name for name, t in target.items() if name not in tensors and t.data_ptr() not in sent]
    if missing:
        raise ValueError(
            f"the pushed weights lack {missing[0]!r} ({len(missing)} of {len(target)} tensors missing)"
        )
    return len(tensors)


@torch.no_grad()
def copy_full_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Check (:func:`check_full_weights`), then copy ``tensors`` into ``model``'s own storage; bytes copied.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> copy_full_weights(layer, {"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
        24
        >>> float(layer.weight.sum())
        4.0
    """
    check_full_weights(model, tensors)
    target = model.state_dict()
    moved = 0
    for name, tensor in tensors.items():
        target[name].copy_(tensor)
        moved += tensor.numel() * tensor.element_size()
    return moved


def new_adapter_config(config: Mapping[str, Any]) -> Any:
    """A peft config from its ``to_dict()`` form (what the trainer sends with an adapter's first push).

    Example:
        >>> new_adapter_config({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}).r
        4
    """
    from peft import PeftConfig

    try:
        return PeftConfig.from_peft_type(**dict(config))
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"not a peft adapter config: {exc}") from None


@torch.no_grad()
def copy_adapter_weights(model: Any, adapter_id: str, tensors: Mapping[str, torch.Tensor]) -> int:
    """Check, then copy a LoRA adapter's ``tensors`` into the adapter ``adapter_id``; returns bytes copied.

    ``tensors`` carry peft's names without the adapter name (``get_peft_model_state_dict``).

    Example:
        >>> copy_adapter_weights(peft_model, "slot0", adapter_tensors)  # doctest: +SKIP
        65536
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    current = get_peft_model_state_dict(model, adapter_name=adapter_id)
    unknown = sorted(set(tensors) - set(current))
    if unknown:
        raise ValueError(f"the adapter has no tensor {unknown[0]!r} ({len(unknown)} unknown names)")
    missing = sorted(set(current) - set(tensors))
    if missing:
        raise ValueError(f"the pushed adapter lacks {missing[0]!r} ({len(missing)} tensors missing)")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(current[name].shape):
            raise ValueError(
                f"adapter tensor {name!r} has shape {tuple(tensor.shape)}, the served adapter's "
                f"{tuple(current[name].shape)}"
            )
    set_peft_model_state_dict(model, dict(tensors), adapter_name=adapter_id)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def encode_push(
    tensors: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any] | None = None
) -> bytes:
    """One ``safetensors`` buffer of ``tensors`` (the adapter's config, if any, in its metadata).

    Example:
        >>> len(encode_push({"w": torch.zeros(2)})) > 8
        True
    """
    from safetensors.torch import save

    metadata = {"adapter_config": json.dumps(dict(adapter_config))} if adapter_config is not None else None
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)


def decode_push(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The tensors and adapter config of an :func:`encode_push` buffer (``ValueError`` if it is not one).

    Example:
        >>> tensors, config = decode_push(encode_push({"w": torch.ones(2)}, {"r": 4}))
        >>> tensors["w"].tolist(), config
        ([1.0, 1.0], {'r': 4})
    """
    from safetensors.torch import load

    if len(data) < 8:
        raise ValueError("the body is not a safetensors buffer (too short)")
    size = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8 : 8 + size])
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error type for any damage
        raise ValueError(f"the body is not a safetensors buffer: {str(exc).splitlines()[0]}") from None
    meta = header.get("__metadata__") or {}
    config = json.loads(meta["adapter_config"]) if "adapter_config" in meta else None
    return tensors, config
