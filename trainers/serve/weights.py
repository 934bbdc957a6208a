"""Weights pushed to the policy server as tensors: checked whole first, then copied in place.

The resident trainer (:mod:`trainers.trl.resident`) sends a version's weights without writing a checkpoint:
in the same process as a mapping of tensors, to a server process as one ``safetensors`` buffer over the
loopback (``POST /admin/weights``). Full weights are copied into the served model's own parameters; a LoRA
adapter's tensors (never a merged copy of the base) into the adapter's. Every name and shape is checked
before the first tensor is copied, so a push that does not fit changes nothing. Checkpoints a server loads
whole come through :func:`load_model`.

Pushed tensors are input (:func:`check_values`, before anything is copied): a tensor that is not floating
point (``int32``, ``bool``, ...) or holds a value that is not finite (NaN, infinity) is refused with one
``ValueError`` naming it, and so is one whose values would become infinite in the served dtype (a float32
value beyond float16's 65504 pushed to a float16 server). The casts that remain are between floating
dtypes: ``copy_`` rounds each tensor to the dtype of the parameter it replaces (float32 → bfloat16 or
float16 on a server loaded with ``--dtype bfloat16``/``float16``, float64 → float32), as loading a
checkpoint of another dtype would.

Example:
    >>> import torch
    >>> from trainers.serve.weights import check_full_weights
    >>> layer = torch.nn.Linear(2, 2)
    >>> check_full_weights(layer, {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)})
    2
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "attach_adapter",
    "check_full_weights",
    "check_values",
    "copy_adapter_weights",
    "copy_full_weights",
    "copy_served_adapter",
    "decode_push",
    "encode_push",
    "first_line",
    "load_model",
    "new_adapter_config",
    "serving_device",
    "serving_dtype",
    "SERVING_DTYPES",
]


def _base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s tensors by their names in a plain checkpoint.

    LoRA layers peft wrapped around modules (adapters served on this base) are left out, and ``.base_layer.``
    is dropped from the wrapped modules' names.
    """
    return {
        name.replace(".base_layer.", "."): tensor
        for name, tensor in model.state_dict().items()
        if ".lora_" not in name
    }


def _check_fit(tensors: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], served: str) -> None:
    """Every pushed name is one of ``target``'s, with its shape (``served`` names ``target`` in errors)."""
    unknown = sorted(set(tensors) - set(target))
    if unknown:
        raise ValueError(f"the {served} has no tensor {unknown[0]!r} ({len(unknown)} unknown names)")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise ValueError(
                f"{name!r} has shape {tuple(tensor.shape)}, the {served}'s {tuple(target[name].shape)}"
            )


def check_values(tensors: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor]) -> None:
    """Refuse pushed ``tensors`` that are not finite floating-point values the served ``targets`` can hold.

    ``targets``: the served tensor each name replaces (its dtype bounds the values). A non-floating dtype, a
    NaN or infinity, or a value beyond the served dtype's range is a :class:`ValueError` naming the tensor.

    Example:
        >>> check_values({"w": torch.tensor([1.0, float("nan")])}, {"w": torch.zeros(2)})
        Traceback (most recent call last):
        ValueError: the pushed tensor 'w' holds values that are not finite (NaN or infinity)
        >>> check_values({"w": torch.ones(2, dtype=torch.int32)}, {"w": torch.zeros(2)})
        Traceback (most recent call last):
        ValueError: the pushed tensor 'w' is torch.int32: weights must be floating point
    """
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise ValueError(f"the pushed tensor {name!r} is {tensor.dtype}: weights must be floating point")
        if tensor.numel() == 0:
            continue
        # amin and amax propagate NaN and reduce without a copy of the tensor
        low, high = (float(v) for v in torch.aminmax(tensor.detach()))
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"the pushed tensor {name!r} holds values that are not finite (NaN or infinity)")
        served = targets[name].dtype
        limit = torch.finfo(served).max if served.is_floating_point else math.inf
        if max(-low, high) > limit:
            raise ValueError(
                f"the pushed tensor {name!r} holds values beyond {served}'s range (±{limit:g}): they would "
                f"be served as infinity"
            )


def check_full_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Check that ``tensors`` are ``model``'s whole state (names, shapes, values); returns how many there are.

    A name the model lacks, a shape that differs, or a parameter that is neither sent nor tied to one that
    is (tied embeddings are sent once) is a :class:`ValueError` naming it, and so are values
    :func:`check_values` refuses.

    Example:
        >>> check_full_weights(torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)})
        Traceback (most recent call last):
        ValueError: the pushed weights lack 'bias' (1 of 2 tensors missing)
    """
    target = _base_state(model)
    _check_fit(tensors, target, "served model")
    sent = {target[name].data_ptr() for name in tensors}
    missing = [name for name, t in target.items() if name not in tensors and t.data_ptr() not in sent]
    if missing:
        raise ValueError(
            f"the pushed weights lack {missing[0]!r} ({len(missing)} of {len(target)} tensors missing)"
        )
    check_values(tensors, target)
    return len(tensors)


@torch.no_grad()
def copy_full_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Check (:func:`check_full_weights`), then copy ``tensors`` into ``model``'s own storage; bytes copied.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> copy_full_weights(layer, {"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
        24
        >>> float(layer.weight.detach().sum())
        4.0
    """
    check_full_weights(model, tensors)
    target = _base_state(model)
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
    _check_fit(tensors, current, "served adapter")
    missing = sorted(set(current) - set(tensors))
    if missing:
        raise ValueError(f"the pushed adapter lacks {missing[0]!r} ({len(missing)} tensors missing)")
    check_values(tensors, current)
    set_peft_model_state_dict(model, dict(tensors), adapter_name=adapter_id)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def serving_device(device: str) -> str:
    """``device`` checked for serving: ``"cpu"``, or ``"cuda"`` / ``"cuda:N"`` on a machine that has it.

    Raises:
        ValueError: Another device, or no such CUDA device here.

    Example:
        >>> serving_device("cpu")
        'cpu'
        >>> serving_device("tpu")
        Traceback (most recent call last):
        ValueError: device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'
    """
    text = str(device).strip()
    if text == "cpu":
        return text
    kind, colon, index = text.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"device {text!r}: this machine has no CUDA device (serve on 'cpu')")
    if colon and int(index) >= count:
        raise ValueError(
            f"device {text!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        )
    return text


SERVING_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}
"""The ``dtype`` names a server loads checkpoints as (``auto``: the checkpoint's own)."""


def serving_dtype(name: str) -> torch.dtype | str:
    """The dtype a server loads checkpoints as, from its name in :data:`SERVING_DTYPES`.

    Raises:
        ValueError: Another name.

    Example:
        >>> serving_dtype("bfloat16")
        torch.bfloat16
    """
    if name not in SERVING_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SERVING_DTYPES)}, got {name!r}")
    return SERVING_DTYPES[name]


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


def first_line(exc: BaseException) -> str:
    r"""``Type: message`` on one line (a heading line ending in ``:`` gets its first detail line).

    Example:
        >>> first_line(RuntimeError("Error(s) in loading:\n\tsize mismatch for w\n\tmore"))
        'RuntimeError: Error(s) in loading: size mismatch for w'
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(exc).__name__}: {text[:500]}"


def attach_adapter(model: Any, path: str, adapter_id: str) -> Any:
    """Load the LoRA adapter at ``path`` onto ``model`` as ``adapter_id``; returns the (peft) model.

    All or nothing: an adapter that cannot be loaded (no or a bad ``adapter_config.json``, weights that are
    not a readable file, tensors whose shapes do not fit the model, tensors missing) is a
    :class:`ValueError` naming the cause, and ``model`` is left as it was (the half-added adapter removed,
    or the LoRA layers peft injected into a plain model taken out again).

    Example:
        >>> model = attach_adapter(base_model, "runs/router/final", "slot0")  # doctest: +SKIP
    """
    from peft import PeftConfig, PeftModel, get_peft_model

    wrapped = not isinstance(model, PeftModel)
    peft_model = model
    try:
        if wrapped:
            config = PeftConfig.from_pretrained(path)
            config.inference_mode = True
            peft_model = get_peft_model(model, config, adapter_name=adapter_id)
        result = peft_model.load_adapter(path, adapter_name=adapter_id)  # the saved config, then weights
        if result.missing_keys:  # peft loads leniently: a file of other tensors would leave these as made
            raise ValueError(
                f"its weights lack {result.missing_keys[0]!r} ({len(result.missing_keys)} missing)"
            )
    except Exception as exc:  # peft, safetensors and torch each raise their own types for a bad adapter
        if isinstance(peft_model, PeftModel):
            if wrapped:
                peft_model.unload()  # the plain model's modules without the injected LoRA layers
            elif adapter_id in peft_model.peft_config:
                peft_model.delete_adapter(adapter_id)
        raise ValueError(f"cannot load the LoRA adapter {path!r}: {first_line(exc)}") from None
    return peft_model


def copy_served_adapter(source: Any, source_id: str, target: Any, adapter_id: str) -> Any:
    """Copy the adapter ``source_id`` of the peft model ``source`` onto ``target`` as ``adapter_id``.

    For an adapter that was pushed from memory (no checkpoint on disk) when new base weights come in: its
    config and tensors are put on the new base. Returns the (peft) target; :class:`ValueError` if they
    do not fit it (``target`` is then left as it was).

    Example:
        >>> new = copy_served_adapter(old_model, "slot3", new_base, "slot7")  # doctest: +SKIP
    """
    import copy

    from peft import PeftModel, get_peft_model, get_peft_model_state_dict

    config = copy.deepcopy(source.peft_config[source_id])
    tensors = {
        k: v.detach().clone() for k, v in get_peft_model_state_dict(source, adapter_name=source_id).items()
    }
    wrapped = not isinstance(target, PeftModel)
    if wrapped:
        target = get_peft_model(target, config, adapter_name=adapter_id)
    else:
        target.add_adapter(adapter_id, config)
    try:
        copy_adapter_weights(target, adapter_id, tensors)
    except ValueError:
        if wrapped:
            target.unload()
        else:
            target.delete_adapter(adapter_id)
        raise
    return target


def load_model(
    model: Any, tokenizer: Any, device: torch.device, dtype: torch.dtype | str = torch.float32
) -> tuple[Any, Any, str | None, set[int]]:
    """A checkpoint (as ``dtype``) or a model on ``device``, in eval mode: ``(model, tokenizer, path, stop)``.

    A checkpoint that cannot be loaded is a ``ValueError``; the stop ids are the tokenizer's EOS and pad and
    the generation config's EOS ids.

    Example:
        >>> model, tok, path, stop = load_model("runs/sft", None, torch.device("cpu"))  # doctest: +SKIP
    """
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = None
    if isinstance(model, (str, Path)):
        path = str(model)
        from trainers._model_dir import check_model_dir
        from trainers.errors import UserError

        try:  # a directory tracerl did not finish writing is refused, not served half-made
            check_model_dir(path)
        except UserError as exc:
            raise ValueError(f"cannot load the checkpoint {path!r}: {exc}") from None
        try:
            tok = tokenizer or AutoTokenizer.from_pretrained(path)
            mdl = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except Exception as exc:  # transformers, safetensors and torch each raise their own types
            raise ValueError(f"cannot load the checkpoint {path!r}: {first_line(exc)}") from None
    else:
        if tokenizer is None:
            raise ValueError("tokenizer is required when model is an object")
        tok, mdl = tokenizer, model
    mdl.to(device).eval()
    stop = {tok.eos_token_id, tok.pad_token_id}
    gen_eos = getattr(getattr(mdl, "generation_config", None), "eos_token_id", None)
    stop.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return mdl, tok, path, {i for i in stop if i is not None}
