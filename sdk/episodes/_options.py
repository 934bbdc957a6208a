"""How a store's sessions become episodes.

The one options record of ``build_episodes``, ``export``, ``open_episodes`` and ``python -m sdk.export``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["EpisodeOptions", "episode_options"]

_SPLIT_BY = ("agent", "model")


def _patterns(value: Iterable[str] | str) -> tuple[str, ...]:
    # One pattern given as a plain string is one pattern, not its characters.
    return (value,) if isinstance(value, str) else tuple(value)


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """How a store's sessions become episodes: selection, thread splitting, rewards and validation.

    Attributes:
        reward_fns: Post-hoc rewards: a callable ``fn(episode) -> float | {name: float} | None`` (named
            ``"reward"``), a ``"[name=]module:function"`` string, a ``{name: fn}`` mapping, or a list of
            those. A function that raises rejects that episode (``reward_fn_error``), nothing more.
        group_reward_fns: ``{name: fn(episodes_of_one_task) -> [value, ...]}``, e.g. a partial of
            ``llm_judge_reward``. Holds all episodes in memory until the store is read.
        reward_name: Which named reward is the episode ``reward``.
        models: Keep only calls whose requested or returned model matches one of these glob patterns.
        agents: Keep only calls whose agent name matches one of these glob patterns.
        splits: Keep only sessions whose metadata ``split`` is one of these (e.g. ``("train",)``).
        split_by: ``"agent"`` and/or ``"model"``: a call never continues a thread of another agent/model.
        require_reward: Treat an episode without a reward as invalid.

    Raises:
        ValueError: ``split_by`` names something other than ``"agent"`` or ``"model"``.

    Example:
        >>> opts = EpisodeOptions(splits=["train"], require_reward=False)
        >>> opts.splits, opts.require_reward
        (('train',), False)
        >>> opts.replace(models="gpt-*").models
        ('gpt-*',)
    """

    reward_fns: Any = None
    group_reward_fns: Mapping[str, Callable[..., Any]] | None = None
    reward_name: str = "reward"
    models: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    split_by: tuple[str, ...] = ()
    require_reward: bool = True

    def __post_init__(self) -> None:
        for name in ("models", "agents", "splits", "split_by"):
            object.__setattr__(self, name, _patterns(getattr(self, name)))  # frozen: set once, here
        bad = [k for k in self.split_by if k not in _SPLIT_BY]
        if bad:
            raise ValueError(f"split_by accepts 'agent' and 'model', got {bad}")

    def replace(self, **changes: Any) -> EpisodeOptions:
        """A copy with ``changes`` applied (``TypeError`` for a name that is not an option)."""
        return dataclasses.replace(self, **changes)

    @property
    def is_default(self) -> bool:
        """Whether every option is at its default (then a source that already holds episodes is fine)."""
        return self == EpisodeOptions()


def episode_options(options: EpisodeOptions | None, overrides: Mapping[str, Any]) -> EpisodeOptions:
    """``options`` (default: all defaults) with the keyword arguments a public function received.

    The one place where ``build_episodes(..., models=...)``-style keywords become an
    :class:`EpisodeOptions`; an unknown keyword raises ``TypeError`` naming it.

    Example:
        >>> episode_options(None, {"splits": ["train"]}).splits
        ('train',)
    """
    base = options if options is not None else EpisodeOptions()
    if not isinstance(base, EpisodeOptions):
        raise TypeError(f"options must be an EpisodeOptions, got {type(base).__name__}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(EpisodeOptions)})
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    return base.replace(**overrides) if overrides else base
