"""One step of a backward pass, as ``--steps`` shows it, whichever engine replayed.

:func:`graphsvc.replay.columns.backward_steps` (float64 scalars) and
:func:`graphsvc.replay.arrays.backward` (arrays) both record :class:`Step`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Step"]


class Step(NamedTuple):
    """One node of the backward pass: its gradient, and for each parent ``(parent, local, sent)``.

    ``sent`` is what the node adds to the parent's gradient: ``grad * local`` for a scalar (a
    float), the cotangent of the op's VJP for an array (``None`` for an input that gets no
    gradient). ``local`` is the local derivative d(node)/d(parent) where the engine has one (the
    column engine's scalars), else ``None`` (a VJP maps gradients without one). A leaf's step has
    no contributions: it is where the gradient ends. (A NamedTuple: a million steps are cheap.)
    """

    node: int
    grad: Any
    contributions: list[tuple[int, Any, Any]]
