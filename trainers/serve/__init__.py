"""The local policy server: an OpenAI-compatible endpoint with logprobs, token ids and policy versions.

The package: :mod:`~trainers.serve.app` (the HTTP side, :class:`LocalPolicyServer`, ``python -m
trainers.serve``), :mod:`~trainers.serve.engine` (the model sampling chat completions; its parts are
listed there), :mod:`~trainers.serve.policy` (the loop's policy handles: this server, vLLM, an external one),
:mod:`~trainers.serve.weights` (weights pushed as tensors, adapters loaded all or nothing),
:mod:`~trainers.serve.ipc` (pushes to a server process on a GPU through CUDA IPC),
:mod:`~trainers.serve.versions` (versions only move forward) and :mod:`~trainers.serve.pidfile` (the server
process: one per output directory, its start-up wait and stop).

Names are imported on first use, so ``trainers.serve.policy`` (imported by agents for the policy's address)
loads neither torch nor FastAPI.

Example:
    >>> from trainers.serve import LocalPolicyServer  # doctest: +SKIP
    >>> server = LocalPolicyServer("path/to/model").start()  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Engine": "engine",
    "Generation": "scheduler",
    "LocalPolicyServer": "app",
    "create_app": "app",
    "main": "app",
    "parse_tool_calls": "response",
    "render_prompt_ids": "request",
}
"""Each name's module: ``trainers.serve.NAME`` imports it on first use."""

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"trainers.serve.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'trainers.serve' has no attribute {name!r}")
