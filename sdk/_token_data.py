"""Ask an OpenAI-compatible server for token data, and hide what the client did not ask for.

Shared by the recording gateway (:mod:`sdk.gateway`) and usable by any in-process capture that rewrites a
request body before it is sent. Pure functions on parsed JSON: no HTTP library is imported.

Example:
    >>> body, added = token_data_params("chat.completions", {"model": "m", "messages": []})
    >>> body["logprobs"], body["return_token_ids"], sorted(added)
    (True, True, ['logprobs', 'return_token_ids'])
    >>> strip_token_data("chat.completions", {"choices": [{"logprobs": {"content": []}, "token_ids": [1]}],
    ...                                       "prompt_token_ids": [2]}, added)
    {'choices': [{'logprobs': None}]}
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOGPROBS_INCLUDE", "rejects_token_data", "strip_token_data", "token_data_params"]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The Responses API ``include`` entry that returns per-token logprobs of the output text."""


def rejects_token_data(url: str) -> bool:
    """Whether ``url`` is a server known to reject ``return_token_ids`` (OpenAI's API, Azure OpenAI).

    Example:
        >>> rejects_token_data("https://api.openai.com/v1"), rejects_token_data("http://127.0.0.1:8000/v1")
        (True, False)
    """
    host = (urlsplit(str(url)).hostname or "").lower()
    return host == "api.openai.com" or host.endswith(".openai.azure.com")


def token_data_params(endpoint: str, body: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """Return ``body`` asking for logprobs and (chat, vLLM) token ids, and the names of what was added.

    Chat completions get ``logprobs=true`` and vLLM's ``return_token_ids=true``; the Responses API gets
    ``include += ["message.output_text.logprobs"]`` and vLLM's ``enable_response_messages=true`` (the
    prompt's and the completion's token ids). What the client set
    itself (``logprobs: false`` included) is left as it is. ``body`` is not modified: a shallow copy is
    returned when something is added.
    Servers that reject unknown parameters (OpenAI's own rejects ``return_token_ids``) must not be sent it:
    this is opt-in.

    Args:
        endpoint: ``"chat.completions"`` or ``"responses"``.
        body: The parsed request JSON.

    Returns:
        ``(body, added)``: the request to send, and the added names (pass them to :func:`strip_token_data`).

    Example:
        >>> token_data_params("responses", {"input": "hi"})[0]["include"]
        ['message.output_text.logprobs']
    """
    added: set[str] = set()
    out = body
    if endpoint == "chat.completions":
        if body.get("logprobs") is None:
            out = {**out, "logprobs": True}
            added.add("logprobs")
        if "return_token_ids" not in body:
            out = {**out, "return_token_ids": True}
            added.add("return_token_ids")
    elif endpoint == "responses":
        include = body.get("include")
        include = list(include) if isinstance(include, list) else []
        if LOGPROBS_INCLUDE not in include:
            out = {**out, "include": [*include, LOGPROBS_INCLUDE]}
            added.add("include_logprobs")
        if "enable_response_messages" not in body:  # vLLM: the prompt's and completion's token ids
            out = {**out, "enable_response_messages": True}
            added.add("enable_response_messages")
    return out, frozenset(added)


def strip_token_data(endpoint: str, payload: Any, added: frozenset[str] | set[str]) -> Any:
    """Remove from a response body (or one stream event) the token data that only the capture asked for.

    Changes ``payload`` in place and returns it, so the client sees the shape it asked for.

    Args:
        endpoint: ``"chat.completions"`` or ``"responses"``.
        payload: A parsed response body, a ``chat.completion.chunk`` or a Responses stream event.
        added: What :func:`token_data_params` added.

    Returns:
        ``payload``.

    Example:
        >>> strip_token_data("responses", {"type": "response.output_text.delta", "logprobs": [{}]},
        ...                  {"include_logprobs"})
        {'type': 'response.output_text.delta', 'logprobs': []}
    """
    if not added or not isinstance(payload, dict):
        return payload
    if endpoint == "chat.completions":
        if "return_token_ids" in added:
            payload.pop("prompt_token_ids", None)
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if "logprobs" in added and "logprobs" in choice:
                choice["logprobs"] = None
            if "return_token_ids" in added:
                choice.pop("token_ids", None)
        return payload
    if "include_logprobs" in added:
        _strip_response_logprobs(payload)
    if "enable_response_messages" in added:
        for node in (payload, payload.get("response")):
            if isinstance(node, dict):
                node.pop("input_messages", None)
                node.pop("output_messages", None)
    return payload


def _strip_response_logprobs(node: Any) -> None:
    # Logprobs sit on output_text parts, on text delta/done events, and on the response inside events.
    if isinstance(node, dict):
        if "logprobs" in node and isinstance(node["logprobs"], list):
            node["logprobs"] = []
        for key in ("response", "part", "item"):
            if key in node:
                _strip_response_logprobs(node[key])
        for key in ("output", "content"):
            if isinstance(node.get(key), list):
                for child in node[key]:
                    _strip_response_logprobs(child)
