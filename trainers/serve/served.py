"""The engine's weights and their versions: a base model and tokenizer, LoRA adapters on it, their changes.

Three changes, each all or nothing: :meth:`ServedWeights.reload` (new base weights from a checkpoint or a
model object, every adapter attached to them aside first), :meth:`ServedWeights.reload_adapter` (one adapter
from its directory, loaded beside the one it replaces) and :meth:`ServedWeights.push` (tensors copied in
place, checked whole first: :mod:`trainers.serve.weights`). A change that does not load or fit is a
``ValueError`` and one naming a version that would go back a :class:`~trainers.serve.versions.StaleVersion`;
either way what is served and every version stay as they were. Versions follow
:mod:`trainers.serve.versions`; the slots that carry them are :mod:`trainers.serve.slots`.

The caller holds the weights still while they change (the engine runs each change inside its scheduler's
``hold()``), so no request generates on weights half changed.

Example:
    >>> weights = ServedWeights("path/to/base", model_name="base")  # doctest: +SKIP
    >>> weights.reload_adapter("router", "runs/router")  # doctest: +SKIP
    0
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainers.serve import weights
from trainers.serve.slots import Slot, Slots
from trainers.serve.versions import next_version

__all__ = ["ServedWeights"]


@dataclass
class _Base:
    """Loaded base weights, not yet served (a reload builds them aside, then swaps them in)."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    path: str | None
    stop: set[int]


class ServedWeights:
    """A causal LM and its tokenizer, LoRA adapters on it (:attr:`slots`), and their versions.

    Args:
        model: A path (``from_pretrained``) or a loaded ``PreTrainedModel``.
        tokenizer: A tokenizer; loaded from ``model`` when it is a path and this is None.
        model_name: Name of the base weights (default: the checkpoint directory's name).
        device: Torch device.
        dtype: What checkpoints load as: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (their own).
        policy_version: Version of the base weights as loaded (a restarted server goes on counting).

    Example:
        >>> ServedWeights("path/to/base").slots.versions()  # doctest: +SKIP
        {'base': 0}
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        model_name: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        policy_version: int = 0,
    ) -> None:
        self.device, self.dtype = torch.device(device), weights.serving_dtype(dtype)
        self._ids = itertools.count()  # adapter ids in the peft model, never one used twice
        self.model: Any
        self.tokenizer: PreTrainedTokenizerBase
        self.stop_ids: set[int]
        new = self._read(model, tokenizer)
        self._install(new)
        name = model_name or (Path(new.path).name if new.path else "local-model")
        self.slots = Slots(name, new.path, policy_version)

    @property
    def context_length(self) -> int:
        """Most prompt + completion tokens a request may hold (the model's ``max_position_embeddings``)."""
        return int(getattr(self.model.config, "max_position_embeddings", None) or 1 << 30)

    @property
    def pad_id(self) -> int:
        """The token id rows are padded with."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _read(self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> _Base:
        """Load base weights without serving them; a checkpoint that cannot be loaded is a ``ValueError``."""
        return _Base(*weights.load_model(model, tokenizer, self.device, self.dtype))

    def _install(self, new: _Base) -> None:
        self.model, self.tokenizer, self.stop_ids = new.model, new.tokenizer, new.stop

    def reload(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        policy_version: int | None = None,
    ) -> int:
        """Swap in new base weights (a checkpoint path or a model object); returns their version.

        ``policy_version``: the version from now on (default: the current + 1; lower: ``StaleVersion``).
        The new base is loaded and every adapter attached to it aside (both bases in memory meanwhile) and
        swapped in only when all of it loaded. Each adapter's version then moves up by one.

        Example:
            >>> weights.reload("out/round-1/checkpoint")  # doctest: +SKIP
            1
        """
        base = self.slots.base
        version = next_version(base.name, base.version, policy_version)
        if isinstance(model, (str, Path)) and tokenizer is None and _has_no_tokenizer(str(model)):
            tokenizer = self.tokenizer
        new = self._read(model, tokenizer)
        ids: dict[str, str] = {}
        for slot in self.slots.adapters():
            try:
                new.model, ids[slot.name] = self._attach(slot, new.model)
            except ValueError as exc:
                raise ValueError(
                    f"the new base weights were not swapped in: adapter {slot.name!r} does not load on "
                    f"them ({exc}); still serving the previous weights as version {base.version}"
                ) from None
        self._install(new)  # everything loaded: only now does anything served change
        base.path, base.version = new.path, version
        for slot in self.slots.adapters():  # base + adapter changed: each adapter's version moves
            slot.adapter, slot.version = ids[slot.name], slot.version + 1
        return version

    def reload_adapter(self, name: str, checkpoint: str | Path, *, policy_version: int | None = None) -> int:
        """Load (or replace) the LoRA adapter served as ``name``; returns its version (0 when new).

        The new adapter is loaded beside the old one, which is deleted once the new one loaded.

        Example:
            >>> weights.reload_adapter("router", "runs/router/step-20", policy_version=2)  # doctest: +SKIP
            2
        """
        old = self.slots.adapter(name)
        if not (Path(checkpoint) / "adapter_config.json").exists():
            raise ValueError(f"{str(checkpoint)!r} is not a LoRA adapter directory (no adapter_config.json)")
        if old is None:
            version = 0 if policy_version is None else int(policy_version)
        else:
            version = next_version(name, old.version, policy_version)
        self.model, new_id = self._attach(str(checkpoint), self.model)
        if old is None:
            self.slots[name] = Slot(name, new_id, str(checkpoint), version)
            return version
        self.model.set_adapter(new_id)  # never delete the active adapter (peft warns, then picks one)
        self.model.delete_adapter(old.adapter)
        old.adapter, old.path, old.version = new_id, str(checkpoint), version
        return version

    def push(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        adapter: str | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        policy_version: int | None = None,
        alias: str | None = None,
    ) -> int:
        """Copy weights sent as tensors into the served ones (no checkpoint on disk); returns their version.

        Without ``adapter``: the base model's whole state (tied tensors once); every adapter's version moves
        up by one. With ``adapter``: that LoRA adapter's tensors (peft's names); ``adapter_config`` (the peft
        config's ``to_dict()``) is needed when the adapter is new. ``alias`` (with ``adapter``): requests
        naming it are served by the adapter from now on.

        Example:
            >>> weights.push(trainer_state, policy_version=3)  # doctest: +SKIP
            3
        """
        slot = self.slots.base if adapter is None else self.slots.adapter(adapter)
        self.slots.check_alias(alias, adapter)
        if adapter is None:
            version = next_version(slot.name, slot.version, policy_version)
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            weights.copy_full_weights(base, {k: v.to(self.device) for k, v in tensors.items()})
            for other in self.slots.adapters():  # base + adapter changed: each adapter's version moves
                other.version += 1
        elif slot is None:
            version = next_version(adapter, -1, policy_version)
            if adapter_config is None:
                raise ValueError(f"adapter {adapter!r} is new: its first push needs its adapter_config")
            slot = Slot(adapter, self._add_adapter(weights.new_adapter_config(adapter_config)), None, -1)
            try:
                weights.copy_adapter_weights(self.model, str(slot.adapter), tensors)
            except ValueError:
                self.model.delete_adapter(slot.adapter)
                raise
            self.slots[adapter] = slot
        else:
            version = next_version(adapter, slot.version, policy_version)
            weights.copy_adapter_weights(self.model, str(slot.adapter), tensors)
        slot.path = None  # served from memory: no checkpoint on disk holds these weights
        slot.version = version
        if alias is not None:
            self.slots.aliases[alias] = slot.name
        return version

    def _add_adapter(self, config: Any) -> str:
        """A new, empty adapter in the model from a peft config; returns its id."""
        from peft import PeftModel, get_peft_model

        adapter_id = f"slot{next(self._ids)}"
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(adapter_id, config)
        else:
            self.model = get_peft_model(self.model, config, adapter_name=adapter_id)
        self.model.to(self.device).eval()
        return adapter_id

    def _attach(self, source: str | Slot, model: Any) -> tuple[Any, str]:
        """Put an adapter on ``model`` under a fresh id; returns (model, id).

        ``source``: an adapter directory, or a served slot (its checkpoint, or its tensors when it was
        pushed from memory). A ``ValueError`` leaves ``model`` as it was.
        """
        adapter_id = f"slot{next(self._ids)}"
        if isinstance(source, Slot) and source.path is None:
            model = weights.copy_served_adapter(self.model, str(source.adapter), model, adapter_id)
        else:
            path = source.path if isinstance(source, Slot) else source
            model = weights.attach_adapter(model, str(path), adapter_id)
        model.to(self.device).eval()
        return model, adapter_id


def _has_no_tokenizer(path: str) -> bool:
    """A checkpoint without tokenizer files (trainers often save only weights) keeps the loaded tokenizer."""
    p = Path(path)
    return not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
