"""The ``tracerl`` command, the ``python -m`` entry points it fronts, and the environment variable names."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sdk import cli
from sdk.cli import COMMANDS, Command

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch", "trl", "transformers", "peft", "langchain_core", "llama_index", "strands", "openai", "httpx",
    "polars", "pyarrow", "numpy", "fastapi", "uvicorn", "aiohttp", "opentelemetry", "ray",
)  # fmt: skip
# Entry points run with an argument that is not --help: not commands a user types.
NOT_COMMANDS = {"sdk.episodes._worker": "a parallel-export worker process, started with a job file"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_help_lists_every_subcommand_and_imports_nothing_heavy() -> None:
    assert {"train", "export", "inspect", "rollout", "gateway", "otel", "view", "serve"} <= set(COMMANDS)
    code = (
        "import sys\nfrom sdk.cli import main\nstatus = main(['--help'])\n"
        f"print('heavy:', [m for m in {HEAVY!r} if m in sys.modules], status)"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "heavy: [] 0"
    listed = re.findall(r"^  (\S+)  ", r.stdout, re.M)
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_help_is_its_modules_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "serve":
        pytest.importorskip("torch")  # the policy server imports torch at the top
    try:
        status = cli.main([name, "--help"])
    except SystemExit as exc:  # argparse's --help exits 0; some mains turn that into their return value
        status = exc.code
    assert status == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_unknown_or_missing_subcommand_is_one_error_line() -> None:
    for args, said in ((["frobnicate"], "unknown command 'frobnicate'"), ([], "no command given")):
        r = _run("-m", "sdk.cli", *args)
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {said}; choose from train,")


def test_exit_status_and_output_are_the_modules(tmp_path: Path) -> None:
    empty = tmp_path / "store"
    empty.mkdir()
    direct = _run("-m", "sdk.view", str(empty), "--out", str(tmp_path / "a.html"))
    front = _run("-m", "sdk.cli", "view", str(empty), "--out", str(tmp_path / "a.html"))
    assert direct.returncode == front.returncode == 1  # "no episode to show"
    assert (front.stdout, front.stderr) == (direct.stdout, direct.stderr)
    missing = _run("-m", "sdk.cli", "inspect", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: no store directory")


def test_a_subcommand_whose_module_is_missing_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(COMMANDS, "train", Command("tracerl_no_such_module:main", "train", "train"))
    assert cli.main(["train", "--help"]) == 2
    err = capsys.readouterr().err
    assert err == "error: No module named 'tracerl_no_such_module' (pip install 'tracerl[train]')\n"


def test_a_new_subcommand_is_one_table_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a later `eval` adds: its module's main(argv) gets the rest of the arguments, its status comes back.
    (tmp_path / "tracerl_echo.py").write_text("def main(argv):\n    print(argv)\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "echo", Command("tracerl_echo:main", "print the arguments"))
    assert cli.main(["--help"]) == 0
    assert re.search(r"^  echo +print the arguments$", capsys.readouterr().out, re.M)
    assert cli.main(["echo", "x", "--help"]) == 3
    assert capsys.readouterr().out == "['x', '--help']\n"


def _python_m_modules() -> list[str]:
    """Every module under sdk/ and trainers/ that runs as ``python -m``: a ``__main__`` guard or file."""
    guard = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)
    out = []
    for package in ("sdk", "trainers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                out.append(".".join(parts[:-1]))
            elif guard.search(path.read_text(encoding="utf-8")):
                out.append(".".join(parts))
    return [m for m in out if m not in NOT_COMMANDS]


def test_the_entry_point_list_is_complete() -> None:
    modules = _python_m_modules()
    assert {"sdk.train", "sdk.export", "sdk.gateway", "sdk.view", "sdk.otel", "sdk.cli"} <= set(modules)
    for target in {c.module.removesuffix(".__main__") for c in COMMANDS.values()}:
        assert target in modules, f"tracerl runs {target}, which has no `python -m` form"


@pytest.mark.parametrize("module", _python_m_modules())
def test_old_python_m_entry_point_still_works(module: str) -> None:
    r = _run("-m", module, "--help")
    absent = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", r.stderr)
    if r.returncode and absent and importlib.util.find_spec(absent.group(1).split(".")[0]) is None:
        pytest.skip(f"python -m {module} needs {absent.group(1)}, not installed here")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:")


def test_environment_variable_names_are_spelled_in_one_module() -> None:
    name = re.compile(r"TRACERL_[A-Z_]*")
    owner = ROOT / "sdk" / "_env.py"
    for package in ("sdk", "integrations", "trainers"):
        for path in (ROOT / package).rglob("*.py"):
            if path == owner:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    assert not name.fullmatch(node.value), (
                        f"{path.relative_to(ROOT)}:{node.lineno} spells {node.value!r}: import it from sdk._env"
                    )


def test_the_readme_lists_every_subcommand() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, command in COMMANDS.items():
        module = command.module.removesuffix(".__main__")
        assert f"| `tracerl {name}` | `python -m {module}` |" in readme, f"README's Command line lacks {name}"
