"""Policy servers: the vLLM launcher's command line and reload requests (against a scripted stand-in for
``vllm``; vLLM itself needs a GPU), the external server's reloads, and the local ``sdk.serve`` subprocess."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from trainers import UserError
from trainers.policy import (
    ENV_BASE_URL,
    ENV_MODEL,
    ExternalPolicy,
    LocalPolicy,
    VLLMPolicy,
    export_env,
    make_policy,
)

FAKE = Path(__file__).parent / "fake_vllm.py"


@pytest.fixture
def vllm_log(tmp_path, monkeypatch):
    log = tmp_path / "vllm.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))

    def read() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return read


def _adapter(path: Path, base: str) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8}))
    return str(path)


def test_vllm_command_line():
    p = VLLMPolicy("Qwen/Qwen2.5-0.5B-Instruct", lora=True, max_lora_rank=32, port=8123, tool_call_parser="hermes",
                   extra_args="--gpu-memory-utilization 0.5 --dtype bfloat16")  # fmt: skip
    assert p.command() == [
        "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "policy-base", "--max-logprobs", "20",
        "--enable-lora", "--max-lora-rank", "32", "--max-loras", "1",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--gpu-memory-utilization", "0.5", "--dtype", "bfloat16",
    ]  # fmt: skip
    assert p.env()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and p.base_url == "http://127.0.0.1:8123/v1"
    full = VLLMPolicy("/ckpt", port=8124)
    assert (
        "--enable-lora" not in full.command()
        and full.command()[full.command().index("--served-model-name") + 1] == "policy"
    )
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in full.env() or os.environ.get(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    )


def test_vllm_lora_reload_requests_and_full_weight_restart(tmp_path, vllm_log):
    base = str(tmp_path / "base")
    Path(base).mkdir()
    p = VLLMPolicy(
        base, lora=True, max_lora_rank=8, executable=[sys.executable, str(FAKE)], startup_timeout=30
    )
    p.start()
    try:
        launch = vllm_log()[0]
        assert launch["launch"][:2] == ["serve", base] and "--enable-lora" in launch["launch"]
        assert launch["runtime_lora"] == "True"
        export_env(p)
        assert os.environ[ENV_BASE_URL] == p.base_url and os.environ[ENV_MODEL] == "policy"
        # Round 1: the adapter was trained on the served base -> loaded at run time under the agents' name.
        a1 = _adapter(tmp_path / "round-1" / "final", base)
        p.update(str(tmp_path / "round-1" / "merged"), adapter=a1)
        a2 = _adapter(tmp_path / "round-2" / "final", base)
        p.update(str(tmp_path / "round-2" / "merged"), adapter=a2)
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e]
        assert posts == [
            ("/v1/unload_lora_adapter", {"lora_name": "policy"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy", "lora_path": a1}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy", "lora_path": a2}),
        ]
        with urllib.request.urlopen(p.base_url + "/models") as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["policy"]
        # An adapter trained on other weights (a merged checkpoint) -> restart on the full weights.
        merged = str(tmp_path / "round-3" / "merged")
        p.update(
            merged, adapter=_adapter(tmp_path / "round-3" / "final", str(tmp_path / "round-2" / "merged"))
        )
        launches = [e for e in vllm_log() if "launch" in e]
        assert len(launches) == 2 and launches[1]["launch"][:2] == ["serve", merged]
        assert "--enable-lora" not in launches[1]["launch"]
        assert launches[1]["launch"][launches[1]["launch"].index("--served-model-name") + 1] == "policy"
    finally:
        p.stop()
    assert p._proc is None


def test_vllm_missing_executable_is_a_clear_error(tmp_path):
    p = VLLMPolicy("m", executable="/nonexistent/vllm")
    with pytest.raises(UserError, match="install vLLM"):
        p.start()


def test_external_policy_reloads(tmp_path, vllm_log):
    import subprocess
    import time

    from trainers.policy import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE), "serve", "x", "--port", str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v1"
        make_policy({"kind": "external", "base_url": url}, "ignored").update("/ckpt/round-1")
        lora = ExternalPolicy(url, "policy", reload="vllm-lora")
        lora.update("/ckpt/round-1", adapter="/ckpt/round-1/final")
        ExternalPolicy(url, reload="none").update("/x")
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e]
        assert posts == [
            ("/admin/reload", {"path": "/ckpt/round-1"}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy", "lora_path": "/ckpt/round-1/final"}),
        ]
        with pytest.raises(UserError, match="needs LoRA"):
            lora.update("/ckpt/round-2")
    finally:
        proc.terminate()
        proc.wait()
    with pytest.raises(UserError, match="kind must be"):
        make_policy({"kind": "sglang"}, "m")


@pytest.mark.slow
def test_local_policy_subprocess_serves_and_reloads(tiny_model_dir, tmp_path):
    pytest.importorskip("fastapi")
    p = LocalPolicy(str(tiny_model_dir), "policy", subprocess=True, threads=1, log=tmp_path / "serve.log")
    p.start()
    try:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        req = urllib.request.Request(p.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.load(resp)["model"] == "policy"
        p.update(str(tiny_model_dir))
        with urllib.request.urlopen(p.base_url.removesuffix("/v1") + "/health") as resp:
            assert json.load(resp)["version"] == 1
        with pytest.raises(UserError, match="reload failed"):
            p.update(str(tmp_path / "missing"))
    finally:
        p.stop()
