"""Fixtures for the Strands integration tests: clean globals (the store is in ../conftest.py).

No ``__init__.py`` here on purpose: with pytest's default import mode a package in this directory would be
importable as ``strands`` and shadow the real one. Each test module starts with
``pytest.importorskip("strands")`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
