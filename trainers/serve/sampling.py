"""Batched token sampling on the model's device: one call per step for all rows, seeded per request.

Both engine paths (:mod:`trainers.serve.engine`'s batch path and :mod:`trainers.serve.paged`) sample here, so
a request gets the same tokens whichever path serves it (up to float differences in the logits). Nothing of
vocabulary size leaves the device: per row, the sampled id and its logprob (and the top logprobs on request).

Randomness is counter-based: row ``i`` draws one uniform from a hash of ``(seed_i, position_i)``, where the
position is the index of the last input token, and inverts the cumulative distribution at it. A request is
therefore reproducible from its seed alone, whatever else shares its batch, and the step needs no generator
per row. Requests without a seed get a random one.

Logprobs are of ``softmax(logits / temperature)`` (the raw logits at ``temperature == 0``, which is greedy),
before the ``top_p`` cut: the distribution the trainer recomputes.

Example:
    >>> import torch
    >>> logits = torch.tensor([[0.0, 5.0, 0.0], [1.0, 1.0, 1.0]])
    >>> ids, lps, _ = sample_rows(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]),
    ...                           torch.tensor([7, 7]), torch.tensor([3, 3]))
    >>> int(ids[0]), round(float(lps[1]), 4)
    (1, -1.0986)
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["SEED_BITS", "new_seed", "sample_rows", "uniform", "uniform_host"]

#: Seeds are reduced to this many bits (two int32 halves of 31 bits travel in the paged engine's arguments).
SEED_BITS = 62
_MASK31 = (1 << 31) - 1
_MASK53 = (1 << 53) - 1
# splitmix64 / murmur3 finaliser constants, written as signed int64 (torch multiplies wrap around).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def new_seed() -> int:
    """A random seed for a request that did not send one.

    Example:
        >>> 0 <= new_seed() < 2**62
        True
    """
    return secrets.randbits(SEED_BITS)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniform(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """One float64 in ``[0, 1)`` per row from ``(seed, position)`` (int64 tensors): splitmix64 of both.

    Example:
        >>> u = uniform(torch.tensor([1, 1, 2]), torch.tensor([5, 6, 5]))
        >>> bool(((u >= 0) & (u < 1)).all()), len(set(u.tolist()))
        (True, 3)
    """
    x = seed.long() * _GOLDEN + position.long() + 1
    for _ in range(2):  # two rounds: seeds that differ in one bit give unrelated streams
        x = x * _GOLDEN
        x = (x ^ _shift(x, 30)) * _MIX1
        x = (x ^ _shift(x, 27)) * _MIX2
        x = x ^ _shift(x, 31)
    return _shift(x, 11).double() / float(1 << 53)


def uniform_host(seed: Sequence[int], position: Sequence[int]) -> torch.Tensor:
    """:func:`uniform` computed on the host with numpy (bit for bit the same floats), as a CPU tensor.

    A step of a few rows spends most of :func:`uniform`'s time launching its twenty small torch operations;
    numpy's are several times cheaper, and the batch path knows its rows' seeds and positions on the host.

    Example:
        >>> s, p = torch.tensor([1, -7, 2**62]), torch.tensor([5, 0, 9])
        >>> bool((uniform_host(s.tolist(), p.tolist()) == uniform(s, p)).all())
        True
    """
    with np.errstate(over="ignore"):
        x = np.asarray(seed, dtype=np.int64).view(np.uint64) * np.uint64(_GOLDEN % (1 << 64))
        x = x + np.asarray(position, dtype=np.int64).view(np.uint64) + np.uint64(1)
        for _ in range(2):
            x = x * np.uint64(_GOLDEN % (1 << 64))
            x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1 % (1 << 64))
            x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2 % (1 << 64))
            x = x ^ (x >> np.uint64(31))
    return torch.from_numpy((x >> np.uint64(11)).astype(np.float64) / float(1 << 53))


def _invert_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative probability exceeds ``u`` times the row's total."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    target = (u[:, None].to(cdf.dtype) * total).minimum(torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@torch.no_grad()
def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor | None,
    position: torch.Tensor | None,
    *,
    use_top_p: bool | None = None,
    top_logprobs: int = 0,
    u: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one token per row; returns ``(ids, logprobs, top)`` on the logits' device.

    Args:
        logits: ``[rows, vocabulary]`` next-token logits (any float dtype; computed in fp32).
        temperature: ``[rows]``; ``<= 0`` is greedy.
        top_p: ``[rows]`` nucleus mass (``1`` keeps everything).
        seed: ``[rows]`` int64 seeds (None when ``u`` is given).
        position: ``[rows]`` index of each row's last input token (None when ``u`` is given).
        use_top_p: whether any row has ``top_p < 1`` (skips the sort when False; None: checked).
        top_logprobs: how many top ``(logprob, id)`` pairs to return per row (0: ``top`` is None).
        u: the rows' uniforms when the caller computed them (:func:`uniform_host`); else from the seeds.

    Example:
        >>> ids, lps, top = sample_rows(torch.zeros(2, 4), torch.ones(2), torch.ones(2),
        ...                             torch.tensor([1, 2]), torch.tensor([0, 0]), top_logprobs=2)
        >>> top[0].shape
        torch.Size([2, 2])
    """
    logits = logits.float()
    temperature = temperature.to(logits.device, torch.float32)
    greedy = ~(temperature > 0)  # NaN (an unused row's stale argument) counts as greedy
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if u is None:
        if seed is None or position is None:
            raise ValueError("sample_rows needs seed and position, or u")
        u = uniform(seed.to(logits.device), position.to(logits.device))
    u = u.to(logits.device)
    top_p = top_p.to(logits.device, torch.float32)
    if use_top_p is None:
        use_top_p = bool((top_p < 1).any())
    if use_top_p:  # keep the smallest set of tokens whose mass reaches top_p (the likeliest always kept)
        sorted_p = probs.sort(dim=-1, descending=True).values
        kept = ((sorted_p.cumsum(-1) - sorted_p) < top_p[:, None]).sum(-1, keepdim=True).clamp(min=1)
        floor = sorted_p.gather(1, kept - 1).masked_fill(top_p[:, None] >= 1, 0.0)
        # The cut keeps vocabulary order, so a row with top_p = 1 samples exactly as without this branch.
        picked = _invert_cdf(probs * (probs >= floor), u)
    else:
        picked = _invert_cdf(probs, u)
    ids = torch.where(greedy, logp.argmax(dim=-1), picked)
    lps = logp.gather(1, ids[:, None]).squeeze(1)
    top = logp.topk(min(top_logprobs, logp.shape[-1]), dim=-1) if top_logprobs > 0 else None
    return ids, lps, (None if top is None else (top.values, top.indices))
