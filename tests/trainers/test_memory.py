"""``trainers._memory.release_memory``: freed heap memory goes back to the OS (glibc)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from trainers._memory import release_memory


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_chunks_are_returned():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 400 MB in 4 KB chunks (below the mmap threshold: on the heap, as a trainer's small tensors), touched,
    # then 9 in 10 freed: the survivors pin the heap, so free() alone returns nothing (fragmentation, as
    # after a training run) and only a trim hands the holes' pages back.
    chunks = [libc.malloc(4096) for _ in range(100_000)]
    for p in chunks:
        ctypes.memset(p, 1, 4096)
    kept = chunks[::10]
    for i, p in enumerate(chunks):
        if i % 10:
            libc.free(p)
    before = _rss_kb()
    try:
        assert release_memory() is True
        assert before - _rss_kb() > 200_000  # most of the 360 MB freed left the process
    finally:
        for p in kept:
            libc.free(p)
