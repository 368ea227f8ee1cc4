"""The fused builtin ops (addmm, layer_norm, batch_norm, scaled_dot_product_attention, stack, slice,
where, mse_loss, clamp): values and gradients worked out by hand on tiny inputs, replayed as graphs
(loss = sum(y * c), so y's gradient is c), their edge cases, and their refusals, word for word.
tests/ops/test_builtin_fused_torch.py holds them to PyTorch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.errors import OpError, ReplayError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.ops import OpRegistry
from graphsvc.ops import builtin as builtin_ops
from graphsvc.testing import check_registry
from tests.conftest import run_cli

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

FUSED = (
    "addmm", "layer_norm", "batch_norm", "scaled_dot_product_attention", "stack", "slice", "where", "mse_loss", "clamp",
)  # fmt: skip


def builtins() -> OpRegistry:
    registry, problems = graphsvc.load_registry(disable_third_party=True)
    assert not problems
    return registry


def build(op: str, inputs: dict[str, Any], c: Any, attrs: dict[str, Any] | None = None, consts: str = "") -> Graph:
    """``y = op(*inputs)`` and ``loss = sum(y * c)``: y's gradient is ``c``. Inputs named in
    ``consts`` (letters or names, space-separated) are consts, the others leaves."""
    b = GraphBuilder()
    kept = consts.split()
    ids = [
        b.const(np.asarray(value), name=name) if name in kept else b.leaf(np.asarray(value), name=name)
        for name, value in inputs.items()
    ]
    y = b.add(op, ids, attrs=attrs, name="y")
    dtype = next((np.asarray(v).dtype for v in inputs.values() if np.asarray(v).dtype.kind == "f"), np.float64)
    b.add("sum", [b.add("mul", [y, b.const(np.asarray(c, dtype=dtype), name="c")])], name="loss")
    return b.build()


def backward(op: str, inputs: dict[str, Any], c: Any, attrs: dict[str, Any] | None = None, consts: str = "") -> Graph:
    return graphsvc.backward(build(op, inputs, c, attrs, consts), output="loss", registry=builtins())


def values(graph: Graph, name: str) -> Any:
    return np.asarray(graph.value(name)).tolist()


def grads(graph: Graph, *names: str) -> list[Any]:
    return [np.asarray(graph.grad(name)).tolist() for name in names]


# -- addmm ---------------------------------------------------------------------------------------------
def test_addmm_by_hand() -> None:
    """m1 @ m2 = [[19, 22], [43, 50]]; y = 0.5 * [10, 20] + 2 * that. With y's gradient all ones: the
    bias gets 0.5 * the column sums of ones (its broadcast row summed back), m1 2 * ones @ m2^T, m2
    2 * m1^T @ ones."""
    inputs = {"bias": [10.0, 20.0], "m1": [[1.0, 2.0], [3.0, 4.0]], "m2": [[5.0, 6.0], [7.0, 8.0]]}
    graph = backward("addmm", inputs, np.ones((2, 2)), {"beta": 0.5, "alpha": 2.0})
    assert values(graph, "y") == [[43.0, 54.0], [91.0, 110.0]]
    assert grads(graph, "bias", "m1", "m2") == [[1.0, 1.0], [[22.0, 30.0], [22.0, 30.0]], [[8.0, 8.0], [12.0, 12.0]]]


def test_addmm_bias_broadcasts_from_a_column_and_beta_zero_ignores_a_nan_bias() -> None:
    inputs = {"bias": [[1.0], [-1.0]], "m1": [[1.0, 2.0], [3.0, 4.0]], "m2": [[1.0, 0.0], [0.0, 1.0]]}
    graph = backward("addmm", inputs, [[1.0, 2.0], [3.0, 4.0]])
    assert values(graph, "y") == [[2.0, 3.0], [2.0, 3.0]]
    assert grads(graph, "bias") == [[[3.0], [7.0]]]  # each row's gradients summed
    inputs["bias"] = [[math.nan], [1.0]]
    graph = backward("addmm", inputs, np.ones((2, 2)), {"beta": 0.0})
    assert values(graph, "y") == [[1.0, 2.0], [3.0, 4.0]]
    assert grads(graph, "bias") == [[[0.0], [0.0]]]


# -- layer_norm ------------------------------------------------------------------------------------------
def test_layer_norm_by_hand() -> None:
    """Rows [0, 0, 2, 2] and [5, 5, 7, 7]: mean 1 (6), biased variance 1, so x normalized is
    [-1, -1, 1, 1] (eps 0). With weight [2, 1, 1, 1], bias [0, 0.5, 0, 0] and y's gradient 1 at
    column 0 of each row: the normalized x's gradient is [2, 0, 0, 0], its mean 1/2, its mean times
    x normalized -1/2, so x's is [2, 0, 0, 0] - 1/2 - [-1, -1, 1, 1] * -1/2 = [1, -1, 0, 0]; the weight
    gets sum(g * x normalized) over the rows, the bias sum(g)."""
    inputs = {"x": [[0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 7.0, 7.0]], "w": [2.0, 1.0, 1.0, 1.0], "b": [0.0, 0.5, 0.0, 0.0]}
    c = [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    for dtype in (np.float64, np.float32):
        typed = {name: np.array(value, dtype=dtype) for name, value in inputs.items()}
        graph = backward("layer_norm", typed, c, {"normalized_shape": [4], "eps": 0.0})
        assert graph.value("y").dtype == graph.grad("x").dtype == dtype  # type: ignore[union-attr]
        assert values(graph, "y") == [[-2.0, -0.5, 1.0, 1.0]] * 2
        assert grads(graph, "x", "w", "b") == [[[1.0, -1.0, 0.0, 0.0]] * 2, [-2.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]


def test_layer_norm_over_two_trailing_axes_and_eps() -> None:
    """normalized_shape [2, 2]: each (2, 2) block is one group, [[0, 0], [2, 2]] as above; eps 3
    makes 1 / sqrt(1 + 3) = 1/2."""
    x = np.array([[[0.0, 0.0], [2.0, 2.0]], [[1.0, 1.0], [3.0, 3.0]]])
    inputs = {"x": x, "w": np.ones((2, 2)), "b": np.zeros((2, 2))}
    graph = backward("layer_norm", inputs, np.ones_like(x), {"normalized_shape": [2, 2], "eps": 3.0})
    assert values(graph, "y") == [[[-0.5, -0.5], [0.5, 0.5]]] * 2
    assert grads(graph, "x") == [np.zeros_like(x).tolist()]  # a constant gradient: the mean takes it all
    assert grads(graph, "w", "b") == [[[-1.0, -1.0], [1.0, 1.0]], [[2.0, 2.0], [2.0, 2.0]]]


# -- batch_norm ------------------------------------------------------------------------------------------
BN_X = [[0.0, 1.0], [0.0, 3.0], [2.0, 1.0], [2.0, 3.0]]  # channel 0: mean 1, channel 1: mean 2; variance 1
BN_C = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_batch_norm_in_training_by_hand() -> None:
    """Channel 0 is layer_norm's row above (x's gradient [1, -1, 0, 0] with weight 2); channel 1,
    normalized [-1, 1, -1, 1] with weight 3 and gradient 1 at row 1: the normalized x's gradient is
    [0, 3, 0, 0], its mean 3/4 and its mean times x normalized 3/4, so x's is [0, 1.5, 0, -1.5]."""
    inputs = {"x": BN_X, "w": [2.0, 3.0], "b": [0.5, -1.0]}
    graph = backward("batch_norm", inputs, BN_C, {"eps": 0.0})
    assert values(graph, "y") == [[-1.5, -4.0], [-1.5, 2.0], [2.5, -4.0], [2.5, 2.0]]
    assert grads(graph, "x", "w", "b") == [[[1.0, 0.0], [-1.0, 1.5], [0.0, 0.0], [0.0, -1.5]], [-1.0, 1.0], [1.0, 1.0]]


def test_batch_norm_in_training_leaves_running_statistics_unread_and_gives_them_zeros() -> None:
    inputs = {"x": BN_X, "w": [2.0, 3.0], "b": [0.5, -1.0], "mean": [100.0, 100.0], "var": [9.0, 9.0]}
    graph = backward("batch_norm", inputs, BN_C, {"eps": 0.0})
    assert values(graph, "y") == [[-1.5, -4.0], [-1.5, 2.0], [2.5, -4.0], [2.5, 2.0]]
    assert grads(graph, "mean", "var") == [[0.0, 0.0], [0.0, 0.0]]


def test_batch_norm_in_evaluation_uses_the_running_statistics() -> None:
    """Running mean [1, 2], variance [4, 0.25] (eps 0): 1/std [0.5, 2]; x's gradient is g * weight /
    std; the running mean's -sum(g * weight / std), the running variance's
    sum(g * weight * (x - mean)) * -1/2 / std**3: 2 * -1 * -1/2 / 8 = 1/8 and 3 * 1 * -1/2 * 8 = -12."""
    inputs = {"x": BN_X, "w": [2.0, 3.0], "b": [0.5, -1.0], "mean": [1.0, 2.0], "var": [4.0, 0.25]}
    attrs = {"training": False, "eps": 0.0}
    graph = backward("batch_norm", inputs, BN_C, attrs, consts="mean var")
    assert values(graph, "y") == [[-0.5, -7.0], [-0.5, 5.0], [1.5, -7.0], [1.5, 5.0]]
    assert grads(graph, "x", "w", "b") == [[[1.0, 0.0], [0.0, 6.0], [0.0, 0.0], [0.0, 0.0]], [-0.5, 2.0], [1.0, 1.0]]
    assert np.isnan(graph.grad("mean")) and np.isnan(graph.grad("var"))  # type: ignore[arg-type]  # consts: data
    graph = backward("batch_norm", inputs, BN_C, attrs)
    assert grads(graph, "mean", "var") == [[-1.0, -6.0], [0.125, -12.0]]


def test_batch_norm_of_images_normalizes_each_channel_over_batch_and_pixels() -> None:
    x = np.arange(16.0).reshape(2, 2, 2, 2)  # channel 0: 0-3 and 8-11, mean 5.5
    graph = graphsvc.forward(build("batch_norm", {"x": x, "w": [1.0, 1.0], "b": [0.0, 10.0]}, x), registry=builtins())
    y = np.asarray(graph.value("y"))
    channel = np.array([0.0, 1, 2, 3, 8, 9, 10, 11])
    expected = (channel - 5.5) / np.sqrt(channel.var() + 1e-5)
    assert y[:, 0].ravel().tolist() == pytest.approx(expected.tolist(), rel=1e-15)
    assert y[:, 1].ravel().tolist() == pytest.approx((expected + 10).tolist(), rel=1e-15)


# -- scaled_dot_product_attention -----------------------------------------------------------------------
def test_attention_with_a_float_mask_by_hand() -> None:
    """q = 0, so the scores are the mask [log 3, 0]: weights [3/4, 1/4], y = [1.5, 2.5]. With y's
    gradient [1, 0]: v's is weights^T @ g; the weights' is g @ v^T = [1, 3], the scores' weights *
    (that - 1.5) = [-3/8, 3/8], which the mask gets as it is and q gets @ k / sqrt(2)."""
    inputs = {
        "q": [[0.0, 0.0]],
        "k": [[1.0, 0.0], [0.0, 1.0]],
        "v": [[1.0, 2.0], [3.0, 4.0]],
        "mask": [[math.log(3), 0.0]],
    }
    graph = backward("scaled_dot_product_attention", inputs, [[1.0, 0.0]])
    assert values(graph, "y")[0] == pytest.approx([1.5, 2.5], rel=1e-15)
    gq, gk, gv, gmask = grads(graph, "q", "k", "v", "mask")
    assert gq[0] == pytest.approx([-0.375 / math.sqrt(2), 0.375 / math.sqrt(2)], rel=1e-14)
    assert gk == [[0.0, 0.0], [0.0, 0.0]]  # q = 0
    assert np.allclose(gv, [[0.75, 0.0], [0.25, 0.0]], rtol=1e-15, atol=0)
    assert gmask[0] == pytest.approx([-0.375, 0.375], rel=1e-14)


def test_attention_causal_and_bool_masks_and_a_row_with_nothing_to_attend() -> None:
    """q = k = 0: equal weights among the positions a row may see. Causal: row 0 sees v[0], row 1
    the mean of v[0] and v[1]. An int64 mask (a bool one in a file) [[0, 1], [0, 0]]: row 0 sees v[1],
    row 1 nothing, which gives 0 and no gradient, as PyTorch does."""
    zeros = np.zeros((2, 2))
    inputs = {"q": zeros, "k": zeros, "v": [[1.0, 2.0], [3.0, 4.0]]}
    graph = backward("scaled_dot_product_attention", inputs, np.ones((2, 2)), {"is_causal": True})
    assert values(graph, "y") == [[1.0, 2.0], [2.0, 3.0]]
    assert grads(graph, "v") == [[[1.5, 1.5], [0.5, 0.5]]]
    inputs["mask"] = np.array([[0, 1], [0, 0]])
    graph = backward("scaled_dot_product_attention", inputs, np.ones((2, 2)), consts="mask")
    assert values(graph, "y") == [[3.0, 4.0], [0.0, 0.0]]
    assert grads(graph, "q", "v") == [[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 1.0]]]
    assert np.isnan(graph.grad("mask"))  # type: ignore[arg-type]  # a const: no gradient


def test_attention_batched_with_a_scale_and_k_v_broadcast_over_heads() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((1, 3, 6, 5)), rng.standard_normal((2, 1, 6, 2))
    graph = backward("scaled_dot_product_attention", {"q": q, "k": k, "v": v}, np.ones((2, 3, 4, 2)), {"scale": 0.25})
    scores = q @ np.swapaxes(k, -1, -2) * 0.25
    weights = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(graph.value("y"), weights @ v, rtol=1e-13)  # type: ignore[arg-type]
    assert [np.shape(g) for g in grads(graph, "q", "k", "v")] == [(2, 3, 4, 5), (1, 3, 6, 5), (2, 1, 6, 2)]
    np.testing.assert_allclose(
        graph.grad("v"), (np.swapaxes(weights, -1, -2) @ np.ones((2, 3, 4, 2))).sum(1, keepdims=True), rtol=1e-13
    )  # type: ignore[arg-type]


# -- stack, slice, where -------------------------------------------------------------------------------
def test_stack_along_a_negative_axis() -> None:
    graph = backward("stack", {"a": [1.0, 2.0], "b": [3.0, 4.0]}, [[1.0, 2.0], [3.0, 4.0]], {"axis": -1})
    assert values(graph, "y") == [[1.0, 3.0], [2.0, 4.0]]
    assert grads(graph, "a", "b") == [[1.0, 3.0], [2.0, 4.0]]
    graph = backward("stack", {"a": 1.5}, [2.0], {"axis": 0})  # 0-d inputs: a 1-d output, 0-d gradients
    assert values(graph, "y") == [1.5] and grads(graph, "a") == [2.0]


def test_slice_with_python_semantics() -> None:
    x = np.arange(10.0)
    graph = backward("slice", {"x": x}, [1.0, 2.0, 3.0, 4.0], {"axis": 0, "start": -7, "stop": None, "step": 2})
    assert values(graph, "y") == [3.0, 5.0, 7.0, 9.0]
    assert grads(graph, "x") == [[0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0]]
    x = np.arange(10.0).reshape(2, 5)
    attrs = {"axis": -1, "start": 1, "stop": 9223372036854775807, "step": 3}  # PyTorch's "to the end"
    graph = backward("slice", {"x": x}, [[1.0, 2.0], [3.0, 4.0]], attrs)
    assert values(graph, "y") == [[1.0, 4.0], [6.0, 9.0]]
    assert grads(graph, "x") == [[[0.0, 1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 0.0, 0.0, 4.0]]]
    graph = backward("slice", {"x": x}, np.zeros((2, 0)), {"axis": 1, "start": 7, "stop": 9})
    assert values(graph, "y") == [[], []]
    graph = backward("slice", {"x": x}, [[1.0, 2.0], [3.0, 4.0]], {"axis": 1, "step": -3})  # backwards, as Python
    assert values(graph, "y") == [[4.0, 1.0], [9.0, 6.0]]
    assert grads(graph, "x") == [[[0.0, 2.0, 0.0, 0.0, 1.0], [0.0, 4.0, 0.0, 0.0, 3.0]]]


def test_where_takes_x_where_the_condition_is_nonzero_and_gives_it_no_gradient() -> None:
    inputs = {"cond": np.array([1, 0, 2]), "x": [1.0, 2.0, 3.0], "y0": np.array(10.0)}
    graph = backward("where", inputs, [1.0, 2.0, 3.0], consts="cond")
    assert values(graph, "y") == [1.0, 10.0, 3.0]
    assert grads(graph, "x", "y0") == [[1.0, 0.0, 3.0], 2.0]  # the 0-d fill gets its one use's gradient
    assert np.isnan(graph.grad("cond"))  # type: ignore[arg-type]  # a const: no gradient


# -- mse_loss and clamp ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reduction", "value", "c", "gradient"),
    [
        ("mean", 13 / 3, 1.0, [0.0, 4 / 3, 2.0]),
        ("sum", 13.0, 1.0, [0.0, 4.0, 6.0]),
        ("none", [0.0, 4.0, 9.0], [1.0, 2.0, 3.0], [0.0, 8.0, 18.0]),
    ],
)
def test_mse_loss_by_hand(reduction: str, value: Any, c: Any, gradient: list[float]) -> None:
    """x - target = [0, 2, 3]: the squares [0, 4, 9]; x's gradient 2 (x - target) g (/ 3 for the
    mean), the target's its negative."""
    graph = backward("mse_loss", {"x": [1.0, 2.0, 3.0], "t": [1.0, 0.0, 0.0]}, c, {"reduction": reduction})
    assert values(graph, "y") == pytest.approx(value, rel=1e-15)
    gx, gt = grads(graph, "x", "t")
    assert gx == pytest.approx(gradient, rel=1e-15) and gt == pytest.approx([-g for g in gradient], rel=1e-15)


def test_mse_loss_with_a_broadcast_target_sums_its_gradient_back() -> None:
    graph = backward("mse_loss", {"x": [[1.0, 2.0], [3.0, 4.0]], "t": [1.0, 1.0]}, 1.0, {"reduction": "sum"})
    assert values(graph, "y") == 14.0  # 0 + 1 + 4 + 9
    assert grads(graph, "x", "t") == [[[0.0, 2.0], [4.0, 6.0]], [-4.0, -8.0]]


def test_clamp_passes_the_gradient_between_the_bounds_included() -> None:
    x = [-2.0, -1.0, 0.0, 1.0, 2.0]
    graph = backward("clamp", {"x": np.array(x, dtype=np.float32)}, [1.0] * 5, {"min": -1.0, "max": 1.0})
    assert graph.value("y").dtype == np.float32 and values(graph, "y") == [-1.0, -1.0, 0.0, 1.0, 1.0]  # type: ignore[union-attr]
    assert grads(graph, "x") == [[0.0, 1.0, 1.0, 1.0, 0.0]]
    graph = backward("clamp", {"x": x}, [1.0] * 5, {"min": 1.0, "max": -1.0})  # min > max: max everywhere
    assert values(graph, "y") == [-1.0] * 5 and grads(graph, "x") == [[0.0] * 5]
    graph = backward("clamp", {"x": x}, [1.0] * 5, {"max": 0.0})
    assert values(graph, "y") == [-2.0, -1.0, 0.0, 0.0, 0.0] and grads(graph, "x") == [[1.0, 1.0, 1.0, 0.0, 0.0]]


# -- refusals: one line naming the node and the op ------------------------------------------------------
M = np.ones((2, 3))


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "message"),
    [
        (
            "addmm",
            [np.ones(2), M, np.ones((4, 5))],
            {},
            "m1 of shape [2, 3] and m2 of shape [4, 5] cannot be multiplied (3 != 4)",
        ),
        (
            "addmm",
            [np.ones(3), M, np.ones((3, 2))],
            {},
            "a bias of shape [3] does not broadcast to the product's shape [2, 2]",
        ),
        (
            "addmm",
            [np.ones(2), np.ones(3), np.ones((3, 2))],
            {},
            "m1 and m2 must be matrices (2 dimensions), not of shapes [3] and [3, 2]",
        ),
        ("addmm", [np.ones(2), M, np.ones((3, 2))], {"beta": "1"}, "beta must be a number, not '1'"),
        (
            "layer_norm",
            [M, np.ones(2), np.ones(2)],
            {"normalized_shape": [2]},
            "x of shape [2, 3] does not end with normalized_shape [2]",
        ),
        (
            "layer_norm",
            [M, np.ones(3), np.ones(2)],
            {"normalized_shape": [3]},
            "bias must have normalized_shape [3], not [2]",
        ),
        (
            "layer_norm",
            [M, np.ones(3), np.ones(3)],
            {"normalized_shape": []},
            "normalized_shape must be a non-empty list of positive integers, not []",
        ),
        (
            "layer_norm",
            [M, np.ones(3), np.ones(3)],
            {"normalized_shape": [2, 2, 3]},
            "x of shape [2, 3] does not end with normalized_shape [2, 2, 3]",
        ),
        ("batch_norm", [M, np.ones(2), np.ones(3)], {}, "weight must have shape [3] (x's channels), not [2]"),
        (
            "batch_norm",
            [np.ones(3), np.ones(3), np.ones(3)],
            {},
            "x must have a batch and a channel axis (N, C, ...), not shape [3]",
        ),
        (
            "batch_norm",
            [M, np.ones(3), np.ones(3)],
            {"training": False},
            "training false uses running_mean and running_var: give them as inputs 4 and 5",
        ),
        (
            "batch_norm",
            [M, np.ones(3), np.ones(3), np.ones(3)],
            {},
            "give running_mean and running_var both, or neither",
        ),
        ("batch_norm", [M, np.ones(3), np.ones(3)], {"training": 1}, "training must be true or false, not 1"),
        (
            "batch_norm",
            [M.astype(np.int64), np.ones(3), np.ones(3)],
            {},
            "x must hold floats (float32, float64), not int64",
        ),
        (
            "scaled_dot_product_attention",
            [M, np.ones((4, 2)), np.ones((4, 2))],
            {},
            "q of shape [2, 3], k of shape [4, 2] and v of shape [4, 2] do not fit: "
            "expected q (..., L, E), k (..., S, E), v (..., S, Ev)",
        ),
        (
            "scaled_dot_product_attention",
            [M, M, M, np.ones((3, 2))],
            {},
            "an attn_mask of shape [3, 2] does not broadcast to the scores' shape [2, 2]",
        ),
        (
            "scaled_dot_product_attention",
            [M, M, M, np.ones((2, 2))],
            {"is_causal": True},
            "give an attn_mask or is_causal, not both",
        ),
        (
            "scaled_dot_product_attention",
            [np.ones(3), M, M],
            {},
            "q, k and v must have at least 2 dimensions (..., L, E), not shapes [3], [2, 3], [2, 3]",
        ),
        (
            "scaled_dot_product_attention",
            [np.ones((2, 2, 3)), np.ones((3, 2, 3)), np.ones((3, 2, 3))],
            {},
            "the batch axes of q [2, 2, 3], k [3, 2, 3] and v [3, 2, 3] do not broadcast together",
        ),
        ("stack", [M, np.ones((3, 2))], {}, "every input must have one shape: [2, 3] and [3, 2] differ"),
        ("stack", [M, M], {"axis": 3}, "axis 3 is out of range for 3 dimensions"),
        ("slice", [M], {"axis": 2, "start": 0, "stop": 1}, "axis 2 is out of range for 2 dimensions"),
        ("slice", [M], {"axis": 0, "start": 0, "stop": 1, "step": 0}, "step must not be 0"),
        ("slice", [M], {"axis": 0, "start": 0.5, "stop": 1}, "start must be an integer or None, not 0.5"),
        ("slice", [np.array(1.0)], {"axis": 0, "start": 0, "stop": 1}, "a 0-d array has no axis to slice"),
        ("where", [M, M, M], {}, "the condition must be bool or integers (nonzero: take x), not float64"),
        (
            "where",
            [np.ones(2, np.int64), M, M],
            {},
            "the condition [2], x [2, 3] and y [2, 3] do not broadcast together",
        ),
        ("mse_loss", [M, np.ones(2)], {}, "x of shape [2, 3] and a target of shape [2] do not broadcast together"),
        ("mse_loss", [M, M], {"reduction": "avg"}, "reduction must be one of mean, sum, none, not 'avg'"),
        ("clamp", [M], {}, "give min, max or both"),
        (
            "layer_norm",
            [M, np.ones(3), np.ones(3)],
            {"normalized_shape": True},
            "normalized_shape must be a non-empty list of positive integers, not True",
        ),
        (
            "layer_norm",
            [M, np.ones(3), np.ones(3)],
            {"normalized_shape": [3.0]},
            "normalized_shape must be a non-empty list of positive integers, not [3.0]",
        ),
        ("clamp", [M], {"min": None, "max": "1"}, "max must be a number, not '1'"),
    ],
)
def test_bad_inputs_and_attributes_are_refused_with_the_reason(
    op: str, inputs: list[np.ndarray], attrs: dict[str, Any], message: str
) -> None:
    b = GraphBuilder()
    ids = [b.const(x) if x.dtype.kind != "f" else b.leaf(x) for x in inputs]
    b.add(op, ids, attrs=attrs, name="y")
    for replay in (graphsvc.forward, lambda graph, registry: graphsvc.backward(graph, "y", registry=registry)):
        with pytest.raises(ReplayError) as info:
            replay(b.build(), registry=builtins())
        assert str(info.value) == f"node y: op {op!r} (graphsvc 0.1.0): forward raised ValueError: {message}"


def test_a_node_with_too_many_inputs_is_refused_before_anything_runs() -> None:
    b = GraphBuilder()
    ones = [b.leaf(np.ones(2)) for _ in range(6)]
    b.add("batch_norm", ones, name="y")
    with pytest.raises(OpError) as info:
        graphsvc.forward(b.build(), registry=builtins())
    assert str(info.value) == "node y: op batch_norm takes at most 5 inputs but the node has 6 parents"


def test_an_output_above_the_array_limit_is_refused_before_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """out_shape: addmm's product, stack's output and attention's scores are worked out first."""
    big = np.ones((3000, 1), dtype=np.float32)
    cases = [
        ("addmm", [np.zeros((), dtype=np.float32), big, np.ones((1, 3000), dtype=np.float32)], "3000x3000", 34.3),
        ("stack", [np.ones((1000, 1000), dtype=np.float32)] * 3, "3x1000x1000", 11.4),
        ("scaled_dot_product_attention", [big, big, big], "3000x3000", 34.3),  # the scores, (L, S)
        ("mse_loss", [big, np.ones(3000, dtype=np.float32)], "3000x3000", 34.3),  # the squares, broadcast
    ]
    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "10000000")
    for op, inputs, shape, mib in cases:
        b = GraphBuilder()
        b.add(op, [b.leaf(x) for x in inputs], name="y")
        with pytest.raises(ReplayError) as info:
            graphsvc.forward(b.build(), registry=builtins())
        assert str(info.value) == (
            f"node y ({op}): asks for a {shape} float32 array ({mib} MiB), more than the limit of 9.5 MiB on one "
            "array (GRAPHSVC_MAX_ARRAY_BYTES)"
        )


# -- the command line: ops, gradcheck --op, and a saved graph replayed ----------------------------------
def test_gradcheck_passes_every_sample_of_every_fused_op() -> None:
    results = check_registry(builtins(), FUSED)
    assert [(r.op, r.ok, r.unchecked) for r in results] == [(name, True, "") for name in FUSED]
    assert all(r.points > 0 for r in results)


@pytest.mark.parametrize("name", FUSED)
def test_each_fused_op_is_documented_and_checked_from_the_command_line(name: str) -> None:
    op = builtins().get(name)
    assert op.doc and op.samples is not None and op.vjp is not None
    code, out, err = run_cli("gradcheck", "--op", name)
    assert (code, err) == (0, "") and out.startswith(f"{name} (graphsvc 0.1.0): ok ("), out


def test_a_saved_graph_of_each_fused_op_replays_backward_from_the_command_line(tmp_path: Path) -> None:
    graphs = {
        "addmm": build(
            "addmm",
            {"bias": [10.0, 20.0], "m1": [[1.0, 2.0], [3.0, 4.0]], "m2": [[5.0, 6.0], [7.0, 8.0]]},
            np.ones((2, 2)),
            {"beta": 0.5, "alpha": 2.0},
        ),
        "layer_norm": build(
            "layer_norm",
            {"x": [[0.0, 0.0, 2.0, 2.0]], "w": [2.0, 1.0, 1.0, 1.0], "b": [0.0] * 4},
            [[1.0, 0.0, 0.0, 0.0]],
            {"normalized_shape": [4], "eps": 0.0},
        ),
        "batch_norm": build(
            "batch_norm",
            {"x": BN_X, "w": [2.0, 3.0], "b": [0.5, -1.0], "mean": [1.0, 2.0], "var": [4.0, 0.25]},
            BN_C,
            {"training": False, "eps": 0.0},
            consts="mean var",
        ),
        "scaled_dot_product_attention": build(
            "scaled_dot_product_attention",
            {"q": np.zeros((2, 2)), "k": np.zeros((2, 2)), "v": [[1.0, 2.0], [3.0, 4.0]]},
            np.ones((2, 2)),
            {"is_causal": True},
        ),
        "stack": build("stack", {"a": [1.0, 2.0], "b": [3.0, 4.0]}, [[1.0, 2.0], [3.0, 4.0]], {"axis": -1}),
        "slice": build(
            "slice", {"x": np.arange(10.0)}, [1.0, 2.0, 3.0, 4.0], {"axis": 0, "start": -7, "stop": None, "step": 2}
        ),
        "where": build(
            "where",
            {"cond": np.array([1, 0, 2]), "x": [1.0, 2.0, 3.0], "y0": np.array(10.0)},
            [1.0, 2.0, 3.0],
            consts="cond",
        ),
        "mse_loss": build("mse_loss", {"x": [1.0, 2.0, 3.0], "t": [1.0, 0.0, 0.0]}, 1.0, {"reduction": "sum"}),
        "clamp": build("clamp", {"x": [-2.0, -1.0, 0.0, 1.0, 2.0]}, [1.0] * 5, {"min": -1.0, "max": 1.0}),
    }
    expected = {
        "addmm": {"bias": [1.0, 1.0], "m1": [[22.0, 30.0], [22.0, 30.0]], "m2": [[8.0, 8.0], [12.0, 12.0]]},
        "layer_norm": {"x": [[1.0, -1.0, 0.0, 0.0]], "w": [-1.0, 0.0, 0.0, 0.0], "b": [1.0, 0.0, 0.0, 0.0]},
        "batch_norm": {"x": [[1.0, 0.0], [0.0, 6.0], [0.0, 0.0], [0.0, 0.0]], "w": [-0.5, 2.0], "b": [1.0, 1.0]},
        "scaled_dot_product_attention": {"v": [[1.5, 1.5], [0.5, 0.5]]},
        "stack": {"a": [1.0, 3.0], "b": [2.0, 4.0]},
        "slice": {"x": [0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0]},
        "where": {"x": [1.0, 0.0, 3.0], "y0": 2.0},
        "mse_loss": {"x": [0.0, 4.0, 6.0], "t": [0.0, -4.0, -6.0]},
        "clamp": {"x": [0.0, 1.0, 1.0, 1.0, 0.0]},
    }
    assert sorted(graphs) == sorted(FUSED)
    for name, graph in graphs.items():
        path, replayed = tmp_path / f"{name}.msgpack", tmp_path / f"{name}.out.msgpack"
        graphsvc.save(graph, path)
        code, out, err = run_cli("backward", str(path), "--write", str(replayed))
        assert (code, err) == (0, f"wrote {replayed} ({graph.num_nodes} nodes)\n"), (name, out, err)
        assert [line.split("\t")[2] for line in out.splitlines() if line.split("\t")[1] == "y"] == [name]
        result = graphsvc.load(replayed)
        assert {leaf: np.asarray(result.grad(leaf)).tolist() for leaf in expected[name]} == expected[name], name


def test_the_fused_ops_are_registered_in_the_builtin_table() -> None:
    names = [op.name for op in builtin_ops.BUILTIN_OPS]
    assert names[-len(FUSED) :] == list(FUSED)
