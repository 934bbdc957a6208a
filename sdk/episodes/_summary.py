"""ExportSummary: every session, call and episode accounted for."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

__all__ = ["ExportSummary"]


@dataclasses.dataclass
class _Stats:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        # Welford: numerically stable and O(1) memory per task.
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def merge(self, o: _Stats) -> None:
        if o.n == 0:
            return
        n = self.n + o.n
        d = o.mean - self.mean
        self.mean += d * o.n / n
        self.m2 += o.m2 + d * d * self.n * o.n / n
        self.n = n

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0


@dataclasses.dataclass
class ExportSummary:
    """What an export read, wrote, and set aside, by reason.

    Attributes:
        sessions: Sessions read from the store.
        calls: Calls read (in sessions kept by the split filter).
        episodes: Episodes built.
        written: Episodes that passed validation (written, or yielded by ``build_episodes``).
        rejected: Rejected episodes by the code of their first error (sums to the rejected total).
        warnings: Warning problems by code (episodes kept).
        store_problems: The store reader's problem counts (torn lines, corrupt lines, ...).
        store_examples: The first ``file:line`` for each store problem.
        skipped: Input set aside before building, by reason (``calls_filtered``, ``sessions_filtered``,
            ``sessions_without_calls``, ``call_rewards_unmatched``, ``sessions_superseded`` /
            ``calls_superseded``: attempts a re-run of their (task, sample) replaced).
        token_faithful: Written episodes that are token-faithful.
        out: Output Parquet path (export only).
        rejects_path: Where rejected episodes were written, if any.
        elapsed_s: Wall time of the export.

    Example:
        >>> s = ExportSummary(sessions=2, calls=5, episodes=2, written=1)
        >>> s.reject("missing_reward"); s.add_reward("t1", 1.0)
        >>> s.rejected_total, s.reward_stats()["t1"]
        (1, (1, 1.0, 0.0))
    """

    sessions: int = 0
    calls: int = 0
    episodes: int = 0
    written: int = 0
    rejected: Counter[str] = dataclasses.field(default_factory=Counter)
    warnings: Counter[str] = dataclasses.field(default_factory=Counter)
    store_problems: Counter[str] = dataclasses.field(default_factory=Counter)
    store_examples: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    token_faithful: int = 0
    out: str | None = None
    rejects_path: str | None = None
    elapsed_s: float = 0.0
    _rewards: dict[Any, _Stats] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def rejected_total(self) -> int:
        """Number of rejected episodes."""
        return sum(self.rejected.values())

    @property
    def calls_per_s(self) -> float:
        """Calls read per second of wall time."""
        return self.calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def reject(self, code: str) -> None:
        """Count one rejected episode under ``code``."""
        self.rejected[code] += 1

    def add_reward(self, task_id: Any, value: float | None) -> None:
        """Account one written episode's reward for the per-task statistics."""
        if value is not None:
            self._rewards.setdefault(task_id, _Stats()).add(value)

    def reward_stats(self) -> dict[Any, tuple[int, float, float]]:
        """Per task: ``(episodes with a reward, mean, population std)`` over written episodes."""
        return {k: (s.n, s.mean, s.std) for k, s in self._rewards.items()}

    def merge(self, other: ExportSummary) -> None:
        """Add another summary's counts into this one (parallel exports)."""
        for f in ("sessions", "calls", "episodes", "written", "token_faithful"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for f in ("rejected", "warnings", "store_problems", "skipped"):
            getattr(self, f).update(getattr(other, f))
        for k, v in other.store_examples.items():
            self.store_examples.setdefault(k, v)
        for k, st in other._rewards.items():
            self._rewards.setdefault(k, _Stats()).merge(st)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every count (``--summary-json``)."""
        return {
            "sessions": self.sessions,
            "calls": self.calls,
            "episodes": self.episodes,
            "written": self.written,
            "rejected": dict(self.rejected),
            "rejected_total": self.rejected_total,
            "warnings": dict(self.warnings),
            "store_problems": dict(self.store_problems),
            "store_examples": dict(self.store_examples),
            "skipped": dict(self.skipped),
            "token_faithful": self.token_faithful,
            "rewards": {
                str(k): {"n": n, "mean": m, "std": s} for k, (n, m, s) in self.reward_stats().items()
            },
            "out": self.out,
            "rejects_path": self.rejects_path,
            "elapsed_s": self.elapsed_s,
        }

    def rows(self, max_tasks: int = 20) -> list[tuple[str, str]]:
        """The summary as ``(label, value)`` rows, for plain or rich tables."""
        rows = [
            ("sessions", str(self.sessions)),
            ("calls", str(self.calls)),
            ("episodes built", str(self.episodes)),
            ("episodes written", str(self.written)),
            ("token-faithful", f"{self.token_faithful} of {self.written}"),
            ("rejected", str(self.rejected_total)),
        ]
        rows += [(f"  rejected: {k}", str(v)) for k, v in self.rejected.most_common()]
        rows += [(f"  warning: {k}", str(v)) for k, v in self.warnings.most_common()]
        rows += [(f"  skipped: {k}", str(v)) for k, v in self.skipped.most_common()]
        rows += [
            (
                f"  store: {k}",
                f"{v} (first at {self.store_examples[k]})" if k in self.store_examples else str(v),
            )
            for k, v in self.store_problems.most_common()
        ]
        stats = sorted(self.reward_stats().items(), key=lambda kv: str(kv[0]))
        if stats:
            total = _Stats()
            for st in self._rewards.values():
                total.merge(st)
            rows.append(("reward mean ± std (all)", f"{total.mean:.4f} ± {total.std:.4f} (n={total.n})"))
            for task, (n, mean, std) in stats[:max_tasks]:
                rows.append((f"  task {task}", f"{mean:.4f} ± {std:.4f} (n={n})"))
            if len(stats) > max_tasks:
                rows.append((f"  … {len(stats) - max_tasks} more tasks", ""))
        if self.out:
            rows.append(("output", self.out))
        if self.rejects_path:
            rows.append(("rejects", self.rejects_path))
        if self.elapsed_s:
            rows.append(("time", f"{self.elapsed_s:.2f} s ({self.calls_per_s:,.0f} calls/s)"))
        return rows

    def format_table(self, max_tasks: int = 20) -> str:
        """The summary as a plain-text table.

        Example:
            >>> print(ExportSummary(sessions=1).format_table().splitlines()[0])
            sessions          1
        """
        rows = self.rows(max_tasks)
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in rows)
