"""Start and stop a gateway process; read its store; normalise episodes for comparison."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sdk.store import StoredSession, StoreReader

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Gateway:
    url: str  # http://127.0.0.1:PORT
    store: Path
    proc: subprocess.Popen[str]
    output: list[str]

    def base(self, session_id: str | None = None) -> str:
        """The openai client's base_url, through a session's URL when given."""
        return f"{self.url}/sessions/{session_id}/v1" if session_id else f"{self.url}/v1"

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def reward(self, session_id: str, value: float, **extra: Any) -> None:
        r = self.post(f"/sessions/{session_id}/reward", {"value": value, **extra})
        assert r.status_code == 200, r.text

    def end(self, session_id: str) -> None:
        r = self.post(f"/sessions/{session_id}/end")
        assert r.status_code == 200, r.text

    def session(self, session_id: str) -> StoredSession:
        [s] = [s for s in StoreReader(self.store).sessions() if s.session_id == session_id]
        return s

    def kill(self) -> None:
        """SIGKILL the gateway and its workers (one process group), as a crash or `docker kill` would."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def start_gateway(upstream: str, store: Path, *, workers: int = 1, args: tuple[str, ...] = ()) -> Gateway:
    cmd = [sys.executable, "-m", "sdk.gateway", "--upstream", upstream, "--port", "0", "--store", str(store)]
    cmd += ["--workers", str(workers), *args]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("TRACERL_STORE", None)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise RuntimeError(f"gateway did not start: {first}{proc.stdout.read()}")
    output: list[str] = [first]
    # Keep draining its output (logs) so the pipe never fills.
    threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    url = first.split()[4].removesuffix("/v1")
    gw = Gateway(url, store, proc, output)
    httpx.get(url + "/stats", timeout=60)  # wait until a worker serves
    return gw


def new_id() -> str:
    return uuid.uuid4().hex


# --- comparing episodes (as tests/integrations/test_equivalence.py does) -------------------------------


def normalise_messages(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Messages by role, text, tool calls (parsed arguments) and tool-call ids by position."""
    ids: dict[str, int] = {}
    out = []
    for m in messages:
        calls = tuple(
            (tc["function"]["name"], json.loads(tc["function"]["arguments"] or "{}"))
            for tc in m.get("tool_calls") or []
        )
        for tc in m.get("tool_calls") or []:
            ids.setdefault(tc["id"], len(ids))
        tool_call = ids.get(m["tool_call_id"]) if m.get("tool_call_id") else None
        out.append(
            (m["role"], (m.get("content") or "").strip(), json.dumps(calls, sort_keys=True), tool_call)
        )
    return out


def normalise_tools(tools_json: str | None) -> list[tuple[Any, ...]]:
    out = []
    for t in json.loads(tools_json or "[]"):
        fn = t["function"]
        desc = (fn.get("description") or "").strip().splitlines()
        params = fn.get("parameters") or {}
        props = {k: v.get("type") for k, v in (params.get("properties") or {}).items()}
        out.append(
            (
                fn["name"],
                (desc[0] if desc else "").strip(),
                json.dumps(props, sort_keys=True),
                sorted(params.get("required", [])),
            )
        )
    return sorted(out)
