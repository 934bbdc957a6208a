"""Resuming a results file: samples the store finished but the file lacks, and superseded attempts.

A results file's samples are marked in the store by a key of its path (session metadata ``rollout``), so a
re-run of the same command finds its own sessions: those that ended without a results line are taken from
the store, those cut short are marked superseded (:func:`sdk.store._events.supersede`) so the export trains
each (task, sample) once.

Example:
    >>> len(_run_key(Path("results.jsonl")))
    12
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

from sdk.rollout._summary import _append, read_results
from sdk.rollout._tasks import SampleTimeout

__all__: list[str] = []


def _run_key(results: Path) -> str:
    """Identifies one results file's samples in the store (session metadata ``rollout``)."""
    return hashlib.sha1(str(results.resolve()).encode()).hexdigest()[:12]


def _recover_from_store(
    store: str | Path,
    key: str,
    split: str,
    done: set[tuple[str, int]],
    task_ids: Container[str],
    attempts: list[tuple[tuple[str, int], str]] | None = None,
) -> list[dict[str, Any]]:
    """Result lines for samples whose session ended in the store but whose line was not written.

    Only a kill between a session's end and its result line leaves such a sample; writing its line from
    the store (instead of running it again) keeps every (task, sample) once in the store's finished
    sessions. Sessions cut short (no end, or interrupted) are run again. ``attempts`` receives
    ``((task, sample), session_id)`` of every session of this run's tasks not yet marked superseded.
    """
    from sdk.store import StoreReader

    if isinstance(store, Path) and not store.is_dir():
        return []
    try:
        reader = StoreReader(store)
    except FileNotFoundError:  # an object-store store nothing was shipped to yet
        return []
    out: list[dict[str, Any]] = []
    for s in reader.sessions():
        md = s.metadata or {}
        if md.get("rollout") != key or md.get("split") != split or s.sample is None:
            continue
        pair = (str(s.task_id), int(s.sample))
        if attempts is not None and pair[0] in task_ids and not s.superseded:
            attempts.append((pair, s.session_id))
        if pair in done or pair[0] not in task_ids or s.status not in ("ok", "error") or s.superseded:
            continue
        err = s.error or {}
        if s.status == "error" and err.get("type") in ("CancelledError", "KeyboardInterrupt"):
            continue
        named = {r["name"]: r["value"] for r in s.rewards if r.get("call_id") is None}
        reward = named.get("reward")
        status = s.status
        if status == "error" and err.get("type") == SampleTimeout.__name__:  # as the live run counts it
            status = "timeout"
        elif status == "ok" and reward is None:
            status = "no_reward"
        out.append(
            {
                "task_id": pair[0],
                "sample": pair[1],
                "split": split,
                "status": status,
                "reward": reward,
                "rewards": named,
                "success": None,  # filled in by the caller (threshold)
                "answer": None,
                "error": None if not err else f"{err.get('type')}: {err.get('message')}",
                "session_id": s.session_id,
                "seconds": None if s.ended_at is None or s.started_at is None else s.ended_at - s.started_at,
                "ts": s.ended_at,
                "recovered": True,
            }
        )
        done.add(pair)
    return out


def _resume(
    results_path: Path,
    location: str | Path,
    key: str,
    split: str,
    task_ids: Container[str],
    success_threshold: float,
) -> list[dict[str, Any]]:
    """The rows of an earlier run of this results file, plus the samples its store holds but it lacks."""
    rows = read_results(results_path)
    if not results_path.exists():
        results_path.touch()  # a run killed before its first line is resumed too (its attempts superseded)
        return rows
    done = {(str(r["task_id"]), int(r["sample"])) for r in rows}
    attempts: list[tuple[tuple[str, int], str]] = []
    # A run killed between a session's end and its results line: the store has the sample, so take it
    # from there rather than run it again.
    for r in _recover_from_store(location, key, split, done, task_ids, attempts):
        r["success"] = r["reward"] is not None and r["reward"] >= success_threshold
        rows.append(r)
        _append(results_path, r)
    _supersede(attempts, rows, key)
    return rows


def _supersede(attempts: list[tuple[tuple[str, int], str]], rows: list[dict[str, Any]], key: str) -> None:
    """Mark in the store every attempt that is not its (task, sample)'s result: each pair is trained once.

    Such attempts were cut short (killed, interrupted) and their pair is run again now, or was run again
    by an earlier resume that did not mark them. An agent may have given its reward before the cut, so
    without the mark the export would train the cut attempt beside the finished one.
    """
    from sdk._tracer import tracer
    from sdk.store import _events as events

    result = {(str(r["task_id"]), int(r["sample"])): r.get("session_id") for r in rows}
    stale = [sid for pair, sid in attempts if pair not in result or result[pair] not in (None, sid)]
    now = time.time()
    for sid in stale:
        tracer.append(events.supersede(sid, reason="rerun", ts=now, run=key))
    if stale:
        tracer.flush()


def _current_store() -> Path:
    from sdk._tracer import tracer

    return Path(tracer.config.store)


def _store_location() -> str | Path:
    """The store as other processes name it: its object-store URI, or its absolute directory."""
    from sdk._tracer import tracer

    return tracer.config.store_uri or Path(tracer.config.store).resolve()
