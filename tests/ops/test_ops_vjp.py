"""graphsvc.ops: unbroadcast (autograd's), the VJP of an elementwise op built from its local
derivatives, and a per-element op carried over arrays. Every number below is worked by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graphsvc.errors import ReplayError
from graphsvc.ops import Op, OpRegistry, _times, elementwise_vjp, per_element, unbroadcast

G = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


# -- unbroadcast -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((3,), [5.0, 7.0, 9.0]),  # the added leading dimension summed away
        ((1, 3), [[5.0, 7.0, 9.0]]),  # a stretched dimension summed, kept as 1
        ((2, 1), [[6.0], [15.0]]),
        ((1, 1), [[21.0]]),
        ((), 21.0),
        ((1,), [21.0]),  # added (2) and stretched (3 from 1)
    ],
)
def test_unbroadcast_sums_back_to_the_inputs_shape(shape: tuple[int, ...], expected: Any) -> None:
    result = unbroadcast(G, shape)
    assert result.shape == shape
    assert result.tolist() == expected


def test_unbroadcast_returns_a_gradient_of_the_right_shape_as_it_is() -> None:
    assert unbroadcast(G, (2, 3)) is G


def test_unbroadcast_sums_leading_axes_in_the_gradients_dtype_whatever_its_layout() -> None:
    """Leading axes summed away: a C-contiguous float array (through BLAS), a transposed one and an
    int64 one (numpy's sum), one with no elements; float32 stays float32."""
    g = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # g[i, j, k] = 12i + 4j + k
    summed = unbroadcast(g, (4,))  # sum over i and j of 12i + 4j + k = 3*12 + 2*12 + 6k = 60 + 6k
    assert summed.dtype == np.float32 and summed.tolist() == [60.0, 66.0, 72.0, 78.0]
    assert unbroadcast(g, (3, 4)).tolist() == [[12.0 + 8 * j + 2 * k for k in range(4)] for j in range(3)]
    transposed = g.transpose(2, 1, 0)  # [k, j, i]: over k and j, 12 * 12i + 4 * 4 * (0+1+2) + 3 * (0+1+2+3)
    assert not transposed.flags.c_contiguous
    assert unbroadcast(transposed, (2,)).tolist() == [66.0, 210.0]
    assert unbroadcast(g.astype(np.int64), (4,)).tolist() == [60, 66, 72, 78]
    assert unbroadcast(np.zeros((0, 3), dtype=np.float32), (3,)).tolist() == [0.0, 0.0, 0.0]


# -- elementwise_vjp ---------------------------------------------------------------------------------------
def test_the_vjp_of_mul_over_broadcast_inputs(registry: OpRegistry) -> None:
    x = np.array([1.0, 2.0, 3.0])  # (3,)
    y = np.array([[10.0], [20.0]])  # (2, 1)
    gx, gy = elementwise_vjp(registry.get("mul"))(G, x * y, x, y)
    # d/dx: g * y summed over rows: [1*10 + 4*20, 2*10 + 5*20, 3*10 + 6*20]
    assert gx.tolist() == [90.0, 120.0, 150.0]
    # d/dy: g * x summed over columns: [1 + 4 + 9, 4 + 10 + 18]
    assert gy.tolist() == [[14.0], [32.0]]


def test_only_the_wanted_input_gradients_are_made(registry: OpRegistry) -> None:
    x, y = np.array([2.0, 3.0]), np.array([5.0, 7.0])
    grads = elementwise_vjp(registry.get("mul"))(np.ones(2), x * y, x, y, needs_input_grad=(False, True))
    assert grads[0] is None
    assert grads[1].tolist() == [2.0, 3.0]


def test_add_and_sub_pass_the_gradient_on_without_a_call_and_in_its_dtype(registry: OpRegistry) -> None:
    g = np.array([1.5, -2.0], dtype=np.float32)
    x = np.zeros(2, dtype=np.float32)
    gx, gy = elementwise_vjp(registry.get("add"))(g, x, x, x)
    assert gx is g and gy is g  # partials of 1: the gradient itself
    gx, gy = elementwise_vjp(registry.get("sub"))(g, x, x, x)
    assert gx is g
    assert gy.dtype == np.float32 and gy.tolist() == [-1.5, 2.0]


@pytest.mark.parametrize(
    ("derivatives", "message"),
    [
        (lambda x, y, out: (1.0,), "derivatives returned 1, expected a tuple of 2 partial derivatives"),
        (lambda x, y, out: 3.0, "derivatives returned float, expected a tuple of 2 partial derivatives"),
        (lambda x, y, out: 1 / 0, "derivatives raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_broken_derivatives_function_is_a_replay_error_naming_the_op(derivatives: Any, message: str) -> None:
    op = Op("bad", 2, forward=lambda x, y: x + y, derivatives=derivatives)
    ones = np.ones(2)
    with pytest.raises(ReplayError) as info:
        elementwise_vjp(op)(ones, ones, ones, ones)
    assert str(info.value) == f"op 'bad' (an unnamed plugin): {message}"


# -- per_element -----------------------------------------------------------------------------------------
def _square_one_at_a_time() -> Op:
    def forward(x: float) -> float:
        assert isinstance(x, float)  # one element at a time
        return x * x

    return Op("square1", 1, forward=forward, derivatives=lambda x, out: (2 * x,), vectorized=False)


def test_per_element_forward_keeps_the_float_dtype_and_makes_integers_float64() -> None:
    forward = per_element(_square_one_at_a_time(), "forward")
    result = forward(np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float32))
    assert result.dtype == np.float32 and result.tolist() == [[1.0, 4.0], [9.0, 16.0]]
    result = forward(np.array([1, 2, 3]))
    assert result.dtype == np.float64 and result.tolist() == [1.0, 4.0, 9.0]


def test_the_vjp_of_a_per_element_op_goes_through_its_derivatives_an_element_at_a_time() -> None:
    x = np.array([1.0, 2.0, -3.0])
    (gx,) = elementwise_vjp(_square_one_at_a_time())(np.array([1.0, 0.5, 2.0]), x * x, x)
    assert gx.tolist() == [2.0, 2.0, -12.0]  # g * 2x


# -- _times: g * partial in g's dtype -------------------------------------------------------------------
def test_times_keeps_the_gradients_dtype() -> None:
    g = np.array([2.0, 4.0], dtype=np.float32)
    assert _times(g, 1) is g
    assert _times(g, -1).tolist() == [-2.0, -4.0]
    assert _times(g, 0.5).tolist() == [1.0, 2.0]
    product = _times(g, np.array([0.25, 3.0], dtype=np.float64))
    assert product.dtype == np.float32 and product.tolist() == [0.5, 12.0]
    chosen = _times(g, np.array([True, False]))
    assert chosen.dtype == np.float32 and chosen.tolist() == [2.0, 0.0]
