"""graphsvc's builtin ops: each local derivative against central finite differences, one line per op,
and the rules of the seeds worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.ops import Op, OpRegistry, evaluate, local_derivatives
from graphsvc.ops import builtin as builtin_ops
from graphsvc.testing import ulp_distance


def derivatives_at(op: Op, point: Sequence[float], attrs: Mapping[str, Any] | None = None) -> list[float]:
    inputs = [np.array([v], dtype=np.float64) for v in point]
    out = evaluate(op, inputs, attrs or {})
    return [float(d[0]) for d in local_derivatives(op, inputs, out, attrs or {})]


def central_differences(op: Op, point: Sequence[float], attrs: Mapping[str, Any], h: float = 1e-6) -> list[float]:
    slopes = []
    for i in range(op.arity):
        up = [np.array([v + h if j == i else v]) for j, v in enumerate(point)]
        down = [np.array([v - h if j == i else v]) for j, v in enumerate(point)]
        slopes.append(float((evaluate(op, up, attrs)[0] - evaluate(op, down, attrs)[0]) / (2 * h)))
    return slopes


# One line per builtin op: points away from kinks and ties, inside the domain.
@pytest.mark.parametrize(
    ("name", "points", "attrs"),
    [
        ("add", [(0.7, -1.3), (2.5, 4.0)], {}),
        ("sub", [(0.7, -1.3), (2.5, 4.0)], {}),
        ("mul", [(0.7, -1.3), (2.5, 4.0)], {}),
        ("div", [(0.7, -1.3), (2.5, 4.0)], {}),
        ("neg", [(0.7,), (-2.5,)], {}),
        ("pow", [(0.7,), (2.5,)], {"exponent": 3.0}),
        ("pow", [(0.7,), (2.5,)], {"exponent": -0.5}),
        ("exp", [(0.7,), (-2.5,)], {}),
        ("log", [(0.7,), (2.5,)], {}),
        ("sqrt", [(0.7,), (2.5,)], {}),
        ("sin", [(0.7,), (-2.5,)], {}),
        ("cos", [(0.7,), (-2.5,)], {}),
        ("tanh", [(0.7,), (-2.5,)], {}),
        ("relu", [(0.7,), (-2.5,)], {}),
        ("sigmoid", [(0.7,), (-2.5,)], {}),
        ("abs", [(0.7,), (-2.5,)], {}),
        ("max", [(0.7, -1.3), (2.5, 4.0)], {}),
        ("min", [(0.7, -1.3), (2.5, 4.0)], {}),
    ],
)
def test_local_derivatives_match_central_differences(
    registry: OpRegistry, name: str, points: list[tuple[float, ...]], attrs: dict[str, Any]
) -> None:
    op = registry.get(name)
    for point in points:
        assert derivatives_at(op, point, attrs) == pytest.approx(
            central_differences(op, point, attrs), rel=1e-6, abs=1e-8
        )


def test_the_builtins_are_exactly_the_documented_ops_registered_by_graphsvc(registry: OpRegistry) -> None:
    assert [op.name for op in registry] == [
        "abs", "add", "addmm", "amax", "batch_norm", "broadcast_to", "clamp", "concatenate", "const", "cos",
        "div", "exp", "layer_norm", "leaf", "log", "log_softmax", "matmul", "max", "mean", "min", "mse_loss",
        "mul", "neg", "nll_loss", "pow", "relu", "reshape", "scaled_dot_product_attention", "sigmoid", "sin",
        "slice", "softmax", "sqrt", "stack", "sub", "sum", "take", "tanh", "transpose", "where",
    ]  # fmt: skip
    assert {(op.plugin, op.plugin_version, op.version) for op in registry} == {("graphsvc", graphsvc.__version__, "1")}
    assert {op.name: op.arity for op in registry if op.arity != 1} == {
        "add": 2, "sub": 2, "mul": 2, "div": 2, "max": 2, "min": 2, "leaf": 0, "const": 0,
        "matmul": 2, "nll_loss": 2, "take": 2, "addmm": 3, "layer_norm": 3, "batch_norm": 3,
        "scaled_dot_product_attention": 3, "where": 3, "mse_loss": 2,
    }  # fmt: skip
    assert [(op.name, op.max_arity) for op in registry if op.variadic] == [
        ("batch_norm", 5), ("concatenate", None), ("scaled_dot_product_attention", 4), ("stack", None),
    ]  # fmt: skip


def test_the_builtins_come_through_the_same_hook_as_plugins() -> None:
    registered: list[Op] = []
    builtin_ops.graphsvc_register_ops(registered.append)
    assert registered == list(builtin_ops.BUILTIN_OPS)
    assert hasattr(builtin_ops.graphsvc_register_ops, "graphsvc_impl")  # marked with graphsvc.hookimpl


def test_the_leaf_tags_have_no_functions(registry: OpRegistry) -> None:
    for tag in (graphsvc.LEAF, graphsvc.CONST):
        op = registry.get(tag)
        assert (op.arity, op.forward, op.derivatives) == (0, None, None)


# -- the seeds' rules, by hand ---------------------------------------------------------------------
def test_add_distributes_the_gradient(registry: OpRegistry) -> None:
    assert derivatives_at(registry.get("add"), (2.0, 3.0)) == [1.0, 1.0]
    assert derivatives_at(registry.get("sub"), (2.0, 3.0)) == [1.0, -1.0]


def test_mul_swaps_the_multipliers(registry: OpRegistry) -> None:
    assert derivatives_at(registry.get("mul"), (3.0, 4.0)) == [4.0, 3.0]
    assert derivatives_at(registry.get("mul"), (3.0, 3.0)) == [3.0, 3.0]  # x*x: each slot gets x, 2x in total


def test_max_routes_the_gradient_to_the_larger_input(registry: OpRegistry) -> None:
    max_ = registry.get("max")
    assert derivatives_at(max_, (4.0, -1.0)) == [1.0, 0.0]
    assert derivatives_at(max_, (-1.0, 4.0)) == [0.0, 1.0]
    assert derivatives_at(registry.get("min"), (4.0, -1.0)) == [0.0, 1.0]


def test_a_tie_splits_the_gradient_evenly_as_documented(registry: OpRegistry) -> None:
    assert derivatives_at(registry.get("max"), (2.0, 2.0)) == [0.5, 0.5]
    assert derivatives_at(registry.get("min"), (2.0, 2.0)) == [0.5, 0.5]
    assert "on a tie each gets half" in registry.get("max").doc


def test_kinks_take_derivative_zero(registry: OpRegistry) -> None:
    assert derivatives_at(registry.get("relu"), (0.0,)) == [0.0]
    assert derivatives_at(registry.get("abs"), (0.0,)) == [0.0]
    assert derivatives_at(registry.get("abs"), (-3.0,)) == [-1.0]


def test_hand_worked_values(registry: OpRegistry) -> None:
    assert derivatives_at(registry.get("div"), (6.0, 3.0)) == pytest.approx([1 / 3, -6 / 9])
    assert derivatives_at(registry.get("pow"), (3.0,), {"exponent": 2.0}) == [6.0]
    assert derivatives_at(registry.get("sqrt"), (4.0,)) == [0.25]
    assert derivatives_at(registry.get("log"), (2.0,)) == [0.5]
    # exp's derivative is its output; tanh's is 1 - out**2. numpy's exp and tanh are not correctly
    # rounded (its SIMD loops and libm's math may differ in the last bit, by CPU), so against math
    # they agree within an ulp or two, and against the output exactly.
    (d_exp,) = derivatives_at(registry.get("exp"), (1.0,))
    assert d_exp == float(np.exp(np.array([1.0]))[0]) and ulp_distance(d_exp, math.e) <= 1
    (d_tanh,) = derivatives_at(registry.get("tanh"), (0.5,))
    assert d_tanh == 1.0 - float(np.tanh(np.array([0.5]))[0]) ** 2
    assert ulp_distance(d_tanh, 1.0 - math.tanh(0.5) ** 2) <= 4
    assert derivatives_at(registry.get("sigmoid"), (0.0,)) == [0.25]
    assert derivatives_at(registry.get("neg"), (7.0,)) == [-1.0]


def test_the_chain_rule_over_local_derivatives_gives_seed_004(registry: OpRegistry) -> None:
    """L = (a*b + c)*(a + b) at a=2, b=3, c=1: dL/da = 22, dL/db = 17, dL/dc = 5, worked by hand."""
    mul, add = registry.get("mul"), registry.get("add")
    a, b, c = 2.0, 3.0, 1.0
    ab, apb = a * b, a + b
    abc = ab + c
    d_abc, d_apb = derivatives_at(mul, (abc, apb))  # mul swaps: (apb, abc) = (5, 7)
    d_ab, d_c = (d_abc * d for d in derivatives_at(add, (ab, c)))  # add distributes
    d_a_mul, d_b_mul = (d_ab * d for d in derivatives_at(mul, (a, b)))
    d_a_add, d_b_add = (d_apb * d for d in derivatives_at(add, (a, b)))
    assert (d_a_mul + d_a_add, d_b_mul + d_b_add, d_c) == (22.0, 17.0, 5.0)


# -- the elementwise ops come from graphsvc.ops.opmath's table ------------------------------------------
def test_the_elementwise_ops_are_the_tables(registry: OpRegistry) -> None:
    from graphsvc.ops import opmath

    for name, rule in opmath.RULES.items():
        op = registry.get(name)
        assert (op.arity, op.doc, op.kernel, op.derivatives is not None) == (rule.arity, rule.doc, name, True)


def test_float64_transcendental_ops_run_the_compiled_loop_and_float32_stays_numpy(registry: OpRegistry) -> None:
    """Where the C extension is built, tanh of a float64 array is the C loop's (the code a compiled
    sweep runs), broadcasting included; float32 arrays keep numpy's loops and dtype."""
    from graphsvc.ops import opmath
    from tests.conftest import require_compiled

    jit = require_compiled()
    tanh, pow_ = registry.get("tanh"), registry.get("pow")
    x = np.random.default_rng(3).standard_normal((4, 5))
    assert tanh.forward is not None and pow_.forward is not None and pow_.derivatives is not None
    expected = jit.elementwise(opmath.CODES["tanh"], x.ravel(), x.ravel(), 0.0).reshape(4, 5)
    assert tanh.forward(x).tobytes() == expected.tobytes()
    assert tanh.forward(x[:, ::2]).tobytes() == expected[:, ::2].copy().tobytes()  # not contiguous
    cube = pow_.forward(x, exponent=3)
    assert cube.tobytes() == jit.elementwise(opmath.CODES["pow"], x.ravel(), x.ravel(), 3.0).reshape(4, 5).tobytes()
    (slope,) = pow_.derivatives(x, cube, exponent=3.0)
    assert (
        slope.shape == (4, 5)
        and slope.tolist() == (3.0 * np.array([xi**2 for xi in x.ravel().tolist()])).reshape(4, 5).tolist()
    )
    single = x.astype(np.float32)
    assert tanh.forward(single).dtype == np.float32
    assert tanh.forward(single).tobytes() == np.tanh(single).tobytes()
    with pytest.raises(TypeError, match="exponent"):
        pow_.forward(x)  # no exponent: the numpy function's own error, as before
