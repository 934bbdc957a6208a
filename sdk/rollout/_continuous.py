"""Continuous collection: ``concurrency`` samples always in flight over a task set or stream, until stopped.

The batch runner runs a fixed set of (task, sample) pairs and ends; :func:`run_continuous` keeps going, so a
trainer can learn beside it (the loop's ``mode: async``). Samples are taken in blocks of ``spec.group_size``
(one GRPO group): block ``b`` of a task is samples ``b*G .. b*G+G-1``, and each time a task comes round
(the task set cycled in order, or the next task of ``task_stream``) it gets its first block not yet done,
so a task that comes back gets fresh sample indices. The results file, the store and resuming are the batch
runner's: after a kill, the same call skips the pairs in the results file, takes pairs the store finished
from there, marks the attempts cut short superseded, and runs the missing samples of every group the kill
left part-done first, before any new task (a trainer waiting for those groups is never left waiting on a
task that may not come round again: a task stream held back by back-pressure, or a spent budget).

Example:
    >>> import threading
    >>> from sdk.rollout import RolloutSpec
    >>> spec, stop = RolloutSpec("my_agent:solve", group_size=8), threading.Event()
    >>> run_continuous(spec, "tasks.jsonl", results="r.jsonl", stop=stop)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import itertools
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sdk.rollout._run import _finish, _Plan, _prepare
from sdk.rollout._sample import _one_sample, _Progress, _settle_loop
from sdk.rollout._spec import RolloutSpec
from sdk.rollout._summary import RolloutSummary, _append, read_results
from sdk.rollout._tasks import RolloutError, load_tasks

__all__ = ["run_continuous"]

_END = object()  # the task source is exhausted
_POLL_S = 0.05  # how often the run looks at ``stop`` while it waits (a threading.Event cannot be awaited)

Metadata = dict[str, Any] | Callable[[dict[str, Any], int], dict[str, Any]]


class _AnyTask:
    """Every task id: a streamed run resumes the samples of whatever tasks its results file holds."""

    def __contains__(self, item: object) -> bool:
        return True


def run_continuous(
    spec: RolloutSpec,
    tasks: str | os.PathLike[str] | Iterable[dict[str, Any]] = (),
    *,
    results: str | os.PathLike[str],
    stop: threading.Event,
    task_stream: Iterable[dict[str, Any]] | None = None,
    cycle: bool = True,
    split: str = "train",
    metadata: Metadata | None = None,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    store: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> RolloutSummary:
    """Keep ``spec.concurrency`` samples in flight until ``stop`` is set; resumable (as run_rollout).

    Args:
        spec: What runs, as for :func:`sdk.rollout.run_rollout`; ``group_size`` samples per task each
            time it comes round (one GRPO group).
        tasks: The task set, taken ``group_size`` samples per task in order (again and again when
            ``cycle``, with fresh sample indices each round). With ``task_stream``, only where a killed
            run's part-done groups find their tasks (their missing samples run first).
        results: The results file (JSON lines, the batch runner's format); pairs already in it are skipped.
        stop: Set to stop: no sample starts after it, those in flight finish (or time out), then it returns.
        task_stream: An iterable of task dicts, e.g. fed by a curriculum; each task it yields gets its next
            ``group_size`` samples. It may block; a task it yields after ``stop`` is not run.
        cycle: Cycle over ``tasks`` until stopped; False: one pass, then return.
        split: Session metadata ``split``.
        metadata: Extra session metadata, or a callable ``(task, sample) -> dict`` called at each sample's
            start (the loop stamps ``policy_version`` this way).
        on_sample: Called with each results line once it is written (in the runner's thread); its errors are
            reported once and do not stop the run.
        store: Store directory or URI; default: the current configuration.
        progress: Show a progress bar on stderr.

    Returns:
        A :class:`sdk.rollout.RolloutSummary` over the whole results file (``total``: the pairs done).

    Raises:
        RolloutError: Bad agent, reward function, tasks or settings.

    Example:
        >>> run_continuous(spec, "tasks.jsonl", results="r.jsonl", stop=stop)  # doctest: +SKIP
    """
    plan = _prepare(
        spec, tasks, split=split, results=results, store=store,
        metadata=None if callable(metadata) else metadata,
        task_ids=_AnyTask() if task_stream is not None else None,
    )  # fmt: skip
    done = {(str(r["task_id"]), int(r["sample"])) for r in plan.rows}
    plan.rows = []
    first = _part_done(plan.tasks, done, spec.group_size)
    bar = _Progress(progress, None, len(done))  # no total: it runs until stopped
    done.update((t["id"], k) for t, k in first)  # scheduled now: not again when their task comes round
    tasks_in_order = itertools.cycle(plan.tasks) if cycle else iter(plan.tasks)
    source: Iterator[dict[str, Any]] = iter(task_stream) if task_stream is not None else tasks_in_order
    run = _Continuous(plan, stop, metadata if callable(metadata) else None, on_sample, bar)
    pairs = itertools.chain(first, _pairs(source, spec, done, bar))
    try:
        asyncio.run(run.loop(pairs, blocking=task_stream is not None))
    finally:
        bar.close()
        import sdk

        sdk.flush()
    plan.rows = read_results(plan.results)  # the whole file, read again: a long run keeps no rows in memory
    summary = _finish(plan, [], len({(r["task_id"], r["sample"]) for r in plan.rows}), interrupted=False)
    return dataclasses.replace(summary, ran=run.ran)


def _part_done(
    tasks: list[dict[str, Any]], done: set[tuple[str, int]], group_size: int
) -> list[tuple[dict[str, Any], int]]:
    """The missing (task, sample) pairs of the groups an earlier run left part-done, of the known tasks."""
    by_id = {t["id"]: t for t in tasks}
    blocks = sorted({(tid, k // group_size) for tid, k in done if tid in by_id})
    return [
        (by_id[tid], k)
        for tid, b in blocks
        for k in range(b * group_size, (b + 1) * group_size)
        if (tid, k) not in done
    ]


def _pairs(
    source: Iterator[dict[str, Any]], spec: RolloutSpec, done: set[tuple[str, int]], bar: _Progress
) -> Iterator[tuple[dict[str, Any], int]]:
    """(task, sample) pairs: each task as it comes, its first block of ``group_size`` samples not yet done."""
    blocks: dict[str, int] = defaultdict(int)  # the next block to look at, per task id
    group_size = spec.group_size
    for raw in source:
        try:
            (task,) = load_tasks([raw], spec.id_field)
        except RolloutError as exc:
            bar.say(f"warning: a streamed task was skipped: {exc}")
            continue
        tid = task["id"]
        while True:
            first = blocks[tid] * group_size
            blocks[tid] += 1
            todo = [k for k in range(first, first + group_size) if (tid, k) not in done]
            if todo:
                break
        for k in todo:
            yield task, k


class _Continuous:
    """The event loop's side of :func:`run_continuous`: starts samples as others finish, until stopped."""

    def __init__(
        self,
        plan: _Plan,
        stop: threading.Event,
        metadata: Callable[[dict[str, Any], int], dict[str, Any]] | None,
        on_sample: Callable[[dict[str, Any]], None] | None,
        bar: _Progress,
    ) -> None:
        self.plan, self.concurrency, self.stop = plan, plan.spec.concurrency, stop
        self.metadata, self.on_sample, self.bar = metadata, on_sample, bar
        self.ran = 0
        self.warned: set[str] = set()

    async def loop(self, pairs: Iterator[tuple[dict[str, Any], int]], *, blocking: bool) -> None:
        """Keep ``concurrency`` samples running; on ``stop`` start no more and wait for the running ones."""
        running: set[asyncio.Future[Any]] = set()
        feed = _Feed(pairs, self.stop, self.concurrency) if blocking else None
        exhausted = False
        try:
            while not self.stop.is_set():
                if feed is None:
                    while not exhausted and len(running) < self.concurrency:
                        pair = next(pairs, _END)
                        exhausted = pair is _END
                        if not exhausted:
                            running.add(asyncio.ensure_future(self.sample(*pair)))
                else:
                    for pair in feed.ready():
                        exhausted = exhausted or pair is _END
                        if not exhausted and not self.stop.is_set():
                            running.add(asyncio.ensure_future(self.sample(*pair)))
                waiting = running | ({feed.arrival} if feed is not None and not exhausted else set())
                if not waiting:
                    break  # one pass over the tasks is done
                finished, _ = await asyncio.wait(
                    waiting, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED
                )
                ended = finished & running
                running -= ended
                if feed is not None:
                    feed.want(len(ended))
        finally:
            if feed is not None:
                feed.close()
        if running:
            await asyncio.gather(*running)
        await _settle_loop()

    async def sample(self, task: dict[str, Any], k: int) -> None:
        """One sample, its line appended to the results file as it ends (no await in between)."""
        plan = self.plan
        md = plan.metadata
        if self.metadata is not None:
            try:
                md = {**self.metadata(task, k), **plan.metadata}
            except Exception as exc:
                self.warn("metadata", f"the metadata function failed on task {task['id']!r} sample {k}", exc)
        row = await _one_sample(plan.fn, plan.score, task, k, plan.spec, md, self.warned, self.bar)
        _append(plan.results, row)
        self.ran += 1
        self.bar.update(bool(row["success"]))
        if self.on_sample is not None:
            try:
                self.on_sample(row)
            except Exception as exc:
                self.warn("on_sample", f"on_sample failed on task {task['id']!r} sample {k}", exc)

    def warn(self, what: str, message: str, exc: Exception) -> None:
        """One line on stderr the first time ``what`` fails; later failures pass quietly."""
        if what not in self.warned:
            self.warned.add(what)
            self.bar.say(f"warning: {message}: {type(exc).__name__}: {exc} (further failures not reported)")


class _Feed:
    """Pairs of a task stream that may block, pulled by one thread as sample slots free up.

    One thread for the run, not one per pair: samples that end together (a policy server's batch answers
    many at once) are replaced together, each as soon as the stream yields its pair, instead of one thread
    start and event-loop round trip after another (the asynchronous main job's slots stood empty 0.1-0.2 s
    after each such batch, on a 2-vCPU host). It never pulls more pairs than there are free slots, so a stream
    that waits for room (the loop's back-pressure) is not read ahead; pairs that arrive after ``stop`` are
    not run. Runs in a copy of the caller's context, as the stream did before.
    """

    def __init__(self, pairs: Iterator[Any], stop: threading.Event, slots: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._arrived: list[Any] = []  # touched in the event loop's thread only
        self._slots = threading.Semaphore(slots)
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self.arrival: asyncio.Future[Any] = self._loop.create_future()  # done when pairs are ready
        ctx = contextvars.copy_context()
        thread = threading.Thread(
            target=ctx.run, args=(self._pull, pairs, stop), name="tracerl-rollout-feed", daemon=True
        )
        thread.start()

    def want(self, n: int) -> None:
        """``n`` more slots are free."""
        for _ in range(n):
            self._slots.release()

    def ready(self) -> list[Any]:
        """The pairs (and maybe ``_END``) that arrived; raises what the stream raised."""
        if not self.arrival.done():
            return []
        self.arrival = self._loop.create_future()
        if self._error is not None:
            raise self._error
        out, self._arrived = self._arrived, []
        return out

    def close(self) -> None:
        """Stop pulling: the thread ends at its next look (a stream blocked in ``next``, with ``stop``)."""
        self._closed.set()
        if not self.arrival.done():
            self.arrival.cancel()

    def _pull(self, pairs: Iterator[Any], stop: threading.Event) -> None:
        try:
            while not (stop.is_set() or self._closed.is_set()):
                if not self._slots.acquire(timeout=_POLL_S):
                    continue
                pair = next(pairs, _END)
                self._deliver(pair, None)
                if pair is _END:
                    return
        except BaseException as exc:  # raised in the event loop's thread, as the stream's error
            self._deliver(None, exc)

    def _deliver(self, pair: Any, error: BaseException | None) -> None:
        def put() -> None:  # in the event loop's thread
            if error is None:
                self._arrived.append(pair)
            else:
                self._error = error
            if not self.arrival.done():
                self.arrival.set_result(None)

        with contextlib.suppress(RuntimeError):  # the loop has closed: the run is over
            self._loop.call_soon_threadsafe(put)
