"""The layering is checked, not just described: import-linter's contracts in pyproject.toml must hold.

`trainers` and `integrations` stand on `sdk`, never the reverse (the `python -m sdk.train` / `sdk.serve`
shims hand off inside `main()`); `sdk` imports no framework, torch or trl; integrations record through
`sdk.capture`; no two sibling modules import each other. Run the same check by hand with `lint-imports`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    pytest.importorskip("importlinter")
    out = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
