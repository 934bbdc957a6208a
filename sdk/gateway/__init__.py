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

Guarantees:

- A call is in the store before the last byte of its response is sent (the terminal SSE event,
  ``data: [DONE]``, ``response.completed`` or ``message_stop``, is held back until the call is written), so
  a client that got its whole answer can rely on it being stored, even if the gateway is killed right after.
  Stream events are otherwise forwarded as they arrive, never buffered whole.
- Upstream errors reach the client unchanged and are stored as failed calls; an unreachable upstream is a
  502 with an OpenAI-style body, also stored. A client that goes away before its answer is delivered leaves
  a failed call (``ConnectionAbortedError``), never a successful one; the upstream request is dropped.
- Every call the upstream answered is stored. A request the mapping cannot represent (``messages`` that are
  not messages, an unknown content block) is stored without messages, the request under
  ``extra.malformed_request``, and counted; a compressed body (gzip, deflate) is recorded decompressed up
  to 64 MiB; a body it cannot read is forwarded and answered but not recorded, and counted.
- Hop-by-hop headers (RFC 9110 §7.6.1, and any header ``Connection`` names) are dropped both ways; client
  keys and headers go upstream and are never stored; the gateway prints neither a token nor an upstream
  URL's password, and ``/stats`` shows the store's name, not its path.
- A store that cannot be written never fails a request: logged once and counted in ``GET /stats`` (the
  answering worker's counters). With several workers each writes its own segments; the reader merges a
  session's parts. WebSocket upgrades are answered 501 (HTTP only).

Sessions: task, sample and metadata are taken from a session's first call; a session id is used once
(calls after its end are counted by the reader as ``event_after_session_end``); ids in the URL are
percent-decoded once as UTF-8 (:mod:`sdk.gateway._http`); an ``X-Tracerl-Metadata`` that is not a JSON
object is ignored and counted. A reward that is not a finite number is a 400; ending a session no worker
opened and the store does not hold is a 404.

Token data: ``--token-data`` adds ``logprobs`` and vLLM's ``return_token_ids`` to chat requests (Responses:
the output-text logprobs and ``enable_response_messages``); ``--strip-token-data`` removes from responses
what the client did not ask for. Only for servers that accept them (vLLM, SGLang): with OpenAI's API
upstream it is refused. Wire formats (Anthropic Messages, Responses → OpenAI-format episodes, one mapping):
:mod:`sdk.openai_wire`. Harnesses: Claude Code needs ``--bare`` (else it sends its skill listing as a system
turn after the first user turn, which the episode validator rejects) and ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``
below its 32,000 default for a small server; its task goes in ``ANTHROPIC_CUSTOM_HEADERS="X-Tracerl-Task:
<id>"`` (Codex: the provider's ``http_headers``); tested with Claude Code and Codex from npm against a
scripted upstream (``tests/gateway/test_harness_clis.py``).

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
