"""The trainer protocol, the shared configuration and result types, and backend-independent data preparation.

A backend (``trainers/trl/`` for TRL; the remote ones in ``trainers/remote/``) pairs a documented
``<Name>Config`` dataclass (a subclass of :class:`TrainerConfig`) with a ``<Name>Trainer`` class that
satisfies :class:`Trainer`, and imports its heavy dependencies inside ``train()``. Backends are registered
by name in ``trainers/__init__.py``; errors live in ``trainers/errors.py``.

Nothing here imports torch; transformers is imported only when a tokenizer is loaded.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from trainers.data import (
    ConvertedEpisode,
    DataReport,
    Group,
    TrainingSequence,
    build_groups,
    check_task_sizes,
    convert_episodes,
    load_episodes,
    recorded_group_size,
)
from trainers.errors import UserError

__all__ = [
    "PreparedData",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "TrainingSequence",
    "check_model",
    "load_tokenizer",
    "prepare_data",
]


@dataclass
class TrainerConfig:
    """Configuration shared by every backend: model, data preparation, grouping, evaluation, curriculum.

    Parameters that control the model and output:
        model: local directory or hub id of the policy model.
        tokenizer: tokenizer location when it differs from ``model``.
        chat_template: Jinja chat template file to use instead of the tokenizer's.
        output_dir: where checkpoints, ``metrics.jsonl``, plots and the resolved config go.
        resume: ``"latest"`` (the newest checkpoint in ``output_dir``) or a checkpoint directory.
        seed: seed for grouping choices and training.

    Parameters that control sequences and groups:
        group_size: GRPO group size G (episodes per task per update).
        max_length: maximum prompt + completion tokens of a sequence.
        truncation: what to do with longer sequences: ``"truncate"`` the completion or ``"skip"`` the episode.
        per_turn: ``"auto"``, ``"always"`` or ``"never"`` split episodes into one sequence per assistant turn.
        group_overflow / group_underflow: how tasks with more / fewer than G episodes become groups.
        filter_zero_std: drop groups whose rewards are all equal.

    Parameters that control evaluation and curriculum:
        eval_fraction / eval_data / eval_steps: held-out groups and how often they are evaluated.
        curriculum, curriculum_start, curriculum_expand_every, curriculum_expand_by: easy-first ordering.

    Example:
        >>> cfg = TrainerConfig(model="./tiny", group_size=4, max_length=1024)
        >>> cfg.truncation
        'truncate'
    """

    model: str = field(default="", metadata={"help": "Policy model: a local directory or a hub id."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer location when it differs from --model."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "Jinja chat template FILE, for tokenizers without one (or to override it)."},
    )
    output_dir: str = field(
        default="runs/tracerl",
        metadata={"help": "Output directory: checkpoints, final model, metrics.jsonl, plots, config.yaml."},
    )
    resume: str | None = field(
        default=None,
        metadata={
            "help": "Resume training: 'latest' checkpoint in the output directory, or a checkpoint path."
        },
    )
    seed: int = field(default=42, metadata={"help": "Seed for grouping choices and training."})
    group_size: int = field(
        default=4, metadata={"help": "GRPO group size G: episodes of one task compared with each other."}
    )
    max_length: int | None = field(
        default=4096,
        metadata={"help": "Maximum prompt + completion tokens per sequence (0 or null: no limit)."},
    )
    truncation: Literal["truncate", "skip"] = field(
        default="truncate",
        metadata={
            "help": "Sequences longer than max_length: 'truncate' the completion or 'skip' the episode."
        },
    )
    per_turn: Literal["auto", "always", "never"] = field(
        default="auto",
        metadata={
            "help": "One masked sequence per episode ('never' skips episodes that are not append-only), one "
            "sequence per assistant turn ('always'), or per turn only where needed ('auto')."
        },
    )
    group_overflow: Literal["split", "trim"] = field(
        default="split",
        metadata={"help": "Tasks with more than G episodes: 'split' into several groups, or 'trim' to G."},
    )
    group_underflow: Literal["resample", "drop", "smaller"] = field(
        default="resample",
        metadata={
            "help": "Groups with 2..G-1 episodes: 'resample' with replacement up to G, 'drop', or train them "
            "as a 'smaller' group (advantages over its own episodes, no episode twice; the loop's default)."
        },
    )
    filter_zero_std: bool = field(
        default=True, metadata={"help": "Drop groups whose rewards are all equal (they have zero advantage)."}
    )
    strict: bool = field(
        default=False,
        metadata={
            "help": "Refuse a store with any problem (corrupt or torn lines, damaged threads, ...) or an "
            "invalid episode, instead of counting and skipping them."
        },
    )
    eval_fraction: float = field(
        default=0.0, metadata={"help": "Fraction of tasks held out for evaluation (0 disables)."}
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "Separate held-out episodes (Parquet file or store directory)."}
    )
    eval_steps: int = field(
        default=50,
        metadata={"help": "Evaluate the held-out groups every N optimizer steps (and at start/end)."},
    )
    plots: bool = field(
        default=True,
        metadata={
            "help": "Draw the training metrics as PNG files in output_dir (the loops draw their own and "
            "turn this off)."
        },
    )
    curriculum: bool = field(
        default=False, metadata={"help": "Train on easy groups (high mean reward) first, then expand."}
    )
    curriculum_start: float = field(
        default=0.25, metadata={"help": "Fraction of groups (easiest first) available at the start."}
    )
    curriculum_expand_every: int = field(
        default=10, metadata={"help": "Add more groups every N optimizer steps."}
    )
    curriculum_expand_by: float = field(
        default=0.25, metadata={"help": "Fraction of all groups added at each expansion."}
    )

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length <= 0:
            self.max_length = None  # 0 means "no limit" (convenient on the command line)
        checks = [
            (self.group_size >= 2, f"group_size must be at least 2, got {self.group_size}"),
            (0.0 <= self.eval_fraction < 1.0, f"eval_fraction must be in [0, 1), got {self.eval_fraction}"),
            (
                0.0 < self.curriculum_start <= 1.0,
                f"curriculum_start must be in (0, 1], got {self.curriculum_start}",
            ),
            (
                0.0 < self.curriculum_expand_by <= 1.0,
                f"curriculum_expand_by must be in (0, 1], got {self.curriculum_expand_by}",
            ),
            (
                self.curriculum_expand_every >= 1,
                f"curriculum_expand_every must be at least 1, got {self.curriculum_expand_every}",
            ),
            (
                self.truncation in ("truncate", "skip"),
                f"truncation must be truncate or skip, got {self.truncation!r}",
            ),
            (
                self.per_turn in ("auto", "always", "never"),
                f"per_turn must be auto/always/never, got {self.per_turn!r}",
            ),
            (
                self.group_overflow in ("split", "trim"),
                f"group_overflow must be split or trim, got {self.group_overflow!r}",
            ),
            (
                self.group_underflow in ("resample", "drop", "smaller"),
                f"group_underflow must be resample, drop or smaller, got {self.group_underflow!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


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


@dataclass
class TrainResult:
    """What a training run produced.

    Example:
        >>> r = TrainResult(output_dir=Path("runs/x"), global_step=10)
        >>> r.global_step
        10
    """

    output_dir: Path
    checkpoint: Path | None = None
    adapter: bool = False
    metrics_path: Path | None = None
    plots: list[Path] = field(default_factory=list)
    config_path: Path | None = None
    global_step: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    report: DataReport | None = None

    def summary_lines(self) -> list[str]:
        """Human-readable final summary."""
        out = [
            f"steps: {self.global_step}",
            f"{'adapter' if self.adapter else 'model'}: {self.checkpoint}",
            f"metrics: {self.metrics_path}",
        ]
        out += [f"plot: {p}" for p in self.plots]
        out += [f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in self.metrics.items()]
        return out


@runtime_checkable
class Trainer(Protocol):
    """A training backend, registered by name in ``trainers.TRAINERS``.

    ``data`` is anything :func:`trainers.data.load_episodes` accepts (Parquet path, store directory,
    DataFrame, list of episode dicts) or a list of :class:`TrainingSequence` built with the target tokenizer.

    Example:
        >>> from trainers import get_trainer
        >>> cls = get_trainer("trl")
        >>> issubclass(cls.config_class, TrainerConfig)
        True
    """

    name: ClassVar[str]
    config_class: ClassVar[type[TrainerConfig]]

    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Load, convert and group the data without training (``--dry-run``)."""
        ...

    def train(self, data: Any, config: TrainerConfig) -> TrainResult:
        """Train and return the artifacts."""
        ...


# ------------------------------------------------------------------------------------------ model/tokenizer


def check_model(model: str) -> str:
    """Validate ``--model``: an existing local directory, or something that can only be a hub id.

    A name whose first part is a local directory (``runs/bse`` next to ``runs/``) is a path.

    Raises:
        UserError: Empty, or a path-like value that does not exist.

    Example:
        >>> check_model("Qwen/Qwen2.5-0.5B-Instruct")
        'Qwen/Qwen2.5-0.5B-Instruct'
    """
    if not model:
        raise UserError("no model given: pass --model PATH_OR_HUB_ID (or set 'model' in the config file)")
    from trainers._model_dir import check_model_dir

    check_model_dir(model)  # a directory tracerl did not finish writing (a killed `tracerl sft`)
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    # "runs/base2" where ./runs exists can only mean a local directory: a hub download would retry for a
    # minute before failing.
    path_like = (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or model.endswith("/")
        or os.sep != "/"
        and os.sep in model
        or "/" in model
        and Path(model.split("/")[0]).is_dir()
    )
    if path_like:
        raise UserError(f"model path not found: {model}")
    return model


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


# ------------------------------------------------------------------------------------------ data preparation


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
