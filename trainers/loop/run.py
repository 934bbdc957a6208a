"""What both loop modes keep of a run: its files, its clock, and the training side it starts.

A run lives in ``out``: ``store/`` (the sessions), ``rollouts/`` (the runners' results files),
``metrics.jsonl`` (one row per round or optimizer step, plus validation rows), ``state.json`` (the last
commit: what a restart continues from, replaced atomically) and ``train/`` (checkpoints): how they are
written, how the run's seconds go on after a restart, and how the resident trainer and the policy server
serving it are started. What the loop commits is :mod:`trainers.loop.driver`'s.

Example:
    >>> from trainers.loop.config import LoopConfig
    >>> run = LoopRun(LoopConfig(agent="a:f", tasks="t.jsonl", model="m", out="runs/x"), quiet=True)
    >>> run.metrics.name, run.state_path.name
    ('metrics.jsonl', 'state.json')
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.config import planned_steps, train_settings
from trainers.loop.training import LoopTrainer, is_resident, start_policy

__all__ = ["LoopRun", "atomic_write", "read_jsonl"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file; a missing file or a torn line (a kill mid-write) is skipped.

    Example:
        >>> read_jsonl(Path("no-such-file.jsonl"))
        []
    """
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole or not at all (written aside, synced, renamed over it).

    Example:
        >>> atomic_write(Path("runs/x/state.json"), "{}")  # doctest: +SKIP
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LoopRun:
    """One run's files, clock and training side, as both loop modes keep them.

    Attributes:
        version: The policy version served (0: the starting model); a round trains one version.
        checkpoint: What a restarted server starts on: the starting model, then a checkpoint.
        resident_checkpoint: The resident trainer's recovery checkpoint (``None`` before the first).
        trainer: The resident trainer (:class:`~trainers.loop.training.LoopTrainer`), once started.

    Example:
        >>> run = LoopRun(cfg, quiet=False)  # doctest: +SKIP
        >>> run.say("resuming"); run.wall_s()  # doctest: +SKIP
    """

    def __init__(self, cfg: Any, *, quiet: bool = False) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.quiet = quiet
        self.store = self.out / "store"
        self.rollouts = self.out / "rollouts"
        self.metrics = self.out / "metrics.jsonl"
        self.state_path = self.out / "state.json"
        self.version = 0
        self.checkpoint = str(cfg.model)
        self.resident_checkpoint: str | None = None
        self.trainer: LoopTrainer | None = None
        self.t0 = time.time()  # wall_s counts from here; a resumed run moves it back (go_on_from)

    def say(self, text: str) -> None:
        """Print one line of the loop's own (nothing when quiet)."""
        if not self.quiet:
            print(text, flush=True)

    def prepare(self) -> None:
        """Make the run's directories and record its settings (``loop-config.json``)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.rollouts.mkdir(exist_ok=True)
        (self.out / "loop-config.json").write_text(json.dumps(dataclasses.asdict(self.cfg), indent=2))

    def wall_s(self) -> float:
        """The run's seconds so far, across restarts (each row's ``wall_s``)."""
        return round(time.time() - self.t0, 1)

    def go_on_from(self, rows: list[dict[str, Any]]) -> None:
        """Continue the run's seconds from the last of ``rows`` kept after a restart."""
        self.t0 = time.time() - max((float(r.get("wall_s") or 0) for r in rows), default=0.0)

    def read_state(self) -> dict[str, Any] | None:
        """The last commit (``state.json``), or ``None`` for a new run."""
        try:
            return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def write_state(self, state: dict[str, Any]) -> None:
        """Commit: replace ``state.json`` atomically (what a restart continues from)."""
        atomic_write(self.state_path, json.dumps(state, indent=2))

    def rewrite(self, path: Path, rows: list[dict[str, Any]]) -> None:
        """Replace a JSON-lines file with ``rows`` (what a restart keeps of it)."""
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def append(self, lines: dict[Path, list[dict[str, Any]]]) -> None:
        """Append rows to JSON-lines files, synced: they are on disk before the next commit."""
        for path, rows in lines.items():
            with path.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())

    def start_training_side(self, *, require_resident: bool = False) -> Any:
        """Start the resident trainer (``trl`` backend) and the policy server serving the run's weights.

        The trainer continues from ``resident_checkpoint`` when the run resumes; a LoRA run serves the base
        with the checkpoint's adapter pushed on it. Another backend trains each round through the trainer
        API (the lock-step loop), with no resident trainer. ``TRACERL_POLICY_*`` are set for this process's
        agents. Returns the started policy.

        Raises:
            UserError: ``require_resident`` (the asynchronous loop) with another backend.
        """
        from trainers.serve.policy import export_env, make_policy

        cfg = self.cfg
        settings = train_settings(cfg, cfg.model, self.out / "train")
        if require_resident and not is_resident(settings):
            raise UserError("mode: async trains with the resident trl trainer: set train.backend to trl")
        if is_resident(settings):
            self.trainer = LoopTrainer(
                settings, planned_steps=planned_steps(cfg), resume=self.resident_checkpoint
            )
        lora = self.trainer is not None and self.trainer.lora
        policy = make_policy(cfg.policy, cfg.model if lora else self.checkpoint, log_dir=str(self.out))
        policy.policy_version = self.version  # a restarted server goes on counting
        start_policy(policy, self.trainer)
        if self.trainer is not None:
            self.trainer.serve_resumed(policy, self.version)
        export_env(policy)
        return policy

    def train_version(
        self, data: Any, policy: Any, version: int, *, what: str, steps: int | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Train one version on the resident trainer and serve it as ``version``.

        ``train.grpo.num_train_epochs`` passes (1 by default) over ``data`` (the version's episodes; a
        Parquet file of them works too), or ``steps`` optimizer steps when given. Returns the trainer's
        :class:`~trainers.trl.resident.VersionResult` and the swap's costs (``build_s``, ``push_s``,
        ``push_bytes``).

        Raises:
            UserError: The training failed (the line names ``what``: ``round 3``, ``version 5``), or the
                server refused the weights.
        """
        assert self.trainer is not None, "start_training_side() made no resident trainer"
        grpo = self.cfg.train.get("grpo") or {}
        passes = max(1, int(grpo.get("num_train_epochs") or 1))
        try:
            done = self.trainer.train(data, passes=passes, steps=steps)
        except UserError as exc:
            raise UserError(f"training {what} failed: {exc}") from None
        return done, {"build_s": round(done.build_s, 2), **self.trainer.publish(policy, version)}
