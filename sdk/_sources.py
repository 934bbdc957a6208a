"""Episodes with the calls behind them, from a store or an episode Parquet file.

The OTel exporter and the viewer both take either: a store gives every call's own details (timings,
usage, finish reason, token strings, tool timings), a Parquet file only what the episode holds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

__all__ = ["SourcedEpisode", "episode_metadata", "episodes_with_calls"]


@dataclasses.dataclass
class SourcedEpisode:
    """One episode and, when read from a store, the thread's calls in order.

    Attributes:
        episode: The episode dict (the Parquet columns; ``tools`` and ``metadata`` JSON strings).
        calls: The thread's call dicts as the store reader rebuilds them, or ``None`` (Parquet source).

    Example:
        >>> SourcedEpisode({"episode_id": "s:0"}, None).calls is None
        True
    """

    episode: dict[str, Any]
    calls: list[dict[str, Any]] | None = None


def episode_metadata(ep: dict[str, Any]) -> dict[str, Any]:
    """The episode's ``metadata`` column as a dict (``{}`` when missing or not JSON).

    Example:
        >>> episode_metadata({"metadata": '{"split": "train"}'})
        {'split': 'train'}
    """
    raw = ep.get("metadata")
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def episodes_with_calls(source: Any, *, summary: Any = None) -> Iterator[SourcedEpisode]:
    """Yield the episodes of a source (see ``sdk.episodes.open_episodes``), with its calls from a store.

    Every episode is yielded, invalid ones and those without a reward included (a viewer and an
    exporter show what is there; ``summary`` counts the problems).

    Args:
        source: A store directory or URI, an episode Parquet file or directory, or anything else
            ``sdk.episodes.open_episodes`` takes.
        summary: An ``ExportSummary`` to fill (store sources only).

    Raises:
        FileNotFoundError: ``source`` does not exist (raised at the call, not on iteration).
        sdk.episodes.EpisodeError: ``source`` is a file but not an episode Parquet file.

    Example:
        >>> [se.calls for se in episodes_with_calls([{"episode_id": "s:0"}])]
        [None]
    """
    from sdk.episodes import EpisodeOptions, open_episodes
    from sdk.episodes._source import open_store, source_kind

    if source_kind(source) not in ("store", "store_uri", "reader"):
        return (SourcedEpisode(ep, None) for ep in open_episodes(source))
    reader, sessions, _ = open_store(source)
    pending: dict[str, dict[str, Any]] = {}

    def tapped() -> Iterator[Any]:
        # The builder consumes a session before it yields that session's episodes: remember the calls
        # until then, by id (the episode lists its calls' ids in metadata.tracerl.call_ids).
        for s in sessions:
            for c in s.calls:
                cid = c.get("call_id")
                if isinstance(cid, str):
                    pending[cid] = c
            yield s

    options = EpisodeOptions(require_reward=False)
    episodes = open_episodes(tapped(), options, on_invalid="keep", summary=summary)
    return (SourcedEpisode(ep, _calls_of(ep, pending)) for ep in episodes)


def _calls_of(ep: dict[str, Any], pending: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    ids = (episode_metadata(ep).get("tracerl") or {}).get("call_ids") or []
    return [pending.pop(i) for i in ids if isinstance(i, str) and i in pending]
