"""Shared pytest fixtures: the scripted OpenAI-compatible server and a per-test tracerl environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk.testing import ScriptedOpenAIServer

# Nothing is downloaded in tests: offline and quiet before transformers/TRL/datasets are imported.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _tracerl_test_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point ``TRACERL_STORE`` at a fresh per-test directory so no test writes to a shared store."""
    store = tmp_path / "tracerl_store"
    store.mkdir()
    monkeypatch.setenv("TRACERL_STORE", str(store))
    yield


@pytest.fixture
def openai_server() -> Iterator[ScriptedOpenAIServer]:
    """A started :class:`ScriptedOpenAIServer` for one test (default policy, empty queue)."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def shared_openai_server() -> Iterator[ScriptedOpenAIServer]:
    """One server for the whole session; tests that ``enqueue`` should ``reset()`` it when done."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny tokenizer built locally (``trainers._tiny``); nothing downloaded."""
    from trainers._tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Tiny Qwen2 (hidden 64, 2 layers, ~107k parameters) + tokenizer saved to a temp dir, once per run."""
    import torch

    from trainers._tiny import build_tiny_model

    torch.set_num_threads(2)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
