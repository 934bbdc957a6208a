"""Fixtures for remote-backend tests: episodes, the tiny model, and a loopback training server process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from remote_helpers import TOKEN, TOKEN_ENV, ServerProcess

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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture()
def token_env(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN_ENV
