"""The export pipeline: store → sessions → episodes → rewards → validation, with every item counted."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sdk.episodes._build import session_episodes
from sdk.episodes._options import EpisodeOptions
from sdk.episodes._rewards import apply_group_reward, apply_reward_fns, resolve_reward_fns
from sdk.episodes._source import open_store
from sdk.episodes._summary import ExportSummary
from sdk.episodes._validate import EpisodeError, Problem, ValidationPolicy, validate_episode

__all__ = ["Pipeline", "gc_paced", "validate_only", "validated"]

Pair = tuple[dict[str, Any], list[Problem]]


@contextlib.contextmanager
def gc_paced() -> Iterator[None]:
    """Fewer, cheaper garbage collections while an export runs; the process's settings come back after.

    An export allocates millions of short-lived containers. With the default thresholds the collector ran
    full collections over every object of the process (polars, the SDK, the caller's own) so often that
    they took a quarter of a 1M-call export. Here the objects alive at the start are frozen (not scanned)
    and a young collection runs every 100k allocations: cycles are still collected, later.
    """
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0  # never unfreeze what the caller froze
    if freeze:
        gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


class Pipeline:
    """Iterate ``(episode, problems)`` for every episode of a store, counting everything in ``summary``.

    Rejected episodes (any error problem) are yielded too, so a writer can put them in a rejects file;
    in strict mode the first error (or store problem) raises ``EpisodeError`` instead.
    """

    def __init__(
        self,
        source: Any,
        options: EpisodeOptions | None = None,
        *,
        strict: bool = False,
        summary: ExportSummary | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        options = options if options is not None else EpisodeOptions()
        self.reader, self._sessions, store = open_store(source)
        self.fns = resolve_reward_fns(options.reward_fns)
        self.group_fns = list((options.group_reward_fns or {}).items())
        self.opts = options
        self.source = store  # named in each episode (metadata.tracerl.source)
        self.require_reward = options.require_reward
        self.strict = strict
        self.summary = summary if summary is not None else ExportSummary()
        if self.reader is not None:
            # Share the reader's counters: the summary is exact at every point of the iteration.
            self.summary.store_problems = self.reader.problems
            self.summary.store_examples = self.reader.examples
        self.progress = progress
        # A StoreReader yields each session once (a repeated session id is counted as a store problem), so
        # episode ids are unique by construction: tracking them would only cost memory per episode.
        self._seen: set[int] | None = None if self.reader is not None else set()

    def _check_store(self) -> None:
        if self.strict and self.reader is not None and self.reader.problems:
            reason = next(iter(self.reader.problems))
            where = self.reader.examples.get(reason, "?")
            raise EpisodeError(f"store problem {reason} at {where} (strict mode)")

    def _built(self) -> Iterator[Pair]:
        summary, opts = self.summary, self.opts
        pending = sessions = reported = 0  # progress: calls and bytes not reported yet
        for s in self._sessions:
            summary.sessions += 1
            n = len(s.calls)
            summary.calls += n
            self._check_store()
            if s.superseded:  # a later attempt at its (task, sample) replaces it: trained once, by that one
                summary.skipped["sessions_superseded"] += 1
                summary.skipped["calls_superseded"] += n
            elif opts.splits and s.metadata.get("split") not in opts.splits:
                summary.skipped["sessions_filtered"] += 1
                summary.skipped["calls_filtered"] += n
            elif n == 0:
                summary.skipped["sessions_without_calls"] += 1
            else:
                for ep, problems in session_episodes(s, opts, summary.skipped, self.source):
                    summary.episodes += 1
                    if self.fns:
                        problems += apply_reward_fns(ep, self.fns, opts.reward_name)
                    yield ep, problems
            if self.progress is not None:
                pending += n
                sessions += 1
                if sessions % 64 == 0:  # the read position costs a system call: not for every session
                    position = self.reader.bytes_read if self.reader is not None else 0
                    self.progress(pending, position - reported)
                    pending, reported = 0, position
        if self.progress is not None:
            position = self.reader.bytes_read if self.reader is not None else 0
            self.progress(pending, position - reported)
        self._check_store()

    def _grouped(self, pairs: Iterator[Pair]) -> Iterator[Pair]:
        # A group reward needs every episode of a task at once: this stage holds all episodes in memory.
        groups: dict[Any, list[Pair]] = {}
        for pair in pairs:
            groups.setdefault(pair[0].get("task_id"), []).append(pair)
        for group in groups.values():
            eps = [ep for ep, _ in group]
            for name, fn in self.group_fns:
                extras = apply_group_reward(eps, name, fn, self.opts.reward_name)
                for (_, problems), extra in zip(group, extras, strict=True):
                    problems += extra
            yield from group

    def __iter__(self) -> Iterator[Pair]:
        pairs = self._built()
        if self.group_fns:
            pairs = self._grouped(pairs)
        return validated(
            pairs,
            require_reward=self.require_reward,
            strict=self.strict,
            summary=self.summary,
            seen=self._seen,
        )


def validated(
    pairs: Iterable[Pair],
    *,
    require_reward: bool,
    strict: bool,
    summary: ExportSummary,
    seen: set[int] | None,
) -> Iterator[Pair]:
    """Validate and count ``(episode, problems)`` pairs; in strict mode raise at the first error."""
    policy = dataclasses.replace(ValidationPolicy.EXPORT, require_reward=require_reward)
    for ep, problems in pairs:
        problems += validate_episode(ep, policy=policy, seen_ids=seen)
        error = next((p for p in problems if p.is_error), None) if problems else None
        if error is not None:
            if strict:
                raise EpisodeError(f"episode {ep.get('episode_id')}: {error} (strict mode)")
            summary.reject(error.code)
        else:
            for p in problems:  # warnings of written episodes (a rejected one counts once, by its error)
                summary.warnings[p.code] += 1
            summary.written += 1
            summary.token_faithful += bool(ep.get("token_faithful"))
            summary.add_reward(ep.get("task_id"), ep.get("reward"))
        yield ep, problems


def validate_only(
    episodes: Iterable[dict[str, Any]], *, require_reward: bool, strict: bool, summary: ExportSummary
) -> Iterator[Pair]:
    """Validate and count episodes that come from elsewhere (e.g. ``read_episodes``)."""

    def pairs() -> Iterator[Pair]:
        for ep in episodes:
            summary.episodes += 1
            yield ep, []

    return validated(pairs(), require_reward=require_reward, strict=strict, summary=summary, seen=set())
