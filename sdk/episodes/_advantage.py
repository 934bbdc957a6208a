"""GRPO's group-relative advantage, computed in one place for the viewer, the trainers and every backend."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["TRL_EPS", "group_advantages"]

#: The constant TRL adds to the standard deviation before dividing (``GRPOTrainer``, all ``scale_rewards``).
TRL_EPS = 1e-4


def group_advantages(
    rewards: Sequence[float], *, scale: bool = True, std: float | None = None, eps: float = TRL_EPS
) -> list[float]:
    """Advantage of each sample of one GRPO group: what TRL's ``GRPOTrainer`` computes.

    ``(r - mean) / (std + eps)`` with the group mean and the group's *sample* standard deviation
    (Bessel-corrected, ``ddof=1``, as TRL's ``nanstd`` with ``scale_rewards="group"``) and TRL's
    ``eps = 1e-4``. A group of one sample, or of equal rewards, has advantage 0 for every sample.

    Args:
        rewards: The group's rewards, one per sample.
        scale: Divide by the standard deviation; ``False`` only centres (TRL's ``scale_rewards="none"``).
        std: Divide by this standard deviation instead of the group's (TRL's ``scale_rewards="batch"``
            passes the whole batch's sample std).
        eps: Added to the standard deviation.

    Returns:
        One advantage per reward, in order.

    Example:
        >>> [round(a, 3) for a in group_advantages([1.0, 0.0])]
        [0.707, -0.707]
        >>> group_advantages([1.0, 0.0], scale=False), group_advantages([2.0])
        ([0.5, -0.5], [0.0])
    """
    values = [float(r) for r in rewards]
    if not values:
        return []
    mean = statistics.fmean(values)
    if not scale:
        return [r - mean for r in values]
    if std is None:
        std = statistics.stdev(values) if len(values) > 1 else 0.0
    return [(r - mean) / (std + eps) for r in values]
