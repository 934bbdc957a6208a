"""The ``ray`` backend against a local Ray head on loopback (``ray_head`` in tests/conftest.py): a TRL job on
the tiny model submitted, followed, its artifacts copied back, re-attached after the client is killed,
cancelled; bad data refused before anything is submitted; Ray's token authentication."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdk.train import main as train_main
from tests.support.synth import cpu_grpo
from trainers import resolve_backend
from trainers.errors import InvalidDataError, RemoteError, UserError
from trainers.remote import RemoteJob, reattach
from trainers.remote.ray_jobs import RayConfig, RayTrainer

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def config(head, model, out, **kw):
    grpo = cpu_grpo(max_steps=kw.pop("max_steps", 2))
    return RayConfig(
        address=head.dashboard,
        model=str(model),
        output_dir=str(out),
        group_size=4,
        max_length=512,
        grpo=grpo,
        poll_interval=0.3,
        retry_base_delay=0.05,
        **kw,
    )


def jobs(head):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.dashboard).list_jobs()


def test_resolve_backend_and_settings(monkeypatch, tmp_path):
    assert resolve_backend("http://127.0.0.1:8265/") == ("ray", {"address": "http://127.0.0.1:8265"})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UserError, match="pass --address"):
        RayTrainer().check_config(RayConfig(model="m", output_dir=str(tmp_path)))
    with pytest.raises(UserError, match="set --artifacts"):  # a remote cluster cannot write here
        RayTrainer().check_config(RayConfig(model="m", address="http://10.1.2.3:8265"))
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    cfg = RayTrainer().check_config(RayConfig(model="m", output_dir=str(tmp_path / "o")))
    assert cfg.address == "http://127.0.0.1:8265" and cfg.artifacts == str(tmp_path / "o" / ".ray-artifacts")


def test_invalid_data_rejected_before_submitting(ray_head, tiny_model_dir, tmp_path):
    from tests.support.synth import make_episodes, write_parquet

    before = len(jobs(ray_head))
    eps = make_episodes(2, 4)
    eps[1]["messages"] = eps[1]["messages"][:1]  # no assistant turn
    path = write_parquet(eps, tmp_path / "bad.parquet")
    with pytest.raises(InvalidDataError, match="1 of 8 episodes are invalid"):
        RayTrainer().train(path, config(ray_head, tiny_model_dir, tmp_path / "out"))
    single = write_parquet(make_episodes(4, 1), tmp_path / "single.parquet")  # no task with 2 episodes
    with pytest.raises(UserError, match="at least 2 rewarded episodes"):
        RayTrainer().train(single, config(ray_head, tiny_model_dir, tmp_path / "out2"))
    assert len(jobs(ray_head)) == before and not (tmp_path / "out" / "job.json").exists()


def run_cli(capsys, args):
    rc = train_main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_detach_resume_cancel(ray_head, tiny_model_dir, episodes_parquet, tmp_path, capsys):
    out = tmp_path / "ray"
    base = ["--backend", "ray", "--address", ray_head.dashboard, "--data", episodes_parquet]
    base += ["--model", tiny_model_dir, "--output", out, "--poll-interval", "0.3"]
    rc, _, err = run_cli(capsys, [*base, "--detach", "--grpo", "max_steps=100000"])
    assert rc == 0, err
    job = RemoteJob.load(out)
    assert job.backend == "ray" and job.endpoint == ray_head.dashboard and job.job_id.startswith("tracerl-")
    assert os.environ["RAY_AUTH_TOKEN"] not in (out / "job.json").read_text()  # no secret persisted
    rc, _, err = run_cli(capsys, base)  # the directory already follows an unfinished job
    assert rc == 2 and "already follows job" in err.strip().splitlines()[-1]
    rc, _, err = run_cli(capsys, ["--resume", out, "--cancel"])
    assert rc == 0 and RemoteJob.load(out).status == "cancelled", err
    assert reattach(out, cancel=True).metrics["status"] == "cancelled"  # idempotent
    with pytest.raises(RemoteError, match="was cancelled"):
        reattach(out)
    deadline = time.monotonic() + 60
    while (status := _ray_status(ray_head, job.job_id)) not in ("STOPPED", "FAILED"):
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    # Nothing of the job trains on: its sdk.train (max_steps 100000) once outlived the stop by 45 minutes.
    deadline = time.monotonic() + 30
    while left := _processes_of(job.job_id):
        assert time.monotonic() < deadline, left
        time.sleep(0.5)


def _processes_of(job_id: str) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if job_id in cmdline and "sdk.train" in cmdline:
            found.append(cmdline)
    return found


KEEP = """
import sys
from trainers.remote.ray_jobs import _run_training
sys.exit(_run_training([sys.executable, "-c", "import os, sys, time; print(os.getpid(), flush=True); time.sleep(300)"]))
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_training_process_ends_with_the_job(how):
    """``ray job stop`` SIGTERMs what the entrypoint runs then SIGKILLs it: either way its training process ends
    (the signal passed on; the kernel's parent-death signal where the entrypoint is killed outright)."""
    import psutil

    entry = subprocess.Popen(
        [sys.executable, "-c", KEEP],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = psutil.Process(int(entry.stdout.readline()))
    entry.send_signal(getattr(signal, how))
    child.wait(timeout=30)  # psutil.TimeoutExpired if it trains on
    assert entry.wait(timeout=30) == (-signal.SIGKILL if how == "SIGKILL" else 128 + signal.SIGTERM)


def _ray_status(head, job_id):
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(head.dashboard).get_job_status(job_id).value)


def test_wrong_token_is_one_error_line(ray_head, tmp_path):
    out = tmp_path / "o"
    RemoteJob(
        backend="ray", job_id="tracerl-000000000000", endpoint=ray_head.dashboard, status="running"
    ).save(out)
    env = {**os.environ, "RAY_AUTH_TOKEN": "0" * 32, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "sdk.train", "--resume", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("error: the Ray cluster at") and "refused" in lines[-1]


def test_job_failing_on_the_cluster(ray_head, episodes_parquet, tmp_path):
    cfg = config(ray_head, "/no/such/model", tmp_path / "out")
    with pytest.raises(RemoteError, match="model path not found"):
        RayTrainer().train(episodes_parquet, cfg)
    assert RemoteJob.load(tmp_path / "out").status == "failed"


CLIENT = """
import json, sys
from trainers.remote.ray_jobs import RayConfig, RayTrainer
RayTrainer().train(sys.argv[2], RayConfig(**json.loads(sys.argv[1])))
"""


def test_train_kill_client_reattach_download(ray_head, tiny_model_dir, episodes_parquet, tmp_path):
    out = tmp_path / "out"
    cfg = config(ray_head, tiny_model_dir, out, max_steps=3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(dataclasses.asdict(cfg)), str(episodes_parquet)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (out / "job.json").is_file():  # the job id is persisted as soon as Ray accepted the job
        assert client.poll() is None, client.communicate()[1].decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.send_signal(signal.SIGKILL)  # the client machine "restarts"; the job keeps running on the cluster
    client.wait()
    job = RemoteJob.load(out)
    assert job.backend == "ray" and job.endpoint == ray_head.dashboard and not job.terminal

    result = reattach(out)  # what `python -m sdk.train --resume OUT` calls
    assert result.metrics["status"] == "succeeded" and result.global_step == 3
    assert (out / "final" / "model.safetensors").is_file() and (
        out / "final" / "tokenizer_config.json"
    ).is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert (out / "reward.png").read_bytes()[:4] == b"\x89PNG"
    assert RemoteJob.load(out).status == "succeeded" and RemoteJob.load(out).cursor > 0

    again = reattach(out)  # re-attaching to a finished job is harmless: nothing new, artifacts present
    assert again.global_step == 3 and again.checkpoint == out / "final"


@pytest.mark.s3
def test_data_and_artifacts_on_object_storage(
    ray_head, bucket, tiny_model_dir, episodes_parquet, tmp_path, capsys
):
    """What a multi-host cluster needs: the job reads s3:// data and writes its output to s3:// artifacts,
    which the client copies back (moto's S3 on loopback; its endpoint reaches the job through env_vars)."""
    import fsspec

    fsspec.filesystem("s3").put_file(str(episodes_parquet), f"{bucket}/episodes.parquet")
    out = tmp_path / "out"
    env_vars = ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    cfg = config(ray_head, tiny_model_dir, out, artifacts=f"{bucket}/runs", env_vars=",".join(env_vars))
    result = RayTrainer().train(f"{bucket}/episodes.parquet", cfg)
    assert result.metrics["status"] == "succeeded" and result.global_step == 2
    assert (out / "final" / "model.safetensors").is_file()
    job = RemoteJob.load(out)
    assert job.info["artifacts"] == f"{bucket}/runs/{job.job_id}"
    stored = fsspec.filesystem("s3").find(f"{bucket}/runs/{job.job_id}")
    assert any(p.endswith("/final/model.safetensors") for p in stored)  # written there by the job
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in (out / "job.json").read_text()
    err = capsys.readouterr().err  # the job's own log, followed here as it ran
    assert "[tracerl] running:" in err and "tracerl training finished" in err


def test_job_entrypoint_launches_one_process_per_gpu(tmp_path, monkeypatch):
    """On the cluster, num_gpus > 1 runs sdk.train under accelerate launch (no GPU here: the command line)."""
    from trainers.remote import ray_jobs

    ran = []

    def call(cmd):
        ran.append(cmd)
        out = Path(cmd[cmd.index("--output") + 1])
        (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
        return 0

    monkeypatch.setattr(ray_jobs, "_run_training", call)
    for gpus, launcher in (("4", ["accelerate", "launch", "--num_processes", "4"]), ("1", [sys.executable])):
        art = tmp_path / f"art-{gpus}"
        assert (
            ray_jobs.run_job(["--artifacts", str(art), "--num-gpus", gpus, "--", "--config", "j.yaml"]) == 0
        )
        assert ran[-1] == [*launcher, "-m", "sdk.train", "--config", "j.yaml", "--output", str(art)]
        result = json.loads((art / "result.json").read_text())
        assert result["status"] == "succeeded" and result["global_step"] == 1
