"""The replay sampler (TRL's repeat blocks, reseeded per epoch) and the easy-first curriculum."""

from __future__ import annotations

import math
from typing import Any

from trainers.trl.config import TRLGRPOConfig

__all__ = ["replay_sampler"]


class _Curriculum:
    """Easy-first schedule: units sorted by group mean reward (descending), a growing prefix is sampled."""

    def __init__(self, order: list[int], start: float, expand_every: int, expand_by: float, seed: int):
        self.order, self.start, self.every, self.by, self.seed = order, start, expand_every, expand_by, seed
        self.step = 0  # updated by a callback at every optimizer step

    def available(self, step: int | None = None) -> int:
        s = self.step if step is None else step
        frac = min(1.0, self.start + self.by * (s // max(1, self.every)))
        return max(1, min(len(self.order), math.ceil(frac * len(self.order))))


def replay_sampler(
    num_rows: int,
    *,
    mini_repeat_count: int,
    batch_size: int,
    repeat_count: int,
    shuffle: bool = True,
    seed: int = 0,
    curriculum: _Curriculum | None = None,
) -> Any:
    """TRL's ``RepeatSampler`` block structure, reseeded per epoch (exact resume), optionally easy-first.

    Rows are drawn in chunks of ``batch_size`` (rows per generation batch); each row is repeated
    ``mini_repeat_count`` (G) times in a contiguous block and each chunk ``repeat_count`` times. Unlike TRL's
    sampler, the permutation depends only on ``(seed, epoch)`` (``set_epoch`` is called by the Trainer), so a
    resumed run replays exactly the batches an uninterrupted run would have. With a curriculum, each chunk is
    drawn from the currently unlocked easiest rows (read when the batch is drawn; the dataloader may prefetch
    one batch ahead).

    Example:
        >>> s = replay_sampler(3, mini_repeat_count=2, batch_size=1, repeat_count=1, shuffle=False)
        >>> list(s)
        [0, 0, 1, 1, 2, 2]
    """
    import random

    from torch.utils.data import Sampler

    class ReplayRepeatSampler(Sampler):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def _chunks(self) -> Any:
            rng = random.Random(seed * 1_000_003 + self.epoch)
            n = num_rows // batch_size
            if curriculum is None:
                rows = list(range(num_rows))
                if shuffle:
                    rng.shuffle(rows)
                yield from (rows[i * batch_size : (i + 1) * batch_size] for i in range(n))
                return
            for _ in range(n):
                yield rng.sample(curriculum.order[: max(batch_size, curriculum.available())], batch_size)

        def __iter__(self) -> Any:
            for chunk in self._chunks():
                for _ in range(repeat_count):
                    for index in chunk:
                        for _ in range(mini_repeat_count):
                            yield index

        def __len__(self) -> int:
            return (num_rows // batch_size) * batch_size * mini_repeat_count * repeat_count

    return ReplayRepeatSampler()


def _make_curriculum(units: list[Any], config: TRLGRPOConfig) -> _Curriculum | None:
    """The easy-first schedule over ``units`` (highest group mean reward first), or ``None`` when off."""
    if not config.curriculum:
        return None
    order = sorted(range(len(units)), key=lambda i: (-units[i].group.mean_reward, units[i].group.group_id))
    return _Curriculum(
        order,
        config.curriculum_start,
        config.curriculum_expand_every,
        config.curriculum_expand_by,
        config.seed,
    )


def _curriculum_logger(curriculum: _Curriculum) -> Any:
    from transformers import TrainerCallback

    class CurriculumLogger(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            if logs is not None:
                logs["curriculum/groups_available"] = curriculum.available(state.global_step)

    return CurriculumLogger()
