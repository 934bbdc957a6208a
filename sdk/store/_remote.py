"""Stores on object storage: ``s3://bucket/prefix`` (any fsspec URI) as a store location.

Writing: events still go to crash-safe local segments first, in a spool directory on this host
(:func:`spool_dir`); a :class:`SegmentShipper` copies them to the object store under their own names,
whole lines only, and again whenever they grew: every ``interval`` seconds, on ``sdk.flush()`` and at exit.
Uploading a segment under its name is idempotent (a later upload is a longer copy of the same lines), so a
shipper that starts ships whatever a crashed process left in the spool (segments of processes that are gone).

Durable when: an event is in the local page cache when the agent's call returns (a killed process loses
nothing; a power cut can lose what was not fsynced, see ``TRACERL_FSYNC``); it is in the object store after
the next ship (at most ``interval`` seconds later while the process lives, at ``sdk.flush()``/exit, or when a
later process on this host starts with the same store and ships the spool).

Reading: :func:`fetch_store` copies the store's segments into a local cache (only those that changed) and
the local reader reads that copy; ``StoreReader``, ``sdk.episodes.export`` and ``sdk.train --data`` accept a
store URI through it.

This module imports fsspec only when a URI is used.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from sdk import _env
from sdk._host import pid_alive
from sdk._internal import count, logger, warn_once
from sdk.store._writer import SEGMENT_SUFFIX

__all__ = ["ENV_SPOOL", "SOURCE_FILE", "SegmentShipper", "fetch_store", "is_store_uri", "spool_dir"]

#: In a local copy made by :func:`fetch_store`: the URI it copies (the reader reports that as its source).
SOURCE_FILE = ".tracerl-source"

ENV_SPOOL = _env.TRACERL_SPOOL
"""Directory under which local segments of object-store stores are kept (default ``~/.cache/tracerl``)."""


def is_store_uri(store: object) -> bool:
    """Whether ``store`` names an object store (``s3://...``) rather than a local directory.

    Example:
        >>> is_store_uri("s3://bucket/traces"), is_store_uri("./traces")
        (True, False)
    """
    return isinstance(store, str) and "://" in store and not store.startswith("file://")


def _cache_root() -> Path:
    return Path(os.environ.get(ENV_SPOOL) or Path.home() / ".cache" / "tracerl").expanduser()


def _key(uri: str) -> str:
    return hashlib.sha1(uri.rstrip("/").encode()).hexdigest()[:16]


def spool_dir(uri: str) -> Path:
    """The local directory where this host writes the segments of the store at ``uri``.

    Example:
        >>> spool_dir("s3://bucket/traces").parent.name
        'spool'
    """
    return _cache_root() / "spool" / _key(uri)


def _fs(uri: str) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path.rstrip("/")


def _segment_pid(name: str) -> int | None:
    # Segment names are "<time>-<host>-<pid>-<hex>.<seq>.jsonl" (sdk.store._writer._process_key).
    try:
        return int(name.rsplit(".", 2)[0].rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return None


def _whole_lines(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


class SegmentShipper:
    """Ships this process's segments (and those left by dead processes) from the spool to the object store.

    Never raises from :meth:`ship`: a failed upload is logged once, counted (``ship_failures``) and retried
    at the next ship; the local segments stay.

    Example:
        >>> shipper = SegmentShipper(spool_dir("s3://bucket/t"), "s3://bucket/t")  # doctest: +SKIP
        >>> shipper.ship()  # doctest: +SKIP
        2
    """

    def __init__(self, local: str | os.PathLike[str], uri: str, *, interval: float = 5.0) -> None:
        self.local = Path(local)
        self.uri = uri.rstrip("/")
        self.interval = interval
        self._shipped: dict[str, int] = {}  # segment name -> bytes now in the object store
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listed = False

    def _mine(self, name: str) -> bool:
        pid = _segment_pid(name)
        # Segments of live processes other than this one are theirs to ship: a stale shorter copy uploaded
        # from here could land after their longer one.
        return pid is None or pid == os.getpid() or not pid_alive(pid)

    def ship(self) -> int:
        """Upload every segment that grew since it was last shipped; return how many were uploaded."""
        with self._lock:
            try:
                fs, root = _fs(self.uri)
                if not self._listed:  # what a previous process already shipped
                    try:
                        for entry in fs.ls(root, detail=True, refresh=True):
                            name = str(entry["name"]).rsplit("/", 1)[-1]
                            self._shipped[name] = int(entry.get("size") or 0)
                    except FileNotFoundError:
                        pass
                    self._listed = True
                sent = 0
                for path in sorted(self.local.glob(f"*{SEGMENT_SUFFIX}")):
                    if not self._mine(path.name):
                        continue
                    try:
                        size = path.stat().st_size
                    except FileNotFoundError:
                        continue
                    if size <= self._shipped.get(path.name, 0):
                        continue
                    data = _whole_lines(path)
                    if len(data) <= self._shipped.get(path.name, 0):
                        continue
                    fs.pipe_file(f"{root}/{path.name}", data)
                    self._shipped[path.name] = len(data)
                    sent += 1
                return sent
            except Exception as exc:  # never break the agent: counted, warned once, retried next time
                count("ship_failures")
                warn_once(
                    f"ship:{self.uri}",
                    "cannot ship store segments to %s (%s: %s); they stay in %s and are retried",
                    self.uri,
                    type(exc).__name__,
                    exc,
                    self.local,
                )
                return 0

    def start(self) -> None:
        """Ship now and then every ``interval`` seconds in a daemon thread."""
        if self._thread is None:
            # Import fsspec and the filesystem's package (s3fs, botocore, aiohttp...) here, in the caller's
            # thread: first imports of overlapping modules in two threads at once can end in CPython's
            # "deadlock detected by _ModuleLock" ImportError, and the other thread is the user's agent.
            try:
                _fs(self.uri)
            except Exception:  # ship() counts and reports it, in the thread
                pass
            self._thread = threading.Thread(target=self._loop, name="tracerl-ship", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        self.ship()
        while not self._stop.wait(self.interval):
            self.ship()

    def close(self) -> None:
        """Stop the thread and ship what is left."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._thread = None
        if self.ship() == 0 and logger.isEnabledFor(10):
            logger.debug("tracerl: nothing left to ship to %s", self.uri)


def fetch_store(uri: str) -> Path:
    """Copy the segments of the store at ``uri`` into a local cache and return that directory.

    Only segments whose size changed since the last fetch are downloaded (concurrently, by fsspec), so
    reading a growing store again is cheap.

    Raises:
        FileNotFoundError: Nothing is stored at ``uri``.

    Example:
        >>> fetch_store("s3://bucket/traces")  # doctest: +SKIP
        PosixPath('/home/me/.cache/tracerl/read/5d41402abc4b2a76')
    """
    fs, root = _fs(uri)
    try:
        entries = fs.ls(root, detail=True, refresh=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"no tracerl store at {uri!r}") from None
    local = _cache_root() / "read" / _key(uri)
    local.mkdir(parents=True, exist_ok=True)
    (local / SOURCE_FILE).write_text(uri)  # episodes name the store they came from, not this copy
    remote: dict[str, int] = {}
    for entry in entries:
        name = str(entry["name"]).rsplit("/", 1)[-1]
        if entry.get("type") == "file" and name.endswith(SEGMENT_SUFFIX):
            remote[name] = int(entry.get("size") or 0)
    for old in local.glob(f"*{SEGMENT_SUFFIX}"):
        if old.name not in remote:
            old.unlink()
    todo = [
        n for n, size in remote.items() if not (local / n).is_file() or (local / n).stat().st_size != size
    ]
    if todo:
        fs.get([f"{root}/{n}" for n in todo], [str(local / n) for n in todo])
    return local
