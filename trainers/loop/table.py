"""The loop's table and progress plot: one row per round, validation as pass@1 ± se (``sdk.eval``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["HEADER", "checkpoints_line", "print_row", "plot_progress", "subset_note", "validation_change"]


def plot_progress(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Draw the validation success and the rollouts' mean reward per round into ``path`` (PNG).

    Example:
        >>> plot_progress([{"round": 0, "val_success": 0.5}], Path("progress.png"), "demo")  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    val = [(r["round"], r["val_success"]) for r in rows if r.get("val_success") is not None]
    tr = [(r["round"], r["train_reward"]) for r in rows if r.get("train_reward") is not None]
    if val:
        ax.plot([x for x, _ in val], [y for _, y in val], "o-", label="validation success rate")
    if tr:
        ax.plot([x for x, _ in tr], [y for _, y in tr], "s--", label="mean reward of the round's rollouts")
    ax.set_xlabel("round")
    ax.set_xticks([r["round"] for r in rows])
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


#: The header of the loop's table; validation is pass@1 ± its standard error over tasks (sdk.eval);
#: ``malformed val/train`` is the share of tool-call attempts the server could not parse (returned as text,
#: see ``sdk.messages.malformed_tool_call``) in the round's validation and in its training samples;
#: ``train reward`` is the training samples' mean (after ``malformed_tool_call_penalty``); ``wall s`` is
#: the run's seconds so far; ``swap s`` is the time from the trainer's last step to the new weights served
#: (the resident trainer's push).
HEADER = "round  validation pass@1  malformed val/train  train reward  groups  steps   wall s  swap s"


def _pass_at_1(r: dict[str, Any]) -> str:
    p = r.get("val_pass_at_1")
    if p is None:
        return "-"
    se = r.get("val_pass_at_1_se")
    subset = "*" if r.get("val_subset") else ""  # a fixed subset of the held-out tasks (subset_note)
    return f"{100 * p:.1f}%" + ("" if se is None else f" ± {100 * se:.1f}") + subset


def subset_note(n: int, total: int, full: str) -> str:
    """The line under the header when validation during the run uses ``eval_subset`` tasks.

    Example:
        >>> subset_note(10, 40, "round 0")
        '  (validation marked * is on a fixed 10 of the 40 held-out tasks; round 0 on all 40)'
    """
    return f"  (validation marked * is on a fixed {n} of the {total} held-out tasks; {full} on all {total})"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_row(r: dict[str, Any]) -> None:
    """Print one round's row of the table (see :data:`HEADER`).

    Example:
        >>> print_row({"round": 1, "val_pass_at_1": 0.5, "val_pass_at_1_se": 0.1, "val_malformed_share": 0.0,
        ...            "train_reward": 0.25, "malformed_share": 0.125, "groups": 2, "steps": 1, "wall_s": 3.0,
        ...            "push_s": 0.04})
            1       50.0% ± 10.0         0.0% / 12.5%         0.250       2      1      3.0    0.04
    """
    swap = r.get("push_s")
    malformed = f"{_share(r.get('val_malformed_share'))} / {_share(r.get('malformed_share'))}"
    print(
        f"{r['round']:>5}  {_pass_at_1(r):>17}  {malformed:>19}  {_fmt(r.get('train_reward')):>12}  "
        f"{r.get('groups', 0):>6}  {r.get('steps', 0):>5}  {r['wall_s']:>7.1f}  "
        f"{'-' if swap is None else f'{swap:.2f}':>6}",
        flush=True,
    )


def validation_change(out: str | os.PathLike[str], rows: list[dict[str, Any]]) -> str | None:
    """The last line of the loop's table: pass@1 of the last validated round against round 0.

    The difference comes with its 95% interval (paired bootstrap over the validation tasks) and p-value
    (paired sign-flip test), from :func:`sdk.eval.compare` on the two rounds' results files; an interval
    that includes 0 is said to be no clear change. ``None`` without two validated rounds.

    Example:
        >>> validation_change("runs/loop", [{"round": 0, "val_success": None}]) is None
        True
    """
    from sdk.eval import EvalError, compare

    # The lock-step loop validates rounds (eval-round-N.jsonl), the async loop versions (eval-vN.jsonl).
    key, name, word = ("round", "eval-round-{}.jsonl", "round")
    if rows and "round" not in rows[0]:
        key, name, word = ("policy_version", "eval-v{}.jsonl", "version")
    validated = [r[key] for r in rows if r.get(key) is not None and r.get("val_success") is not None]
    if len(validated) < 2 or validated[0] != 0:
        return None
    last = validated[-1]
    trained = sum(int(r.get("steps") or 0) for r in rows if 0 < (r.get(key) or 0) <= last)
    if key == "round" and not trained:  # the same weights validated twice: any difference is noise
        return (
            f"validation pass@1: no round trained (0 optimizer steps), so {word} {last} is {word} 0's policy"
        )
    results = Path(out) / "rollouts"
    try:
        c = compare(results / name.format(0), results / name.format(last), resamples=10_000)
    except EvalError as exc:
        return f"validation pass@1, {word} {last} vs {word} 0: not compared ({exc})"
    # An interval that reaches 0 (at its edge too: [+0.0, +25.0]) does not tell the change from noise.
    unclear = c.ci_low <= 0 <= c.ci_high
    note = "; the interval includes 0: no clear change (more held-out tasks or eval_samples narrow it)"
    return (
        f"validation pass@1: {100 * c.a_pass_at_1:.1f}% ({word} 0) -> {100 * c.b_pass_at_1:.1f}% "
        f"({word} {last}), {100 * c.difference:+.1f} points, 95% CI [{100 * c.ci_low:+.1f}, "
        f"{100 * c.ci_high:+.1f}], p = {c.p_value:.3g} over {c.tasks} tasks{note if unclear else ''}"
    )


def checkpoints_line(out: str | os.PathLike[str], rows: list[dict[str, Any]]) -> str | None:
    """``final: ...; best: ...``: the last round's checkpoint and the best validated one (``out/best``).

    Example:
        >>> rows = [{"round": 0, "val_success": 0.5, "checkpoint": "m"},
        ...         {"round": 1, "val_success": 0.25, "checkpoint": "r1"}]
        >>> checkpoints_line("runs/loop", rows)
        'final: r1 (round 1, validation 25.0%); best: runs/loop/best -> m (round 0, validation 50.0%)'
    """
    if not rows or "round" not in rows[-1]:
        return None
    last = rows[-1]

    def val(r: dict[str, Any]) -> str:
        v = r.get("val_success")
        return "" if v is None else f", validation {100 * v:.1f}%"

    line = f"final: {last.get('checkpoint')} (round {last['round']}{val(last)})"
    validated = [r for r in rows if r.get("val_success") is not None and r.get("checkpoint")]
    if validated:
        best = max(validated, key=lambda r: r["val_success"])
        link = Path(out) / "best"
        where = f"{link} -> {best['checkpoint']}" if not link.is_dir() or link.is_symlink() else str(link)
        line += f"; best: {where} (round {best['round']}{val(best)})"
    return line
