"""The embedded store: an append-only log of JSON-line events, one segment file per process.

Why this shape: an ``O_APPEND`` write of one line is a single syscall that lands in the OS page cache
before control returns to the agent, so ``kill -9`` loses only calls still in flight; one segment per
process means many processes can share a store without locks; JSON lines survive a torn last line.
"""

from __future__ import annotations

import collections
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path

from sdk._internal import count, logger, warn_once

__all__ = ["SEGMENT_SUFFIX", "SegmentWriter"]

SEGMENT_SUFFIX = ".jsonl"
_RETRY_SPILL_EVERY_S = 1.0
# Appends between two checks that the segment file is still in the store (one fstat). A check also runs
# on every flush, rotation and close. Lines written in between are not lost: the segment is opened for
# reading too, so the whole deleted file is copied into a new one when the check finds it gone.
_CHECK_EVERY = 256
_COPY_CHUNK = 1 << 20


def _process_key() -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:24] or "host"
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{host}-{os.getpid()}-{secrets.token_hex(3)}"


class SegmentWriter:
    r"""Appends encoded event lines to this process's segment files in one store directory.

    Thread-safe. Never raises from :meth:`append`: when the disk refuses a write, the line is kept in
    a bounded in-memory spill (retried on later appends and on :meth:`flush`), a warning is logged
    once, and the failure is counted; past ``spill_max_bytes`` lines are dropped and counted. A write
    cut short (disk full, file-size limit) is truncated away, so no fragment is left in the segment.

    When the store directory or the segment file is deleted while the process runs, the writer notices
    (every few hundred appends, and on every flush and close), re-creates the directory, copies the
    deleted segment's lines into a new segment (kept in the spill, ahead of later lines, while the
    directory cannot be re-created, e.g. a file stands in its place), warns once and counts a write
    failure; lines of this
    process's earlier segments that were deleted with it are counted in ``events_dropped``, and the next
    :meth:`flush` returns ``False``.

    Example:
        >>> import tempfile
        >>> w = SegmentWriter(tempfile.mkdtemp())
        >>> w.append(b'{"event":"reward"}\\n')
        True
        >>> w.close()
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: str = "never",
        fsync_interval: float = 1.0,
        segment_max_bytes: int = 64 * 1024 * 1024,
        spill_max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self.segment_max_bytes = segment_max_bytes
        self.spill_max_bytes = spill_max_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = -1
        self._key = ""
        self._seq = 0
        self._size = 0
        self._dirty = False
        self._spill: collections.deque[bytes] = collections.deque()
        self._spill_bytes = 0
        self._last_retry = 0.0
        self._closed = False
        self._fsync_thread: threading.Thread | None = None
        self._since_check = 0
        self._lines = 0  # lines in the open segment
        self._ino = 0
        self._done: list[tuple[Path, int, int]] = []  # this process's closed segments: path, inode, lines
        self._lost = False  # events lost since the last flush
        self.path: Path | None = None

    # -- writing -----------------------------------------------------------------------------

    def append(self, line: bytes) -> bool:
        """Append one newline-terminated line; return ``True`` if it reached the file."""
        with self._lock:
            if self._spill:
                now = time.monotonic()
                if now - self._last_retry < _RETRY_SPILL_EVERY_S:
                    self._to_spill(line)
                    return False
                self._last_retry = now
                if not self._drain_spill():
                    self._to_spill(line)
                    return False
            try:
                self._since_check += 1
                if self._since_check >= _CHECK_EVERY:
                    self._check_segment()
                self._write(line)
                return True
            except OSError as exc:
                self._write_failed(exc)
                self._to_spill(line)
                return False

    def _write(self, data: bytes) -> None:
        if self._fd is None or self._pid != os.getpid() or self._size >= self.segment_max_bytes:
            self._open_segment()
        self._write_all(data)
        self._lines += 1
        if self.fsync == "always":
            os.fsync(self._fd)  # type: ignore[arg-type]
            self._dirty = False

    def _open_segment(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            self._check_segment()
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
            if self.path is not None:
                self._done.append((self.path, self._ino, self._lines))
        if self._pid != os.getpid():  # first use, or a forked child: never share a parent's segment
            self._key, self._seq, self._pid = _process_key(), 0, os.getpid()
            self._done = []
        self._fd = None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        self.path = self.directory / f"{self._key}.{self._seq:05d}{SEGMENT_SUFFIX}"
        # Read access too: a segment deleted while open is copied back from its descriptor.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._ino = os.fstat(self._fd).st_ino
        self._size = 0
        self._lines = 0
        if self.fsync == "interval" and self._fsync_thread is None:
            self._fsync_thread = threading.Thread(target=self._fsync_loop, name="tracerl-fsync", daemon=True)
            self._fsync_thread.start()

    def _check_segment(self) -> None:
        """Recover from the segment file (or the whole store directory) having been deleted."""
        self._since_check = 0
        fd = self._fd
        if fd is None or self._pid != os.getpid() or os.fstat(fd).st_nlink > 0:
            return
        size = os.fstat(fd).st_size
        lines = self._lines
        old = self.path
        count("write_failures")
        warn_once(
            f"deleted:{self.directory}",
            "the store segment %s was deleted while this process was writing to it; it is re-created "
            "and what was written to it is copied back. Lines of earlier segments deleted with it are "
            "counted in sdk.stats()['events_dropped'].",
            old,
        )
        # The deleted file's lines are still readable through the descriptor: copy them to a new segment.
        self._fd = None
        chunks = []
        offset = 0
        try:
            while offset < size:
                chunk = os.pread(fd, min(_COPY_CHUNK, size - offset), offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._lost_earlier_segments()
        try:
            self._open_segment()
            self._write_all(data)
        except OSError:
            # The directory cannot be re-created yet (a file in its place, a full disk): the copied lines
            # wait in memory, ahead of everything appended since, until it can be written again.
            self._spill_first(data.splitlines(keepends=True))
            raise
        self._lines = lines

    def _write_all(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, view[written:])
        except OSError:
            if written:
                _truncate_fragment(fd, written)
            raise
        self._size += len(data)
        self._dirty = True

    def _lost_earlier_segments(self) -> None:
        kept = []
        for path, ino, lines in self._done:
            try:
                same = os.stat(path).st_ino == ino
            except OSError:
                same = False
            if same:
                kept.append((path, ino, lines))
            else:
                self._lose(lines, f"the segment {path} was deleted")
        self._done = kept

    def _lose(self, lines: int, why: str) -> None:
        count("events_dropped", lines)
        self._lost = True
        logger.error("tracerl: %d events are lost: %s (counted in sdk.stats()['events_dropped'])", lines, why)

    def _write_failed(self, exc: OSError) -> None:
        count("write_failures")
        warn_once(
            f"write:{self.directory}",
            "cannot write to the store %s (%s). The agent continues; events are kept in memory and "
            "retried, and failures are counted in sdk.stats().",
            self.directory,
            exc,
        )
        # A failed descriptor may be unusable (e.g. the directory vanished): reopen next time.
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    def _to_spill(self, line: bytes) -> None:
        if self._spill_bytes + len(line) > self.spill_max_bytes:
            count("events_dropped")
            warn_once(
                "spill-full",
                "the in-memory spill is full (%d bytes); further events are dropped and counted in "
                "sdk.stats()['events_dropped']",
                self.spill_max_bytes,
            )
            return
        self._spill.append(line)
        self._spill_bytes += len(line)
        count("events_spilled")

    def _spill_first(self, lines: list[bytes]) -> None:
        """Put ``lines`` (older than the spill's) at its front; what does not fit is lost and counted."""
        room = self.spill_max_bytes - self._spill_bytes
        kept = 0
        while kept < len(lines) and len(lines[kept]) <= room:
            room -= len(lines[kept])
            kept += 1
        if kept < len(lines):
            self._lose(len(lines) - kept, f"the in-memory spill ({self.spill_max_bytes} bytes) is full")
        self._spill.extendleft(reversed(lines[:kept]))
        self._spill_bytes += sum(len(line) for line in lines[:kept])
        count("events_spilled", kept)

    def _drain_spill(self) -> bool:
        while self._spill:
            line = self._spill[0]
            try:
                self._write(line)
            except OSError as exc:
                self._write_failed(exc)
                return False
            self._spill.popleft()
            self._spill_bytes -= len(line)
        return True

    # -- durability and lifecycle ------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Number of events held in memory because the store could not be written."""
        return len(self._spill)

    def flush(self) -> bool:
        """Retry spilled events and fsync; ``True`` when nothing is left in memory and nothing was lost.

        ``False`` also when events were lost since the previous flush (e.g. a deleted segment).
        """
        with self._lock:
            try:
                self._check_segment()
            except OSError as exc:
                self._write_failed(exc)
            ok = self._drain_spill() and not self._lost
            self._lost = False
            if self._fd is not None and self._dirty and self._pid == os.getpid():
                try:
                    os.fsync(self._fd)
                    self._dirty = False
                except OSError:
                    pass
            return ok

    def _fsync_loop(self) -> None:
        while not self._closed:
            time.sleep(self.fsync_interval)
            with self._lock:
                if self._fd is not None and self._dirty and self._pid == os.getpid():
                    try:
                        os.fsync(self._fd)
                        self._dirty = False
                    except OSError:
                        pass

    def close(self) -> None:
        """Flush and close the segment. Events that still cannot be written are reported."""
        self.flush()
        with self._lock:
            self._closed = True
            if self._spill:
                logger.error(
                    "tracerl: %d events could not be written to %s and are lost at exit "
                    "(see the warning above for the cause)",
                    len(self._spill),
                    self.directory,
                )
                count("events_dropped", len(self._spill))
                self._spill.clear()
                self._spill_bytes = 0
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None


def _truncate_fragment(fd: int, written: int) -> None:
    """Cut off the first ``written`` bytes of a line whose write failed part-way (disk full, size limit).

    Left in place, the fragment would read back as a corrupt line although the whole line is written
    again later from the spill.
    """
    try:
        os.ftruncate(fd, os.fstat(fd).st_size - written)
    except OSError:
        count("fragments_left")
