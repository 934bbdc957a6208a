"""The backend types: the trainer protocol, the configuration every backend shares, and the result type.

A backend (``trainers/trl/`` for TRL; the remote ones in ``trainers/remote/``) pairs a documented
``<Name>Config`` dataclass (a subclass of :class:`TrainerConfig`) with a ``<Name>Trainer`` class that
satisfies :class:`Trainer`, and imports its heavy dependencies inside ``train()``. Backends are registered
by name in ``trainers/__init__.py``; errors live in ``trainers/errors.py``; preparing the data every backend
trains on (:func:`trainers.data.prepare_data`) lives in ``trainers/data``.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from trainers.data import DataReport, PreparedData
from trainers.errors import UserError

__all__ = ["TrainResult", "Trainer", "TrainerConfig"]


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
    DataFrame, list of episode dicts) or a list of :class:`~trainers.data.TrainingSequence` built with the
    target tokenizer.

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
