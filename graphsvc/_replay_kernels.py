"""The compiled replay sweeps (C, in ``csrc/replay.c``), as their callers in :mod:`graphsvc.replay`
call them, each the twin of a pure-Python reference there: each allocates its results with numpy
and runs the C loop. Import only through :mod:`graphsvc.kernels`; raises ImportError where the
extension was not built.

Arguments are the graph's columns: ``offsets`` (int64, N + 1), ``parents`` (int32, E), ``codes``
(uint16, N), ``values`` (float64, N); ``table`` (int8) maps an op code to its primitive and ``kinds``
(int8, N) gives each node's (0: not a primitive; codes in :data:`graphsvc.kernels.PRIMITIVES`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from graphsvc import _creplay as _extension

#: The extension module (no stub: its functions take buffers and return None or an int, as below).
_creplay: Any = _extension

__all__ = [
    "backward_primitives",
    "backward_sweep",
    "forward_all_primitives",
    "forward_primitives",
    "primitive_derivatives",
]

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
Int8Array = npt.NDArray[np.int8]
CodeArray = npt.NDArray[np.uint16]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def backward_sweep(
    offsets: Int64Array, parents: Int32Array, local: FloatArray, nodes: Int64Array, output: int, n: int
) -> FloatArray:
    """Twin of ``replay.reference_sweep``: ``nodes`` in decreasing id order, slot by slot."""
    grads = np.zeros(n, dtype=np.float64)
    _creplay.backward_sweep(offsets, parents, local, nodes, output, grads)
    return grads


def forward_all_primitives(
    codes: CodeArray, table: Int8Array, offsets: Int64Array, parents: Int32Array, values: FloatArray
) -> None:
    """``forward_primitives`` over every node in id order, for graphs whose every op is a primitive:
    ``table`` maps an op code to its primitive (0 for the leaf tags, whose nodes have no parents)."""
    _creplay.forward_all_primitives(codes, table, offsets, parents, values)


def forward_primitives(
    nodes: Int64Array, kinds: Int8Array, offsets: Int64Array, parents: Int32Array, values: FloatArray, start: int
) -> int:
    """Compute ``values`` of ``nodes[start:]`` in order; stop at the first node that is not a
    primitive and return its position (``len(nodes)`` when all were done)."""
    position: int = _creplay.forward_primitives(nodes, kinds, offsets, parents, values, start)
    return position


def primitive_derivatives(
    nodes: Int64Array, kinds: Int8Array, offsets: Int64Array, parents: Int32Array, values: FloatArray, local: FloatArray
) -> None:
    """Fill ``local`` (one entry per parent slot) for ``nodes`` that are primitives."""
    _creplay.primitive_derivatives(nodes, kinds, offsets, parents, values, local)


def backward_primitives(
    offsets: Int64Array,
    parents: Int32Array,
    codes: CodeArray,
    table: Int8Array,
    values: FloatArray,
    output: int,
    both: FloatArray,
    reached: BoolArray,
    grads: FloatArray,
) -> None:
    """``backward_sweep`` fused with ``ancestors`` and ``primitive_derivatives``, for graphs whose
    every op is a primitive (``table`` as in ``forward_all_primitives``): one pass down from
    ``output``; the result goes to ``grads`` (0 for nodes the output does not depend on). Scratch
    from the caller: ``both``, ``2 * (output + 1)`` floats (each node's value and gradient side by
    side, one cache line per parent), ``reached``, ``output + 1`` booleans."""
    _creplay.backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads)
