"""The loop's settings (:class:`LoopConfig`, the keys of its YAML file) and the checks made before loading.

Example:
    >>> from trainers.loop import LoopConfig
    >>> LoopConfig(agent="a:f", tasks="t.jsonl", model="m").mode
    'sync'
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from pathlib import Path
from typing import Any, Literal

from trainers.errors import UserError
from trainers.settings import (
    PolicySpec,
    check_settings,
    context_default,
    curriculum_settings,
    from_mapping,
    setting,
    settings_table,
)
from trainers.settings import read_yaml as _read_yaml

__all__ = ["LoopConfig", "check_before_loading", "loop_keys", "planned_steps", "read_yaml", "train_settings"]


def _at_least(n: int) -> dict[str, Any]:
    return {"check": lambda v: v >= n, "rule": f">= {n}"}


@dataclasses.dataclass
class LoopConfig:
    """Settings of :func:`run_loop` (the keys of the YAML file): each field's help is its metadata's.

    Example:
        >>> LoopConfig(agent="a:f", tasks="t.jsonl", model="m").group_size
        8
    """

    agent: str = setting(help="Agent entry point module:function (takes a task dict; see sdk.rollout).")
    tasks: str = setting(
        help="Training task file (JSONL, Parquet, a saved datasets directory, hf:NAME[:SPLIT])."
    )
    model: str = setting(help="Starting checkpoint (full weights: a directory with model + tokenizer).")
    out: str = setting("runs/loop", help="Output directory.")
    eval_tasks: str | None = setting(None, help="Validation task file (optional).")
    reward_fn: str | None = setting(
        None, help="module:function(task, answer) -> float | dict (optional if the agent calls sdk.reward)."
    )
    rounds: int = setting(4, help="Training rounds.", **_at_least(0))
    tasks_per_round: int = setting(
        32,
        help="Training tasks per round; without a curriculum, round N takes the next ones in the file's "
        "order (wrapping around), so shuffle the file and do not put the tasks you demonstrated first.",
        **_at_least(1),
    )
    group_size: int = setting(
        context_default("group_size", "loop"),
        help="Samples per task (the GRPO group size G).",
        check=lambda v: v >= 2,
        rule=">= 2 (a GRPO group compares samples of one task)",
    )
    concurrency: int = setting(
        context_default("concurrency", "loop"), help="Samples at once.", **_at_least(1)
    )
    timeout: float | None = setting(
        None, help="Seconds per sample (null: no limit).", check=lambda v: v > 0, rule="> 0 seconds"
    )
    success_threshold: float = setting(
        1.0, help="Reward counted as a success.", check=math.isfinite, rule="a finite number"
    )
    malformed_tool_call_penalty: float = setting(
        0.0,
        help="Subtracted from the reward of a training sample whose calls include a malformed tool call (the "
        "model opened a <tool_call> the server could not parse, so the agent took it as its answer): RL then "
        "learns the call format as well as the decision. 0 leaves rewards as the reward function gives "
        "them; e.g. 0.5 with 0/1 rewards. Success and validation are not shaped; the sample's stored rewards "
        "show the penalty by name.",
        check=lambda v: math.isfinite(v) and v >= 0,
        rule="a finite number >= 0 (0: rewards as given)",
    )
    eval_every: int = setting(
        1, help="Validate every N rounds (and before the first round; async: versions).", **_at_least(1)
    )
    eval_samples: int = setting(1, help="Samples per validation task.", **_at_least(1))
    eval_subset: int | None = setting(
        None,
        help="Validate on this many held-out tasks during the run (a fixed subset, drawn once with seed), "
        "the first and the last validation on all of them; the table marks the subset's rows. Null: every "
        "validation on all of them.",
        check=lambda v: v >= 1,
        rule=">= 1 (or null: all)",
    )
    curriculum: bool
    curriculum_start: float
    curriculum_expand_every: int
    curriculum_expand_by: float
    (curriculum, curriculum_start, curriculum_expand_every, curriculum_expand_by) = curriculum_settings(
        "loop",
        items="training tasks",
        ranked="ranked by their mean reward in earlier rounds; tasks not tried yet rank with the average",
        unit="rounds",
    )
    policy: PolicySpec = setting(
        factory=PolicySpec,
        help="The policy server agents call (its keys are listed below; trainers.serve.policy.make_policy).",
    )
    train: dict[str, Any] = setting(
        factory=dict,
        help="tracerl train settings (the keys of its --config file; data, model and output_dir are set by "
        "the loop). micro_batch_size defaults to 1 here, with padding_free (unset with "
        "grpo.generation_batch_size): the same gradient in passes of one sequence, a fraction of the memory "
        "and faster on a CPU; raise it on a GPU.",
    )
    seed: int = setting(
        context_default("seed", "loop"),
        help="Seed for the eval_subset draw and training (training tasks are taken in file order).",
    )
    id_field: str = setting("id", help="Task id field.")
    plot: bool = setting(True, help="Write progress.png.")
    mode: Literal["sync", "async"] = setting(
        "sync",
        help="sync (rounds: collection pauses while a version trains) or async (collection and training "
        "overlap; eval_every then counts versions); trainers.loop.driver.",
    )
    max_staleness: int = setting(
        2,
        help="async: largest current version - oldest turn version of a trained group.",
        **_at_least(0),
    )
    sync_every: int = setting(
        1,
        help="async: batches of groups per published version (num_train_epochs passes each).",
        **_at_least(1),
    )
    reward_wait_s: float = setting(
        0.0, help="async: seconds a finished sample may wait for a late reward.", **_at_least(0)
    )
    max_versions: int | None = setting(
        None, help="async: stop after this many versions (default: rounds).", **_at_least(1)
    )
    max_steps: int | None = setting(None, help="async: stop after this many optimizer steps.", **_at_least(1))
    max_samples: int | None = setting(
        None,
        help="async: the collector's sample budget (training samples); the run ends when they are all "
        "trained or dropped.",
        **_at_least(1),
    )
    tis_cap: float = setting(
        context_default("tis_cap", "loop"),
        help="async: truncated importance sampling cap (train.tis_cap overrides it).",
        check=lambda v: v > 0,
        rule="> 0",
    )
    checkpoint_every: int | None = setting(
        None,
        help="Write a recovery checkpoint (weights, optimizer, scheduler, RNG; async: the stream's cursor) "
        "every N rounds (default 1) or async versions (default 10), and at the end. Between checkpoints "
        "weights reach the policy server as tensors, not through the disk.",
        **_at_least(1),
    )

    def __post_init__(self) -> None:
        check_settings(self)
        for key in ("data", "model", "output_dir", "output"):
            if key in self.train:
                raise UserError(f"train.{key} is set by the loop; remove it from the train section")
        if self.train.get("group_underflow", context_default("group_underflow", "loop")) not in (
            "smaller",
            "drop",
        ):
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
        if self.mode == "async" and self.curriculum:
            raise UserError("curriculum is not supported with mode: async")
        if self.mode == "async" and backend != "trl":
            raise UserError(
                "mode: async trains with the resident trl trainer: leave train.backend unset (trl)"
            )

    def curriculum_share(self, round_no: int) -> float | None:
        """The share of the training tasks round ``round_no`` draws from (``None``: no curriculum).

        Example:
            >>> LoopConfig(agent="a:f", tasks="t", model="m", curriculum=True).curriculum_share(3)
            1.0
        """
        if not self.curriculum:
            return None
        widenings = (round_no - 1) // self.curriculum_expand_every
        return min(1.0, self.curriculum_start + self.curriculum_expand_by * widenings)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> LoopConfig:
        """Build from a mapping, rejecting unknown keys with one clear error.

        Example:
            >>> LoopConfig.from_mapping({"agent": "a:f", "tasks": "t", "model": "m"}).rounds
            4
        """
        missing = [k for k in ("agent", "tasks", "model") if not data.get(k)]
        if missing and not set(data) - {f.name for f in dataclasses.fields(cls)}:
            raise UserError(f"the loop config needs {', '.join(missing)}")
        return from_mapping(
            cls, data, unknown="loop setting(s)", tail=" (tracerl train --loop --help lists them)"
        )

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
    return _read_yaml(path, "loop settings")


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
    from trainers._model_dir import check_local_model, check_model
    from trainers.serve.policy import make_policy
    from trainers.settings import make_config

    check_local_model(check_model(cfg.model))
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


def train_settings(cfg: LoopConfig, model: str, out: Path) -> dict[str, Any]:
    """The trainer settings of the loop: the ``train`` section plus what the loop sets.

    Example:
        >>> train_settings(LoopConfig(agent="a:f", tasks="t", model="m"), "m", Path("o"))["group_size"]
        8
    """
    settings = dict(cfg.train)
    settings.setdefault("group_size", cfg.group_size)
    settings.setdefault("seed", cfg.seed)
    settings.setdefault("group_underflow", context_default("group_underflow", "loop"))
    if cfg.mode == "async":
        settings.setdefault("tis_cap", cfg.tis_cap)
        settings.setdefault("plots", False)  # the loop draws progress.png itself
    settings.update(model=model, output_dir=str(out))
    grpo_keys = settings.get("grpo") or {}
    if "micro_batch_size" not in settings and "generation_batch_size" not in grpo_keys:
        # Passes of one sequence, the gradient of the whole batch: the README's step-5 loop on SmolLM2-135M
        # peaked at 12.2 GB in passes of 8, and a LlamaIndex agent's loop (prompts of ~290 tokens) at 6.0 GiB
        # in passes of 2 (issue 50). Two steps of 16 such sequences with sdk.train on 2 cores: passes of 2
        # 3.5 GiB and 116-123 s, of 1 2.4 GiB and 110-116 s, of 1 padding-free 2.1 GiB and 83-88 s, the
        # same loss and gradient norm (tests/bench/RESULTS.md). padding_free falls back to TRL's loss
        # for what it does not cover; passes of 1 bound the memory either way. On a GPU, larger passes
        # (micro_batch_size, or micro_batch_tokens with a varlen flash attention) are faster.
        settings["micro_batch_size"] = 1
        settings.setdefault("padding_free", True)
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
    """Every key of the loop's YAML file with its default and meaning, from the fields' help.

    Example:
        >>> print(loop_keys().splitlines()[9][:57])
          group_size                     8  Samples per task (the
    """
    return "\n".join(
        (
            settings_table(LoopConfig, "loop keys (YAML), with their defaults:"),
            settings_table(PolicySpec, "policy keys (the policy: section):", where="  "),
        )
    )
