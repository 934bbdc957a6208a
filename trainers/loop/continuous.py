"""The asynchronous loop (``mode: async``): the agents keep running while the trainer trains.

Three processes (four with a policy server of its own), the loop's with two threads:

- the **collector** (``sdk.rollout.run_continuous``, in its own process: see
  :mod:`trainers.loop.collect`) keeps ``concurrency`` samples in flight over the training tasks
  (cycling), each session stamped with the policy version being served (metadata ``policy_version``);
- the **trainer** (the main thread) polls a :class:`~trainers.data.stream.StreamingSource` on the store;
  once at least one batch of groups with reward spread is there, it trains ``sync_every`` batches of
  them (``train.grpo.num_train_epochs`` passes, 1 by default) on the loop's resident trainer
  (:mod:`trainers.loop.training`: model, optimizer, schedule and RNG kept across versions) and pushes the
  weights to the policy server as version N+1, as tensors (in place: requests running finish on the old
  weights); every ``checkpoint_every`` versions (10) and at the end it writes a recovery checkpoint;
- **validation** on the held-out tasks every ``eval_every`` versions runs beside training in a worker
  process kept for the run (:mod:`trainers.loop.validation`; its samples run on whatever version is served
  while they run; one due while another runs validates the version served when that one ends; the last,
  after training stops, is exact).

Durability (kill -9 anywhere, then the same command): each version appends its ``metrics.jsonl`` rows and
``trained_samples.jsonl`` lines; at a checkpoint ``state.json`` is replaced atomically after the checkpoint,
the cursor (``train/v-N/cursor.json``) and the lines are written; on restart, rows and lines of versions
after the last checkpoint are cut, the trainer continues from the checkpoint, its cursor is read back, and
groups taken after it are offered again — so no
(task, sample) is trained twice (``trained_samples.jsonl`` says which version trained it) and every
completed one is either trained or listed in ``dropped_samples.jsonl`` with its reason. The collector's
results files and the store resume as the rollout runner does (an interrupted attempt is superseded).

Metrics per optimizer step in ``metrics.jsonl`` (``kind: "train"``): ``step``, ``policy_version`` (the
version the step produces), ``loss``, ``reward``, ``is_ratio_mean``, ``is_ratio_max``,
``is_truncated_frac``, and for its version ``staleness_hist`` ({versions behind: groups}),
``groups_dropped_stale``, ``samples_per_s``, ``trainer_idle_pct``, ``collector_idle_pct``,
``malformed_tool_calls`` and ``malformed_share`` (of the samples that ended meanwhile), and the swap's
costs ``build_s``, ``train_s``, ``push_s``, ``push_bytes``, ``checkpoint_s``; validation rows
have ``kind: "eval"``. Every row has ``wall_s``, the loop's seconds so far (a resumed run goes on from
its last row, as the lock-step loop's rows do). ``progress.png`` shows validation success and staleness by
version.

Example:
    >>> from trainers.loop import run_loop
    >>> run_loop({"agent": "a:f", "tasks": "t.jsonl", "model": "m", "mode": "async"})  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.errors import UserError
from trainers.loop.collect import _Collector, _Gate, _Version, read_jsonl, write_policy_env
from trainers.loop.config import planned_steps, train_settings
from trainers.loop.training import LoopTrainer, is_resident, start_policy
from trainers.loop.validation import Validator

__all__ = ["run_async"]

# The trainer's sleep between polls while it waits for groups. 0.1 s was tried (a poll is a few ms now
# that the source follows the store): in 6 runs each against 6 at 0.5 s the time to the held-out target
# and the final success did not move beyond the runs' noise (tests/bench/RESULTS.md), so it stays.
_POLL_S = 0.5


class _AsyncRun:
    """Files, resume and the per-version commit of one asynchronous run."""

    def __init__(self, cfg: Any, quiet: bool) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.quiet = quiet
        self.store = self.out / "store"
        self.rollouts = self.out / "rollouts"
        self.results = _ResultsTail(self.rollouts)  # the collector's results, read once each
        self.metrics = self.out / "metrics.jsonl"
        self.trained = self.out / "trained_samples.jsonl"
        self.dropped = self.out / "dropped_samples.jsonl"
        self.state_path = self.out / "state.json"
        self.version = 0
        self.steps = 0
        self.checkpoint = cfg.model  # what a restarted server starts on
        self.resident_checkpoint: str | None = None  # the resident trainer's recovery checkpoint
        self.committed = 0  # the last version in a checkpoint (state.json): later ones are redone
        self.trainer: Any = None  # trainers.loop.training.LoopTrainer (the trl backend)
        self.final: str | None = None  # the final weights saved to serve anywhere (LoRA: merged once)
        self.cursor: dict[str, Any] | None = None
        self.t0 = time.time()  # rows' wall_s: seconds since this process started the loop

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def resume(self) -> None:
        """Read the last committed version; cut what later versions wrote before a crash."""
        from trainers.data.stream import sample_key

        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_path.read_text())
            self.version, self.steps = int(state["version"]), int(state["steps"])
            self.committed = self.version
            self.checkpoint = str(state["checkpoint"])
            self.resident_checkpoint = state.get("resident_checkpoint")
            cursor = state.get("cursor")
            self.cursor = json.loads(Path(cursor).read_text()) if cursor else None
            self.say(f"resuming after version {self.version} (checkpoint {self.checkpoint})")
        # The cursor is the ledger: trained and dropped lines it does not hold were written by a version (or
        # the last drops) that never committed; those samples are offered again.
        cursor = self.cursor or {}
        decided = set(cursor.get("taken") or ()) | set(cursor.get("dropped") or ())
        for path in (self.metrics, self.trained, self.dropped):
            rows = read_jsonl(path)
            if path == self.metrics:
                kept = [r for r in rows if int(r.get("policy_version", 0)) <= self.version]
            else:
                kept = [r for r in rows if sample_key(r["rollout"], r["task_id"], r["sample"]) in decided]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            if path == self.metrics:  # wall_s goes on from the last kept row, as the lock-step loop's
                self.t0 = time.time() - max((float(r.get("wall_s") or 0) for r in kept), default=0.0)

    def append(self, lines: dict[Path, list]) -> None:
        """Append a version's metrics rows and trained/dropped lines (cut on resume unless committed)."""
        for path, rows in lines.items():
            with path.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())

    def commit(
        self,
        version: int,
        checkpoint: str,
        steps: int,
        cursor: dict[str, Any],
        lines: dict[Path, list],
        name: str = "cursor.json",
        resident_checkpoint: str | None = None,
    ) -> None:
        """Save a version: cursor beside its checkpoint, its lines, then ``state.json`` (the commit point)."""
        vdir = self.out / "train" / f"v-{version}"
        cursor_path = vdir / name
        _atomic_write(cursor_path, json.dumps(cursor))
        self.append(lines)
        state = {"version": version, "steps": steps, "checkpoint": checkpoint, "cursor": str(cursor_path)}
        if resident_checkpoint is not None:
            state["resident_checkpoint"] = resident_checkpoint
            self.resident_checkpoint = resident_checkpoint
        _atomic_write(self.state_path, json.dumps(state, indent=2))
        self.version, self.steps, self.checkpoint, self.cursor = version, steps, checkpoint, cursor
        self.committed = version
        for old in (self.out / "train").glob("v-*"):  # keep the served weights and the ones before
            n = old.name[2:]
            if n.isdigit() and int(n) < version - 1:
                shutil.rmtree(old, ignore_errors=True)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _groups_per_step(cfg: Any) -> int:
    grpo = cfg.train.get("grpo") or {}
    batch = grpo.get("per_device_train_batch_size")
    if isinstance(batch, int) and batch >= cfg.group_size:
        return max(1, batch // cfg.group_size)
    return max(1, 8 // cfg.group_size)


def _backlog_limit(cfg: Any, need: int) -> int:
    """Ended samples the trainer may have waiting before the collector pauses.

    The trainer takes ``need`` groups per version, oldest first, so a sample started behind ``B`` others
    is trained about ``B / (need * group_size)`` versions later: beyond ``max_staleness`` versions' worth,
    less the samples still in flight, it would only be collected to be dropped as stale.
    """
    per_version = need * cfg.group_size
    return max(per_version, cfg.max_staleness * per_version - cfg.concurrency)


def _version_episodes(groups: list[Any]) -> list[dict[str, Any]]:
    """The episodes of a version's groups, each group one GRPO group even when its task recurs."""
    from sdk.episodes import build_episodes

    rows = []
    for g in groups:
        for ep in build_episodes(g.sessions):
            ep["task_id"] = g.key
            rows.append(ep)
    return rows


def _train_resident(
    cfg: Any, run: _AsyncRun, n: int, groups: list[Any], policy: Any
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """Train version ``n`` on the resident trainer and serve it; returns (steps, log rows, swap costs).

    ``num_train_epochs`` passes over the version's groups (as the lock-step loop makes over a round's); the
    steps follow from the training sequences the groups made, not from the number of samples.
    """
    passes = max(1, int((cfg.train.get("grpo") or {}).get("num_train_epochs", 1) or 1))
    try:
        done = run.trainer.train(_version_episodes(groups), passes=passes)
    except UserError as exc:
        raise UserError(f"training version {n} failed: {exc}") from None
    swap = {"build_s": round(done.build_s, 2), "train_s": round(done.train_s, 2)}
    swap.update(run.trainer.publish(policy, n))
    steps = [r for r in done.log_rows if "loss" in r]
    return done.steps, steps, swap


def _checkpoint(run: _AsyncRun, source: Any, lines: dict[Path, list], name: str = "cursor.json") -> float:
    """Write the resident trainer's checkpoint and commit the version it holds; returns its seconds."""
    path, seconds = run.trainer.checkpoint()
    _commit_checkpoint(run, source, lines, path, name)
    return seconds


def _commit_checkpoint(
    run: _AsyncRun, source: Any, lines: dict[Path, list], path: str, name: str = "cursor.json"
) -> None:
    """Commit ``run.version`` with its lines and the checkpoint ``path`` holding its weights."""
    servable = path if not run.trainer.lora else run.cfg.model  # a LoRA checkpoint is pushed on the base
    run.commit(
        run.version, servable, run.trainer.global_step, source.state(), lines, name, resident_checkpoint=path
    )


_RERUN = "re-run the same command to continue after the last checkpoint"


def _check_server(policy: Any) -> None:
    """Stop when a policy server child process has exited (its samples would only fail meanwhile)."""
    code = policy.exit_code()
    if code is not None:
        raise UserError(f"the policy server exited (code {code}); {_RERUN}")


class _ResultsTail:
    """The rows appended to the collector's results files (``rollouts/stream*.jsonl``) since the last read.

    Each version's collector load reads only these: a sample in ``[t0, t1]`` ended after ``t0``, so it was
    written after the previous version's read (the files grow by a line per sample for the whole run).
    """

    def __init__(self, rollouts: Path) -> None:
        self.rollouts = rollouts
        self._offsets: dict[str, int] = {}

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.rollouts.glob("stream*.jsonl")):
            offset = self._offsets.get(path.name, 0)
            with contextlib.suppress(OSError), path.open("rb") as fh:
                fh.seek(offset)
                for raw in fh:
                    if not raw.endswith(b"\n"):
                        break  # being written: read it next time
                    offset += len(raw)
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(raw))
            self._offsets[path.name] = offset
        return out


def _collector_load(rows: list[Any], t0: float, t1: float, concurrency: int) -> tuple[float, float]:
    """Samples per second and the collector's idle share (empty sample slots) in ``[t0, t1]``."""
    busy, n = 0.0, 0
    for r in rows:
        end = float(r.get("ts") or 0)
        start = end - float(r.get("seconds") or 0)
        overlap = min(end, t1) - max(start, t0)
        if overlap > 0:
            busy += overlap
        n += t0 < end <= t1
    span = max(t1 - t0, 1e-9)
    return n / span, max(0.0, 100.0 * (1 - busy / (concurrency * span)))


def _take(
    cfg: Any,
    source: Any,
    version: _Version,
    collector: _Collector,
    gate: _Gate,
    policy: Any,
    next_version: int,
) -> tuple[list, list, float]:
    """Poll until ``sync_every`` batches of groups with reward spread are there; release the surplus.

    Returns ``(groups, drop lines, idle seconds)``, the oldest groups first; fewer groups (maybe none)
    once the collector has finished and nothing is left to wait for.
    """
    per_step = _groups_per_step(cfg)
    need = per_step * cfg.sync_every
    groups: list[Any] = []
    drops: list[dict[str, Any]] = []
    idle = 0.0
    while True:
        collector.check()
        _check_server(policy)
        done = not collector.alive()  # read before polling: nothing new can come after
        t = time.time()
        batch = source.poll(version.get(), closed=done)  # closed: part-done groups are dropped, not awaited
        polled = time.time() - t
        drops += [{**d, "policy_version": next_version} for d in batch.dropped_samples]
        for g in batch.groups:
            if len({s.reward for s in g.sessions}) > 1:
                groups.append(g)
            else:  # equal rewards: zero advantage, nothing to learn from
                drops += [_drop_line(g, s, "no_reward_spread", next_version) for s in g.sessions]
        groups.sort(key=lambda g: (g.policy_version, g.key))
        take = need if len(groups) >= need else len(groups) // per_step * per_step if done else 0
        if take or (done and batch.pending == 0) or (done and groups):
            take = take or len(groups)
            source.release(groups[take:])
            gate.set_backlog(batch.backlog + cfg.group_size * len(groups[take:]))
            return groups[:take], drops, idle
        gate.set_backlog(batch.backlog + cfg.group_size * len(groups))
        pause = max(_POLL_S, 2 * polled)  # re-reading a large store: at most a third of the time
        time.sleep(pause)
        idle += pause + polled


def _drop_line(g: Any, s: Any, reason: str, version: int) -> dict[str, Any]:
    return {
        "rollout": s.metadata.get("rollout") or "",
        "task_id": g.task_id,
        "sample": s.sample,
        "session_id": s.session_id,
        "reason": reason,
        "policy_version": version,
    }


def _malformed(rows: list[Any], t0: float, t1: float) -> dict[str, Any]:
    """Malformed tool calls of the collector's samples that ended in ``[t0, t1]`` (trained or dropped)."""
    from sdk.rollout import summarize

    ended = [r for r in rows if t0 < float(r.get("ts") or 0) <= t1]
    got = summarize(ended, split="train", results_path="", total=len(ended))
    return {"malformed_tool_calls": got.malformed_tool_calls, "malformed_share": got.malformed_share}


def _malformed_words(share: float | None) -> str:
    return "" if share is None else f", {100 * share:.1f}% of tool calls malformed"


def _version_rows(
    run: _AsyncRun,
    n: int,
    groups: list,
    drops: list,
    steps: list,
    load: tuple[float, float],
    idle_pct: float,
    malformed: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The metrics rows (one per optimizer step) and ``trained_samples.jsonl`` lines of version ``n``."""
    from trainers.data.stream import session_version

    hist = Counter(g.staleness for g in groups)
    shared = {
        "policy_version": n,
        "groups": len(groups),
        "staleness_hist": {str(k): v for k, v in sorted(hist.items())},
        "groups_dropped_stale": len(
            {
                (d["rollout"], d["task_id"], d["sample"] // run.cfg.group_size)
                for d in drops
                if d["reason"] == "stale"
            }
        ),
        "samples_dropped": dict(Counter(d["reason"] for d in drops)),
        **malformed,
        "samples_per_s": round(load[0], 3),
        "trainer_idle_pct": round(idle_pct, 1),
        "collector_idle_pct": round(load[1], 1),
        "wall_s": round(time.time() - run.t0, 1),
    }
    rows = []
    for i, r in enumerate(steps):
        rows.append(
            {
                "kind": "train",
                "step": run.steps + i + 1,
                **shared,
                "loss": r.get("loss"),
                "reward": r.get("reward"),
                "is_ratio_mean": r.get("tis/is_ratio_mean"),
                "is_ratio_max": r.get("tis/is_ratio_max"),
                "is_truncated_frac": r.get("tis/is_truncated_frac"),
            }
        )
    trained = [
        {
            "rollout": s.metadata.get("rollout") or "",
            "task_id": g.task_id,
            "sample": s.sample,
            "session_id": s.session_id,
            "group": g.key,
            "policy_version": n,
            "behaviour_version": session_version(s),
            "staleness": g.staleness,
        }
        for g in groups
        for s in g.sessions
    ]
    return rows, trained


def run_async(
    cfg: Any,
    *,
    on_version: Callable[[dict[str, Any]], None] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run (or continue) the asynchronous loop for a validated ``LoopConfig`` with ``mode: async``.

    Returns ``{"rows", "checkpoint", "out", "version"}``; ``on_version`` is called with each version's last
    metrics row after its commit.

    Example:
        >>> run_async(LoopConfig(agent="a:f", tasks="t", model="m", mode="async"))  # doctest: +SKIP
    """
    import sdk
    from trainers.data.stream import StreamingSource
    from trainers.loop.pools import load_pools
    from trainers.quiet import quiet_libraries

    if cfg.curriculum is not None:  # also when --mode async overrides a lock-step config
        raise UserError("curriculum is not supported with mode: async")
    run = _AsyncRun(cfg, quiet)
    run.out.mkdir(parents=True, exist_ok=True)
    run.rollouts.mkdir(exist_ok=True)
    (run.out / "loop-config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    pool, eval_pool = load_pools(cfg)
    sdk.configure(store=run.store)
    run.resume()
    finished = _finished(cfg, run)
    if finished and (_validated(run) or not eval_pool):
        run.say("the run is complete (raise max_versions or max_steps to continue)")
        return _result(run)
    quiet_libraries()
    version = _Version(run.version)
    source = StreamingSource(
        run.store,
        group_size=cfg.group_size,
        max_staleness=cfg.max_staleness,
        reward_wait_s=cfg.reward_wait_s,
        state=run.cursor,
    )
    policy = _start_training_side(cfg, run)
    validator = Validator(cfg, run, eval_pool, version, lambda: _finished(cfg, run))
    need = _groups_per_step(cfg) * cfg.sync_every
    budget = None if cfg.max_samples is None else -(-cfg.max_samples // cfg.group_size)
    gate = _Gate(_backlog_limit(cfg, need), budget)
    unfreeze = _freeze_gc()
    # A run killed after its last commit but before its final validation only validates (and plots).
    collector = _Collector(cfg, pool, run.out, version, gate) if not finished else None
    try:
        if run.version == 0 and not any(r.get("kind") == "eval" for r in read_jsonl(run.metrics)):
            validator.start(0)
        while collector is not None and not _finished(cfg, run):
            if not _one_version(cfg, run, source, version, policy, collector, validator, gate, on_version):
                run.say("the collector's sample budget is spent and no group is left to train on")
                break
        if run.committed < run.version:  # the end: always a checkpoint
            with validator.lock:
                _checkpoint(run, source, {})
        run.final = run.trainer.final()
        if collector is not None:
            collector.join(timeout=None if cfg.timeout is None else 4 * cfg.timeout + 60)
        validator.wait()
        if not _validated(run):
            validator.evaluate(run.version, alone=True)  # nothing collects or trains now: exact for it
    finally:
        if collector is not None:  # after a failure: the running samples are superseded by the next run
            collector.join(timeout=5)
        validator.close(timeout=0)  # after a failure: a validation may still run
        policy.stop()
        sdk.flush()
        if unfreeze:
            gc.unfreeze()
    if cfg.plot:
        from trainers._plots import plot_async_progress

        plot_async_progress(read_jsonl(run.metrics), run.out / "progress.png", f"{cfg.agent} (async)")
    return _result(run)


def _freeze_gc() -> bool:
    """Freeze what exists now for the garbage collector; whether the loop unfreezes it when it returns.

    Each version's trainer runs a full garbage collection (accelerate's free_memory); with torch, TRL and
    the agents' frameworks loaded that is ~0.3 s of every version. What exists now lives as long as the
    loop does, so the collector need not scan it again. A caller's own freeze is left alone.
    """
    unfreeze = gc.get_freeze_count() == 0
    gc.freeze()
    return unfreeze


def _tell_agents(policy: Any, env: Path) -> None:
    """Where the policy is, for this process and the collector's: once, as the name and address stay."""
    from trainers.serve.policy import export_env

    export_env(policy)
    write_policy_env(env)


def _start_training_side(cfg: Any, run: _AsyncRun) -> Any:
    """The resident trainer (from the last checkpoint when resuming) and the policy server serving it."""
    from trainers.serve.policy import make_policy

    settings = train_settings(cfg, cfg.model, run.out / "train")
    resumed = run.resident_checkpoint
    if not is_resident(settings):
        raise UserError("mode: async trains with the resident trl trainer: set train.backend to trl")
    if resumed is None and run.checkpoint != cfg.model:
        raise UserError(
            f"{run.out} holds a run of an older tracerl (checkpoints per version): use a new out directory"
        )
    run.trainer = LoopTrainer(settings, planned_steps=planned_steps(cfg), resume=resumed)
    policy = make_policy(cfg.policy, run.checkpoint, log_dir=str(run.out))
    policy.policy_version = run.version  # the resumed weights are served as their version
    start_policy(policy, run.trainer)
    run.trainer.serve_resumed(policy, run.version)
    _tell_agents(policy, run.out / "policy-env.json")
    return policy


def _one_version(
    cfg: Any,
    run: _AsyncRun,
    source: Any,
    version: _Version,
    policy: Any,
    collector: _Collector,
    validator: Validator,
    gate: _Gate,
    on_version: Callable[[dict[str, Any]], None] | None,
) -> bool:
    """Take groups, train ``sync_every`` batches, commit the version, publish it, validate when due.

    Returns ``False`` when the collector has finished (sample budget) and no group is left.
    """
    n = run.version + 1
    t0 = time.time()
    groups, drops, idle = _take(cfg, source, version, collector, gate, policy, n)
    if not groups:  # the end: the last drops are committed with the version trained last
        lines = {run.dropped: [{**d, "policy_version": run.version} for d in drops]}
        with validator.lock:
            if run.trainer.resident.trainer is not None:
                _checkpoint(run, source, lines, name="cursor-end.json")
            else:  # nothing trained in this process: the drops go with the version trained last
                run.commit(run.version, run.checkpoint, run.steps, source.state(), lines, "cursor-end.json")
        return False
    taken = (groups, drops, idle)
    return _resident_version(cfg, run, n, t0, taken, source, version, policy, validator, on_version)


def _resident_version(
    cfg: Any,
    run: _AsyncRun,
    n: int,
    t0: float,
    taken: tuple[list, list, float],
    source: Any,
    version: _Version,
    policy: Any,
    validator: Validator,
    on_version: Callable[[dict[str, Any]], None] | None,
) -> bool:
    """Version ``n`` on the resident trainer: train, push the weights, checkpoint every ``checkpoint_every``.

    Between checkpoints a version's rows and lines are appended but not committed: after a crash the
    versions since the last checkpoint are trained again from it (their groups are offered again).
    """
    groups, drops, idle = taken
    steps, log_rows, swap = _train_resident(cfg, run, n, groups, policy)
    t1 = time.time()
    version.set(n)  # the collector stamps new samples with it from now on
    ended = run.results.rows()
    load = _collector_load(ended, t0, t1, cfg.concurrency)
    idle_pct = 100 * idle / max(t1 - t0, 1e-9)
    rows, trained = _version_rows(run, n, groups, drops, log_rows, load, idle_pct, _malformed(ended, t0, t1))
    lines = {run.metrics: rows, run.trained: trained, run.dropped: drops}
    with validator.lock:
        run.version, run.steps = n, run.trainer.global_step
        path = None
        if n % (cfg.checkpoint_every or 10) == 0:
            path, swap["checkpoint_s"] = run.trainer.checkpoint()
        for r in rows:
            r.update(swap)
        if path is not None:  # the lines first, then state.json: the commit point
            _commit_checkpoint(run, source, lines, path)
        else:
            run.append(lines)
    last = rows[-1] if rows else {"policy_version": n, **swap}
    run.say(
        f"version {n}: {len(groups)} groups, staleness {last.get('staleness_hist')}, "
        f"dropped {last.get('samples_dropped') or {}}{_malformed_words(last.get('malformed_share'))}, "
        f"{t1 - t0:.1f} s (swap {swap['push_s']:.2f} s)"
    )
    if n % cfg.eval_every == 0 and not _finished(cfg, run):
        validator.start(n)
    if on_version is not None:
        on_version(last)
    return True


def _validated(run: _AsyncRun) -> bool:
    """Whether the last committed weights have a validation row (the run's result)."""
    rows = read_jsonl(run.metrics)
    return any(r.get("kind") == "eval" and r.get("policy_version") == run.version for r in rows)


def _finished(cfg: Any, run: _AsyncRun) -> bool:
    if cfg.max_steps is not None and run.steps >= cfg.max_steps:
        return True
    limit = cfg.max_versions
    if limit is None and cfg.max_samples is None and cfg.max_steps is None:
        limit = cfg.rounds
    return limit is not None and run.version >= limit


def _result(run: _AsyncRun) -> dict[str, Any]:
    return {
        "rows": read_jsonl(run.metrics),
        "checkpoint": run.final or run.checkpoint,
        "out": str(run.out),
        "version": run.version,
    }
