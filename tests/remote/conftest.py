"""Fixtures for remote-backend tests: episodes, the tiny model, and a loopback training server process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from remote_helpers import TOKEN, TOKEN_ENV, ServerProcess

_ROOT = Path(__file__).resolve().parents[2]
for p in (str(_ROOT), str(_ROOT / "tests" / "trainers")):  # `_synth` lives with the trainer tests
    if p not in sys.path:
        sys.path.insert(0, p)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from trainers._tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    import torch

    from trainers._tiny import build_tiny_model

    torch.set_num_threads(2)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


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
