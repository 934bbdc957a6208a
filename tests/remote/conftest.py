"""Fixtures for remote-backend tests: episodes and the tiny model (the Ray head is in tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
for p in (str(_ROOT), str(_ROOT / "tests" / "trainers")):  # `_synth` lives with the trainer tests
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(scope="session")
def episodes_parquet(tmp_path_factory, tiny_tokenizer):
    from _synth import make_episodes, write_parquet

    return write_parquet(
        make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path_factory.mktemp("data") / "episodes.parquet"
    )
