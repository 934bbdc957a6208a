"""A real consumer: Arize Phoenix, run locally, receives the exported spans and its client returns the messages.

Phoenix is a server application with a large dependency tree (and, up to 20.x on Python 3.11, an import
bug fixed later), so it may live in its own environment: set ``TRACERL_PHOENIX_PYTHON`` to that
environment's interpreter; otherwise ``.venv-phoenix`` (made by ``tests/setup.sh``), else this interpreter
when it can import Phoenix. The client
(``arize-phoenix-client``) is a dev dependency.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("phoenix.client")

from sdk.otel import export_otlp
from tests.support.otel import make_store


def _phoenix_python() -> str | None:
    # tests/setup.sh installs Phoenix into .venv-phoenix at the repo root.
    local = Path(__file__).resolve().parents[2] / ".venv-phoenix" / "bin" / "python"
    candidate = os.environ.get("TRACERL_PHOENIX_PYTHON") or (str(local) if local.exists() else sys.executable)
    probe = subprocess.run(
        [candidate, "-c", "import phoenix.server.main"], capture_output=True, text=True, timeout=120
    )
    return candidate if probe.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def phoenix(tmp_path: Path) -> Iterator[tuple[str, int]]:
    import httpx

    python = _phoenix_python()
    if python is None:
        pytest.skip("Arize Phoenix is not importable here; set TRACERL_PHOENIX_PYTHON to an env that has it")
    http_port, grpc_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (tmp_path / "phoenix.log").open("w")
    proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 120  # ~35 s on a busy 2-core machine
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"Phoenix exited: {(tmp_path / 'phoenix.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Phoenix did not start within 120 s")
        yield base, grpc_port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _spans(base: str, want: int) -> list[dict[str, Any]]:
    from phoenix.client import Client

    client = Client(base_url=base)
    spans: list[dict[str, Any]] = []
    for _ in range(60):  # Phoenix inserts received spans in the background
        spans = client.spans.get_spans(project_identifier="default", limit=1000)
        if len(spans) >= want:
            break
        time.sleep(0.5)
    return spans


def test_phoenix_receives_the_spans_with_their_messages(tmp_path: Path, phoenix: tuple[str, int]) -> None:
    base, grpc_port = phoenix
    store = make_store(tmp_path / "store", tasks=1, samples=2)
    http = export_otlp(store, f"{base}/v1/traces")
    grpc = export_otlp(store, f"http://127.0.0.1:{grpc_port}", protocol="grpc")  # the same traces again
    assert (http.failed_spans, grpc.failed_spans) == (0, 0)
    assert http.spans == grpc.spans == 8
    spans = _spans(base, 16)
    assert len(spans) == 16
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_kind.setdefault(s["span_kind"], []).append(s)
    assert {k: len(v) for k, v in by_kind.items()} == {"AGENT": 4, "LLM": 8, "TOOL": 4}
    # Phoenix reads the GenAI attributes into its own message model: the client returns the messages.
    answers = [s for s in by_kind["LLM"] if "llm.output_messages.0.message.content" in s["attributes"]]
    assert sorted({s["attributes"]["llm.output_messages.0.message.content"] for s in answers}) == [
        "The answer is 0.",
        "The answer is 1.",
    ]
    first = answers[0]["attributes"]
    assert first["llm.input_messages.0.message.role"] == "system"
    assert first["llm.input_messages.1.message.content"].startswith("What is 0 + ")
    assert first["llm.input_messages.2.message.tool_calls.0.tool_call.function.name"] == "add"
    assert first["llm.input_messages.3.message.role"] == "tool"
    assert {s["attributes"]["tracerl.task_id"] for s in by_kind["AGENT"]} == {"task-0"}
    assert {s["name"] for s in by_kind["TOOL"]} == {"execute_tool add"}
