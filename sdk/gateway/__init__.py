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

Who holds which credential (the agent being trained is untrusted code):

- The **gateway token** (``--auth-token-file`` / ``$TRACERL_GATEWAY_TOKEN``) is for model calls: the
  agents hold it (in their base URL or a header). It keeps out whoever else reaches the port; a bind beyond
  loopback is refused without it.
- The **control token** (``--control-token-file`` / ``$TRACERL_GATEWAY_CONTROL_TOKEN``) is for
  ``POST /sessions/<id>/reward`` and ``/end``, sent in ``X-Tracerl-Control-Token``: only the trainer or
  harness that scores the sessions holds it, so an agent cannot reward or end its own sessions (403 with
  the gateway token alone, 401 with neither; nothing changes). Prefer the file: an agent started from a
  shell that exports the variable inherits it (``tracerl rollout`` keeps it from its Ray tasks). Without
  one, these routes take the gateway token like every other (on loopback without any token, any local
  process can post rewards): set one whenever agents run code on the gateway's host.
- The upstream's own key (``Authorization`` / ``x-api-key``) is forwarded as the client sent it, never
  recorded.

Untrusted JSON (request bodies, answers, stream chunks, SSE events) is read by one bounded parser
(:func:`sdk._json.parse_untrusted`); what it cannot read is forwarded and counted, or makes the call a
stored failed call, and a client's error always comes in its API's own format (Anthropic's on
``/v1/messages``, an SSE ``error`` event for a stream that breaks).

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
