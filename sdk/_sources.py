"""Episodes with the calls behind them, from a store directory or an episode Parquet file.

The OTel exporter and the viewer both take either: a store gives every call's own details (timings,
usage, finish reason, token strings, tool timings), a Parquet file only what the episode holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["SourcedEpisode", "episode_metadata", "open_episodes"]


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


def open_episodes(source: str | os.PathLike[str], *, summary: Any = None) -> Iterator[SourcedEpisode]:
    """Yield the episodes of a store directory or an episode ``.parquet`` file, streaming for a store.

    Every episode is yielded, invalid ones and those without a reward included (a viewer and an
    exporter show what is there; ``summary`` counts the problems).

    Args:
        source: A store directory or an episode Parquet file.
        summary: An ``ExportSummary`` to fill (store sources only).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        sdk.episodes.EpisodeError: ``source`` is a file but not an episode Parquet file.

    Example:
        >>> eps = list(open_episodes("traces"))  # doctest: +SKIP
    """
    from sdk.episodes import build_episodes, read_episodes

    path = Path(source)
    if path.is_file():
        for ep in read_episodes(path):
            yield SourcedEpisode(ep, None)
        return
    if not path.is_dir():
        raise FileNotFoundError(f"no store directory or episode file at {str(path)!r}")

    from sdk.store import StoreReader

    pending: dict[str, dict[str, Any]] = {}
    reader = StoreReader(path)

    def sessions() -> Iterator[Any]:
        # The builder consumes a session before it yields that session's episodes: remember the calls
        # until then, by id (the episode lists its calls' ids in metadata.tracerl.call_ids).
        for s in reader.sessions():
            for c in s.calls:
                cid = c.get("call_id")
                if isinstance(cid, str):
                    pending[cid] = c
            yield s

    for ep in build_episodes(sessions(), require_reward=False, on_invalid="keep", summary=summary):
        ids = (episode_metadata(ep).get("tracerl") or {}).get("call_ids") or []
        calls = [pending.pop(i) for i in ids if isinstance(i, str) and i in pending]
        yield SourcedEpisode(ep, calls)
