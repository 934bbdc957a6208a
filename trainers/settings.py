"""A backend's trainer and config object from a mapping of settings: one path for the CLI and the loop.

The mapping holds the keys of a ``--config`` YAML file: ``backend`` (a name or a server URL), every field of
the backend's config dataclass, and for ``trl`` a ``grpo:`` mapping of ``trl.GRPOConfig`` fields. Values are
coerced to the field types (YAML 1.1 reads ``1e-5`` as a string); unknown keys are a :class:`UserError`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from trainers import get_trainer, resolve_backend
from trainers.base import Trainer, TrainerConfig
from trainers.errors import UserError

__all__ = ["make_config"]


def parse_bool(value: Any) -> bool:
    """``true/false/yes/no/on/off/1/0`` (any case) or a bool as a bool.

    Example:
        >>> parse_bool("off"), parse_bool(True)
        (False, True)
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise UserError(f"expected a boolean, got {value!r}")


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Coerce a YAML/CLI value to the dataclass field type (YAML 1.1 reads '1e-5' as a string)."""
    if value is None:
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if typing.get_origin(hint) is typing.Literal or typing.get_origin(base) is typing.Literal:
        choices = typing.get_args(hint if typing.get_origin(hint) is typing.Literal else base)
        if value not in choices:
            raise UserError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    try:
        if base is bool:
            return parse_bool(value)
        if base is int and not isinstance(value, bool):
            return int(value)
        if base is float and not isinstance(value, bool):
            return float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a {base.__name__}, got {value!r}") from None
    return value


def make_config(
    settings: Mapping[str, Any], *, backend: str | None = None, source: str = "the settings"
) -> tuple[Trainer, TrainerConfig, str]:
    """The trainer and its config object for ``settings`` (the keys of a ``--config`` file).

    Args:
        settings: Config fields of the backend (and ``grpo``); a ``backend`` key is used when ``backend``
            is not given.
        backend: Backend name or server URL (default: ``settings["backend"]``, else ``trl``).
        source: Where the settings come from, for error messages (e.g. a file name).

    Returns:
        ``(trainer, config, backend)``: a trainer instance, its config, and the backend as given.

    Raises:
        UserError: Unknown keys, values of the wrong type, or settings the config refuses.

    Example:
        >>> trainer, cfg, _ = make_config({"model": "./tiny", "max_length": "512", "grpo": {"beta": 0}})
        >>> type(cfg).__name__, cfg.max_length, cfg.grpo
        ('TRLGRPOConfig', 512, {'beta': 0})
    """
    values = dict(settings)
    given = backend or values.pop("backend", None) or "trl"
    values.pop("backend", None)
    name, overrides = resolve_backend(str(given))  # http://head:8265 -> ("ray", {address})
    trainer_cls = get_trainer(name)
    config_cls = trainer_cls.config_class
    hints = typing.get_type_hints(config_cls)
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UserError(f"unknown setting(s) in {source}: {', '.join(unknown)}")
    if "grpo" in values and not isinstance(values["grpo"] or {}, dict):
        raise UserError("'grpo' must be a mapping of GRPOConfig fields")
    config_values = {k: v if k == "grpo" else _coerce(k, v, hints[k]) for k, v in values.items()}
    config_values.update(overrides)
    try:
        config = config_cls(**config_values)
    except TypeError as exc:
        raise UserError(f"invalid settings: {exc}") from exc
    return trainer_cls(), config, str(given)
