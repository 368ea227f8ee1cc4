"""graphsvc's own ops, registered through the same hook third-party plugins use.

One declaration per op, the forward function next to its local derivatives. The derivatives receive
the inputs, then the output ``out``, then the node's attributes as keywords, and return one partial
derivative per input. All functions work on float64 numpy arrays (every node of an op at once).

The tensor ops (numpy's names and semantics) come after them, each with its vector-Jacobian
product ``vjp(g, out, *inputs, **attrs)`` (see :mod:`graphsvc.ops`); the elementwise ops above work
on arrays too, with broadcasting.

Conventions at the points where an op is not differentiable (the same as micrograd and PyTorch):

- ``relu`` at 0: derivative 0 (micrograd's ``out > 0``).
- ``abs`` at 0: derivative 0 (``sign(0)``).
- ``max`` and ``min`` on a tie (``x == y``): the gradient is split evenly, 0.5 to each input, as
  PyTorch's ``torch.maximum``/``torch.minimum`` do; it is also what a central difference measures.
- ``amax`` with several maxima along the axis: the gradient is split evenly among them (PyTorch's
  ``amax``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsvc.graph import CONST, LEAF
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op
from graphsvc.tensors import unbroadcast


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# -- helpers of the tensor ops' VJPs -------------------------------------------------------------
def _axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """``axis`` (None: all) as a tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim if ndim else a for a in axes)


def _unreduce(g: np.ndarray, x: np.ndarray, axis: int | Sequence[int] | None, keepdims: bool) -> np.ndarray:
    """A reduction's gradient ``g`` with the reduced axes put back (size 1), broadcast to ``x``."""
    if not keepdims:
        g = np.expand_dims(g, _axes(axis, x.ndim))
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


_REDUCTIONS: tuple[dict[str, Any], ...] = ({}, {"axis": 1}, {"axis": -1, "keepdims": True}, {"axis": [0, 1]})


def _tuple(axis: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    """An ``axis`` attribute as numpy takes it (a file stores a list)."""
    return axis if axis is None or isinstance(axis, int) else tuple(axis)


def _count(x: np.ndarray, axis: int | Sequence[int] | None) -> int:
    return int(np.prod([x.shape[a] for a in _axes(axis, x.ndim)]))


def _matmul_vjp(g: np.ndarray, out: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 1 and y.ndim == 1:
        return g * y, g * x
    x2 = x[np.newaxis, :] if x.ndim == 1 else x  # np.matmul's promotion of 1-d operands
    y2 = y[:, np.newaxis] if y.ndim == 1 else y
    g2 = np.expand_dims(g, -2) if x.ndim == 1 else g
    g2 = np.expand_dims(g2, -1) if y.ndim == 1 else g2
    gx = unbroadcast(g2 @ np.swapaxes(y2, -1, -2), x2.shape)
    gy = unbroadcast(np.swapaxes(x2, -1, -2) @ g2, y2.shape)
    return gx.reshape(x.shape), gy.reshape(y.shape)


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
    gx = np.zeros_like(x)
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


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


BUILTIN_OPS: tuple[Op, ...] = (
    # -- leaf tags: values come from the file --------------------------------------------------------
    Op(LEAF, 0, forward=None, derivatives=None, doc="An input: a value a user may set (a weight, an x)."),
    Op(CONST, 0, forward=None, derivatives=None, doc="A constant that appeared in an expression (the 2 in 2*a)."),
    # -- arithmetic ----------------------------------------------------------------------------------
    Op(
        "add", 2,
        forward=lambda x, y: x + y,
        derivatives=lambda x, y, out: (1.0, 1.0),
        doc="x + y. Distributes the gradient: both inputs receive it unchanged.",
        kernel="add",
    ),
    Op(
        "sub", 2,
        forward=lambda x, y: x - y,
        derivatives=lambda x, y, out: (1.0, -1.0),
        doc="x - y.",
        kernel="sub",
    ),
    Op(
        "mul", 2,
        forward=lambda x, y: x * y,
        derivatives=lambda x, y, out: (y, x),
        doc="x * y. Swaps the multipliers: d/dx = y, d/dy = x.",
        kernel="mul",
    ),
    Op(
        "div", 2,
        forward=lambda x, y: x / y,
        derivatives=lambda x, y, out: (1.0 / y, -out / y),
        doc="x / y. d/dx = 1/y, d/dy = -x/y**2.",
        kernel="div",
    ),
    Op(
        "neg", 1,
        forward=lambda x: -x,
        derivatives=lambda x, out: (-1.0,),
        doc="-x.",
        kernel="neg",
    ),
    Op(
        "pow", 1,
        forward=lambda x, exponent: x**exponent,
        derivatives=lambda x, out, exponent: (exponent * x ** (exponent - 1),),
        doc="x ** exponent, with a constant exponent (attribute `exponent`). nan for x < 0 and a non-integer exponent.",
    ),
    # -- exponentials and logarithms -----------------------------------------------------------------
    Op(
        "exp", 1,
        forward=np.exp,
        derivatives=lambda x, out: (out,),
        doc="e ** x. Its own derivative: d/dx = out.",
    ),
    Op(
        "log", 1,
        forward=np.log,
        derivatives=lambda x, out: (1.0 / x,),
        doc="Natural logarithm. nan for x < 0, -inf at 0.",
    ),
    Op(
        "sqrt", 1,
        forward=np.sqrt,
        derivatives=lambda x, out: (0.5 / out,),
        doc="Square root. nan for x < 0; the derivative is inf at 0.",
    ),
    # -- trigonometry --------------------------------------------------------------------------------
    Op(
        "sin", 1,
        forward=np.sin,
        derivatives=lambda x, out: (np.cos(x),),
        doc="Sine (radians).",
    ),
    Op(
        "cos", 1,
        forward=np.cos,
        derivatives=lambda x, out: (-np.sin(x),),
        doc="Cosine (radians).",
    ),
    # -- activations ---------------------------------------------------------------------------------
    Op(
        "tanh", 1,
        forward=np.tanh,
        derivatives=lambda x, out: (1.0 - out**2,),
        doc="Hyperbolic tangent. d/dx = 1 - out**2.",
    ),
    Op(
        "relu", 1,
        forward=lambda x: np.maximum(x, 0.0),
        derivatives=lambda x, out: (np.where(out > 0, 1.0, 0.0),),
        doc="max(x, 0). The derivative at 0 is 0 (micrograd's out > 0).",
        kernel="relu",
    ),
    Op(
        "sigmoid", 1,
        forward=_sigmoid,
        derivatives=lambda x, out: (out * (1.0 - out),),
        doc="1 / (1 + e ** -x). d/dx = out * (1 - out).",
    ),
    # -- piecewise -----------------------------------------------------------------------------------
    Op(
        "abs", 1,
        forward=np.abs,
        derivatives=lambda x, out: (np.sign(x),),
        doc="|x|. The derivative at 0 is 0 (sign(0)).",
        kernel="abs",
    ),
    Op(
        "max", 2,
        forward=np.maximum,
        derivatives=lambda x, y, out: ((x > y) + 0.5 * (x == y), (y > x) + 0.5 * (x == y)),
        doc="The larger of x and y. Routes the gradient to the larger input; on a tie each gets half.",
        kernel="max",
    ),
    Op(
        "min", 2,
        forward=np.minimum,
        derivatives=lambda x, y, out: ((x < y) + 0.5 * (x == y), (y < x) + 0.5 * (x == y)),
        doc="The smaller of x and y. Routes the gradient to the smaller input; on a tie each gets half.",
        kernel="min",
    ),
    # -- linear algebra ------------------------------------------------------------------------------
    Op(
        "matmul", 2,
        forward=np.matmul,
        vjp=_matmul_vjp,
        samples=_matmul_samples,
        doc="np.matmul: matrix product, batched over (broadcast) leading axes; 1-d operands promoted as numpy does.",
    ),
    # -- reductions (attributes: axis, an int, a list of ints or None for all; keepdims) ---------------
    Op(
        "sum", 1,
        forward=lambda x, axis=None, keepdims=False: np.sum(x, axis=_tuple(axis), keepdims=keepdims),
        vjp=lambda g, out, x, axis=None, keepdims=False: (_unreduce(g, x, axis, keepdims),),
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.sum over `axis` (default: all), keeping reduced axes with `keepdims`.",
    ),
    Op(
        "mean", 1,
        forward=lambda x, axis=None, keepdims=False: np.mean(x, axis=_tuple(axis), keepdims=keepdims),
        vjp=lambda g, out, x, axis=None, keepdims=False: (_unreduce(g, x, axis, keepdims) / _count(x, axis),),
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.mean over `axis` (default: all), with `keepdims`.",
    ),
    Op(
        "amax", 1,
        forward=lambda x, axis=None, keepdims=False: np.amax(x, axis=_tuple(axis), keepdims=keepdims),
        vjp=_amax_vjp,
        samples=_unary_samples(*_REDUCTIONS),
        doc="np.amax over `axis` (default: all), with `keepdims`. Several maxima share the gradient evenly.",
    ),
    # -- shapes --------------------------------------------------------------------------------------
    Op(
        "reshape", 1,
        forward=lambda x, shape: np.reshape(x, shape),
        vjp=lambda g, out, x, shape: (np.reshape(g, x.shape),),
        samples=_unary_samples({"shape": [2, -1]}, {"shape": [12]}),
        doc="np.reshape to `shape` (a list; one entry may be -1).",
    ),
    Op(
        "transpose", 1,
        forward=lambda x, axes=None: np.transpose(x, axes),
        vjp=lambda g, out, x, axes=None: (np.transpose(g, None if axes is None else np.argsort(_axes(axes, x.ndim))),),
        samples=_unary_samples({}, {"axes": [1, 2, 0]}, {"axes": [-1, 0, 1]}, shape=(2, 3, 4)),
        doc="np.transpose by `axes` (default: reversed).",
    ),
    Op(
        "broadcast_to", 1,
        forward=lambda x, shape: np.broadcast_to(x, shape),
        vjp=lambda g, out, x, shape: (unbroadcast(g, x.shape),),
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
        samples=_take_samples,
        doc="np.take(x, indices, axis): indexing and embedding lookup; `indices` is an int64 input (no gradient).",
    ),
    # -- normalized exponentials ---------------------------------------------------------------------
    Op(
        "softmax", 1,
        forward=_softmax,
        vjp=lambda g, out, x, axis=-1: (out * (g - np.sum(g * out, axis=axis, keepdims=True)),),
        samples=_unary_samples({}, {"axis": 0}),
        doc="exp(x) / sum(exp(x)) along `axis` (default -1), computed stably.",
    ),
    Op(
        "log_softmax", 1,
        forward=_log_softmax,
        vjp=lambda g, out, x, axis=-1: (g - np.exp(out) * np.sum(g, axis=axis, keepdims=True),),
        samples=_unary_samples({}, {"axis": 0}),
        doc="log(softmax(x)) along `axis` (default -1), computed stably: a cross-entropy's first half.",
    ),
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register graphsvc's builtin ops."""
    for op in BUILTIN_OPS:
        register(op)
