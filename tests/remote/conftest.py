"""Fixtures for remote-backend tests: episodes and the tiny model (the Ray head is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def episodes_parquet(tmp_path_factory, tiny_tokenizer):
    from tests.support.synth import make_episodes, write_parquet

    return write_parquet(
        make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path_factory.mktemp("data") / "episodes.parquet"
    )
