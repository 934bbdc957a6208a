"""The loops' training side: one resident trainer per loop, its weights pushed to the policy server.

Both loop modes train through :class:`LoopTrainer`: with the ``trl`` backend a
:class:`~trainers.trl.resident.ResidentTrainer` is built at the first round or version and kept (model,
optimizer, schedule and RNG carry over); each version's weights go to the policy server as tensors
(:meth:`LocalPolicy.push <trainers.serve.policy.LocalPolicy.push>`; a LoRA adapter's tensors only). A
policy without a push (vLLM, an external server) gets the weights from disk instead: the adapter directory
alone for LoRA (vLLM loads it at run time), a full save otherwise. Recovery checkpoints (weights,
optimizer, scheduler, RNG, step) are written every ``checkpoint_every`` rounds or versions and at the end;
the last two are kept.

Each version reports what its swap cost: ``build_s`` (the trainer's construction, first version only),
``train_s``, ``push_s`` and ``push_bytes`` (trainer done to the new version served), ``checkpoint_s``.

Example:
    >>> from trainers.loop.training import LoopTrainer  # doctest: +SKIP
    >>> lt = LoopTrainer(settings, planned_steps=40)  # doctest: +SKIP
    >>> lt.train("round-1.parquet", passes=3).steps  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from trainers.errors import UserError

__all__ = ["LoopTrainer", "is_resident", "start_policy"]

_RERUN = "re-run the same command to continue after the last checkpoint"


def is_resident(settings: dict[str, Any]) -> bool:
    """Whether the loop's ``train`` settings use the resident trainer (the local ``trl`` backend).

    Example:
        >>> is_resident({"backend": "trl"}), is_resident({"backend": "ray"})
        (True, False)
    """
    return str(settings.get("backend") or "trl") == "trl"


def start_policy(policy: Any, trainer: LoopTrainer | None) -> None:
    """Start the policy server; while one in its own process loads, import what the trainer's build needs.

    The first round or version otherwise pays those imports (TRL's trainer, ``datasets``: ~0.9 s on a
    2-vCPU host) after the server is up, and this process only waits for the server meanwhile. A server in
    this process loads its model here: nothing else is imported beside it (two threads importing the same
    packages can see each other's half-imported modules).

    Example:
        >>> start_policy(policy, run.trainer)  # doctest: +SKIP
    """
    warm = None
    if trainer is not None and getattr(policy, "use_subprocess", True) is not False:
        warm = threading.Thread(target=trainer.warm, name="tracerl-trainer-imports", daemon=True)
        warm.start()
    try:
        policy.start()
    finally:
        if warm is not None:
            warm.join()


class LoopTrainer:
    """A loop's resident trainer and the way its weights reach the policy server.

    Args:
        settings: The loop's trainer settings (:func:`trainers.loop.config.train_settings`); ``output_dir``
            holds ``metrics.jsonl`` and the checkpoints.
        planned_steps: Optimizer steps the run is expected to take (the learning-rate schedule's span).
        resume: A checkpoint of an earlier run of this loop to continue from.

    Example:
        >>> lt = LoopTrainer(train_settings(cfg, cfg.model, out), planned_steps=40)  # doctest: +SKIP
        >>> lt.train("episodes/round-1.parquet", passes=3).steps  # doctest: +SKIP
        6
        >>> lt.publish(policy, version=1)  # doctest: +SKIP
        {'push_s': 0.02, 'push_bytes': 428032}
    """

    def __init__(self, settings: dict[str, Any], *, planned_steps: int, resume: str | None = None) -> None:
        from trainers.settings import make_config
        from trainers.trl.resident import ResidentTrainer

        _, config, _ = make_config(settings, source="the loop's train section")
        self.config = config
        self.base = str(settings["model"])
        self.out = Path(str(settings["output_dir"]))
        self.resident = ResidentTrainer(config, planned_steps=planned_steps, resume=resume)

    def warm(self) -> None:
        """Import the libraries the trainer's build needs (TRL's trainer, ``datasets``); nothing is built.

        A failed import is left for the build to report.

        Example:
            >>> lt.warm()  # doctest: +SKIP
        """
        with contextlib.suppress(Exception):  # the build raises a failed import with its context
            import datasets  # noqa: F401  (TRL's trainer imports it too, lazily)
            from trl import GRPOTrainer  # noqa: F401

    @property
    def lora(self) -> bool:
        """Whether a LoRA adapter is trained (and pushed) rather than full weights."""
        return bool(getattr(self.config, "lora", False))

    @property
    def global_step(self) -> int:
        """Optimizer steps so far (a resumed run counts on from its checkpoint)."""
        return self.resident.global_step

    def train(self, data: Any, *, passes: int = 1, steps: int | None = None) -> Any:
        """Train one round or version; returns the :class:`~trainers.trl.resident.VersionResult`."""
        return self.resident.train_version(data, passes=passes, steps=steps)

    def publish(self, policy: Any, version: int) -> dict[str, Any]:
        """Serve the trainer's current weights as ``version``; returns ``{"push_s", "push_bytes"}``.

        Raises:
            UserError: The server is gone or refused the weights; the message says how to go on.
        """
        t0 = time.perf_counter()
        pushes = getattr(policy, "pushes", None)
        if pushes(self.lora) if pushes is not None else hasattr(policy, "push"):
            tensors, adapter_config = self.resident.weights(device=getattr(policy, "push_device", "cpu"))
            try:
                stats = policy.push(tensors, adapter_config=adapter_config, policy_version=version)
            except UserError as exc:
                raise UserError(f"{exc}; version {version} is not served; {_RERUN}") from None
            return {"push_s": round(time.perf_counter() - t0, 4), "push_bytes": int(stats["bytes"])}
        # No push (vLLM without weight_transfer, LoRA on vLLM, an external server): the weights go through
        # the disk, the adapter alone for LoRA.
        path = self.out / f"serve-v{version}"
        self.resident.save_model(path)
        try:
            if self.lora:
                policy.update(self.base, adapter=str(path), policy_version=version)
            else:
                policy.update(str(path), policy_version=version)
        except OSError as exc:
            raise UserError(f"the policy server could not load version {version}: {exc}; {_RERUN}") from None
        for old in self.out.glob("serve-v*"):  # the served weights and the ones before stay
            n = old.name[len("serve-v") :]
            if n.isdigit() and int(n) < version - 1:
                shutil.rmtree(old, ignore_errors=True)
        moved = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return {"push_s": round(time.perf_counter() - t0, 4), "push_bytes": moved}

    def serve_resumed(self, policy: Any, version: int) -> None:
        """Serve a resumed run's checkpoint as ``version``.

        LoRA: the checkpoint's adapter is pushed onto the base the server started on; full weights: the
        server was started on the checkpoint itself.
        """
        if self.lora and self.resident.resume is not None:
            self.publish(policy, version)

    def checkpoint(self) -> tuple[str, float]:
        """Write a recovery checkpoint; keep it and the one before. Returns ``(path, seconds)``."""
        t0 = time.perf_counter()
        path = self.resident.save_checkpoint()
        steps = sorted(int(p.name[11:]) for p in self.out.glob("checkpoint-*") if p.name[11:].isdigit())
        for step in steps[:-2]:
            shutil.rmtree(self.out / f"checkpoint-{step}", ignore_errors=True)
        return str(path), round(time.perf_counter() - t0, 3)

    def save_servable(self, path: Path) -> str:
        """Save the current weights to ``path`` as a model directory that serves anywhere (LoRA: merged).

        Example:
            >>> lt.save_servable(Path("runs/loop/best"))  # doctest: +SKIP
            'runs/loop/best'
        """
        if not self.lora:
            self.resident.save_model(path)
            return str(path)
        from trainers.loop.pools import merge_adapter

        adapter = self.out / "adapter-now"
        shutil.rmtree(adapter, ignore_errors=True)
        self.resident.save_model(adapter)
        merged = merge_adapter(self.base, adapter, Path(path))
        shutil.rmtree(adapter, ignore_errors=True)
        return merged

    def final(self) -> str:
        """Save the final weights under ``output_dir/final`` and return a directory that serves them.

        For LoRA that is the adapter merged into the base once, at the end (never per version), so the
        result loads like any model.
        """
        final = self.out / "final"
        if self.resident.trainer is not None:
            from trainers._model_dir import writing_model_dir

            with writing_model_dir(final, by="tracerl loop (final)") as aside:  # whole or not at all
                self.resident.save_model(aside)
        elif self.resident.resume is not None:  # resumed and nothing trained since: the checkpoint holds it
            final = self.resident.resume
        else:
            return self.base
        if not self.lora:
            return str(final)
        from trainers.loop.pools import merge_adapter

        return merge_adapter(self.base, final, self.out / "final-merged")
