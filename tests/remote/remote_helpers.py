"""Shared pieces of the remote-backend tests (a uniquely named module: ``conftest`` names collide)."""

from __future__ import annotations

CPU_GRPO = {
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "report_to": "none",
    "bf16": False,
    "use_cpu": True,
    "dataloader_num_workers": 0,
}
