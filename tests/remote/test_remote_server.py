"""The self-hosted training server (``python -m trainers.remote.http_server``) and the ``http`` backend, on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from remote_helpers import TOKEN, TOKEN_ENV

from trainers import resolve_backend
from trainers.errors import AuthError, InvalidDataError, RemoteError, UserError
from trainers.remote import RemoteJob, reattach
from trainers.remote.http_client import HTTPConfig, HTTPTrainer
from trainers.remote.http_server import main as server_main

ROOT = Path(__file__).resolve().parents[2]
CPU_GRPO = {
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "report_to": "none",
    "bf16": False,
    "use_cpu": True,
    "dataloader_num_workers": 0,
}


def config(server, model, out, **kw):
    grpo = {**CPU_GRPO, "max_steps": kw.pop("max_steps", 2)}
    return HTTPConfig(
        server=server.url,
        token_env=TOKEN_ENV,
        model=str(model),
        output_dir=str(out),
        num_generations=4,
        max_length=512,
        grpo=grpo,
        poll_interval=0.2,
        retry_base_delay=0.05,
        **kw,
    )


def headers(token=TOKEN):
    return {"Authorization": f"Bearer {token}"}


def test_resolve_backend_url():
    assert resolve_backend("http://127.0.0.1:8000/") == ("http", {"server": "http://127.0.0.1:8000"})


def test_server_cli_requires_token(monkeypatch, capsys):
    monkeypatch.delenv("TRACERL_NO_SUCH_TOKEN", raising=False)
    assert server_main(["--token-env", "TRACERL_NO_SUCH_TOKEN", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TRACERL_NO_SUCH_TOKEN" in err[0]


def test_requests_without_the_token_are_refused(server, episodes_parquet):
    assert httpx.get(f"{server.url}/healthz").json() == {"ok": True}
    for h in ({}, headers("wrong"), {"Authorization": TOKEN}):
        assert httpx.get(f"{server.url}/v1/jobs", headers=h).status_code == 401
        with open(episodes_parquet, "rb") as fh:
            r = httpx.post(f"{server.url}/v1/jobs", headers=h, files={"file": fh}, data={"config": "{}"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{server.url}/v1/jobs", headers=headers()).status_code == 200


def test_client_auth_errors(server, tiny_model_dir, episodes_parquet, tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(AuthError, match=f"set \\${TOKEN_ENV}"):
        HTTPTrainer().train(episodes_parquet, config(server, tiny_model_dir, tmp_path / "a"))
    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    with pytest.raises(AuthError, match="refused the token") as exc:
        HTTPTrainer().train(episodes_parquet, config(server, tiny_model_dir, tmp_path / "b"))
    assert "not-the-token" not in str(exc.value)  # secrets never appear in messages
    assert not (tmp_path / "b" / "job.json").exists()


def test_invalid_data_rejected_before_upload(server, tiny_model_dir, tmp_path, token_env):
    from _synth import make_episodes, write_parquet

    before = len(httpx.get(f"{server.url}/v1/jobs", headers=headers()).json()["data"])
    eps = make_episodes(2, 4)
    eps[1]["messages"] = eps[1]["messages"][:1]  # no assistant turn
    eps[2]["messages"][3]["tool_call_id"] = "call_nobody"  # tool result answering no call
    path = write_parquet(eps, tmp_path / "bad.parquet")
    with pytest.raises(InvalidDataError) as exc:
        HTTPTrainer().train(path, config(server, tiny_model_dir, tmp_path / "out"))
    assert "2 of 8 episodes are invalid" in str(exc.value)
    assert any(r.startswith("empty_episode: 1 (e.g. ep-0-1)") for r in exc.value.reasons)
    assert any(r.startswith("tool_result_without_call") for r in exc.value.reasons)

    single = write_parquet(make_episodes(4, 1), tmp_path / "single.parquet")  # no task with 2 episodes
    with pytest.raises(UserError, match="at least 2 rewarded episodes"):
        HTTPTrainer().train(single, config(server, tiny_model_dir, tmp_path / "out2"))
    assert len(httpx.get(f"{server.url}/v1/jobs", headers=headers()).json()["data"]) == before


def test_server_validates_uploads(server, tiny_model_dir, episodes_parquet):
    def post(body, cfg):
        return httpx.post(
            f"{server.url}/v1/jobs",
            headers=headers(),
            files={"file": ("e.parquet", body)},
            data={"config": cfg},
        )

    r = post(b"not parquet", json.dumps({"model": str(tiny_model_dir)}))
    assert r.status_code == 422 and "cannot read Parquet" in r.json()["detail"]["message"]
    data = Path(episodes_parquet).read_bytes()
    r = post(data, json.dumps({"model": str(tiny_model_dir), "no_such_field": 1}))
    assert r.status_code == 422 and "no_such_field" in r.json()["detail"]["message"]
    r = post(data, json.dumps({"model": "/no/such/model"}))
    assert r.status_code == 422 and "on the server: model path not found" in r.json()["detail"]["message"]
    r = post(data, "[1, 2")
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"]["message"]
    assert httpx.get(f"{server.url}/v1/jobs/job-doesnotexist", headers=headers()).status_code == 404
    r = httpx.get(f"{server.url}/v1/jobs/job-doesnotexist/artifacts/../../x", headers=headers())
    assert r.status_code == 404


def test_detach_then_cancel(server, tiny_model_dir, episodes_parquet, tmp_path, token_env):
    out = tmp_path / "out"
    res = HTTPTrainer().train(
        episodes_parquet, config(server, tiny_model_dir, out, max_steps=100000, detach=True)
    )
    job = RemoteJob.load(out)
    assert res.metrics["job_id"] == job.job_id and job.backend == "http"
    assert TOKEN not in (out / "job.json").read_text()  # no secret persisted
    with pytest.raises(UserError, match="already follows job"):
        HTTPTrainer().train(episodes_parquet, config(server, tiny_model_dir, out))
    res = reattach(out, cancel=True)
    assert res.metrics["status"] == "cancelled" and RemoteJob.load(out).status == "cancelled"
    assert reattach(out, cancel=True).metrics["status"] == "cancelled"  # idempotent
    with pytest.raises(RemoteError, match="was cancelled"):
        reattach(out)
    events = httpx.get(f"{server.url}/v1/jobs/{job.job_id}/events", headers=headers()).json()["data"]
    assert [e["status"] for e in events if e["type"] == "status"][-1] == "cancelled"


CLIENT = """
import sys
from trainers.remote.http_client import HTTPConfig, HTTPTrainer
cfg = HTTPConfig(**__import__("json").loads(sys.argv[1]))
HTTPTrainer().train(sys.argv[2], cfg)
"""


@pytest.mark.slow
def test_end_to_end_client_restart_and_resume(server, tiny_model_dir, episodes_parquet, tmp_path, token_env):
    out = tmp_path / "out"
    cfg = config(server, tiny_model_dir, out, max_steps=3)
    import dataclasses

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(dataclasses.asdict(cfg)), str(episodes_parquet)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (out / "job.json").is_file():  # the job id is persisted as soon as the server accepts it
        assert client.poll() is None, client.communicate()[1].decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.send_signal(signal.SIGKILL)  # the client machine "restarts"; the job keeps running on the server
    client.wait()
    job = RemoteJob.load(out)
    assert job.backend == "http" and job.endpoint == server.url and not job.terminal

    result = reattach(out)  # what `python -m sdk.train --resume OUT` calls
    assert result.metrics["status"] == "succeeded" and result.global_step == 3
    assert (out / "final" / "model.safetensors").is_file() and (
        out / "final" / "tokenizer_config.json"
    ).is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert (out / "reward.png").read_bytes()[:4] == b"\x89PNG"
    assert RemoteJob.load(out).status == "succeeded"

    # Re-attaching to a finished job is harmless: nothing new to stream, artifacts already present.
    again = reattach(out)
    assert again.global_step == 3 and again.checkpoint == out / "final"
    arts = httpx.get(f"{server.url}/v1/jobs/{job.job_id}/artifacts", headers=headers()).json()["data"]
    assert {"metrics.jsonl", "final/model.safetensors"} <= {a["path"] for a in arts}
