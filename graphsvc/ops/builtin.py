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


def _count(x: np.ndarray, axis: int | Sequence[int] | None) -> int:
    return math.prod(x.shape[a] for a in _axes(axis, x.ndim))


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
        batch = np.broadcast_shapes(x[:-2], y[:-2])
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
    if axis is None:
        np.add.at(gx.reshape(-1), indices.reshape(-1), g.reshape(-1))
    else:
        where: Any = (slice(None),) * (axis % x.ndim) + (indices,)
        np.add.at(gx, where, g)
    return gx, None


def _take(x: np.ndarray, indices: np.ndarray, axis: int | None = None) -> np.ndarray:
    if indices.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers (int64), not {indices.dtype}")
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


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


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
        vjp=lambda g, out, x, axes=None: (g.transpose(None if axes is None else np.argsort(_axes(axes, x.ndim))),),
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
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register graphsvc's builtin ops."""
    for op in BUILTIN_OPS:
        register(op)
