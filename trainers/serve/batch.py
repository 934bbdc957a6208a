"""The engine's batch path: a running batch of left-padded rows over one KV cache; rows join and leave it.

Requests that arrive while a batch runs join it at the next step (their prompts prefilled as a group, their
cache left-padded to the running one's length and appended); a row that is done leaves at once, and cache
columns that no remaining row attends to are cut. Each step samples every row at once on the model's device
(:func:`trainers.serve.sampling.sample_rows`); per row only the sampled id and its logprob (and top logprobs
on request) reach the host. Every forward computes logits at the last position only: full prompt logits are
batch x length x vocabulary floats (64 prompts of 300 tokens with a 49k vocabulary are 3.8 GB), of which
sampling reads one position.

Requests that start alike (an agent's system prompt and tools, a conversation's earlier turns, the ``n``
choices of one request) share their common prefix: it is run once, its KV cache repeated across the rows,
and only each row's rest is prefilled. The last shared prefix is kept (:class:`PrefixCache`), so a request
arriving alone after it reuses it too. With the main job's 422-token agent prompt, 64 requests prefill about
64 x 10 tokens instead of 64 x 430 (vLLM's prefix caching and SGLang's radix cache do the same).

Joining needs the model's cache to be transformers' plain ``DynamicCache`` (full attention); with any other
cache (sliding windows, linear attention) a batch runs until its last row is done and new requests wait.

Example:
    >>> rows = generate_batch(model, reqs, pad=0, stop_ids={2}, device=torch.device("cpu"))  # doctest: +SKIP
    >>> ids, logprobs, top, finish = rows[0]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.serve.sampling import sample_rows, uniform_host

__all__ = ["MIN_SHARED", "PrefixCache", "RunningBatch", "generate_batch"]

Row = tuple[list[int], list[float], list[list[tuple[int, float]]], str]

#: Shortest common prefix worth a forward of its own (below it the rows just prefill it each).
MIN_SHARED = 16


def _forward(model: Any, **inputs: Any) -> Any:
    try:
        return model(**inputs, logits_to_keep=1)
    except TypeError as exc:  # a model whose forward does not take it
        if "logits_to_keep" not in str(exc):
            raise
        return model(**inputs)


def _plain_layers(past: Any) -> list[Any] | None:
    """The cache's layers if all are plain ``DynamicLayer`` (rows can be appended and cut), else None."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(past, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return None
    return list(layers)


def _mask_arg(mask: torch.Tensor) -> torch.Tensor | None:
    """``mask``, or None when it masks nothing (the model then skips building an attention mask)."""
    return None if bool(mask.all()) else mask


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    return next((k for k in range(min(limit, len(a), len(b))) if a[k] != b[k]), min(limit, len(a), len(b)))


@dataclass
class PrefixCache:
    """The last shared prompt prefix and its keys and values (one row), for the weights that computed it.

    The engine empties it whenever weights change (:meth:`clear`); ``slot`` names the weights it holds.

    Example:
        >>> cache = PrefixCache()
        >>> cache.ids
        []
    """

    slot: str = ""
    ids: list[int] = field(default_factory=list)
    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def clear(self) -> None:
        """Forget the prefix (new weights make its keys and values wrong).

        Example:
            >>> PrefixCache(slot="base", ids=[1, 2]).clear()
        """
        self.slot, self.ids, self.layers = "", [], []


def _prefix_past(model: Any, reqs: Sequence[Any], device: torch.device, cache: PrefixCache | None, slot: str):
    """The rows' common prefix length and its KV cache repeated per row, or ``(0, None)``.

    Every row keeps at least one token of its own, so each has a last position to sample from. A prefix
    that starts like ``cache``'s reuses its keys and values and runs only the rest.
    """
    first = reqs[0].prompt_ids
    shared = min(len(r.prompt_ids) for r in reqs) - 1
    for r in reqs[1:]:
        shared = _common(r.prompt_ids, first, shared)
    reuse = _common(cache.ids, first, shared) if cache is not None and cache.slot == slot else 0
    # Alone and with nowhere to keep it, a request gains nothing from running its prefix apart.
    if shared < MIN_SHARED or (len(reqs) < 2 and cache is None):
        return 0, None
    past = None  # the model makes its own cache (its kind of layers) unless a kept prefix starts it
    if reuse >= MIN_SHARED:
        from transformers import DynamicCache

        past = DynamicCache()
        for i, (k, v) in enumerate(cache.layers):
            past.update(k[:, :, :reuse], v[:, :, :reuse], i)
    else:
        reuse = 0
    if shared > reuse:
        ids = torch.tensor([first[reuse:shared]], device=device)
        pos = torch.arange(reuse, shared, device=device)[None]
        past = _forward(
            model, input_ids=ids, position_ids=pos, past_key_values=past, use_cache=True
        ).past_key_values
    layers = _plain_layers(past)
    if cache is not None and layers is not None and shared > reuse:
        cache.slot, cache.ids = slot, list(first[:shared])
        cache.layers = [(layer.keys, layer.values) for layer in layers]
    if not hasattr(past, "batch_repeat_interleave"):  # a cache that cannot be repeated: no sharing
        return 0, None
    if len(reqs) > 1:
        past.batch_repeat_interleave(len(reqs))
    return shared, past


class RunningBatch:
    """Rows generating together on one set of weights: :meth:`add` requests, :meth:`step` until empty.

    A request has ``prompt_ids``, ``max_tokens``, ``temperature``, ``top_p``, ``top_logprobs`` and ``seed``.

    Example:
        >>> run = RunningBatch(model, pad=0, stop_ids={2}, device=torch.device("cpu"))  # doctest: +SKIP
        >>> run.add([req])  # doctest: +SKIP
        >>> while run:  # doctest: +SKIP
        ...     for req, (ids, lps, top, finish) in run.step():
        ...         print(req, ids)
    """

    def __init__(
        self,
        model: Any,
        *,
        pad: int,
        stop_ids: set[int],
        device: torch.device,
        prefix: PrefixCache | None = None,
        slot: str = "",
    ) -> None:
        self.model, self.pad, self.stop_ids, self.device = model, pad, stop_ids, device
        self.prefix, self.slot = prefix, slot
        self.reqs: list[Any] = []
        self.rows: list[Row] = []
        self.past: Any = None
        self.state: dict[str, torch.Tensor] = {}
        self.joinable = True  # False once the cache is not a plain DynamicCache

    def __len__(self) -> int:
        return len(self.reqs)

    @torch.inference_mode()
    def add(self, reqs: Sequence[Any]) -> None:
        """Prefill ``reqs`` and append them as rows (``RuntimeError`` when this batch cannot take rows)."""
        if not reqs:
            return
        if self.reqs and not self.joinable:
            raise RuntimeError("this model's cache cannot take rows while a batch runs")
        dev, n = self.device, len(reqs)
        shared, past = _prefix_past(self.model, reqs, dev, self.prefix, self.slot)
        rests = [r.prompt_ids[shared:] for r in reqs]
        width = max(len(x) for x in rests)
        ids = torch.full((n, width), self.pad, dtype=torch.long)
        # Left padding sits between the shared prefix and each row's rest: masked out, positions skip it.
        mask = torch.zeros((n, shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for i, rest in enumerate(rests):
            ids[i, width - len(rest) :] = torch.tensor(rest)
            mask[i, shared + width - len(rest) :] = 1
        mask = mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = _forward(
            self.model, input_ids=ids.to(dev), attention_mask=_mask_arg(mask), position_ids=pos,
            past_key_values=past, use_cache=True,
        )  # fmt: skip
        state = {
            "mask": mask,
            "logits": out.logits[:, -1],
            "last_pos": pos[:, -1],
            "temps": torch.tensor([r.temperature for r in reqs], device=dev),
            "top_ps": torch.tensor([r.top_p for r in reqs], device=dev),
        }
        if not self.reqs:
            self.past, self.state = out.past_key_values, state
            self.joinable = _plain_layers(self.past) is not None
        else:
            self._append(out.past_key_values, state)
        self.reqs += list(reqs)
        self.rows += [([], [], [], "length") for _ in reqs]

    def _append(self, past: Any, state: dict[str, torch.Tensor]) -> None:
        """Join new rows' cache and state to the running ones, the shorter cache left-padded."""
        old_layers, new_layers = _plain_layers(self.past), _plain_layers(past)
        if old_layers is None or new_layers is None:
            raise RuntimeError("this model's cache cannot take rows while a batch runs")
        length = max(self.state["mask"].shape[1], state["mask"].shape[1])

        def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = length - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for old, new in zip(old_layers, new_layers, strict=True):
            old.keys = torch.cat([left_pad(old.keys, 2), left_pad(new.keys, 2)])
            old.values = torch.cat([left_pad(old.values, 2), left_pad(new.values, 2)])
        self.state["mask"] = torch.cat([left_pad(self.state["mask"], 1), left_pad(state["mask"], 1)])
        for key in ("logits", "last_pos", "temps", "top_ps"):
            self.state[key] = torch.cat([self.state[key], state[key]])

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, Row]]:
        """Sample one token for every row; returns the rows that are done (they leave the batch)."""
        st, reqs = self.state, self.reqs
        use_top_p, n_top = any(r.top_p < 1 for r in reqs), max(r.top_logprobs for r in reqs)
        # Each row's uniform from its seed and the index of its last input token (prompt, then sampled ids).
        positions = [len(r.prompt_ids) - 1 + len(row[0]) for r, row in zip(reqs, self.rows, strict=True)]
        u = uniform_host([r.seed for r in reqs], positions)
        tok_t, lp_t, top = sample_rows(
            st["logits"], st["temps"], st["top_ps"], None, None, use_top_p=use_top_p, top_logprobs=n_top, u=u
        )
        toks, lps = tok_t.tolist(), lp_t.tolist()  # one id and one float per row leave the device
        tops = None if top is None else (top[0].tolist(), top[1].tolist())
        done: list[tuple[Any, Row]] = []
        keep: list[int] = []
        for i, r in enumerate(reqs):
            row_ids, row_lps, row_top, _ = self.rows[i]
            row_ids.append(toks[i])
            row_lps.append(lps[i])
            if tops is not None and r.top_logprobs:
                row_top.append(list(zip(tops[1][i], tops[0][i], strict=True))[: r.top_logprobs])
            if toks[i] in self.stop_ids:
                done.append((r, (row_ids, row_lps, row_top, "stop")))
            elif len(row_ids) >= r.max_tokens:
                done.append((r, self.rows[i]))
            else:
                keep.append(i)
        if not keep:
            self.reqs, self.rows, self.past = [], [], None
            return done
        if len(keep) < len(reqs):
            self._keep(keep)
            tok_t = tok_t[torch.tensor(keep, device=self.device)]
        st = self.state
        st["mask"] = torch.cat([st["mask"], st["mask"].new_ones((len(keep), 1))], dim=1)
        st["last_pos"] = st["last_pos"] + 1
        out = _forward(
            self.model, input_ids=tok_t[:, None], attention_mask=_mask_arg(st["mask"]),
            position_ids=st["last_pos"][:, None], past_key_values=self.past, use_cache=True,
        )  # fmt: skip
        self.past, st["logits"] = out.past_key_values, out.logits[:, -1]
        return done

    def _keep(self, keep: list[int]) -> None:
        """Drop every row not in ``keep``; cut the cache columns that no remaining row attends to."""
        idx = torch.tensor(keep, device=self.device)
        self.reqs = [self.reqs[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]
        for key in ("mask", "temps", "top_ps", "last_pos"):
            self.state[key] = self.state[key][idx]
        self.past.batch_select_indices(idx)
        layers = _plain_layers(self.past)
        if layers is None:
            return
        unused = int(self.state["mask"].any(0).int().argmax())  # leading columns masked in every row
        if unused:
            self.state["mask"] = self.state["mask"][:, unused:]
            for layer in layers:
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]


def generate_batch(
    model: Any, reqs: Sequence[Any], *, pad: int, stop_ids: set[int], device: torch.device
) -> list[Row]:
    """Sample every request of ``reqs`` as one batch; returns ``(ids, logprobs, top logprobs, finish)`` each.

    Example:
        >>> generate_batch(model, [req], pad=0, stop_ids={2}, device=torch.device("cpu"))  # doctest: +SKIP
        [([5, 2], [-0.3, -0.1], [], 'stop')]
    """
    run = RunningBatch(model, pad=pad, stop_ids=stop_ids, device=device)
    run.add(reqs)
    out: dict[int, Row] = {}
    while run:
        for r, row in run.step():
            out[id(r)] = row
    return [out[id(r)] for r in reqs]
