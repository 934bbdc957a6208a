"""``sdk.serve`` with several LoRA adapters on one base: routing by the requested model name, one adapter
reloaded while the others keep serving (issue 27 item 3). The server is a real ``python -m sdk.serve``
process on the tiny model; clients are the real ``openai`` client and plain HTTP."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tests.support.serve import (  # noqa: E402
    ADMIN,
    MSGS,
    admin_env,
    make_adapter,
    make_base,
    reference_logprobs,
)
from trainers.serve.pidfile import free_port, terminate, wait_healthy  # noqa: E402


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("weights")
    base = make_base(root)
    return {
        "base": base,
        "alpha": make_adapter(base, root / "alpha", seed=1),
        "beta": make_adapter(base, root / "beta", seed=2),
        "alpha2": make_adapter(base, root / "alpha2", seed=3),
    }


@pytest.fixture(scope="module")
def server(weights: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """``python -m sdk.serve --model BASE --adapter alpha=... --adapter beta=...`` in a child process."""
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "serve.log"
    cmd = [sys.executable, "-m", "sdk.serve", "--model", weights["base"], "--model-name", "base",
           "--adapter", f"alpha={weights['alpha']}", "--adapter", f"beta={weights['beta']}",
           "--port", str(port), "--threads", "1",
           "--reload-root", str(tmp_path_factory.getbasetemp())]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=admin_env())
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 120, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        terminate(proc, 10)


def _ask(root: str, model: str) -> tuple[list[int], list[int], list[float], int, str]:
    r = httpx.post(f"{root}/v1/chat/completions", timeout=60, json={
        "model": model, "messages": MSGS, "temperature": 0, "max_tokens": 6, "logprobs": True,
        "return_token_ids": True,
    })  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert int(r.headers["X-Tracerl-Policy-Version"]) == body["policy_version"]
    choice = body["choices"][0]
    lps = [e["logprob"] for e in choice["logprobs"]["content"]]
    return body["prompt_token_ids"], choice["token_ids"], lps, body["policy_version"], body["model"]


def test_routes_by_model_name_to_each_adapters_weights(server: str, weights: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["base", "alpha", "beta"]
    seen = {}
    for name in ("base", "alpha", "beta"):
        prompt, ids, lps, version, model = _ask(server, name)
        assert model == name and version == 0
        ref = reference_logprobs(weights["base"], None if name == "base" else weights[name], prompt, ids)
        assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3
        seen[name] = (ids, lps)
    # Different weights: the same greedy request gives different tokens or logprobs per name.
    assert seen["alpha"] != seen["beta"] and seen["alpha"] != seen["base"]
    assert _ask(server, "alpha@v0")[1:3] == seen["alpha"]  # a version suffix routes to the adapter
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gamma", messages=MSGS, max_tokens=2)


def test_reload_one_adapter_while_the_other_keeps_serving(server: str, weights: dict[str, str]) -> None:
    before = _ask(server, "beta")
    alpha_before = _ask(server, "alpha")
    results: list[tuple] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            try:
                results.append(_ask(server, "beta"))
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=keep_asking) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        r = httpx.post(f"{server}/admin/reload", timeout=60, headers=ADMIN,
                       json={"adapter": "alpha", "checkpoint": weights["alpha2"]})  # fmt: skip
        assert r.status_code == 200 and r.json()["policy_version"] == 1
        after_reload = len(results)
        while len(results) < after_reload + 2 and not errors:  # beta still answers after the swap too
            threading.Event().wait(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors and results
    # Same weights, same version: nothing touched beta. Its logprobs agree to float rounding, not bit for bit:
    # the running batch computes a request alone, beside another, or on a kept prompt prefix.
    for prompt, ids, lps, version, model in results:
        assert (prompt, ids, version, model) == (before[0], before[1], before[3], before[4])
        assert max(abs(a - b) for a, b in zip(lps, before[2], strict=True)) < 1e-5
    prompt, ids, lps, version, _ = _ask(server, "alpha")
    assert version == 1 and (ids, lps) != alpha_before[1:3]
    ref = reference_logprobs(weights["base"], weights["alpha2"], prompt, ids)
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3
    models = httpx.get(f"{server}/v1/models").json()["data"]
    assert {m["id"]: m["policy_version"] for m in models} == {"base": 0, "alpha": 1, "beta": 0}


def test_bad_reload_and_bad_adapter_arguments(server: str, tmp_path: Path) -> None:
    bad = httpx.post(
        f"{server}/admin/reload", json={"adapter": "alpha", "checkpoint": str(tmp_path)}, headers=ADMIN
    )
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    bad = httpx.post(
        f"{server}/admin/reload", json={"checkpoint": str(tmp_path), "policy_version": -1}, headers=ADMIN
    )
    assert bad.status_code == 400
    out = subprocess.run([sys.executable, "-m", "sdk.serve", "--model", str(tmp_path), "--adapter", "x"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "NAME=PATH" in out.stderr and "Traceback" not in out.stderr


def test_local_policy_adds_and_replaces_adapters_and_reloads_the_base_under_them(
    weights: dict[str, str], tmp_path: Path
) -> None:
    """In-process (``trainers.serve.policy.LocalPolicy``): adapters added and replaced by name, each with its own
    version; new base weights are loaded with the adapters applied on them again (their versions move)."""
    from trainers import UserError
    from trainers._tiny import build_tiny_model
    from trainers.serve.policy import LocalPolicy

    other = str(build_tiny_model(tmp_path / "other", seed=1))
    p = LocalPolicy(weights["base"], "base", adapters={"alpha": weights["alpha"]})
    p.start()
    try:
        root = p.base_url.removesuffix("/v1")
        assert p.update_adapter("beta", weights["beta"]) == 0  # a new name: served from now on
        assert p.update_adapter("alpha", weights["alpha2"], policy_version=4) == 4
        prompt, ids, lps, version, _ = _ask(root, "alpha")
        assert version == 4 and _ask(root, "beta")[3] == 0
        ref = reference_logprobs(weights["base"], weights["alpha2"], prompt, ids)
        assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3
        p.update(other, policy_version=1)
        prompt, ids, lps, version, _ = _ask(root, "alpha")  # base + adapter changed: its version moves
        assert version == 5 and _ask(root, "base")[3] == 1 and p.policy_version == 1
        ref = reference_logprobs(other, weights["alpha2"], prompt, ids)
        assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3
        with pytest.raises(UserError, match="adapter_config.json"):
            p.update_adapter("alpha", str(tmp_path))
    finally:
        p.stop()
