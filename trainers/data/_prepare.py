"""Preparing training data: episodes (or built sequences) → converted, grouped by task, eval groups split off.

:func:`prepare_data` is what every backend calls (the TRL trainer, Tinker, Ray); :func:`load_tokenizer` loads
the *target* tokenizer the episodes are rendered with (transformers is imported there only).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainers._model_dir import check_model
from trainers.data._groups import build_groups
from trainers.data._load import check_task_sizes, load_episodes, recorded_group_size
from trainers.data._report import DataReport
from trainers.data._screen import convert_episodes
from trainers.data._sequence import ConvertedEpisode, Group, TrainingSequence
from trainers.errors import UserError

if TYPE_CHECKING:  # the backend config is read here, never built: trainers.data stays below the backends
    from trainers.base import TrainerConfig

__all__ = ["PreparedData", "load_tokenizer", "prepare_data"]


@dataclass
class PreparedData:
    """Episodes converted and grouped for training, plus the report of what happened to them.

    Example:
        >>> PreparedData(groups=[], eval_groups=[], report=DataReport()).num_sequences
        0
    """

    groups: list[Group]
    eval_groups: list[Group]
    report: DataReport
    tokenizer: Any = None

    @property
    def num_sequences(self) -> int:
        """Number of training sequences over all groups (duplicates from resampling included)."""
        return sum(len(g.sequences) for g in self.groups)

    def stats(self) -> dict[str, Any]:
        """Length and faithfulness statistics of the training sequences.

        Example:
            >>> PreparedData(groups=[], eval_groups=[], report=DataReport()).stats()["sequences"]
            0
        """
        sequences = [s for g in self.groups for s in g.sequences]

        def summary(xs: list[int]) -> dict[str, float]:
            if not xs:
                return {"min": 0, "mean": 0.0, "max": 0}
            return {"min": min(xs), "mean": round(statistics.fmean(xs), 1), "max": max(xs)}

        return {
            "groups": len(self.groups),
            "eval_groups": len(self.eval_groups),
            "sequences": len(sequences),
            "prompt_tokens": summary([len(s.prompt_ids) for s in sequences]),
            "completion_tokens": summary([len(s.completion_ids) for s in sequences]),
            "trained_tokens": summary([s.num_trained_tokens for s in sequences]),
            "sequences_with_behaviour_logprobs": sum(s.logprobs is not None for s in sequences),
            "truncated_sequences": sum(s.truncated for s in sequences),
        }

    def group_rows(self) -> list[dict[str, Any]]:
        """One summary row per group (for ``--dry-run``)."""
        rows = []
        for split, groups in (("train", self.groups), ("eval", self.eval_groups)):
            for g in groups:
                rows.append(
                    {
                        "group": g.group_id,
                        "split": split,
                        "episodes": len(g.episodes),
                        "unique": len({e.episode_id for e in g.episodes}),
                        "sequences": len(g.sequences),
                        "mean_reward": round(g.mean_reward, 4),
                        "reward_std": round(g.reward_std, 4),
                        "per_turn": g.per_turn,
                        "faithful": sum(e.faithful for e in g.episodes),
                        "trained_tokens": sum(s.num_trained_tokens for s in g.sequences),
                    }
                )
        return rows


def load_tokenizer(config: TrainerConfig) -> Any:
    """Load the target tokenizer and make sure it has a chat template.

    Raises:
        UserError: The model/tokenizer cannot be found or loaded, or it has no chat template.

    Example:
        >>> tok = load_tokenizer(TrainerConfig(model="./tiny"))  # doctest: +SKIP
    """
    source = check_model(config.tokenizer or config.model)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is in the train extra
        raise UserError("training needs transformers: pip install 'tracerl[train]'") from exc
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot load tokenizer from {source!r}: {first}") from exc
    if config.chat_template:
        path = Path(config.chat_template).expanduser()
        if not path.is_file():
            raise UserError(f"chat template file not found: {path}")
        tok.chat_template = path.read_text()
    if not getattr(tok, "chat_template", None):
        raise UserError(
            f"tokenizer {source!r} has no chat template; set tokenizer.chat_template (and save it) or pass "
            "--chat-template FILE (a Jinja template, e.g. TRL's trl/chat_templates/qwen2_5.jinja)"
        )
    if tok.pad_token_id is None:
        # TRL pads completions with pad_token_id; EOS is the conventional stand-in.
        tok.pad_token = tok.eos_token
    return tok


def _episodes_from_sequences(sequences: Sequence[TrainingSequence]) -> list[ConvertedEpisode]:
    by_episode: dict[tuple[str, str], ConvertedEpisode] = {}
    for s in sequences:
        key = (s.group_id, s.episode_id)
        ep = by_episode.get(key)
        if ep is None:
            ep = by_episode[key] = ConvertedEpisode(s.episode_id, s.group_id, s.reward)
            ep.faithful = True
        ep.sequences.append(s)
        ep.per_turn |= s.turn is not None
        ep.faithful &= s.logprobs is not None
    return list(by_episode.values())


def _split_eval(
    converted: list[ConvertedEpisode], fraction: float, seed: int
) -> tuple[list[ConvertedEpisode], list[ConvertedEpisode]]:
    if fraction <= 0:
        return converted, []
    if fraction >= 1:
        raise UserError(f"eval_fraction must be below 1, got {fraction}")
    import random

    counts: dict[str, int] = {}
    for ep in converted:
        counts[ep.task_id or ""] = counts.get(ep.task_id or "", 0) + 1
    tasks = sorted(t for t, n in counts.items() if n >= 2)
    n_eval = min(max(1, round(fraction * len(tasks))), len(tasks) - 1)
    if n_eval <= 0:
        return converted, []
    held = set(random.Random(seed).sample(tasks, n_eval))
    return [e for e in converted if e.task_id not in held], [e for e in converted if e.task_id in held]


def prepare_data(
    data: Any, config: TrainerConfig, *, tokenizer: Any = None, max_completion_length: int | None = None
) -> PreparedData:
    """Load episodes, convert them with the target tokenizer, group them by task and split off eval groups.

    Args:
        data: Parquet file, directory, store, DataFrame, episode dicts, or built :class:`TrainingSequence` s.
        config: Backend configuration.
        tokenizer: Use this tokenizer instead of loading one from the config.
        max_completion_length: Also cut completions to this many tokens.

    Returns:
        A :class:`PreparedData`.

    Raises:
        UserError: No usable task group, no chat template, missing model path, unreadable data, all episodes
            too long, every group without reward spread.

    Example:
        >>> prepared = prepare_data("episodes.parquet", TrainerConfig(model="./tiny"))  # doctest: +SKIP
        >>> [g.group_id for g in prepared.groups]  # doctest: +SKIP
        ['task-0', 'task-1']
    """
    converted, report, tok = _convert(data, config, tokenizer, max_completion_length)
    train_eps, eval_eps = _split_eval(converted, config.eval_fraction, config.seed)
    groups, report = build_groups(
        train_eps,
        config.group_size,
        overflow=config.group_overflow,
        underflow=config.group_underflow,
        filter_zero_std=config.filter_zero_std,
        seed=config.seed,
        report=report,
    )
    eval_groups = _eval_groups(eval_eps, config, tok)
    report.eval_groups = len(eval_groups)
    if not groups:
        raise _no_group_error(report, converted)
    return PreparedData(groups=groups, eval_groups=eval_groups, report=report, tokenizer=tok)


def _convert(
    data: Any, config: TrainerConfig, tokenizer: Any, max_completion_length: int | None
) -> tuple[list[ConvertedEpisode], DataReport, Any]:
    """Episodes (or built training sequences) → converted episodes, their report, and the tokenizer."""
    report = DataReport()
    if isinstance(data, Sequence) and bool(data) and isinstance(data[0], TrainingSequence):
        converted = _episodes_from_sequences(data)
        report.episodes = len(converted)
        report.sequences = len(data)
        check_task_sizes([{"task_id": e.task_id, "reward": e.reward} for e in converted])
        return converted, report, tokenizer
    if tokenizer is None:
        check_model(config.tokenizer or config.model)  # fail on a bad path before reading any data
    episodes = load_episodes(data, report=report, strict=config.strict)
    check_task_sizes(episodes)
    _group_size_of_data(episodes, config, report)
    tok = tokenizer if tokenizer is not None else load_tokenizer(config)
    max_length = config.max_length or None
    converted, report = convert_episodes(
        episodes,
        tok,
        max_length=max_length,
        max_completion_length=max_completion_length,
        truncation=config.truncation,
        per_turn=config.per_turn,
        report=report,
    )
    if not converted and report.skipped_too_long:
        raise UserError(
            f"all {report.skipped_too_long} usable episodes are longer than max_length={max_length} "
            "tokens; raise --max-length or use --truncation truncate"
        )
    return converted, report, tok


def _group_size_of_data(episodes: list[dict[str, Any]], config: TrainerConfig, report: DataReport) -> None:
    """Group as the episodes were collected when the user set no group size; else say when they differ."""
    recorded = recorded_group_size(episodes)
    from_data = getattr(
        config, "group_size_from_data", False
    )  # set by the CLI when no --group-size was given
    if recorded is None and from_data:
        report.notes.append(
            f"group size {config.group_size}: the default (the episodes do not record how many samples per "
            "task were collected; --group-size G to set it)"
        )
    if recorded is None or recorded == config.group_size or recorded < 2:
        return
    if from_data:
        config.group_size = recorded
        report.notes.append(f"group size {recorded}: as the episodes were collected (--group-size to change)")
    else:
        report.notes.append(
            f"note: the episodes were collected with group size {recorded}, this run uses "
            f"{config.group_size} (--group-size {recorded} to match)"
        )


def _eval_groups(eval_eps: list[ConvertedEpisode], config: TrainerConfig, tok: Any) -> list[Group]:
    """Held-out groups: from ``eval_data`` when given, else from the episodes split off for evaluation."""
    if config.eval_data:
        eval_rows = load_episodes(config.eval_data)
        eval_eps, _ = convert_episodes(
            eval_rows,
            tok,
            max_length=config.max_length or None,
            truncation="truncate",
            per_turn=config.per_turn,
        )
    if not eval_eps:
        return []
    # Held-out groups keep all episodes and equal-reward groups: log-probs are measured on all of them.
    eval_groups, _ = build_groups(
        eval_eps,
        config.group_size,
        overflow="split",
        underflow="resample",
        filter_zero_std=False,
        seed=config.seed,
    )
    return eval_groups


def _no_group_error(report: DataReport, converted: list[ConvertedEpisode]) -> UserError:
    """Why no training group is left, in one line."""
    if report.groups_zero_std_filtered:
        return UserError(
            f"all {report.groups_zero_std_filtered} groups have equal rewards within the group, so GRPO "
            "has no signal; record rewards that differ between attempts, or set filter_zero_std: false"
        )
    if not converted:
        return UserError(
            f"no episode could be converted to a training sequence ({'; '.join(report.lines())})"
        )
    return UserError(f"no training group left after grouping ({'; '.join(report.lines())})")
