"""The contract with TRL: tested release ranges and the private API the replay trainer overrides."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from trainers._compat import PRIVATE_API, TESTED, check_trl_compat  # noqa: E402
from trainers.errors import UserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_releases_pass() -> None:
    check_trl_compat()


@pytest.mark.parametrize(
    ("name", "version"), [("trl", "1.17.0"), ("trl", "1.15.2"), ("transformers", "6.0.0")]
)
def test_an_untested_release_is_one_clear_line(name, version, monkeypatch) -> None:
    # The module as imported now: transformers replaces its own sys.modules entry while it loads.
    monkeypatch.setattr(importlib.import_module(name), "__version__", version)
    with pytest.raises(UserError) as err:
        check_trl_compat()
    assert str(err.value) == (
        f"{name} {version} is not a release tracerl's replay trainer is tested with "
        f"({name}{TESTED[name]}): pip install '{name}{TESTED[name]}'"
    )


def test_a_changed_private_method_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, batch: {})
    with pytest.raises(UserError) as err:
        check_trl_compat()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"trl {trl.__version__} is not the TRL the replay")
    assert (
        "GRPOTrainer._generate_and_score_completions takes (self, batch), expected (self, inputs" in message
    )
    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    with pytest.raises(UserError, match="2 difference"):
        check_trl_compat()


def _replay_trainer_private_names() -> set[str]:
    """Private names a ``GRPOTrainer`` subclass under trainers/ defines, or calls on self or super()."""
    names: set[str] = set()
    for path in (ROOT / "trainers").rglob("*.py"):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            bases = [getattr(b, "id", getattr(b, "attr", "")) for b in getattr(cls, "bases", [])]
            if not isinstance(cls, ast.ClassDef) or "GRPOTrainer" not in bases:
                continue
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef):
                    names.add(node.name)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    names.add(node.func.attr)
    return {n for n in names if n.startswith("_") and hasattr(GRPOTrainer, n)}


def test_the_contract_names_every_trl_method_the_replay_trainer_overrides_or_calls() -> None:
    used = _replay_trainer_private_names()
    assert {"_generate_and_score_completions", "_prepare_inputs", "__init__"} <= used  # the scan finds them
    named = {m.target.rpartition(".")[2] for m in PRIVATE_API if m.target.startswith("trl:GRPOTrainer.")}
    assert used <= named, f"not in trainers/_compat.py PRIVATE_API: {sorted(used - named)}"


def test_the_ranges_are_the_train_extras() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    train = re.search(r"^train = \[\n(.*?)^\]", text, re.S | re.M).group(1)
    declared = {r.name: r.specifier for r in map(Requirement, re.findall(r'^\s*"([^"]+)"', train, re.M))}
    for name, spec in TESTED.items():
        assert declared[name] == SpecifierSet(spec), f"pyproject.toml's {name} range is not {spec}"
