"""The install hint when LangChain is missing, the example script, and the docs' claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_openai")

from sdk.store import StoreReader

ROOT = Path(__file__).resolve().parents[3]


def test_missing_langchain_names_the_extra() -> None:
    # In a subprocess: reloading the module in-process would reset the process-wide handler slot.
    code = (
        "import sys\n"
        "from unittest import mock\n"
        "with mock.patch.dict(sys.modules, {'langchain_core': None}):\n"
        "    try:\n"
        "        import integrations.langchain\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, '|', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == (
        "MissingDependency | langchain-core is not installed; run: pip install 'tracerl[langchain]'"
    )


def test_import_loads_no_model_provider() -> None:
    code = (
        "import sys, integrations.langchain\n"
        "print(sorted(m for m in ('langchain_openai', 'openai', 'langgraph') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_example_runs_and_captures(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "TRACERL_STORE")}
    out = subprocess.run(
        [sys.executable, "-m", "examples.langchain_agent", "--store", str(store)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.strip().splitlines()
    assert "2 sessions, 4 calls (framework ['langchain']), 2 tool calls, 4 with token ids" in line
    assert line.endswith("problems none")
    sessions = [s for s in StoreReader(store).sessions() if not s.implicit]
    assert sorted(s.task_id for s in sessions) == ["add-2-3", "add-4-5"]
    first = sessions[0].calls[0]
    assert first["framework"] == "langchain" and first["logprobs"] and first["prompt_token_ids"]
    assert json.loads(first["response"]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "a": 2,
        "b": 3,
    }
