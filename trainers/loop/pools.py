"""What the lock-step and the asynchronous loop share: task pools and merging a LoRA adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainers._memory import release_memory
from trainers.errors import UserError

__all__ = ["load_pools", "merge_adapter"]


def load_pools(cfg: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The training tasks and the validation tasks (``None`` without ``eval_tasks``) of a loop config.

    Raises:
        UserError: A task file that cannot be read, or no training tasks.

    Example:
        >>> load_pools(LoopConfig(agent="a:f", tasks="t.jsonl", model="m"))  # doctest: +SKIP
    """
    from sdk.rollout import RolloutError, load_tasks

    try:
        pool = load_tasks(cfg.tasks, cfg.id_field)
        eval_pool = load_tasks(cfg.eval_tasks, cfg.id_field) if cfg.eval_tasks else None
    except RolloutError as exc:
        raise UserError(str(exc)) from None
    if not pool:
        raise UserError(f"no tasks in {cfg.tasks}")
    return pool, eval_pool


def merge_adapter(base: str, adapter: Path, dest: Path) -> str:
    """Merge a LoRA adapter into its base weights: a model directory that serves anywhere (saved once).

    Example:
        >>> merge_adapter("base", Path("train/final"), Path("train/merged"))  # doctest: +SKIP
        'train/merged'
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainers._model_dir import writing_model_dir

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with writing_model_dir(dest, by="tracerl loop (merged adapter)") as aside:  # whole or not at all
        merged.save_pretrained(aside)
        AutoTokenizer.from_pretrained(
            str(adapter) if (adapter / "tokenizer_config.json").exists() else base
        ).save_pretrained(aside)
    del model, merged
    release_memory()
    return str(dest)
