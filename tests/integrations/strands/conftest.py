"""Fixtures for the Strands integration tests: a per-test store, strict internal errors, clean globals.

No ``__init__.py`` here on purpose: with pytest's default import mode a package in this directory would be
importable as ``strands`` and shadow the real one. Each test module starts with
``pytest.importorskip("strands")`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh store for this test; SDK internal errors raise instead of being swallowed."""
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")
    path = tmp_path / "store"
    sdk.configure(store=path, implicit_sessions="process", fsync="never")
    yield path
    sdk.shutdown()


@pytest.fixture(autouse=True)
def _no_global_instrumentation() -> Iterator[None]:
    """Undo instrument_strands()/instrument_openai() whatever a test did."""
    yield
    try:
        from integrations.strands import uninstrument_strands
    except ImportError:
        return
    uninstrument_strands()
    from integrations.openai import uninstrument_openai

    uninstrument_openai()
