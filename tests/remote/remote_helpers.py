"""Shared pieces of the remote-backend tests (a uniquely named module: ``conftest`` names collide)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

TOKEN_ENV = "TRACERL_TEST_SERVER_TOKEN"
TOKEN = "test-token-" + "x" * 20


class ServerProcess:
    """``python -m trainers.remote.http_server`` on 127.0.0.1 with a free port, its workdir and its log."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log = workdir / "server.log"
        env = {**os.environ, TOKEN_ENV: TOKEN, "PYTHONPATH": str(_ROOT)}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainers.remote.http_server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--token-env",
                    TOKEN_ENV,
                    "--workdir",
                    str(workdir / "server"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(_ROOT),
            )
        self.url = self._wait_url()

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_text() if self.log.exists() else ""
            for line in text.splitlines():
                if "listening on " in line:
                    return line.split("listening on ", 1)[1].split()[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {text}")
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        import httpx

        try:  # cancel what a failed test may have left running, then stop the server (and its workers)
            jobs = httpx.get(f"{self.url}/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json()[
                "data"
            ]
            for job in jobs:
                if job["status"] in ("queued", "running"):
                    httpx.post(
                        f"{self.url}/v1/jobs/{job['id']}/cancel",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=60,
                    )
        except httpx.HTTPError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
