"""Binary ops for graphsvc: hypot and atan2.

A worked example of a graphsvc plugin with two-input ops (see docs/plugins.md in graphsvc): the
derivatives return one partial derivative per input, in input order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op

__version__ = "0.1.0"

OPS: tuple[Op, ...] = (
    Op(
        "hypot", 2,
        forward=np.hypot,
        derivatives=lambda x, y, out: (x / out, y / out),
        doc="sqrt(x**2 + y**2), without overflow. d/dx = x/out, d/dy = y/out; nan at the origin, "
        "where hypot has no derivative.",
    ),
    Op(
        "atan2", 2,
        forward=np.arctan2,
        derivatives=lambda y, x, out: (x / (x * x + y * y), -y / (x * x + y * y)),
        doc="The angle of the point (x, y), in (-pi, pi]; inputs in the order (y, x), as in math.atan2. "
        "d/dy = x/(x**2 + y**2), d/dx = -y/(x**2 + y**2); nan at the origin.",
    ),
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register the binary ops."""
    for op in OPS:
        register(op)
