"""Vector-Jacobian products an op can build on: :func:`unbroadcast` (autograd's), the VJP of an
elementwise op from its local derivatives (:func:`elementwise_vjp`), and an elementwise op that
computes one element at a time carried over arrays (:func:`per_element`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsvc.errors import ReplayError
from graphsvc.ops import Op, _call_one, evaluate, local_derivatives, opmath

__all__ = ["elementwise_vjp", "per_element", "unbroadcast"]


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the dimensions that broadcasting added to or stretched in an input of ``shape``
    (autograd's ``unbroadcast``): the gradient of that input."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    stretched = tuple(axis for axis, size in enumerate(shape) if size == 1 and g.shape[axis] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g


def elementwise_vjp(op: Op) -> Callable[..., Sequence[Any]]:
    """The VJP of an elementwise op from its local derivatives: ``g * d out/d input_i``, summed
    back to each input's shape."""
    derivatives = op.derivatives
    assert derivatives is not None
    over_arrays = None if op.vectorized else per_element(op, "derivatives")
    # An op whose kernel is a primitive with constant derivatives (add, sub, neg) computes what that
    # primitive computes: its partials are those numbers, and need no call per node.
    constants = opmath.constant_partials(op.kernel) if op.kernel in opmath.RULES and op.vectorized else None

    def vjp(
        g: np.ndarray,
        out: np.ndarray,
        *inputs: np.ndarray,
        needs_input_grad: Sequence[bool] | None = None,
        **attrs: Any,
    ) -> list[np.ndarray | None]:
        partials: Any
        if constants is not None and not attrs and len(inputs) == len(constants):
            partials = constants
        elif over_arrays is None:  # a failure is a ReplayError naming the op, as in the column engine
            partials = _call_one(op, "derivatives", derivatives, [*inputs, out], attrs)
        else:
            partials = over_arrays(*inputs, out, **attrs)
        if not isinstance(partials, (tuple, list)) or len(partials) != len(inputs):
            count = len(partials) if isinstance(partials, (tuple, list)) else type(partials).__name__
            raise ReplayError(
                f"op {op.name!r} ({op.source}): derivatives returned {count}, "
                f"expected a tuple of {len(inputs)} partial derivatives"
            )
        wanted = needs_input_grad or (True,) * len(inputs)
        return [
            unbroadcast(_times(g, d), x.shape) if want else None
            for d, x, want in zip(partials, inputs, wanted, strict=True)
        ]

    return vjp


def _times(g: np.ndarray, partial: Any) -> np.ndarray:
    """``g * partial`` in ``g``'s dtype: a partial of 1.0 (``add``) or a float64 array (``max``'s
    tie rule) must not turn a float32 gradient into float64."""
    if isinstance(partial, (int, float)):
        if partial == 1:
            return g
        if partial == -1:
            return -g
        return g * partial
    if partial.dtype == g.dtype or partial.dtype == bool:  # the product is in g's dtype already
        return np.multiply(g, partial)
    return np.multiply(g, partial, dtype=g.dtype)


def per_element(op: Op, what: str) -> Callable[..., Any]:
    """A per-element op's ``forward`` (``what="forward"``) or ``derivatives`` over arrays that
    broadcast: the elements go through :func:`graphsvc.ops.evaluate` / ``local_derivatives`` (the
    column engine's per-element loop and its checks of what the op returns), the results come back
    in the inputs' shape and float dtype (float32 stays float32; integers give float64)."""

    def over_arrays(*args: np.ndarray, **attrs: Any) -> Any:
        floats = [a.dtype for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
        dtype = np.result_type(*floats) if floats else np.dtype(np.float64)
        arrays = np.broadcast_arrays(*args)
        shape = arrays[0].shape
        columns = [np.array(a, dtype=np.float64).reshape(-1) for a in arrays]
        if what == "forward":
            return evaluate(op, columns, attrs).reshape(shape).astype(dtype)
        partials = local_derivatives(op, columns[:-1], columns[-1], attrs)
        return tuple(np.asarray(d).reshape(shape).astype(dtype) for d in partials)

    return over_arrays
