"""Gateway fixtures: a real `python -m sdk.gateway` process in front of the scripted upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sdk.testing import ScriptedOpenAIServer


def _need_gateway_deps() -> None:
    for module in ("aiohttp", "uvicorn", "httpx", "openai"):
        pytest.importorskip(module)


@pytest.fixture(scope="session")
def upstream() -> Iterator[ScriptedOpenAIServer]:
    """The scripted model server the shared gateway forwards to; tests that enqueue reset it first."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def gateway(upstream: ScriptedOpenAIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One gateway with two workers for the whole run: a session's calls land on both workers."""
    _need_gateway_deps()
    from tests.support.gateway import start_gateway

    gw = start_gateway(upstream.base_url, tmp_path_factory.mktemp("gateway") / "store", workers=2)
    try:
        yield gw
    finally:
        gw.stop()
