"""Vector-Jacobian products an op can build on: :func:`unbroadcast` (autograd's), the VJP of an
elementwise op from its local derivatives (:func:`elementwise_vjp`), and an elementwise op that
computes one element at a time carried over arrays (:func:`per_element`). They are defined in
:mod:`graphsvc.ops`, beside the op calls they make (:attr:`graphsvc.ops.Op.tensor_vjp` derives an
op's VJP with them); this module is where an op's author imports them from."""

from __future__ import annotations

from graphsvc.ops import elementwise_vjp, per_element, unbroadcast

__all__ = ["elementwise_vjp", "per_element", "unbroadcast"]
