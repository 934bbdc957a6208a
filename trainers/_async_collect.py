"""The asynchronous loop's collector: the version it stamps, back-pressure, and the runner it drives.

See :mod:`trainers.async_loop`.
"""

from __future__ import annotations

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


def _continuous(
    cfg: Any, pool: list[dict[str, Any]], rollouts: Path, version: _Version, gate: _Gate
) -> Callable[..., None]:
    """The collector's body: ``sdk.rollout.run_continuous`` over the gate's task stream."""
    from sdk.rollout import run_continuous

    def run(stop: threading.Event) -> None:
        # The task stream carries back-pressure and the budget; after a restart the runner resumes its
        # results file and gives each task that comes round its next group of samples.
        done = _read_jsonl_count(rollouts / "stream.jsonl") // cfg.group_size  # tasks already run (budget)
        run_continuous(
            cfg.agent,
            pool,
            stop=stop,
            task_stream=gate.feed(pool, stop, start=done),
            results=rollouts / "stream.jsonl",
            concurrency=cfg.concurrency,
            group_size=cfg.group_size,
            split="train",
            timeout=cfg.timeout,
            metadata=lambda task, sample: {"policy_version": version.get()},
            reward_fn=cfg.reward_fn,
            success_threshold=cfg.success_threshold,
        )

    return run


def _read_jsonl_count(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0
