"""graphsvc's own ops, registered through the same hook third-party plugins use.

One declaration per op, the forward function next to its local derivatives. The derivatives receive
the inputs, then the output ``out``, then the node's attributes as keywords, and return one partial
derivative per input. All functions work on float64 numpy arrays (every node of an op at once).

Conventions at the points where an op is not differentiable (the same as micrograd and PyTorch):

- ``relu`` at 0: derivative 0 (micrograd's ``out > 0``).
- ``abs`` at 0: derivative 0 (``sign(0)``).
- ``max`` and ``min`` on a tie (``x == y``): the gradient is split evenly, 0.5 to each input, as
  PyTorch's ``torch.maximum``/``torch.minimum`` do; it is also what a central difference measures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphsvc.graph import CONST, LEAF
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


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
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register graphsvc's builtin ops."""
    for op in BUILTIN_OPS:
        register(op)
