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
from trainers.settings import check_settings, context_default, curriculum_settings, setting

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
        curriculum, curriculum_start, curriculum_expand_every, curriculum_expand_by: easy-first ordering
        (the loop's keys of the same names count rounds; these count optimizer steps).

    Each field's help, check and default are its :func:`~trainers.settings.setting`'s.

    Example:
        >>> cfg = TrainerConfig(model="./tiny", group_size=4, max_length=1024)
        >>> cfg.truncation
        'truncate'
    """

    model: str = setting("", help="Policy model: a local directory or a hub id.")
    tokenizer: str | None = setting(None, help="Tokenizer location when it differs from --model.")
    chat_template: str | None = setting(
        None, help="Jinja chat template FILE, for tokenizers without one (or to override it)."
    )
    output_dir: str = setting(
        "runs/tracerl",
        help="Output directory: checkpoints, final model, metrics.jsonl, plots, config.yaml.",
        aliases=("--output",),
    )
    resume: str | None = setting(
        None,
        help="Resume training: 'latest' checkpoint in the output directory, or a checkpoint path.",
        flag={"nargs": "?", "const": "latest", "metavar": "CHECKPOINT"},
    )
    seed: int = setting(context_default("seed", "trainer"), help="Seed for grouping choices and training.")
    group_size: int = setting(
        context_default("group_size", "trainer"),
        help="GRPO group size G: episodes of one task compared with each other (default: the size the "
        "episodes were collected with, else 4).",
        check=lambda v: v >= 2,
        rule=">= 2",
    )
    max_length: int | None = setting(
        4096, help="Maximum prompt + completion tokens per sequence (0 or null: no limit)."
    )
    truncation: Literal["truncate", "skip"] = setting(
        "truncate", help="Sequences longer than max_length: 'truncate' the completion or 'skip' the episode."
    )
    per_turn: Literal["auto", "always", "never"] = setting(
        "auto",
        help="One masked sequence per episode ('never' skips episodes that are not append-only), one "
        "sequence per assistant turn ('always'), or per turn only where needed ('auto').",
    )
    group_overflow: Literal["split", "trim"] = setting(
        "split", help="Tasks with more than G episodes: 'split' into several groups, or 'trim' to G."
    )
    group_underflow: Literal["resample", "drop", "smaller"] = setting(
        context_default("group_underflow", "trainer"),
        help="Groups with 2..G-1 episodes: 'resample' with replacement up to G, 'drop', or train them as a "
        "'smaller' group (advantages over its own episodes, no episode twice; the loop's default).",
    )
    filter_zero_std: bool = setting(
        True, help="Drop groups whose rewards are all equal (they have zero advantage)."
    )
    strict: bool = setting(
        False,
        help="Refuse a store with any problem (corrupt or torn lines, damaged threads, ...) or an invalid "
        "episode, instead of counting and skipping them.",
    )
    eval_fraction: float = setting(
        context_default("eval_fraction", "trainer"),
        help="Fraction of tasks held out for evaluation (0 disables).",
        check=lambda v: 0.0 <= v < 1.0,
        rule="in [0, 1)",
    )
    eval_data: str | None = setting(
        None, help="Separate held-out episodes (Parquet file or store directory)."
    )
    eval_steps: int = setting(
        50, help="Evaluate the held-out groups every N optimizer steps (and at start/end)."
    )
    plots: bool = setting(
        True,
        help="Draw the training metrics as PNG files in output_dir (the loops draw their own and turn this "
        "off).",
    )
    curriculum: bool
    curriculum_start: float
    curriculum_expand_every: int
    curriculum_expand_by: float
    (curriculum, curriculum_start, curriculum_expand_every, curriculum_expand_by) = curriculum_settings(
        "trainer", items="groups", ranked="high mean reward first", unit="optimizer steps"
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.max_length is not None and self.max_length <= 0:
            self.max_length = None  # 0 means "no limit" (convenient on the command line)


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
