"""The GPU training benchmark runs end to end on CPU with the tiny shape (what CI can exercise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_bench_runs_on_cpu_with_tiny_settings(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "bench" / "gpu_train.py"),
        "--shapes",
        "tiny",
        "--lengths",
        "tiny",
    ]
    cmd += ["--tasks", "2", "--group-size", "4", "--batch", "4", "--steps", "2", "--warmup", "1"]
    cmd += ["--micro-batch-size", "2", "--workdir", str(tmp_path), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("device: cpu")
    assert "| run | N | tokens/step |" in proc.stdout
    (r,) = json.loads(out.read_text())
    assert r["shape"] == "tiny" and r["device"].startswith("cpu") and r["mfu_6n"] is None
    assert r["steps"] == 2 and r["tokens_per_s"] > 0 and r["peak_mem_gib"] > 0
    assert 0 < r["replay_prep_s"] < r["step_s"] and r["train_step_s"] > 0
    assert r["settings"]["micro_batch"] == 2 and r["settings"]["accumulation"] == 2
    assert r["store"]["episodes"] == 8 and r["store"]["completion_tokens_mean"] > 0


def test_peak_table_knows_the_issue_gpus():
    from trainers.trl._flops import (
        peak_flops,  # the benchmark's table (tests/bench/gpu_train.py re-exports it)
    )

    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("cpu") is None
