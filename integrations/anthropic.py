"""Capture every call an ``anthropic`` SDK client makes: Messages, sync or async, streamed or not.

The same recording HTTP transport as the OpenAI client's (``integrations.openai``) sits under the client:
it sees the exact request JSON and the full response body (SSE events reassembled), and records each
``POST /v1/messages`` as the Messages call it is, its conversation mapped to OpenAI chat messages by the
documented mapping in ``sdk.openai_wire`` (so it becomes the same episodes as a chat completions call).
API keys and headers are never recorded.

Example:
    >>> from anthropic import Anthropic
    >>> from integrations.anthropic import wrap_anthropic
    >>> client = wrap_anthropic(Anthropic(base_url="http://127.0.0.1:8000", api_key="x"))
"""

from __future__ import annotations

from typing import Any

from sdk import capture

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - exercised in the missing-dependency test
    raise capture.MissingDependency("anthropic", "anthropic") from exc

from integrations.openai import _agent_sink, _wrap_http_client

__all__ = ["wrap_anthropic"]


def wrap_anthropic(
    client: Any,
    *,
    sink: Any = None,
    agent: str | None = None,
) -> Any:
    """Record every Messages call ``client`` makes (in place; idempotent). Returns the client.

    Works for ``Anthropic`` and ``AsyncAnthropic`` clients, ``messages.create`` with or without
    ``stream=True`` and ``messages.stream(...)``.

    Args:
        client: An ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic`` client.
        sink: Where records go, ``sink(record, session)`` (default :func:`sdk.capture.record_call`).
        agent: The agent name recorded on this client's calls (the role in per-agent training).
            Applies when the client is first wrapped.

    Example:
        >>> from anthropic import AsyncAnthropic
        >>> client = AsyncAnthropic(base_url="http://127.0.0.1:8000", api_key="x")
        >>> client = wrap_anthropic(client, agent="coder")
    """
    if agent is not None:
        sink = _agent_sink(str(agent), sink)
    _wrap_http_client(client._client, isinstance(client, anthropic.AsyncAnthropic), sink)
    return client
