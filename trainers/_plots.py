"""PNG plots of a run's ``metrics.jsonl`` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["plot_metrics", "read_metrics"]


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
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
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
    ]
    return [p for p in plots if p is not None]
