"""Fixtures for trainer tests: a tiny tokenizer/model built locally (nothing downloaded)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# `trainers` and `sdk` live at the repository root; make them importable under plain `pytest` too.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# Offline and quiet before transformers/TRL are imported by any test module.
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
def tokenizer_dir(tmp_path_factory):
    """A directory holding only the tiny tokenizer (enough for --dry-run and data errors)."""
    from trainers._tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Tiny Qwen2 (hidden 64, 2 layers, ~107k parameters) + tokenizer saved to a temp dir."""
    import torch

    from trainers._tiny import build_tiny_model

    torch.set_num_threads(2)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def model_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


