"""The compiled replay sweeps (C, in ``csrc/replay.c``), as their callers in :mod:`graphsvc.replay.columns`
call them, each the twin of a pure-Python reference there: each allocates its results with numpy
and runs the C loop. Import only through :mod:`graphsvc.native`; raises ImportError where the
extension is not in use (not built, or turned off).

Arguments are the graph's columns: ``offsets`` (int64, N + 1), ``parents`` (int32, E), ``codes``
(uint16, N), ``values`` (float64, N); ``table`` (int8) maps an op code to its primitive and ``kinds``
(int8, N) gives each node's (0: not a primitive; codes in :data:`graphsvc.ops.opmath.PRIMITIVES`);
``params`` (float64, N, or None when no node needs one) holds each node's parameter, for the
primitives that take one (``pow``'s exponent).

:func:`elementwise` and :func:`elementwise_partials` compute one primitive over arrays: what
:mod:`graphsvc.ops.builtin` runs for float64 arrays, so every path computes an op with one code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from graphsvc.native.loader import extension

#: The extension module (no stub: its functions take buffers and return None or an int, as below).
_creplay: Any = extension("replay")
if _creplay is None:
    raise ImportError("graphsvc.native._creplay is not in use here (not built, or GRAPHSVC_NATIVE=0)")

__all__ = [
    "backward_primitives",
    "backward_sweep",
    "elementwise",
    "elementwise_partials",
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
    codes: CodeArray,
    table: Int8Array,
    offsets: Int64Array,
    parents: Int32Array,
    values: FloatArray,
    params: FloatArray | None = None,
) -> None:
    """``forward_primitives`` over every node in id order, for graphs whose every op is a primitive:
    ``table`` maps an op code to its primitive (0 for the leaf tags, whose nodes have no parents)."""
    _creplay.forward_all_primitives(codes, table, offsets, parents, values, params)


def forward_primitives(
    nodes: Int64Array,
    kinds: Int8Array,
    offsets: Int64Array,
    parents: Int32Array,
    values: FloatArray,
    start: int,
    params: FloatArray | None = None,
) -> int:
    """Compute ``values`` of ``nodes[start:]`` in order; stop at the first node that is not a
    primitive and return its position (``len(nodes)`` when all were done)."""
    position: int = _creplay.forward_primitives(nodes, kinds, offsets, parents, values, start, params)
    return position


def primitive_derivatives(
    nodes: Int64Array,
    kinds: Int8Array,
    offsets: Int64Array,
    parents: Int32Array,
    values: FloatArray,
    local: FloatArray,
    params: FloatArray | None = None,
) -> None:
    """Fill ``local`` (one entry per parent slot) for ``nodes`` that are primitives."""
    _creplay.primitive_derivatives(nodes, kinds, offsets, parents, values, local, params)


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
    params: FloatArray | None = None,
) -> None:
    """``backward_sweep`` fused with ``ancestors`` and ``primitive_derivatives``, for graphs whose
    every op is a primitive (``table`` as in ``forward_all_primitives``): one pass down from
    ``output``; the result goes to ``grads`` (0 for nodes the output does not depend on). Scratch
    from the caller: ``both``, ``2 * (output + 1)`` floats (each node's value and gradient side by
    side, one cache line per parent), ``reached``, ``output + 1`` booleans."""
    _creplay.backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads, params)


def elementwise(code: int, x: FloatArray, y: FloatArray, param: float = 0.0) -> FloatArray:
    """Primitive ``code``'s forward of ``x`` and ``y`` (C-contiguous float64 arrays of one length;
    a unary primitive ignores ``y``), element by element; ``param`` is its parameter."""
    out = np.empty_like(x)
    _creplay.elementwise(code, x, y, param, out)
    return out


def elementwise_partials(
    code: int, x: FloatArray, y: FloatArray, out: FloatArray, param: float = 0.0
) -> tuple[FloatArray, FloatArray]:
    """Primitive ``code``'s partial derivatives (d out/d x, d out/d y) element by element."""
    dx, dy = np.empty_like(x), np.empty_like(x)
    _creplay.elementwise_partials(code, x, y, out, param, dx, dy)
    return dx, dy
