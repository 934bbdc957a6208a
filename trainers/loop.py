"""The in-situ training loop: rollout → export → train → reload → validate, round after round.

``python -m trainers.loop CONFIG.yaml`` (or :func:`run_loop`) points the loop at any agent function and
task file. Each round:

1. the policy server serves the current weights (:mod:`trainers.policy`; agents read its address from
   ``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL``);
2. ``sdk.rollout`` runs the agent ``samples`` times on this round's training tasks (split ``round-N``);
3. ``sdk.episodes.export`` turns the round's sessions into Parquet;
4. one training round in-process through the trainer API (:func:`trainers.settings.make_config`, then the
   backend's ``train``, whose ``TrainResult`` gives checkpoint, adapter flag and steps; ``train:`` holds the
   keys of ``python -m sdk.train``'s ``--config`` file); a LoRA adapter is merged into full weights;
5. the policy server loads the new weights;
6. every ``eval_every`` rounds (and before the first), the runner evaluates the validation tasks
   (split ``eval-round-N``; nothing is trained on them).

``mode: async`` (or ``--mode async``) runs :mod:`trainers.async_loop` instead: collection and training
overlap, groups at most ``max_staleness`` versions old, truncated importance sampling on the stored tokens.

Curriculum (``curriculum: {start, widen_every, widen_by}``): a round draws its tasks from the easiest
``start`` share of the training tasks, ranked by their mean reward in earlier rounds (tasks not tried yet
rank with the average), and the share widens by ``widen_by`` every ``widen_every`` rounds.

Outputs in ``out``: ``metrics.jsonl`` (one line per round, appended as it finishes), ``progress.png``
(train reward and validation success per round), ``state.json`` (the last finished round and its
checkpoint: re-running the same command continues after it), ``store/``, ``rollouts/`` (the runner's
results files), ``episodes/`` and ``train/round-N/``.

Config keys: see :class:`LoopConfig`. Example ``loop.yaml``::

    agent: my_agent:solve
    tasks: data/train.jsonl
    eval_tasks: data/eval.jsonl
    reward_fn: my_agent:score
    model: ./my-model
    out: runs/loop
    rounds: 6
    tasks_per_round: 32
    samples: 8
    train: {learning_rate: 1.0e-5, lora: true, beta: 0}

Example:
    >>> from trainers.loop import run_loop
    >>> result = run_loop("loop.yaml")  # doctest: +SKIP
    >>> result["rows"][-1]["val_success"]  # doctest: +SKIP
    0.62
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers._loop_checks import check_field_types, check_loop_model
from trainers._loop_table import HEADER, plot_progress, print_row, validation_change
from trainers.base import UserError

__all__ = ["LoopConfig", "check_before_loading", "main", "run_loop", "select_tasks"]


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
        group_size: Samples per task (the GRPO group size G); ``samples`` is its deprecated spelling.
        concurrency: Samples at once.
        timeout: Seconds per sample.
        success_threshold: Reward counted as a success.
        eval_every: Validate every N rounds (and before the first round).
        eval_samples: Samples per validation task.
        curriculum: ``{start, widen_every, widen_by}`` or null.
        policy: ``policy:`` section for :func:`trainers.policy.make_policy`.
        train: ``python -m sdk.train`` settings (the keys of its ``--config`` file; ``data``, ``model``
            and ``output_dir`` are set by the loop).
        seed: Seed for training.
        id_field: Task id field.
        plot: Write ``progress.png``.
        mode: ``sync`` (rounds, this module) or ``async`` (:mod:`trainers.async_loop`: collection and training
            overlap; ``eval_every`` then counts versions).
        max_staleness: async: largest ``current version - oldest turn version`` of a trained group.
        sync_every: async: batches of groups per published version (``num_train_epochs`` passes each).
        reward_wait_s: async: seconds a finished sample may wait for a late reward.
        max_versions: async: stop after this many versions (default: ``rounds``).
        max_steps: async: stop after this many optimizer steps.
        max_samples: async: the collector's sample budget (training samples); the run ends when they
            are all trained or dropped.
        tis_cap: async: truncated importance sampling cap (``train.tis_cap`` overrides it).

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
    eval_every: int = 1
    eval_samples: int = 1
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

    def __post_init__(self) -> None:
        check_field_types(self)
        checks = [
            (self.rounds >= 0, "rounds must be >= 0"),
            (self.concurrency >= 1, "concurrency must be >= 1"),
            (self.timeout is None or self.timeout > 0, "timeout must be > 0 seconds (or null: no limit)"),
            (math.isfinite(self.success_threshold), "success_threshold must be a finite number"),
            (self.tasks_per_round >= 1, "tasks_per_round must be >= 1"),
            (self.group_size >= 2, "group_size must be >= 2 (a GRPO group compares samples of one task)"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.eval_samples >= 1, "eval_samples must be >= 1"),
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
        from trainers.settings import rename_deprecated

        data = dict(data)
        rename_deprecated(data, "samples", "group_size")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserError(f"unknown loop setting(s): {', '.join(unknown)}")
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
        return cls.from_mapping(_read_yaml(path))


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
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
    from trainers.base import check_model
    from trainers.policy import make_policy
    from trainers.settings import make_config

    check_loop_model(check_model(cfg.model))
    make_policy(cfg.policy, cfg.model)  # the policy section's keys (builds the server object; starts nothing)
    try:
        load_function(cfg.agent, "agent")
        if cfg.reward_fn:
            load_function(cfg.reward_fn, "reward_fn")
    except RolloutError as exc:
        raise UserError(str(exc)) from None
    settings = _train_settings(cfg, cfg.model, Path(cfg.out) / "train" / "round-1")
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
        (isinstance(cfg.tis_cap, (int, float)) and cfg.tis_cap > 0, "tis_cap must be > 0"),
        (cfg.mode != "async" or cfg.curriculum is None, "curriculum is not supported with mode: async"),
    ]


# -------------------------------------------------------------------------------------------- curriculum


def select_tasks(
    pool: list[dict[str, Any]],
    round_no: int,
    n: int,
    *,
    history: dict[str, list[float]],
    uses: dict[str, int],
    curriculum: dict[str, Any] | None,
) -> tuple[list[dict[str, Any]], float]:
    """The training tasks of round ``round_no`` (1-based) and the share of the pool available.

    Without curriculum the pool is walked in order, ``n`` fresh tasks per round (wrapping around). With
    it, tasks are ranked easiest first by their mean reward in ``history`` (untried tasks rank with the
    average of the tried ones, keeping file order) and the round takes the ``n`` least-used tasks of the
    available share.

    Example:
        >>> pool = [{"id": str(i)} for i in range(4)]
        >>> [t["id"] for t in select_tasks(pool, 2, 2, history={}, uses={}, curriculum=None)[0]]
        ['2', '3']
    """
    if curriculum is None:
        k = (round_no - 1) * n
        return [pool[(k + j) % len(pool)] for j in range(min(n, len(pool)))], 1.0
    steps = (round_no - 1) // int(curriculum["widen_every"])
    share = min(1.0, float(curriculum["start"]) + float(curriculum["widen_by"]) * steps)
    means = {tid: statistics.fmean(v) for tid, v in history.items() if v}
    prior = statistics.fmean(means.values()) if means else 0.0
    order = sorted(range(len(pool)), key=lambda i: (-means.get(pool[i]["id"], prior), i))
    active = [pool[i] for i in order[: max(1, math.ceil(share * len(pool)))]]
    rank = {t["id"]: r for r, t in enumerate(active)}
    chosen = sorted(active, key=lambda t: (uses.get(t["id"], 0), rank[t["id"]]))[: min(n, len(active))]
    return chosen, share


# ----------------------------------------------------------------------------------------------- rounds


class _Run:
    """One loop run: its files, the rows and checkpoint so far, and the rewards the curriculum ranks by."""

    def __init__(
        self,
        cfg: LoopConfig,
        *,
        on_round_end: Callable[[dict[str, Any]], None] | None = None,
        quiet: bool = False,
    ) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.store = self.out / "store"
        self.metrics = self.out / "metrics.jsonl"
        self.state_path = self.out / "state.json"
        self.on_round_end = on_round_end
        self.quiet = quiet
        self.checkpoint = cfg.model
        self.all_rows: list[dict[str, Any]] = []
        self.history: dict[str, list[float]] = defaultdict(list)  # task id -> rewards in earlier rounds
        self.uses: dict[str, int] = defaultdict(int)  # task id -> rounds that drew it
        self._t_start = time.time()
        self._wall0 = 0.0  # wall seconds of the rounds finished before this process

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def result(self) -> dict[str, Any]:
        return {"rows": self.all_rows, "checkpoint": self.checkpoint, "out": str(self.out)}

    # -- state on disk ---------------------------------------------------------------------------

    def load_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def save_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_path)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(OSError):
            for line in self.metrics.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def keep_rows_through(self, last_round: int) -> list[dict[str, Any]]:
        """Drop metrics lines of rounds after the last finished one (a round cut short is run again)."""
        rows = [r for r in self.rows() if r.get("round", -1) <= last_round]
        self.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return rows

    def append_row(self, row: dict[str, Any]) -> None:
        with open(self.metrics, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def resume(self) -> int:
        """Pick up after the last finished round (if any); return the round to run first."""
        from sdk.rollout import read_results

        state = self.load_state()
        if state:
            self.checkpoint = str(state["checkpoint"])
        first = int(state["round"]) + 1 if state else 0
        self.all_rows = self.keep_rows_through(first - 1)
        self._wall0 = float(self.all_rows[-1]["wall_s"]) if self.all_rows else 0.0
        if state:
            self.say(f"resuming after round {state['round']} (checkpoint {self.checkpoint})")
        for rnd in range(1, first):  # earlier rounds' rewards, for the curriculum
            self._remember(read_results(self.out / "rollouts" / f"round-{rnd}.jsonl"))
        return first

    def _remember(self, results: list[dict[str, Any]], tasks: list[dict[str, Any]] | None = None) -> None:
        for r in results:
            if isinstance(r.get("reward"), (int, float)):
                self.history[str(r["task_id"])].append(float(r["reward"]))
        drawn = {t["id"] for t in tasks} if tasks is not None else {str(r["task_id"]) for r in results}
        for tid in drawn:
            self.uses[tid] += 1

    # -- rounds ----------------------------------------------------------------------------------

    def rollout(self, tasks: list[dict[str, Any]], split: str, group_size: int) -> Any:
        from sdk.rollout import RolloutError, run_rollout

        cfg = self.cfg
        try:
            return run_rollout(
                cfg.agent,
                tasks,
                group_size=group_size,
                concurrency=cfg.concurrency,
                timeout=cfg.timeout,
                reward_fn=cfg.reward_fn,
                split=split,
                results=self.out / "rollouts" / f"{split}.jsonl",
                id_field="id",
                success_threshold=cfg.success_threshold,
            )
        except RolloutError as exc:
            raise UserError(str(exc)) from None

    def finish(self, row: dict[str, Any]) -> None:
        """Save a finished round's row (and the state that marks it done); print it, plot, call back."""
        row["wall_s"] = round(self._wall0 + time.time() - self._t_start, 1)
        row["checkpoint"] = self.checkpoint
        self.append_row(row)
        self.save_state({"round": row["round"], "checkpoint": self.checkpoint})
        self.all_rows.append(row)
        if not self.quiet:
            print_row(row)
        if self.cfg.plot:
            plot_progress(
                self.all_rows,
                self.out / "progress.png",
                f"{self.cfg.agent}: train reward and validation success",
            )
        if self.on_round_end is not None:
            self.on_round_end(row)

    def validate(self, eval_pool: list[dict[str, Any]] | None, rnd: int) -> dict[str, Any]:
        """Evaluate the validation tasks (if any); the row's validation fields and ``eval_s``."""
        t0 = time.time()
        val = self.rollout(eval_pool, f"eval-round-{rnd}", self.cfg.eval_samples) if eval_pool else None
        metrics = None if val is None else val.metrics
        return {
            "val_success": None if val is None else val.success_rate,
            "val_reward": None if val is None else val.mean_reward,
            "val_pass_at_1": None if metrics is None else metrics.pass_at_1,
            "val_pass_at_1_se": None if metrics is None else metrics.pass_at_1_se,
            "eval_s": round(time.time() - t0, 1),
        }

    def validation_round(self, eval_pool: list[dict[str, Any]] | None) -> None:
        """Round 0: the starting policy on the validation tasks, nothing trained."""
        val = self.validate(eval_pool, 0)
        self.finish({"round": 0, **val, "train_reward": None, "groups": 0, "steps": 0})

    def training_round(
        self, rnd: int, pool: list[dict[str, Any]], eval_pool: list[dict[str, Any]] | None, policy: Any
    ) -> None:
        """Collect on this round's tasks, export, train, serve the new weights, validate when due."""
        from sdk.episodes import export
        from sdk.rollout import read_results
        from trainers.policy import export_env

        cfg = self.cfg
        t0 = time.time()
        tasks, share = select_tasks(
            pool, rnd, cfg.tasks_per_round, history=self.history, uses=self.uses, curriculum=cfg.curriculum
        )
        split = f"round-{rnd}"
        got = self.rollout(tasks, split, cfg.group_size)
        results = read_results(self.out / "rollouts" / f"{split}.jsonl")
        self._remember(results, tasks)
        t_collect = time.time() - t0
        data = self.out / "episodes" / f"{split}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        summary = export(self.store, data, splits=[split])
        groups = _groups_with_signal(results)
        steps, adapter, t1 = 0, None, time.time()
        if groups:
            self.checkpoint, adapter, steps = _train_round(cfg, self, rnd, data, self.checkpoint, groups)
            policy.update(self.checkpoint, adapter=adapter)
            export_env(policy)
        t_train = time.time() - t1
        due = eval_pool and (rnd % cfg.eval_every == 0 or rnd == cfg.rounds)
        val = self.validate(eval_pool if due else None, rnd)
        self.finish(
            {
                "round": rnd,
                "val_success": val["val_success"],
                "val_reward": val["val_reward"],
                "val_pass_at_1": val["val_pass_at_1"],
                "val_pass_at_1_se": val["val_pass_at_1_se"],
                "train_reward": got.mean_reward,
                "train_success": got.success_rate,
                "tasks": len(tasks),
                "samples": got.done,
                "errors": got.counts.get("error", 0),
                "timeouts": got.counts.get("timeout", 0),
                "exported": getattr(summary, "written", None),
                "groups": groups,
                "steps": steps,
                "curriculum_share": share,
                "adapter": adapter,
                "collect_s": round(t_collect, 1),
                "train_s": round(t_train, 1),
                "eval_s": val["eval_s"],
            }
        )


def _train_round(
    cfg: LoopConfig, run: _Run, rnd: int, data: Path, model: str, groups: int
) -> tuple[str, str | None, int]:
    """One training round through the trainer API: (full-weight checkpoint, adapter or None, steps)."""
    from trainers.settings import make_config

    out = run.out / "train" / f"round-{rnd}"
    if out.exists():
        shutil.rmtree(out)  # a round cut short trains again from scratch
    out.mkdir(parents=True)
    settings = _train_settings(cfg, model, out)
    grpo = dict(settings.get("grpo") or {})
    G = int(settings["group_size"])
    batch = grpo.get("per_device_train_batch_size")
    if isinstance(batch, int) and batch > G * groups:
        # Fewer groups carry signal this round than one batch holds: a smaller batch, not a failed round.
        grpo["per_device_train_batch_size"] = G * groups
        settings["grpo"] = grpo
    trainer, config, backend = make_config(settings, source="the loop's train section")
    try:
        result = trainer.train(str(data), config, extra_config={"backend": backend, "data": str(data)})
    except UserError as exc:
        raise UserError(f"training round {rnd} failed: {exc}") from None
    final = result.checkpoint
    if final is None or not Path(final).is_dir():
        raise UserError(
            f"training round {rnd} left no local checkpoint in {out / 'final'}: the loop serves weights it "
            "can load (local trl backend, or a remote backend that downloads them)"
        )
    if result.adapter:
        from trainers._loopkit import merge_adapter

        return merge_adapter(model, Path(final), out / "merged"), str(final), result.global_step
    return str(final), None, result.global_step


def _train_settings(cfg: LoopConfig, model: str, out: Path) -> dict[str, Any]:
    """The trainer settings of a round: the ``train`` section plus what the loop sets."""
    settings = dict(cfg.train)
    settings.setdefault("group_size", cfg.group_size)
    settings.setdefault("seed", cfg.seed)
    settings.update(model=model, output_dir=str(out))
    if str(settings.get("backend") or "trl") == "trl":
        grpo = dict(settings.get("grpo") or {})
        grpo.setdefault("disable_tqdm", True)  # the loop prints one row per round, not TRL's steps
        settings["grpo"] = grpo
    return settings


def _groups_with_signal(rows: list[dict[str, Any]]) -> int:
    by_task: dict[str, set[float]] = defaultdict(set)
    for r in rows:
        if isinstance(r.get("reward"), (int, float)):
            by_task[str(r["task_id"])].add(float(r["reward"]))
    return sum(len(v) > 1 for v in by_task.values())


def run_loop(
    config: LoopConfig | dict[str, Any] | str | os.PathLike[str],
    *,
    on_round_end: Callable[[dict[str, Any]], None] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run (or continue) the loop; returns ``{"rows", "checkpoint", "out"}``.

    Re-running with the same ``out`` continues after the last finished round (``state.json``); a round cut
    short runs again (its rollout keeps the samples that finished). Raising ``rounds`` extends a run.
    Third-party progress bars, logs and warnings are turned off for the process
    (:func:`trainers.quiet.quiet_libraries`): the loop prints its own lines only.

    Args:
        config: A :class:`LoopConfig`, a mapping of its fields or a YAML file.
        on_round_end: Called with each round's metrics row after it is saved.
        quiet: Print nothing.

    Raises:
        UserError: Bad settings, a failed training round, a policy server that would not start.

    Example:
        >>> run_loop({"agent": "a:f", "tasks": "t.jsonl", "model": "m", "rounds": 2})  # doctest: +SKIP
    """
    cfg = (
        config
        if isinstance(config, LoopConfig)
        else LoopConfig.from_mapping(dict(config))
        if isinstance(config, dict)
        else LoopConfig.from_yaml(config)
    )
    check_before_loading(cfg)
    if cfg.mode == "async":
        from trainers.async_loop import run_async

        return run_async(cfg, on_version=on_round_end, quiet=quiet)
    import sdk
    from trainers._loopkit import load_pools
    from trainers.policy import export_env, make_policy
    from trainers.quiet import quiet_libraries

    run = _Run(cfg, on_round_end=on_round_end, quiet=quiet)
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "loop-config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    pool, eval_pool = load_pools(cfg)
    sdk.configure(store=run.store)
    first = run.resume()
    if first > cfg.rounds:
        run.say(f"all {cfg.rounds} rounds are done (raise rounds to continue)")
        return run.result()
    quiet_libraries()  # one row per round: no third-party bars, logs or warnings between them
    policy = make_policy(cfg.policy, run.checkpoint, log_dir=str(run.out))
    policy.start()
    export_env(policy)
    run.say(HEADER)
    try:
        if first == 0:
            run.validation_round(eval_pool)
            first = 1
        for rnd in range(first, cfg.rounds + 1):
            run.training_round(rnd, pool, eval_pool, policy)
    finally:
        policy.stop()
        sdk.flush()
    return run.result()


# -------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m trainers.loop CONFIG.yaml [--rounds N] [--out DIR]``; 0, 2 on bad input, 130 on Ctrl-C.

    Example:
        >>> main(["examples/arithmetic/loop.yaml", "--rounds", "1"])  # doctest: +SKIP
        0
    """
    p = argparse.ArgumentParser(
        prog="python -m sdk.train --loop", description="rollout → export → train → reload → validate rounds"
    )
    p.add_argument("config", help="loop YAML file")
    p.add_argument("--rounds", type=int, default=None, help="override rounds")
    p.add_argument("--out", default=None, help="override out")
    p.add_argument("--model", default=None, help="override model")
    p.add_argument("--mode", choices=["sync", "async"], default=None, help="override mode")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        data = _read_yaml(args.config)
        # Overrides join the file's settings before validation: --rounds -1 is refused like rounds: -1.
        overrides = ("rounds", "out", "model", "mode")
        data.update({k: getattr(args, k) for k in overrides if getattr(args, k) is not None})
        result = run_loop(LoopConfig.from_mapping(data))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: re-run the same command to continue after the last finished round", file=sys.stderr
        )
        return 130
    line = validation_change(result["out"], result["rows"])
    if line is not None:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
