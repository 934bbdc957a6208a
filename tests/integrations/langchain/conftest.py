"""Fixtures for the LangChain integration tests: a ChatOpenAI factory, strict hygiene checks.

No ``__init__.py`` in this directory on purpose: with pytest's default import mode a package here would
be importable as ``langchain`` or ``integrations.langchain`` and shadow the real ones. Each test module
starts with ``pytest.importorskip("langchain_core")`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sdk
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer


@pytest.fixture
def read_calls(store: Path) -> Callable[..., list[dict[str, Any]]]:
    """Flush and return the stored calls, of one task or of every session (implicit ones included)."""

    def read(task_id: str | None = None) -> list[dict[str, Any]]:
        sdk.flush()
        sessions = list(StoreReader(store).sessions())
        return [c for s in sessions if task_id is None or s.task_id == task_id for c in s.calls]

    return read


@pytest.fixture
def make_llm(openai_server: ScriptedOpenAIServer) -> Callable[..., Any]:
    """Build a real ``ChatOpenAI`` pointed at the loopback server."""

    def make(**kwargs: Any) -> Any:
        from langchain_openai import ChatOpenAI

        kwargs.setdefault("model", "gpt-test")
        return ChatOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0, **kwargs)

    return make


@pytest.fixture(autouse=True)
def _hygiene(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test: no handler errors were swallowed, no run state leaked, no global attach left."""
    before = sdk.stats()["internal_errors"]
    yield
    try:
        import integrations.langchain as lc
    except ImportError:
        return
    leaked = len(lc._runs)
    lc.uninstrument_langchain()
    lc._runs.clear()
    lc._tool_runs.clear()
    lc._tool_timings.clear()
    from integrations.openai import uninstrument_openai

    uninstrument_openai()
    assert leaked == 0, "run state leaked: a started run was never ended"
    if "allow_internal_errors" not in request.fixturenames:
        assert sdk.stats()["internal_errors"] == before, "the handler hit an internal error"


@pytest.fixture
def allow_internal_errors(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that break the handler on purpose: errors are counted, not re-raised."""
    monkeypatch.delenv("TRACERL_RAISE_INTERNAL", raising=False)
