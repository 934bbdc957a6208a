"""Policy servers: the vLLM launcher's command line and reload requests (against a scripted stand-in for
``vllm``; vLLM itself needs a GPU), the one name agents send across versions (the served-name proxy), the
external server's reloads, and the local ``sdk.serve`` subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_vllm import VLLM
from trainers import UserError
from trainers.serve.policy import (
    ENV_BASE_URL,
    ENV_MODEL,
    ExternalPolicy,
    LocalPolicy,
    VLLMPolicy,
    export_env,
    make_policy,
)
from trainers.settings import PolicySpec


@pytest.fixture(autouse=True)
def _agents_env(monkeypatch):
    """``export_env`` writes the agents' variables into ``os.environ``: restored after each test, so later
    tests (the docstring examples that read ``TRACERL_POLICY_MODEL``) see the environment they started with."""
    for name in (ENV_BASE_URL, ENV_MODEL):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def vllm_log(tmp_path, monkeypatch):
    log = tmp_path / "vllm.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))

    def read() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return read


@contextlib.contextmanager
def _fake_server() -> Iterator[str]:
    """The scripted vLLM stand-in as a server the user runs; yields its ``/v1`` base URL."""
    from trainers.serve.pidfile import free_port, terminate, wait_healthy

    port = free_port()
    proc = subprocess.Popen([*VLLM, "serve", "x", "--port", str(port)])
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 20, None)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        terminate(proc, 10)


def _adapter(path: Path, base: str) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8}))
    return str(path)


def test_vllm_command_line():
    p = VLLMPolicy("Qwen/Qwen2.5-0.5B-Instruct", lora=True, max_lora_rank=32, port=8123, tool_call_parser="hermes",
                   extra_args="--gpu-memory-utilization 0.5 --dtype bfloat16")  # fmt: skip
    assert p.server_port != 8123  # vLLM listens behind the proxy agents call on 8123
    assert p.command() == [
        "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1", "--port", str(p.server_port),
        "--served-model-name", "policy-base", "--max-logprobs", "20",
        "--enable-lora", "--max-lora-rank", "32", "--max-loras", "2",
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
    p = VLLMPolicy(base, lora=True, max_lora_rank=8, executable=VLLM, startup_timeout=30)
    p.start()
    try:
        launch = vllm_log()[0]
        assert launch["launch"][:2] == ["serve", base] and "--enable-lora" in launch["launch"]
        assert launch["runtime_lora"] == "True"
        export_env(p)
        assert os.environ[ENV_BASE_URL] == p.base_url and os.environ[ENV_MODEL] == "policy"
        # Round 1: the adapter was trained on the served base -> loaded at run time as the next version.
        a1 = _adapter(tmp_path / "round-1" / "final", base)
        p.update(str(tmp_path / "round-1" / "merged"), adapter=a1)
        a2 = _adapter(tmp_path / "round-2" / "final", base)
        p.update(str(tmp_path / "round-2" / "merged"), adapter=a2)
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e]
        assert posts == [
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v1"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy@v1", "lora_path": a1}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v2"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy@v2", "lora_path": a2}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v1"}),
        ]
        with urllib.request.urlopen(p.base_url + "/models") as resp:  # the agents' name, not the versions
            assert [m["id"] for m in json.load(resp)["data"]] == ["policy-base", "policy"]
        assert p.model_name == "policy" and _chat(p.base_url, "policy")[0] == 200
        # An adapter trained on other weights (a merged checkpoint) -> restart on the full weights.
        merged = str(tmp_path / "round-3" / "merged")
        p.update(
            merged, adapter=_adapter(tmp_path / "round-3" / "final", str(tmp_path / "round-2" / "merged"))
        )
        launches = [e for e in vllm_log() if "launch" in e]
        assert len(launches) == 2 and launches[1]["launch"][:2] == ["serve", merged]
        assert "--enable-lora" not in launches[1]["launch"]
        assert launches[1]["launch"][launches[1]["launch"].index("--served-model-name") + 1] == "policy@v3"
        status, raw = _chat(p.base_url, "policy")  # the same address and name after the restart
        assert status == 200 and json.loads(raw)["model"] == "policy@v3"
    finally:
        p.stop()
    assert p._proc is None


def test_vllm_missing_executable_is_a_clear_error(tmp_path):
    p = VLLMPolicy("m", executable="/nonexistent/vllm")
    with pytest.raises(UserError, match="install vLLM"):
        p.start()


def test_external_policy_reloads(tmp_path, vllm_log):
    with _fake_server() as url:
        make_policy(PolicySpec(kind="external", base_url=url), "ignored").update("/ckpt/round-1")
        lora = ExternalPolicy(url, "policy", reload="vllm-lora")
        lora.update("/ckpt/round-1", adapter="/ckpt/round-1/final")
        ExternalPolicy(url, reload="none").update("/x")
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e]
        assert posts == [
            ("/admin/reload", {"path": "/ckpt/round-1"}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v1"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy@v1", "lora_path": "/ckpt/round-1/final"}),
        ]
        assert lora.model_name == "policy" and lora.base_url == url  # not started: no proxy
        with pytest.raises(UserError, match="needs LoRA"):
            lora.update("/ckpt/round-2")
    with pytest.raises(UserError, match="policy.kind must be local, vllm or external, got 'sglang'"):
        PolicySpec.from_mapping({"kind": "sglang"})


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


def _chat(base_url: str, model: str) -> tuple[int, bytes]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stream(base_url: str, model: str) -> tuple[str, str]:
    """A streamed chat call: ``(model, content)`` as the chunks say."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return chunks[0]["model"], "".join(c["choices"][0]["delta"]["content"] for c in chunks)


def test_vllm_one_served_name_across_lora_versions(tmp_path, vllm_log):
    """Issue 50: agents send ``policy`` to one address for the whole run; version N is vLLM's adapter
    ``policy@vN`` and the loop's proxy sends ``policy`` to it, so a request after a reload is answered by
    the new adapter and its response names the version the stored call records.

    Against the scripted stand-in only: this path has not run on a real vLLM server."""
    from sdk.openai_wire import parse_exchange

    base = str(tmp_path / "base")
    Path(base).mkdir()
    p = VLLMPolicy(base, lora=True, executable=VLLM, startup_timeout=30)
    p.start()
    try:
        export_env(p)
        told = (os.environ[ENV_BASE_URL], os.environ[ENV_MODEL])
        assert told == (p.base_url, "policy") and p.base_url != p.server_url
        status, raw = _chat(p.base_url, "policy")  # before any update: the base model
        assert status == 200 and json.loads(raw)["model"] == "policy-base"
        a1 = _adapter(tmp_path / "v1", base)
        a2 = _adapter(tmp_path / "v2", base)
        for version, adapter in ((1, a1), (2, a2)):
            p.update(str(tmp_path / f"m{version}"), adapter=adapter, policy_version=version)
            assert (p.base_url, p.model_name) == told and p.served_name == f"policy@v{version}"
            status, raw = _chat(p.base_url, "policy")
            assert (
                status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == f"adapter {adapter}"
            )
            record = parse_exchange("chat.completions", {"model": "policy", "messages": []}, status, raw)
            assert record.response_model == f"policy@v{version}" and record.policy_version == version
            assert _stream(p.base_url, "policy") == (f"policy@v{version}", f"adapter {adapter}")
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e and "lora" in e["path"]]
        assert posts == [
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v1"}),  # a 404: not loaded (a resumed run)
            ("/v1/load_lora_adapter", {"lora_name": "policy@v1", "lora_path": a1}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v2"}),
            ("/v1/load_lora_adapter", {"lora_name": "policy@v2", "lora_path": a2}),
            ("/v1/unload_lora_adapter", {"lora_name": "policy@v1"}),  # once no request is on its way to it
        ]
        chats = [e["body"]["model"] for e in vllm_log() if e.get("path") == "/v1/chat/completions"]
        assert chats == ["policy-base", "policy@v1", "policy@v1", "policy@v2", "policy@v2"]
        with urllib.request.urlopen(p.base_url + "/models") as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["policy-base", "policy"]
        assert _chat(p.server_url, "policy@v1")[0] == 404  # the previous version is unloaded
        # An agent cannot change its policy through the address it is given: vLLM's adapter routes are not
        # forwarded (nor its weight-transfer routes).
        for route in ("/load_lora_adapter", "/unload_lora_adapter"):
            req = urllib.request.Request(p.base_url + route, data=b'{"lora_name": "policy@v2"}',
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 404
        assert _chat(p.base_url, "policy")[0] == 200
        # An unversioned update is the next version (the name agents send is the same either way).
        p.update(str(tmp_path / "m3"), adapter=a1)
        assert p.model_name == "policy" and p.served_name == "policy@v3" and p.policy_version == 3
    finally:
        p.stop()
    assert p.exit_code() is None and p._proxy is None


def test_external_vllm_lora_keeps_one_name(tmp_path, vllm_log):
    """The user's vLLM server behind the loop's proxy: the name and address agents get stay the same."""
    with _fake_server() as url:
        lora = ExternalPolicy(url, "policy", reload="vllm-lora")
        lora.start()
        try:
            export_env(lora)
            assert os.environ[ENV_MODEL] == "policy" and lora.base_url != url and lora.server_url == url
            for version in (1, 2):
                adapter = f"/ckpt/a{version}"
                lora.update("/ckpt", adapter=adapter, policy_version=version)
                status, raw = _chat(os.environ[ENV_BASE_URL], os.environ[ENV_MODEL])
                assert status == 200 and json.loads(raw)["model"] == f"policy@v{version}"
                assert json.loads(raw)["choices"][0]["message"]["content"] == f"adapter {adapter}"
            assert lora.model_name == "policy"
        finally:
            lora.stop()
        assert lora.base_url == url


def test_external_policy_passes_versions_on(tmp_path, vllm_log):
    with _fake_server() as url:
        ExternalPolicy(url, "policy").update("/ckpt/round-1", policy_version=4)
        lora = ExternalPolicy(url, "policy", reload="vllm-lora")
        lora.update("/ckpt/round-1", adapter="/ckpt/a1", policy_version=7)
        assert lora.model_name == "policy" and lora.policy_version == 7
        posts = [(e["path"], e["body"]) for e in vllm_log() if "path" in e]
        assert posts[0] == ("/admin/reload", {"path": "/ckpt/round-1", "policy_version": 4})
        assert ("/v1/load_lora_adapter", {"lora_name": "policy@v7", "lora_path": "/ckpt/a1"}) in posts
