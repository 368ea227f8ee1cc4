"""Memory a tensor replay reuses from one pass to the next (``csrc/memory.c``).

A replay keeps every value and gradient it computes, so each pass asks for all of its memory anew.
glibc serves large blocks from fresh pages: each page costs a page fault and zeroing before numpy
writes into it (for the transformer benchmark, about 14 MB a pass). Inside :func:`reuse`, numpy
allocates through graphsvc's memory handler (numpy's NEP 49), which keeps freed blocks of 64 KiB
and more, by size, for the next array of that size: a second replay of a graph (a training loop,
``gradcheck``'s passes) gets back pages the first one touched. At most :data:`LIMIT` bytes wait for
reuse (past it, the blocks that waited longest are freed first), and they stay with the process
after the last replay: :func:`release` frees what waits now, and a replay's arrays still alive give
theirs to the cache when they are freed later; :func:`set_limit` ``(0)`` keeps none from then on.

Arrays keep the handler that allocated them, so they may outlive the ``with`` block and be freed
anywhere. A handler someone else gave numpy (a memory profiler's) is left in place: :func:`reuse`
then changes nothing. Without the C extension (no compiler at install), or with a numpy older than 1.22,
:func:`reuse` does nothing: numpy's own allocator serves every array, with the same results.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from graphsvc.native import extension

__all__ = ["LIMIT", "available", "release", "reuse", "set_limit", "stats"]

#: How many bytes of freed blocks may wait for reuse, by default (256 MiB).
LIMIT = 256 * 1024 * 1024


#: ``graphsvc.native._cmemory``, or None where it is not in use (not built, a numpy without memory
#: handlers or one it cannot read, or ``GRAPHSVC_NATIVE=0``): numpy's allocator serves.
_cmemory = extension("memory")
if _cmemory is not None:
    _cmemory.set_limit(LIMIT)


def available() -> bool:
    """Whether :func:`reuse` has the handler to install (the C extension is built)."""
    return _cmemory is not None


@contextmanager
def reuse() -> Iterator[None]:
    """numpy allocates through the reusing handler in this block (this thread and context only)."""
    if _cmemory is None:
        yield
        return
    previous = _cmemory.install()
    try:
        yield
    finally:
        _cmemory.restore(previous)


def release() -> None:
    """Free the blocks waiting for reuse (arrays still alive keep theirs)."""
    if _cmemory is not None:
        _cmemory.release()


def set_limit(nbytes: int) -> None:
    """Let at most ``nbytes`` of freed blocks wait for reuse (0: none); frees them if more wait."""
    if nbytes < 0:
        raise ValueError(f"the limit must be a number of bytes >= 0, not {nbytes}")
    if _cmemory is not None:
        _cmemory.set_limit(nbytes)


def stats() -> dict[str, int]:
    """``cached_bytes`` (waiting for reuse), ``limit``, ``sizes`` (distinct block sizes known), and
    how many large blocks came from the cache (``hits``) or from the system (``misses``); all zero
    without the handler."""
    if _cmemory is None:
        return {"cached_bytes": 0, "limit": 0, "sizes": 0, "hits": 0, "misses": 0}
    return dict(_cmemory.stats())
