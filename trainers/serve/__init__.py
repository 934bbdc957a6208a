"""The local policy server: an OpenAI-compatible endpoint with logprobs, token ids and policy versions.

The package: :mod:`~trainers.serve.app` (the HTTP side, :class:`LocalPolicyServer`, ``python -m
trainers.serve``), :mod:`~trainers.serve.engine` (the model sampling chat completions),
:mod:`~trainers.serve.policy` (the loop's policy handles: this server, vLLM, an external one),
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

__all__ = [
    "Engine",
    "Generation",
    "LocalPolicyServer",
    "create_app",
    "main",
    "parse_tool_calls",
    "render_prompt_ids",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("trainers.serve.app"), name)
    raise AttributeError(f"module 'trainers.serve' has no attribute {name!r}")
