"""What the wheel installs: the library (sdk, integrations, trainers) and the `tracerl` command, no examples.

Builds the wheel from a copy of the checkout in a fresh virtual environment (no system site-packages; pip
fetches the build backend, setuptools, from the package index) and installs it there without dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from sdk.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "sdk", "integrations", "trainers", "examples")


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    r = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r


def test_the_wheel_installs_the_library_and_the_command_but_no_examples(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to pyproject.toml
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".*")
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    _run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    bin_ = tmp_path / "venv" / "bin"
    _run(bin_ / "python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", src, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("tracerl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "tracerl = sdk.cli:main" in z.read(entry_points).decode()
    assert {n.split("/")[0] for n in names if not n.startswith("tracerl-")} == {
        "sdk",
        "integrations",
        "trainers",
    }
    assert "sdk/py.typed" in names

    _run(bin_ / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    help_ = _run(bin_ / "tracerl", "--help", cwd=tmp_path)
    assert all(f"\n  {name} " in help_.stdout for name in COMMANDS)
    check = "import importlib.util as u, sdk, trainers, integrations; print(u.find_spec('examples'))"
    assert _run(bin_ / "python", "-c", check, cwd=tmp_path).stdout == "None\n"


def test_the_examples_run_from_a_checkout() -> None:
    # The README's `python -m examples.main`: from the checkout's root, which `python -m` puts on sys.path.
    r = subprocess.run(
        [sys.executable, "-m", "examples.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m examples.main"), r.stderr[-2000:]
