"""Model directories appear whole or not at all: ``tracerl sft`` killed -9 while saving, ``tracerl model`` on a
path it cannot write, and the check the loop and the policy server make before loading one.

The kills are real (``kill -9`` of a ``tracerl sft`` process); the moment is made deterministic by a wrapper
that holds the process at one step of the save (after the weights, or with the weights half-written, as a
kill during that write leaves them), then the test kills it there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.synth import make_episodes, write_parquet
from trainers._model_dir import COMPLETE_MARK, check_local_model, check_model_dir, writing_model_dir
from trainers.errors import UserError

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]

# argv: mode ready_file, then tracerl sft's arguments. Holds `tracerl sft` inside its save for the kill.
HELD_SFT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import transformers

    mode, ready = sys.argv[1], Path(sys.argv[2])
    if mode == "after-weights":  # the weights are written; the tokenizer and the summary are next
        def held(self, *args, **kwargs):
            ready.write_text("weights written")
            time.sleep(600)
        transformers.PreTrainedTokenizerBase.save_pretrained = held
    else:  # "torn-weights": the weights file is half there, as a kill during its write leaves it
        real = transformers.PreTrainedModel.save_pretrained
        def held(self, save_directory, *args, **kwargs):
            real(self, save_directory, *args, **kwargs)
            f = Path(save_directory) / "model.safetensors"
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // 2])
            ready.write_text("weights half written")
            time.sleep(600)
        transformers.PreTrainedModel.save_pretrained = held
    from trainers.sft import main
    sys.exit(main(sys.argv[3:]))
    """
)


def _sft_args(tmp_path: Path, model: Path, out: Path) -> list[str]:
    data = tmp_path / "episodes.parquet"
    if not data.exists():
        write_parquet(make_episodes(2, 2, tools_in_prompt=True), data)
    return ["--data", str(data), "--model", str(model), "--output", str(out), "--max-steps", "1",
            "--eval-fraction", "0"]  # fmt: skip


def _killed_while_saving(tmp_path: Path, mode: str, args: list[str]) -> None:
    """Run ``tracerl sft`` held at ``mode`` in its save, and kill -9 it there."""
    ready = tmp_path / f"ready-{mode}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_SFT, mode, str(ready), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "tracerl sft never reached its save"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _serve_refuses(model: Path) -> str:
    """Start ``python -m sdk.serve`` on ``model``: it must exit 2 with one line (a server up is a failure)."""
    from trainers.serve.pidfile import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "sdk.serve", "--model", str(model), "--port", str(free_port())]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the policy server started on {model}: {out[-300:]}")
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.slow
def test_sft_killed_after_the_weights_leaves_nothing_the_loop_or_the_server_takes(tmp_path, tiny_model_dir):
    out = tmp_path / "sft"
    _killed_while_saving(tmp_path, "after-weights", _sft_args(tmp_path, tiny_model_dir, out))
    # Weights without their tokenizer (no chat template) must not pass for a model directory.
    with pytest.raises(UserError) as exc:
        check_local_model(str(out))
    message = str(exc.value)
    assert "\n" not in message and "tracerl sft stopped while writing it" in message, message
    assert "tracerl sft stopped while writing it" in _serve_refuses(out)


@pytest.mark.slow
def test_sft_rerun_killed_while_writing_the_weights_leaves_the_finished_directory(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from trainers.sft import main

    out = tmp_path / "sft"
    assert main(_sft_args(tmp_path, tiny_model_dir, out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _killed_while_saving(tmp_path, "torn-weights", [*_sft_args(tmp_path, tiny_model_dir, out), "--seed", "1"])
    # The finished directory is as it was: its weights beside its own summary, never half-written ones.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    check_local_model(str(out))
    AutoModelForCausalLM.from_pretrained(out)


def _immutable(path: Path) -> bool:
    path.mkdir()
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("where", ["under_a_file", "immutable_dir"])
def test_model_on_a_path_it_cannot_write_is_one_error_line(tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "model"
    else:
        locked = tmp_path / "locked"
        if not _immutable(locked):
            pytest.skip("chattr +i needs root on a file system with attributes")
        out = locked / "model"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sdk.cli", "model", "tiny", "--out", str(out)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "locked")], capture_output=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert str(out) in lines[0]
    assert not out.exists()
    if out.parent.is_dir():  # nothing left aside either
        assert [p.name for p in out.parent.iterdir()] == []


def test_a_directory_missing_a_file_its_mark_lists_is_refused_and_a_users_own_is_not(
    tmp_path, tiny_model_dir
):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    check_model_dir(copy)
    (copy / "tokenizer_config.json").unlink()
    with pytest.raises(UserError, match="tokenizer_config.json is missing"):
        check_local_model(str(copy))
    # A Hugging Face directory tracerl did not write (no mark) loads as it is.
    (copy / COMPLETE_MARK).unlink()
    check_local_model(str(copy))


def test_a_failed_write_leaves_the_old_directory_and_no_aside(tmp_path):
    out = tmp_path / "m"
    with writing_model_dir(out, by="test") as aside:
        (aside / "config.json").write_text("{}")
    with pytest.raises(RuntimeError), writing_model_dir(out, by="test") as aside:
        (aside / "config.json").write_text('{"new": 1}')
        raise RuntimeError("the save failed")
    assert json.loads((out / "config.json").read_text()) == {}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # A directory holding something else is never replaced.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with (
        pytest.raises(UserError, match="not a model directory"),
        writing_model_dir(tmp_path / "other", by="t"),
    ):
        pass
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_a_killed_writers_aside_is_named_by_the_check_and_cleared_by_the_next_write(tmp_path):
    out = tmp_path / "m"
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()  # a pid no live process has (the killed writer's)
    aside = tmp_path / f".m.tracerl-writing-{dead.pid}-abcdef"
    aside.mkdir()
    (aside / "tracerl_writing.json").write_text(json.dumps({"by": "tracerl sft", "pid": dead.pid}))
    (aside / "model.safetensors").write_bytes(b"half")
    with pytest.raises(UserError, match=r"was never completed: tracerl sft stopped while writing it"):
        check_model_dir(out)
    out.mkdir()  # an empty directory a library made before the kill: still not a model
    with pytest.raises(UserError, match=r"is incomplete: tracerl sft stopped while writing it"):
        check_model_dir(out)
    with writing_model_dir(out, by="test") as new:
        (new / "config.json").write_text("{}")
    check_model_dir(out)
    assert not aside.exists() and (out / COMPLETE_MARK).is_file()


# argv: out ready_file. The loop saves a new best/ over the previous one and is killed -9 half-way.
HELD_BEST = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trainers.loop.rounds import mark_best as _mark_best

    out, ready = Path(sys.argv[1]), Path(sys.argv[2])

    def save(path):
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)  # as save_pretrained does
        (path / "config.json").write_text('{"round": 2}')
        (path / "model.safetensors").write_bytes(b"half of round 2")
        ready.write_text("saving")
        time.sleep(600)

    rows = [{"round": 1, "val_success": 0.5, "checkpoint": str(out / "r1")},
            {"round": 2, "val_success": 0.9, "checkpoint": str(out / "r2")}]
    _mark_best(out, rows, save)
    """
)


def test_the_loops_best_killed_while_saving_keeps_the_previous_best_whole(tmp_path):
    best = tmp_path / "best"
    best.mkdir()  # round 1's, saved when it was the best
    (best / "config.json").write_text('{"round": 1}')
    (best / "model.safetensors").write_bytes(b"round 1 weights")
    before = {p.name: p.read_bytes() for p in best.iterdir()}
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HELD_BEST, str(tmp_path), str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert {p.name: p.read_bytes() for p in best.iterdir()} == before
    check_local_model(str(best))
