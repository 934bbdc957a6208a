"""Every example config under examples/remote/ builds its backend's config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainers.remote import REMOTE_BACKENDS, resolve_backend

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "remote").glob("*.yaml"))


def test_one_example_per_backend():
    assert {resolve_backend(yaml.safe_load(p.read_text())["backend"])[0] for p in EXAMPLES} == set(
        REMOTE_BACKENDS
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_builds_config(path):
    from importlib import import_module

    data = yaml.safe_load(path.read_text())
    name, overrides = resolve_backend(data.pop("backend"))
    module, _, attr = REMOTE_BACKENDS[name].partition(":")
    trainer_cls = getattr(import_module(module), attr)
    config = trainer_cls.config_class(**{**data, **overrides})
    assert config.model and config.output_dir.startswith("runs/")
