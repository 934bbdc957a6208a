"""``python -m sdk.train --backend tinker`` against a real Tinker API server: SkyRL tx, self-hosted on CPU.

SkyRL tx (``skyrl[tinker,jax]``) implements the Tinker REST API with JAX. ``tests/setup.sh`` installs it into
``.venv-skyrl`` (Python 3.12, with ``uv``: its API server starts its engine with ``uv run``); set
``TRACERL_SKYRL_VENV`` to use another environment. The server trains a LoRA adapter on a tiny Qwen3 built
here (hidden 64, 2 layers, the project's tiny tokenizer; nothing downloaded), and the client is the
project's own tinker SDK.

The episodes carry exact token ids and, as behaviour logprobs, the base model's own logprobs of them
(computed here with transformers). A fresh LoRA adapter is the base model, so on the first step every
importance ratio is 1 and the server's summed loss is exactly minus the summed advantages: that checks
the datums' alignment (position i predicts token i + 1) and the logprobs end to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker")

ROOT = Path(__file__).resolve().parents[2]
LORA_RANK = 8


def _skyrl_venv() -> Path | None:
    venv = Path(os.environ.get("TRACERL_SKYRL_VENV") or ROOT / ".venv-skyrl")
    ok = (venv / "bin" / "python").exists() and (venv / "bin" / "uv").exists()
    return venv if ok else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_policy_logprobs(episodes: list[dict[str, Any]], model_dir: Path) -> list[dict[str, Any]]:
    """Replace each turn's logprobs with the base model's logprobs of its tokens (as if it sampled them)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    for ep in episodes:
        for turn in ep["turns"]:
            prompt, tokens = turn["prompt_token_ids"], turn["token_ids"]
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            lps = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
            turn["logprobs"] = lps.tolist()
    return episodes


class SkyRLServer:
    """SkyRL tx's Tinker API (and the engine it starts) on 127.0.0.1, in its own process group."""

    def __init__(self, venv: Path, model: Path, work: Path) -> None:
        self.port, self.work, self.log_path = _free_port(), work, work / "skyrl.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.checkpoints = work / "checkpoints"
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",  # the engine: `uv run ...`
            "UV_OFFLINE": "1",
            "UV_CACHE_DIR": str(work / "uv-cache"),
        }
        # `uv run` as SkyRL documents it: the API server re-uses its parent's `uv run` flags for the engine.
        cmd = [
            str(venv / "bin" / "uv"), "run", "--no-project", "--python", str(venv / "bin" / "python"),
            "-m", "skyrl.tinker.api",
            "--base-model", str(model),
            "--backend", "jax",
            "--backend-config", json.dumps({"max_lora_rank": LORA_RANK}),
            "--checkpoints-base", str(self.checkpoints),
            "--database-url", f"sqlite:///{work / 'tinker.db'}",
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_healthy(self, timeout: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"SkyRL tx exited ({self.proc.returncode}): {self.tail()}")
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"SkyRL tx did not answer /api/v1/healthz within {timeout:.0f} s: {self.tail()}")

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        # The API server, `uv` and the engine share one process group (start_new_session): end them all.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever did not stop (the engine outlives the API)
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    from trainers._tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), architecture="qwen3")


@pytest.fixture(scope="module")
def skyrl(tiny_qwen3, tmp_path_factory) -> Iterator[SkyRLServer]:
    venv = _skyrl_venv()
    if venv is None:
        pytest.skip("no SkyRL tx environment: run tests/setup.sh (or set TRACERL_SKYRL_VENV)")
    server = SkyRLServer(venv, tiny_qwen3, tmp_path_factory.mktemp("skyrl"))
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def policy_episodes(tiny_qwen3, tiny_tokenizer, tmp_path_factory) -> Path:
    from tests.support.synth import make_episodes, write_parquet

    episodes = _with_policy_logprobs(make_episodes(2, 4, tokenizer=tiny_tokenizer), tiny_qwen3)
    return write_parquet(episodes, tmp_path_factory.mktemp("data") / "episodes.parquet")


def _train(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TINKER_API_KEY": "tml-local-skyrl"}
    return subprocess.run(
        [sys.executable, "-m", "sdk.train", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _run_args(skyrl: SkyRLServer, model: Path, data: Path, out: Path, **opts: Any) -> list[str]:
    args = [
        "--backend", "tinker", "--data", str(data), "--model", str(model), "--tokenizer", str(model),
        "--base-url", skyrl.url, "--group-size", "4", "--lora-rank", str(LORA_RANK),
        "--learning-rate", "0.01", "--output", str(out),
    ]  # fmt: skip
    for key, value in opts.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _base_losses(data: Path, model: Path) -> list[float]:
    """Per task group: the importance-sampling loss at ratio 1, i.e. minus the sum of the advantages."""
    from trainers.data import prepare_data
    from trainers.remote.tinker_backend import TinkerConfig, TinkerTrainer

    cfg = TinkerConfig(model=str(model), tokenizer=str(model), group_size=4)
    batches = TinkerTrainer().build_datums(prepare_data(data, cfg), cfg)
    return [-sum(float(d.loss_fn_inputs["advantages"].to_numpy().sum()) for d in b) for b in batches]


def test_short_rl_run_trains_and_saves_state_and_sampler_weights(
    skyrl, tiny_qwen3, policy_episodes, tmp_path
):
    out = tmp_path / "run"
    proc = _train(
        *_run_args(skyrl, tiny_qwen3, policy_episodes, out, steps=3, save_every=2, groups_per_step=2)
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + skyrl.tail()
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["datums"] == 8 for r in rows)
    # Step 1 runs on the base weights with the base model's logprobs as behaviour: every ratio is 1.
    assert rows[0]["loss:sum"] == pytest.approx(sum(_base_losses(policy_episodes, tiny_qwen3)), rel=1e-3)
    # The same 8 sequences every step: the updates lower their loss.
    assert rows[2]["loss:sum"] < rows[1]["loss:sum"] < rows[0]["loss:sum"]

    result = json.loads((out / "result.json").read_text())
    model_id = result["sampler_path"].removeprefix("tinker://").split("/")[0]
    assert result["steps"] == 3 and result["state_path"] == f"tinker://{model_id}/weights/tracerl-final"
    assert result["sampler_path"].endswith("/tracerl-final")
    saved = skyrl.checkpoints / model_id
    assert (saved / "tracerl-000002.tar.gz").exists() and (saved / "tracerl-final.tar.gz").exists()
    # The sampler weights are a PEFT LoRA adapter of the requested rank, trained away from its zero init.
    with tarfile.open(saved / "sampler_weights" / "tracerl-final.tar.gz") as tar:
        tar.extractall(tmp_path / "adapter", filter="data")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == LORA_RANK
    from safetensors.numpy import load_file

    lora_b = [
        v for k, v in load_file(tmp_path / "adapter" / "adapter_model.safetensors").items() if "lora_B" in k
    ]
    assert lora_b and any(abs(v).max() > 0 for v in lora_b)


def test_killed_client_resumes_from_its_last_state_and_cancel_is_final(
    skyrl, tiny_qwen3, policy_episodes, tmp_path, capsys
):
    out = tmp_path / "run"
    args = _run_args(skyrl, tiny_qwen3, policy_episodes, out, steps=6, save_every=2, groups_per_step=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TINKER_API_KEY": "tml-local-skyrl"}
    client = subprocess.Popen(
        [sys.executable, "-m", "sdk.train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and client.poll() is None:
            with_state = (out / "job.json").exists() and _job(out)["info"].get("state_path")
            if with_state:
                break
            time.sleep(0.01)
        client.kill()  # SIGKILL: no clean-up runs in the client
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    job = _job(out)
    assert job["status"] == "running" and not (out / "result.json").exists(), "the run ended before the kill"
    saved_at = job["info"]["state_step"]
    assert job["info"]["state_path"].endswith(f"/weights/tracerl-{saved_at:06d}")
    shutil.copytree(out, tmp_path / "to-cancel")

    proc = _train("--resume", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:] + skyrl.tail()
    assert f"restoring Tinker state {job['info']['state_path']} (step {saved_at})" in proc.stderr
    assert json.loads((out / "result.json").read_text())["steps"] == 6
    # The first step after the restore starts from the saved weights, not from the base model.
    resumed = [r for r in _rows(out) if r["step"] == saved_at + 1][-1]
    base = _base_losses(policy_episodes, tiny_qwen3)[saved_at % 2]
    assert resumed["loss:sum"] != pytest.approx(base, rel=1e-3)

    # Cancelling contacts nothing (the loop runs on the client): run in this process.
    from sdk.train import main as train_main

    assert train_main(["--resume", str(tmp_path / "to-cancel"), "--cancel"]) == 0
    assert _job(tmp_path / "to-cancel")["status"] == "cancelled"
    train_main(["--resume", str(tmp_path / "to-cancel")])
    assert "already cancelled" in capsys.readouterr().err
    assert not (tmp_path / "to-cancel" / "result.json").exists()


def test_lora_rank_over_the_servers_limit_is_one_error_line(skyrl, tiny_qwen3, policy_episodes, tmp_path):
    args = _run_args(skyrl, tiny_qwen3, policy_episodes, tmp_path / "run", steps=1)
    args[args.index("--lora-rank") + 1] = str(2 * LORA_RANK)
    proc = _train(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("error: create LoRA training client:")
    assert f"LoRA rank {2 * LORA_RANK} must be between 1 and {LORA_RANK}" in lines[-1]


def _job(out: Path) -> dict[str, Any]:
    return json.loads((out / "job.json").read_text())
