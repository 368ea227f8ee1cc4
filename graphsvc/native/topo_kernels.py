"""The compiled orderings and structure check (C, in ``csrc/topo.c``), as their callers in
:mod:`graphsvc.topo`, :mod:`graphsvc.graph` and :mod:`graphsvc.replay.columns` call them: each allocates its
results (and the scratch its caller does not pass) with numpy and runs the C loop. Each is the
twin of a pure-Python reference beside its caller (the tests compare the two). Import only through
:mod:`graphsvc.native`; raises ImportError where the extension is not in use (not built, or
turned off).

The C loops check every length and every index they follow: broken columns raise ValueError,
never read outside the arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from graphsvc.native.loader import extension

#: The extension module (no stub: its functions take buffers, and return None, an int or a bool).
_ctopo: Any = extension("topo")
if _ctopo is None:
    raise ImportError("graphsvc.native._ctopo is not in use here (not built, or GRAPHSVC_NATIVE=0)")

__all__ = [
    "align_walk",
    "ancestors",
    "child_count_order",
    "dfs_postorder",
    "first_arity_mismatch",
    "inline_parents",
    "levels",
    "structure_ok",
]

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]
#: A column as the C loop takes it (any dtype: the loop checks the item size).
Array = npt.NDArray[Any]


def _column(array: npt.ArrayLike, dtype: type[np.generic]) -> Array:
    """``array`` as the C loop reads it: contiguous, of ``dtype`` when that keeps every value
    (uint8 op codes, int32 starts); any other dtype goes through as it is, and the C loop refuses
    its item size with a TypeError rather than cut its values."""
    array = np.asarray(array)
    if array.dtype != dtype and np.can_cast(array.dtype, dtype):
        return np.ascontiguousarray(array, dtype=dtype)
    return np.ascontiguousarray(array)


def inline_parents(offsets: Int64Array, parents: Int32Array, pairs: Int32Array) -> None:
    """Each node's first two parents side by side in ``pairs``."""
    _ctopo.inline_parents(_column(offsets, np.int64), _column(parents, np.int32), pairs)


def dfs_postorder(
    starts: npt.ArrayLike, offsets: Int64Array, parents: Int32Array, pairs: Int32Array, visited: BoolArray
) -> Int64Array:
    """Twin of ``topo._dfs_postorder``. Scratch from the caller (numpy gives it huge pages):
    ``pairs``, 2 N int32; ``visited``, N booleans."""
    n = len(visited)
    order = np.empty(n, dtype=np.int64)
    stack, cursor = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    offsets, parents = _column(offsets, np.int64), _column(parents, np.int32)
    count = _ctopo.dfs_postorder(_column(starts, np.int64), offsets, parents, pairs, visited, order, stack, cursor)
    return order[:count]


def child_count_order(
    starts: npt.ArrayLike,
    offsets: Int64Array,
    parents: Int32Array,
    pairs: Int32Array,
    counts: Int64Array,
    reached: BoolArray,
) -> Int64Array:
    """Twin of ``topo._child_count_order`` (a repeated start counts once, as there). Scratch from the
    caller: ``pairs`` (2 N int32), ``counts`` (N int64), ``reached`` (N booleans)."""
    n = len(reached)
    order = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    offsets, parents = _column(offsets, np.int64), _column(parents, np.int32)
    count = _ctopo.child_count_order(_column(starts, np.int64), offsets, parents, pairs, counts, reached, order, stack)
    return order[:count]


def levels(offsets: Int64Array, parents: Int32Array, n: int) -> Int64Array:
    """Twin of ``topo.levels``."""
    level = np.empty(n, dtype=np.int64)
    _ctopo.levels(_column(offsets, np.int64), _column(parents, np.int32), level)
    return level


def align_walk(
    a: tuple[Int64Array, Int32Array, Int32Array],
    b: tuple[Int64Array, Int32Array, Int32Array],
    matched: Int64Array,
    used: BoolArray,
    differs: Int64Array,
    stack: Int64Array,
    count: int,
) -> None:
    """Twin of ``graphsvc.diff._walk``: ``a`` and ``b`` are each graph's (offsets, parents, tags);
    ``matched``, ``used``, ``differs`` are updated in place; ``stack`` (4 N_A int64) holds ``count``
    pairs to begin with."""
    (offsets_a, parents_a, tags_a), (offsets_b, parents_b, tags_b) = a, b
    _ctopo.align_walk(
        _column(offsets_a, np.int64),
        _column(parents_a, np.int32),
        _column(tags_a, np.int32),
        _column(offsets_b, np.int64),
        _column(parents_b, np.int32),
        _column(tags_b, np.int32),
        matched,
        used,
        differs,
        stack,
        int(count),
    )


def ancestors(offsets: Int64Array, parents: Int32Array, output: int, n: int) -> BoolArray:
    """Twin of ``topo.ancestors``."""
    mask = np.empty(n, dtype=np.bool_)
    _ctopo.ancestors(_column(offsets, np.int64), _column(parents, np.int32), int(output), mask)
    return mask


def structure_ok(
    offsets: Int64Array, parents: Int32Array, op_codes: npt.NDArray[np.uint16], num_ops: int, is_leaf_code: BoolArray
) -> bool:
    """True when the columns keep every rule ``Graph._check_columns``
    checks."""
    offsets, parents = _column(offsets, np.int64), _column(parents, np.int32)
    codes, leaf = _column(op_codes, np.uint16), _column(is_leaf_code, np.bool_)
    return bool(_ctopo.structure_ok(offsets, parents, codes, int(num_ops), leaf))


def first_arity_mismatch(codes: npt.NDArray[np.uint16], offsets: Int64Array, arity: Int64Array) -> int:
    """Twin of the vectorized check in ``replay.resolve_ops``: the first node whose parent count is
    not ``arity[its op code]`` (entries below 0 are not checked), or -1."""
    return int(
        _ctopo.first_arity_mismatch(_column(codes, np.uint16), _column(offsets, np.int64), _column(arity, np.int64))
    )
