"""``accelerate launch --multi_gpu --num_processes 2 -m sdk.train`` on CPU: two processes (gloo), tiny model.

``accelerate launch --cpu --num_processes 2`` would start ONE process: accelerate 1.15 routes ``--cpu`` to its
simple launcher, which starts several CPU processes only through ``mpirun``. ``--multi_gpu`` with
``ACCELERATE_USE_CPU=1`` starts two torchrun workers on CPU and accelerate picks the gloo backend.

Checks what users rely on when they add GPUs: every process trains whole GRPO groups, the processes' shares of
a step are disjoint, and only the main process writes the outputs (metrics, plots, episodes log, model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.synth import make_episodes, write_parquet

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_two_cpu_processes_train_disjoint_whole_groups(tmp_path, tiny_model_dir, tiny_tokenizer):
    pytest.importorskip("accelerate")
    data = write_parquet(make_episodes(4, 4, tokenizer=tiny_tokenizer), tmp_path / "episodes.parquet")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "sdk.train",
        "--data",
        str(data),
        "--model",
        str(tiny_model_dir),
        "--output",
        str(out),
        "--group-size",
        "4",
        "--max-steps",
        "2",
        "--learning-rate",
        "1e-3",
        "--per-device-train-batch-size",
        "4",
        "--grpo",
        "save_steps=2",
        "--grpo",
        "disable_tqdm=true",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = [json.loads(x) for x in (out / "trained_episodes.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]  # one row per generation batch, written once
    seen: set[str] = set()
    for r in rows:
        shares = r["shares"]
        assert len(shares) == 2  # one share per process
        assert not set(shares[0]) & set(shares[1])  # disjoint
        for share in shares:
            tasks = {e.rsplit("-", 1)[0] for e in share}
            assert len(tasks) == 1 and len(share) == 4  # one whole group: the 4 episodes of one task
            assert sorted(share) == [f"{next(iter(tasks))}-{i}" for i in range(4)]
        seen |= {e for share in shares for e in share}
    assert len(seen) == 16  # 2 steps x 2 processes x 1 group: every group trained once

    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]  # not duplicated by the second process
    for name in ("reward.png", "loss.png", "config.yaml", "data_report.json"):
        assert (out / name).is_file(), name
    assert (out / "final" / "model.safetensors").is_file()
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert proc.stdout.count("tracerl training finished") == 2  # each process reports; files come from one
