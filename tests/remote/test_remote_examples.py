"""Every example config under examples/remote/ builds its backend's config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainers import available_trainers, get_trainer, resolve_backend
from trainers.remote import RemoteTrainer

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "remote").glob("*.yaml"))


def test_one_example_per_remote_backend():
    remote = {name for name in available_trainers() if issubclass(get_trainer(name), RemoteTrainer)}
    assert remote == {"ray", "openai", "tinker"}
    assert {resolve_backend(yaml.safe_load(p.read_text())["backend"])[0] for p in EXAMPLES} == remote


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_builds_config(path):
    data = yaml.safe_load(path.read_text())
    name, overrides = resolve_backend(data.pop("backend"))
    config = get_trainer(name).config_class(**{**data, **overrides})
    assert config.model and config.output_dir.startswith("runs/")
