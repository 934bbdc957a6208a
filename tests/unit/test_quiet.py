"""``quiet_libraries``: the same silence whether a library is imported before or after it, at no import cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The light legs (Python 3.10, the openai 3 client) install neither; the main leg runs these.
pytest.importorskip("transformers")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
{before}
from trainers.quiet import quiet_libraries
quiet_libraries()
loaded = sorted(m for m in ("transformers", "datasets") if m in sys.modules)
import datasets, transformers
from transformers.utils import logging as tl
print(json.dumps({{
    "loaded_by_quiet": loaded,
    "transformers_level": tl.get_verbosity(),
    "transformers_bars": tl.is_progress_bar_enabled(),
    "datasets_level": datasets.logging.get_verbosity(),
    "datasets_bars": datasets.is_progress_bar_enabled(),
}}))
"""


def _probe(before: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_", "DATASETS_", "HF_"))}
    env["PYTHONPATH"] = str(ROOT)
    code = _PROBE.format(before=before)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_libraries_imported_later_are_quiet_and_not_imported_by_it() -> None:
    got = _probe("")
    assert got["loaded_by_quiet"] == []  # a process that runs agents only does not pay their import
    assert got["transformers_level"] == 40 and got["datasets_level"] == 40  # logging.ERROR
    assert got["transformers_bars"] is False and got["datasets_bars"] is False


def test_libraries_imported_before_are_quiet() -> None:
    got = _probe("import transformers, datasets")
    assert got["loaded_by_quiet"] == ["datasets", "transformers"]
    assert got["transformers_level"] == 40 and got["datasets_level"] == 40
    assert got["transformers_bars"] is False and got["datasets_bars"] is False
