"""Activation ops for graphsvc: softplus, gelu, silu, leaky_relu and elu.

A worked example of a graphsvc plugin (see docs/plugins.md in graphsvc). Every op but ``gelu`` is
vectorized (numpy arrays in, arrays out). ``gelu`` is the exact, erf-based GELU; numpy has no erf,
so it is written with :func:`math.erf` on Python floats and declared ``vectorized=False``: graphsvc
then calls it once per element.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op

__version__ = "0.1.0"

_SQRT_2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / _SQRT_2))


def _gelu_derivatives(x: float, out: float) -> tuple[float]:
    # d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
    return (0.5 * (1.0 + math.erf(x / _SQRT_2)) + x * math.exp(-0.5 * x * x) / _SQRT_2PI,)


OPS: tuple[Op, ...] = (
    Op(
        "softplus", 1,
        forward=lambda x: np.logaddexp(0.0, x),
        derivatives=lambda x, out: (_sigmoid(x),),
        doc="log(1 + e ** x), computed without overflow. d/dx = sigmoid(x).",
    ),
    Op(
        "gelu", 1,
        forward=_gelu,
        derivatives=_gelu_derivatives,
        vectorized=False,
        doc="Exact GELU, x * Phi(x) with the erf-based normal CDF (not the tanh approximation). "
        "Per element: uses math.erf on Python floats.",
    ),
    Op(
        "silu", 1,
        forward=lambda x: x * _sigmoid(x),
        derivatives=lambda x, out: (_sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))),),
        doc="x * sigmoid(x) (also called swish).",
    ),
    Op(
        "leaky_relu", 1,
        forward=lambda x, alpha=0.01: np.where(x > 0, x, alpha * x),
        derivatives=lambda x, out, alpha=0.01: (np.where(x > 0, 1.0, alpha),),
        doc="x for x > 0, else alpha * x (attribute `alpha`, default 0.01). The derivative at 0 is alpha.",
    ),
    Op(
        "elu", 1,
        forward=lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(x)),
        derivatives=lambda x, out, alpha=1.0: (np.where(x > 0, 1.0, out + alpha),),
        doc="x for x > 0, else alpha * (e ** x - 1) (attribute `alpha`, default 1.0). "
        "d/dx = out + alpha for x <= 0.",
    ),
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register the activation ops."""
    for op in OPS:
        register(op)
