"""Project-level guarantees: import cost, public surface, README and CI agree."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import sdk

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "langchain",
    "langchain_core",
    "langgraph",
    "llama_index",
    "strands",
    "torch",
    "trl",
    "transformers",
    "polars",
    "openai",
    "httpx",
    "httpx2",
    "numpy",
    "pandas",
    "pyarrow",
    "orjson",
)


def test_import_sdk_imports_no_framework_or_heavy_library() -> None:
    code = (
        "import sys, sdk, sdk.capture, sdk.store, integrations, trainers\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_public_surface_is_pinned() -> None:
    assert sorted(sdk.__all__) == sorted(
        [
            "Config",
            "Session",
            "configure",
            "current_session",
            "flush",
            "reward",
            "session",
            "shutdown",
            "stats",
            "wrap",
        ]
    )
    for name in sdk.__all__:
        assert getattr(sdk, name).__doc__, f"sdk.{name} has no docstring"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    ci_command = re.search(r'^TEST_COMMAND="(.+)"$', ci, re.M).group(1)
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert ci_command in blocks[1], "README's second command and .ci/run's test command differ"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions (``TYPE_CHECKING`` included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_capture_core_imports_go_one_way() -> None:
    # store <- _records <- _context <- _tracer <- _session: no module imports one above it.
    order = ["sdk.store", "sdk._records", "sdk._context", "sdk._tracer", "sdk._session"]
    files = {"sdk.store": sorted((ROOT / "sdk" / "store").glob("*.py"))}
    files.update({m: [ROOT / "sdk" / f"{m.split('.')[1]}.py"] for m in order[1:]})
    for i, module in enumerate(order):
        above = order[i + 1 :]
        for path in files[module]:
            bad = {m for m in _imports(path) for a in above if m == a or m.startswith(a + ".")}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, which sits above it"
    plumbing = ("sdk._internal", "sdk._json", "sdk._env", "sdk._host", "sdk._numbers")
    for path in files["sdk.store"]:  # the store stands on sdk's plumbing only
        sdk_imports = {m for m in _imports(path) if m.startswith("sdk.") and not m.startswith("sdk.store")}
        bad = {m for m in sdk_imports if not m.startswith(plumbing)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_events_are_built_only_by_the_store_event_module() -> None:
    # The event version is written in one place: sdk/store/_events.py (EVENT_VERSION).
    literal = re.compile(r"""["']v["']\s*:""")
    owner = ROOT / "sdk" / "store" / "_events.py"
    for package in ("sdk", "integrations", "trainers"):
        for path in (ROOT / package).rglob("*.py"):
            if path != owner:
                assert not literal.search(path.read_text(encoding="utf-8")), (
                    f"{path.relative_to(ROOT)} builds an event"
                )
