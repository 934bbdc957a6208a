"""The engine's adapter slots: the served names, the weights each routes to, and each one's version.

One slot serves the base weights (under the base model's name), one each LoRA adapter on them (peft
multi-adapter; the adapter lives in the peft model under an id of its own, so a replacement loads beside
the one it replaces). An alias is a stable name routed to an adapter's slot: a push points it
at the trained adapter, so the name agents send stays the same for a whole run (an alias of the base's own
name routes that name to the adapter). A request's ``model`` routes to a slot (:meth:`Slots.route`): an
alias first, then a slot's name (a ``@v<N>`` suffix ignored); with one slot, every name routes to it.

Example:
    >>> slots = Slots("base", None, 0)
    >>> slots["router"] = Slot("router", "slot0", "runs/router")
    >>> slots.route("router@v3"), slots.served(), slots.versions()
    ('router', {'base': 'base', 'router': 'router'}, {'base': 0, 'router': 0})
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trainers.serve.versions import check_name, unversioned

__all__ = ["ModelNotFound", "Slot", "Slots"]


class ModelNotFound(LookupError):
    """The requested ``model`` is neither the base model's name nor a loaded adapter's (HTTP 404).

    Example:
        >>> str(ModelNotFound("the model 'x' does not exist"))
        "the model 'x' does not exist"
    """


@dataclass
class Slot:
    """One servable set of weights: the base model (``adapter`` None) or one LoRA adapter on it.

    ``adapter`` is the adapter's id in the peft model; ``path`` the checkpoint the weights came from (None:
    pushed from memory).

    Example:
        >>> Slot("router", "slot0", "runs/router", version=2).version
        2
    """

    name: str
    adapter: str | None
    path: str | None
    version: int = 0


class Slots(dict[str, Slot]):
    """The served slots by name, the base's first (``base``), and the aliases routed to them (``aliases``).

    Args:
        base: The base weights' name.
        path: Their checkpoint (None: a model object).
        version: Their version as loaded.

    Example:
        >>> Slots("base", "runs/sft", 3).base.path
        'runs/sft'
    """

    def __init__(self, base: str, path: str | None, version: int) -> None:
        self.base = Slot(base, None, path, int(version))
        super().__init__({base: self.base})
        self.aliases: dict[str, str] = {}  # looked up before the slots

    def adapters(self) -> list[Slot]:
        """The adapters' slots.

        Example:
            >>> Slots("base", None, 0).adapters()
            []
        """
        return [s for s in self.values() if s.adapter is not None]

    def adapter(self, name: str) -> Slot | None:
        """The slot of the adapter ``name``, None when new (``ValueError``: the base's or a versioned name).

        Example:
            >>> Slots("base", None, 0).adapter("base")
            Traceback (most recent call last):
            ValueError: 'base' names the base weights, not an adapter
        """
        slot = self.get(check_name(name))
        if slot is not None and slot.adapter is None:
            raise ValueError(f"{name!r} names the base weights, not an adapter")
        return slot

    def check_alias(self, alias: str | None, adapter: str | None) -> None:
        """Refuse (``ValueError``) an ``alias`` that may not route to the pushed ``adapter``.

        Example:
            >>> Slots("base", None, 0).check_alias("base", None)
            Traceback (most recent call last):
            ValueError: an alias names an adapter pushed under another name
        """
        if alias is None:
            return
        if adapter is None or check_name(alias) == adapter:
            raise ValueError("an alias names an adapter pushed under another name")
        if alias in self and self[alias].adapter is not None:
            raise ValueError(f"the alias {alias!r} names another adapter")

    def route(self, model: str | None) -> str:
        """The slot a request's ``model`` routes to (raises :class:`ModelNotFound`).

        Example:
            >>> Slots("base", None, 0).route(None)
            'base'
        """
        name = unversioned(model or "")
        if name in self.aliases:
            return self.aliases[name]
        if name in self:
            return name
        if len(self) == 1:
            return self.base.name
        raise ModelNotFound(f"the model {model!r} does not exist; served: {', '.join(self.served())}")

    def served(self) -> dict[str, str]:
        """``{name a request may send: the slot serving it}``: slots an alias does not shadow, then aliases.

        Example:
            >>> Slots("policy", None, 0).served()
            {'policy': 'policy'}
        """
        return {**{n: n for n in self if n not in self.aliases}, **self.aliases}

    def versions(self) -> dict[str, int]:
        """``{slot name: policy version}``.

        Example:
            >>> Slots("base", None, 3).versions()
            {'base': 3}
        """
        return {n: s.version for n, s in self.items()}

    @contextmanager
    def serving(self, model: Any, name: str) -> Iterator[None]:
        """Forwards of ``model`` inside run on slot ``name``'s weights: its adapter, or the base bare.

        Example:
            >>> with slots.serving(model, "router"):  # doctest: +SKIP
            ...     model(input_ids=ids)
        """
        adapter = self[name].adapter
        if adapter is not None:
            model.set_adapter(adapter)
            yield
        elif len(self) > 1:
            with model.disable_adapter():
                yield
        else:
            yield
