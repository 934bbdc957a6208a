"""The lock-step loop (``mode: sync``): collect a round, export, train, serve the new weights, validate.

See :mod:`trainers.loop` for the whole loop; this module holds the rounds and :func:`run_loop`.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.collect import rollout_spec
from trainers.loop.config import LoopConfig, check_before_loading, train_settings
from trainers.loop.run import LoopRun, read_jsonl
from trainers.loop.table import HEADER, plot_progress, print_row, subset_note
from trainers.loop.validation import validation_tasks

__all__ = ["run_loop", "select_tasks"]


# -------------------------------------------------------------------------------------------- curriculum


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


# ----------------------------------------------------------------------------------------------- rounds


class _Run(LoopRun):
    """One lock-step run: the rows and checkpoint so far, and the rewards the curriculum ranks by."""

    def __init__(
        self,
        cfg: LoopConfig,
        *,
        on_round_end: Callable[[dict[str, Any]], None] | None = None,
        quiet: bool = False,
    ) -> None:
        super().__init__(cfg, quiet=quiet)
        self.on_round_end = on_round_end
        self.all_rows: list[dict[str, Any]] = []
        self.history: dict[str, list[float]] = defaultdict(list)  # task id -> rewards in earlier rounds
        self.uses: dict[str, int] = defaultdict(int)  # task id -> rounds that drew it
        self._tail: Any = None  # follows the store from round to round (see round_sessions)

    def result(self) -> dict[str, Any]:
        return {"rows": self.all_rows, "checkpoint": self.checkpoint, "out": str(self.out)}

    def resume(self) -> int:
        """Pick up after the last finished round (if any); return the round to run first.

        Rows of rounds after it are cut: a round cut short is run again.
        """
        from sdk.rollout import read_results

        state = self.read_state()
        if state:
            self.checkpoint = str(state["checkpoint"])
            self.resident_checkpoint = state.get("resident_checkpoint")
            self.version = int(state.get("policy_version") or 0)
        first = int(state["round"]) + 1 if state else 0
        self.all_rows = [r for r in read_jsonl(self.metrics) if r.get("round", -1) <= first - 1]
        self.rewrite(self.metrics, self.all_rows)
        self.go_on_from(self.all_rows)
        if state:
            self.say(f"resuming after round {state['round']} (checkpoint {self.checkpoint})")
        for rnd in range(1, first):  # earlier rounds' rewards, for the curriculum
            self._remember(read_results(self.rollouts / f"round-{rnd}.jsonl"))
        return first

    def _remember(self, results: list[dict[str, Any]], tasks: list[dict[str, Any]] | None = None) -> None:
        for r in results:
            if isinstance(r.get("reward"), (int, float)):
                self.history[str(r["task_id"])].append(float(r["reward"]))
        drawn = {t["id"] for t in tasks} if tasks is not None else {str(r["task_id"]) for r in results}
        for tid in drawn:
            self.uses[tid] += 1

    # -- rounds ----------------------------------------------------------------------------------

    def rollout(
        self, tasks: list[dict[str, Any]], split: str, group_size: int, *, train: bool = False
    ) -> Any:
        """Run ``split``'s samples; training ones (``train``) get ``malformed_tool_call_penalty``."""
        from sdk.rollout import MALFORMED_TOOL_CALL_PENALTY, RolloutError, run_rollout

        cfg = self.cfg
        results = self.rollouts / f"{split}.jsonl"
        penalty = cfg.malformed_tool_call_penalty if train else 0.0
        try:
            got = run_rollout(
                rollout_spec(cfg, group_size),
                tasks,
                split=split,
                results=results,
                metadata={MALFORMED_TOOL_CALL_PENALTY: penalty} if penalty else None,
                progress=False if self.quiet else _bar_label(split),
            )
        except RolloutError as exc:
            raise UserError(str(exc)) from None
        _stop_if_every_sample_failed(results, split)
        return got

    def finish(self, row: dict[str, Any], *, saved: bool = True) -> None:
        """Save a finished round's row; print it, plot, call back.

        ``saved``: the round's weights are in a checkpoint, so ``state.json`` marks the round done. A round
        after the last checkpoint is run again after a crash (its samples are kept; the training, from the
        checkpoint's weights, optimizer and RNG, comes out the same).
        """
        row["wall_s"] = self.wall_s()
        row["checkpoint"] = self.checkpoint
        row["policy_version"] = self.version
        self.append({self.metrics: [row]})
        if saved:
            self.write_state(
                {
                    "round": row["round"],
                    "checkpoint": self.checkpoint,
                    "resident_checkpoint": self.resident_checkpoint,
                    "policy_version": self.version,
                }
            )
        self.all_rows.append(row)
        trained = self.trainer is not None and self.trainer.resident.trainer is not None
        _mark_best(self.out, self.all_rows, self.trainer.save_servable if trained else None)
        if not self.quiet:
            print_row(row)
        if self.cfg.plot:
            plot_progress(
                self.all_rows,
                self.out / "progress.png",
                f"{self.cfg.agent}: train reward and validation success",
            )
        if self.on_round_end is not None:
            self.on_round_end(row)

    def validate(self, eval_pool: list[dict[str, Any]] | None, rnd: int) -> dict[str, Any]:
        """Evaluate the validation tasks (if any); the row's validation fields and ``eval_s``."""
        t0 = time.time()
        tasks = validation_tasks(self.cfg, eval_pool, first_or_last=rnd in (0, self.cfg.rounds))
        val = self.rollout(tasks, f"eval-round-{rnd}", self.cfg.eval_samples) if tasks else None
        metrics = None if val is None else val.metrics
        return {
            "val_tasks": len(tasks) if val is not None and tasks else None,
            "val_subset": bool(val is not None and eval_pool and len(tasks or ()) < len(eval_pool)),
            "val_success": None if val is None else val.success_rate,
            "val_reward": None if val is None else val.mean_reward,
            "val_pass_at_1": None if metrics is None else metrics.pass_at_1,
            "val_pass_at_1_se": None if metrics is None else metrics.pass_at_1_se,
            "val_malformed_share": None if val is None else val.malformed_share,
            "eval_s": round(time.time() - t0, 1),
        }

    def validation_round(self, eval_pool: list[dict[str, Any]] | None) -> None:
        """Round 0: the starting policy on the validation tasks, nothing trained."""
        val = self.validate(eval_pool, 0)
        self.finish({"round": 0, **val, "train_reward": None, "groups": 0, "steps": 0})

    def round_sessions(self, split: str) -> Any:
        """What a round's export reads: the sessions of ``split`` that ended since the last round's export.

        A tail kept for the run reads only what was appended since (``sdk.store.StoreTail``), so the export
        costs what the round wrote, not the whole store again every round; a store it cannot follow is
        read whole (the export then keeps the split's sessions).
        """
        from sdk.store import StoreTail, TailUnsupported

        if self._tail is False:
            return self.store
        try:
            if self._tail is None:
                self._tail = StoreTail(self.store)
            update = self._tail.read(keep=lambda s: s.metadata.get("split") == split)
        except TailUnsupported:
            self._tail = False
            return self.store
        return update

    def training_round(
        self, rnd: int, pool: list[dict[str, Any]], eval_pool: list[dict[str, Any]] | None, policy: Any
    ) -> None:
        """Collect on this round's tasks, export, train, serve the new weights, validate when due."""
        from sdk.episodes import export
        from sdk.rollout import read_results

        cfg = self.cfg
        t0 = time.time()
        tasks, share = select_tasks(
            pool,
            rnd,
            cfg.tasks_per_round,
            history=self.history,
            uses=self.uses,
            share=cfg.curriculum_share(rnd),
        )
        split = f"round-{rnd}"
        got = self.rollout(tasks, split, cfg.group_size, train=True)
        results = read_results(self.rollouts / f"{split}.jsonl")
        self._remember(results, tasks)
        t_collect = time.time() - t0
        data = self.out / "episodes" / f"{split}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        t_export = time.time()
        summary = export(self.round_sessions(split), data, splits=[split])
        t_export = time.time() - t_export
        groups = _groups_with_signal(results)
        steps, adapter, t1, swap = 0, None, time.time(), {}
        if groups and self.trainer is not None:
            steps, swap = self.train_resident(rnd, data, policy)
        elif groups:
            self.checkpoint, adapter, steps = _train_round(cfg, self, rnd, data, self.checkpoint, groups)
            self.version += 1
            policy.update(self.checkpoint, adapter=adapter, policy_version=self.version)
        if not groups and rnd == cfg.rounds and self.trainer is not None:
            # The last round had nothing to train: the run's final weights are the ones it trained last.
            self.checkpoint = self.trainer.final()
        t_train = time.time() - t1
        saved = self.trainer is None or swap.get("checkpoint_s") is not None
        due = eval_pool and (rnd % cfg.eval_every == 0 or rnd == cfg.rounds)
        val = self.validate(eval_pool if due else None, rnd)
        self.finish(
            {
                "round": rnd,
                "val_success": val["val_success"],
                "val_reward": val["val_reward"],
                "val_pass_at_1": val["val_pass_at_1"],
                "val_pass_at_1_se": val["val_pass_at_1_se"],
                "train_reward": got.mean_reward,
                "train_success": got.success_rate,
                "malformed_share": got.malformed_share,
                "malformed_tool_calls": got.malformed_tool_calls,
                "val_malformed_share": val["val_malformed_share"],
                "val_tasks": val["val_tasks"],
                "val_subset": val["val_subset"],
                "tasks": len(tasks),
                "samples": got.done,
                "errors": got.counts.get("error", 0),
                "timeouts": got.counts.get("timeout", 0),
                "exported": getattr(summary, "written", None),
                "groups": groups,
                "steps": steps,
                "curriculum_share": share,
                "adapter": adapter,
                "collect_s": round(t_collect, 1),
                "export_s": round(t_export, 2),
                "train_s": round(t_train, 1),
                "eval_s": val["eval_s"],
                **swap,
            },
            saved=saved,
        )

    def train_resident(self, rnd: int, data: Path, policy: Any) -> tuple[int, dict[str, Any]]:
        """Train the round on the resident trainer, push the weights, checkpoint when due.

        Returns the steps and the swap's costs (``build_s``, ``push_s``, ``push_bytes``, ``checkpoint_s``).
        """
        cfg = self.cfg
        steps = (cfg.train.get("grpo") or {}).get("max_steps")  # a round's steps when set
        self.version += 1
        done, swap = self.train_version(
            str(data), policy, self.version, what=f"round {rnd}",
            steps=steps if isinstance(steps, int) and steps > 0 else None,
        )  # fmt: skip
        swap["checkpoint_s"] = None
        if rnd % (cfg.checkpoint_every or 1) == 0 or rnd == cfg.rounds:
            self.resident_checkpoint, swap["checkpoint_s"] = self.trainer.checkpoint()
            # What a restarted server starts on: the checkpoint (full weights load as a model), or for LoRA
            # the base, the adapter pushed on it; after the last round a directory that serves anywhere.
            self.checkpoint = self.resident_checkpoint if not self.trainer.lora else cfg.model
            if rnd == cfg.rounds:
                self.checkpoint = self.trainer.final()
        return done.steps, swap


def _bar_label(split: str) -> str:
    """The progress bar of a round's rollout (on a terminal only): ``collect round 3``, ``validate round 0``.

    Example:
        >>> _bar_label("round-3"), _bar_label("eval-round-0")
        ('collect round 3', 'validate round 0')
    """
    kind, _, n = split.rpartition("round-")
    return f"{'validate' if kind else 'collect'} round {n}"


#: Sample statuses that mean the agent or its reward function did not work (``sdk.rollout``).
_FAILED = ("error", "timeout", "reward_error")


def _stop_if_every_sample_failed(results: Path, split: str) -> None:
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


def _mark_best(
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


def _train_round(
    cfg: LoopConfig, run: _Run, rnd: int, data: Path, model: str, groups: int
) -> tuple[str, str | None, int]:
    """One training round through the trainer API: (full-weight checkpoint, adapter or None, steps)."""
    from trainers.settings import make_config

    out = run.out / "train" / f"round-{rnd}"
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


def _groups_with_signal(rows: list[dict[str, Any]]) -> int:
    by_task: dict[str, set[float]] = defaultdict(set)
    for r in rows:
        if isinstance(r.get("reward"), (int, float)):
            by_task[str(r["task_id"])].add(float(r["reward"]))
    return sum(len(v) > 1 for v in by_task.values())


def run_loop(
    config: LoopConfig | dict[str, Any] | str | os.PathLike[str],
    *,
    on_round_end: Callable[[dict[str, Any]], None] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run (or continue) the loop; returns ``{"rows", "checkpoint", "out"}``.

    Re-running with the same ``out`` continues after the last finished round (``state.json``); a round cut
    short runs again (its rollout keeps the samples that finished). Raising ``rounds`` extends a run.
    Third-party progress bars, logs and warnings are turned off for the process
    (:func:`trainers.quiet.quiet_libraries`): the loop prints its own lines only.

    Args:
        config: A :class:`LoopConfig`, a mapping of its fields or a YAML file.
        on_round_end: Called with each round's metrics row after it is saved.
        quiet: Print nothing.

    Raises:
        UserError: Bad settings, a failed training round, a policy server that would not start.

    Example:
        >>> run_loop({"agent": "a:f", "tasks": "t.jsonl", "model": "m", "rounds": 2})  # doctest: +SKIP
    """
    cfg = (
        config
        if isinstance(config, LoopConfig)
        else LoopConfig.from_mapping(dict(config))
        if isinstance(config, dict)
        else LoopConfig.from_yaml(config)
    )
    check_before_loading(cfg)
    if cfg.mode == "async":
        from trainers.loop.continuous import run_async

        return run_async(cfg, on_version=on_round_end, quiet=quiet)
    import sdk
    from trainers.loop.pools import load_pools
    from trainers.quiet import quiet_libraries

    run = _Run(cfg, on_round_end=on_round_end, quiet=quiet)
    run.prepare()
    pool, eval_pool = load_pools(cfg)
    sdk.configure(store=run.store)
    first = run.resume()
    if first > cfg.rounds:
        run.say(f"all {cfg.rounds} rounds are done (raise rounds to continue)")
        return run.result()
    quiet_libraries()  # one row per round: no third-party bars, logs or warnings between them
    policy = run.start_training_side()
    run.say(HEADER)
    if eval_pool and cfg.eval_subset is not None and cfg.eval_subset < len(eval_pool):
        run.say(subset_note(cfg.eval_subset, len(eval_pool), "round 0 and the last round"))
    try:
        if first == 0:
            run.validation_round(eval_pool)
            first = 1
        for rnd in range(first, cfg.rounds + 1):
            run.training_round(rnd, pool, eval_pool, policy)
    finally:
        policy.stop()
        sdk.flush()
    return run.result()
