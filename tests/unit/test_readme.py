"""The README stays a guide: short, its two commands on the first screen, every example in it parses.

Reference lives in the owning module's docstring and in ``tracerl <cmd> --help``; measurements in
``tests/bench/RESULTS.md`` (DESIGN.md 6c). These tests keep the README from growing back into either.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAX_LINES = 500
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == language]


def test_the_readme_is_at_most_500_lines() -> None:
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, (
        f"README.md has {lines} lines (at most {MAX_LINES}): move reference into the owning module's "
        "docstring or --help, measurements into tests/bench/RESULTS.md"
    )


def test_the_two_commands_open_the_readme_with_nothing_between_them() -> None:
    fences = list(FENCE.finditer(README))
    first, second = fences[0], fences[1]
    assert README[: first.start()].count("\n") < 15, "the main job's command is not on the first screen"
    assert "examples.main" in first.group(2) and "pytest" in second.group(2)
    between = README[first.end() : second.start()].strip()
    assert "\n\n" not in between, "only the test command's own paragraph may sit between the two commands"
    # What the first screen promises about the test command: time, disk, system packages.
    for fact in ("minutes", "GB", "chromium", "nodejs", "npm"):
        assert fact in between, f"the test command's paragraph does not say {fact!r}"


def test_no_dated_run_or_commit_hash_in_the_readme() -> None:
    months = "January|February|March|April|May|June|July|August|September|October|November|December"
    assert not re.search(rf"\b\d{{1,2}} ({months})\b", README), "a dated run belongs in RESULTS.md"
    assert not re.search(r"\bcommit [0-9a-f]{7,40}\b", README), "a commit hash belongs in RESULTS.md"
    assert "slower host" not in README


def test_every_python_example_in_the_readme_is_valid_python() -> None:
    blocks = _blocks("python")
    assert blocks
    for body in blocks:
        ast.parse(body)  # a SyntaxError names the line


def _loop_config(data: dict) -> None:
    """Parse a loop config as ``tracerl train --loop`` does before it loads anything."""
    from trainers.loop.config import LoopConfig, train_settings
    from trainers.settings import make_config

    cfg = LoopConfig.from_mapping(data)
    _, config, _ = make_config(train_settings(cfg, cfg.model, Path(cfg.out) / "train"), source="README")
    if importlib.util.find_spec("trl") is not None and isinstance(getattr(config, "grpo", None), dict):
        from trainers.trl import check_grpo_keys

        check_grpo_keys(config)  # every train.grpo key is a trl.GRPOConfig field


def test_every_yaml_example_in_the_readme_parses_as_what_it_is() -> None:
    from trainers.loop.config import LoopConfig
    from trainers.settings import make_config, yaml_loader

    blocks = _blocks("yaml")
    assert blocks, "the README shows a loop config"
    loop_keys = set(LoopConfig.__dataclass_fields__)
    for body in blocks:
        data = yaml.load(body, Loader=yaml_loader())  # as tracerl reads its files
        assert isinstance(data, dict), f"a README YAML example is not a mapping:\n{body}"
        if "agent" in data or set(data) <= loop_keys:
            assert "agent" in data, f"a README loop config without its agent:\n{body}"
            _loop_config(data)
        else:  # a `tracerl train --config` file
            make_config(data, source="README")


@pytest.mark.parametrize(
    "bad",
    [
        "agent: a:f\ntasks: t.jsonl\nmodel: m\nround: 3\n",  # a misspelt loop key
        "agent: a:f\ntasks: t.jsonl\nmodel: m\ngroup_size: 1\n",  # a value the loop refuses
        "agent: a:f\ntasks: t.jsonl\nmodel: m\ntrain: {lora: true, no_such_setting: 1}\n",  # a train key
    ],
)
def test_the_yaml_check_refuses_what_the_loop_refuses(bad: str) -> None:
    # The check above is only worth something if it fails on a config the loop would refuse.
    from trainers.errors import UserError

    with pytest.raises(UserError):
        _loop_config(yaml.safe_load(bad))
