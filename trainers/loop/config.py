"""The loop's settings (:class:`LoopConfig`, the keys of its YAML file) and the checks made before loading.

Example:
    >>> from trainers.loop import LoopConfig
    >>> LoopConfig(agent="a:f", tasks="t.jsonl", model="m").mode
    'sync'
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import re
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.checks import check_field_types, check_loop_model

__all__ = ["LoopConfig", "check_before_loading", "loop_keys", "planned_steps", "read_yaml", "train_settings"]


@dataclasses.dataclass
class LoopConfig:
    """Settings of :func:`run_loop` (the keys of the YAML file).

    Attributes:
        agent: Agent entry point ``module:function`` (takes a task dict; see ``sdk.rollout``).
        tasks: Training task file (JSONL, Parquet, a saved ``datasets`` directory, ``hf:NAME[:SPLIT]``).
        model: Starting checkpoint (full weights: a directory with model + tokenizer).
        out: Output directory.
        eval_tasks: Validation task file (optional).
        reward_fn: ``module:function(task, answer) -> float | dict`` (optional if the agent calls
            ``sdk.reward``).
        rounds: Training rounds.
        tasks_per_round: Training tasks per round.
        group_size: Samples per task (the GRPO group size G).
        concurrency: Samples at once.
        timeout: Seconds per sample.
        success_threshold: Reward counted as a success.
        malformed_tool_call_penalty: Subtracted from the reward of a training sample whose calls include a
            malformed tool call (the model opened a ``<tool_call>`` the server could not parse, so the agent
            took it as its answer): RL then learns the call format as well as the decision. 0 (the
            default) leaves rewards as the reward function gives them; e.g. 0.5 with 0/1 rewards. Success
            and validation are not shaped; the sample's stored rewards show the penalty by name.
        eval_every: Validate every N rounds (and before the first round).
        eval_samples: Samples per validation task.
        eval_subset: Validate on this many held-out tasks during the run (a fixed subset, drawn once with
            ``seed``), the first and the last validation on all of them; the table marks the subset's
            rows. Null: every validation on all of them.
        curriculum: ``{start, widen_every, widen_by}`` or null.
        policy: ``policy:`` section for :func:`trainers.serve.policy.make_policy`.
        train: ``python -m sdk.train`` settings (the keys of its ``--config`` file; ``data``, ``model``
            and ``output_dir`` are set by the loop). ``micro_batch_size`` defaults to 2 here (1 for an odd
            ``group_size``; unset with ``grpo.generation_batch_size``): the same gradient in passes of 2
            sequences, a fraction of the memory.
        seed: Seed for training.
        id_field: Task id field.
        plot: Write ``progress.png``.
        mode: ``sync`` (rounds, :mod:`trainers.loop.lockstep`) or ``async`` (:mod:`trainers.loop.continuous`:
            collection and training overlap; ``eval_every`` then counts versions).
        max_staleness: async: largest ``current version - oldest turn version`` of a trained group.
        sync_every: async: batches of groups per published version (``num_train_epochs`` passes each).
        reward_wait_s: async: seconds a finished sample may wait for a late reward.
        max_versions: async: stop after this many versions (default: ``rounds``).
        max_steps: async: stop after this many optimizer steps.
        max_samples: async: the collector's sample budget (training samples); the run ends when they
            are all trained or dropped.
        tis_cap: async: truncated importance sampling cap (``train.tis_cap`` overrides it).
        checkpoint_every: Write a recovery checkpoint (weights, optimizer, scheduler, RNG; async: the
            stream's cursor) every N rounds (default 1) or async versions (default 10), and at the end.
            Between checkpoints weights reach the policy server as tensors, not through the disk.

    Example:
        >>> LoopConfig(agent="a:f", tasks="t.jsonl", model="m").group_size
        8
    """

    agent: str
    tasks: str
    model: str
    out: str = "runs/loop"
    eval_tasks: str | None = None
    reward_fn: str | None = None
    rounds: int = 4
    tasks_per_round: int = 32
    group_size: int = 8
    concurrency: int = 16
    timeout: float | None = None
    success_threshold: float = 1.0
    malformed_tool_call_penalty: float = 0.0
    eval_every: int = 1
    eval_samples: int = 1
    eval_subset: int | None = None
    curriculum: dict[str, Any] | None = None
    policy: dict[str, Any] = dataclasses.field(default_factory=dict)
    train: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    id_field: str = "id"
    plot: bool = True
    mode: str = "sync"
    max_staleness: int = 2
    sync_every: int = 1
    reward_wait_s: float = 0.0
    max_versions: int | None = None
    max_steps: int | None = None
    max_samples: int | None = None
    tis_cap: float = 2.0
    checkpoint_every: int | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        checks = [
            (self.rounds >= 0, "rounds must be >= 0"),
            (self.concurrency >= 1, "concurrency must be >= 1"),
            (self.timeout is None or self.timeout > 0, "timeout must be > 0 seconds (or null: no limit)"),
            (math.isfinite(self.success_threshold), "success_threshold must be a finite number"),
            (
                math.isfinite(self.malformed_tool_call_penalty) and self.malformed_tool_call_penalty >= 0,
                "malformed_tool_call_penalty must be a finite number >= 0 (0: rewards as given)",
            ),
            (self.tasks_per_round >= 1, "tasks_per_round must be >= 1"),
            (self.group_size >= 2, "group_size must be >= 2 (a GRPO group compares samples of one task)"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.eval_samples >= 1, "eval_samples must be >= 1"),
            (self.eval_subset is None or self.eval_subset >= 1, "eval_subset must be >= 1 (or null: all)"),
            (isinstance(self.train, dict), "train must be a mapping of sdk.train settings"),
            (isinstance(self.policy, dict), "policy must be a mapping"),
            (self.mode in ("sync", "async"), f"mode must be 'sync' or 'async', got {self.mode!r}"),
            *_async_checks(self),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        for key in ("data", "model", "output_dir", "output"):
            if key in self.train:
                raise UserError(f"train.{key} is set by the loop; remove it from the train section")
        if self.train.get("group_underflow", "smaller") not in ("smaller", "drop"):
            raise UserError(
                "train.group_underflow must be smaller (the default) or drop in the loop: a group short of "
                "samples is trained as it is or dropped and counted, never filled with one sample twice"
            )
        # The loop serves each round's weights from this machine: a backend must leave them in final/.
        backend = str(self.train.get("backend") or "trl")
        if backend in ("openai", "tinker") or self.train.get("download") == "metrics":
            raise UserError(
                f"train.backend {backend!r} leaves no weights on this machine to serve; the loop trains with "
                "'trl' or 'ray' (download: final)"
            )
        if self.curriculum is not None:
            c = {"start": 0.5, "widen_every": 1, "widen_by": 0.25, **self.curriculum}
            unknown = set(c) - {"start", "widen_every", "widen_by"}
            if unknown:
                raise UserError(f"unknown curriculum key(s): {', '.join(sorted(unknown))}")
            if not (
                0 < float(c["start"]) <= 1 and 0 < float(c["widen_by"]) <= 1 and int(c["widen_every"]) >= 1
            ):
                raise UserError("curriculum needs 0 < start <= 1, 0 < widen_by <= 1, widen_every >= 1")
            self.curriculum = c

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> LoopConfig:
        """Build from a mapping, rejecting unknown keys with one clear error.

        Example:
            >>> LoopConfig.from_mapping({"agent": "a:f", "tasks": "t", "model": "m"}).rounds
            4
        """
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            hints = [
                f"{key} (did you mean {close[0]}?)"
                if (close := difflib.get_close_matches(key, names, 1))
                else key
                for key in unknown
            ]
            raise UserError(
                f"unknown loop setting(s): {', '.join(hints)} (tracerl train --loop --help lists them)"
            )
        missing = [k for k in ("agent", "tasks", "model") if not data.get(k)]
        if missing:
            raise UserError(f"the loop config needs {', '.join(missing)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise UserError(f"invalid loop settings: {exc}") from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> LoopConfig:
        """Read a YAML config file.

        Example:
            >>> LoopConfig.from_yaml("examples/arithmetic/loop.yaml").group_size  # doctest: +SKIP
            8
        """
        return cls.from_mapping(read_yaml(path))


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A loop YAML file as a mapping (one :class:`UserError` line when it is missing or not a mapping).

    Example:
        >>> read_yaml("examples/arithmetic/loop.yaml")["agent"]  # doctest: +SKIP
        'examples.arithmetic.agent:solve'
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"cannot parse {p}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{p} must hold a mapping of loop settings")
    return data


def check_before_loading(cfg: LoopConfig) -> None:
    """Everything a run needs that can be checked without loading a model or running a rollout.

    The model path, the ``policy`` section, the agent and reward function imports, and the trainer's
    settings (its config fields and, for TRL, every ``train.grpo`` key against ``trl.GRPOConfig``): a typo
    costs one line, not a round of rollouts.

    Raises:
        UserError: The first problem, in one line.

    Example:
        >>> check_before_loading(LoopConfig(agent="json:dumps", tasks="t.jsonl", model="./no-such-model"))
        Traceback (most recent call last):
        trainers.errors.UserError: model path not found: ./no-such-model
    """
    from sdk.rollout import RolloutError, load_function
    from sdk.rollout._tasks import check_call
    from trainers._model_dir import check_model
    from trainers.serve.policy import make_policy
    from trainers.settings import make_config

    check_loop_model(check_model(cfg.model))
    make_policy(cfg.policy, cfg.model)  # the policy section's keys (builds the server object; starts nothing)
    try:
        # Imported and called as the rollout calls them: a wrong signature would fail every sample.
        check_call(load_function(cfg.agent, "agent"), 1, "agent", f"{cfg.agent}(task)")
        if cfg.reward_fn:
            check_call(
                load_function(cfg.reward_fn, "reward_fn"), 2, "reward_fn", f"{cfg.reward_fn}(task, answer)"
            )
    except RolloutError as exc:
        raise UserError(str(exc)) from None
    settings = train_settings(cfg, cfg.model, Path(cfg.out) / "train" / "round-1")
    _, config, _ = make_config(settings, source="the loop's train section")
    # GRPOConfig keys, also for a remote backend's TRL when trl is installed here (else its job checks them).
    if isinstance(getattr(config, "grpo", None), dict) and importlib.util.find_spec("trl") is not None:
        from trainers.trl import check_grpo_keys

        check_grpo_keys(config)  # type: ignore[arg-type]


def _async_checks(cfg: LoopConfig) -> list[tuple[bool, str]]:
    """The settings of ``mode: async`` (checked in every mode: a typo fails before anything loads)."""
    return [
        (
            isinstance(cfg.max_staleness, int) and cfg.max_staleness >= 0,
            "max_staleness must be an integer >= 0",
        ),
        (isinstance(cfg.sync_every, int) and cfg.sync_every >= 1, "sync_every must be an integer >= 1"),
        (
            isinstance(cfg.reward_wait_s, (int, float)) and cfg.reward_wait_s >= 0,
            "reward_wait_s must be >= 0",
        ),
        (cfg.max_versions is None or cfg.max_versions >= 1, "max_versions must be >= 1"),
        (cfg.max_steps is None or cfg.max_steps >= 1, "max_steps must be >= 1"),
        (cfg.max_samples is None or cfg.max_samples >= 1, "max_samples must be >= 1"),
        (cfg.checkpoint_every is None or cfg.checkpoint_every >= 1, "checkpoint_every must be >= 1"),
        (isinstance(cfg.tis_cap, (int, float)) and cfg.tis_cap > 0, "tis_cap must be > 0"),
        (cfg.mode != "async" or cfg.curriculum is None, "curriculum is not supported with mode: async"),
        (
            cfg.mode != "async" or str(cfg.train.get("backend") or "trl") == "trl",
            "mode: async trains with the resident trl trainer: leave train.backend unset (trl)",
        ),
    ]


def train_settings(cfg: LoopConfig, model: str, out: Path) -> dict[str, Any]:
    """The trainer settings of the loop: the ``train`` section plus what the loop sets.

    Example:
        >>> train_settings(LoopConfig(agent="a:f", tasks="t", model="m"), "m", Path("o"))["group_size"]
        8
    """
    settings = dict(cfg.train)
    settings.setdefault("group_size", cfg.group_size)
    settings.setdefault("seed", cfg.seed)
    # A group that lost a sample (no reward, killed) trains as it is: never a sample twice to fill it.
    settings.setdefault("group_underflow", "smaller")
    if cfg.mode == "async":
        settings.setdefault("tis_cap", cfg.tis_cap)
        settings.setdefault("plots", False)  # the loop draws progress.png itself
    settings.update(model=model, output_dir=str(out))
    grpo_keys = settings.get("grpo") or {}
    if "micro_batch_size" not in settings and "generation_batch_size" not in grpo_keys:
        # Passes of 2 sequences, the gradient of the whole batch: the README's step-5 loop on SmolLM2-135M
        # peaked at 12.2 GB in passes of 8, examples/smollm2_agent (passes of 2) stays under 5.5 GB (issue
        # 50). Batches hold whole groups, so an even G divides them by 2; an odd G may not: passes of 1.
        settings["micro_batch_size"] = 2 if cfg.group_size % 2 == 0 else 1
    if str(settings.get("backend") or "trl") == "trl":
        grpo = dict(settings.get("grpo") or {})
        grpo.setdefault("disable_tqdm", True)  # the loop prints one row per round, not TRL's steps
        settings["grpo"] = grpo
    return settings


def planned_steps(cfg: LoopConfig) -> int:
    """The optimizer steps a whole run takes if every group carries signal (the learning rate's schedule).

    Example:
        >>> planned_steps(LoopConfig(agent="a:f", tasks="t", model="m", rounds=2, tasks_per_round=4))
        8
    """
    grpo = cfg.train.get("grpo") or {}
    batch = grpo.get("per_device_train_batch_size")
    per_step = max(1, batch // cfg.group_size) if isinstance(batch, int) and batch >= cfg.group_size else 1
    passes = max(1, int(grpo.get("num_train_epochs") or 1))
    if cfg.mode != "async":
        return max(1, cfg.rounds * passes * math.ceil(cfg.tasks_per_round / per_step))
    if cfg.max_steps is not None:
        return int(cfg.max_steps)
    versions = cfg.max_versions or cfg.rounds
    if cfg.max_samples is not None:
        versions = max(1, cfg.max_samples // (cfg.group_size * per_step * cfg.sync_every))
    return max(1, versions * passes * cfg.sync_every)


def loop_keys() -> str:
    """Every key of the loop's YAML file with its default and meaning, from :class:`LoopConfig`.

    Example:
        >>> print(loop_keys().splitlines()[9][:57])
          group_size                     8  Samples per task (the
    """
    meaning: dict[str, str] = {}
    name = None
    doc = LoopConfig.__doc__ or ""
    for line in doc.split("Attributes:", 1)[1].split("Example:", 1)[0].splitlines():
        head, sep, text = line.strip().partition(": ")
        if line.startswith(" " * 8) and not line.startswith(" " * 12) and sep:
            name = head
            meaning[name] = text.strip()
        elif name and line.strip():
            meaning[name] += " " + line.strip()
    rows = ["loop keys (YAML), with their defaults:"]
    for f in dataclasses.fields(LoopConfig):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        text = re.sub(r":\w+:`~?([^`]+)`", r"\1", meaning.get(f.name, "")).replace("``", "")
        rows.append(f"  {f.name:<20}  {default:>10}  {text}")
    return "\n".join(rows)
