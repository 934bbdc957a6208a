"""``sdk.train --resume`` (issue 24, items 21, 22): after kill -9, each step is logged once; on a finished run
it says so and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sdk.train import main
from tests.support.synth import make_episodes, write_parquet

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]

# Runs sdk.train with one more callback that kills the process (SIGKILL: no cleanup, no flush) right after
# the metrics row of step KILL_AT is written, before that step's checkpoint could be saved.
KILLED_RUN = """
import os, signal, sys
from transformers import TrainerCallback
import trainers.trl.trainer as T

KILL_AT = int(os.environ["KILL_AT"])
make_callbacks = T._callbacks

class KillAfterLog(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kw):
        if state.global_step >= KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

def with_kill(*args, **kw):
    callbacks, writer = make_callbacks(*args, **kw)
    return [*callbacks, KillAfterLog()], writer

T._callbacks = with_kill
from sdk.train import main
sys.exit(main(sys.argv[1:]))
"""


def _args(data: Path, model: Path, out: Path, max_steps: int) -> list[str]:
    grpo = ["logging_steps=1", "disable_tqdm=true", "save_steps=2", "learning_rate=1e-3"]
    return [
        "--data", str(data), "--model", str(model), "--output", str(out), "--group-size", "4",
        "--max-steps", str(max_steps), *[a for g in grpo for a in ("--grpo", g)],
    ]  # fmt: skip


def _steps(path: Path, key: str | None = None) -> list[int]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["step"] for r in rows if key is None or key in r]


@pytest.fixture
def data(tmp_path: Path, tiny_tokenizer: Any) -> Path:
    return write_parquet(make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path / "episodes.parquet")


@pytest.mark.slow
def test_kill_9_after_a_checkpoint_then_resume_logs_each_step_once(
    tmp_path: Path, data: Path, tiny_model_dir: Path, capsys: Any
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": "5"}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, *_args(data, tiny_model_dir, out, 6)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (out / "checkpoint-4").is_dir() and not (out / "checkpoint-6").exists()
    assert _steps(out / "metrics.jsonl", "loss") == [1, 2, 3, 4, 5]  # step 5 ran past the checkpoint
    assert _steps(out / "trained_episodes.jsonl") == [0, 1, 2, 3, 4]

    assert main([*_args(data, tiny_model_dir, out, 6), "--resume"]) == 0, capsys.readouterr().err
    assert _steps(out / "metrics.jsonl", "loss") == [1, 2, 3, 4, 5, 6]
    assert _steps(out / "trained_episodes.jsonl") == [0, 1, 2, 3, 4, 5]
    assert (out / "final").is_dir()


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so_and_changes_nothing(
    tmp_path: Path, data: Path, tiny_model_dir: Path, capsys: Any
) -> None:
    out = tmp_path / "out"
    assert main(_args(data, tiny_model_dir, out, 2)) == 0
    before = _digest(out)
    capsys.readouterr()
    assert main([*_args(data, tiny_model_dir, out, 2), "--resume"]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip().splitlines() == [
        f"the run in {out} is complete (step 2): nothing to resume; raise --max-steps to train further"
    ], printed
    assert _digest(out) == before  # final/, checkpoints, metrics and logs: byte for byte
    # Without --max-steps the run's own max_steps (from its checkpoint) decides.
    args = _args(data, tiny_model_dir, out, 2)
    i = args.index("--max-steps")
    assert main([*args[:i], *args[i + 2 :], "--resume"]) == 0
    assert "is complete" in capsys.readouterr().out and _digest(out) == before
