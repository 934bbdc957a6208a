"""Shared pytest fixtures: the scripted OpenAI-compatible server and a per-test tracerl environment."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from sdk.testing import ScriptedOpenAIServer

# Nothing is downloaded in tests: offline and quiet before transformers/TRL/datasets are imported.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _tracerl_test_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point ``TRACERL_STORE`` at a fresh per-test directory so no test writes to a shared store."""
    store = tmp_path / "tracerl_store"
    store.mkdir()
    monkeypatch.setenv("TRACERL_STORE", str(store))
    yield


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh store, configured for this test; SDK internal errors re-raise instead of being swallowed."""
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    path = tmp_path / "store"
    sdk.configure(store=path, implicit_sessions="process", fsync="never")
    yield path
    sdk.shutdown()


@pytest.fixture
def openai_server() -> Iterator[ScriptedOpenAIServer]:
    """A started :class:`ScriptedOpenAIServer` for one test (default policy, empty queue)."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def shared_openai_server() -> Iterator[ScriptedOpenAIServer]:
    """One server for the whole session; tests that ``enqueue`` should ``reset()`` it when done."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny tokenizer built locally (``trainers._tiny``); nothing downloaded."""
    from trainers._tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Tiny Qwen2 (hidden 64, 2 layers, ~107k parameters) + tokenizer saved to a temp dir, once per run."""
    import torch

    from trainers._tiny import build_tiny_model

    torch.set_num_threads(2)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


# A Ray head on loopback for the `ray` tests, started once per session in its own process (ray.init with
# the dashboard, whose Jobs API the ray backend uses). Its workers import this checkout (PYTHONPATH).
_RAY_HEAD = r"""
import json, os, signal, sys, threading, time
import ray
ctx = ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=0,
               _node_ip_address="127.0.0.1", _temp_dir=sys.argv[1], configure_logging=False)
print(json.dumps({"dashboard": "http://" + ctx.dashboard_url, "gcs": ctx.address_info["gcs_address"]}), flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
parent = os.getppid()
while not stop.wait(1.0) and os.getppid() == parent and sys.stdin.readable():
    pass
ray.shutdown()
"""


class RayHead:
    """A running Ray head: ``dashboard`` (Jobs API URL) and ``gcs`` (``ray.init(address=...)``)."""

    def __init__(self, dashboard: str, gcs: str) -> None:
        self.dashboard = dashboard
        self.gcs = gcs


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    """One local Ray head (2 CPUs, dashboard on 127.0.0.1) for the whole session."""
    import json
    import subprocess
    import sys
    import tempfile

    root = Path(__file__).resolve().parents[1]
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    import secrets

    # Ray's token authentication, with a token of this session's own (nothing read from or written to
    # ~/.ray); this process's Jobs API clients send it too.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(16)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    # Both context managers close what they opened (the log, the pipes): nothing left to a ResourceWarning.
    with (
        open(Path(temp) / "head.log", "wb") as log,
        subprocess.Popen(
            [sys.executable, "-c", _RAY_HEAD, temp],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.PIPE,
            env=env,
            cwd=str(root),
            text=True,
        ) as proc,
    ):
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            proc.kill()
            raise RuntimeError(f"the Ray head did not start: {(Path(temp) / 'head.log').read_text()[-2000:]}")
        info = json.loads(line)
        try:
            yield RayHead(info["dashboard"], info["gcs"])
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ------------------------------------------------------------------------- object storage (moto S3)


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    # botocore (under s3fs) reads the endpoint from AWS_ENDPOINT_URL; so do child processes.
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture()
def bucket(s3_endpoint, tmp_path, monkeypatch):
    """``s3://<fresh bucket>``; this test's spool and read cache under tmp_path."""
    import fsspec

    monkeypatch.setenv("TRACERL_SPOOL", str(tmp_path / "spool"))
    name = f"tracerl-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(name)
    yield f"s3://{name}"
    import sdk

    sdk.shutdown()
