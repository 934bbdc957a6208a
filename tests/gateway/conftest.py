"""Gateway fixtures: a real `python -m sdk.gateway` process in front of the scripted upstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")
pytest.importorskip("openai")

from gateway_helpers import Gateway, start_gateway

from sdk.testing import ScriptedOpenAIServer


@pytest.fixture(scope="session")
def upstream() -> Iterator[ScriptedOpenAIServer]:
    """The scripted model server the shared gateway forwards to; tests that enqueue reset it first."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def gateway(upstream: ScriptedOpenAIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway with two workers for the whole run: a session's calls land on both workers."""
    gw = start_gateway(upstream.base_url, tmp_path_factory.mktemp("gateway") / "store", workers=2)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def fresh_store(tmp_path: Path) -> Path:
    return tmp_path / "store"
