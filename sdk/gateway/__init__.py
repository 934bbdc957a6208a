"""Capture without code changes: an OpenAI-compatible gateway that records every call into the store.

Point any agent's OpenAI (or Anthropic: ``/v1/messages``) base URL at the gateway, in any language or
container, and its calls land in the same crash-safe store as in-process capture. ``python -m sdk.gateway
--upstream URL`` serves it; see :func:`main` for the options. Sessions come from the URL
(``/sessions/<id>/v1``) or from the ``X-Tracerl-Session`` / ``X-Tracerl-Task`` / ``X-Tracerl-Sample`` /
``X-Tracerl-Metadata`` headers (``X-Tracerl-Agent`` names the agent of a call: its role in per-agent
training); ``POST /sessions/<id>/reward`` and ``POST /sessions/<id>/end`` give rewards and end sessions, and
``GET /stats`` reports a worker's counters. With a gateway token (``--auth-token-file`` or
``$TRACERL_GATEWAY_TOKEN``) every route needs it, in ``X-Tracerl-Gateway-Token`` or as ``/token/<token>/``
at the start of the path.

Example:
    >>> from sdk.gateway import GatewayConfig, create_app
    >>> app = create_app(GatewayConfig(upstream="http://127.0.0.1:8000/v1"))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sdk.gateway._cli import main

if TYPE_CHECKING:
    from sdk.gateway._app import GatewayConfig, create_app

__all__ = ["GatewayConfig", "create_app", "main"]


def __getattr__(name: str) -> Any:
    # uvicorn, aiohttp and the openai converters load only when an app is built, not for `--help`.
    if name in ("GatewayConfig", "create_app"):
        from sdk.gateway import _app

        return getattr(_app, name)
    raise AttributeError(name)
