"""Issue 38 item 13: the policy server ends with its parent, and a stale one is never doubled.

A real parent process starts ``LocalPolicy`` (a ``python -m sdk.serve`` child) and is killed with
``kill -9``; the server must be gone within a bounded wait. A server left in an output directory by an
earlier run is stopped by the next start there; one whose run is still going is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from trainers.errors import UserError  # noqa: E402
from trainers.serve.pidfile import free_port, process_info, terminate, wait_healthy  # noqa: E402
from trainers.serve.policy import LocalPolicy  # noqa: E402

PARENT = """
import sys, time
from trainers.serve.policy import LocalPolicy
p = LocalPolicy(sys.argv[1], "policy", subprocess=True, threads=1, log=sys.argv[2], pid_file=sys.argv[3])
p.start()
time.sleep(600)
"""


def _until(check, timeout: float, what: str):
    """Poll ``check`` until it returns something true; a hang fails the test instead of stalling it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def _record(pid_file: Path) -> dict | None:
    try:
        return json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_kill_9_of_the_parent_ends_its_policy_server(tiny_model_dir, tmp_path) -> None:
    pid_file = tmp_path / "out" / "policy-server.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tiny_model_dir), str(tmp_path / "serve.log"), str(pid_file)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        rec = _until(lambda: _record(pid_file), 120, "the parent recorded its server")
        assert rec["parent"] == parent.pid
        _until(lambda: _answers(rec["port"]), 120, "the server answers")
        assert process_info(rec["pid"])[0] == parent.pid
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        _until(lambda: process_info(rec["pid"]) is None, 30, "the orphaned server exited")
        assert not _answers(rec["port"])
        assert "the parent process" in (tmp_path / "serve.log").read_text()
    finally:
        if parent.poll() is None:
            parent.kill()
        rec = _record(pid_file)
        if rec and process_info(rec["pid"]) is not None:
            os.kill(rec["pid"], signal.SIGKILL)


def test_a_stale_server_in_the_output_directory_is_stopped_and_a_live_runs_is_refused(
    tiny_model_dir, tmp_path
) -> None:
    port = free_port()
    log = tmp_path / "stale.log"
    with open(log, "wb") as out:  # as an older run left it: no --parent-pid, so it outlives its parent
        stale = subprocess.Popen(
            [sys.executable, "-m", "sdk.serve", "--model", str(tiny_model_dir), "--port", str(port),
             "--threads", "1"], stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    pid_file = tmp_path / "policy-server.pid"
    policy = LocalPolicy(str(tiny_model_dir), subprocess=True, threads=1, pid_file=pid_file)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", stale, 120, log)
        # Its run (this test process, its parent) still goes on: refused, nothing stopped, nothing started.
        pid_file.write_text(json.dumps({"pid": stale.pid, "parent": os.getpid(), "port": port}))
        with pytest.raises(UserError, match=f"another run \\(process {os.getpid()}\\)"):
            policy.start()
        assert stale.poll() is None and _answers(port) and policy.exit_code() is None
        # Its run is gone (the recorded parent has exited): the stale server is stopped, one new one serves.
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(timeout=30)
        pid_file.write_text(json.dumps({"pid": stale.pid, "parent": gone.pid, "port": port}))
        policy.start()
        assert stale.wait(timeout=30) is not None and not _answers(port)
        rec = _record(pid_file)
        assert rec["parent"] == os.getpid() and rec["pid"] == policy._proc.pid and rec["pid"] != stale.pid
        assert _answers(int(policy.base_url.split(":")[-1].split("/")[0]))
    finally:
        policy.stop()
        terminate(stale, 10)
    assert not pid_file.exists()  # stop() removes its own record
