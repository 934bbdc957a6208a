"""Checks of the loop's settings that need no model: field types, and a model the policy server can load."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from trainers.errors import UserError

__all__ = ["check_field_types", "check_loop_model"]


def _kind(value: Any, hint: str) -> tuple[Any, str | None]:
    """``(value, None)`` when ``value`` fits ``hint`` (int → float, path → str), else ``(value, wanted)``."""
    if hint.startswith("int"):
        return value, None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if hint.startswith("float"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return value, "a number"
    if hint.startswith("str"):
        if isinstance(value, os.PathLike):  # run_loop({"model": Path(...)}) from Python
            value = os.fspath(value)
        return value, None if isinstance(value, str) else "a string"
    if hint.startswith("bool"):
        return value, None if isinstance(value, bool) else "true or false"
    return value, None if isinstance(value, dict) else "a mapping"  # dict[str, Any] (| None)


def check_field_types(settings: Any) -> None:
    """Check that each field of the dataclass ``settings`` holds its declared type.

    Ints become floats where floats are declared, paths strings. YAML hands over ``rounds: 1.5`` or
    ``agent: 3`` as they are.

    Raises:
        UserError: The first field of the wrong type, named.

    Example:
        >>> @dataclasses.dataclass
        ... class S:
        ...     rounds: int = 1
        >>> check_field_types(S(rounds=1.5))
        Traceback (most recent call last):
        trainers.errors.UserError: rounds must be an integer, got 1.5
    """
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        hint = str(f.type)
        if value is None and "None" in hint:
            continue
        value, wanted = _kind(value, hint)
        if wanted is not None:
            raise UserError(f"{f.name} must be {wanted}, got {value!r}")
        setattr(settings, f.name, value)


def check_loop_model(model: str) -> None:
    """The policy server loads the model on this machine: a directory, or a hub model already downloaded.

    Raises:
        UserError: Neither (a download would need the network, and fail mid-start without it), or a
            directory tracerl did not finish writing (:func:`trainers._model_dir.check_model_dir`).

    Example:
        >>> check_loop_model(".")
    """
    from trainers._model_dir import check_model_dir

    check_model_dir(model)  # a directory tracerl did not finish writing: one line saying what is missing
    if Path(model).expanduser().is_dir():
        return
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - comes with transformers
        return
    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise UserError(
            f"model {model!r} is neither a directory nor a model in the local Hugging Face cache; download "
            f"it first (huggingface-cli download {model} --local-dir DIR) and set model: DIR"
        )
