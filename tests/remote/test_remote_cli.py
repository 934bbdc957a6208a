"""``python -m sdk.train`` with remote backends: ``--resume DIR``, ``--cancel`` (the ray backend's CLI run is in
test_remote_ray.py)."""

from __future__ import annotations

from sdk.train import main
from tests.support.fake_openai import FakeOpenAI
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
    from tests.support.synth import make_episodes, write_parquet

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


def test_cancel_needs_resume(capsys, tmp_path):
    rc, _, err = run(capsys, ["--cancel", "--data", tmp_path / "e.parquet"])
    assert "--cancel needs --resume DIR" in error_line(rc, err)
