"""``tests/bench/gpu_suite.sh --cpu``: the GPU suite's one command runs end to end on the tiny shape (CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_suite_runs_on_cpu_and_writes_one_json_and_one_table(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    cmd = ["bash", str(ROOT / "tests" / "bench" / "gpu_suite.sh"), "--cpu", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert suite["mode"] == "cpu" and suite["train_rc"] == 0
    assert "skipped" in suite["pytest_gpu"]["summary"]  # the gpu tests skip cleanly without CUDA
    padded, free = suite["runs"]
    assert (padded["label"], free["label"]) == ("tiny padded", "tiny padding-free")
    assert padded["settings"]["padding_free"] is False and free["settings"]["padding_free"] is True
    assert free["settings"]["fallback"] is None and free["settings"]["micro_batch_tokens"] == 256
    assert padded["tokens_per_step"] == free["tokens_per_step"] > 0
    assert abs(sum(free["profile"]["split"].values()) - 1) < 0.01
    table = (tmp_path / "suite.md").read_text()
    assert "| tiny padding-free |" in table and "profile of tiny padding-free" in table


def test_gpu_suite_rejects_an_unknown_argument(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "bench" / "gpu_suite.sh"), "--nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown argument --nope")
