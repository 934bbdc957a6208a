"""``python -m sdk.train`` with remote backends: ``--backend http://host:port``, ``--resume DIR``, ``--cancel``."""

from __future__ import annotations

import json

from fake_openai import FakeOpenAI
from remote_helpers import TOKEN

from sdk.train import main
from trainers.remote import RemoteJob


def run(capsys, args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def error_line(rc, err):
    """The CLI's one-line error (progress lines may precede it; never a traceback)."""
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    return errors[0]


def test_openai_via_cli_detach_resume_cancel(tmp_path, capsys, monkeypatch):
    from _synth import make_episodes, write_parquet

    fake = FakeOpenAI()
    try:
        monkeypatch.setenv("TRACERL_TEST_OPENAI_KEY", fake.api_key)
        data = write_parquet(make_episodes(12, 2), tmp_path / "e.parquet")
        out = tmp_path / "ft"
        common = ["--api-key-env", "TRACERL_TEST_OPENAI_KEY", "--base-url", fake.base_url]
        common += ["--poll-interval", "0.01", "--retry-base-delay", "0.01"]
        args = ["--backend", "openai", "--data", data, "--model", "gpt-4.1-mini-2025-04-14", "--output", out]
        rc, _, err = run(capsys, [*args, *common, "--detach"])
        assert rc == 0, err
        assert RemoteJob.load(out).backend == "openai"
        rc, _, err = run(capsys, [*args, *common])  # the directory already follows an unfinished job
        assert "already follows job" in error_line(rc, err)
        rc, stdout, err = run(capsys, ["--resume", out])  # re-attach: no --data, no --backend needed
        assert rc == 0, err
        assert "ft:gpt-4.1-mini-2025-04-14:tracerl::" in stdout and RemoteJob.load(out).status == "succeeded"

        fake.hold = True
        out2 = tmp_path / "ft2"
        rc, _, err = run(capsys, [*args[:-1], out2, *common, "--detach"])
        assert rc == 0, err
        rc, _, err = run(capsys, ["--resume", out2, "--cancel"])
        assert rc == 0, err
        assert RemoteJob.load(out2).status == "cancelled"
        rc, _, err = run(capsys, ["--resume", out2])
        assert error_line(rc, err) == f"error: fine-tuning job {RemoteJob.load(out2).job_id} was cancelled"

        monkeypatch.setenv("TRACERL_TEST_OPENAI_KEY", "sk-wrong")
        rc, _, err = run(capsys, [*args[:-1], tmp_path / "ft3", *common])
        assert "refused the key" in error_line(rc, err)
    finally:
        fake.stop()


def test_http_backend_url_and_errors(server, tmp_path, capsys, episodes_parquet, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TRACERL_SERVER_TOKEN", TOKEN)
    out = tmp_path / "http"
    base = ["--backend", server.url, "--data", episodes_parquet, "--model", tiny_model_dir, "--output", out]
    rc, _, err = run(capsys, [*base, "--detach", "--grpo", "max_steps=100000", "--poll-interval", "0.1"])
    assert rc == 0, err
    job = RemoteJob.load(out)
    assert job.backend == "http" and job.endpoint == server.url
    rc, _, err = run(capsys, ["--resume", out, "--cancel"])
    assert rc == 0 and RemoteJob.load(out).status == "cancelled", err

    monkeypatch.setenv("TRACERL_SERVER_TOKEN", "nope")
    rc, _, err = run(capsys, [*base[:-1], tmp_path / "h2"])
    assert "refused the token" in error_line(rc, err)
    rc, _, err = run(capsys, ["--cancel", "--data", episodes_parquet])
    assert "--cancel needs --resume DIR" in error_line(rc, err)
    assert json.loads((out / "job.json").read_text())["job_id"] == job.job_id
