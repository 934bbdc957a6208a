"""The engine's paged path: transformers' continuous batching with tracerl's sampler on the device.

The library brings the paged KV cache, the scheduler and one packed forward per step (CUDA graphs on a GPU);
the step samples with :mod:`trainers.serve.sampling`.

transformers (5.23) ``ContinuousBatchingManager`` schedules requests into packed steps, keeps the KV cache in
pages and returns each sampled id with its logprob. What it lacks, and how this module fills it:

- per-request seeds and greedy rows (its sampling is one ``torch.multinomial`` on the global generator, or
  argmax for every row): the step's sampling is replaced (``_Runner._forward_process_and_sample``) by
  :func:`~trainers.serve.sampling.sample_rows`; each request's temperature, top_p and seed travel as its
  logits-processor arguments (int32 rows the library already packs per step);
- logprobs of ``softmax(logits / temperature)`` before the top_p cut (its logprobs are after it);
- top logprobs and LoRA adapters per request (one forward serves one set of weights; peft's per-row adapters
  are not passed through): the engine serves those requests on its batch path instead.

These hooks subclass the library's ``ModelRunner`` and logits-processor classes: transformers is pinned to
``>=5.23,<6`` in pyproject, and the tests run this path on CPU.

Example:
    >>> pool = PagedPool(model, stop_ids=[2], max_batch=64)  # doctest: +SKIP
    >>> pool.generate([1, 2, 3], max_tokens=8, temperature=1.0, top_p=1.0, seed=7)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import ContinuousBatchingManager
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.continuous_batching.model_runner import ModelRunner
from transformers.generation.logits_process import LogitsProcessorList

from trainers.serve.sampling import sample_rows

__all__ = ["PagedPool"]

_MASK31 = (1 << 31) - 1


class _Arg(ContinuousBatchingLogitsProcessor):
    """Carries one per-request sampling argument into the step's int32 argument rows (changes no logits)."""

    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, key: str, kind: type, default: float) -> None:
        self.key, self.kind, self.default = key, kind, default
        self.supported_kwargs = {key: kind}

    def _pack(self, values: list[Any]) -> torch.Tensor:
        if self.kind is float:
            return torch.tensor(values, dtype=torch.float32).view(dtype=torch.int32)
        return torch.tensor(values, dtype=torch.int32)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(self._pack([self.default]).expand_as(int32_tensor))

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        return self._pack(
            [r.state.logit_processor_kwargs.get(self.key, self.default) for r in requests_with_new_token]
        )

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return scores


def _argument_rows() -> ContinuousBatchingLogitsProcessorList:
    args = [_Arg("temperature", float, 1.0), _Arg("top_p", float, 1.0), _Arg("seed_lo", int, 0),
            _Arg("seed_hi", int, 0)]  # fmt: skip
    rows = ContinuousBatchingLogitsProcessorList(LogitsProcessorList())
    rows.logits_processor = LogitsProcessorList(args)
    rows.tensors_required = len(args)
    rows._retrieve_processors_kwargs()
    rows.do_processing = True
    return rows


class _Runner(ModelRunner):
    """The library's model runner with tracerl's sampling step (the rest, CUDA graphs included, kept)."""

    def _forward_process_and_sample(
        self,
        model: torch.nn.Module,
        batch_data: dict,
        carry_over_ids: torch.Tensor,
        prev_output_ids: torch.Tensor,
        output_ids: torch.Tensor,
    ) -> None:
        self.inputs_and_outputs.carry_over_tokens(batch_data["input_ids"], carry_over_ids, prev_output_ids)
        logits = model(**batch_data).logits
        index = batch_data["logits_indices"]
        if "logits_to_keep" not in batch_data:
            logits = logits[:, index, :]
        args = batch_data["logits_processor_args"]
        rows = logits.shape[1]
        seed = args[2, :rows].long() | (args[3, :rows].long() << 31)
        ids, lps, _ = sample_rows(
            logits[0],
            args[0, :rows].view(dtype=torch.float32),
            args[1, :rows].view(dtype=torch.float32),
            seed,
            batch_data["position_ids"][0, index].long(),
            use_top_p=True,  # a static choice: the step may be captured in a CUDA graph
        )
        output_ids[0, :rows].copy_(ids)
        output_ids[1, :rows].copy_(lps.view(dtype=torch.int32))


class _Manager(ContinuousBatchingManager):
    def _create_batch_processor(self) -> Any:
        processor = super()._create_batch_processor()
        old = processor.model_runner
        if not isinstance(old, _Runner):
            processor.model_runner = _Runner(
                logit_processor=old.logit_processor,
                cb_config=old.cb_config,
                cache=old.cache,
                inputs_and_outputs=old.inputs_and_outputs,
                do_sample=True,
                return_logprobs=True,
            )
        return processor


def _cb_config(model: Any, max_batch: int, max_len: int) -> ContinuousBatchingConfig:
    """A cache for ``max_batch`` requests of ``max_len`` tokens, sized here rather than by the library.

    Left to itself the library takes most of the free memory (the host's, on CPU), and without a flash
    attention kernel every step builds a mask of max_batch_tokens x all cache tokens: both stay modest here,
    and a trainer sharing the GPU keeps its memory.
    """
    on_cpu = model.device.type == "cpu"
    page = 32 if on_cpu else 256
    return ContinuousBatchingConfig(
        return_logprobs=True,
        page_size=page,
        num_blocks=math.ceil(max_batch * max_len / page),
        max_batch_tokens=512 if on_cpu else 2048,
        max_requests_per_batch=max_batch,
        auto_switch_to_flash=False,  # its kernels fallback would fetch from the Hub
        # Prefix sharing would hand requests after a weight swap KV blocks the old weights computed (the
        # swap test caught it); the library has no call to drop them, so it stays off.
        allow_block_sharing=False,
    )


class PagedPool:
    """A running continuous-batching loop on ``model``: :meth:`generate` blocks until one request is done.

    Args:
        model: a causal LM (its attention is set to ``sdpa`` unless it already uses a paged-capable one).
        stop_ids: token ids that end a completion.
        max_batch: most requests per step.
        max_len: prompt + completion tokens a request may hold in the CPU cache.

    Example:
        >>> pool = PagedPool(model, stop_ids=[2])  # doctest: +SKIP
        >>> out = pool.generate([5], max_tokens=4, temperature=0, top_p=1, seed=1)  # doctest: +SKIP
    """

    def __init__(self, model: Any, stop_ids: list[int], max_batch: int = 64, max_len: int = 1024) -> None:
        if model.config._attn_implementation not in ("sdpa", "paged|eager") and "flash" not in str(
            model.config._attn_implementation
        ):
            model.set_attn_implementation("sdpa")  # the batch path shares the model: keep a plain attention
        self.stop_ids = sorted(stop_ids)
        gen = GenerationConfig(do_sample=True, eos_token_id=self.stop_ids or -1, max_new_tokens=16)
        self.manager = _Manager(model, gen, _cb_config(model, max_batch, max_len))
        self.manager.logit_processor = _argument_rows()
        self._waiting: dict[str, tuple[threading.Event, list[Any]]] = {}
        self._lock = threading.Lock()
        self._ids = iter(range(1 << 62))
        self.manager.start()
        self._closed = False
        threading.Thread(target=self._deliver, name="tracerl-paged-results", daemon=True).start()

    def _deliver(self) -> None:
        while not self._closed:
            out = self.manager.get_result(timeout=0.2)
            if out is None:
                if not self.manager.is_running():  # the loop died: fail everyone waiting
                    with self._lock:
                        for event, box in self._waiting.values():
                            box.append(RuntimeError("the continuous-batching loop stopped"))
                            event.set()
                    return
                continue
            if not out.is_finished():
                continue
            with self._lock:
                entry = self._waiting.pop(out.request_id, None)
            if entry is not None:
                entry[1].append(out)
                entry[0].set()

    def submit(
        self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float, seed: int
    ) -> Any:
        """Queue one completion; returns a ticket for :meth:`result`.

        Example:
            >>> ticket = pool.submit([5, 6], max_tokens=4, temperature=1, top_p=1, seed=3)  # doctest: +SKIP
        """
        rid = f"r{next(self._ids)}"
        event, box = threading.Event(), []
        with self._lock:
            self._waiting[rid] = (event, box)
        self.manager.add_request(
            list(prompt_ids), request_id=rid, max_new_tokens=int(max_tokens),
            eos_token_id=self.stop_ids or -1,
            temperature=float(temperature), top_p=float(top_p), seed_lo=int(seed) & _MASK31,
            seed_hi=(int(seed) >> 31) & _MASK31,
        )  # fmt: skip
        return event, box

    def result(self, ticket: Any) -> tuple[list[int], list[float], str]:
        """Wait for a ticket: ``(token ids, logprobs, finish reason)``; ``RuntimeError`` if it failed.

        Example:
            >>> pool.result(ticket)  # doctest: +SKIP
            ([7, 9, 2], [-1.2, -0.4, -2.0], 'stop')
        """
        event, box = ticket
        event.wait()
        out = box[0]
        if isinstance(out, BaseException):
            raise out
        if out.error is not None:
            raise RuntimeError(f"generation failed: {out.error}")
        ids = list(out.generated_tokens)
        finish = "stop" if ids and ids[-1] in self.stop_ids else "length"
        return ids, [float(x) for x in out.logprobs], finish

    def generate(self, prompt_ids: list[int], **sampling: Any) -> tuple[list[int], list[float], str]:
        """:meth:`submit` then :meth:`result`.

        Example:
            >>> pool.generate([5, 6], max_tokens=4, temperature=0, top_p=1.0, seed=1)  # doctest: +SKIP
        """
        return self.result(self.submit(prompt_ids, **sampling))

    def pause(self) -> Any:
        """The library's pause: the loop parks between steps while the caller changes weights in place."""
        return self.manager.pause()

    def close(self) -> None:
        """Stop the loop (requests still running fail)."""
        self._closed = True
        self.manager.stop(block=True, timeout=10)
