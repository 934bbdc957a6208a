"""The asynchronous loop's collector: the version it stamps, back-pressure, and the runner it drives.

See :mod:`trainers.async_loop`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__: list[str] = []


class _Version:
    """The policy version being served, shared by the threads."""

    def __init__(self, value: int) -> None:
        self._value = value
        self._lock = threading.Lock()

    def get(self) -> int:
        with self._lock:
            return self._value

    def set(self, value: int) -> None:
        with self._lock:
            self._value = value


class _Gate:
    """Back-pressure: the collector waits while too many ended samples wait for the trainer.

    Samples beyond ``max_staleness`` versions' worth would only be dropped as stale, so the collector
    starts new tasks only while the backlog the trainer last saw is below ``limit`` (see
    ``async_loop._backlog_limit``); it also stops at the sample budget (``max_samples``).
    """

    def __init__(self, limit: int, budget_tasks: int | None) -> None:
        self.limit = limit
        self.budget_tasks = budget_tasks
        self.backlog = 0
        self.changed = threading.Condition()

    def set_backlog(self, n: int) -> None:
        with self.changed:
            self.backlog = n
            self.changed.notify_all()

    def wait_room(self, stop: threading.Event) -> None:
        with self.changed:
            while self.backlog >= self.limit and not stop.is_set():
                self.changed.wait(timeout=1.0)

    def feed(self, pool: list[dict[str, Any]], stop: threading.Event, start: int = 0) -> Any:
        """Tasks in pool order, cycling, as room allows, until ``stop`` or the budget (``task_stream``)."""
        k = start
        while not stop.is_set() and (self.budget_tasks is None or k < self.budget_tasks):
            self.wait_room(stop)
            if stop.is_set():
                return
            yield pool[k % len(pool)]
            k += 1


class _ChunkCollector:
    """``run_continuous``'s contract over the batch runner, for an ``sdk.rollout`` without it.

    Chunk ``c`` runs tasks ``c*n .. c*n+n-1`` (cycling over the pool) ``group_size`` times each into
    ``rollouts/stream-c.jsonl``; after a restart the last chunk is resumed (its finished samples kept).
    """

    def __init__(
        self, cfg: Any, pool: list[dict[str, Any]], rollouts: Path, version: _Version, gate: _Gate
    ) -> None:
        self.cfg, self.pool, self.rollouts, self.version, self.gate = cfg, pool, rollouts, version, gate

    def run(self, stop: threading.Event) -> None:
        from sdk.rollout import run_rollout

        cfg = self.cfg
        n = max(1, cfg.concurrency // cfg.group_size)
        chunk = max(0, len(list(self.rollouts.glob("stream-*.jsonl"))) - 1)
        budget = self.gate.budget_tasks
        while not stop.is_set() and (budget is None or chunk * n < budget):
            self.gate.wait_room(stop)
            if stop.is_set():
                return
            count = n if budget is None else min(n, budget - chunk * n)
            tasks = [self.pool[(chunk * n + j) % len(self.pool)] for j in range(count)]
            run_rollout(
                cfg.agent,
                tasks,
                group_size=cfg.group_size,
                concurrency=cfg.concurrency,
                timeout=cfg.timeout,
                reward_fn=cfg.reward_fn,
                split="train",
                results=self.rollouts / f"stream-{chunk}.jsonl",
                success_threshold=cfg.success_threshold,
                metadata={"policy_version": self.version.get()},
            )
            chunk += 1


def _continuous(
    cfg: Any, pool: list[dict[str, Any]], rollouts: Path, version: _Version, gate: _Gate
) -> Callable[..., None]:
    """The collector's body: ``sdk.rollout.run_continuous`` when it exists, else :class:`_ChunkCollector`."""
    import sdk.rollout as rollout

    fn = getattr(rollout, "run_continuous", None)
    params = inspect.signature(fn).parameters if fn is not None else {}
    if fn is None or "task_stream" not in params or (cfg.reward_fn and "reward_fn" not in params):
        # No continuous runner, or one that cannot take the task stream or score with reward_fn.
        return _ChunkCollector(cfg, pool, rollouts, version, gate).run
    wanted = {
        "results": rollouts / "stream.jsonl",
        "concurrency": cfg.concurrency,
        "group_size": cfg.group_size,
        "split": "train",
        "timeout": cfg.timeout,
        "metadata": lambda task, sample: {"policy_version": version.get()},
        "reward_fn": cfg.reward_fn,
        "success_threshold": cfg.success_threshold,
    }
    kw = {k: v for k, v in wanted.items() if k in params}

    def run(stop: threading.Event) -> None:
        # The task stream carries back-pressure and the budget; after a restart the runner resumes its
        # results file and gives each task that comes round its next group of samples.
        done = _read_jsonl_count(rollouts / "stream.jsonl") // cfg.group_size  # tasks already run (budget)
        fn(cfg.agent, pool, stop=stop, task_stream=gate.feed(pool, stop, start=done), **kw)

    return run


def _read_jsonl_count(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0
