"""The asynchronous loop's collector: the version it stamps, back-pressure, and the process it runs in.

The collector (``sdk.rollout.run_continuous``: the agents) runs in its own process, and validations in
another (:class:`RolloutWorker`, kept for the run), so the agents' Python work does not share the trainer's
interpreter lock: with a small model the trainer's step is mostly Python, and 32 agent threads beside it
made each step about three times slower. The version, the backlog and the stop flag are shared values;
where the policy is (``TRACERL_POLICY_*``) travels in a small file the loop rewrites on every publish (a
vLLM adapter's name changes with its version).

See :mod:`trainers.loop.driver`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainers.errors import UserError

if TYPE_CHECKING:
    from sdk.rollout import RolloutSpec

__all__: list[str] = []

_CTX = multiprocessing.get_context("spawn")  # the loop process has threads (server, validation): no fork
_POLL_S = 0.05


def rollout_spec(cfg: Any, group_size: int | None = None) -> RolloutSpec:
    """The loop's samples as the runners take them: the spec's settings of ``cfg`` (a ``LoopConfig``).

    ``group_size``: validations run ``eval_samples`` per task. The pools' tasks carry their id under ``id``
    already (``load_pools`` read ``cfg.id_field``).

    Example:
        >>> from trainers.loop import LoopConfig
        >>> rollout_spec(LoopConfig(agent="a:f", tasks="t.jsonl", model="m"), group_size=4).group_size
        4
    """
    from sdk.rollout import RolloutSpec

    same = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RolloutSpec)}  # the loop's names
    G = cfg.group_size if group_size is None else group_size
    return RolloutSpec(**{**same, "id_field": "id", "group_size": G})


# Shared values without locks: the loop writes them, the collector only reads, and a lock held by a
# collector killed with -9 would never be released (the loop would hang on its next read or write).


class _Version:
    """The policy version being served, shared with the collector process."""

    def __init__(self, value: int) -> None:
        self._value = _CTX.Value("q", value, lock=False)

    def get(self) -> int:
        return int(self._value.value)

    def set(self, value: int) -> None:
        self._value.value = value


class _Gate:
    """Back-pressure: the collector waits while too many ended samples wait for the trainer.

    Samples beyond ``max_staleness`` versions' worth would only be dropped as stale, so the collector
    starts new tasks only while the backlog the trainer last saw is below ``limit`` (see
    ``driver._backlog_limit``); it also stops at the sample budget (``max_samples``).
    """

    def __init__(self, limit: int, budget_tasks: int | None) -> None:
        self.limit = limit
        self.budget_tasks = budget_tasks
        self._backlog = _CTX.Value("q", 0, lock=False)

    def set_backlog(self, n: int) -> None:
        self._backlog.value = n

    def wait_room(self, stop: Any) -> None:
        while self._backlog.value >= self.limit and not stop.is_set():
            stop.wait(_POLL_S)

    def feed(self, pool: list[dict[str, Any]], stop: Any, start: Callable[[], int] = lambda: 0) -> Any:
        """Tasks in pool order, cycling, as room allows, until ``stop`` or the budget (``task_stream``).

        ``start()``: tasks handed out before, read when the first task is asked for (after the runner has
        resumed its results file).
        """
        k = start()
        while not stop.is_set() and (self.budget_tasks is None or k < self.budget_tasks):
            self.wait_room(stop)
            if stop.is_set():
                return
            yield pool[k % len(pool)]
            k += 1


def write_policy_env(path: Path) -> None:
    """Write where the policy is now (``TRACERL_POLICY_*`` of this process) for the collector to follow."""
    from trainers.serve.policy import ENV_BASE_URL, ENV_MODEL

    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: os.environ.get(k, "") for k in (ENV_BASE_URL, ENV_MODEL)}))
    os.replace(tmp, path)


class _Flag:
    """A stop flag for both processes (``threading.Event``'s ``is_set``, ``set`` and ``wait``)."""

    def __init__(self) -> None:
        self._value = _CTX.Value("b", 0, lock=False)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set() and time.monotonic() < deadline:
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
        return self.is_set()


class _Collector:
    """The collector process: start, check, stop (the loop's side)."""

    def __init__(
        self, cfg: Any, pool: list[dict[str, Any]], out: Path, version: _Version, gate: _Gate
    ) -> None:
        self.stop = _Flag()
        self.error_path = out / "collector-error.txt"
        self.error_path.unlink(missing_ok=True)
        args = (cfg, pool, out, version, gate, self.stop, os.getpid())
        self.proc = _CTX.Process(target=_main, args=args, name="tracerl-collector", daemon=True)
        self.proc.start()
        (out / "collector.pid").write_text(f"{self.proc.pid}\n")  # for operators (and the crash tests)

    def alive(self) -> bool:
        return self.proc.is_alive()

    def check(self) -> None:
        """Raise when the collector failed or was killed (its samples then stop coming)."""
        code = self.proc.exitcode
        if code is None or code == 0:
            return
        with contextlib.suppress(OSError):
            raise UserError(f"the collector failed: {self.error_path.read_text().strip()}")
        raise UserError(
            f"the collector process exited (code {code}); re-run the same command to continue after the "
            "last saved version"
        )

    def join(self, timeout: float | None) -> None:
        """Stop starting samples, let the running ones finish, and wait (killed after ``timeout``)."""
        self.stop.set()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _main(
    cfg: Any,
    pool: list[dict[str, Any]],
    out: Path,
    version: _Version,
    gate: _Gate,
    stop: Any,
    parent: int,
) -> None:
    """The collector process: ``run_continuous`` over the gate's task stream, stamping the served version."""
    import sdk
    from sdk.rollout import MALFORMED_TOOL_CALL_PENALTY, run_continuous
    from trainers.quiet import quiet_libraries

    quiet_libraries()
    sdk.configure(store=out / "store")
    threading.Thread(target=_watch_parent, args=(parent, stop), daemon=True).start()
    results = out / "rollouts" / "stream.jsonl"
    env = _PolicyEnv(out / "policy-env.json", version)
    # The task stream carries back-pressure and the budget; after a restart the runner resumes its results
    # file, first runs the missing samples of the groups the kill left part-done (outside the gate and the
    # budget: the trainer waits for those groups), then gives each task that comes round its next group.
    handed_out = functools.partial(_groups_begun, results, cfg.group_size)  # tasks run before (budget)
    penalty = cfg.malformed_tool_call_penalty
    shaping = {MALFORMED_TOOL_CALL_PENALTY: penalty} if penalty else {}  # training samples only
    try:
        run_continuous(
            rollout_spec(cfg),
            pool,
            stop=stop,
            task_stream=gate.feed(pool, stop, start=handed_out),
            results=results,
            split="train",
            metadata=lambda task, sample: {"policy_version": env.follow(), **shaping},
        )
    except BaseException as exc:  # reported by the loop as one line
        (out / "collector-error.txt").write_text(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
    finally:
        sdk.flush()


class RolloutWorker:
    """A process that runs ``sdk.rollout.run_rollout`` jobs one after another (validations beside training).

    Started once and kept: a fresh interpreter that imports the agents' frameworks costs 2-3 s on a busy
    2-core host, which every validation paid when each ran in a process of its own. Where the policy is
    (``policy-env.json``) is read before each job (it is written when the policy server starts).

    Example:
        >>> worker = RolloutWorker(out, "validation")  # doctest: +SKIP
        >>> worker.run(spec=rollout_spec(cfg, 4), tasks=tasks, results=out / "eval.jsonl")  # doctest: +SKIP
        >>> worker.close()  # doctest: +SKIP
    """

    def __init__(self, out: Path, name: str) -> None:
        self.out, self.name = out, name
        self.conn, child = _CTX.Pipe()
        args = (out, name, os.getpid(), child)
        self.proc = _CTX.Process(target=_worker_main, args=args, name=f"tracerl-{name}", daemon=True)
        self.proc.start()
        child.close()
        (out / f"{name}.pid").write_text(f"{self.proc.pid}\n")  # for operators (and the crash tests)

    def run(self, **kwargs: Any) -> None:
        """Run one job; raises ``UserError`` with its first error line when it fails or the process died."""
        try:
            self.conn.send(kwargs)
            error = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise UserError(
                f"the {self.name} process exited (code {self.proc.exitcode}); re-run the same command to "
                "continue after the last saved version"
            ) from None
        if error is not None:
            raise UserError(error)

    def close(self, timeout: float = 10) -> None:
        """Stop the process (after its running job when there is one; killed after ``timeout`` s)."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _worker_main(out: Path, name: str, parent: int, conn: Any) -> None:
    import sdk
    from sdk.rollout import run_rollout
    from trainers.quiet import quiet_libraries

    quiet_libraries()
    sdk.configure(store=out / "store")
    threading.Thread(target=_watch_parent, args=(parent, _Flag()), daemon=True).start()
    while (kwargs := conn.recv()) is not None:
        with contextlib.suppress(OSError, ValueError):
            os.environ.update(json.loads((out / "policy-env.json").read_text()))
        error = None
        try:
            run_rollout(**kwargs)
        except Exception as exc:  # reported by the loop as one line
            from sdk.rollout import RolloutError

            text = (str(exc).splitlines() or [""])[0]
            kind = "" if isinstance(exc, RolloutError) else f"{type(exc).__name__}: "
            error = f"{name}: {kind}{text}"
        finally:
            sdk.flush()
        conn.send(error)


class _PolicyEnv:
    """Re-reads where the policy is when the served version changes (before a sample starts)."""

    def __init__(self, path: Path, version: _Version) -> None:
        self.path, self.version, self.seen = path, version, -1
        self.lock = threading.Lock()

    def follow(self) -> int:
        n = self.version.get()
        with self.lock:
            if n != self.seen:
                with contextlib.suppress(OSError, ValueError):
                    os.environ.update(json.loads(self.path.read_text()))
                self.seen = n
        return n


def _watch_parent(parent: int, stop: Any) -> None:
    """Exit when the loop process is gone (kill -9), as if killed with it.

    The next run supersedes the samples that were running (their policy server may be gone too).
    """
    while os.getppid() == parent:
        time.sleep(0.5)
    stop.set()
    os._exit(1)


def _groups_begun(path: Path, group_size: int) -> int:
    """Groups (task, block of ``group_size`` samples) with at least one sample in the results file."""
    begun = set()
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                begun.add((str(row["task_id"]), int(row["sample"]) // group_size))
    return len(begun)
