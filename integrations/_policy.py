"""Where the policy server is, for the per-framework recipes (``policy_client``, ``policy_chat_model``, ...).

The loop and ``tracerl rollout`` name the policy in ``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL``;
:func:`sdk.rollout.policy_endpoint` reads them as they were when the current sample started. The served
name stays the same for a whole run, so a model built from them once serves every sample.

Example:
    >>> endpoint("http://127.0.0.1:8000/v1/", None)
    ('http://127.0.0.1:8000/v1', 'policy')
"""

from __future__ import annotations

from sdk import _env
from sdk.rollout import policy_endpoint

__all__ = ["API_KEY", "MAX_RETRIES", "MODEL", "TEMPERATURE", "TIMEOUT_S", "endpoint", "model_name"]

TIMEOUT_S = 600.0
"""Client timeout per request: a local CPU server queues requests for minutes under a loop's concurrency
(LlamaIndex's default of 60 s ended a run with ``APITimeoutError``)."""
MAX_RETRIES = 2
"""Retries of a failed request (the server answers 429 when its queue is full: the client retries later)."""
TEMPERATURE = 1.0
"""Sampling temperature: GRPO learns from the spread within a group (LlamaIndex's default is 0.1)."""
MODEL = "policy"
"""The model name sent when ``TRACERL_POLICY_MODEL`` is unset (a server with one model serves any name)."""
API_KEY = "none"
"""The API key sent: the local policy server on loopback needs none, but OpenAI clients require one."""


def endpoint(base_url: str | None, model: str | None) -> tuple[str, str]:
    """``(base_url, model)``: the arguments if given, else the policy the environment names.

    Raises:
        RuntimeError: no base URL given and ``TRACERL_POLICY_BASE_URL`` is unset.

    Example:
        >>> endpoint("http://127.0.0.1:8000/v1", "policy@v2")
        ('http://127.0.0.1:8000/v1', 'policy@v2')
    """
    env = policy_endpoint()
    url = base_url or env.base_url
    if not url:
        raise RuntimeError(
            f"{_env.TRACERL_POLICY_BASE_URL} is not set: run the agent through `tracerl rollout` or the loop "
            "(they set it), or start `tracerl serve --model DIR --port 8000` and export "
            f"{_env.TRACERL_POLICY_BASE_URL}=http://127.0.0.1:8000/v1 (or pass base_url=)"
        )
    return url.rstrip("/"), model_name(model)


def model_name(model: str | None) -> str:
    """``model`` if given, else ``TRACERL_POLICY_MODEL``, else :data:`MODEL`.

    Example:
        >>> model_name("policy@v2")
        'policy@v2'
    """
    return model or policy_endpoint().model or MODEL
