"""What an episode source is, and its sessions when it is a store.

Sources: an episode Parquet file or directory, a store directory or URI, a ``StoreReader``, stored
sessions, or episodes already in memory.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sdk.store import StoredSession, StoreReader, TailUpdate
from sdk.store._remote import is_store_uri
from sdk.store._writer import SEGMENT_SUFFIX

__all__ = ["open_store", "parquet_files", "peek", "source_kind"]


def source_kind(source: Any) -> str:
    """The kind of an episode source, one of the names below.

    ``"parquet_uri"``, ``"store_uri"``, ``"parquet_file"``, ``"parquet_dir"``, ``"store"``, ``"reader"``,
    ``"missing"`` (a path where nothing is) or ``"iterable"``.

    A directory is a store when it holds segment files or no Parquet file (an empty store is a store);
    otherwise it is a directory of episode files (an export's parts, say).

    Example:
        >>> source_kind("s3://bucket/traces"), source_kind("s3://bucket/train.parquet"), source_kind([])
        ('store_uri', 'parquet_uri', 'iterable')
    """
    if is_store_uri(source):
        return "parquet_uri" if str(source).endswith(".parquet") else "store_uri"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        if path.is_file():
            return "parquet_file"
        if not path.is_dir():
            return "missing"
        if not any(path.glob(f"*{SEGMENT_SUFFIX}")) and any(path.glob("*.parquet")):
            return "parquet_dir"
        return "store"
    if isinstance(source, (StoreReader, TailUpdate)):  # a TailUpdate: the sessions a StoreTail read
        return "reader"
    if isinstance(source, Iterable):
        return "iterable"
    raise TypeError(
        "expected an episode Parquet file or directory, a store directory or URI, a StoreReader, "
        f"stored sessions or episodes, got {type(source).__name__}"
    )


def parquet_files(source: str | os.PathLike[str]) -> list[Path]:
    """The episode files of a Parquet file or directory source, in name order."""
    path = Path(source).expanduser()
    return sorted(path.glob("*.parquet")) if path.is_dir() else [path]


def open_store(source: Any) -> tuple[StoreReader | None, Iterable[StoredSession], str | None]:
    """``(reader, sessions, source name)`` of a store directory or URI, a ``StoreReader``, or sessions.

    A ``TailUpdate`` is the sessions a ``StoreTail`` read returned, named with their store.

    A store URI is fetched by ``StoreReader`` (once); ``reader`` is ``None`` for an iterable of sessions.

    Raises:
        FileNotFoundError: No store at ``source`` (or it is a file: episodes are read with ``read_episodes``).
    """
    if isinstance(source, StoreReader):
        return source, source.sessions(), source.uri or str(source.path)
    if isinstance(source, TailUpdate):  # the sessions a StoreTail read returned
        return None, source.ended, source.source
    if is_store_uri(source) or isinstance(source, (str, os.PathLike)):
        if not is_store_uri(source) and Path(source).is_file():
            path = Path(source)
            hint = "; read episodes with sdk.episodes.read_episodes" if path.suffix == ".parquet" else ""
            raise FileNotFoundError(f"{str(path)!r} is a file, not a tracerl store directory{hint}")
        reader = StoreReader(source)  # raises FileNotFoundError with a clear message
        return reader, reader.sessions(), reader.uri or str(reader.path)
    if isinstance(source, Iterable):
        return None, source, None
    raise TypeError(
        f"expected a store directory, a StoreReader or StoredSessions, got {type(source).__name__}"
    )


def peek(items: Iterable[Any]) -> tuple[Any, Iterator[Any]]:
    """The first item (``None`` when empty) and an iterator over all the items, the first included."""
    it = iter(items)
    for first in it:
        return first, itertools.chain((first,), it)
    return None, iter(())
