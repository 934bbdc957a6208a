"""Fixtures for the OTel tests: an OTLP receiver process writing into a fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.otel import Receiver


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[Receiver, Path]]:
    store = tmp_path / "received"
    r = Receiver(store)
    try:
        yield r, store
    finally:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
