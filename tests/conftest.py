"""Shared pytest fixtures: the scripted OpenAI-compatible server and a per-test tracerl environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk.testing import ScriptedOpenAIServer


@pytest.fixture(autouse=True)
def _tracerl_test_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point ``TRACERL_STORE`` at a fresh per-test directory so no test writes to a shared store."""
    store = tmp_path / "tracerl_store"
    store.mkdir()
    monkeypatch.setenv("TRACERL_STORE", str(store))
    yield


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
