"""Replayed numbers against stored ones (graphsvc.replay.compare): the element rule, the worst nodes, and
nodes without a stored value counted apart. (Where nan or inf first appears: tests/replay/test_replay_faults.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from graphsvc.graph import Graph, GraphBuilder
from graphsvc.replay import compare as checks
from tests.conftest import needs_torch


def test_differences_are_zero_for_equal_numbers_and_inf_where_one_side_is_nan() -> None:
    replayed = np.array([1.0, np.nan, np.nan, np.inf, 0.0, 3.0, -np.inf])
    stored = np.array([1.5, np.nan, 2.0, np.inf, -0.0, np.nan, np.inf])
    diff, rel = checks.differences(replayed, stored)
    assert diff.tolist() == [0.5, 0.0, math.inf, 0.0, 0.0, math.inf, math.inf]
    assert rel.tolist() == [0.5 / 1.5, 0.0, math.inf, 0.0, 0.0, math.inf, math.inf]


def test_compare_counts_nodes_without_a_stored_value_apart() -> None:
    # nan in a stored column is the format's "no stored value" (values not computed yet, no gradient)
    stored = np.array([1.0, np.nan, 3.0, np.nan, np.nan, np.inf, 7.0])
    replayed = np.array([1.0, 2.0, 3.5, np.nan, 5.0, np.inf, np.nan])
    c = checks.compare("values", replayed, stored, rtol=0.0, atol=0.1)
    assert (c.unstored, c.nodes, c.compared) == (3, 7, 4)
    assert (c.worst_abs, c.worst_abs_node, c.mismatches, c.ok) == (math.inf, 6, 2, False)  # 3.5 vs 3, nan vs 7
    assert (c.worst_rel, c.worst_rel_node) == (math.inf, 6)
    assert (c.worst_abs_at, c.worst_rel_at) == ((6, ()), (6, ()))
    only_missing = checks.compare("values", replayed[:5], stored[:5], rtol=0.0, atol=1.0)
    assert (only_missing.ok, only_missing.mismatches, only_missing.unstored) == (True, 0, 3)
    assert (only_missing.worst_abs, only_missing.worst_abs_node) == (0.5, 2)
    nothing = checks.compare("grads", np.array([1.0, 2.0]), np.array([np.nan, np.nan]), 0.0, 0.0)
    assert (nothing.ok, nothing.unstored, nothing.compared, nothing.worst_abs_node, nothing.worst_rel_node) == (
        True,
        2,
        0,
        None,
        None,
    )
    assert (nothing.worst_abs_at, nothing.worst_rel_at) == (None, None)


def test_compare_reports_the_worst_node() -> None:
    stored = np.array([1.0, 2.0, np.nan, np.inf])
    replayed = np.array([1.0, 2.5, np.nan, np.inf])
    c = checks.compare("values", replayed, stored, rtol=1e-9, atol=0.0)
    assert (c.worst_abs, c.worst_abs_node, c.worst_rel, c.worst_rel_node, c.mismatches) == (0.5, 1, 0.25, 1, 1)
    assert checks.compare("values", stored, stored, 0.0, 0.0).ok


# -- the tolerance of each dtype --------------------------------------------------------------------
F64, F32, I64 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int64)


def test_each_dtype_has_its_tolerance_and_the_looser_wins_where_two_meet() -> None:
    assert checks.tolerance([F64, F64]) == ("float64", checks.Tolerance(1e-9, 1e-12))
    assert checks.tolerance([F32, F32]) == ("float32", checks.Tolerance(1e-4, 1e-6))
    assert checks.tolerance([I64, I64]) == ("int64", checks.Tolerance(0.0, 0.0))
    assert checks.tolerance([F64, F32]) == ("float32", checks.Tolerance(1e-4, 1e-6))
    assert checks.tolerance([I64, F64]) == ("float64", checks.Tolerance(1e-9, 1e-12))
    # what is given wins, each of the two on its own
    assert checks.tolerance([F32, F32], rtol=1e-6) == ("float32", checks.Tolerance(1e-6, 1e-6))
    assert checks.tolerance([I64, I64], atol=0.5) == ("int64", checks.Tolerance(0.0, 0.5))


def test_tolerance_text_names_each_dtype_and_writes_its_numbers_short() -> None:
    used = checks.used([("int64", checks.Tolerance(0.0, 0.0)), ("float32", checks.Tolerance(1e-4, 1e-6))])
    assert checks.tolerance_text(used) == "float32: rtol 1e-4, atol 1e-6; int64: rtol 0, atol 0"
    odd = (("float64", checks.Tolerance(2.5e-7, 1e300)),)
    assert checks.tolerance_text(odd) == "float64: rtol 2.5e-7, atol 1e300"
    assert checks.tolerance_text((("float64", checks.Tolerance(0.123, 1.0)),)) == "float64: rtol 0.123, atol 1.0"
    small = (("float32", checks.Tolerance(1.2345e-5, 3e-9)),)
    assert checks.tolerance_text(small) == "float32: rtol 1.2345e-5, atol 3e-9"
    assert checks.tolerance_text(()) == ""


def float32_graph(off: float) -> Graph:
    """y = x * w (float32), stored with y[1] off by ``off`` relative to what a replay gives (6.0)."""
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, 2.0], dtype=np.float32), name="x")
    w = b.leaf(np.array([3.0, 3.0], dtype=np.float32), name="w")
    b.add("mul", [x, w], name="y", value=np.array([3.0, 6.0 * (1 + off)], dtype=np.float32))
    return b.build()


def test_a_float32_graph_is_held_to_float32s_tolerance() -> None:
    """6 * (1 + 2e-5) in float32 is 6.00012: a replay of 6.0 is within float32's rtol 1e-4 (it was
    beyond float64's 1e-9); 6 * (1 + 2e-4) is beyond it."""
    from graphsvc.pluginhost import load_registry
    from graphsvc.replay.run import replay_values

    registry, _ = load_registry(disable_third_party=True)
    near, far = float32_graph(2e-5), float32_graph(2e-4)
    (check,) = replay_values(near, registry, {}, check=(None, None)).comparisons
    assert (check.ok, check.worst_rel_at, check.tolerances) == (
        True,
        (2, (1,)),
        (("float32", checks.Tolerance(1e-4, 1e-6)),),
    )
    assert check.worst_abs == float(np.float32(6.0 * (1 + 2e-5))) - 6.0
    (check,) = replay_values(far, registry, {}, check=(None, None)).comparisons
    assert (check.ok, check.mismatches) == (False, 1)
    (check,) = replay_values(near, registry, {}, check=(1e-9, None)).comparisons  # given: it wins
    assert (check.ok, check.tolerances) == (False, (("float32", checks.Tolerance(1e-9, 1e-6)),))
    # w set to a float64 array: w and y replay as float64 against the stored float32, held to float32's
    (check,) = replay_values(near, registry, {1: np.array([3.0, 3.0])}, check=(None, None)).comparisons
    assert (check.ok, check.tolerances) == (True, (("float32", checks.Tolerance(1e-4, 1e-6)),))


def test_a_float32_step_as_pytorch_computed_it_passes_the_default_check(tmp_path: Path) -> None:
    """An MLP 784-128-10 (batch 64, float32) whose stored values and gradients are PyTorch's: the
    replay (numpy, other summation orders) is within float32's default tolerance everywhere, and
    beyond float64's."""
    torch = needs_torch()
    from graphsvc.pluginhost import load_registry
    from graphsvc.replay.run import replay_values

    torch.manual_seed(0)
    x = torch.randn(64, 784)
    w1 = (torch.randn(784, 128) / 28).requires_grad_()
    w2 = (torch.randn(128, 10) / 12).requires_grad_()
    labels = torch.randint(0, 10, (64,))
    m1 = x @ w1
    h = torch.relu(m1)
    m2 = h @ w2
    logp = torch.log_softmax(m2, -1)
    loss = torch.nn.functional.nll_loss(logp, labels)
    for t in (m1, h, m2, logp):
        t.retain_grad()
    loss.backward()
    b = GraphBuilder()
    xi = b.const(x.numpy(), name="x")
    w1i = b.leaf(w1.detach().numpy(), name="w1", grad=w1.grad.numpy())
    w2i = b.leaf(w2.detach().numpy(), name="w2", grad=w2.grad.numpy())
    node = b.add("matmul", [xi, w1i], value=m1.detach().numpy(), grad=m1.grad.numpy())
    node = b.add("relu", [node], value=h.detach().numpy(), grad=h.grad.numpy())
    node = b.add("matmul", [node, w2i], value=m2.detach().numpy(), grad=m2.grad.numpy())
    node = b.add("log_softmax", [node], attrs={"axis": -1}, value=logp.detach().numpy(), grad=logp.grad.numpy())
    loss_value = loss.detach().numpy()
    b.add("nll_loss", [node, b.const(labels.numpy())], value=loss_value, grad=np.float32(1.0), name="loss")
    graph = b.build()
    registry, _ = load_registry(disable_third_party=True)
    run = replay_values(graph, registry, {}, graph.node_id("loss"), check=(None, None))
    assert [(c.what, c.ok, c.tolerances) for c in run.comparisons] == [
        ("values", True, (("float32", checks.Tolerance(1e-4, 1e-6)), ("int64", checks.Tolerance(0.0, 0.0)))),
        ("grads", True, (("float32", checks.Tolerance(1e-4, 1e-6)),)),
    ]
    strict = replay_values(graph, registry, {}, graph.node_id("loss"), check=(1e-9, 1e-12)).comparisons
    assert not all(c.ok for c in strict)
