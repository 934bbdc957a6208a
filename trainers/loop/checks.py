"""The loop's model check, made before anything loads: a model the policy server can load."""

from __future__ import annotations

from pathlib import Path

from trainers.errors import UserError

__all__ = ["check_loop_model"]


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
