"""What a chat request asks: its sampling parameters, checked the way OpenAI checks them, and its prompt ids.

A bad field is a ``ValueError`` naming it; the engine's callers answer it as an OpenAI-style 400
(``trainers.serve.app``) and keep serving.

Example:
    >>> p = sampling_params({"temperature": 0.5, "max_tokens": 8, "n": 2, "seed": 3})
    >>> p.temperature, p.max_tokens, p.n, p.seed
    (0.5, 8, 2, 3)
    >>> sampling_params({"top_p": 0})
    Traceback (most recent call last):
    ValueError: 'top_p' must be a number in (0, 1], got 0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdk._numbers import is_finite_number
from sdk.messages import render_ids, template_messages

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "MAX_N",
    "MAX_TOP_LOGPROBS",
    "ChatRequest",
    "SamplingParams",
    "chat_request",
    "render_prompt_ids",
    "sampling_params",
]

#: Most choices per request (each is one sampled completion).
MAX_N = 64
#: Most ``top_logprobs`` per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler (defaults are OpenAI's; ``max_tokens`` is the server's 256)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    top_logprobs: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float, open_low: bool) -> float:
    value = body.get(key)
    if value is None:
        return default
    if is_finite_number(value) and (value > low if open_low else value >= low) and value <= high:
        return float(value)
    span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
    raise ValueError(f"{key!r} must be a number in {span}, got {value!r}")


def _integer(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key!r} must be an integer in [{low}, {high}], got {value!r}")
    return value


def sampling_params(body: dict[str, Any]) -> SamplingParams:
    """Check a ``/v1/chat/completions`` body's sampling fields; raises ``ValueError`` naming the bad one.

    Example:
        >>> sampling_params({"logprobs": True, "top_logprobs": 3}).top_logprobs
        3
    """
    raw_max = next(
        (body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None
    )
    max_tokens = 256 if raw_max is None else _integer(raw_max, "max_tokens", 1, 1 << 30)
    n = 1 if body.get("n") is None else _integer(body["n"], "n", 1, MAX_N)
    top = body.get("top_logprobs")
    top_logprobs = 0 if top is None else _integer(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(seed, "seed", -(1 << 63), (1 << 64) - 1)
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"'stop' must be a non-empty string or a list of at most 4, got {stop!r}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0, open_low=False),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
        n=n,
        top_logprobs=top_logprobs if body.get("logprobs") else 0,
        seed=seed,
        stop=stops,
    )


@dataclass(frozen=True)
class ChatRequest:
    """A ``/v1/chat/completions`` body, checked: what to render, how to sample, what the response carries.

    Example:
        >>> chat_request({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}).logprobs
        True
    """

    messages: list[dict[str, Any]]
    params: SamplingParams
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    token_ids: bool = False  # vLLM's return_token_ids
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def chat_request(body: dict[str, Any]) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body (``ValueError`` naming a bad field).

    Extra (non-OpenAI) fields: ``return_token_ids`` (vLLM), ``chat_template_kwargs``.

    Example:
        >>> chat_request({"messages": []})
        Traceback (most recent call last):
        ValueError: 'messages' must be a non-empty list
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    return ChatRequest(
        messages=messages,
        params=sampling_params(body),
        model=body.get("model"),
        tools=body.get("tools") or None,
        logprobs=bool(body.get("logprobs")),
        token_ids=bool(body.get("return_token_ids")),
        template_kwargs=dict(body.get("chat_template_kwargs") or {}),
    )


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of OpenAI ``messages`` rendered with the tokenizer's chat template (the server's prompt).

    Messages go through ``sdk.messages.template_messages`` and ``render_ids``, the same steps the trainer
    takes on the exported episode, so the ids returned as ``prompt_token_ids`` are the ids it re-renders.

    Example:
        >>> ids = render_prompt_ids(tok, [{"role": "user", "content": "hi"}])  # doctest: +SKIP
    """
    return render_ids(
        tokenizer,
        template_messages(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
