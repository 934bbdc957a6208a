"""Issue 38 items 14 (server part), 15 and 16: a reload is all or nothing, every bad reload is a JSON 4xx
(``ValueError`` from the Python API), versions only move forward, and ``sdk.serve``'s bad arguments are one
``error:`` line and exit 2. A real ``python -m sdk.serve`` process on the tiny model, plain HTTP clients."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from tests.support.serve import (  # noqa: E402
    ADMIN,
    MSGS,
    admin_env,
    full_state,
    make_adapter,
    make_base,
    reference_logprobs,
)
from trainers.serve.pidfile import free_port, terminate, wait_healthy  # noqa: E402


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The base, adapters on it, a narrower base (its adapters do not fit the base) and damaged copies."""
    from trainers._tiny import build_tiny_model

    root = tmp_path_factory.mktemp("reload")
    base = make_base(root)
    narrow = str(build_tiny_model(root / "narrow", hidden_size=32))
    out = {"base": base, "narrow": narrow, "alpha": make_adapter(base, root / "alpha", seed=1)}
    out["other"] = str(build_tiny_model(root / "other", seed=3))  # same shapes as the base
    out["alpha2"] = make_adapter(base, root / "alpha2", seed=2)
    out["misshaped"] = make_adapter(narrow, root / "misshaped", seed=3)  # r x 32 where the base needs r x 64
    shutil.copytree(out["alpha"], root / "garbage")
    (root / "garbage" / "adapter_model.safetensors").write_bytes(b"\x00garbage" * 64)
    out["garbage"] = str(root / "garbage")
    shutil.copytree(base, root / "corrupt")
    (root / "corrupt" / "model.safetensors").write_bytes(b"not a checkpoint" * 64)
    out["corrupt"] = str(root / "corrupt")
    return out


def _ask(root: str, model: str) -> tuple[list[int], list[int], list[float], int]:
    r = httpx.post(f"{root}/v1/chat/completions", timeout=60, json={
        "model": model, "messages": MSGS, "temperature": 0, "max_tokens": 6, "logprobs": True,
        "return_token_ids": True,
    })  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    lps = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    return body["prompt_token_ids"], body["choices"][0]["token_ids"], lps, body["policy_version"]


def _reload(root: str, **body: object) -> httpx.Response:
    return httpx.post(f"{root}/admin/reload", json=body, timeout=120, headers=ADMIN)


def _versions(root: str) -> dict[str, int]:
    return {m["id"]: m["policy_version"] for m in httpx.get(f"{root}/v1/models", timeout=10).json()["data"]}


def test_bad_reloads_are_json_4xx_and_change_nothing_and_versions_only_move_forward(
    weights, tmp_path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "sdk.serve", "--model", weights["base"], "--model-name", "base",
           "--adapter", f"alpha={weights['alpha']}", "--port", str(port), "--threads", "1",
           "--reload-root", str(Path(weights["base"]).parent)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=admin_env())
    root = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{root}/health", proc, 120, log)
        before = {name: _ask(root, name) for name in ("base", "alpha")}

        # Item 16: garbage or mis-shaped adapter weights, a corrupt base checkpoint: JSON 400, nothing moved.
        for bad in ("garbage", "misshaped"):
            for name in ("alpha", "gamma"):  # replacing an adapter, adding one
                r = _reload(root, adapter=name, checkpoint=weights[bad])
                assert r.status_code == 400, r.text
                assert r.json()["error"]["message"].startswith("ValueError: cannot load the LoRA adapter")
        r = _reload(root, checkpoint=weights["corrupt"])
        assert r.status_code == 400 and "cannot load the checkpoint" in r.json()["error"]["message"]

        # Item 15: new base weights on which the adapter does not load: not swapped in, the old base serves.
        r = _reload(root, checkpoint=weights["narrow"], policy_version=7)
        assert r.status_code == 400 and "not swapped in" in r.json()["error"]["message"]
        assert "'alpha'" in r.json()["error"]["message"]
        assert _versions(root) == {"base": 0, "alpha": 0}
        assert {name: _ask(root, name) for name in ("base", "alpha")} == before
        prompt, ids, lps, _ = before["base"]
        ref = reference_logprobs(weights["base"], None, prompt, ids)
        assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3

        # Item 14: versions only move forward; new base weights move the adapters' versions too.
        assert (
            _reload(root, adapter="alpha", checkpoint=weights["alpha2"], policy_version=3).status_code == 200
        )
        r = _reload(root, adapter="alpha", checkpoint=weights["alpha"], policy_version=2)
        assert r.status_code == 409 and r.json()["error"]["code"] == "stale_version"
        assert _versions(root) == {"base": 0, "alpha": 3} and _ask(root, "alpha")[3] == 3
        r = _reload(root, checkpoint=weights["base"], policy_version=5)
        assert r.status_code == 200 and r.json()["versions"] == {"base": 5, "alpha": 4}
        assert _ask(root, "alpha")[3] == 4 and _ask(root, "base")[3] == 5
        r = _reload(root, checkpoint=weights["base"], policy_version=4)
        assert r.status_code == 409 and _versions(root) == {"base": 5, "alpha": 4}

        from trainers.serve.weights import encode_push

        state = full_state(weights["base"])
        r = httpx.post(
            f"{root}/admin/weights?policy_version=1", content=encode_push(state), timeout=60, headers=ADMIN
        )
        assert r.status_code == 409 and "only move forward" in r.json()["error"]["message"]
        r = httpx.post(f"{root}/admin/weights", content=encode_push(state), timeout=60, headers=ADMIN)
        assert r.status_code == 200 and r.json()["versions"] == {"base": 6, "alpha": 5}
    finally:
        terminate(proc, 10)


def test_python_api_raises_value_error_and_keeps_serving_what_it_served(weights) -> None:
    """In-process: ValueError (never SafetensorError/RuntimeError); a failed first adapter leaves the plain
    model plain; an adapter pushed from memory is carried onto new base weights."""
    from safetensors.torch import load_file

    from trainers.serve.engine import Engine
    from trainers.serve.versions import StaleVersion

    engine = Engine(weights["base"], model_name="base")
    ask = {"model": "base", "messages": MSGS, "temperature": 0, "max_tokens": 4, "logprobs": True}
    plain = engine.chat(ask)["choices"][0]["logprobs"]
    for bad in ("garbage", "misshaped"):
        with pytest.raises(ValueError, match="cannot load the LoRA adapter") as info:
            engine.reload_adapter("alpha", weights[bad])
        assert type(info.value) is ValueError
    assert not any("lora" in name for name, _ in engine.model.named_modules())
    assert engine.chat(ask)["choices"][0]["logprobs"] == plain and engine.versions() == {"base": 0}
    with pytest.raises(ValueError, match="cannot load the checkpoint"):
        engine.reload(weights["corrupt"])

    config = __import__("json").loads((Path(weights["alpha"]) / "adapter_config.json").read_text())
    tensors = load_file(str(Path(weights["alpha"]) / "adapter_model.safetensors"))
    assert engine.push(tensors, adapter="pushed", adapter_config=config, policy_version=2) == 2
    pushed = engine.chat({**ask, "model": "pushed"})["choices"][0]["logprobs"]
    with pytest.raises(ValueError, match="not swapped in"):
        engine.reload(weights["narrow"])
    assert engine.versions() == {"base": 0, "pushed": 2} and engine.weights.slots.base.path == weights["base"]
    assert engine.reload(weights["base"]) == 1 and engine.versions() == {"base": 1, "pushed": 3}
    assert engine.chat({**ask, "model": "pushed"})["choices"][0]["logprobs"] == pushed  # carried over
    with pytest.raises(StaleVersion):
        engine.push(tensors, adapter="pushed", policy_version=1)
    # A base push under a served adapter: the base's own tensors change, the adapter's version moves.
    assert engine.push(full_state(weights["other"])) == 2 and engine.versions() == {"base": 2, "pushed": 4}
    resp = engine.chat({**ask, "return_token_ids": True})
    lps = [e["logprob"] for e in resp["choices"][0]["logprobs"]["content"]]
    ref = reference_logprobs(
        weights["other"], None, resp["prompt_token_ids"], resp["choices"][0]["token_ids"]
    )
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-3
    with pytest.raises(StaleVersion):
        engine.reload(weights["base"], policy_version=0)


def test_cli_bad_arguments_are_one_error_line_and_exit_2(weights, tmp_path, capsys) -> None:
    from trainers.serve.app import main

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    base, alpha = weights["base"], weights["alpha"]
    cases = {
        "the base weights are served as 'base'": ["--model", base, "--model-name", "base", "--adapter", f"base={alpha}"],
        "must not end in @v<N>": ["--model", base, "--adapter", f"alpha@v2={alpha}"],
        "--model: no model directory at '/": ["--model", str(tmp_path / "missing"), "--port", str(free_port())],
        "--port must be 1..65535": ["--model", base, "--port", "70000"],
        "cannot listen on 127.0.0.1": ["--model", base, "--port", str(busy.getsockname()[1])],
        "--threads must be >= 1": ["--model", base, "--threads", "0"],
        "no such process": ["--model", base, "--parent-pid", str(dead.pid)],
        "invalid int value": ["--model", base, "--port", "eighty"],
        "cannot load the checkpoint": ["--model", weights["corrupt"], "--port", str(free_port())],
    }  # fmt: skip
    try:
        for expected, argv in cases.items():
            with pytest.raises(SystemExit) as info:
                main(argv)
            err = capsys.readouterr().err.strip().splitlines()
            assert info.value.code == 2 and len(err) == 1, (argv, err)
            assert err[0].startswith("error: ") and expected in err[0], (argv, err)
    finally:
        busy.close()
    # A corrupt adapter at start, as a real process: one line, exit 2, no traceback.
    argv = ["--model", base, "--adapter", f"alpha={weights['garbage']}", "--port", str(free_port())]
    out = subprocess.run(
        [sys.executable, "-m", "sdk.serve", *argv], capture_output=True, text=True, timeout=120
    )
    lines = out.stderr.splitlines()  # issue 53 item 17: that line alone (no progress bar or warnings)
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and "cannot load the LoRA adapter" in lines[0]
