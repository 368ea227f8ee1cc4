"""graphsvc.replay.memory: numpy's memory handler with a cache of freed blocks, used by tensor replays."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

import graphsvc
from graphsvc.graph import GraphBuilder
from graphsvc.replay import memory
from tests.conftest import require_native

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import get_handler_name  # type: ignore[no-redef]

BIG = 100_000  # float64 elements: 800,000 bytes, a cached size (64 KiB and more)


@pytest.fixture
def cache() -> Iterator[None]:
    """The C handler, its cache empty before and after the test."""
    require_native("memory")
    memory.release()
    yield
    memory.set_limit(memory.LIMIT)
    memory.release()


def test_arrays_made_inside_reuse_take_the_handler_and_numpy_gets_its_own_back(cache: None) -> None:
    before = get_handler_name()
    with memory.reuse():
        inside = np.empty(BIG)
        assert get_handler_name() == "graphsvc_reuse"
    outside = np.empty(BIG)
    assert get_handler_name(inside) == "graphsvc_reuse"
    assert get_handler_name(outside) == before == get_handler_name()


def test_the_handler_is_given_back_when_the_block_raises(cache: None) -> None:
    before = get_handler_name()
    with pytest.raises(RuntimeError, match=r"^inside$"), memory.reuse():
        raise RuntimeError("inside")
    assert get_handler_name() == before


def test_a_freed_block_waits_for_the_next_array_of_its_size(cache: None) -> None:
    start = memory.stats()
    with memory.reuse():
        first = np.full(BIG, 7.0)
    address = first.ctypes.data
    del first
    pages = -(-BIG * 8 // 4096) * 4096  # rounded up to whole pages
    assert memory.stats()["cached_bytes"] == pages
    with memory.reuse():
        second = np.empty(BIG)
    assert second.ctypes.data == address
    stats = memory.stats()
    assert (stats["hits"] - start["hits"], stats["misses"] - start["misses"]) == (1, 1)
    assert stats["cached_bytes"] == 0


def test_zeros_from_a_reused_block_are_zeros(cache: None) -> None:
    with memory.reuse():
        dirty = np.full(BIG, np.nan)
    del dirty
    with memory.reuse():
        zeros = np.zeros(BIG)
    assert memory.stats()["hits"] >= 1
    assert not zeros.any()


def test_small_arrays_are_not_kept(cache: None) -> None:
    with memory.reuse():
        small = np.ones(100)
    del small
    assert memory.stats()["cached_bytes"] == 0


def test_resize_keeps_the_data(cache: None) -> None:
    """ndarray.resize reallocates through the handler: the old elements are copied over."""
    with memory.reuse():
        grown = np.arange(BIG, dtype=np.float64)
        grown.resize(3 * BIG, refcheck=False)
        shrunk = np.arange(3 * BIG, dtype=np.float64)
        shrunk.resize(10, refcheck=False)
    assert np.array_equal(grown[:BIG], np.arange(BIG)) and not grown[BIG:].any()
    assert np.array_equal(shrunk, np.arange(10))


def test_the_limit_bounds_what_waits_and_release_frees_it(cache: None) -> None:
    memory.set_limit(0)
    with memory.reuse():
        array = np.empty(BIG)
    del array
    assert memory.stats()["cached_bytes"] == 0
    memory.set_limit(memory.LIMIT)
    with memory.reuse():
        arrays = [np.empty(BIG * k) for k in (1, 2, 3)]
    del arrays
    assert memory.stats()["cached_bytes"] > 0
    memory.release()
    assert memory.stats()["cached_bytes"] == 0
    with pytest.raises(ValueError, match=r"^the limit must be a number of bytes >= 0, not -1$"):
        memory.set_limit(-1)


def _pages(count: int) -> np.ndarray:
    return np.empty(count * 4096, dtype=np.uint8)


def test_at_the_limit_the_blocks_that_waited_longest_are_freed_first(cache: None) -> None:
    memory.set_limit((20 + 21 + 22) * 4096)
    with memory.reuse():
        a, b, c, d = (_pages(k) for k in (20, 21, 22, 23))
    del a, b, c  # freed in this order
    assert memory.stats()["cached_bytes"] == 63 * 4096
    del d  # the 23-page block needs room: the 20- and then the 21-page block go
    assert memory.stats()["cached_bytes"] == (22 + 23) * 4096
    start = memory.stats()
    with memory.reuse():
        again = [_pages(k) for k in (20, 21, 22, 23)]
    stats = memory.stats()
    assert (stats["hits"] - start["hits"], stats["misses"] - start["misses"]) == (2, 2)
    del again


def test_new_shapes_are_reused_after_more_sizes_than_the_table_holds(cache: None) -> None:
    """A long-running process that changes shapes: 1,100 sizes come and go (more than the 1,024
    the size table holds), then a new one repeats; nothing released in between."""
    memory.set_limit(40 * 1024 * 1024)
    with memory.reuse():
        for k in range(16, 16 + 1100):
            _pages(k)  # made and freed at once: it waits, the longest-waiting go past the limit
    assert memory.stats()["cached_bytes"] <= 40 * 1024 * 1024
    start = memory.stats()
    with memory.reuse():
        for _ in range(5):
            _pages(3000)
    stats = memory.stats()
    assert (stats["hits"] - start["hits"], stats["misses"] - start["misses"]) == (4, 1)


def test_threads_that_allocate_and_free_at_once_get_their_own_arrays(cache: None) -> None:
    failures: list[str] = []

    def work(seed: int) -> None:
        with memory.reuse():
            for i in range(200):
                size = BIG + 4096 * ((seed + i) % 5)
                array = np.full(size, float(seed))
                if not (array == seed).all():
                    failures.append(f"thread {seed} pass {i}")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert memory.stats()["hits"] > 0


def test_a_second_replay_reuses_the_memory_of_the_first(cache: None) -> None:
    """The results of a replay are the same bits with and without the handler; freed, their
    memory serves the next replay."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.const(rng.standard_normal((64, 300)), name="x")
    w = b.leaf(rng.standard_normal((300, 200)), name="w")
    h = b.add("tanh", [b.add("matmul", [x, w])])
    b.add("mean", [b.add("mul", [h, h])], name="loss")
    graph = b.build()
    first = graphsvc.backward(graph, output="loss")
    assert get_handler_name(_owner(first.grad("w"))) == "graphsvc_reuse"
    expected = first.grad("w").copy()
    del first
    hits = memory.stats()["hits"]
    second = graphsvc.backward(graph, output="loss")
    assert memory.stats()["hits"] > hits
    assert second.grad("w").tobytes() == expected.tobytes()


def _owner(array: np.ndarray) -> np.ndarray:
    while array.base is not None:
        array = array.base
    return array


def test_without_the_extension_reuse_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_cmemory", None)
    before = get_handler_name()
    with memory.reuse():
        array = np.empty(BIG)
    assert get_handler_name(array) == before
    assert memory.available() is False
    assert memory.stats() == {"cached_bytes": 0, "limit": 0, "sizes": 0, "hits": 0, "misses": 0}
    memory.release()
    memory.set_limit(5)


def test_a_handler_someone_else_installed_is_left_in_place(cache: None) -> None:
    """A memory profiler may have given numpy a handler of its own: reuse() changes nothing then."""
    import ctypes

    _cmemory = require_native("memory")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = libc.calloc.restype = libc.realloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    counted = {"malloc": 0}

    def malloc(ctx: int, size: int) -> int:
        counted["malloc"] += 1
        return libc.malloc(size)  # type: ignore[no-any-return]

    functions = (  # numpy's PyDataMemAllocator: ctx, malloc, calloc, realloc, free
        ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(malloc),
        ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)(
            lambda ctx, n, size: libc.calloc(n, size)
        ),
        ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
            lambda ctx, ptr, size: libc.realloc(ptr, size)
        ),
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
            lambda ctx, ptr, size: libc.free(ptr)
        ),
    )

    class Handler(ctypes.Structure):
        _fields_ = [  # numpy's PyDataMem_Handler, the allocator's fields inline
            ("name", ctypes.c_char * 127),
            ("version", ctypes.c_uint8),
            ("ctx", ctypes.c_void_p),
            *((name, type(f)) for name, f in zip(("malloc", "calloc", "realloc", "free"), functions, strict=True)),
        ]

    handler = Handler(b"profiler", 1, None, *functions)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    theirs = new_capsule(ctypes.addressof(handler), b"mem_handler", None)
    numpys = _cmemory.install()  # numpy's own, to give back at the end
    _cmemory.restore(theirs)  # the profiler's is numpy's handler now
    try:
        with memory.reuse():
            assert get_handler_name() == "profiler"
            array = np.ones(BIG)
        assert get_handler_name(array) == "profiler" and counted["malloc"] >= 1
        assert array.sum() == BIG
        del array
    finally:
        _cmemory.restore(numpys)
    assert get_handler_name() == "default_allocator"
