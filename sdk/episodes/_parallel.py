"""Parallel export: this process and worker processes over disjoint shares of segment chains.

Parsing JSON lines dominates an export and Python runs it on one core, so a store written by several
processes (one chain of segments each) is split by chain into shares of similar size. This process
exports the first share itself, straight into the output file; a worker process per other share writes a
part file, and this process appends those parts, in order, once its own share is done (a streaming read,
bounded memory). Sessions never span chains, so episodes are identical to a single-process export and
keep its row order (chains are split into contiguous shares, written in order).

Two things cross chains and are reconciled here: rewards and rewards for unknown sessions. Each process
first scans its own chains for the rewards it cannot attach as it reads (given after their session ended,
or by another process: usually none) into a SQLite file; this process merges those files into one index
that every process then reads. Each lists the sessions whose indexed rewards it took; whatever none took
is for an unknown session.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sdk.episodes._frame import pyarrow_declined
from sdk.episodes._options import EpisodeOptions
from sdk.episodes._parquet import (
    Rejects,
    default_rejects_path,
    pair_frames,
    progress_bar,
    reject_line,
    sink,
    write_pairs,
)
from sdk.episodes._pipeline import Pipeline, gc_paced
from sdk.episodes._summary import ExportSummary
from sdk.episodes._validate import EpisodeError, Problem
from sdk.store import StoreReader
from sdk.store._index import RewardIndex, insert_rows, scan_rewards
from sdk.store._reader import usable
from sdk.store._spread import scan_spread

__all__ = ["plan_workers", "export_parallel"]

MIN_BYTES_PER_WORKER = 16 * 1024 * 1024
"""Below this much input per worker, starting processes costs more than it saves."""


class _ClaimingIndex(RewardIndex):
    """A view of the merged reward index: read-only; claims go to a database of its own."""

    def __init__(self, db_path: str, size: int, claims_db: str, indexed_chains: set[int]) -> None:
        super().__init__()
        self.indexed_chains = indexed_chains
        self._size = size
        self._db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, check_same_thread=False)
        self._claims_db = sqlite3.connect(claims_db, isolation_level=None, check_same_thread=False)
        self._claims_db.execute("PRAGMA journal_mode=OFF")
        self._claims_db.execute("CREATE TABLE c (k TEXT NOT NULL)")

    def _flush_claims(self) -> None:
        insert_rows(self._claims_db, "INSERT INTO c VALUES (?)", self._claims)
        self._claims = []

    def unclaimed(self) -> Iterator[str]:
        return iter(())  # reconciled by the parent

    def close(self) -> None:
        self._flush_claims()
        self._claims_db.close()
        if self._db is not None:  # the parent's file: closed, not deleted
            self._db.close()
            self._db = None


class _SubsetReader(StoreReader):
    """A reader over some chains of a store, with the indexed rewards of every chain (see the module).

    ``exchange()`` is called once this reader's own rewards are in ``job["rewards"]``: it returns the
    merged index's path and size once every process has scanned.
    """

    def __init__(
        self,
        path: str,
        chains: list[list[Path]],
        job: dict[str, Any],
        exchange: Callable[[], tuple[str, int]],
    ) -> None:
        super().__init__(path)
        self._chains = chains
        self._job = job
        self._exchange = exchange

    def segments(self) -> list[list[Path]]:
        return self._chains

    def _rewards(self, chains: list[list[Path]]) -> RewardIndex:
        own = scan_rewards(
            chains,
            lambda name: self._problem("invalid_reward", name),
            usable,
            RewardIndex(limit=0, path=self._job["rewards"]),
        )
        own.spill()
        own.close()
        db_path, size = self._exchange()
        return _ClaimingIndex(db_path, size, self._job["claimed"], own.indexed_chains)


def _stdio_exchange() -> tuple[str, int]:
    """A worker's side of the reward exchange: say its scan is done, read the merged index's path."""
    sys.stdout.write("scanned\n")
    sys.stdout.flush()
    line = sys.stdin.readline().strip()
    if not line:
        raise RuntimeError("the parent process sent no reward index")
    db_path, _, size = line.rpartition("\t")
    return db_path, int(size)


def _split_shares(chains: list[list[Path]], n: int) -> list[list[list[Path]]]:
    """Split chains into ``n`` contiguous shares of similar byte size (order kept)."""
    sizes = [sum(f.stat().st_size for f in chain) for chain in chains]
    total = sum(sizes)
    shares: list[list[list[Path]]] = [[]]
    acc = 0
    for chain, size in zip(chains, sizes, strict=True):
        if shares[-1] and acc >= total * len(shares) / n and len(shares) < n:
            shares.append([])
        shares[-1].append(chain)
        acc += size
    return shares


def plan_workers(store: Any, workers: int, **blockers: Any) -> list[list[list[Path]]] | None:
    """Chain shares for a parallel export (``workers`` 0: automatic), or ``None`` to run in this process."""
    if workers == 1 or not isinstance(store, (str, os.PathLike)) or not Path(store).is_dir():
        return None
    if any(blockers.values()):
        return None
    reader = StoreReader(store)
    chains = reader.segments()
    if reader.problems:  # files skipped by name (not_a_segment_file): counted by the in-process export
        return None
    if scan_spread(chains):
        return None  # a session written by several processes is merged by one reader (sdk.store._spread)
    total = sum(f.stat().st_size for chain in chains for f in chain)
    n = workers if workers else min(os.cpu_count() or 1, 8, total // MIN_BYTES_PER_WORKER or 1)
    n = min(n, len(chains))
    return _split_shares(chains, n) if n >= 2 else None


def _files(parts_dir: Path, i: int) -> dict[str, str]:
    """The files of share ``i``'s export: its part, rejects, reward index and claims."""
    return {
        "part": str(parts_dir / f"{i:03d}.parquet"),
        "rejects": str(parts_dir / f"{i:03d}.rejects.jsonl"),
        "rewards": str(parts_dir / f"{i:03d}.rewards.sqlite"),
        "claimed": str(parts_dir / f"{i:03d}.claims.sqlite"),
    }


def run_job(job_path: str) -> int:
    """Worker process entry point (``python -m sdk.episodes._worker JOB``): export one chain share.

    Prints ``progress CALLS BYTES`` lines (read since the last one) on stdout; pickles ``("ok", summary)``
    or ``("error", (is_episode_error, message))`` next to the job file.
    """
    with open(job_path, "rb") as fh:
        job = pickle.load(fh)
    result_path = job_path + ".result"
    try:
        reader = _SubsetReader(job["store"], job["chains"], job, _stdio_exchange)
        summary = ExportSummary()
        calls = nbytes = 0
        last = time.monotonic()

        def progress(n: int, b: int) -> None:
            nonlocal calls, nbytes, last
            calls += n
            nbytes += b
            now = time.monotonic()
            if now - last >= 0.2:
                sys.stdout.write(f"progress {calls} {nbytes}\n")
                sys.stdout.flush()
                calls, nbytes, last = 0, 0, now

        pipeline = Pipeline(reader, job["options"], strict=job["strict"], summary=summary, progress=progress)
        with gc_paced(), pyarrow_declined():
            # Parts are appended a batch at a time: row groups of one batch keep the workers' memory low.
            write_pairs(
                pipeline,
                job["part"],
                summary=summary,
                rejects=job["rejects"],
                batch_size=job["batch_size"],
                row_group_size=job["batch_size"],
            )
        sys.stdout.write(f"progress {calls} {nbytes}\n")
        summary._rewards = {}  # recomputed from the merged file
        result: tuple[str, Any] = ("ok", summary)
    except BaseException as exc:  # reported to the parent, which raises it
        result = (
            "error",
            (isinstance(exc, EpisodeError), str(exc) or type(exc).__name__, type(exc).__name__),
        )
    with open(result_path, "wb") as fh:
        pickle.dump(result, fh)
    return 0


class _Workers:
    """The worker processes of one parallel export, by share index (1, 2, ...): started, followed, collected.

    A thread per worker reads its stdout: ``progress CALLS BYTES`` lines go to the progress bar, and
    ``scanned`` says its reward scan is done (see :meth:`exchange`). Its result is pickled next to its job.
    """

    def __init__(
        self, parts_dir: Path, files: list[dict[str, str]], update: Callable[..., None] | None
    ) -> None:
        self.parts_dir = parts_dir
        self.files = files
        self.update = update
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.outcomes: dict[int, ExportSummary] = {}
        self.rewards: RewardIndex | None = None  # the merged index, once exchanged
        self._readers: dict[int, threading.Thread] = {}
        self._scanned: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def count(self, calls: int, nbytes: int) -> None:
        """Add to the progress bar (from this process's reader and the workers' follower threads)."""
        assert self.update is not None
        with self._lock:
            self.update(calls, nbytes)

    def start(self, i: int, job: dict[str, Any], env: dict[str, str]) -> None:
        """Start worker ``i`` on ``job`` (pickled to a file it reads) and a thread following its stdout."""
        job_path = self.parts_dir / f"{i:03d}.job"
        with open(job_path, "wb") as fh:
            pickle.dump(job, fh)
        with open(self.parts_dir / f"{i:03d}.stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sdk.episodes._worker", str(job_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
        self.procs[i] = proc
        self._scanned[i] = threading.Event()
        t = threading.Thread(target=self._follow, args=(i, proc), daemon=True)
        t.start()
        self._readers[i] = t

    def _follow(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        # Anything on stdout but progress and "scanned" lines is ignored.
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"progress ") and self.update is not None:
                _, calls, nbytes = line.split()
                self.count(int(calls), int(nbytes))
            elif line == b"scanned\n":
                self._scanned[i].set()
        self._scanned[i].set()  # it exited: its result says why

    def outcome(self, i: int) -> ExportSummary:
        """Wait for worker ``i`` and return its summary; raise what it raised, or that it died."""
        proc = self.procs[i]
        proc.wait()
        self._readers[i].join()
        result = self.parts_dir / f"{i:03d}.job.result"
        if not result.exists():
            tail = (self.parts_dir / f"{i:03d}.stderr").read_text(errors="replace").strip().splitlines()
            raise RuntimeError(
                f"export worker {i} died (exit code {proc.returncode})" + (f": {tail[-1]}" if tail else "")
            )
        with open(result, "rb") as fh:
            status, payload = pickle.load(fh)
        if status == "error":
            is_episode_error, message, kind = payload
            raise EpisodeError(message) if is_episode_error else RuntimeError(f"{kind}: {message}")
        return payload

    def exchange(self) -> tuple[str, int]:
        """Merge every process's unattached rewards into one index on disk; send its path to the workers.

        Called by this process's reader once its own scan is done; waits for every worker's.
        """
        for i, proc in self.procs.items():
            self._scanned[i].wait()
            if proc.poll() is not None:  # it stopped before its scan was done: an error (raised here)
                self.outcome(i)
        self.rewards = RewardIndex(limit=0)
        db = self.rewards.spill()
        size = self.rewards.merge_from([f["rewards"] for f in self.files])
        for proc in self.procs.values():
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # a worker that died is reported below
                proc.stdin.write(f"{db}\t{size}\n".encode())
                proc.stdin.close()
        return db, size

    def parts(self, batch_size: int) -> Iterator[Any]:
        """Each worker's part, in order, once that worker is done (by then this process's share is)."""
        for i in self.procs:
            self.outcomes[i] = self.outcome(i)
            yield from _slices(self.files[i]["part"], batch_size)

    def stop(self) -> None:
        """Close the merged index and kill the workers still running (after an error)."""
        if self.rewards is not None:
            self.rewards.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _worker_env(n_shares: int) -> dict[str, str]:
    # Plain subprocesses, not multiprocessing: spawn would re-run the caller's __main__ module.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # The cores shared out between the processes: each runs Python plus a polars pool, which by default
    # takes every core, and N such pools on the same cores spent CPU on contention.
    env.setdefault("POLARS_MAX_THREADS", str(max(1, (os.cpu_count() or 1) // n_shares)))
    return env


def export_parallel(
    store: str | os.PathLike[str],
    out: str | os.PathLike[str],
    shares: list[list[list[Path]]],
    *,
    rejects: Any,
    progress: bool,
    options: EpisodeOptions,
    strict: bool,
    batch_size: int,
) -> ExportSummary:
    """Export ``store``: the first chain share here, one worker process per other (see the module)."""
    started = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir():
        raise IsADirectoryError(f"output {str(out)!r} is a directory; give a .parquet file path")
    rejects_path = default_rejects_path(out) if rejects is True else (Path(rejects) if rejects else None)
    parts_dir = out.with_name(f".{out.name}.parts-{os.getpid()}")
    parts_dir.mkdir(exist_ok=True)
    files = [_files(parts_dir, i) for i in range(len(shares))]
    total = sum(f.stat().st_size for share in shares for chain in share for f in chain)
    update, close = progress_bar(progress, total)
    workers = _Workers(parts_dir, files, update)
    summary = ExportSummary()
    try:
        env = _worker_env(len(shares))
        for i in range(1, len(shares)):
            job = {
                "index": i,
                "store": str(store),
                "chains": shares[i],
                "options": options,
                "strict": strict,
                "batch_size": batch_size,
                **files[i],
                "rejects": files[i]["rejects"] if rejects_path else None,
            }
            workers.start(i, job, env)
        merged = parts_dir / "merged.parquet"
        own = _export_own_share(
            store, shares[0], files[0], workers, merged, options, batch_size, rejects_path, strict=strict
        )
        assert workers.rewards is not None  # the reader asked for the merged index before its first session
        summary.merge(own)
        for i in workers.procs:
            summary.merge(workers.outcomes[i])
        _reconcile_rewards(workers.rewards, files, summary, strict=strict)
        extra_rejects = _drop_duplicates(merged, out, batch_size, summary, strict=strict)
        _recount(summary, out)
        _merge_rejects(parts_dir, len(shares), rejects_path, extra_rejects, summary)
    finally:
        workers.stop()
        close()
        shutil.rmtree(parts_dir, ignore_errors=True)
    summary.out = str(out)
    summary.elapsed_s = time.perf_counter() - started
    return summary


def _export_own_share(
    store: str | os.PathLike[str],
    chains: list[list[Path]],
    files: dict[str, str],
    workers: _Workers,
    merged: Path,
    options: EpisodeOptions,
    batch_size: int,
    rejects_path: Path | None,
    *,
    strict: bool,
) -> ExportSummary:
    """Write this process's share straight into ``merged``, then the workers' parts: one writer, in order."""
    own = ExportSummary()
    reader = _SubsetReader(str(store), chains, files, workers.exchange)
    progress = workers.count if workers.update is not None else None
    pipeline = Pipeline(reader, options, strict=strict, summary=own, progress=progress)
    own_rejects = Rejects(Path(files["rejects"]) if rejects_path else None, own)
    try:
        # Without pyarrow, like the workers: its ~45 MB would add to theirs while they run.
        with gc_paced(), pyarrow_declined():
            frames = pair_frames(pipeline, own, own_rejects, batch_size)
            sink(itertools.chain(frames, workers.parts(batch_size)), merged)
    finally:
        own_rejects.close()
    return own


def _reconcile_rewards(
    rewards: RewardIndex, files: list[dict[str, str]], summary: ExportSummary, strict: bool
) -> None:
    """Count the indexed rewards no process claimed: rewards for sessions that are not in the store."""
    for f in files:
        rewards.claim_from(f["claimed"])
    for sid in rewards.unclaimed():
        summary.store_problems["reward_for_unknown_session"] += 1
        summary.store_examples.setdefault("reward_for_unknown_session", sid)
        if strict:
            raise EpisodeError(f"store problem reward_for_unknown_session at {sid} (strict mode)")


def _drop_duplicates(
    merged: Path, out: Path, batch_size: int, summary: ExportSummary, strict: bool
) -> list[str]:
    """Move ``merged`` to ``out`` without later copies of an episode id; return their rejects lines.

    The same session in two processes' segments (a single reader counts the later copy as
    ``event_after_session_end``) gives two episodes with one id: the first is kept, the others rejected.
    Rare, so the file is rewritten only then.
    """
    import polars as pl

    lf = pl.scan_parquet(merged).with_row_index("_row")
    if not lf.select(pl.col("episode_id").is_duplicated().any()).collect().item():
        os.replace(merged, out)
        return []
    dropped = lf.filter(~pl.col("episode_id").is_first_distinct()).collect().to_dicts()
    if strict:
        raise EpisodeError(f"episode {dropped[0]['episode_id']}: duplicate_id (strict mode)")
    drop: set[int] = set()
    lines: list[str] = []
    for ep in dropped:
        drop.add(ep.pop("_row"))
        problem = Problem("duplicate_id", f"episode id {ep['episode_id']!r} was already seen")
        lines.append(reject_line(ep, [problem]))
    summary.rejected["duplicate_id"] += len(dropped)
    sink(_slices(str(merged), batch_size, drop), out)
    return lines


def _slices(part: str, batch_size: int, drop: set[int] | None = None) -> Iterator[Any]:
    """A Parquet file a batch at a time, without the rows at the positions in ``drop``."""
    # A batch at a time: a plain scan -> sink read so far ahead that a merge of vLLM-style token data took
    # 3x the memory of the export itself.
    import polars as pl

    offset = 0
    for frame in pl.scan_parquet(part).collect_batches(chunk_size=batch_size):
        start, offset = offset, offset + frame.height
        if drop:
            frame = frame.filter(pl.Series([start + k not in drop for k in range(frame.height)]))
        yield frame


def _recount(summary: ExportSummary, out: Path) -> None:
    """Written / token-faithful / per-task reward statistics from the merged file (the truth)."""
    import polars as pl

    from sdk.episodes._summary import _Stats

    lf = pl.scan_parquet(out)
    written, faithful = lf.select(pl.len(), pl.col("token_faithful").sum()).collect().row(0)
    summary.written, summary.token_faithful = int(written), int(faithful or 0)
    stats = (
        lf.filter(pl.col("reward").is_not_null())
        .group_by("task_id", maintain_order=True)
        .agg(
            n=pl.len(),
            mean=pl.col("reward").mean(),
            m2=((pl.col("reward") - pl.col("reward").mean()) ** 2).sum(),
        )
        .collect()
    )
    summary._rewards = {
        row["task_id"]: _Stats(int(row["n"]), float(row["mean"]), float(row["m2"]))
        for row in stats.to_dicts()
    }


def _merge_rejects(
    parts_dir: Path, n: int, path: Path | None, extra: list[str], summary: ExportSummary
) -> None:
    if path is None:
        return
    pieces = [parts_dir / f"{i:03d}.rejects.jsonl" for i in range(n)]
    pieces = [p for p in pieces if p.exists()]
    if not pieces and not extra:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale file from an earlier run would contradict the summary
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as dst:
        for piece in pieces:
            with open(piece, "rb") as src:
                shutil.copyfileobj(src, dst)
        for line in extra:
            dst.write(line.encode("utf-8", "backslashreplace") + b"\n")
    summary.rejects_path = str(path)


def picklable(fns: list[tuple[str, Any]]) -> bool:
    """Whether reward functions can be sent to a worker process (pickled by reference to their module)."""
    if any(getattr(fn, "__module__", None) == "__main__" for _, fn in fns):
        return False  # a worker's __main__ is not the caller's script
    try:
        pickle.dumps(fns)
    except Exception:  # lambdas, closures, local classes
        return False
    return True
