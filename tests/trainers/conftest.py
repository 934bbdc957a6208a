"""Fixtures for trainer tests: a tiny tokenizer/model built locally (nothing downloaded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `trainers` and `sdk` live at the repository root; make them importable under plain `pytest` too.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A directory holding only the tiny tokenizer (enough for --dry-run and data errors)."""
    from trainers._tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def model_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
