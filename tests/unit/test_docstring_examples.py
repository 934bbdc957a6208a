"""Every docstring example in ``sdk``, ``integrations`` and ``trainers`` runs and prints what it shows.

Examples that need a server, a GPU, a model or a cluster carry ``# doctest: +SKIP``. They run in a child
process: some configure the SDK, which must not leak into the other tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_docstring_examples_run() -> None:
    for module in ("torch", "trl", "langchain_core", "llama_index.core", "strands", "fastapi", "polars"):
        pytest.importorskip(module)  # every module is imported to collect its examples
    cmd = [sys.executable, "-m", "pytest", "--doctest-modules", "sdk", "integrations", "trainers"]
    r = subprocess.run(
        [*cmd, "-q", "-p", "no:cacheprovider", "-o", "addopts="],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
