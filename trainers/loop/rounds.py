"""The lock-step mode's rounds: which tasks a round draws, its row, its stop rules, its best weights.

The loop itself is one (:mod:`trainers.loop.driver`); lock-step is its mode with no staleness: a round's
samples are collected while nothing trains, then its groups train one version. This module holds what only
rounds have: the curriculum's draw (:func:`select_tasks`), the round's row, the stop when every sample of a
round failed, the ``best`` link, and a round trained through the trainer API (``backend: ray``).

Example:
    >>> pool = [{"id": str(i)} for i in range(4)]
    >>> [t["id"] for t in select_tasks(pool, 1, 2, history={}, uses={}, share=None)[0]]
    ['0', '1']
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.config import LoopConfig, train_settings

__all__ = [
    "bar_label",
    "mark_best",
    "round_row",
    "select_tasks",
    "stop_if_every_sample_failed",
    "train_round",
]


def select_tasks(
    pool: list[dict[str, Any]],
    round_no: int,
    n: int,
    *,
    history: dict[str, list[float]],
    uses: dict[str, int],
    share: float | None,
) -> tuple[list[dict[str, Any]], float]:
    """The training tasks of round ``round_no`` (1-based) and the share of the pool available.

    Without a curriculum (``share`` None) the pool is walked in order, ``n`` fresh tasks per round (wrapping
    around). With one (``share``: :meth:`LoopConfig.curriculum_share`), tasks are ranked easiest first by
    their mean reward in ``history`` (untried tasks rank with the average of the tried ones, keeping file
    order) and the round takes the ``n`` least-used tasks of that share of the pool.

    Example:
        >>> pool = [{"id": str(i)} for i in range(4)]
        >>> [t["id"] for t in select_tasks(pool, 2, 2, history={}, uses={}, share=None)[0]]
        ['2', '3']
    """
    if share is None:
        k = (round_no - 1) * n
        return [pool[(k + j) % len(pool)] for j in range(min(n, len(pool)))], 1.0
    means = {tid: statistics.fmean(v) for tid, v in history.items() if v}
    prior = statistics.fmean(means.values()) if means else 0.0
    order = sorted(range(len(pool)), key=lambda i: (-means.get(pool[i]["id"], prior), i))
    active = [pool[i] for i in order[: max(1, math.ceil(share * len(pool)))]]
    rank = {t["id"]: r for r, t in enumerate(active)}
    chosen = sorted(active, key=lambda t: (uses.get(t["id"], 0), rank[t["id"]]))[: min(n, len(active))]
    return chosen, share


def bar_label(split: str) -> str:
    """The progress bar of a rollout (on a terminal only): ``collect round 3``, ``validate round 0``.

    Example:
        >>> bar_label("round-3"), bar_label("eval-round-0"), bar_label("eval-v4")
        ('collect round 3', 'validate round 0', 'validate version 4')
    """
    if split.startswith("eval-v"):
        return f"validate version {split[len('eval-v') :]}"
    kind, _, n = split.rpartition("round-")
    return f"{'validate' if kind else 'collect'} round {n}"


#: Sample statuses that mean the agent or its reward function did not work (``sdk.rollout``).
_FAILED = ("error", "timeout", "reward_error")


def stop_if_every_sample_failed(results: Path, split: str) -> None:
    """Stop the loop when no sample of ``split`` worked: a broken agent must not look like a 0% policy.

    The failed attempts are marked superseded in the store and the results file is moved aside
    (``SPLIT.failed.jsonl``), so re-running the same command runs the round again.

    Raises:
        UserError: Every sample failed; the line names the first error.
    """
    from sdk._tracer import tracer
    from sdk.rollout import read_results
    from sdk.store import _events as events

    rows = read_results(results)
    if not rows or any(r.get("status") not in _FAILED for r in rows):
        return
    now = time.time()
    for r in rows:
        if r.get("session_id"):
            tracer.append(events.supersede(str(r["session_id"]), reason="failed_round", ts=now))
    tracer.flush()
    os.replace(results, results.with_suffix(".failed.jsonl"))
    first = next((r["error"] for r in rows if r.get("error")), rows[0].get("status"))
    raise UserError(
        f"every sample of {split} failed ({len(rows)} samples; first: {first}); fix the agent or reward "
        "function and re-run the same command: this round runs again"
    )


def mark_best(
    out: Path, rows: list[dict[str, Any]], save: Callable[[Path], Any] | None = None
) -> dict[str, Any] | None:
    """Keep ``out/best`` on the best validated round (the first of equals); returns its row.

    It links to that round's checkpoint; with ``save`` (the resident trainer, whose checkpoints are
    replaced as it goes) the newest round, when it becomes the best, has its weights saved there instead.
    """
    validated = [r for r in rows if r.get("val_success") is not None and r.get("checkpoint")]
    if not validated:
        return None
    best = max(validated, key=lambda r: r["val_success"])  # max keeps the first (earliest) of equals
    link = out / "best"
    if save is not None and best is rows[-1] and len(validated) > 1:
        if link.is_symlink() or link.is_file():
            link.unlink()
        from trainers._model_dir import writing_model_dir

        # Aside, then renamed over the previous best: a kill while saving leaves that one, whole.
        with writing_model_dir(link, by="tracerl loop (best)") as aside:
            save(aside)
        return best
    target = Path(best["checkpoint"]).resolve()
    if link.is_dir() and not link.is_symlink():
        return best  # saved when its round became the best
    if link.is_symlink() or link.exists():
        if link.is_symlink() and link.resolve() == target:
            return best
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
    return best


def train_round(
    cfg: LoopConfig, out_dir: Path, rnd: int, data: Path, model: str, groups: int
) -> tuple[str, str | None, int]:
    """One round through the trainer API (a backend other than the resident trl trainer, e.g. ``ray``).

    Returns the full-weight checkpoint the policy server loads, the adapter (LoRA) or ``None``, and the
    optimizer steps.
    """
    from trainers.settings import make_config

    out = out_dir / "train" / f"round-{rnd}"
    if out.exists():
        shutil.rmtree(out)  # a round cut short trains again from scratch
    out.mkdir(parents=True)
    settings = train_settings(cfg, model, out)
    grpo = dict(settings.get("grpo") or {})
    G = int(settings["group_size"])
    batch = grpo.get("per_device_train_batch_size")
    if isinstance(batch, int) and batch > G * groups:
        # Fewer groups carry signal this round than one batch holds: a smaller batch, not a failed round.
        grpo["per_device_train_batch_size"] = G * groups
        settings["grpo"] = grpo
    trainer, config, backend = make_config(settings, source="the loop's train section")
    try:
        result = trainer.train(str(data), config, extra_config={"backend": backend, "data": str(data)})
    except UserError as exc:
        raise UserError(f"training round {rnd} failed: {exc}") from None
    final = result.checkpoint
    if final is None or not Path(final).is_dir():
        raise UserError(
            f"training round {rnd} left no local checkpoint in {out / 'final'}: the loop serves weights it "
            "can load (local trl backend, or a remote backend that downloads them)"
        )
    if result.adapter:
        from trainers.loop.pools import merge_adapter

        return merge_adapter(model, Path(final), out / "merged"), str(final), result.global_step
    return str(final), None, result.global_step


def round_row(rnd: int, got: Any, val: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """A round's ``metrics.jsonl`` row: its training samples' summary ``got``, its validation ``val``.

    ``fields``: the round's own counts and seconds (``groups``, ``steps``, ``collect_s``, ...).

    Example:
        >>> round_row(0, None, {"val_success": 0.5}, groups=0, steps=0)["val_success"]
        0.5
    """
    val = val or {}
    row: dict[str, Any] = {
        "round": rnd,
        "val_success": val.get("val_success"),
        "val_reward": val.get("val_reward"),
        # Validation is pass@1 over tasks (sdk.eval) with its standard error; the table prints it.
        "val_pass_at_1": val.get("val_success"),
        "val_pass_at_1_se": val.get("val_success_se"),
        "val_malformed_share": val.get("val_malformed_share"),
        "val_tasks": val.get("val_tasks"),
        "val_subset": bool(val.get("val_subset")),
        "train_reward": None,
    }
    if got is not None:
        row.update(
            train_reward=got.mean_reward,
            train_success=got.success_rate,
            malformed_share=got.malformed_share,
            malformed_tool_calls=got.malformed_tool_calls,
            samples=got.done,
            errors=got.counts.get("error", 0),
            timeouts=got.counts.get("timeout", 0),
        )
    return {**row, **fields, "eval_s": val.get("eval_s", 0.0)}
