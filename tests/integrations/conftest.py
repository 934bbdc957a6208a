"""Fixtures shared by the integration suites: a per-test store with strict internal errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh store for this test; SDK internal errors re-raise inside the firewall."""
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    path = tmp_path / "store"
    sdk.configure(store=path, implicit_sessions="process", fsync="never")
    yield path
    sdk.shutdown()
