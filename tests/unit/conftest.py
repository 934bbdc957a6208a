from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh store, configured for this test; SDK internal errors raise instead of being swallowed."""
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    path = tmp_path / "store"
    sdk.configure(store=path, implicit_sessions="process", fsync="never")
    yield path
    sdk.shutdown()
