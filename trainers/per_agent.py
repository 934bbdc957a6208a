"""Per-agent training: one policy (a LoRA adapter with ``lora: true``) per role, on one base model.

The role of an episode is its ``agent`` column: the agent name its integration recorded (a LangGraph node,
a LlamaIndex or Strands agent, ``session(agent=...)``, the gateway's ``X-Tracerl-Agent`` header). For each
role, the role's episodes are credited with :func:`sdk.episodes.role_reward` (the reward named after the
role when the session recorded one, else the episode reward) and trained by the configured trainer into
``OUTPUT/<role>/`` (so ``OUTPUT/<role>/final`` is the role's adapter or model); GRPO groups are then per
(task, role). ``<role>`` is the role's name with every byte outside ``[A-Za-z0-9_-]`` percent-encoded
(:func:`role_dir`; ``a b`` and ``a/b`` are ``a%20b`` and ``a%2Fb``), so no two roles share a directory and
:func:`role_of_dir` reverses it. A role without a task whose rewards differ (nothing GRPO can learn from) is
reported and skipped. ``OUTPUT/roles.json`` summarises every role with its directory.

This is what ``python -m sdk.train --per-agent [--roles a,b]`` runs.

Credit, in this order: the session reward named after the role (``s.reward(1.0, name="router")``: the role's
own score, e.g. "did the router pick the right specialist"); otherwise the session reward (every role shares
the outcome); per-call rewards go to the thread of that call only. Give a role its own reward when its job
can be judged alone: its groups then compare its choices without the noise of what the others did.

Round after round, :class:`ResidentRoles` keeps one resident trainer per role (with ``lora: true``, one
adapter per role on the one base): ``train_round(episodes)`` trains each role with signal from where it left
off, ``push(server, role, policy_version=N)`` sends that role's adapter to a multi-adapter server while the
others keep serving, ``checkpoint()`` / ``ResidentRoles(config, resume=...)`` recover a run, and
:func:`fresh_adapter` gives the adapter to serve before a role's first round. Full-weight roles are served
one server each (``sdk.serve --model OUTPUT/ROLE/final --model-name ROLE``).

Example:
    >>> from trainers.settings import make_config
    >>> trainer, cfg, _ = make_config({"model": "./tiny", "output_dir": "runs/agents", "lora": True})
    >>> result = train_per_agent("episodes.parquet", cfg, trainer=trainer)  # doctest: +SKIP
    >>> [(r.role, r.status) for r in result.roles]  # doctest: +SKIP
    [('math', 'trained'), ('router', 'trained')]
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sdk.episodes import role_reward
from trainers.base import TrainerConfig, TrainResult
from trainers.data import DataReport, load_episodes
from trainers.errors import UserError

__all__ = [
    "PerAgentResult",
    "ResidentRoles",
    "RoleResult",
    "fresh_adapter",
    "role_dir",
    "role_episodes",
    "role_of_dir",
    "train_per_agent",
]


@dataclass
class RoleResult:
    """What per-agent training did for one role.

    Example:
        >>> RoleResult("router", episodes=8, tasks=2, tasks_with_spread=0, skipped="no reward spread").status
        'skipped'
    """

    role: str
    episodes: int = 0
    tasks: int = 0
    tasks_with_spread: int = 0
    named_rewards: int = 0  # episodes credited by the reward named after the role
    output_dir: Path | None = None
    result: TrainResult | None = None
    skipped: str | None = None

    @property
    def status(self) -> str:
        """``trained``, ``skipped`` or ``planned`` (a dry run)."""
        return "trained" if self.result is not None else "skipped" if self.skipped else "planned"

    def line(self) -> str:
        """One human-readable line."""
        head = (
            f"{self.role}: {self.episodes} episodes, {self.tasks} tasks ({self.tasks_with_spread} with "
            f"reward spread), {self.named_rewards} credited by the named reward {self.role!r}"
        )
        if self.output_dir is not None and self.output_dir.name != self.role:
            head += f" (directory {self.output_dir.name})"
        if self.result is not None:
            kind = "adapter" if self.result.adapter else "model"
            return f"{head}; trained {self.result.global_step} steps, {kind}: {self.result.checkpoint}"
        return f"{head}; skipped: {self.skipped}" if self.skipped else f"{head}; dry run"

    def to_dict(self) -> dict[str, Any]:
        """The role's entry in ``roles.json``."""
        out: dict[str, Any] = {
            "role": self.role,
            "status": self.status,
            "episodes": self.episodes,
            "tasks": self.tasks,
            "tasks_with_spread": self.tasks_with_spread,
            "named_rewards": self.named_rewards,
            "output_dir": None if self.output_dir is None else str(self.output_dir),
            "skipped": self.skipped,
        }
        if self.result is not None:
            out.update(
                checkpoint=str(self.result.checkpoint),
                adapter=self.result.adapter,
                steps=self.result.global_step,
            )
        return out


@dataclass
class PerAgentResult:
    """Per-role results of :func:`train_per_agent`.

    Example:
        >>> r = PerAgentResult(Path("runs/x"), [RoleResult("router", skipped="no reward spread")])
        >>> r.trained, r.roles[0].status
        ([], 'skipped')
    """

    output_dir: Path
    roles: list[RoleResult] = field(default_factory=list)
    unnamed_episodes: int = 0  # episodes without an agent name: no role, not trained

    @property
    def trained(self) -> list[RoleResult]:
        """The roles that were trained."""
        return [r for r in self.roles if r.result is not None]

    def summary_lines(self) -> list[str]:
        """One line per role, then the episodes without a role."""
        lines = [r.line() for r in self.roles]
        if self.unnamed_episodes:
            lines.append(f"{self.unnamed_episodes} episodes without an agent name (no role): not trained")
        return lines

    def checkpoints(self) -> dict[str, Path]:
        """``{role: final checkpoint}`` of the trained roles (what ``sdk.serve --adapter`` takes)."""
        return {r.role: Path(r.result.checkpoint) for r in self.trained if r.result and r.result.checkpoint}


_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_NAME = 200  # bytes: file systems allow 255 per name; leave room for temporary suffixes


def role_dir(output_dir: str | Path, role: str) -> Path:
    """The output directory of ``role``: its name with every byte outside ``[A-Za-z0-9_-]`` percent-encoded.

    Distinct roles get distinct directories (``a b`` -> ``a%20b``, ``a/b`` -> ``a%2Fb``; ``.``, ``..`` and
    ``roles.json`` cannot name a directory or the summary file), and :func:`role_of_dir` gives the role back.

    Raises:
        ValueError: ``role`` is empty, or its escaped name is longer than a file name may be.

    Example:
        >>> role_dir("runs/x", "math/expert").as_posix()
        'runs/x/math%2Fexpert'
        >>> role_of_dir("math%2Fexpert")
        'math/expert'
    """
    if not role:
        raise ValueError("a role (agent name) must not be empty")
    name = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in role)
    if len(name) > _MAX_NAME:
        raise ValueError(f"role {role[:40]!r} is too long for a directory name ({len(name)} bytes escaped)")
    return Path(output_dir) / name


def role_of_dir(name: str) -> str:
    """The role whose :func:`role_dir` is named ``name`` (percent-decoding).

    Example:
        >>> role_of_dir("%E8%B7%AF%E7%94%B1")
        '路由'
    """
    return unquote(name, errors="strict")


def role_episodes(episodes: Sequence[Mapping[str, Any]], role: str) -> list[dict[str, Any]]:
    """The episodes of ``role`` (their ``agent``), each with ``reward`` set to the role's credit.

    Args:
        episodes: Episode rows.
        role: An agent name.

    Returns:
        Copies of the role's episodes; ``reward`` is :func:`sdk.episodes.role_reward` for the role.

    Example:
        >>> rows = [{"agent": "router", "reward": 0.0, "rewards": [{"name": "router", "value": 1.0}]},
        ...         {"agent": "math", "reward": 0.0, "rewards": [{"name": "router", "value": 1.0}]}]
        >>> [r["reward"] for r in role_episodes(rows, "router")]
        [1.0]
    """
    return [{**ep, "reward": role_reward(ep, role)} for ep in episodes if ep.get("agent") == role]


def _plan(rows: list[dict[str, Any]], role: str, output_dir: str | Path) -> RoleResult:
    """Counts for one role's credited episodes; ``skipped`` says why GRPO cannot train it."""
    rewards: dict[Any, set[float]] = defaultdict(set)
    for ep in rows:
        if ep.get("task_id") is not None and ep.get("reward") is not None:
            rewards[ep["task_id"]].add(float(ep["reward"]))
    named = sum(any((x or {}).get("name") == role for x in ep.get("rewards") or ()) for ep in rows)
    res = RoleResult(
        role,
        episodes=len(rows),
        tasks=len(rewards),
        tasks_with_spread=sum(len(v) > 1 for v in rewards.values()),
        named_rewards=named,
    )
    try:
        res.output_dir = role_dir(output_dir, role)
    except ValueError as exc:  # an empty or over-long name: no directory can hold it
        res.skipped = str(exc)
        return res
    if not res.tasks_with_spread:
        res.skipped = "too little data: no task whose rewarded episodes differ in reward"
    return res


def _select(found: dict[str, int], roles: Sequence[str] | str | None) -> list[str]:
    if roles is None or roles == "" or roles == []:
        return sorted(found)
    wanted = [r.strip() for r in roles.split(",")] if isinstance(roles, str) else [str(r) for r in roles]
    wanted = [r for r in wanted if r]
    unknown = [r for r in wanted if r not in found]
    if unknown:
        have = ", ".join(f"{r} ({n})" for r, n in sorted(found.items())) or "none"
        raise UserError(f"no episodes of role(s) {', '.join(unknown)}; roles in the data: {have}")
    return wanted


def train_per_agent(
    data: Any,
    config: TrainerConfig,
    *,
    trainer: Any = None,
    roles: Sequence[str] | str | None = None,
    models: Mapping[str, str] | None = None,
    dry_run: bool = False,
    extra_config: dict[str, Any] | None = None,
) -> PerAgentResult:
    """Train one policy per role (agent name) on its own episodes and credit.

    Each role runs ``trainer.train`` once with ``config`` whose ``output_dir`` is ``OUTPUT/<role>``
    (:func:`role_dir`: the name percent-encoded outside ``[A-Za-z0-9_-]``). With
    ``lora: true`` every role gets a LoRA adapter on the same base model (serve them together with
    ``python -m sdk.serve --adapter ROLE=OUTPUT/ROLE/final ...``).

    Args:
        data: Anything :func:`trainers.data.load_episodes` reads (Parquet, store, episode dicts).
        config: The trainer's config (from :func:`trainers.settings.make_config`).
        trainer: The trainer instance (default: ``config``'s backend from ``trainers.get_trainer("trl")``).
        roles: Roles to train (a list or ``"a,b"``); default every agent name in the data.
        models: ``{role: checkpoint}`` to start a role from instead of ``config.model`` (a loop continuing
            each role's own full-weight policy).
        dry_run: Count and check the roles; train nothing.
        extra_config: Passed to each ``trainer.train`` (written into the resolved config).

    Returns:
        A :class:`PerAgentResult`; ``OUTPUT/roles.json`` holds the same per-role summary.

    Raises:
        UserError: A requested role has no episode, the data has no agent names, or no role could be
            trained (each role's reason in the message).

    Example:
        >>> trainer, cfg, _ = make_config({"model": "./tiny", "output_dir": "runs/agents"})  # doctest: +SKIP
        >>> train_per_agent("./.tracerl", cfg, trainer=trainer, roles="router").trained  # doctest: +SKIP
    """
    if trainer is None:
        from trainers import get_trainer

        trainer = get_trainer("trl")()
    episodes = load_episodes(data, report=DataReport(), strict=bool(getattr(config, "strict", False)))
    found: dict[str, int] = defaultdict(int)
    for ep in episodes:
        if ep.get("agent") is not None:
            found[str(ep["agent"])] += 1
    if not found:
        raise UserError(
            "no episode has an agent name, so there are no roles; record one with session(agent=...), "
            "the framework integrations or the gateway's X-Tracerl-Agent header"
        )
    out = PerAgentResult(
        Path(config.output_dir), unnamed_episodes=sum(ep.get("agent") is None for ep in episodes)
    )
    for role in _select(found, roles):
        rows = role_episodes(episodes, role)
        res = _plan(rows, role, config.output_dir)
        out.roles.append(res)
        if res.skipped or dry_run:
            continue
        cfg = _role_config(config, res, (models or {}).get(role))
        try:
            res.result = trainer.train(rows, cfg, extra_config={**(extra_config or {}), "role": role})
        except UserError as exc:  # this role cannot be trained; the others still can
            res.skipped = str(exc)
    _write_summary(out)
    if not dry_run and not out.trained:
        raise UserError("no role could be trained: " + "; ".join(f"{r.role}: {r.skipped}" for r in out.roles))
    return out


def _role_config(config: TrainerConfig, res: RoleResult, model: str | None) -> TrainerConfig:
    """``config`` for one role: its output directory, its starting model, a batch its groups can fill."""
    changes: dict[str, Any] = {"output_dir": str(res.output_dir)}
    if model is not None:
        changes["model"] = str(model)
    grpo = dict(getattr(config, "grpo", None) or {})
    batch, G = grpo.get("per_device_train_batch_size"), int(getattr(config, "group_size", 0) or 0)
    if isinstance(batch, int) and G and batch > G * res.tasks_with_spread:
        # A role with few groups that carry signal: a smaller batch (whole groups), not a failed role.
        grpo["per_device_train_batch_size"] = G * res.tasks_with_spread
        changes["grpo"] = grpo
    return dataclasses.replace(config, **changes)


def _write_summary(result: PerAgentResult) -> None:
    result.output_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "roles": [r.to_dict() for r in result.roles],
        "unnamed_episodes": result.unnamed_episodes,
    }
    (result.output_dir / "roles.json").write_text(json.dumps(body, indent=2) + "\n")


class ResidentRoles:
    """Per-agent training across rounds: one resident trainer per role, each continuing its own adapter.

    Each role has a :class:`~trainers.trl.resident.ResidentTrainer` (with ``lora: true``, a LoRA adapter on
    the one base model) built at its first round and kept: a round trains every role that has groups with
    reward spread on its own episodes and credit (:func:`role_episodes`), from where that role left off
    (adapter, optimizer, schedule, RNG). :meth:`push` sends one role's weights to a multi-adapter policy
    server, which swaps that adapter while the other roles keep serving.

    Args:
        config: The ``trl`` backend's config; ``output_dir`` gets one directory per role (:func:`role_dir`).
        planned_steps: Optimizer steps each role is expected to take (its learning-rate schedule's span).

    Example:
        >>> roles = ResidentRoles(cfg, planned_steps=200)  # doctest: +SKIP
        >>> roles.train_round(episodes)  # doctest: +SKIP
        {'router': 6, 'math': 6}
        >>> roles.push(server, "router", policy_version=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        config: TrainerConfig,
        *,
        planned_steps: int = 1000,
        resume: Mapping[str, str] | None = None,
    ) -> None:
        from trainers.trl.resident import ResidentTrainer

        self.config = config
        self.planned_steps = planned_steps
        self.trainers: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}
        for role, checkpoint in (resume or {}).items():  # each role continues from its checkpoint
            self.trainers[role] = ResidentTrainer(
                self._config(role), planned_steps=planned_steps, resume=checkpoint
            )

    def _config(self, role: str) -> TrainerConfig:
        return dataclasses.replace(self.config, output_dir=str(role_dir(self.config.output_dir, role)))

    def train_round(self, data: Any, *, passes: int = 1) -> dict[str, int]:
        """Train each role with signal in ``data`` (episodes); returns ``{role: optimizer steps}``.

        Roles without a task whose rewards differ are left as they are (their reason in :attr:`skipped`).
        """
        from trainers.trl.resident import ResidentTrainer

        episodes = load_episodes(
            data, report=DataReport(), strict=bool(getattr(self.config, "strict", False))
        )
        found = sorted({str(ep["agent"]) for ep in episodes if ep.get("agent") is not None})
        steps: dict[str, int] = {}
        self.skipped = {}
        for role in found:
            rows = role_episodes(episodes, role)
            plan = _plan(rows, role, self.config.output_dir)
            if plan.skipped:
                self.skipped[role] = plan.skipped
                continue
            if role not in self.trainers:
                self.trainers[role] = ResidentTrainer(self._config(role), planned_steps=self.planned_steps)
            try:
                steps[role] = self.trainers[role].train_version(rows, passes=passes).steps
            except UserError as exc:  # this role cannot train this round; the others still can
                self.skipped[role] = str(exc)
        return steps

    def checkpoint(self) -> dict[str, str]:
        """Write each trained role's recovery checkpoint; ``{role: checkpoint}`` (``resume=`` takes it).

        Example:
            >>> roles.checkpoint()  # doctest: +SKIP
            {'math': 'runs/agents/math/checkpoint-12', 'router': 'runs/agents/router/checkpoint-9'}
        """
        out = {}
        for role, trainer in sorted(self.trainers.items()):
            if trainer.trainer is not None:
                out[role] = str(trainer.save_checkpoint())
            elif trainer.resume is not None:  # resumed, not trained since: its checkpoint still holds
                out[role] = str(trainer.resume)
        return out

    def push(self, server: Any, role: str, *, policy_version: int | None = None) -> int:
        """Serve ``role``'s current weights on ``server`` (``push(tensors, adapter=..., ...)``); its version.

        With LoRA the role's adapter (served under the role's name) is replaced while the other roles
        keep serving; without, the role's own server gets full weights.
        """
        tensors, adapter_config = self.trainers[role].weights()
        if adapter_config is None:
            return int(server.push(tensors, policy_version=policy_version))
        return int(
            server.push(tensors, adapter=role, adapter_config=adapter_config, policy_version=policy_version)
        )


def fresh_adapter(base: str | Path, config: TrainerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """A new LoRA adapter for ``base`` as ``config`` sets it up (``B = 0``: it serves the base's outputs).

    Serve one per role before the first round (``server.push(tensors, adapter=role, adapter_config=...)``)
    so every role's name routes to its own adapter from the start.

    Example:
        >>> tensors, adapter_config = fresh_adapter("./tiny", cfg)  # doctest: +SKIP
    """
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from trainers.trl._args import _lora_config
    from trainers.trl.resident import adapter_config_dict

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)), _lora_config(config))
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return tensors, adapter_config_dict(model)
