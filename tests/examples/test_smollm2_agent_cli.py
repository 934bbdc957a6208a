"""``python -m examples.smollm2_agent`` on bad arguments: one ``error:`` line and exit status 2, before any
model is loaded (no model package needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--seed", "x"], "invalid int value"),
        (["--rounds", "-1"], "--rounds must be >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--sft-lr", "0"], "--sft-lr must be > 0"),
        (["--set", "rounds"], "--set takes KEY=YAML"),
        (["--set", "train.grpo=["], "--set train.grpo: not YAML"),
    ],
)
def test_bad_arguments_are_one_error_line(args: list[str], says: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "examples.smollm2_agent", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
