"""graphsvc's own ops, registered through the same hook third-party plugins use.

The elementwise ops (add sub mul div neg pow exp log sqrt sin cos tanh relu sigmoid abs max min)
are written once, in :data:`graphsvc.ops.opmath.RULES` (forward, local derivatives, doc and the
conventions at non-differentiable points, side by side); their numpy functions here are derived
from that table (:func:`graphsvc.ops.opmath.numpy_functions`), as are the compiled kernels that replay
them (each op's ``kernel`` is its own name) and :class:`graphsvc.value.Value`'s arithmetic. The
derivatives receive the inputs, then the output ``out``, then the node's attributes as keywords, and
return one partial derivative per input. They work on numpy arrays (every node of an op at once),
with broadcasting. Where the C extension is in use (and built from this table), the float64 forward
and derivatives of the ops that are not correctly rounded (exp, log, pow, sin, cos, tanh, sigmoid)
run through its elementwise loop (:func:`graphsvc.native.replay_kernels.elementwise`), the code the
compiled sweeps run, so a node gets the same bits on every path; other dtypes (float32 tensors) use
numpy.

The tensor ops (numpy's names and semantics) come after them, each with its vector-Jacobian
product ``vjp(g, out, *inputs, **attrs)`` (see :mod:`graphsvc.ops`). ``amax`` with several maxima
along the axis splits the gradient evenly among them (PyTorch's ``amax``).

The fused ops at the end (addmm, layer_norm, batch_norm, scaled_dot_product_attention, stack, slice,
where, mse_loss, clamp) are PyTorch's, with its names for inputs and attributes: one node where a
captured PyTorch step has one ATen call (:mod:`graphsvc.torch`), each VJP written directly (no
decomposition into other ops), what it reuses kept by ``forward_with_residuals`` (x normalized and
1/std, the attention softmax's numerators and their row sums). They keep their inputs' dtype;
batch_norm sums its statistics in float64 as PyTorch's CPU kernel does.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import numpy as np

import graphsvc.native as kernels
from graphsvc.graph import CONST, LEAF
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op, opmath
from graphsvc.text import counted


# -- the elementwise ops, from graphsvc.ops.opmath's table --------------------------------------------
def _elementwise(name: str) -> Op:
    """Op ``name`` of :data:`graphsvc.ops.opmath.RULES`, with its numpy functions (through the C loop
    for float64 arrays when the op is not correctly rounded) and its compiled kernel."""
    rule = opmath.RULES[name]
    forward, derivatives = opmath.numpy_functions(name)
    if not opmath.rounded(name):
        forward, derivatives = _through_c(name, forward), _through_c(name, derivatives, partials=True)
    return Op(name, rule.arity, forward=forward, derivatives=derivatives, doc=rule.doc, kernel=name)


_FLOAT64 = np.dtype(np.float64)


def _through_c(name: str, numpy_function: Callable[..., Any], *, partials: bool = False) -> Callable[..., Any]:
    """``numpy_function`` (signature kept), run by the compiled elementwise loop of op ``name`` when
    every input is a float64 array, the attributes are the op's own and the extension is in use."""
    rule, code = opmath.RULES[name], opmath.CODES[name]

    @functools.wraps(numpy_function)
    def run(*inputs: Any, **attrs: Any) -> Any:
        for x in inputs:  # first what is cheapest to see: a float32 array goes to numpy at once
            if type(x) is not np.ndarray or x.dtype != _FLOAT64:
                return numpy_function(*inputs, **attrs)
        compiled = kernels.compiled_elementwise() if opmath.compiled_primitives() else None
        param = attrs.get(rule.attrs[0], None) if rule.attrs else 0.0
        if compiled is None or len(attrs) != len(rule.attrs) or not isinstance(param, Real) or isinstance(param, bool):
            return numpy_function(*inputs, **attrs)
        arrays: Sequence[np.ndarray] = inputs
        shape = inputs[0].shape  # a 0-d input stays 0-d (ascontiguousarray would make it 1-d)
        if not all(x.shape == shape for x in inputs):  # one shape (a unary op, most nodes): no broadcast
            arrays = np.broadcast_arrays(*inputs)
            shape = arrays[0].shape
        columns = [np.ascontiguousarray(x).reshape(-1) for x in arrays]
        x, y = columns[0], columns[1 if rule.arity == 2 else 0]
        if not partials:
            return compiled.elementwise(code, x, y, float(param)).reshape(shape)
        dx, dy = compiled.elementwise_partials(code, x, y, columns[-1], float(param))
        return (dx.reshape(shape), dy.reshape(shape)) if rule.arity == 2 else (dx.reshape(shape),)

    return run


# -- helpers of the tensor ops' VJPs -------------------------------------------------------------
def _axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """``axis`` (None: all) as a tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim if ndim else a for a in axes)


def _unreduce(g: np.ndarray, x: np.ndarray, axis: int | Sequence[int] | None, keepdims: bool) -> np.ndarray:
    """A reduction's gradient ``g`` with the reduced axes put back (size 1), broadcast to ``x``
    (a read-only view)."""
    if not keepdims and g.ndim:  # a 0-d g (every axis reduced) broadcasts as it is
        shape = list(x.shape)
        for a in _axes(axis, x.ndim):
            shape[a] = 1
        g = g.reshape(shape)
    return np.broadcast_to(g, x.shape)


# -- where gradcheck checks the tensor ops (Op.samples) --------------------------------------------
Samples = list[tuple[tuple[np.ndarray, ...], dict[str, Any]]]


def _unary_samples(*attrs: dict[str, Any], shape: tuple[int, ...] = (3, 4)) -> Callable[[np.random.Generator], Samples]:
    """A random input of ``shape`` (values in [0.5, 2): no ties) under each set of ``attrs``."""
    return lambda rng: [((rng.uniform(0.5, 2.0, shape),), dict(a)) for a in attrs]


def _matmul_samples(rng: np.random.Generator) -> Samples:
    shapes = [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)), ((4,), (4,))]
    return [((rng.standard_normal(a), rng.standard_normal(b)), {}) for a, b in shapes]


def _concatenate_samples(rng: np.random.Generator) -> Samples:
    return [
        ((rng.standard_normal((2, 3)), rng.standard_normal((1, 3))), {}),
        ((rng.standard_normal((2, 1)), rng.standard_normal((2, 3)), rng.standard_normal((2, 2))), {"axis": 1}),
    ]


def _take_samples(rng: np.random.Generator) -> Samples:
    table = rng.standard_normal((4, 3))
    return [((table, np.array([2, 0, 2])), {"axis": 0}), ((table, np.array([[1, 11], [5, 5]])), {})]


def _nll_loss_samples(rng: np.random.Generator) -> Samples:
    """Log-probabilities (the inputs need not be normalized: the VJP is the same) with targets
    that repeat a class, ignore one entry, and cover the (C,) and (N, C, d) layouts."""
    rows, image = rng.standard_normal((4, 3)), rng.standard_normal((2, 3, 2))
    return [
        ((rows, np.array([2, 0, 2, 1])), {}),
        ((rows, np.array([1, -100, 0, 1])), {"reduction": "sum"}),
        ((rows, np.array([0, 2, 5, 2])), {"reduction": "none", "ignore_index": 5}),
        ((rng.standard_normal(3), np.array(1)), {}),
        ((image, np.array([[0, 2], [1, 1]])), {"reduction": "mean"}),
    ]


_REDUCTIONS: tuple[dict[str, Any], ...] = ({}, {"axis": 1}, {"axis": -1, "keepdims": True}, {"axis": [0, 1]})


def _tuple(axis: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    """An ``axis`` attribute as numpy takes it (a file stores a list)."""
    return axis if axis is None or isinstance(axis, int) else tuple(axis)


@functools.lru_cache(maxsize=4096)
def _broadcast_remembered(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return np.broadcast_shapes(*shapes)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """np.broadcast_shapes, remembered for shapes seen before (it costs microseconds, a look-up a
    tenth of one: the shape checks of every matrix product and attention node of every replay);
    ValueError where they do not broadcast."""
    try:
        return _broadcast_remembered(*shapes)
    except TypeError:  # a shape given as a list: not hashable
        return np.broadcast_shapes(*shapes)


def _count(x: np.ndarray, axis: int | Sequence[int] | None) -> int:
    return math.prod(x.shape[a] for a in _axes(axis, x.ndim))


def _inverse(permutation: tuple[int, ...]) -> list[int]:
    """The permutation that undoes ``permutation`` (transpose's VJP): np.argsort's, without an array."""
    inverse = [0] * len(permutation)
    for i, axis in enumerate(permutation):
        inverse[axis] = i
    return inverse


def _matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """np.matmul; a stack of matrices times one matrix (a linear layer on a batch of sequences) is
    one matrix product of the stack's rows, not one per matrix of the stack."""
    if y.ndim == 2 and x.ndim > 2:
        return np.matmul(_rows(x), y).reshape(*x.shape[:-1], y.shape[-1])
    return np.matmul(x, y)


def _matmul_shape(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape np.matmul returns for operands of shapes ``x`` and ``y`` (None: they do not fit;
    forward says why)."""
    if len(x) == 2 and len(y) == 2:
        return (x[0], y[1])
    if not x or not y:
        return None
    rows, cols = x[-2:-1], y[-1:] if len(y) > 1 else ()
    try:
        batch = _broadcast(x[:-2], y[:-2])
    except ValueError:
        return None
    return (*batch, *rows, *cols)


def _shape_attribute(x: tuple[int, ...], shape: Any) -> tuple[int, ...] | None:
    """broadcast_to's output: its ``shape`` attribute (None when it is not a list of integers)."""
    try:
        return tuple(operator.index(n) for n in shape)
    except TypeError:
        return None


def _take_shape(x: tuple[int, ...], indices: tuple[int, ...], axis: int | None = None) -> tuple[int, ...] | None:
    """np.take's output shape: the indices' shape in place of ``axis`` (of every axis when None)."""
    if axis is None:
        return indices
    try:
        at = operator.index(axis) % len(x)
    except (TypeError, ZeroDivisionError):
        return None
    return (*x[:at], *indices, *x[at + 1 :])


def _rows(a: np.ndarray) -> np.ndarray:
    """A stack of matrices as one matrix of all their rows (no -1: a stack may hold no elements)."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _matmul_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, y: np.ndarray, needs_input_grad: Sequence[bool] = (True, True)
) -> tuple[np.ndarray | None, np.ndarray | None]:
    need_x, need_y = needs_input_grad
    if x.ndim == 2 and y.ndim == 2:  # a linear layer: nothing broadcast, nothing promoted
        return (np.matmul(g, y.T) if need_x else None), (np.matmul(x.T, g) if need_y else None)
    if x.ndim == 1 and y.ndim == 1:
        return (g * y if need_x else None), (g * x if need_y else None)
    if y.ndim == 2 and x.ndim > 2:  # as _matmul: the stack's rows, then y's gradient is one product
        rows, g_rows = _rows(x), _rows(g)
        gx = np.matmul(g_rows, y.T).reshape(x.shape) if need_x else None
        return gx, (np.matmul(rows.T, g_rows) if need_y else None)
    x2 = x[np.newaxis, :] if x.ndim == 1 else x  # np.matmul's promotion of 1-d operands
    y2 = y[:, np.newaxis] if y.ndim == 1 else y
    g2 = np.expand_dims(g, -2) if x.ndim == 1 else g
    g2 = np.expand_dims(g2, -1) if y.ndim == 1 else g2
    from graphsvc.ops import unbroadcast  # here: a graph of scalars never loads it

    gx = unbroadcast(g2 @ np.swapaxes(y2, -1, -2), x2.shape).reshape(x.shape) if need_x else None
    gy = unbroadcast(np.swapaxes(x2, -1, -2) @ g2, y2.shape).reshape(y.shape) if need_y else None
    return gx, gy


def _broadcast_to_vjp(g: np.ndarray, out: np.ndarray, x: np.ndarray, shape: Sequence[int]) -> tuple[np.ndarray]:
    from graphsvc.ops import unbroadcast

    return (unbroadcast(g, x.shape),)


def _amax_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, axis: Any = None, keepdims: bool = False
) -> tuple[np.ndarray]:
    top = x == _unreduce(out, x, axis, keepdims)
    share = top / np.sum(top, axis=_axes(axis, x.ndim), keepdims=True)
    return (_unreduce(g, x, axis, keepdims) * share,)


def _concatenate_vjp(g: np.ndarray, out: np.ndarray, *inputs: np.ndarray, axis: int = 0) -> list[np.ndarray]:
    cuts = np.cumsum([x.shape[axis] for x in inputs[:-1]])
    return np.split(g, cuts, axis=axis)


def _take_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, indices: np.ndarray, axis: int | None = None
) -> tuple[np.ndarray, None]:
    gx = np.zeros(x.shape, dtype=x.dtype)  # C order whatever x's layout: reshape(-1) below must be a view
    target, at, g = (gx.reshape(-1), 0, g.reshape(-1)) if axis is None else (gx, axis % x.ndim, g)
    where: Any = (slice(None),) * at + (indices.reshape(-1) if axis is None else indices,)
    if _distinct(indices, target.shape[at]):  # each element picked once: written, not summed
        target[where] = g  # (np.add.at's loop costs 35x an assignment: a select's gradient)
    else:
        np.add.at(target, where, g)
    return gx, None


def _distinct(indices: np.ndarray, size: int) -> bool:
    """Whether no two of ``indices`` (valid indices into ``size`` elements, negatives counting from
    the end) pick the same element."""
    if indices.size <= 1:
        return True
    picked = np.where(indices < 0, indices + size, indices).reshape(-1)
    return bool(np.unique(picked).size == picked.size)


def _take(x: np.ndarray, indices: np.ndarray, axis: int | None = None) -> np.ndarray:
    """np.take; one index along an axis (PyTorch's select) is a view of ``x``, as PyTorch's: np.take
    copies it element by element (a transformer layer's q, k and v, 64x8x128 float32 each: 77 us
    against 12 for the view and the copy a reshape of it makes)."""
    if indices.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers (int64), not {indices.dtype}")
    if indices.ndim == 0 and type(axis) is int and -x.ndim <= axis < x.ndim:
        at = axis % x.ndim
        i = int(indices)
        if -x.shape[at] <= i < x.shape[at]:  # else np.take says what is wrong
            return x[(slice(None),) * at + (i,)]
    return np.take(x, indices, axis=axis)


#: The reductions of ``nll_loss`` (PyTorch's names).
NLL_REDUCTIONS = ("mean", "sum", "none")


#: Where each target picks its log-probability: an index for ``x[...]``, and which targets count
#: (None: all of them).
_Picks = tuple[tuple[np.ndarray, ...], np.ndarray | None]


def _nll_picks(x: np.ndarray, target: np.ndarray, reduction: str, ignore_index: int) -> _Picks:
    """Where each target picks its log-probability in ``x``: classes along axis 1, as in PyTorch,
    or along axis 0 of one row."""
    if reduction not in NLL_REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(NLL_REDUCTIONS)}, not {reduction!r}")
    if x.dtype.kind != "f":
        raise ValueError(f"the log-probabilities must be floats (float32, float64), not {x.dtype}")
    if target.dtype.kind not in "iu":
        raise ValueError(f"the target must hold class indices (int64), not {target.dtype}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise ValueError(f"ignore_index must be an integer (a class index to leave out), not {ignore_index!r}")
    axis = 0 if x.ndim == 1 else 1
    expected = x.shape[:axis] + x.shape[axis + 1 :]
    if x.ndim == 0 or target.shape != expected:
        raise ValueError(
            f"a target of shape {list(target.shape)} for log-probabilities of shape {list(x.shape)}: "
            f"expected {list(expected) if x.ndim else 'classes along axis 0 or 1'}"
        )
    target = target.astype(np.int64, copy=False)
    classes = x.shape[axis]
    kept: np.ndarray | None = None
    outside = target.view(np.uint64) >= classes  # a negative class is a huge unsigned one
    if 0 <= ignore_index < classes or outside.any():  # some targets may be ignored
        kept = target != ignore_index
        outside &= kept
        if outside.any():
            of = counted(classes, "class", plural="classes")
            raise ValueError(f"target {int(target[outside][0])} is out of range for {of}")
        if not classes:  # no class to pick: every target is ignored (else it was out of range)
            return (), kept
        target = np.where(kept, target, 0)
    ndim = target.ndim
    others = [np.arange(n).reshape((n,) + (1,) * (ndim - 1 - i)) for i, n in enumerate(target.shape)]
    return (*others[:axis], target, *others[axis:]), kept


def _nll_loss_with_residuals(
    x: np.ndarray, target: np.ndarray, reduction: str = "mean", ignore_index: int = -100
) -> tuple[np.ndarray, _Picks]:
    picks = _nll_picks(x, target, reduction, ignore_index)
    index, kept = picks
    if not index:  # no classes, every target ignored
        losses = np.zeros(target.shape, dtype=x.dtype)
    else:
        losses = np.negative(x[index])
        if kept is not None:
            losses = np.where(kept, losses, x.dtype.type(0))
    if reduction == "none":
        return losses, picks
    total = losses.sum(dtype=x.dtype)
    if reduction == "sum":
        return total, picks
    return total / _nll_count(x, target, kept), picks


def _nll_count(x: np.ndarray, target: np.ndarray, kept: np.ndarray | None) -> Any:
    """How many targets a mean is over (those not ignored), in ``x``'s dtype."""
    return x.dtype.type(target.size if kept is None else np.count_nonzero(kept))


def _nll_loss_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    target: np.ndarray,
    reduction: str = "mean",
    ignore_index: int = -100,
    residuals: _Picks | None = None,
) -> tuple[np.ndarray, None]:
    index, kept = _nll_picks(x, target, reduction, ignore_index) if residuals is None else residuals
    each = -g / _nll_count(x, target, kept) if reduction == "mean" else -g
    gx = np.zeros(x.shape, dtype=x.dtype)
    if index:  # else no classes: nothing to send a gradient to
        gx[index] = each if kept is None else np.where(kept, each, x.dtype.type(0))
    return gx, None


def _max_along(x: np.ndarray, axis: int) -> np.ndarray:
    """``x.max(axis=axis, keepdims=True)``, picked by ``argmax``: numpy's maximum reduction along a
    short axis costs about twice as much (the attention scores of a transformer layer, 8x4x64x64
    float32: 260 us against 130). The same numbers: argmax picks the first nan of a row that has one."""
    if x.size == 0 or x.ndim == 0:  # the reduction's own refusal
        return x.max(axis=axis, keepdims=True)
    return np.take_along_axis(x, np.expand_dims(x.argmax(axis=axis), axis), axis=axis)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - _max_along(x, axis))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - _max_along(x, axis)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


# -- the fused ops: one node where PyTorch's graph has one (a captured step maps to them) ------------
def _shape(shape: Sequence[int]) -> str:
    """A shape as messages write it: ``[2, 3]``."""
    return str(list(shape))


def _floats(name: str, x: np.ndarray) -> None:
    """Refuse an input that does not hold floats (it could get no gradient)."""
    if x.dtype.kind != "f":
        raise ValueError(f"{name} must hold floats (float32, float64), not {x.dtype}")


def _integer(name: str, value: Any, *, none: bool = False) -> int | None:
    """An integer attribute (``None`` too when ``none``), refused with its name otherwise."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        kind = "an integer or None" if none else "an integer"
        raise ValueError(f"{name} must be {kind}, not {value!r}")
    return int(value)


def _number(name: str, value: Any) -> float:
    """A real-number attribute (``beta``, ``eps``, ``scale``), refused with its name otherwise."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, not {value!r}")
    return float(value)


def _axis(axis: Any, ndim: int, name: str = "axis") -> int:
    """``axis`` of an array of ``ndim`` dimensions, as a non-negative axis (negatives count from the end)."""
    at = _integer(name, axis)
    assert at is not None
    if not -ndim <= at < ndim:
        raise ValueError(f"{name} {at} is out of range for {counted(ndim, 'dimension')}")
    return at % ndim


def _scaled(a: np.ndarray, factor: float, *, in_place: bool = False) -> np.ndarray:
    """``factor * a`` in ``a``'s dtype (``a`` itself for 1); written into ``a`` when ``in_place``
    (an array the caller made: no second array of its size)."""
    if factor == 1.0:
        return a
    return np.multiply(a, a.dtype.type(factor), out=a if in_place else None)


# -- addmm: beta * bias + alpha * (m1 @ m2), nn.Linear's forward
def _addmm_check(bias: tuple[int, ...], m1: tuple[int, ...], m2: tuple[int, ...]) -> tuple[int, int]:
    if len(m1) != 2 or len(m2) != 2:
        raise ValueError(f"m1 and m2 must be matrices (2 dimensions), not of shapes {_shape(m1)} and {_shape(m2)}")
    if m1[1] != m2[0]:
        raise ValueError(
            f"m1 of shape {_shape(m1)} and m2 of shape {_shape(m2)} cannot be multiplied ({m1[1]} != {m2[0]})"
        )
    try:
        if _broadcast(bias, (m1[0], m2[1])) != (m1[0], m2[1]):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"a bias of shape {_shape(bias)} does not broadcast to the product's shape {_shape((m1[0], m2[1]))}"
        ) from None
    return m1[0], m2[1]


def _addmm(bias: np.ndarray, m1: np.ndarray, m2: np.ndarray, beta: float = 1.0, alpha: float = 1.0) -> np.ndarray:
    _addmm_check(bias.shape, m1.shape, m2.shape)
    beta, alpha = _number("beta", beta), _number("alpha", alpha)
    for name, x in (("bias", bias), ("m1", m1), ("m2", m2)):
        _floats(name, x)
    product = _scaled(np.matmul(m1, m2), alpha, in_place=True)  # fresh: scaled and biased in place
    if beta == 0.0:  # PyTorch: the bias is not read (a nan in it does not come through)
        return product
    return np.add(product, _scaled(bias, beta), out=product, dtype=product.dtype)


def _unfit_is_unknown(out_shape: Callable[..., Sequence[int]]) -> Callable[..., Sequence[int] | None]:
    """An ``out_shape`` that answers ``None`` (cannot tell: the op's own check words the error when
    it runs) where the shapes do not fit together (``out_shape`` raises ValueError)."""

    @functools.wraps(out_shape)
    def shape(*shapes: tuple[int, ...], **attrs: Any) -> Sequence[int] | None:
        try:
            return out_shape(*shapes, **attrs)
        except ValueError:
            return None

    return shape


@_unfit_is_unknown
def _addmm_shape(bias: tuple[int, ...], m1: tuple[int, ...], m2: tuple[int, ...], **attrs: Any) -> tuple[int, ...]:
    return _addmm_check(bias, m1, m2)


def _addmm_vjp(
    g: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray,
    m1: np.ndarray,
    m2: np.ndarray,
    beta: float = 1.0,
    alpha: float = 1.0,
    needs_input_grad: Sequence[bool] = (True, True, True),
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    from graphsvc.ops import unbroadcast

    need_bias, need_m1, need_m2 = needs_input_grad
    g_bias = unbroadcast(_scaled(g, float(beta)), bias.shape) if need_bias else None
    g_m1 = _scaled(np.matmul(g, m2.T), float(alpha), in_place=True) if need_m1 else None
    g_m2 = _scaled(np.matmul(m1.T, g), float(alpha), in_place=True) if need_m2 else None
    return g_bias, g_m1, g_m2


def _addmm_samples(rng: np.random.Generator) -> Samples:
    return [
        ((rng.standard_normal(2), rng.standard_normal((3, 4)), rng.standard_normal((4, 2))), {}),
        (
            (rng.standard_normal((3, 1)), rng.standard_normal((3, 2)), rng.standard_normal((2, 5))),
            {"beta": 0.5, "alpha": -2.0},
        ),
        ((rng.standard_normal((3, 2)), rng.standard_normal((3, 4)), rng.standard_normal((4, 2))), {"beta": 0.0}),
        ((rng.standard_normal(()), rng.standard_normal((1, 3)), rng.standard_normal((3, 1))), {"alpha": 3.0}),
    ]


# -- layer_norm and batch_norm: x normalized by its mean and biased variance, then scaled and shifted
def _normalized_axes(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, normalized_shape: Any) -> tuple[int, ...]:
    """The trailing axes layer_norm normalizes over, with its inputs checked against ``normalized_shape``."""
    dims = normalized_shape if isinstance(normalized_shape, (list, tuple)) else [normalized_shape]
    if not dims or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in dims):
        raise ValueError(f"normalized_shape must be a non-empty list of positive integers, not {normalized_shape!r}")
    shape = tuple(int(n) for n in dims)
    if x.ndim < len(shape) or x.shape[x.ndim - len(shape) :] != shape:
        raise ValueError(f"x of shape {_shape(x.shape)} does not end with normalized_shape {_shape(shape)}")
    for name, a in (("x", x), ("weight", weight), ("bias", bias)):
        _floats(name, a)
        if name != "x" and a.shape != shape:
            raise ValueError(f"{name} must have normalized_shape {_shape(shape)}, not {_shape(a.shape)}")
    return tuple(range(x.ndim - len(shape), x.ndim))


#: What layer_norm and batch_norm keep for their VJPs: x normalized, and 1 / sqrt(var + eps)
#: (layer_norm's as rows of the normalized shape, batch_norm's in x's shape with channels (1, C, 1, ...)).
_Normalized = tuple[np.ndarray, np.ndarray]


def _layer_norm_with_residuals(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, normalized_shape: Any, eps: float = 1e-5
) -> tuple[np.ndarray, _Normalized]:
    axes = _normalized_axes(x, weight, bias, normalized_shape)
    eps = _number("eps", eps)
    size = math.prod(x.shape[a] for a in axes)
    rows = x.reshape(-1, size)  # one row per group normalized together; in place below, on arrays made here
    means = _row_means(rows)
    xhat = rows - means.reshape(-1, 1)
    rstd = np.einsum("ij,ij->i", xhat, xhat).reshape(-1, 1)  # each row's sum of squares
    rstd /= x.dtype.type(size)
    rstd += x.dtype.type(eps)
    np.reciprocal(np.sqrt(rstd, out=rstd), out=rstd)
    xhat *= rstd
    out = xhat * weight.reshape(size)
    out += bias.reshape(size)
    return out.reshape(x.shape), (xhat, rstd)


def _layer_norm_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    normalized_shape: Any,
    eps: float = 1e-5,
    needs_input_grad: Sequence[bool] = (True, True, True),
    residuals: _Normalized | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    if residuals is None:
        residuals = _layer_norm_with_residuals(x, weight, bias, normalized_shape, eps)[1]
    xhat, rstd = residuals
    need_x, need_weight, need_bias = needs_input_grad
    rows = g.reshape(xhat.shape)
    gx = None
    if need_x:  # rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)), gxhat = g * weight
        gx = rows * weight.reshape(-1)
        along = np.einsum("ij,ij->i", gx, xhat).reshape(-1, 1)
        along /= x.dtype.type(xhat.shape[1])
        gx -= _row_means(gx).reshape(-1, 1)
        gx -= xhat * along
        gx *= rstd
        gx = gx.reshape(x.shape)
    g_weight = np.einsum("ij,ij->j", rows, xhat).reshape(weight.shape) if need_weight else None
    g_bias = np.matmul(np.ones(len(rows), rows.dtype), rows).reshape(bias.shape) if need_bias else None
    return gx, g_weight, g_bias


def _row_means(rows: np.ndarray) -> np.ndarray:
    """The mean of each row of a matrix, as a product with a column of 1/n (a BLAS call: a fifth of
    the time of ``mean(axis=1)`` on 512 rows of 128 float32); ``mean`` where the dtype is not
    BLAS's or a row is empty."""
    if rows.shape[1] == 0 or rows.dtype.kind != "f":
        return rows.mean(axis=1)
    return np.matmul(rows, np.full(rows.shape[1], 1 / rows.shape[1], dtype=rows.dtype))


def _layer_norm_samples(rng: np.random.Generator) -> Samples:
    def sample(
        shape: tuple[int, ...], normalized: list[int], eps: float = 1e-5
    ) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
        return (
            (rng.standard_normal(shape), rng.uniform(0.5, 2.0, normalized), rng.standard_normal(normalized)),
            {"normalized_shape": normalized} if eps == 1e-5 else {"normalized_shape": normalized, "eps": eps},
        )

    return [sample((3, 4), [4]), sample((2, 3, 4), [3, 4], 0.1), sample((5,), [5])]


def _batch_norm_layout(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, stats: Sequence[np.ndarray], training: Any, eps: Any
) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """batch_norm's checks; the axes it reduces (all but the channels, axis 1), the shape (1, C, 1, ...)
    its per-channel arrays take against x, and eps."""
    if not isinstance(training, bool):
        raise ValueError(f"training must be true or false, not {training!r}")
    eps = _number("eps", eps)
    _floats("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must have a batch and a channel axis (N, C, ...), not shape {_shape(x.shape)}")
    if len(stats) == 1:
        raise ValueError("give running_mean and running_var both, or neither")
    if not training and not stats:
        raise ValueError("training false uses running_mean and running_var: give them as inputs 4 and 5")
    channels = (x.shape[1],)
    for name, a in (("weight", weight), ("bias", bias), *zip(("running_mean", "running_var"), stats, strict=False)):
        _floats(name, a)
        if a.shape != channels:
            raise ValueError(f"{name} must have shape {_shape(channels)} (x's channels), not {_shape(a.shape)}")
    return (0, *range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2), eps


def _batch_norm_with_residuals(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *stats: np.ndarray, training: bool = True, eps: float = 1e-5
) -> tuple[np.ndarray, _Normalized]:
    axes, shape, eps = _batch_norm_layout(x, weight, bias, stats, training, eps)
    if training:
        count = math.prod(x.shape[a] for a in axes)
        mean = (_channel_sums(x) / count).astype(x.dtype).reshape(shape)
        xhat = x - mean
        variance = _channel_sums(np.square(xhat)) / count
    else:
        xhat, variance = x - stats[0].astype(x.dtype, copy=False).reshape(shape), stats[1]
    rstd = (1 / np.sqrt(variance + eps)).astype(x.dtype).reshape(shape)
    xhat *= rstd  # in place: an array made here
    out = xhat * weight.reshape(shape)
    out += bias.reshape(shape)
    return out, (xhat, rstd)


def _channel_sums(a: np.ndarray) -> np.ndarray:
    """The sum of each channel (axis 1) of ``a``, float64: each image's pixels summed pairwise in
    ``a``'s dtype, then the batch in float64 (PyTorch's CPU kernel sums in float64, its acc_type; the
    two agree far inside float32's rounding, in about half the time of casting every element)."""
    return a.reshape(a.shape[0], a.shape[1], math.prod(a.shape[2:])).sum(axis=2).sum(axis=0, dtype=np.float64)


def _batch_norm_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    *stats: np.ndarray,
    training: bool = True,
    eps: float = 1e-5,
    needs_input_grad: Sequence[bool] | None = None,
    residuals: _Normalized | None = None,
) -> list[np.ndarray | None]:
    axes, shape, _ = _batch_norm_layout(x, weight, bias, stats, training, eps)
    if residuals is None:
        residuals = _batch_norm_with_residuals(x, weight, bias, *stats, training=training, eps=eps)[1]
    xhat, rstd = residuals
    needs = needs_input_grad or (True,) * (3 + len(stats))
    dtype = x.dtype

    def total(a: np.ndarray) -> np.ndarray:  # per channel, the batch summed in float64
        return _channel_sums(a).astype(dtype)

    g_weight = total(g * xhat) if needs[1] or (needs[0] and training) else None
    g_bias = total(g) if needs[2] or (needs[0] and training) else None
    scale = weight.reshape(shape) * rstd  # d out / d x at fixed statistics
    gx = None
    if needs[0]:
        gx = g * scale
        if training:  # the batch's mean and variance depend on x too
            count = dtype.type(math.prod(x.shape[a] for a in axes))
            assert g_weight is not None and g_bias is not None
            gx = gx - scale * (g_bias.reshape(shape) + xhat * g_weight.reshape(shape)) / count
    gradients: list[np.ndarray | None] = [gx, g_weight if needs[1] else None, g_bias if needs[2] else None]
    for i in range(3, 3 + len(stats)):
        if not needs[i]:
            gradients.append(None)
        elif training:  # not read: the output does not depend on them
            gradients.append(np.zeros(x.shape[1], dtype=dtype))
        elif i == 3:  # running_mean
            gradients.append(-total(g * scale))
        else:  # running_var: d rstd / d var = -rstd**3 / 2
            gradients.append(total(g * scale * xhat * rstd) * dtype.type(-0.5))
    return gradients


def _batch_norm_samples(rng: np.random.Generator) -> Samples:
    def channel(c: int, low: float = -1.0) -> np.ndarray:
        return rng.uniform(low, 2.0, c)

    return [
        ((rng.standard_normal((4, 3)), channel(3, 0.5), channel(3)), {}),
        ((rng.standard_normal((2, 3, 2, 2)), channel(3, 0.5), channel(3)), {"eps": 0.01}),
        ((rng.standard_normal((2, 2, 3)), channel(2, 0.5), channel(2), channel(2), channel(2, 0.5)), {}),
        (
            (rng.standard_normal((2, 2, 3)), channel(2, 0.5), channel(2), channel(2), channel(2, 0.5)),
            {"training": False},
        ),
    ]


# -- scaled_dot_product_attention: softmax(q @ k^T * scale + mask) @ v
def _attention_shapes(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], mask: tuple[int, ...] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The scores' shape (..., L, S) and the output's (..., L, Ev); ValueError for shapes that do not fit."""
    if len(q) < 2 or len(k) < 2 or len(v) < 2:
        raise ValueError(
            f"q, k and v must have at least 2 dimensions (..., L, E), not shapes {_shape(q)}, {_shape(k)}, {_shape(v)}"
        )
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(
            f"q of shape {_shape(q)}, k of shape {_shape(k)} and v of shape {_shape(v)} do not fit: "
            "expected q (..., L, E), k (..., S, E), v (..., S, Ev)"
        )
    try:
        batch = _broadcast(q[:-2], k[:-2], v[:-2])
    except ValueError:
        raise ValueError(
            f"the batch axes of q {_shape(q)}, k {_shape(k)} and v {_shape(v)} do not broadcast together"
        ) from None
    scores = (*batch, q[-2], k[-2])
    if mask is not None:
        try:
            if _broadcast(mask, scores) != scores:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"an attn_mask of shape {_shape(mask)} does not broadcast to the scores' shape {_shape(scores)}"
            ) from None
    return scores, (*batch, q[-2], v[-1])


@_unfit_is_unknown
def _attention_shape(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], *mask: tuple[int, ...], **attrs: Any
) -> tuple[int, ...]:
    """out_shape: the larger of the scores (..., L, S) and the output (..., L, Ev)."""
    scores, output = _attention_shapes(q, k, v, mask[0] if mask else None)
    return max(scores, output, key=math.prod)


def _attention_scores(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Sequence[np.ndarray], scale: Any, is_causal: Any
) -> tuple[np.ndarray, float]:
    """q @ k^T * scale with the mask applied (-inf where a position takes no part), an array made
    here (the caller may write into it), and the scale."""
    _attention_shapes(q.shape, k.shape, v.shape, mask[0].shape if mask else None)
    for name, a in (("q", q), ("k", k), ("v", v)):
        _floats(name, a)
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be true or false, not {is_causal!r}")
    if is_causal and mask:
        raise ValueError("give an attn_mask or is_causal, not both")
    factor = 1 / math.sqrt(q.shape[-1]) if scale is None else _number("scale", scale)
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    if not scores.flags.writeable:
        scores = scores.copy()
    scores = _scaled(scores, factor, in_place=True)
    dtype = scores.dtype
    if is_causal:  # an added -inf above the diagonal: a third of the time of writing it through a boolean index
        scores += np.where(np.tri(q.shape[-2], k.shape[-2], dtype=bool), dtype.type(0), dtype.type(-np.inf))
    elif mask:
        m = mask[0]
        if m.dtype.kind == "f":
            scores += m.astype(dtype, copy=False)
        else:
            scores = np.where(m != 0, scores, dtype.type(-np.inf))
    return scores, factor


def _row_sums(a: np.ndarray) -> np.ndarray:
    """The sum along the last axis of a stack of matrices, keeping that axis (size 1): a product with a
    column of ones (one BLAS call per matrix: a sixth of the time of ``sum(axis=-1)`` on the attention
    scores of a transformer layer, 8x4x64x64 float32); ``sum`` where the dtype is not BLAS's or an
    axis is empty."""
    if a.size == 0 or a.dtype.kind != "f":
        return a.sum(axis=-1, keepdims=True)
    return np.matmul(a, np.ones((a.shape[-1], 1), dtype=a.dtype))


#: What scaled_dot_product_attention keeps for its VJP: the softmax's numerators exp(scores - row max)
#: (..., L, S) and their row sums (..., L, 1), 1 where a row is masked out entirely.
_Attention = tuple[np.ndarray, np.ndarray]


def _attention_with_residuals(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *attn_mask: np.ndarray,
    scale: float | None = None,
    is_causal: bool = False,
) -> tuple[np.ndarray, _Attention]:
    """The output (weights @ v, the weights exp / its row sum), computed as (exp @ v) / row sum: the
    division on the output (..., L, Ev) rather than on the weights (..., L, S); the same for the VJP."""
    scores, _ = _attention_scores(q, k, v, attn_mask, scale, is_causal)
    top = _max_along(scores, -1)
    top[~np.isfinite(top)] = 0  # a row every position is masked out of: weights 0, as PyTorch gives
    numerators = np.exp(np.subtract(scores, top, out=scores), out=scores)  # in place: the scores are made here
    total = _row_sums(numerators)
    total[total == 0] = 1  # such a row's numerators stay 0, and so does its output
    out = np.matmul(numerators, v)
    return np.divide(out, total, out=out), (numerators, total)


def _attention_vjp(
    g: np.ndarray,
    out: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *attn_mask: np.ndarray,
    scale: float | None = None,
    is_causal: bool = False,
    needs_input_grad: Sequence[bool] | None = None,
    residuals: _Attention | None = None,
) -> list[np.ndarray | None]:
    """With the weights w = e / t (e the numerators, t their row sums): v's cotangent w^T @ g =
    e^T @ (g / t), the scores' w * (g @ v^T - rowsum(g * out)) = e * ((g / t) @ v^T - rowsum((g / t) * out))
    (softmax's VJP; rowsum(g @ v^T * w) is rowsum(g * out), PyTorch's flash attention's), then
    q's and k's through the product q @ k^T * scale."""
    from graphsvc.ops import unbroadcast

    numerators, total = (
        _attention_with_residuals(q, k, v, *attn_mask, scale=scale, is_causal=is_causal)[1]
        if residuals is None
        else residuals
    )
    factor = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    needs = needs_input_grad or (True,) * (3 + len(attn_mask))
    g_out = np.divide(g, total)  # g / t: (..., L, Ev)
    g_v = unbroadcast(np.matmul(np.swapaxes(numerators, -1, -2), g_out), v.shape) if needs[2] else None
    g_q = g_k = g_mask = None
    float_mask = bool(attn_mask) and attn_mask[0].dtype.kind == "f"
    if needs[0] or needs[1] or (float_mask and needs[3]):
        g_scores = np.matmul(g_out, np.swapaxes(v, -1, -2))  # the weights' cotangent over t, then in place the scores'
        g_out *= out
        g_scores -= _row_sums(g_out)
        g_scores *= numerators
        if needs[0]:
            g_q = unbroadcast(_scaled(np.matmul(g_scores, k), factor, in_place=True), q.shape)
        if needs[1]:
            g_k = unbroadcast(_scaled(np.matmul(np.swapaxes(g_scores, -1, -2), q), factor, in_place=True), k.shape)
        if float_mask and needs[3]:
            g_mask = unbroadcast(g_scores, attn_mask[0].shape)
    return [g_q, g_k, g_v, *([g_mask] if attn_mask else [])]


def _attention_samples(rng: np.random.Generator) -> Samples:
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    keep = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 1]])
    return [
        ((q, k, v), {}),
        ((q, k, v), {"scale": 0.3}),
        ((q, k, v, keep), {}),
        ((q, k, v, rng.standard_normal((3, 5))), {}),
        (
            (rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3)), rng.standard_normal((1, 4, 2))),
            {"is_causal": True},
        ),
        ((rng.standard_normal((3, 2)), rng.standard_normal((2, 2)), rng.standard_normal((2, 3))), {}),
    ]


# -- stack, slice, where
def _stack(*inputs: np.ndarray, axis: int = 0) -> np.ndarray:
    shape = inputs[0].shape
    for x in inputs[1:]:
        if x.shape != shape:
            raise ValueError(f"every input must have one shape: {_shape(shape)} and {_shape(x.shape)} differ")
    return np.stack(inputs, axis=_axis(axis, len(shape) + 1))


def _stack_shape(*shapes: tuple[int, ...], axis: int = 0) -> tuple[int, ...] | None:
    if (
        len(set(shapes)) != 1
        or isinstance(axis, bool)
        or not isinstance(axis, int)
        or not -len(shapes[0]) - 1 <= axis <= len(shapes[0])
    ):
        return None
    at = axis % (len(shapes[0]) + 1)
    return (*shapes[0][:at], len(shapes), *shapes[0][at:])


def _stack_vjp(g: np.ndarray, out: np.ndarray, *inputs: np.ndarray, axis: int = 0) -> list[np.ndarray]:
    parts = np.moveaxis(g, axis % g.ndim, 0)
    return [parts[i, ...] for i in range(len(inputs))]  # 0-d arrays too, never numpy scalars


def _stack_samples(rng: np.random.Generator) -> Samples:
    return [
        ((rng.standard_normal((2, 3)), rng.standard_normal((2, 3))), {}),
        ((rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3))), {"axis": -1}),
        ((rng.standard_normal(()),), {}),
    ]


def _slice_index(x: np.ndarray, axis: Any, start: Any, stop: Any, step: Any) -> tuple[slice, ...]:
    """The index of x[start:stop:step] along ``axis``."""
    if x.ndim == 0:
        raise ValueError("a 0-d array has no axis to slice")
    at = _axis(axis, x.ndim)
    step_ = _integer("step", step)
    if step_ == 0:
        raise ValueError("step must not be 0")
    return (slice(None),) * at + (slice(_integer("start", start, none=True), _integer("stop", stop, none=True), step_),)


def _slice_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    axis: int = 0,
    start: int | None = None,
    stop: int | None = None,
    step: int = 1,
) -> tuple[np.ndarray]:
    gx = np.zeros(x.shape, dtype=g.dtype)
    gx[_slice_index(x, axis, start, stop, step)] = g
    return (gx,)


def _slice_samples(rng: np.random.Generator) -> Samples:
    x = rng.standard_normal((4, 5))
    return [
        ((x,), {"axis": 0, "start": 1, "stop": 3}),
        ((x,), {"axis": -1, "start": None, "stop": None, "step": 2}),
        ((x,), {"axis": 1, "start": -4, "stop": 9223372036854775807, "step": 2}),
        ((x,), {"axis": 0, "start": -1, "stop": None, "step": -2}),
    ]


def _where(condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if condition.dtype.kind not in "biu":
        raise ValueError(f"the condition must be bool or integers (nonzero: take x), not {condition.dtype}")
    try:
        np.broadcast_shapes(condition.shape, x.shape, y.shape)
    except ValueError:
        raise ValueError(
            f"the condition {_shape(condition.shape)}, x {_shape(x.shape)} and y {_shape(y.shape)} "
            "do not broadcast together"
        ) from None
    return np.where(condition if condition.dtype == bool else condition != 0, x, y)


@_unfit_is_unknown
def _where_shape(condition: tuple[int, ...], x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    return np.broadcast_shapes(condition, x, y)


def _where_vjp(
    g: np.ndarray,
    out: np.ndarray,
    condition: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    needs_input_grad: Sequence[bool] = (False, True, True),
) -> tuple[None, np.ndarray | None, np.ndarray | None]:
    from graphsvc.ops import unbroadcast

    chosen = condition if condition.dtype == bool else condition != 0
    zero = g.dtype.type(0)
    gx = unbroadcast(np.where(chosen, g, zero), x.shape) if needs_input_grad[1] and x.dtype.kind == "f" else None
    gy = unbroadcast(np.where(chosen, zero, g), y.shape) if needs_input_grad[2] and y.dtype.kind == "f" else None
    return None, gx, gy


def _where_samples(rng: np.random.Generator) -> Samples:
    condition = np.array([[1, 0, 0], [0, 1, 1]])
    return [
        ((condition, rng.standard_normal((2, 3)), rng.standard_normal((2, 3))), {}),
        ((condition, rng.standard_normal(3), rng.standard_normal(())), {}),
        ((np.array([True, False]).reshape(2, 1), rng.standard_normal((2, 3)), rng.standard_normal((1, 3))), {}),
    ]


# -- mse_loss and clamp
def _mse_loss(x: np.ndarray, target: np.ndarray, reduction: str = "mean") -> np.ndarray:
    if reduction not in NLL_REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(NLL_REDUCTIONS)}, not {reduction!r}")
    _floats("x", x)
    _floats("target", target)
    try:
        np.broadcast_shapes(x.shape, target.shape)
    except ValueError:
        raise ValueError(
            f"x of shape {_shape(x.shape)} and a target of shape {_shape(target.shape)} do not broadcast together"
        ) from None
    losses = np.square(x - target)
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.mean()


@_unfit_is_unknown
def _mse_loss_shape(x: tuple[int, ...], target: tuple[int, ...], reduction: str = "mean") -> tuple[int, ...]:
    """out_shape: the squared differences, x and the target broadcast together (reduced or not)."""
    return np.broadcast_shapes(x, target)


def _mse_loss_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    target: np.ndarray,
    reduction: str = "mean",
    needs_input_grad: Sequence[bool] = (True, True),
) -> tuple[np.ndarray | None, np.ndarray | None]:
    from graphsvc.ops import unbroadcast

    difference = x - target
    scale = 2 / difference.size if reduction == "mean" else 2.0
    each = np.multiply(g, difference, dtype=difference.dtype) * difference.dtype.type(scale)
    g_x = unbroadcast(each, x.shape) if needs_input_grad[0] else None
    g_target = unbroadcast(-each, target.shape) if needs_input_grad[1] else None
    return g_x, g_target


def _mse_loss_samples(rng: np.random.Generator) -> Samples:
    x, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    return [
        ((x, t), {}),
        ((x, t), {"reduction": "sum"}),
        ((x, t), {"reduction": "none"}),
        ((x, rng.standard_normal(4)), {}),
    ]


def _clamp_bounds(min: Any, max: Any) -> tuple[float | None, float | None]:
    if min is None and max is None:
        raise ValueError("give min, max or both")
    low = None if min is None else _number("min", min)
    high = None if max is None else _number("max", max)
    return low, high


def _clamp(x: np.ndarray, min: float | None = None, max: float | None = None) -> np.ndarray:
    low, high = _clamp_bounds(min, max)
    _floats("x", x)
    out = x if low is None else np.maximum(x, x.dtype.type(low))
    return out if high is None else np.minimum(out, x.dtype.type(high))


def _clamp_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, min: float | None = None, max: float | None = None
) -> tuple[np.ndarray]:
    low, high = _clamp_bounds(min, max)
    inside = np.ones(x.shape, dtype=bool)
    if low is not None:
        inside &= x >= x.dtype.type(low)
    if high is not None:
        inside &= x <= x.dtype.type(high)
    return (np.where(inside, g, g.dtype.type(0)),)


def _clamp_samples(rng: np.random.Generator) -> Samples:
    x = np.array([[-1.7, -0.6, 0.2], [0.9, 1.3, 2.4]])
    return [((x,), {"min": -1.0, "max": 1.0}), ((x,), {"min": 0.0}), ((x,), {"max": 0.5})]


BUILTIN_OPS: tuple[Op, ...] = (
    # -- leaf tags: values come from the file --------------------------------------------------------
    Op(LEAF, 0, forward=None, derivatives=None, doc="An input: a value a user may set (a weight, an x)."),
    Op(CONST, 0, forward=None, derivatives=None, doc="A constant that appeared in an expression (the 2 in 2*a)."),
    # -- elementwise: graphsvc.ops.opmath's table (arithmetic, exp/log, trigonometry, activations, piecewise)
    *(_elementwise(name) for name in opmath.RULES),
    # -- linear algebra ------------------------------------------------------------------------------
    Op(
        "matmul", 2,
        forward=_matmul,
        vjp=_matmul_vjp,
        out_shape=_matmul_shape,
        samples=_matmul_samples,
        doc="np.matmul: matrix product, batched over (broadcast) leading axes; 1-d operands promoted as numpy does.",
    ),
    # -- reductions (attributes: axis, an int, a list of ints or None for all; keepdims) ---------------
    Op(
        "sum", 1,
        forward=lambda x, axis=None, keepdims=False: x.sum(axis=_tuple(axis), keepdims=keepdims),
        vjp=lambda g, out, x, axis=None, keepdims=False: (_unreduce(g, x, axis, keepdims),),
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.sum over `axis` (default: all), keeping reduced axes with `keepdims`.",
    ),
    Op(
        "mean", 1,
        forward=lambda x, axis=None, keepdims=False: x.mean(axis=_tuple(axis), keepdims=keepdims),
        vjp=lambda g, out, x, axis=None, keepdims=False: (_unreduce(g / _count(x, axis), x, axis, keepdims),),
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.mean over `axis` (default: all), with `keepdims`.",
    ),
    Op(
        "amax", 1,
        forward=lambda x, axis=None, keepdims=False: x.max(axis=_tuple(axis), keepdims=keepdims),
        vjp=_amax_vjp,
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.amax over `axis` (default: all), with `keepdims`. Several maxima share the gradient evenly.",
    ),
    # -- shapes --------------------------------------------------------------------------------------
    Op(
        "reshape", 1,
        forward=lambda x, shape: x.reshape(shape),
        vjp=lambda g, out, x, shape: (g.reshape(x.shape),),
        samples=_unary_samples({"shape": [2, -1]}, {"shape": [12]}),
        doc="np.reshape to `shape` (a list; one entry may be -1).",
    ),
    Op(
        "transpose", 1,
        forward=lambda x, axes=None: x.transpose(axes),
        vjp=lambda g, out, x, axes=None: (g.transpose(None if axes is None else _inverse(_axes(axes, x.ndim))),),
        samples=_unary_samples({}, {"axes": [1, 2, 0]}, {"axes": [-1, 0, 1]}, shape=(2, 3, 4)),
        doc="np.transpose by `axes` (default: reversed).",
    ),
    Op(
        "broadcast_to", 1,
        forward=lambda x, shape: np.broadcast_to(x, shape),
        vjp=_broadcast_to_vjp,
        out_shape=_shape_attribute,
        samples=_unary_samples({"shape": [2, 3, 4]}, shape=(3, 1)),
        doc="np.broadcast_to `shape`. The gradient is summed back over the broadcast dimensions.",
    ),
    Op(
        "concatenate", 1,
        forward=lambda *inputs, axis=0: np.concatenate(inputs, axis=axis),
        vjp=_concatenate_vjp,
        samples=_concatenate_samples,
        variadic=True,
        doc="np.concatenate of one or more inputs along `axis` (default 0).",
    ),
    Op(
        "take", 2,
        forward=_take,
        vjp=_take_vjp,
        out_shape=_take_shape,
        samples=_take_samples,
        doc="np.take(x, indices, axis): indexing and embedding lookup; `indices` is an int64 input (no gradient).",
    ),
    # -- normalized exponentials ---------------------------------------------------------------------
    Op(
        "softmax", 1,
        forward=_softmax,
        vjp=lambda g, out, x, axis=-1: (out * (g - (g * out).sum(axis=axis, keepdims=True)),),
        samples=_unary_samples({}, {"axis": 0}),
        doc="exp(x) / sum(exp(x)) along `axis` (default -1), computed stably.",
    ),
    Op(
        "log_softmax", 1,
        forward=_log_softmax,
        vjp=lambda g, out, x, axis=-1: (g - np.exp(out) * g.sum(axis=axis, keepdims=True),),
        samples=_unary_samples({}, {"axis": 0}),
        doc="log(softmax(x)) along `axis` (default -1), computed stably: a cross-entropy's first half.",
    ),
    Op(
        "nll_loss", 2,
        forward=lambda x, target, reduction="mean", ignore_index=-100: _nll_loss_with_residuals(
            x, target, reduction, ignore_index
        )[0],
        forward_with_residuals=_nll_loss_with_residuals,
        vjp=_nll_loss_vjp,
        samples=_nll_loss_samples,
        doc=(
            "PyTorch's nll_loss: minus the log-probability each int64 target picks along axis 1 (axis 0 of one row), "
            "`reduction` mean (over the targets not ignored), sum or none, `ignore_index` (default -100; "
            "no class weights): log_softmax then nll_loss is a cross-entropy."
        ),
    ),
    # -- fused ops: one node where a PyTorch step has one (graphsvc.torch's capture maps ATen calls to them)
    Op(
        "addmm", 3,
        forward=_addmm,
        vjp=_addmm_vjp,
        out_shape=_addmm_shape,
        samples=_addmm_samples,
        doc=(
            "PyTorch's addmm: beta * bias + alpha * (m1 @ m2) (defaults 1), nn.Linear's forward; m1 (n, m) and "
            "m2 (m, p) are matrices and the bias broadcasts to (n, p) (its gradient is summed back); "
            "beta 0 ignores the bias."
        ),
    ),
    Op(
        "layer_norm", 3,
        forward=lambda x, weight, bias, normalized_shape, eps=1e-5: _layer_norm_with_residuals(
            x, weight, bias, normalized_shape, eps
        )[0],
        forward_with_residuals=_layer_norm_with_residuals,
        vjp=_layer_norm_vjp,
        samples=_layer_norm_samples,
        doc=(
            "PyTorch's layer_norm: x normalized over its trailing axes `normalized_shape` (a list) by their mean and "
            "biased variance (+ `eps`, default 1e-5), times weight plus bias (both of shape normalized_shape)."
        ),
    ),
    Op(
        "batch_norm", 3,
        forward=lambda x, weight, bias, *stats, training=True, eps=1e-5: _batch_norm_with_residuals(
            x, weight, bias, *stats, training=training, eps=eps
        )[0],
        forward_with_residuals=_batch_norm_with_residuals,
        vjp=_batch_norm_vjp,
        samples=_batch_norm_samples,
        variadic=True,
        max_arity=5,
        doc=(
            "PyTorch's batch_norm on x (N, C, ...): each channel (axis 1) normalized, times weight plus bias "
            "(both (C,)); `training` true (default) uses the batch's mean and biased variance, false the inputs "
            "running_mean and running_var (4 and 5, optional in training, where they are not read and not "
            "updated); `eps` 1e-5. The statistics are summed across the batch in float64, as PyTorch does. "
            "Running statistics get a gradient only when one is asked for (a captured step holds them as "
            "consts): zero in training, the exact one otherwise."
        ),
    ),
    Op(
        "scaled_dot_product_attention", 3,
        forward=lambda q, k, v, *attn_mask, scale=None, is_causal=False: _attention_with_residuals(
            q, k, v, *attn_mask, scale=scale, is_causal=is_causal
        )[0],
        forward_with_residuals=_attention_with_residuals,
        vjp=_attention_vjp,
        out_shape=_attention_shape,
        samples=_attention_samples,
        variadic=True,
        max_arity=4,
        doc=(
            "PyTorch's scaled_dot_product_attention without dropout: softmax(q @ k^T * scale + attn_mask) @ v over the "
            "last two axes, q (..., L, E), k (..., S, E), v (..., S, Ev), batch axes broadcast; `scale` defaults to "
            "1/sqrt(E). An optional 4th input attn_mask broadcasts to (..., L, S): integers (a bool mask as int64) "
            "say which positions take part (0: none), floats are added (and get a gradient); `is_causal` true "
            "masks out what lies above the diagonal (no attn_mask then). A row with every position masked out gives 0."
        ),
    ),
    Op(
        "stack", 1,
        forward=_stack,
        vjp=_stack_vjp,
        out_shape=_stack_shape,
        samples=_stack_samples,
        variadic=True,
        doc="np.stack of one or more inputs of one shape along a new `axis` (default 0; negative counts from the end).",
    ),
    Op(
        "slice", 1,
        forward=lambda x, axis=0, start=None, stop=None, step=1: x[_slice_index(x, axis, start, stop, step)],
        vjp=_slice_vjp,
        samples=_slice_samples,
        doc=(
            "x[start:stop:step] along `axis` (default 0), Python's slicing: negative start and stop count from the "
            "end, None (the default) and bounds past the end take all; `step` (default 1) is not 0. "
            "The gradient goes to the elements taken, zeros elsewhere."
        ),
    ),
    Op(
        "where", 3,
        forward=_where,
        vjp=_where_vjp,
        out_shape=_where_shape,
        samples=_where_samples,
        doc=(
            "np.where(condition, x, y): x where the condition (bool or integers, int64 in a file: nonzero) holds, "
            "else y, broadcast together; the condition gets no gradient (masked_fill is where)."
        ),
    ),
    Op(
        "mse_loss", 2,
        forward=_mse_loss,
        vjp=_mse_loss_vjp,
        out_shape=_mse_loss_shape,
        samples=_mse_loss_samples,
        doc=(
            "PyTorch's mse_loss: (x - target)**2, broadcast together, `reduction` mean (default), sum or none; "
            "both inputs get gradients."
        ),
    ),
    Op(
        "clamp", 1,
        forward=_clamp,
        vjp=_clamp_vjp,
        samples=_clamp_samples,
        doc=(
            "PyTorch's clamp: x limited to [`min`, `max`] (either may be left out, not both; min > max gives max). "
            "The gradient passes where min <= x <= max, bounds included, as PyTorch's does."
        ),
    ),
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register graphsvc's builtin ops."""
    for op in BUILTIN_OPS:
        register(op)
