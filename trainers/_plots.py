"""PNG plots of a run's ``metrics.jsonl`` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sdk._numbers import is_finite_number

__all__ = ["plot_async_progress", "plot_metrics", "read_metrics"]


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` (one JSON object per line; a torn last line is ignored).

    Example:
        >>> read_metrics("/nonexistent/metrics.jsonl")
        []
    """
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if is_finite_number(v):
            xs.append(float(r.get("step", len(xs))))
            ys.append(float(v))
    return xs, ys


def _plot(path: Path, title: str, rows: list[dict[str, Any]], keys: list[str], ylabel: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for key in keys:
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_metrics(metrics_path: str | os.PathLike[str], output_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``reward.png``, ``loss.png`` and (when present) ``clip.png`` / ``eval.png`` next to the metrics.

    The reward plot shows the *stored* rewards of the replayed batches: it reflects the data, not the policy
    (replay does not produce fresh rollouts). Learning shows in the held-out ``eval/*`` log-prob metrics and
    in clip ratios.

    Args:
        metrics_path: The run's ``metrics.jsonl``.
        output_dir: Where to write the PNG files.

    Returns:
        The written files.

    Example:
        >>> plot_metrics("runs/x/metrics.jsonl", "runs/x")  # doctest: +SKIP
        [PosixPath('runs/x/reward.png'), PosixPath('runs/x/loss.png')]
    """
    rows = read_metrics(metrics_path)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = [
        _plot(
            out / "reward.png",
            "stored reward of replayed batches (data, not fresh rollouts)",
            rows,
            ["reward", "reward_std"],
            "reward",
        ),
        _plot(out / "loss.png", "training loss", rows, ["loss"], "loss"),
        _plot(
            out / "clip.png",
            "clip ratios vs behaviour policy",
            rows,
            ["clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"],
            "fraction",
        ),
        _plot(
            out / "eval.png",
            "held-out replay: policy log-probs (higher gap = prefers better episodes)",
            rows,
            ["eval/logp_mean", "eval/logp_gap", "eval/adv_weighted_logp"],
            "nats/token",
        ),
        _plot(
            out / "importance.png",
            "truncated importance sampling vs the behaviour policy",
            rows,
            ["tis/is_ratio_mean", "tis/is_ratio_max", "tis/is_truncated_frac"],
            "ratio / fraction",
        ),
    ]
    return [p for p in plots if p is not None]


def plot_async_progress(rows: list[dict[str, Any]], path: str | os.PathLike[str], title: str) -> Path | None:
    """``progress.png`` of the asynchronous loop: validation success and staleness by policy version.

    Top: validation success (± one standard error) and the mean stored reward of the trained groups.
    Bottom: mean and largest staleness (versions) of the trained groups, and groups dropped as stale.

    Example:
        >>> plot_async_progress([], "progress.png", "run") is None
        True
    """
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("val_success") is not None]
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5.4), sharex=True)
    if evals:
        xs = [r["policy_version"] for r in evals]
        se = [r.get("val_success_se") or 0.0 for r in evals]
        top.errorbar(xs, [r["val_success"] for r in evals], yerr=se, fmt="o-", label="validation success")
    last = {r["policy_version"]: r for r in train}  # a version's last step row carries its figures
    versions = sorted(last)
    rewards = [
        (v, last[v].get("reward")) for v in versions if isinstance(last[v].get("reward"), (int, float))
    ]
    if rewards:
        top.plot([v for v, _ in rewards], [y for _, y in rewards], "s--", label="reward of trained groups")
    top.set_ylabel("success / reward")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(title, fontsize=9)
    mean, most = [], []
    for v in versions:
        hist = {int(k): n for k, n in (last[v].get("staleness_hist") or {}).items()}
        total = sum(hist.values())
        mean.append(sum(k * n for k, n in hist.items()) / total if total else 0.0)
        most.append(max(hist, default=0))
    bottom.plot(versions, mean, "o-", label="mean staleness (versions)")
    bottom.plot(versions, most, "^:", label="max staleness")
    bottom.bar(
        versions,
        [last[v].get("groups_dropped_stale", 0) for v in versions],
        alpha=0.3,
        label="groups dropped stale",
    )
    bottom.set_xlabel("policy version")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
