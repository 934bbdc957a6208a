"""Fixtures for trainer tests: a tiny tokenizer/model built locally (nothing downloaded)."""

from __future__ import annotations

import pytest


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
