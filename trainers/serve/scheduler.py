"""The engine's admission and scheduling: which requests run, on which path, with which weights, and when.

At most :attr:`Batching.max_pending` requests are admitted at once; more wait for a place (back-pressure),
and one that waits longer than ``admit_timeout_s`` is refused with :class:`EngineBusy`. An admitted request
runs on one of two paths, both sampling on the model's device (:mod:`trainers.serve.sampling`):

- *paged*: transformers' continuous batching (:mod:`trainers.serve.paged`): requests join and leave the
  running batch at every step, the KV cache is paged. It serves base-weight requests without
  ``top_logprobs`` while no adapter is loaded; the default on an accelerator.
- *batch* (:mod:`trainers.serve.batch`): a running batch of left-padded rows over one KV cache, one set of
  weights at a time; requests for those weights join it at the next step, rows leave when done, and a
  common prompt prefix is prefilled once. It serves everything else, and every request on CPU, where it
  measured faster for small models (``tests/bench/RESULTS.md``, "Policy engine"). While requests for
  another adapter wait, the batch takes no more rows and drains, then theirs runs.

A change of weights runs inside :meth:`Scheduler.hold`: it waits until the requests generating on the old
weights are done (new ones wait meanwhile), so every response's tokens come from one version, the one it
reports.

Example:
    >>> sched = Scheduler(weights, Batching(max_batch=8))  # doctest: +SKIP
    >>> sched.run([Request([1, 2, 3], max_tokens=4, slot="base")])[0].token_ids  # doctest: +SKIP
    [5, 9, 2]
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainers.serve.batch import PrefixCache, RunningBatch
from trainers.serve.request import SamplingParams
from trainers.serve.sampling import SEED_BITS, new_seed

if TYPE_CHECKING:
    from trainers.serve.served import ServedWeights

__all__ = ["Batching", "EngineBusy", "Generation", "Request", "Scheduler"]


class EngineBusy(RuntimeError):
    """The engine holds its most requests and none finished in time (HTTP 429: back-pressure).

    Example:
        >>> str(EngineBusy("busy"))
        'busy'
    """


@dataclass
class Batching:
    """How requests are admitted and batched.

    Args:
        max_batch: Most rows per forward.
        wait_s: How long an idle batch path waits for more requests before it starts (later ones join the
            running batch).
        paged: Use the paged path (None: on an accelerator only).
        max_pending: Most requests admitted at once (None: ``4 * max_batch``).
        admit_timeout_s: How long a request waits for a place before :class:`EngineBusy`.

    Example:
        >>> Batching(max_batch=8).max_pending
        32
    """

    max_batch: int = 64
    wait_s: float = 0.002
    paged: bool | None = None
    max_pending: int | None = None
    admit_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        self.max_pending = self.max_pending or 4 * self.max_batch


@dataclass
class Generation:
    """One sampled completion, with the version of the weights that produced it.

    Example:
        >>> Generation([5, 2], [-0.3, -0.1], policy_version=3).finish_reason
        'stop'
    """

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "stop"
    policy_version: int = 0
    text: str | None = None  # set when a stop string cut the completion: its text before the string


@dataclass
class Request:
    """One completion to sample on slot ``slot``'s weights; the scheduler fills in ``result`` or ``error``.

    Example:
        >>> Request([1, 2], max_tokens=4, seed=7).top_p
        1.0
    """

    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    seed: int = 0
    slot: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None

    @classmethod
    def choices(cls, prompt_ids: list[int], p: SamplingParams, slot: str, room: int) -> list[Request]:
        """The ``p.n`` requests of one prompt (seeds ``seed + i``), each at most ``room`` tokens long.

        Example:
            >>> [r.seed for r in Request.choices([1], SamplingParams(n=2, seed=5), "base", 8)]
            [5, 6]
        """
        seed = new_seed() if p.seed is None else p.seed
        return [
            cls(list(prompt_ids), min(p.max_tokens, room), p.temperature, p.top_p, p.top_logprobs,
                (seed + i) % (1 << SEED_BITS), slot)
            for i in range(p.n)
        ]  # fmt: skip


def _finish(reqs: list[Request], error: BaseException) -> None:
    """Fail ``reqs`` with ``error`` (their callers raise it)."""
    for r in reqs:
        r.error = error
        r.done.set()


class Scheduler:
    """Admits requests and serves them on ``weights`` by the paged or the batch path (a worker thread).

    Args:
        weights: What is served (read at every batch: a change of weights is seen from the next one on).
        batching: The admission bound and batch sizes.

    Example:
        >>> Scheduler(weights, Batching(paged=False)).paged  # doctest: +SKIP
        False
    """

    def __init__(self, weights: ServedWeights, batching: Batching) -> None:
        self.weights, self.batching = weights, batching
        self.paged = weights.device.type != "cpu" if batching.paged is None else bool(batching.paged)
        self.lock = threading.Lock()  # held by the batch path while it generates, and by a change of weights
        self._queue: queue.Queue[Request] = queue.Queue()  # bounded by the admission semaphore below
        self._admit = threading.BoundedSemaphore(batching.max_pending)
        self._swap = threading.Condition()  # guards _in_paged and _swapping
        self._in_paged, self._swapping = 0, False
        # Swaps waiting for the batch path's lock: meanwhile the running batch takes no new rows.
        self._waiting_swaps = 0
        # The batch path's last shared prompt prefix, emptied whenever weights change.
        self.prefix = PrefixCache()
        self.pool: Any = None
        self.renew()
        threading.Thread(target=self._worker, name="tracerl-engine", daemon=True).start()

    def renew(self) -> None:
        """New base weights: a paged pool on them (call while holding the weights, or before serving)."""
        self.close()
        if self.paged:
            from trainers.serve.paged import PagedPool

            w, max_len = self.weights, min(self.weights.context_length, 2048)
            self.pool = PagedPool(
                w.model, sorted(w.stop_ids), max_batch=self.batching.max_batch, max_len=max_len
            )

    def close(self) -> None:
        """Stop the paged pool's thread (the batch path needs nothing closed).

        Example:
            >>> sched.close()  # doctest: +SKIP
        """
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the weights still: the batch path's lock, and the paged path drained (new requests wait).

        Example:
            >>> with sched.hold():  # doctest: +SKIP
            ...     weights.push(tensors)
        """
        with self._swap:
            self._waiting_swaps += 1
        try:
            with self.lock:
                with self._swap:
                    self._swapping = True
                    self._swap.wait_for(lambda: self._in_paged == 0)
                try:
                    yield
                finally:
                    self.prefix.clear()
                    with self._swap:
                        self._swapping = False
        finally:
            with self._swap:
                self._waiting_swaps -= 1
                self._swap.notify_all()

    def run(self, reqs: list[Request]) -> list[Generation]:
        """Admit ``reqs`` (waiting for places), serve them on the paged or the batch path; their results.

        Raises:
            EngineBusy: No place came free within ``admit_timeout_s``.

        Example:
            >>> sched.run(Request.choices(prompt_ids, params, "base", room=100))  # doctest: +SKIP
        """
        admitted, timeout = 0, self.batching.admit_timeout_s
        try:
            for _ in reqs:
                if not self._admit.acquire(timeout=timeout):
                    raise EngineBusy(f"the engine is at its limit of concurrent requests for {timeout} s")
                admitted += 1
            gens = self._run_paged(reqs)
            if gens is not None:
                return gens
            for r in reqs:
                self._queue.put(r)
            for r in reqs:
                r.done.wait()
            for r in reqs:
                if r.error is not None:
                    raise r.error
            return [r.result for r in reqs if r.result is not None]
        finally:
            for _ in range(admitted):
                self._admit.release()

    def _run_paged(self, reqs: list[Request]) -> list[Generation] | None:
        """Serve on the paged path, or None when it cannot (no pool, adapters loaded, top logprobs asked)."""
        with self._swap:
            self._swap.wait_for(lambda: not self._swapping)
            slots = self.weights.slots
            if self.pool is None or len(slots) > 1 or any(r.top_logprobs for r in reqs):
                return None
            self._in_paged += len(reqs)
            pool, version = self.pool, slots.base.version
        try:
            tickets = [pool.submit(r.prompt_ids, max_tokens=r.max_tokens, temperature=r.temperature,
                                   top_p=r.top_p, seed=r.seed) for r in reqs]  # fmt: skip
            gens = []
            for t in tickets:
                ids, lps, finish = pool.result(t)
                gens.append(Generation(ids, lps, [], finish, version))
            return gens
        finally:
            with self._swap:
                self._in_paged -= len(reqs)
                self._swap.notify_all()

    def _worker(self) -> None:
        pending: deque[Request] = deque()
        while True:
            if not pending:
                pending.append(self._queue.get())
            self._gather(pending, self.batching.wait_s)
            with self._swap:  # a waiting swap goes first (the batch it waited for is done)
                self._swap.wait_for(lambda: not self._waiting_swaps)
            name = pending[0].slot
            try:
                self._serve(name, pending)
            except Exception as exc:  # its weights could not be served: its requests fail, the worker goes on
                failed = [r for r in pending if r.slot == name]
                for r in failed:
                    pending.remove(r)
                _finish(failed, exc)

    def _gather(self, pending: deque[Request], wait_s: float) -> None:
        """Move queued requests to ``pending``; with ``wait_s``, until ``wait_s`` passes without one.

        A burst (many agents at once) thus starts as one batch rather than one request and a crowd waiting.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pending.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return
            if wait_s and len(pending) >= self.batching.max_batch:
                return
            deadline = time.monotonic() + wait_s

    def _take(self, name: str, pending: deque[Request], running: int) -> list[Request]:
        """The pending requests for ``name`` that join the batch now (up to ``max_batch`` rows in all).

        None while a weight swap waits, nor while another slot's request waits and the batch still runs:
        the batch then drains, so the swap (or the other slot) comes next.
        """
        if self._waiting_swaps or (running and any(r.slot != name for r in pending)):
            return []
        take = [r for r in pending if r.slot == name][: self.batching.max_batch - running]
        for r in take:
            pending.remove(r)
        return take

    def _serve(self, name: str, pending: deque[Request]) -> None:
        """One running batch on ``name``'s weights until it empties; requests for it join at each step.

        The lock keeps a change of weights from swapping them under it: every response's tokens come from
        the one version it reports.
        """
        with self.lock:
            w = self.weights
            slot = w.slots[name]
            run = RunningBatch(
                w.model, pad=w.pad_id, stop_ids=w.stop_ids, device=w.device, prefix=self.prefix, slot=name
            )
            with w.slots.serving(w.model, name):
                while True:
                    take = self._take(name, pending, len(run)) if run.joinable or not run else []
                    try:
                        run.add(take)
                    except Exception as exc:  # these requests fail; the running rows go on
                        _finish(take, exc)
                    if not run:
                        return
                    try:
                        done = run.step()
                    except Exception as exc:
                        _finish(run.reqs, exc)
                        return
                    for r, (ids, lps, top, finish) in done:
                        r.result = Generation(ids, lps, top, finish, slot.version)
                        r.done.set()
                    self._gather(pending, 0.0)
