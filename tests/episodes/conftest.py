"""Fixtures for episode tests (helpers live in tests/support/sessions.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from tests.support.sessions import RawStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    """A fresh store that ``sdk`` writes to during the test (flushed and closed at the end)."""
    path = tmp_path / "store"
    sdk.configure(store=path)
    yield path
    sdk.shutdown()


@pytest.fixture
def raw_store(tmp_path: Path) -> RawStore:
    """An empty store directory to fill with raw event lines."""
    return RawStore(tmp_path / "raw")
