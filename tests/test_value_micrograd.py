"""micrograd's own engine tests (test/test_engine.py), rewritten for graphsvc.Value.

micrograd checks its Value against PyTorch. Here each test checks against values worked out by
hand (the derivation is in the comments), and also against PyTorch when it is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from graphsvc.value import Value
from tests.conftest import have_torch


def sanity_check(V: Callable[[float], Any]) -> tuple[Any, Any]:
    """micrograd's test_sanity_check expression; V makes a leaf (a Value or a tensor)."""
    x = V(-4.0)
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    return x, y


def more_ops(V: Callable[[float], Any]) -> tuple[Any, Any, Any]:
    """micrograd's test_more_ops expression, with its in-place forms (``c += ...``)."""
    a = V(-4.0)
    b = V(2.0)
    c = a + b
    d = a * b + b**3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + (b + a).relu()
    d = d + 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g = g + 10.0 / f
    g.backward()
    return a, b, g


def torch_leaf(value: float) -> Any:
    import torch

    return torch.tensor([value], dtype=torch.float64, requires_grad=True)


def test_sanity_check() -> None:
    x, y = sanity_check(Value)
    # At x = -4: z = 3x + 2 = -10, q = relu(z) + z*x = 0 + 40, h = relu(z*z) = 100,
    # y = h + q + q*x = 100 + 40 - 160 = -20.
    # dz/dx = 3; dq/dx = 0 (relu is off) + x*dz/dx + z = -12 - 10 = -22; dh/dx = 2z*dz/dx = -60;
    # dy/dx = dh/dx + dq/dx * (1 + x) + q = -60 + 66 + 40 = 46.
    assert (y.data, x.grad) == (-20.0, 46.0)
    if have_torch():
        xt, yt = sanity_check(torch_leaf)
        assert y.data == yt.item()
        assert x.grad == xt.grad.item()


def test_more_ops() -> None:
    a, b, g = more_ops(Value)
    # At a = -4, b = 2: c = 4(a + b) + 3 - a = 3a + 4b + 3 = -1, so dc/da = 3, dc/db = 4.
    # d1 = ab + b^3 = 0; d = 4(3 d1 + relu(a + b)) + relu(b - a) = 12 d1 + 0 + 6 = 6
    # (a + b = -2 turns the first relu off), so dd/da = 12b - 1 = 23, dd/db = 12(a + 3b^2) + 1 = 97.
    # e = c - d = -7: de/da = -20, de/db = -93. f = e^2 = 49, g = f/2 + 10/f = 24.5 + 10/49.
    # dg/de = (1/2 - 10/f^2) * 2e = -7 + 140/2401.
    dg_de = -7 + 140 / 2401
    tol = 1e-6  # micrograd's tolerance
    assert abs(g.data - (24.5 + 10 / 49)) < tol
    assert abs(a.grad - dg_de * -20) < tol
    assert abs(b.grad - dg_de * -93) < tol
    if have_torch():
        at, bt, gt = more_ops(torch_leaf)
        assert abs(g.data - gt.item()) < tol
        assert abs(a.grad - at.grad.item()) < tol
        assert abs(b.grad - bt.grad.item()) < tol


@pytest.mark.parametrize("x", [-1.0, 0.123, 2.0])
def test_unary_tanh_and_exp(x: float) -> None:
    # Newer micrograd also checks tanh and exp: d tanh = 1 - tanh^2, d exp = exp.
    for method, derivative in (("tanh", lambda t: 1 - t * t), ("exp", lambda e: e)):
        v = Value(x)
        out = getattr(v, method)()
        out.backward()
        assert v.grad == pytest.approx(derivative(out.data), rel=1e-12)
        if have_torch():
            xt = torch_leaf(x)
            yt = getattr(xt, method)()
            yt.sum().backward()
            assert abs(out.data - yt.item()) < 1e-12
            assert abs(v.grad - xt.grad.item()) < 1e-12


def test_in_place_forms_build_new_nodes() -> None:
    # ``c += c + 1`` in micrograd's test has no __iadd__: it rebinds c to a new node.
    c = Value(1.0)
    first = c
    c += c + 1
    assert c is not first and c.parents[0] is first and c.data == 3.0
