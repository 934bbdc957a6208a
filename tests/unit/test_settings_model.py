"""One settings model (issue 51, item 1): every setting of the trainer, the loop, the policy section and the
rollout runner has one definition; a name shared between them has the same default, type and coercion, or
a listed, reasoned exception; one coercion rule and one error voice on every path; every YAML example in a
module docstring builds its config."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdk.rollout import RolloutSpec
from trainers.base import TrainerConfig
from trainers.errors import UserError
from trainers.loop import LoopConfig
from trainers.loop.config import train_settings
from trainers.settings import CONTEXT_DEFAULTS, PolicySpec, coerce, field_types, make_config, yaml_loader
from trainers.sft import SFTSettings
from trainers.trl import TRLGRPOConfig
from trainers.trl.config import GRPOShortcuts

ROOT = Path(__file__).resolve().parents[2]

# Every settings dataclass, by the context CONTEXT_DEFAULTS names it with.
SPECS: dict[str, type] = {
    "trainer": TRLGRPOConfig,  # TrainerConfig's fields and the trl backend's
    "grpo": GRPOShortcuts,
    "loop": LoopConfig,
    "policy": PolicySpec,
    "rollout": RolloutSpec,
    "sft": SFTSettings,
}

# The shared names whose types differ on purpose, with the reason.
TYPE_EXCEPTIONS: dict[str, str] = {
    "tis_cap": "the loop's cap is always a number (read in async mode only); the trainer's None turns "
    "truncated importance sampling off",
    "agent": "sdk.rollout's runner also takes a Python callable; a loop YAML names one as module:function",
    "reward_fn": "as agent",
}
# The shared names whose defaults differ for a reason that is not a context default.
DEFAULT_EXCEPTIONS: dict[str, str] = {
    "model": "the loop needs one to serve from its first round (required); the trainer's '' is --model's",
    "agent": "required wherever it is a setting",
    "output_dir": "tracerl sft writes the model directory a loop then starts from: it is named (required), "
    "so one warm start never overwrites another; the trainer's runs/tracerl holds checkpoints",
}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def _types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in _fields(cls)}


def _shared() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for context, cls in SPECS.items():
        for name in _fields(cls):
            where.setdefault(name, []).append(context)
    return {name: contexts for name, contexts in where.items() if len(contexts) > 1}


def test_the_shared_names_are_found() -> None:
    shared = _shared()
    assert {"group_size", "seed", "tis_cap", "curriculum", "curriculum_start", "lora"} <= set(shared)
    assert shared["curriculum_expand_every"] == ["trainer", "loop"]  # one curriculum vocabulary


@pytest.mark.parametrize("name", sorted(_shared()))
def test_a_shared_name_has_one_default_and_type_or_a_reasoned_exception(name: str) -> None:
    contexts = _shared()[name]
    defaults = {c: _default(_fields(SPECS[c])[name]) for c in contexts}
    if len({repr(d) for d in defaults.values()}) > 1:
        if name in CONTEXT_DEFAULTS:
            table = CONTEXT_DEFAULTS[name]
            for context, default in defaults.items():
                assert context in table, f"{name}: {context}'s default {default!r} is not in CONTEXT_DEFAULTS"
                assert table[context][0] == default, f"{name} in {context}: {default!r} != the table's"
        else:
            assert name in DEFAULT_EXCEPTIONS, f"{name}: defaults differ ({defaults}) with no reason listed"
    types = {c: _types(SPECS[c])[name] for c in contexts}
    if len({str(t) for t in types.values()}) > 1:
        assert name in TYPE_EXCEPTIONS, f"{name}: types differ ({types}) with no reason listed"


@pytest.mark.parametrize("name", sorted(_shared()))
def test_a_shared_name_coerces_alike(name: str) -> None:
    # The same YAML value reads the same in every context that types the name alike (one rule, `coerce`).
    contexts = [c for c in _shared()[name] if c != "rollout"]  # sdk's runner takes Python values
    samples = ["4", "0.5", "1e-5", "true", "x", 3, 2.0, None]

    def read(hint: Any, value: Any) -> Any:
        try:
            return coerce(name, value, hint)
        except UserError as exc:
            return f"refused: {exc}"

    by_type: dict[str, list[Any]] = {}
    for context in contexts:
        hint = _types(SPECS[context])[name]
        by_type.setdefault(str(hint), []).append([read(hint, v) for v in samples])
    for results in by_type.values():
        assert all(r == results[0] for r in results)


def test_every_context_default_is_the_one_its_config_uses() -> None:
    for name, table in CONTEXT_DEFAULTS.items():
        for context, (default, reason) in table.items():
            assert reason, f"{name} in {context}: no reason given"
            if context in SPECS and name in _fields(SPECS[context]):
                assert _default(_fields(SPECS[context])[name]) == default, (name, context)
            else:  # a trainer setting the loop sets for its trainer
                assert context == "loop", (name, context)
                cfg = LoopConfig(agent="a:f", tasks="t", model="m")
                assert train_settings(cfg, "m", Path("o"))[name] == default, name


@pytest.mark.parametrize("context", SPECS)
def test_every_setting_has_help(context: str) -> None:
    for name, f in _fields(SPECS[context]).items():
        text = f.metadata.get("help", "")
        assert text and text.rstrip()[-1] in ".)", f"{context}.{name}: help {text!r} is not a sentence"


def test_trainer_config_is_the_trl_configs_base() -> None:
    assert set(_fields(TrainerConfig)) <= set(_fields(TRLGRPOConfig))


def test_the_grpo_shortcuts_are_grpo_config_fields_of_the_same_kind() -> None:
    pytest.importorskip("trl")
    from trl import GRPOConfig

    types = field_types(GRPOConfig)
    for name, hint in _types(GRPOShortcuts).items():
        assert name in types, f"--{name} sets no GRPOConfig field"
        base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        assert coerce(name, "1", types[name]) == coerce(name, "1", base[0]), name


# ------------------------------------------------------------------------------------------- one rule


def test_one_coercion_rule() -> None:
    assert coerce("x", "1e-5", float) == 1e-5 and coerce("x", 3, float) == 3.0
    assert coerce("x", "4", int) == 4 and coerce("x", "4", int | None) == 4
    assert coerce("x", None, int | None) is None
    assert [coerce("x", v, bool) for v in ("yes", "off", True, "1")] == [True, False, True, True]
    assert coerce("x", Path("a"), str) == "a"
    for value, hint, said in (
        ("x", float, "x must be a float, got 'x'"),
        (1.5, int, "x must be an integer, got 1.5"),
        (True, int, "x must be an integer, got True"),
        ("maybe", bool, "x must be a boolean (true or false), got 'maybe'"),
        (3, str, "x must be a string, got 3"),
        (None, int, "x must be an integer, got None"),
        ("lots", int | None, "x must be an integer or null, got 'lots'"),
        ("z", typing.Literal["a", "b"], "x must be one of a, b, got 'z'"),
        ([1], dict[str, Any], "x must be a mapping, got [1]"),
    ):
        with pytest.raises(UserError) as exc:
            coerce("x", value, hint)
        assert str(exc.value) == said


def _loop(**over: Any) -> LoopConfig:
    return LoopConfig.from_mapping({"agent": "a:f", "tasks": "t", "model": "m", **over})


def _cli(*flags: str) -> Any:
    from trainers.cli import _resolve

    return _resolve(["--data", "d.parquet", "--model", "m", *flags])[1]


PATHS: dict[str, Callable[[str], Any]] = {
    "make_config": lambda v: make_config({"model": "m", "eval_fraction": v})[1].eval_fraction,
    "tracerl train flag": lambda v: _cli("--eval-fraction", v).eval_fraction,
    "tracerl train --grpo": lambda v: _cli("--grpo", f"learning_rate={v}").grpo["learning_rate"],
    "the loop": lambda v: _loop(success_threshold=v).success_threshold,
    "the loop's train section": lambda v: (
        make_config(train_settings(_loop(train={"eval_fraction": v}), "m", Path("o")))[1].eval_fraction
    ),
    "the policy section": lambda v: (
        PolicySpec.from_mapping({"kind": "vllm", "startup_timeout": v}).startup_timeout
    ),
}


@pytest.mark.parametrize("path", PATHS)
def test_1e_5_is_a_float_on_every_path_and_a_bad_value_one_voice(path: str) -> None:
    assert PATHS[path]("1e-5") == 1e-5
    if path == "tracerl train --grpo":  # a flag's value is read as YAML; trl checks the grpo keys
        pytest.importorskip("trl")
        from trainers.trl import check_grpo_keys

        config = _cli("--grpo", "learning_rate=x")
        with pytest.raises(UserError, match=r"^grpo.learning_rate must be a float, got 'x'$"):
            check_grpo_keys(config)
        return
    with pytest.raises(UserError, match=r"must be a float, got 'x'$"):
        PATHS[path]("x")


def test_a_flag_is_refused_in_the_words_of_its_yaml_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainers.cli import main
    from trainers.loop.cli import main as loop_main

    assert main(["--data", "d.parquet", "--model", "m", "--max-length", "lots"]) == 2
    assert capsys.readouterr().err.strip() == "error: max_length must be an integer or null, got 'lots'"
    (tmp_path / "loop.yaml").write_text("agent: a:f\ntasks: t.jsonl\nmodel: m\n")
    assert loop_main([str(tmp_path / "loop.yaml"), "--seed", "1e-5"]) == 2
    assert capsys.readouterr().err.strip() == "error: seed must be an integer, got '1e-5'"


def test_did_you_mean_on_every_path() -> None:
    with pytest.raises(UserError, match=r"group_sise \(did you mean group_size\?\)"):
        _loop(group_sise=4)
    with pytest.raises(UserError, match=r"max_lenght \(did you mean max_length\?\)"):
        make_config({"max_lenght": 4})
    with pytest.raises(UserError, match=r"thread \(did you mean threads\?\)"):
        PolicySpec.from_mapping({"thread": 2})


# ------------------------------------------------------------------------------------ docstring YAML


def _docstring_yaml() -> list[tuple[str, str]]:
    """``(module, block)`` for every literal block in a module docstring under trainers/ and sdk/ that a
    line mentioning YAML or a config introduces."""
    found = []
    for path in sorted([*ROOT.glob("trainers/**/*.py"), *ROOT.glob("sdk/**/*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            if not (line.endswith("::") and re.search(r"yaml|config", line, re.I)):
                continue
            block = []
            for body in lines[i + 1 :]:
                if body and not body.startswith(" "):
                    break
                block.append(body)
            found.append((str(path.relative_to(ROOT)), "\n".join(block)))
    return found


def build_example(data: dict[str, Any]) -> Any:
    """The config a YAML example describes: a loop's (with its train section), else ``tracerl train``'s."""
    if "agent" in data:
        cfg = LoopConfig.from_mapping(data)
        _, train, _ = make_config(train_settings(cfg, cfg.model, Path(cfg.out) / "train"), source="example")
        configs = [cfg, train]
    else:
        configs = [make_config({k: v for k, v in data.items() if k != "data"}, source="example")[1]]
    if importlib.util.find_spec("trl") is not None:
        from trainers.trl import check_grpo_keys

        for config in configs:
            if isinstance(getattr(config, "grpo", None), dict):
                check_grpo_keys(config)  # every grpo key is a trl.GRPOConfig field of the right type
    return configs[0]


def test_the_docstring_yaml_examples_are_found() -> None:
    modules = {module for module, _ in _docstring_yaml()}
    assert {"trainers/loop/__init__.py", "trainers/settings.py"} <= modules


@pytest.mark.parametrize(("module", "block"), _docstring_yaml(), ids=[m for m, _ in _docstring_yaml()])
def test_every_docstring_yaml_example_builds_its_config(module: str, block: str) -> None:
    data = yaml.load(block, Loader=yaml_loader())
    assert isinstance(data, dict), f"{module}: the example is not a mapping"
    build_example(data)
