"""The engine's batch path: requests that arrive together share one left-padded batch with a KV cache.

Rows stop independently; the batch runs until its longest row is done. Each step samples every row at once
on the model's device (:func:`trainers.serve.sampling.sample_rows`); per row only the sampled id and its
logprob (and top logprobs on request) reach the host. Every forward computes logits at the last position
only: full prompt logits are batch x length x vocabulary floats (64 prompts of 300 tokens with a 49k
vocabulary are 3.8 GB), of which sampling reads one position.

Example:
    >>> rows = generate_batch(model, reqs, pad=0, stop_ids={2}, device=torch.device("cpu"))  # doctest: +SKIP
    >>> ids, logprobs, top, finish = rows[0]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainers.serve.sampling import sample_rows

__all__ = ["generate_batch"]

Row = tuple[list[int], list[float], list[list[tuple[int, float]]], str]


def _prefill(model: Any, **inputs: Any) -> Any:
    try:
        return model(**inputs, logits_to_keep=1)
    except TypeError as exc:  # a model whose forward does not take it
        if "logits_to_keep" not in str(exc):
            raise
        return model(**inputs)


@torch.inference_mode()
def generate_batch(
    model: Any, reqs: Sequence[Any], *, pad: int, stop_ids: set[int], device: torch.device
) -> list[Row]:
    """Sample every request of ``reqs``; returns ``(ids, logprobs, top logprobs, finish reason)`` for each.

    A request has ``prompt_ids``, ``max_tokens``, ``temperature``, ``top_p``, ``top_logprobs`` and ``seed``.

    Example:
        >>> generate_batch(model, [req], pad=0, stop_ids={2}, device=torch.device("cpu"))  # doctest: +SKIP
        [([5, 2], [-0.3, -0.1], [], 'stop')]
    """
    n = len(reqs)
    width = max(len(r.prompt_ids) for r in reqs)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    mask = mask.to(device)
    temps = torch.tensor([r.temperature for r in reqs], device=device)
    top_ps = torch.tensor([r.top_p for r in reqs], device=device)
    seeds = torch.tensor([r.seed for r in reqs], dtype=torch.long, device=device)
    last_input = torch.tensor([len(r.prompt_ids) - 1 for r in reqs], dtype=torch.long, device=device)
    use_top_p, n_top = any(r.top_p < 1 for r in reqs), max(r.top_logprobs for r in reqs)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = _prefill(model, input_ids=ids.to(device), attention_mask=mask, position_ids=pos, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1]
    rows: list[Row] = [([], [], [], "length") for _ in reqs]
    active = [True] * n
    last_pos = pos[:, -1]
    for step in range(max(r.max_tokens for r in reqs)):
        tok_t, lp_t, top = sample_rows(
            logits, temps, top_ps, seeds, last_input + step, use_top_p=use_top_p, top_logprobs=n_top
        )
        toks, lps = tok_t.tolist(), lp_t.tolist()  # one id and one float per row leave the device
        tops = None if top is None else (top[0].tolist(), top[1].tolist())
        for i, r in enumerate(reqs):
            if not active[i]:
                continue
            row_ids, row_lps, row_top, _ = rows[i]
            row_ids.append(toks[i])
            row_lps.append(lps[i])
            if tops is not None and r.top_logprobs:
                row_top.append(list(zip(tops[1][i], tops[0][i], strict=True))[: r.top_logprobs])
            if toks[i] in stop_ids:
                rows[i], active[i] = (row_ids, row_lps, row_top, "stop"), False
            elif len(row_ids) >= r.max_tokens:
                active[i] = False
        if not any(active):
            break
        keep = torch.tensor(active, device=device)
        nxt = torch.where(keep, tok_t, torch.full_like(tok_t, pad))[:, None]
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long, device=device)], dim=1)
        last_pos = last_pos + 1
        out = _prefill(
            model,
            input_ids=nxt,
            attention_mask=mask,
            position_ids=last_pos[:, None],
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1]
    return rows
