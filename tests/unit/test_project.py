"""Project-level guarantees: import cost, public surface, README and CI agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import sdk

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("langchain", "langchain_core", "langgraph", "llama_index", "strands", "torch", "trl", "transformers",
         "polars", "openai", "httpx", "httpx2", "numpy", "pandas", "pyarrow", "orjson")


def test_import_sdk_imports_no_framework_or_heavy_library() -> None:
    code = ("import sys, sdk, sdk.capture, sdk.store, integrations, trainers\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_public_surface_is_pinned() -> None:
    assert sorted(sdk.__all__) == sorted([
        "Config", "Session", "configure", "current_session", "flush", "reward", "session", "shutdown", "stats", "wrap",
    ])
    for name in sdk.__all__:
        assert getattr(sdk, name).__doc__, f"sdk.{name} has no docstring"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    ci_command = re.search(r'^TEST_COMMAND="(.+)"$', ci, re.M).group(1)
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert ci_command in blocks[1], "README's second command and .ci/run's test command differ"
