"""Full weights pushed into a running vLLM through its weight-transfer routes (vLLM 0.33's documented path).

Against the scripted stand-in (``tests/support/fake_vllm.py``): vLLM itself and its NCCL data plane need
GPUs, so the data plane here is a TCP socket (``SocketSender``) and the stand-in reads each tensor's bytes
in the order of the names it was given and logs their SHA-256. What is tested is tracerl's side: the server's flags,
the order of the routes, the metadata, the tensors' bytes and order, the version, requests during a push,
and the failures.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
import urllib.request

import pytest

from tests.support.fake_vllm import VLLM
from trainers import UserError
from trainers.serve.policy import VLLMPolicy

torch = pytest.importorskip("torch")


class SocketSender:
    """The trainer's end of the stand-in's data plane: rank 0 listens, each worker connects."""

    def __init__(self) -> None:
        self.conns: list[socket.socket] = []

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        with socket.create_server((master_address, master_port)) as server:
            server.settimeout(30)
            self.conns = [server.accept()[0] for _ in range(world_size - 1)]

    def send(self, tensors) -> None:
        for t in tensors:
            data = _bytes(t)
            for conn in self.conns:
                conn.sendall(data)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []


def _bytes(t) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensors(scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(int(scale * 100))
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g) * scale,
        "model.layers.0.mlp.up_proj.weight": torch.randn(12, 8, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.ones(8) * scale,
    }


def _params(tensors: dict) -> dict:
    return {n: [str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in tensors.items()}


@pytest.fixture
def start_vllm(tmp_path, monkeypatch):
    """Start a ``VLLMPolicy`` with weight_transfer on the stand-in: ``start(update_delay=0) -> (policy, log)``."""
    log = tmp_path / "vllm.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    params = tmp_path / "params.json"
    params.write_text(json.dumps(_params(_tensors())))
    monkeypatch.setenv("FAKE_VLLM_PARAMS", str(params))
    started = []

    def read() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def start(update_delay: float = 0.0):
        monkeypatch.setenv("FAKE_VLLM_UPDATE_DELAY", str(update_delay))
        p = VLLMPolicy(
            "base",
            executable=VLLM,
            startup_timeout=30,
            weight_transfer=True,
            weight_sender=SocketSender(),
        )
        started.append(p)
        p.start()
        return p, read

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def vllm(start_vllm):
    return start_vllm()


def _chat(p: VLLMPolicy) -> str:
    body = json.dumps({"model": p.model_name, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        p.base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["choices"][0]["message"]["content"]


def test_the_server_starts_in_dev_mode_with_the_nccl_backend():
    p = VLLMPolicy("m", weight_transfer=True, port=8123)
    cmd = p.command()
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert p.env()["VLLM_SERVER_DEV_MODE"] == "1"
    assert p.pushes(lora=False) and not p.pushes(lora=True)
    assert not VLLMPolicy("m").pushes(lora=False)  # without weight_transfer: a restart on a saved copy
    with pytest.raises(UserError, match="full weights"):
        VLLMPolicy("m", lora=True, weight_transfer=True)


def test_a_push_runs_the_routes_in_order_and_the_server_gets_the_tensors_bytes(vllm):
    p, read = vllm
    assert read()[0]["dev_mode"] == "1"
    tensors = _tensors()
    stats = p.push(tensors, policy_version=3)
    assert stats["policy_version"] == 3 and p.policy_version == 3
    assert stats["bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    posts = [e["path"] for e in read() if "path" in e]
    assert posts == [
        "/init_weight_transfer_engine",
        "/pause?mode=keep",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/resume",
    ]
    by_path = {e["path"]: e["body"] for e in read() if "path" in e}
    info = by_path["/init_weight_transfer_engine"]["init_info"]
    assert info["rank_offset"] == 1 and info["world_size"] == 2 and info["master_address"] == "127.0.0.1"
    assert by_path["/update_weights"]["update_info"] == {
        "names": list(tensors),
        "dtype_names": ["float32", "bfloat16", "float32"],
        "shapes": [[16, 8], [12, 8], [8]],
    }
    assert by_path["/finish_weight_update"] == {"weight_version": "3"}
    received = next(e["received"] for e in read() if "received" in e)
    assert received == {n: hashlib.sha256(_bytes(t)).hexdigest() for n, t in tensors.items()}
    assert _chat(p) == "v3"
    # The next push: no second rendezvous, the next version by default.
    p.push(_tensors(2.0))
    posts = [e["path"] for e in read() if "path" in e]
    assert posts.count("/init_weight_transfer_engine") == 1 and posts[-1] == "/resume"
    assert [e["received"] for e in read() if "received" in e][-1]["model.norm.weight"] == (
        hashlib.sha256(_bytes(torch.ones(8) * 2.0)).hexdigest()
    )
    assert _chat(p) == "v4" and p.model_name == "policy"


def test_a_request_during_a_push_waits_and_is_answered_by_the_new_weights(start_vllm):
    p, read = start_vllm(update_delay=1.0)
    p.push(_tensors(), policy_version=1)
    done: dict = {}
    t = threading.Thread(target=lambda: done.update(p.push(_tensors(3.0), policy_version=2)))
    t.start()
    deadline = time.time() + 10
    while sum(e.get("path") == "/pause?mode=keep" for e in read()) < 2:  # the second push has paused
        assert time.time() < deadline
        time.sleep(0.005)
    assert _chat(p) == "v2"  # sent while paused: queued (never refused), answered after the update finished
    t.join()
    assert done["policy_version"] == 2


def test_weights_the_server_refuses_are_one_error_and_the_server_resumes(vllm):
    p, read = vllm
    bad = {"model.norm.weight": torch.ones(9)}  # the served model's has 8
    with pytest.raises(UserError, match=r"refused /update_weights \(400\).*no parameter model.norm.weight"):
        p.push(bad, policy_version=1)
    posts = [e["path"] for e in read() if "path" in e]
    assert posts[-1] == "/resume"  # agents are not left paused
    assert _chat(p) == "ok"  # the version never finished
    with pytest.raises(UserError, match="partly updated: restart the server"):
        p.push(_tensors(), policy_version=2)


def test_a_server_that_is_gone_is_one_error(vllm):
    p, _ = vllm
    p._proc.kill()
    p._proc.wait()
    with pytest.raises(UserError, match="is gone"):
        p.push(_tensors(), policy_version=1)


def test_push_needs_weight_transfer_and_full_weights(tmp_path):
    with pytest.raises(UserError, match="weight_transfer=True"):
        VLLMPolicy("m").push(_tensors())
    with pytest.raises(UserError, match="full weights"):
        VLLMPolicy("m", weight_transfer=True).push(_tensors(), adapter_config={"r": 4})


@pytest.mark.slow
def test_the_loop_trainer_pushes_its_trained_weights_into_vllm(
    start_vllm, tmp_path, tiny_model_dir, monkeypatch
):
    """The loops' publish: full weights go through the transfer (nothing on disk), as the trainer holds them."""
    from transformers import AutoTokenizer

    from tests.support.synth import cpu_grpo, make_episodes
    from trainers.loop.training import LoopTrainer

    monkeypatch.delenv("FAKE_VLLM_PARAMS")  # the tiny model's names and shapes are whatever it has
    p, read = start_vllm()
    settings = {
        "model": str(tiny_model_dir),
        "output_dir": str(tmp_path / "train"),
        "group_size": 4,
        "eval_fraction": 0,
        "plots": False,
        "grpo": cpu_grpo(per_device_train_batch_size=4, max_steps=1),
    }
    lt = LoopTrainer(settings, planned_steps=2)
    lt.train(make_episodes(2, 4, tokenizer=AutoTokenizer.from_pretrained(str(tiny_model_dir))), steps=1)
    stats = lt.publish(p, 1)
    tensors, _ = lt.resident.weights()
    received = next(e["received"] for e in read() if "received" in e)
    assert received == {n: hashlib.sha256(_bytes(t)).hexdigest() for n, t in tensors.items()}
    assert stats["push_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert not list((tmp_path / "train").glob("serve-v*"))  # no copy on disk
    assert _chat(p) == "v1"


def test_a_sender_that_cannot_join_is_one_error_without_waiting_for_the_server(start_vllm):
    class NoJoin(SocketSender):
        def join(self, master_address: str, master_port: int, world_size: int) -> None:
            raise OSError("no route to the workers")

    p, _ = start_vllm()
    p.weight_sender = NoJoin()
    # One error at once; the stand-in's side of the rendezvous (it waits 30 s for this side) is not waited for.
    with pytest.raises(UserError, match="weight transfer failed: OSError: no route to the workers"):
        p.push(_tensors(), policy_version=1)
