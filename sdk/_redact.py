"""Credential redaction: what a call record may carry of the request besides the conversation.

One rule for every integration, applied when a record becomes a store event (see ``CallRecord.to_event``):

- a key whose name, lower-cased with everything but letters and digits removed, matches
  :data:`SECRET_NAME` (and is not a token count, :data:`TOKEN_COUNT`) has its value replaced by
  ``"[redacted]"``, at any depth of dicts and lists;
- JSON schemas are structure, not secrets: the names in a schema's ``properties``,
  ``patternProperties``, ``$defs``, ``definitions`` or ``dependentSchemas`` map (a map whose every value is
  a schema: a dict or a bool) are never taken for secret keys, so ``response_format`` JSON schemas and
  tool parameter schemas are stored as the model saw them (their string values still lose URL passwords);
- in every string value, a URL's password (``https://user:PASSWORD@host``) and the values of query
  parameters whose names match the same rule are replaced by ``[redacted]``; a string that starts with
  an HTTP auth scheme (``Bearer ...``, ``Basic ...``) is replaced whole;
- the top-level parameters that carry headers or HTTP clients are dropped whole (:data:`DROPPED_PARAMS`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = [
    "DROPPED_PARAMS",
    "REDACTED",
    "SCHEMA_MAPS",
    "SECRET_NAME",
    "TOKEN_COUNT",
    "is_secret_name",
    "redact",
    "redact_params",
    "redact_text",
]

REDACTED = "[redacted]"
"""What a secret value is replaced by."""

SECRET_NAME = re.compile(
    r"(?:api|access|secret|private|signing|subscription|session|master|encryption|auth|client|license)key"
    r"|^key$|secret|passw(?:or)?d|passphrase|^pwd$|credential|authorization|^auth$|bearer|cookie|jwt"
    r"|tokens?$"
)
"""Matched (``search``) against a normalised key name: ``api_key``, ``apiKey``, ``X-API-KEY`` -> ``apikey``.

``tokens?$`` catches ``token``, ``access_token``, ``session_token``, ``x-session-token``, ``auth_tokens``;
the token counts and switches among those names are :data:`TOKEN_COUNT` and kept. Names that only end in
``key`` are kept (``prompt_cache_key``, ``idempotency_key``): only the key kinds listed are secrets.
"""

TOKEN_COUNT = re.compile(
    r"(?:max|min|num|total|prompt|completion|input|output|new|special|reasoning|cached|audio|image|text"
    r"|budget|context)tokens?$"
)
"""Normalised names ending in ``token(s)`` that are counts or settings, not credentials: ``max_tokens``,
``max_completion_tokens``, ``max_new_tokens``, ``skip_special_tokens``, ``min_tokens``, ``prompt_tokens``."""

SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""JSON-schema keywords whose value maps names to schemas: those names are structure, never secrets."""

DROPPED_PARAMS = frozenset(
    {"headers", "extra_headers", "default_headers", "http_client", "http_async_client", "client"}
)
"""Request parameters never stored at all: header maps (any header may carry a credential) and clients."""

_NORMALISE = re.compile(r"[^a-z0-9]")
_USERINFO = re.compile(r"(?<=://)([^/@\s:?#]*):([^/@\s?#]+)@")
_QUERY_PARAM = re.compile(r"([?&;])([^=&#;\s]+)=([^&#;\s]*)")
_AUTH_SCHEME = re.compile(r"\s*(?:bearer|basic)\s+\S", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # parameter names repeat call after call
def is_secret_name(name: str) -> bool:
    """Whether a key named ``name`` holds a credential (case, ``_`` and ``-`` do not matter).

    Example:
        >>> [is_secret_name(n) for n in ("apiKey", "X-API-KEY", "access_token", "max_tokens", "top_logprobs")]
        [True, True, True, False, False]
    """
    norm = _NORMALISE.sub("", name.lower())
    return SECRET_NAME.search(norm) is not None and TOKEN_COUNT.search(norm) is None


def _query_param(match: re.Match[str]) -> str:
    sep, name, _ = match.groups()
    return f"{sep}{name}={REDACTED}" if is_secret_name(name) else match.group(0)


def redact_text(text: str) -> str:
    """``text`` with URL passwords, secret-named query values and ``Bearer``/``Basic`` credentials redacted.

    Example:
        >>> redact_text("https://u:pw@host/v1?api-key=k&page=2")
        'https://u:[redacted]@host/v1?api-key=[redacted]&page=2'
        >>> redact_text("Bearer sk-123")
        '[redacted]'
    """
    if text[:1] in "bB \t" and _AUTH_SCHEME.match(text):
        return REDACTED
    if "@" in text:
        text = _USERINFO.sub(rf"\1:{REDACTED}@", text)
    if "=" in text:
        text = _QUERY_PARAM.sub(_query_param, text)
    return text


def _is_schema_map(key: Any, value: Any) -> bool:
    """Whether ``value`` under ``key`` maps names to JSON schemas (``"properties": {"password": {...}}``)."""
    return (
        key in SCHEMA_MAPS
        and isinstance(value, dict)
        and all(isinstance(v, (dict, bool)) for v in value.values())
    )


def redact(value: Any, *, names: bool = True) -> Any:
    """``value`` with every credential in it redacted (see the module docstring); the input is not changed.

    Dicts and lists are copied only where something was redacted below them. ``names=False``: the keys of
    this dict are not checked (the names of a JSON schema's properties); its values still are.

    Example:
        >>> redact({"temperature": 0.2, "max_tokens": 9, "extra_body": {"metadata": {"apiKey": "sk-1"}}})
        {'temperature': 0.2, 'max_tokens': 9, 'extra_body': {'metadata': {'apiKey': '[redacted]'}}}
        >>> redact({"type": "object", "properties": {"password": {"type": "string"}}})
        {'type': 'object', 'properties': {'password': {'type': 'string'}}}
    """
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        out = None
        for k, v in value.items():
            if names and isinstance(k, str) and v is not None and is_secret_name(k):
                new = REDACTED
            else:
                new = redact(v, names=not _is_schema_map(k, v))
            if new is not v and out is None:
                out = dict(value)
            if out is not None:
                out[k] = new
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [redact(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def redact_params(params: dict[str, Any]) -> dict[str, Any]:
    """Request parameters as stored: :data:`DROPPED_PARAMS` removed, the rest through :func:`redact`."""
    if not DROPPED_PARAMS.isdisjoint(params):
        params = {k: v for k, v in params.items() if k not in DROPPED_PARAMS}
    return redact(params)
