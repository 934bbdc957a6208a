"""The loop's validation: held-out rollouts, a lock-step round's in this process, the others beside training.

A lock-step round validates after its version is served, alone (:meth:`Validator.evaluate` with
``alone=True`` and the round's split). The asynchronous loop validates in a kept worker process beside
training, one at a time: each validation's samples run on whatever version is served while they run; its
last validation runs after training stops, alone, exact for the final weights.

See :mod:`trainers.loop.driver`.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.collect import RolloutWorker, _Version, rollout_spec
from trainers.loop.run import read_jsonl

__all__ = ["Validator", "validation_tasks"]


def validation_tasks(
    cfg: Any, pool: list[dict[str, Any]] | None, *, first_or_last: bool
) -> list[dict[str, Any]] | None:
    """The held-out tasks a validation runs: all of them first and last, else ``cfg.eval_subset`` of them.

    The subset is drawn once per run (``cfg.seed``), the same tasks every time, in the pool's order, so
    the run's validations compare with each other; the first and the last cover every task, so the run's
    change is measured on all of them.

    Example:
        >>> from types import SimpleNamespace
        >>> pool = [{"id": str(i)} for i in range(6)]
        >>> cfg = SimpleNamespace(eval_subset=2, seed=0)
        >>> [t["id"] for t in validation_tasks(cfg, pool, first_or_last=False)]
        ['3', '5']
        >>> len(validation_tasks(cfg, pool, first_or_last=True))
        6
    """
    n = getattr(cfg, "eval_subset", None)
    if not pool or n is None or n >= len(pool) or first_or_last:
        return pool
    keep = sorted(random.Random(cfg.seed).sample(range(len(pool)), n))
    return [pool[i] for i in keep]


class _Thread:
    """A daemon thread that keeps the exception its body raised (the loop re-raises it)."""

    def __init__(self, name: str, body: Callable[[], None]) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                body()
            except BaseException as exc:  # reported by the main thread
                self.error = exc

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def check(self, what: str) -> None:
        if isinstance(self.error, UserError):  # already one line that says what to do
            raise UserError(str(self.error)) from self.error
        if self.error is not None:
            raise UserError(f"the {what} failed: {type(self.error).__name__}: {self.error}") from self.error


class Validator:
    """Validation rollouts in a worker process, waited on by a thread; one at a time, rows to metrics.

    ``run``: the loop's :class:`~trainers.loop.run.LoopRun`; ``finished()``: whether
    the loop has trained its last version (whose validation runs alone, after training).

    A validation that falls due while one runs is not skipped: when the running one ends, the version
    served then is validated (one validation for however many fell due meanwhile).

    Example:
        >>> v = Validator(cfg, run, eval_tasks, version, finished=lambda: False)  # doctest: +SKIP
        >>> v.start(2)  # beside training; returns at once  # doctest: +SKIP
        >>> v.wait(); v.evaluate(run.version, alone=True)  # the exact last one  # doctest: +SKIP
    """

    def __init__(
        self,
        cfg: Any,
        run: Any,
        pool: list[dict[str, Any]] | None,
        version: _Version,
        finished: Callable[[], bool],
    ) -> None:
        self.cfg, self.run, self.pool, self.version, self.finished = cfg, run, pool, version, finished
        self.lock = threading.Lock()  # metrics.jsonl appends
        self.state = threading.Lock()  # guards running / due
        self.running, self.due, self.closed = False, False, False
        self.thread: _Thread | None = None
        self.worker: RolloutWorker | None = None

    def evaluate(
        self, n: int, *, alone: bool = False, split: str | None = None, full: bool | None = None
    ) -> dict[str, Any] | None:
        """Validate the weights served now as version ``n``; returns the row (``None``: no held-out tasks).

        ``alone``: nothing else runs (a lock-step round's, or the asynchronous loop's final validation), so
        the agents run in this process. ``split``: the results' split and file name (``eval-v{n}``); a
        named one is the lock-step round's, whose row joins the round's: it is not appended here.
        ``full``: on every held-out task (default: the first and the final validation; ``eval_subset``).
        """
        from sdk.eval import summarize
        from sdk.rollout import summarize as rollout_summary

        if not self.pool:
            return None
        cfg = self.cfg
        name = split or f"eval-v{n}"
        results = self.run.rollouts / f"{name}.jsonl"
        t0 = time.time()
        if alone:
            run = functools.partial(_rollout_here, self.run.out, "validation", quiet=self.run.quiet)
        else:
            if self.worker is None:
                self.worker = RolloutWorker(self.run.out, "validation")
            run = self.worker.run
        tasks = validation_tasks(cfg, self.pool, first_or_last=(alone or n == 0) if full is None else full)
        run(
            spec=rollout_spec(cfg, cfg.eval_samples),
            tasks=tasks,
            split=name,
            results=results,
            metadata={"policy_version": n},
        )
        s = summarize(str(results), threshold=cfg.success_threshold)
        lines = read_jsonl(results)
        rewards = [r["reward"] for r in lines if r.get("reward") is not None]
        malformed = rollout_summary(lines, split=f"eval-v{n}", results_path=str(results), total=len(lines))
        row = {
            "kind": "eval",
            "policy_version": n,
            "val_success": s.pass_at_k.get(1),
            "val_success_se": s.pass_at_k_se.get(1),
            "val_reward": sum(rewards) / len(rewards) if rewards else None,
            "val_malformed_share": malformed.malformed_share,
            "val_malformed_tool_calls": malformed.malformed_tool_calls,
            "served_version_at_end": self.version.get(),
            "val_tasks": len(tasks or ()),
            "val_subset": len(tasks or ()) < len(self.pool),
            "eval_s": round(time.time() - t0, 1),
            "wall_s": self.run.wall_s(),
        }
        if split is not None:
            return row
        with self.lock, self.run.metrics.open("a") as f:
            f.write(json.dumps(row) + "\n")
        subset = (
            f" (on {row['val_tasks']} of the {len(self.pool)} tasks, eval_subset)"
            if row["val_subset"]
            else ""
        )
        share = row["val_malformed_share"]
        bad = "" if share is None else f", {_pct(share)} of tool calls malformed"
        self.run.say(f"validation of version {n}: {_pct(row['val_success'])} success{bad}{subset}")
        return row

    def start(self, n: int) -> None:
        """Validate version ``n`` beside training (when one is running: the version served after it)."""
        if not self.pool:
            return
        if self.thread is not None:  # an earlier validation's failure stops the loop here
            self.thread.check("validation")
        with self.state:
            if self.closed:
                return
            if self.running:
                self.due = True
                return
            self.running = True

        def body() -> None:
            m = n
            try:
                while True:
                    self.evaluate(m)
                    with self.state:
                        newest = self.version.get()
                        # the last version's validation runs alone, after training (exact for it)
                        if self.closed or not self.due or newest <= m or self.finished():
                            self.running = self.due = False
                            return
                        m, self.due = newest, False
            except BaseException:
                with self.state:
                    self.running = False
                raise

        self.thread = _Thread("tracerl-validation", body)

    def wait(self) -> None:
        """Wait for the running validation (no new one starts after this) and stop the worker process."""
        with self.state:
            self.closed = True
        if self.thread is not None:
            self.thread.thread.join()
            self.thread.check("validation")
        self.close()

    def close(self, timeout: float = 10) -> None:
        """Stop the worker process (killed when it has not stopped after ``timeout`` s)."""
        with self.state:
            self.closed = True
        if self.worker is not None:
            self.worker.close(timeout)
            self.worker = None


def _rollout_here(out: Path, name: str, *, quiet: bool, **kwargs: Any) -> None:
    """:meth:`RolloutWorker.run`'s contract in this process: a failed run is one ``UserError`` line.

    Unless ``quiet``, a terminal shows the run's bar (``validate version 3``); see ``rounds.bar_label``.
    """
    from sdk.rollout import RolloutError, run_rollout
    from trainers.loop.rounds import bar_label, stop_if_every_sample_failed

    try:
        run_rollout(**kwargs, progress=False if quiet else bar_label(kwargs["split"]))
    except RolloutError as exc:
        raise UserError(f"{name}: {str(exc).splitlines()[0]}") from None
    # A broken agent must not look like a 0% policy: when every sample failed, the loop stops.
    stop_if_every_sample_failed(kwargs["results"], kwargs["split"])


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
