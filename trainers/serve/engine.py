"""The policy server's engine: one causal LM (and any LoRA adapters on it) sampling chat completions.

The HTTP side is :mod:`trainers.serve.app`. The engine batches concurrent requests, routes each by its
requested ``model`` to the base weights or one LoRA adapter (peft multi-adapter: one forward batch per
adapter), and gives every set of weights a ``policy_version`` that each generation reports, so a trainer
knows which weights produced which tokens. :class:`Engine` composes one part per concern:

- :mod:`trainers.serve.served`: the weights and their versions (load, reload, push; all or nothing);
- :mod:`trainers.serve.slots`: the adapter slots (served names, aliases, routing);
- :mod:`trainers.serve.scheduler`: admission (the bound, :class:`~trainers.serve.scheduler.EngineBusy`) and
  scheduling on the paged or the batch path;
- :mod:`trainers.serve.request` and :mod:`trainers.serve.response`: a chat body checked and rendered, and
  the generations shaped as an OpenAI response.

Example:
    >>> from trainers.serve.engine import Engine  # doctest: +SKIP
    >>> eng = Engine("path/to/base", model_name="base", adapters={"router": "runs/router"})  # doctest: +SKIP
    >>> eng.chat({"model": "router", "messages": [{"role": "user", "content": "hi"}]})  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainers.serve.request import SamplingParams, chat_request, render_prompt_ids
from trainers.serve.response import chat_response
from trainers.serve.scheduler import Batching, Generation, Request, Scheduler
from trainers.serve.served import ServedWeights

__all__ = ["Engine"]


def _held(change: Callable[..., int], *, renew: bool = False) -> Callable[..., int]:
    """A :class:`ServedWeights` change as an engine method, run while the scheduler holds the weights still.

    ``renew``: the change brings new base weights, so the paged path's pool is rebuilt on them.
    """

    @functools.wraps(change)
    def held(self: Engine, *args: Any, **kwargs: Any) -> int:
        with self.scheduler.hold():
            version = change(self.weights, *args, **kwargs)
            if renew:
                self.scheduler.renew()
            return version

    return held


class Engine:
    """Holds a causal LM + tokenizer (and optional LoRA adapters on it) and samples chat completions.

    A request's ``model`` picks the weights (:meth:`~trainers.serve.slots.Slots.route`); every response
    reports the ``policy_version`` of the weights that produced all of its tokens, since a reload or push
    swaps them between generation steps, once the requests generating on them are done.

    Args:
        model: a path (``from_pretrained``) or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer; loaded from ``model`` when it is a path and this is None.
        model_name: name of the base weights in responses and ``/v1/models``.
        device: torch device.
        adapters: LoRA adapters to serve on the base, ``{name: adapter directory}``.
        policy_version: version of the base weights as loaded (a restarted server goes on counting).
        dtype: what checkpoints load as: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (their own).
        batching: the admission bound and batch sizes (default :class:`~trainers.serve.scheduler.Batching`).

    Example:
        >>> eng = Engine("path/to/model", batching=Batching(max_pending=8))  # doctest: +SKIP
        >>> eng.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_name: str | None = None,
        device: str = "cpu",
        adapters: Mapping[str, str | Path] | None = None,
        policy_version: int = 0,
        *,
        dtype: str = "float32",
        batching: Batching | None = None,
    ) -> None:
        self.weights = ServedWeights(
            model, tokenizer, model_name=model_name, device=device, dtype=dtype, policy_version=policy_version
        )
        for name, path in (adapters or {}).items():
            self.weights.reload_adapter(name, path, policy_version=0)
        self.batching = batching or Batching()
        self.scheduler = Scheduler(self.weights, self.batching)

    @property
    def model(self) -> Any:
        """The served model (a peft model once an adapter is loaded)."""
        return self.weights.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served tokenizer."""
        return self.weights.tokenizer

    @property
    def policy_version(self) -> int:
        """Version of the base weights (0 as started; each adapter has its own, see :meth:`versions`)."""
        return self.weights.slots.base.version

    def served(self) -> dict[str, str]:
        """``{name a request may send: the slot serving it}`` (:meth:`~trainers.serve.slots.Slots.served`).

        Example:
            >>> engine.served()  # doctest: +SKIP
            {'policy-lora': 'policy-lora', 'policy': 'policy-lora'}
        """
        return self.weights.slots.served()

    def versions(self) -> dict[str, int]:
        """``{slot name: policy version}``.

        Example:
            >>> engine.versions()  # doctest: +SKIP
            {'base': 0, 'router': 3}
        """
        return self.weights.slots.versions()

    def close(self) -> None:
        """Stop the paged path's thread (an engine on the batch path holds none).

        Example:
            >>> engine.close()  # doctest: +SKIP
        """
        self.scheduler.close()

    # A change of weights swaps them between generation steps, once the requests generating on the old ones
    # are done: each of these has ServedWeights' signature and documentation.
    reload = _held(ServedWeights.reload, renew=True)
    reload_adapter = _held(ServedWeights.reload_adapter)
    push = _held(ServedWeights.push)

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_logprobs: int = 0,
        seed: int | None = None,
        model: str | None = None,
    ) -> Generation:
        """Sample one completion (concurrent callers share forwards).

        Logprobs are of ``softmax(logits / temperature)`` (raw logits when ``temperature == 0``).

        Example:
            >>> g = engine.generate([1, 2, 3], max_tokens=4, temperature=0)  # doctest: +SKIP
        """
        seed = None if seed is None else int(seed)
        p = SamplingParams(int(max_tokens), float(temperature), float(top_p), 1, int(top_logprobs), seed)
        slot = self.weights.slots.route(model)
        return self.scheduler.run(Request.choices(prompt_ids, p, slot, p.max_tokens))[0]

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` request body (non-streaming) as an OpenAI response dict.

        Extra (non-OpenAI) fields: ``return_token_ids`` (vLLM), ``chat_template_kwargs``. A bad parameter or
        a prompt longer than the context is a ``ValueError``; ``max_tokens`` is cut to what the context holds.

        Example:
            >>> r = engine.chat({"messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            ...     "tools": TOOLS, "logprobs": True, "return_token_ids": True})  # doctest: +SKIP
            >>> r["choices"][0]["message"]["tool_calls"]  # doctest: +SKIP
        """
        request = chat_request(body)
        slot = self.weights.slots.route(request.model)
        prompt_ids = render_prompt_ids(
            self.tokenizer, request.messages, request.tools, True, **request.template_kwargs
        )
        context = self.weights.context_length
        if len(prompt_ids) >= context:
            raise ValueError(
                f"this model's maximum context length is {context} tokens; the messages are "
                f"{len(prompt_ids)} tokens"
            )
        reqs = Request.choices(prompt_ids, request.params, slot, context - len(prompt_ids))
        return chat_response(self.tokenizer, request, slot, prompt_ids, self.scheduler.run(reqs))
