"""Tensor graphs: nodes that hold arrays, replayed by graphsvc.replay.arrays with VJPs.

Gradients are checked three ways: worked out by hand (seed 004's L = (a*b + c)*(a + b) on arrays),
against central finite differences for every builtin tensor op (axis/keepdims/broadcasting cases),
and against PyTorch on the same computation when it is installed.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.errors import GraphStructureError, OpError, ReplayError, UsageError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.ops import Op, OpRegistry, elementwise_vjp, unbroadcast
from graphsvc.pluginhost import load_registry
from graphsvc.replay.arrays import describe, read_only_memory
from tests.conftest import needs_torch

pytestmark = pytest.mark.usefixtures("no_installed_plugins")


def builtins() -> OpRegistry:
    registry, problems = load_registry(disable_third_party=True)
    assert not problems
    return registry


# -- the model -----------------------------------------------------------------------------------
def test_a_leaf_given_an_array_is_a_tensor_node_holding_a_copy() -> None:
    b = GraphBuilder()
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = b.leaf(data, name="x")
    s = b.leaf(2.0, name="s")  # a float stays a scalar node
    f = b.leaf(np.float64(3.0), name="f")  # so does a numpy float64 scalar
    graph = b.build()
    data[0, 0] = 99.0
    assert graph.is_tensor_graph
    value = graph.value(x)
    assert isinstance(value, np.ndarray) and value.dtype == np.float32 and value.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert graph.value(s) == 2.0 and isinstance(graph.value(s), float)
    assert graph.value(f) == 3.0 and isinstance(graph.value(f), float)
    assert np.isnan(graph.values[x])  # a tensor node's column entry holds nan


def test_a_dtype_outside_float64_float32_int64_is_refused() -> None:
    with pytest.raises(
        GraphStructureError, match=r"^node 0: a value must be an array of float64, float32 or int64, not float16$"
    ):
        GraphBuilder().leaf(np.zeros(2, dtype=np.float16))
    graph = GraphBuilder().build()
    graph.arrays[0] = np.zeros(2)
    with pytest.raises(GraphStructureError, match=r"^a value array is given to node 0, which does not exist$"):
        graph.check()


def test_unbroadcast_sums_added_and_stretched_dimensions() -> None:
    g = np.arange(24.0).reshape(2, 3, 4)
    assert unbroadcast(g, (2, 3, 4)) is g
    assert unbroadcast(g, (4,)).tolist() == g.sum(axis=(0, 1)).tolist()
    assert unbroadcast(g, (3, 1)).tolist() == g.sum(axis=(0, 2)).reshape(3, 1).tolist()
    assert unbroadcast(g, ()).tolist() == 276.0
    assert unbroadcast(g, (2, 1, 4)).shape == (2, 1, 4)


def test_describe_names_dtype_and_shape() -> None:
    assert describe(np.zeros((128, 10), dtype=np.float32)) == "f32[128,10]"
    assert describe(np.zeros((), dtype=np.int64)) == "i64[]"


# -- seed 004 on arrays, by hand -----------------------------------------------------------------
def seed004_on_arrays() -> Graph:
    """L = sum((a*b + c) * (a + b)) with a = [2, 1] and scalars b = 3, c = 1 broadcast."""
    b = GraphBuilder()
    a = b.leaf(np.array([2.0, 1.0]), name="a")
    bb = b.leaf(3.0, name="b")
    c = b.leaf(np.array(1.0), name="c")
    ab = b.add("mul", [a, bb])
    abc = b.add("add", [ab, c])
    apb = b.add("add", [a, bb])
    b.add("sum", [b.add("mul", [abc, apb])], name="L")
    return b.build()


def test_seed_004_on_arrays_gives_the_hand_derived_gradients() -> None:
    graph = graphsvc.backward(seed004_on_arrays(), registry=builtins())
    # element 0 is seed 004 itself (a=2): 7*5 = 35; element 1 (a=1): (3+1)*(1+3) = 16
    assert graph.value("L") == 51.0 and isinstance(graph.value("L"), float)
    # dL/da_i = b(a_i+b) + (a_i b + c): [15 + 7, 12 + 4]
    assert graph.grad("a").tolist() == [22.0, 16.0]  # type: ignore[union-attr]
    # b is broadcast: its gradient sums both elements' a_i(a_i+b) + (a_i b + c) = 17 + 8
    assert graph.grad("b") == 25.0 and isinstance(graph.grad("b"), float)
    # c is a 0-d array (a tensor node): sum of (a_i + b) = 5 + 4, still an array
    grad_c = graph.grad("c")
    assert isinstance(grad_c, np.ndarray) and grad_c.shape == () and float(grad_c) == 9.0


def test_the_input_graph_is_untouched_and_results_are_read_only() -> None:
    graph = seed004_on_arrays()
    before = graph.value("a").copy()  # type: ignore[union-attr]
    result = graphsvc.backward(graph, set={"a": np.array([1.0, 1.0])}, registry=builtins())
    assert graph.value("a").tolist() == before.tolist()  # type: ignore[union-attr]
    assert result.value("L") == 32.0  # 2 * (3+1)*(1+3)
    for array in (*result.arrays.values(), *result.grad_arrays.values()):
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            array.flags.writeable = True
    assert not np.shares_memory(result.arrays[0], graph.arrays[0])


def test_a_built_graphs_arrays_are_read_only_and_a_replay_shares_them_instead_of_copying() -> None:
    graph = seed004_on_arrays()
    a = graph.node_id("a")
    assert not graph.arrays[a].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        graph.arrays[a][0] = 5.0
    result = graphsvc.backward(graph, registry=builtins())
    assert np.shares_memory(result.arrays[a], graph.arrays[a])  # nothing can change it: no copy
    assert result.value("a").tolist() == [2.0, 1.0]  # type: ignore[union-attr]


def test_neither_a_built_graphs_array_nor_a_result_sharing_it_can_be_made_writable() -> None:
    """A result shares the built graph's array: were either the array object itself (which owns its
    memory), a caller who made it writable again to update it in place (a training step's
    ``w -= lr * grad``; a result's array was its own copy before) would change the other, and
    every later graph the builder builds."""
    b = GraphBuilder()
    w = b.leaf(np.array([1.0, 2.0]), name="w")
    b.add("sum", [b.add("mul", [w, w])], name="loss")
    graph = b.build()
    result = graphsvc.backward(graph, registry=builtins())
    assert np.shares_memory(result.arrays[w], graph.arrays[w])
    for array in (result.arrays[w], graph.arrays[w], b.build().arrays[w]):
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            array.flags.writeable = True
    assert graph.value("w").tolist() == [1.0, 2.0]  # type: ignore[union-attr]


def test_no_array_of_a_result_can_be_made_writable_to_change_another_nodes() -> None:
    """add's VJP hands the one ``g`` to both inputs, so a result's gradients of a, c and s were one
    array object that owns its memory: a caller who made one writable again (``w -= lr * grad``)
    changed the others. Every array a result keeps is a view that cannot be made writable."""
    b = GraphBuilder()
    a, c = b.leaf(np.ones(3), name="a"), b.leaf(np.full(3, 2.0), name="c")
    b.add("sum", [b.add("neg", [b.add("add", [a, c], name="s")])], name="loss")
    result = graphsvc.backward(b.build(), registry=builtins())
    assert np.shares_memory(result.grad_arrays[a], result.grad_arrays[c])  # shared, not copied
    for array in (*result.arrays.values(), *result.grad_arrays.values()):
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            array.flags.writeable = True
    assert result.grad("c").tolist() == [-1.0, -1.0, -1.0]  # type: ignore[union-attr]


def test_a_result_shares_the_replays_arrays_whatever_their_layout_without_copies() -> None:
    """A transpose (not C-contiguous), a reshape and a broadcast (a sum's gradient: stride 0) are
    views of memory the replay made: the result holds them as they are, sealed, not copies."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    b = GraphBuilder()
    x = b.leaf(np.arange(6.0).reshape(2, 3), name="x")
    e = b.add("exp", [x], name="e")
    t = b.add("transpose", [e], name="t")
    r = b.add("reshape", [t], attrs={"shape": [6]}, name="r")
    b.add("sum", [b.add("mul", [r, r], name="m")], name="loss")
    graph = b.build()
    ops = replay.resolve_ops(graph, builtins())
    values, grads = tensors.replay(graph, ops, graph.node_id("loss"))
    assert grads is not None
    result = tensors.store(graph, values, grads)
    expected = np.exp(np.arange(6.0).reshape(2, 3))
    assert not result.arrays[t].flags.c_contiguous and result.arrays[t].tolist() == expected.T.tolist()
    assert result.grad_arrays[e].tolist() == (2 * expected).tolist()
    for node in (e, t, r):
        for kept, replayed in ((result.arrays, values), (result.grad_arrays, grads)):
            array = replayed[node]
            assert array is not None
            assert np.shares_memory(kept[node], array) and kept[node].tolist() == array.tolist()
    assert np.shares_memory(result.arrays[t], result.arrays[e])  # one buffer, as the replay made it
    loaded = graphsvc.loads(graphsvc.dumps(result))  # saved in C order all the same
    assert loaded.arrays[t].flags.c_contiguous and loaded.arrays[t].tolist() == expected.T.tolist()
    assert loaded.grad_arrays[t].tolist() == (2 * expected.T).tolist()
    for array in (*result.arrays.values(), *result.grad_arrays.values()):
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            array.flags.writeable = True


def test_a_loaded_graphs_arrays_are_sealed_so_a_replay_keeps_a_transposed_leaf_as_a_view(tmp_path: Path) -> None:
    """A loaded graph's arrays are read-only down to the file's buffer, so no holder can make one
    writable again, and the replay keeps a transposed weight as a view of it (no copy each pass; a
    mapped file's is copied: another process may rewrite the file). The result copies the leaves
    and their transposes (views of a buffer more than twice their size), a transpose in the order
    its axes have in memory, with the numbers the replay had."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    b = GraphBuilder()
    w = b.leaf(np.arange(12.0, dtype=np.float32).reshape(3, 4), name="w")
    t = b.add("transpose", [w], name="t")
    x = b.leaf(np.ones((2, 4), dtype=np.float32), name="x")
    b.leaf(np.zeros(64, dtype=np.float32), name="unused")  # the file's buffer: more than twice w's bytes
    b.add("sum", [b.add("matmul", [x, t], name="y")], name="loss")
    path = tmp_path / "linear.msgpack"
    graphsvc.save(b.build(), path)
    for mapped in (False, True):
        loaded = graphsvc.load(path, mmap=mapped)
        for array in loaded.arrays.values():
            with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
                array.flags.writeable = True
        values, grads = tensors.replay(loaded, replay.resolve_ops(loaded, builtins()), loaded.node_id("loss"))
        assert grads is not None and values[t] is not None
        assert np.shares_memory(values[t], loaded.arrays[w]) is not mapped
    loaded = graphsvc.load(path)
    result = graphsvc.backward(loaded, output="loss", registry=builtins())
    kept = result.arrays[t]
    assert not np.shares_memory(kept, loaded.arrays[w]) and kept.flags.f_contiguous
    assert kept.tolist() == np.arange(12.0).reshape(3, 4).T.tolist()
    assert result.grad_arrays[w].tolist() == [[2.0] * 4] * 3
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
        kept.flags.writeable = True


def test_a_result_copies_a_view_holding_a_much_larger_array_and_a_callers_writable_override() -> None:
    """A gradient that views an array more than twice its size would keep the larger one alive: it
    is copied. An array a caller gives replay() directly stays the caller's, who may change it: the
    result holds a copy."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    b = GraphBuilder()
    x = b.leaf(np.ones(2), name="x")
    b.add("sum", [x], name="loss")
    graph = b.build()
    big = np.arange(10.0)
    big.flags.writeable = False
    result = tensors.store(graph, [big[:2], np.asarray(2.0)], [big[4:6], None])
    assert result.arrays[x].tolist() == [0.0, 1.0] and result.grad_arrays[x].tolist() == [4.0, 5.0]
    assert not np.shares_memory(result.arrays[x], big) and not np.shares_memory(result.grad_arrays[x], big)
    assert result.value("loss") == 2.0  # a float64 0-d array: the scalar column
    given = np.array([5.0, 7.0])
    values, _ = tensors.replay(graph, replay.resolve_ops(graph, builtins()), overrides={x: given})
    result = tensors.store(graph, values, None)
    given[0] = -1.0
    assert result.value("x").tolist() == [5.0, 7.0] and result.value("loss") == 12.0  # type: ignore[union-attr]


def test_a_replay_of_a_graph_with_writable_arrays_copies_them() -> None:
    """Graph.copy gives writable arrays: a result sharing them would change with the copy."""
    graph = seed004_on_arrays().copy()
    a = graph.node_id("a")
    result = graphsvc.backward(graph, registry=builtins())
    assert not np.shares_memory(result.arrays[a], graph.arrays[a])
    graph.arrays[a][0] = 5.0
    assert result.value("a").tolist() == [2.0, 1.0]  # type: ignore[union-attr]


def test_read_only_memory_follows_views_down_to_the_buffer() -> None:
    owner = np.arange(4.0)
    view = owner[1:]
    view.flags.writeable = False
    assert not read_only_memory(view)  # the owner can still write
    owner.flags.writeable = False
    assert read_only_memory(view) and read_only_memory(owner)
    assert read_only_memory(np.frombuffer(bytes(8)))
    assert not read_only_memory(np.frombuffer(bytearray(8)))  # read-only flag, writable buffer
    frozen = np.frombuffer(bytearray(8))
    frozen.flags.writeable = False
    assert not read_only_memory(frozen)


def test_a_read_only_buffer_over_memory_someone_can_change_is_not_read_only_memory(tmp_path: Path) -> None:
    """A buffer that only reads (a read-only memoryview, a file mapped for reading) says nothing of
    the memory behind it: a bytearray its holder changes, a file another process rewrites."""
    data = bytearray(np.array([1.0, 2.0]).tobytes())
    assert not read_only_memory(np.frombuffer(memoryview(data).toreadonly()))
    path = tmp_path / "numbers"
    path.write_bytes(bytes(data))
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        array = np.frombuffer(mapped)
        assert not read_only_memory(array)
        del array
    # a graph given such an array (graph.arrays is a dict anyone may fill): its result copies it
    b = GraphBuilder()
    w = b.leaf(np.zeros(2), name="w")
    b.add("sum", [b.add("mul", [w, w])], name="loss")
    graph = b.build()
    graph.arrays[w] = np.frombuffer(memoryview(data).toreadonly())
    result = graphsvc.forward(graph, registry=builtins())
    data[:8] = np.array([99.0]).tobytes()
    assert result.value("w").tolist() == [1.0, 2.0]  # type: ignore[union-attr]


def test_a_gradient_summed_from_many_consumers_is_exact_and_read_only() -> None:
    """x feeds four nodes: its gradient is the sum of four cotangents (the second makes a new array,
    the others are added into it in place); the VJPs' own arrays and what each step recorded are
    left as they were."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    b = GraphBuilder()
    x = b.leaf(np.array([1.0, 2.0, 3.0]), name="x")
    terms = [b.add("mul", [x, b.const(np.array(k), name=f"k{k}")], name=f"t{k}") for k in (1.0, 10.0, 100.0, 1000.0)]
    b.add("sum", [b.add("concatenate", terms, name="all")], name="loss")
    graph = b.build()
    ops = replay.resolve_ops(graph, builtins())
    steps: list[Any] = []
    grads = tensors.backward(graph, ops, graph.node_id("loss"), tensors.forward(graph, ops), steps)
    gx = grads[x]
    assert gx is not None and gx.tolist() == [1111.0] * 3 and not gx.flags.writeable
    sent = [c for step in steps for parent, _, c in step.contributions if parent == x]
    assert [c.tolist() for c in sent] == [[1000.0] * 3, [100.0] * 3, [10.0] * 3, [1.0] * 3]
    assert all(not c.flags.writeable and not np.shares_memory(c, gx) for c in sent)
    (x_step,) = [step for step in steps if step.node == x]
    assert x_step.grad is gx


def test_float32_stays_float32() -> None:
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, -2.0, 3.0], dtype=np.float32), name="x")
    b.add("sum", [b.add("tanh", [b.add("mul", [x, b.const(np.float32(2.0))])])], name="y")
    b.add("mul", [x, b.const(2.0)], name="promoted")  # numpy's rule: a float64 0-d array promotes
    graph = graphsvc.backward(b.build(), output="y", registry=builtins())
    assert graph.value("y").dtype == np.float32  # type: ignore[union-attr]
    assert graph.value("promoted").dtype == np.float64  # type: ignore[union-attr]
    grad = graph.grad("x")
    assert isinstance(grad, np.ndarray) and grad.dtype == np.float32
    out = np.tanh(np.array([1.0, -2.0, 3.0], dtype=np.float32) * np.float32(2.0))
    assert grad.tolist() == ((1.0 - out**2) * np.float32(2.0)).tolist()  # the same float32 steps


# -- every builtin tensor op against finite differences ------------------------------------------
def numeric_vjp(
    forward: Callable[..., np.ndarray], inputs: Sequence[np.ndarray], g: np.ndarray, index: int
) -> np.ndarray:
    """d<g, forward(inputs)>/d inputs[index] by central differences."""
    x = inputs[index]
    grad = np.zeros_like(x)
    step = 1e-6
    for position in np.ndindex(x.shape):
        shifted = []
        for sign in (1.0, -1.0):
            moved = [a.copy() for a in inputs]
            moved[index][position] += sign * step
            shifted.append(float(np.sum(g * forward(*moved))))
        grad[position] = (shifted[0] - shifted[1]) / (2 * step)
    return grad


CASES: list[tuple[str, list[tuple[int, ...]], dict[str, Any]]] = [
    ("add", [(2, 3), (3,)], {}),
    ("mul", [(2, 1, 4), (3, 1)], {}),
    ("div", [(3,), (2, 3)], {}),
    ("max", [(2, 3), (1, 3)], {}),
    ("pow", [(2, 3)], {"exponent": 3.0}),
    ("matmul", [(3, 4), (4, 2)], {}),
    ("matmul", [(2, 3, 4), (4, 5)], {}),
    ("matmul", [(4,), (2, 4, 3)], {}),
    ("matmul", [(2, 3, 4), (4,)], {}),
    ("matmul", [(4,), (4,)], {}),
    ("sum", [(2, 3, 4)], {}),
    ("sum", [(2, 3, 4)], {"axis": 1}),
    ("sum", [(2, 3, 4)], {"axis": [0, 2], "keepdims": True}),
    ("mean", [(2, 3, 4)], {"axis": -1}),
    ("mean", [(2, 3)], {"keepdims": True}),
    ("amax", [(3, 5)], {"axis": 1}),
    ("amax", [(3, 5)], {}),
    ("reshape", [(2, 6)], {"shape": [3, -1]}),
    ("transpose", [(2, 3, 4)], {"axes": [2, 0, 1]}),
    ("transpose", [(2, 3, 4)], {"axes": [-1, 0, 1]}),  # negative axes, as numpy takes them
    ("transpose", [(2, 3, 4)], {"axes": [1, -1, 0]}),
    ("transpose", [(2, 3)], {}),
    ("broadcast_to", [(3, 1)], {"shape": [2, 3, 4]}),
    ("concatenate", [(2, 3), (1, 3), (4, 3)], {}),
    ("concatenate", [(2, 1), (2, 3)], {"axis": 1}),
    ("softmax", [(3, 4)], {}),
    ("softmax", [(3, 4)], {"axis": 0}),
    ("log_softmax", [(3, 4)], {"axis": -1}),
]


@pytest.mark.parametrize(("name", "shapes", "attrs"), CASES, ids=lambda case: str(case))
def test_vjp_matches_finite_differences(name: str, shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(len(name) * 7 + len(shapes))
    inputs = [rng.uniform(0.5, 2.0, size=shape) for shape in shapes]
    graph_builder = GraphBuilder()
    ids = [graph_builder.leaf(x, name=f"x{i}") for i, x in enumerate(inputs)]
    out = graph_builder.add(name, ids, attrs=attrs)
    op = builtins().get(name)
    assert op.forward is not None
    value = op.forward(*inputs, **attrs)
    g = rng.standard_normal(np.shape(value))
    weights = graph_builder.const(g, name="g")
    graph_builder.add("sum", [graph_builder.add("mul", [out, weights])], name="loss")
    graph = graphsvc.backward(graph_builder.build(), output="loss", registry=builtins())
    for i in range(len(inputs)):
        numeric = numeric_vjp(lambda *xs: op.forward(*xs, **attrs), inputs, g, i)  # type: ignore[misc]
        assert np.allclose(graph.grad(f"x{i}"), numeric, rtol=1e-6, atol=1e-8), (name, i)


def test_amax_splits_the_gradient_among_ties_and_take_adds_repeated_indices() -> None:
    b = GraphBuilder()
    x = b.leaf(np.array([[1.0, 3.0, 3.0], [5.0, 0.0, 2.0]]), name="x")
    b.add("sum", [b.add("amax", [x], attrs={"axis": 1})], name="top")
    graph = graphsvc.backward(b.build(), registry=builtins())
    assert graph.grad("x").tolist() == [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]  # type: ignore[union-attr]

    b = GraphBuilder()
    table = b.leaf(np.arange(6.0).reshape(3, 2), name="table")
    rows = b.const(np.array([2, 0, 2]), name="rows")
    looked_up = b.add("take", [table, rows], attrs={"axis": 0})
    b.add("sum", [looked_up], name="total")
    graph = graphsvc.backward(b.build(), registry=builtins())
    assert graph.value(looked_up).tolist() == [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]]  # type: ignore[union-attr]
    assert graph.grad("table").tolist() == [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]  # type: ignore[union-attr]
    assert graph.grad_arrays.get(rows) is None  # int64 nodes get no gradient


# -- against PyTorch -----------------------------------------------------------------------------
def mlp_graph(x: np.ndarray, params: list[np.ndarray], labels: np.ndarray) -> Graph:
    """tanh MLP with a cross-entropy loss, written with the builtin ops."""
    n, classes = x.shape[0], params[-1].shape[0]
    b = GraphBuilder()
    h = b.const(x, name="x")
    names = ["w1", "b1", "w2", "b2"]
    ids = [b.leaf(p, name=name) for p, name in zip(params, names, strict=True)]
    h = b.add("tanh", [b.add("add", [b.add("matmul", [h, ids[0]]), ids[1]])])
    logits = b.add("add", [b.add("matmul", [h, ids[2]]), ids[3]])
    logp = b.add("log_softmax", [logits], attrs={"axis": -1})
    flat = b.add("reshape", [logp], attrs={"shape": [n * classes]})
    picked = b.add("take", [flat, b.const(np.arange(n) * classes + labels, name="picks")])
    b.add("neg", [b.add("mean", [picked])], name="loss")
    return b.build()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_mlp_with_cross_entropy_matches_pytorch(dtype: type) -> None:
    torch = needs_torch()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 5)).astype(dtype)
    params = [rng.standard_normal(shape).astype(dtype) for shape in ((5, 7), (7,), (7, 3), (3,))]
    labels = rng.integers(0, 3, 8)
    graph = graphsvc.backward(mlp_graph(x, params, labels), registry=builtins())
    tensors = [torch.tensor(p, requires_grad=True) for p in params]
    hidden = torch.tanh(torch.tensor(x) @ tensors[0] + tensors[1])
    loss = torch.nn.functional.cross_entropy(hidden @ tensors[2] + tensors[3], torch.tensor(labels))
    loss.backward()
    rtol = 1e-10 if dtype is np.float64 else 1e-4
    assert np.allclose(graph.value("loss"), loss.item(), rtol=rtol)
    for name, tensor in zip(["w1", "b1", "w2", "b2"], tensors, strict=True):
        grad = graph.grad(name)
        assert isinstance(grad, np.ndarray) and grad.dtype == dtype
        assert np.allclose(grad, tensor.grad.numpy(), rtol=rtol, atol=rtol * 1e-3), name


# -- errors --------------------------------------------------------------------------------------
def test_backward_starts_from_a_scalar() -> None:
    b = GraphBuilder()
    b.add("tanh", [b.leaf(np.zeros((2, 3), dtype=np.float32), name="x")], name="y")
    with pytest.raises(
        UsageError,
        match=r"^backward starts from a scalar \(a loss\), but node y holds f32\[2,3\]: "
        r"reduce it first \(sum, mean\) or choose another output$",
    ):
        graphsvc.backward(b.build(), registry=builtins())


def test_broken_vjps_and_forwards_are_replay_errors_naming_node_and_op() -> None:
    registry = builtins()
    registry.register(Op("two", 1, forward=lambda x: x, vjp=lambda g, out, x: (g, g)), plugin="bad")
    registry.register(Op("wide", 1, forward=lambda x: x, vjp=lambda g, out, x: (np.zeros(5),)), plugin="bad")
    registry.register(Op("half", 1, forward=lambda x: x.astype(np.float16), vjp=lambda g, out, x: (g,)), plugin="bad")
    registry.register(Op("boom", 1, forward=lambda x: 1 / 0, vjp=lambda g, out, x: (g,)), plugin="bad")
    expected = {
        "two": "node n: op 'two' (bad): vjp returned 2 cotangents, expected one per input (1)",
        "wide": "node n: op 'wide' (bad): vjp returned a cotangent of shape [5] for input 0, whose shape is [2]",
        "half": "node n: op 'half' (bad): forward returned an array of float16, "
        "not an array of float64, float32 or int64",
        "boom": "node n: op 'boom' (bad): forward raised ZeroDivisionError: division by zero",
    }
    for name, message in expected.items():
        b = GraphBuilder()
        b.add("sum", [b.add(name, [b.leaf(np.ones(2), name="x")], name="n")], name="loss")
        with pytest.raises(ReplayError) as info:
            graphsvc.backward(b.build(), registry=registry)
        assert str(info.value) == message


class _Scale:
    """A callable with ``__eq__`` and no ``__hash__`` (as a dataclass is): a plugin may give one."""

    def __init__(self, k: float) -> None:
        self.k = k

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Scale) and other.k == self.k

    __hash__ = None  # type: ignore[assignment]

    def __call__(self, g: np.ndarray, out: Any = None, x: Any = None) -> Any:
        return g * self.k if out is None else (g * self.k,)


def test_an_op_whose_functions_cannot_be_hashed_replays_backward() -> None:
    from graphsvc.testing import check_vjp

    registry = builtins()
    op = Op("scale3", 1, forward=_Scale(3.0), vjp=_Scale(3.0))
    registry.register(op, plugin="callables")
    b = GraphBuilder()
    b.add("sum", [b.add("scale3", [b.leaf(np.array([1.0, 2.0]), name="x")])], name="loss")
    graph = graphsvc.backward(b.build(), registry=registry)
    assert (graph.value("loss"), graph.grad("x").tolist()) == (9.0, [3.0, 3.0])  # type: ignore[union-attr]
    assert check_vjp(op, np.array([1.0, 2.0])).ok


def test_take_refuses_float_indices_and_concatenate_needs_an_input() -> None:
    b = GraphBuilder()
    b.add("take", [b.leaf(np.ones(3)), b.const(np.array([0.0]))], name="t")
    with pytest.raises(ReplayError) as info:
        graphsvc.forward(b.build(), registry=builtins())
    assert (
        str(info.value) == "node t: op 'take' (graphsvc 0.1.0): forward raised ValueError: "
        "indices must be integers (int64), not float64"
    )
    b = GraphBuilder()
    b.add("concatenate", [], name="c")
    with pytest.raises(OpError, match=r"^node c: op concatenate takes at least 1 input but the node has 0 parents$"):
        graphsvc.forward(b.build(), registry=builtins())


def test_a_scalar_graph_using_a_vjp_only_op_is_replayed_as_tensors() -> None:
    b = GraphBuilder()
    x, y = b.leaf(2.0, name="x"), b.leaf(5.0, name="y")
    b.add("concatenate", [x, y], name="both")  # 0-d inputs: numpy refuses, a clear error
    with pytest.raises(
        ReplayError, match=r"^node both: op 'concatenate' \(graphsvc 0.1.0\): forward raised ValueError: "
    ):
        graphsvc.forward(b.build(), registry=builtins())
    b = GraphBuilder()
    x, y = b.leaf(2.0, name="x"), b.leaf(5.0, name="y")
    b.add(
        "matmul", [b.add("reshape", [x], attrs={"shape": [1]}), b.add("reshape", [y], attrs={"shape": [1]})], name="p"
    )
    graph = graphsvc.backward(b.build(), registry=builtins())
    assert (graph.value("p"), graph.grad("x"), graph.grad("y")) == (10.0, 5.0, 2.0)
    assert isinstance(graph.value("p"), float) and graph.value(2).shape == (1,)  # type: ignore[union-attr]


def test_big_endian_and_fortran_order_arrays_are_stored_native_and_c_ordered() -> None:
    b = GraphBuilder()
    big = b.leaf(np.array([1.5, -2.0], dtype=">f8"))
    fortran = b.leaf(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    graph = b.build()
    assert graph.arrays[big].dtype == np.dtype("<f8") and graph.arrays[big].tolist() == [1.5, -2.0]
    assert graph.arrays[fortran].flags.c_contiguous and graph.arrays[fortran].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_float32_gradients_stay_float32_through_every_elementwise_vjp() -> None:
    """add's partial 1.0 and max's float64 tie rule must not promote a float32 gradient (the
    engine would cast it back, after computing in float64 at twice the cost)."""
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    y = np.array([3.0, 2.0, 1.0], dtype=np.float32)
    g = np.ones(3, dtype=np.float32)
    registry = builtins()
    for name in ("add", "sub", "mul", "div", "max", "min", "relu", "abs", "neg", "tanh"):
        op = registry.get(name)
        inputs = (x, y)[: op.arity]
        assert op.forward is not None
        out = op.forward(*inputs)
        cotangents = elementwise_vjp(op)(g, out, *inputs)
        assert [c.dtype for c in cotangents] == [np.dtype("float32")] * op.arity, name
    max_vjp = elementwise_vjp(registry.get("max"))(g, np.maximum(x, y), x, y)
    assert [c.tolist() for c in max_vjp] == [[0.0, 0.5, 1.0], [1.0, 0.5, 0.0]]  # a tie splits evenly


def test_a_0d_node_used_twice_gets_the_sum_of_its_gradients() -> None:
    b = GraphBuilder()
    s = b.add("sum", [b.leaf(np.array([1.0, 2.0, 3.0], dtype=np.float32), name="x")], name="s")
    b.add("mul", [s, s], name="y")
    graph = graphsvc.backward(b.build(), output="y", registry=builtins())
    assert float(graph.grad("s")) == 12.0 and graph.grad("x").tolist() == [12.0, 12.0, 12.0]  # type: ignore[union-attr, arg-type]


def test_a_gradient_array_must_have_its_values_shape_and_at_most_32_dimensions() -> None:
    b = GraphBuilder()
    b.leaf(np.zeros((2, 3)), grad=np.zeros(6))
    with pytest.raises(
        GraphStructureError, match=r"^node 0's gradient array has shape \[6\], but its value array has shape \[2, 3\]$"
    ):
        b.build()
    b = GraphBuilder()
    b.leaf(np.zeros((1,) * 33))
    with pytest.raises(GraphStructureError, match=r"^node 0: a value array has 33 dimensions, more than 32$"):
        b.build()


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([0, 10**30], r"the shape \[0, 1000000000000000000000000000000\] is too large \(more than 2\*\*63 - 1 bytes\)"),
        ([0] + [1] * 40, r"the shape has 41 dimensions, more than 32"),
    ],
)
def test_json_tensor_shapes_numpy_cannot_make_are_format_errors(shape: list[int], message: str) -> None:
    from graphsvc.errors import FormatError
    from graphsvc.format import jsonio

    document = {
        "format": "graphsvc-json",
        "version": [2, 0],
        "nodes": [{"id": 0, "op": "leaf", "value": {"dtype": "float64", "shape": shape, "data": []}}],
    }
    with pytest.raises(FormatError, match=rf"^node 0: value: {message}$"):
        jsonio.loads(json.dumps(document))


def test_a_per_element_op_keeps_float32() -> None:
    registry = builtins()
    registry.register(
        Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x * x,), vectorized=False), plugin="p"
    )
    b = GraphBuilder()
    b.add("sum", [b.add("cube", [b.leaf(np.array([1.0, 2.0], dtype=np.float32), name="x")], name="c")], name="L")
    graph = graphsvc.backward(b.build(), registry=registry)
    assert graph.value("c").dtype == np.float32 and graph.value("c").tolist() == [1.0, 8.0]  # type: ignore[union-attr]
    assert graph.grad("x").dtype == np.float32 and graph.grad("x").tolist() == [3.0, 12.0]  # type: ignore[union-attr]


def test_a_0d_float64_array_keeps_its_shape_through_the_compiled_elementwise_ops() -> None:
    """exp, tanh, pow... run a C loop on float64 arrays when it is built: 0-d must stay 0-d, as
    numpy's functions keep it (the stored shape must not depend on the build)."""
    b = GraphBuilder()
    x = b.leaf(np.array([0.5, 1.0]), name="x")
    for name in ("exp", "tanh", "sigmoid", "log", "sin", "cos"):
        b.add(name, [b.add("sum", [x])], name=name)
    b.add("pow", [b.add("sum", [x])], attrs={"exponent": 3.0}, name="cube")
    graph = graphsvc.forward(b.build(), registry=builtins())
    for name in ("exp", "tanh", "sigmoid", "log", "sin", "cos", "cube"):
        value = graph.value(name)
        assert isinstance(value, float), name  # a float64 0-d result: a scalar node
    assert abs(graph.value("exp") - 4.4816890703380645) <= 1e-15  # type: ignore[operator]  # e**1.5
    assert graph.value("cube") == 3.375


def test_a_per_element_op_on_integers_gives_float64() -> None:
    registry = builtins()
    registry.register(Op("half", 1, forward=lambda x: x / 2, derivatives=lambda x, out: (0.5,), vectorized=False))
    b = GraphBuilder()
    b.add("half", [b.const(np.array([1, 3]), name="n")], name="h")
    value = graphsvc.forward(b.build(), registry=registry).value("h")
    assert value.dtype == np.float64 and value.tolist() == [0.5, 1.5]  # type: ignore[union-attr]


# -- which nodes get a gradient: PyTorch's requires_grad ------------------------------------------
def test_const_arrays_and_what_is_computed_from_them_alone_get_no_gradient() -> None:
    b = GraphBuilder()
    x = b.const(np.array([[1.0, 2.0], [3.0, 4.0]]), name="x")  # data
    scaled = b.add("mul", [x, b.const(np.array(0.5), name="half")], name="scaled")  # data too
    w = b.leaf(np.array([[1.0], [-1.0]]), name="w")
    c = b.const(3.0, name="c")  # a number, as in a graph of scalars: it gets one
    b.leaf(np.array([7.0, 8.0]), name="unused")
    b.add("mul", [b.add("sum", [b.add("matmul", [scaled, w], name="h")]), c], name="loss")
    graph = graphsvc.backward(b.build(), output="loss", registry=builtins())
    for name in ("x", "half", "scaled"):
        assert np.isnan(graph.grad(name)), name
        assert graph.node_id(name) not in graph.grad_arrays
    # loss = 3 * sum(0.5 * x @ w): dL/dw = 1.5 * column sums of x, dL/dc = sum(0.5 * x @ w)
    assert graph.grad("w").tolist() == [[6.0], [9.0]]  # type: ignore[union-attr]
    assert graph.grad("c") == -1.0
    assert graph.grad("h").tolist() == [[3.0], [3.0]]  # type: ignore[union-attr]
    assert graph.grad("unused").tolist() == [0.0, 0.0]  # a leaf the loss does not use: zeros


def test_a_vjp_that_declares_needs_input_grad_is_told_which_inputs_need_one() -> None:
    seen: list[tuple[bool, ...]] = []

    def vjp(g: Any, out: Any, x: Any, y: Any, needs_input_grad: tuple[bool, ...] = (True, True)) -> Any:
        seen.append(needs_input_grad)
        return (g * y if needs_input_grad[0] else None), (g * x if needs_input_grad[1] else None)

    def vjp_without(g: Any, out: Any, x: Any, y: Any) -> Any:
        return g * y, np.full_like(x, 99.0)  # the second is for the data input: it must be dropped

    registry = builtins()
    registry.register(Op("times", 2, forward=np.multiply, vjp=vjp))
    registry.register(Op("times_all", 2, forward=np.multiply, vjp=vjp_without))
    b = GraphBuilder()
    w, x = b.leaf(np.array([2.0, 3.0]), name="w"), b.const(np.array([5.0, 7.0]), name="x")
    b.add("sum", [b.add("times_all", [b.add("times", [w, x], name="p"), x], name="q")], name="loss")
    steps: list[Any] = []
    graph = graphsvc.backward(b.build(), registry=registry)
    assert seen == [(True, False)]
    assert graph.grad("w").tolist() == [25.0, 49.0]  # type: ignore[union-attr]
    assert np.isnan(graph.grad("x"))
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    built = b.build()
    ops = replay.resolve_ops(built, registry)
    values = tensors.forward(built, ops)
    tensors.backward(built, ops, built.node_id("loss"), values, steps)
    sent = {built.label(s.node): [(built.label(p), c) for p, _, c in s.contributions] for s in steps}
    assert sent["q"][1] == ("x", None)  # what the data input received: nothing
    assert sent["p"][1] == ("x", None)


def test_check_vjp_asks_a_selective_vjp_for_each_input_alone() -> None:
    from graphsvc.testing import check_vjp

    def honest(g: Any, out: Any, x: Any, y: Any, needs_input_grad: tuple[bool, ...] = (True, True)) -> Any:
        return (g * y if needs_input_grad[0] else None), (g * x if needs_input_grad[1] else None)

    def swapped(g: Any, out: Any, x: Any, y: Any, needs_input_grad: tuple[bool, ...] = (True, True)) -> Any:
        if needs_input_grad == (True, True):
            return g * y, g * x
        return (g * x if needs_input_grad[0] else None), (g * y if needs_input_grad[1] else None)

    x, y = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    assert check_vjp(Op("honest", 2, forward=np.multiply, vjp=honest), x, y).ok
    result = check_vjp(Op("swapped", 2, forward=np.multiply, vjp=swapped), x, y)
    assert not result.ok
    assert result.message == (
        "op 'swapped' (an unnamed plugin): with needs_input_grad=(True, False), vjp gives input 0 "
        "a different cotangent, not the one it gives with every input needed"
    )


# -- residuals: what a forward keeps for its VJP ---------------------------------------------------
def _cube_op(calls: list[str], kept: list[Any]) -> Op:
    """x**3, whose forward keeps 3x**2 for the VJP (and says which function ran)."""

    def forward(x: Any) -> Any:
        calls.append("forward")
        return x**3

    def with_residuals(x: Any) -> tuple[Any, Any]:
        calls.append("forward_with_residuals")
        slope = 3 * x**2
        kept.append(slope)
        return x**3, slope

    def vjp(g: Any, out: Any, x: Any, residuals: Any = None) -> Any:
        calls.append("vjp with residuals" if residuals is not None else "vjp without")
        return (g * (3 * x**2 if residuals is None else residuals),)

    return Op("cube", 1, forward=forward, vjp=vjp, forward_with_residuals=with_residuals)


def test_a_backward_after_a_forward_gets_what_forward_with_residuals_kept() -> None:
    calls: list[str] = []
    kept: list[Any] = []
    registry = builtins()
    registry.register(_cube_op(calls, kept))
    b = GraphBuilder()
    b.add("sum", [b.add("cube", [b.leaf(np.array([1.0, -2.0]), name="x")], name="c")], name="loss")
    graph = b.build()
    result = graphsvc.backward(graph, registry=registry)
    assert calls == ["forward_with_residuals", "vjp with residuals"]
    assert result.grad("x").tolist() == [3.0, 12.0]  # type: ignore[union-attr]
    assert result.value("c").tolist() == [1.0, -8.0]  # type: ignore[union-attr]
    calls.clear()
    graphsvc.forward(graph, registry=registry)  # no backward follows: nothing to keep
    assert calls == ["forward"]
    calls.clear()
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    ops = replay.resolve_ops(graph, registry)
    grads = tensors.backward(graph, ops, graph.node_id("loss"), tensors.forward(graph, ops))
    assert calls == ["forward", "vjp without"]  # values from elsewhere (a file): the VJP makes them again
    assert grads[graph.node_id("x")].tolist() == [3.0, 12.0]  # type: ignore[union-attr]


def test_forward_with_residuals_must_return_a_pair_and_its_failures_name_it() -> None:
    registry = builtins()
    vjp = lambda g, out, x, residuals=None: (g,)  # noqa: E731
    registry.register(Op("single", 1, forward=np.negative, vjp=vjp, forward_with_residuals=np.negative))
    registry.register(Op("fails", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: 1 / 0))
    registry.register(Op("triple", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: (-x, 1, 2)))
    registry.register(Op("lone", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: (-x,)))
    registry.register(Op("text", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: ("abc", None)))
    for op, message in (
        ("single", "node loss: op 'single' (an unnamed plugin): forward_with_residuals returned ndarray, "
         "expected a pair (output, residuals)"),
        ("triple", "node loss: op 'triple' (an unnamed plugin): forward_with_residuals returned a tuple of 3 items, "
         "expected a pair (output, residuals)"),
        ("lone", "node loss: op 'lone' (an unnamed plugin): forward_with_residuals returned a tuple of 1 item, "
         "expected a pair (output, residuals)"),
        ("text", "node loss: op 'text' (an unnamed plugin): forward_with_residuals returned str, "
         "not an array of float64, float32 or int64"),
        ("fails", "node loss: op 'fails' (an unnamed plugin): forward_with_residuals raised ZeroDivisionError: "
         "division by zero"),
    ):  # fmt: skip
        b = GraphBuilder()
        b.add(op, [b.leaf(np.array([1.0]), name="x")], name="loss")
        with pytest.raises(ReplayError) as caught:
            graphsvc.backward(b.build(), output="loss", registry=registry)
        assert str(caught.value) == message


def _reusing_square(wrap: Callable[[np.ndarray], Any] = lambda slope: slope) -> Op:
    """x**2, keeping 2x in a buffer it reuses for every input of that shape: the second node's
    forward would overwrite the first node's residuals. ``wrap`` puts the buffer in a container."""
    buffers: dict[tuple[int, ...], np.ndarray] = {}

    def with_residuals(x: Any) -> tuple[Any, Any]:
        slope = buffers.setdefault(x.shape, np.empty(x.shape))
        np.multiply(x, 2.0, out=slope)
        return x * x, wrap(slope)

    def vjp(g: Any, out: Any, x: Any, residuals: Any = None) -> Any:
        if residuals is None:
            return (g * (2.0 * x),)
        while not isinstance(residuals, np.ndarray):  # the buffer, out of its containers
            residuals = next(iter(residuals.values() if isinstance(residuals, dict) else residuals))
        return (g * residuals,)

    return Op("sq", 1, forward=lambda x: x * x, vjp=vjp, forward_with_residuals=with_residuals)


def test_residuals_are_read_only_so_a_reused_buffer_fails_instead_of_giving_wrong_gradients() -> None:
    from graphsvc.testing import check_vjp

    registry = builtins()
    registry.register(_reusing_square())
    b = GraphBuilder()
    a, c = b.leaf(np.array([1.0, 2.0]), name="a"), b.leaf(np.array([10.0, 20.0]), name="c")
    b.add("sum", [b.add("add", [b.add("sq", [a], name="sa"), b.add("sq", [c], name="sc")])], name="loss")
    with pytest.raises(ReplayError) as caught:
        graphsvc.backward(b.build(), registry=registry)
    assert str(caught.value) == (
        "node sc: op 'sq' (an unnamed plugin): forward_with_residuals raised ValueError: output array is read-only"
    )
    result = check_vjp(_reusing_square(), np.array([1.0, 2.0, 3.0]))
    assert result.message == (
        "op 'sq' (an unnamed plugin): forward_with_residuals raised ValueError: output array is read-only"
    )
    for wrap in (lambda s: (s, 1), lambda s: {"slope": s}, lambda s: [{"deep": (s,)}]):  # however it is held
        result = check_vjp(_reusing_square(wrap), np.array([1.0, 2.0, 3.0]))
        assert result.message == (
            "op 'sq' (an unnamed plugin): forward_with_residuals raised ValueError: output array is read-only"
        )


def test_the_backward_pass_lets_each_residual_go_once_its_vjp_ran() -> None:
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    calls: list[str] = []
    registry = builtins()
    registry.register(_cube_op(calls, []))
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, -2.0]), name="x")
    b.add("cube", [x], name="unused")  # not an ancestor of the loss: its VJP never runs
    b.add("sum", [b.add("cube", [x], name="c")], name="loss")
    graph = b.build()
    ops = replay.resolve_ops(graph, registry)
    kept: dict[int, Any] = {}
    values = tensors.forward(graph, ops, residuals=kept)
    assert sorted(kept) == [graph.node_id("unused"), graph.node_id("c")]
    tensors.backward(graph, ops, graph.node_id("loss"), values, residuals=kept)
    assert kept == {}
    assert calls == ["forward_with_residuals", "forward_with_residuals", "vjp with residuals"]


def test_forward_with_residuals_needs_a_vjp_that_takes_them() -> None:
    vjp = lambda g, out, x: (g,)  # noqa: E731
    for op, message in (
        (Op("a", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: (-x, None)),
         "op 'a': forward_with_residuals is given, but no vjp that takes `residuals` to receive them"),
        (Op("b", 1, forward=np.negative, derivatives=lambda x, out: (-1.0,), forward_with_residuals=lambda x: (-x, 1)),
         "op 'b': forward_with_residuals is given, but no vjp that takes `residuals` to receive them"),
        (Op("c", 1, forward=np.negative, vjp=vjp, forward_with_residuals=3),  # type: ignore[arg-type]
         "op 'c': forward_with_residuals must be a function, not 3"),
    ):  # fmt: skip
        with pytest.raises(OpError) as caught:
            builtins().register(op)
        assert str(caught.value) == message


def test_check_vjp_compares_what_residuals_give_with_what_none_gives() -> None:
    from graphsvc.testing import check_vjp

    x = np.array([0.5, -1.5, 2.0])
    assert check_vjp(_cube_op([], []), x).ok

    def vjp(g: Any, out: Any, x: Any, residuals: Any = None) -> Any:
        return (g * (3 * x**2 if residuals is None else residuals),)

    wrong_slope = Op("wrong", 1, forward=lambda x: x**3, vjp=vjp, forward_with_residuals=lambda x: (x**3, 2 * x**2))
    wrong_output = Op("off", 1, forward=lambda x: x**3, vjp=vjp, forward_with_residuals=lambda x: (x**3 + 1, 3 * x**2))
    assert check_vjp(wrong_slope, x).message == (
        "op 'wrong' (an unnamed plugin): given the residuals of forward_with_residuals, vjp gives input 0 "
        "a different cotangent than without them"
    )
    assert check_vjp(wrong_output, x).message == (
        "op 'off' (an unnamed plugin): forward_with_residuals gives an output that is not the one forward gives"
    )
    no_place = Op("lost", 1, forward=np.negative, vjp=lambda g, out, x: (-g,), forward_with_residuals=lambda x: (-x, 1))
    assert check_vjp(no_place, x).message == (  # what registering it refuses
        "op 'lost': forward_with_residuals is given, but no vjp that takes `residuals` to receive them"
    )


def test_the_builtin_matmul_and_conv2d_skip_what_is_not_needed() -> None:
    from graphsvc.replay.arrays import vjp_of

    registry = builtins()
    vjp, takes_needs, _ = vjp_of(registry.get("matmul"))
    assert takes_needs
    g, x, y = np.ones((2, 4, 5)), np.ones((2, 4, 3)), np.full((3, 5), 2.0)
    gx, gy = vjp(g, None, x, y, needs_input_grad=(False, True))
    assert gx is None and gy.tolist() == [[8.0] * 5] * 3  # one product of the stack's rows
    gx, gy = vjp(g, None, x, y, needs_input_grad=(True, False))
    assert gy is None and gx.tolist() == [[[10.0] * 3] * 4] * 2


@pytest.mark.parametrize("shapes", [((2, 3, 0), (0, 5)), ((2, 0, 4), (4, 5)), ((0, 3, 4), (4, 5)), ((2, 3, 4), (4, 0))])
def test_matmul_of_a_stack_with_no_elements_is_numpys(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    b = GraphBuilder()
    x, y = b.leaf(np.ones(shapes[0]), name="x"), b.leaf(np.ones(shapes[1]), name="y")
    b.add("sum", [b.add("matmul", [x, y], name="p")], name="loss")
    graph = graphsvc.backward(b.build(), output="loss", registry=builtins())
    assert graph.value("p").tolist() == np.matmul(np.ones(shapes[0]), np.ones(shapes[1])).tolist()  # type: ignore[union-attr]
    assert graph.grad("x").shape == shapes[0] and graph.grad("y").shape == shapes[1]  # type: ignore[union-attr]


def test_take_of_a_transposed_array_sends_the_gradient_to_the_elements_taken() -> None:
    b = GraphBuilder()
    w = b.leaf(np.arange(6.0).reshape(2, 3), name="w")
    t = b.add("transpose", [w], name="t")  # (3, 2), a view in Fortran order
    picks = b.const(np.array([0, 5, 5]), name="picks")  # t.flat[0] = w[0, 0], t.flat[5] = w[1, 2]
    b.add("sum", [b.add("take", [t, picks], name="taken")], name="loss")
    graph = graphsvc.backward(b.build(), output="loss", registry=builtins())
    assert graph.value("taken").tolist() == [0.0, 5.0, 5.0]  # type: ignore[union-attr]
    assert graph.grad("t").tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]  # type: ignore[union-attr]
    assert graph.grad("w").tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]  # type: ignore[union-attr]


def test_every_vjp_op_gives_the_same_gradients_for_fortran_ordered_inputs() -> None:
    """A transpose's output is a Fortran-ordered view: every VJP must work on such inputs (check_vjp
    keeps the layout it is given; take's VJP once added into a copy made by reshape)."""
    from graphsvc.testing import check_vjp

    rng = np.random.default_rng(7)
    checked = 0
    for op in builtins():
        for inputs, attrs in op.samples(rng) if op.samples is not None else ():
            laid_out = [np.asfortranarray(x) if np.asarray(x).dtype.kind == "f" else x for x in inputs]
            result = check_vjp(op, *laid_out, attrs=attrs)
            assert result.ok, result.message
            checked += 1
    assert checked >= 30


def test_ops_with_constant_derivatives_give_the_cotangents_their_derivatives_give() -> None:
    """The derived VJP of add, sub and neg uses the table's numbers instead of calling derivatives
    per node: the same cotangents, bit for bit, as the same op without its kernel (which calls them)."""
    import dataclasses

    from graphsvc.ops import opmath

    registry = builtins()
    constant = [name for name in opmath.RULES if opmath.constant_partials(name) is not None]
    assert constant == ["add", "sub", "neg"]
    rng = np.random.default_rng(4)
    for name in constant:
        op = registry.get(name)
        called = dataclasses.replace(op, kernel=None)  # no kernel: derivatives called per node
        shapes = [(2, 3), (3,)][: op.arity]
        inputs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
        g = rng.standard_normal((2, 3)).astype(np.float32)
        fast = op.tensor_vjp.function(g, None, *inputs, needs_input_grad=(True,) * op.arity)
        slow = called.tensor_vjp.function(g, None, *inputs, needs_input_grad=(True,) * op.arity)
        for a, b in zip(fast, slow, strict=True):
            assert a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes(), name


# -- nll_loss: PyTorch's, so that log_softmax then nll_loss is the cross-entropy of its graphs -------
def _nll_graph(logp: np.ndarray, target: np.ndarray, **attrs: Any) -> Graph:
    b = GraphBuilder()
    x = b.leaf(logp, name="logp")
    b.add("nll_loss", [x, b.const(target, name="target")], attrs=attrs or None, name="loss")
    return b.build()


def test_nll_loss_is_minus_the_mean_of_the_picked_log_probabilities() -> None:
    logp = np.log(np.array([[0.5, 0.25, 0.25], [0.125, 0.75, 0.125], [0.5, 0.25, 0.25]]))
    graph = graphsvc.backward(_nll_graph(logp, np.array([0, 1, -100])), output="loss", registry=builtins())
    # two rows count (the third is ignored): (log 2 - log 0.75) / 2, each picked entry's gradient -1/2
    assert graph.value("loss") == (-np.log(0.5) - np.log(0.75)) / 2
    assert graph.grad("logp").tolist() == [[-0.5, 0.0, 0.0], [0.0, -0.5, 0.0], [0.0, 0.0, 0.0]]  # type: ignore[union-attr]


def test_nll_loss_sum_and_none_and_the_class_axis_of_images() -> None:
    logp = -np.arange(12.0).reshape(1, 3, 2, 2)  # (N, C, H, W): classes along axis 1
    target = np.array([[[2, 0], [1, 7]]])  # 7: ignored
    graph = graphsvc.forward(_nll_graph(logp, target, reduction="none", ignore_index=7), registry=builtins())
    assert graph.value("loss").tolist() == [[[8.0, 1.0], [6.0, 0.0]]]  # type: ignore[union-attr]
    b = GraphBuilder()
    x = b.leaf(logp, name="logp")
    picked = b.add("nll_loss", [x, b.const(target)], attrs={"reduction": "sum", "ignore_index": 7}, name="picked")
    b.add("mul", [picked, b.const(np.array(3.0))], name="loss")
    graph = graphsvc.backward(b.build(), output="loss", registry=builtins())
    assert graph.value("picked") == 15.0
    expected = np.zeros((1, 3, 2, 2))
    expected[0, 2, 0, 0] = expected[0, 0, 0, 1] = expected[0, 1, 1, 0] = -3.0
    assert graph.grad("logp").tolist() == expected.tolist()  # type: ignore[union-attr]


def test_nll_loss_keeps_float32_and_gives_pytorchs_mean_of_no_targets() -> None:
    logp = np.log(np.full((2, 4), 0.25, dtype=np.float32))
    graph = graphsvc.backward(_nll_graph(logp, np.array([3, 1])), output="loss", registry=builtins())
    assert graph.value("loss").dtype == np.float32 and graph.value("loss") == np.float32(np.log(4.0))  # type: ignore[union-attr]
    assert graph.grad("logp").dtype == np.float32  # type: ignore[union-attr]
    nothing = graphsvc.forward(_nll_graph(logp, np.array([-100, -100])), registry=builtins())
    assert np.isnan(nothing.value("loss"))  # 0 / 0, as F.nll_loss gives


@pytest.mark.parametrize(
    ("logp", "target", "attrs", "message"),
    [
        (np.zeros((2, 3)), np.array([0, 3]), {}, "target 3 is out of range for 3 classes"),
        (np.zeros((2, 1)), np.array([0, 1]), {}, "target 1 is out of range for 1 class"),
        (np.zeros((2, 3)), np.array([-1, 0]), {"ignore_index": 0}, "target -1 is out of range for 3 classes"),
        (np.zeros((2, 3)), np.array([0.0, 1.0]), {}, "the target must hold class indices (int64), not float64"),
        (
            np.zeros((2, 3), dtype=np.int64),
            np.array([0, 1]),
            {},
            "the log-probabilities must be floats (float32, float64), not int64",
        ),
        (
            np.zeros((2, 3)),
            np.array([0, 1]),
            {"ignore_index": 1.5},
            "ignore_index must be an integer (a class index to leave out), not 1.5",
        ),
        (
            np.zeros((2, 3)),
            np.array([0, 1]),
            {"ignore_index": True},
            "ignore_index must be an integer (a class index to leave out), not True",
        ),
        (
            np.zeros((2, 3)),
            np.array([0, 1, 2]),
            {},
            "a target of shape [3] for log-probabilities of shape [2, 3]: expected [2]",
        ),
        (
            np.zeros(()),
            np.array(0),
            {},
            "a target of shape [] for log-probabilities of shape []: expected classes along axis 0 or 1",
        ),
        (
            np.zeros((2, 3)),
            np.array([0, 1]),
            {"reduction": "avg"},
            "reduction must be one of mean, sum, none, not 'avg'",
        ),
    ],
)
def test_nll_loss_refuses_with_the_reason(
    logp: np.ndarray, target: np.ndarray, attrs: dict[str, Any], message: str
) -> None:
    """The same words under a backward replay, which computes the node with the op's
    forward_with_residuals: a builtin op's two forward functions are one to its users."""
    for replay in (graphsvc.forward, lambda graph, registry: graphsvc.backward(graph, "loss", registry=registry)):
        with pytest.raises(ReplayError) as info:
            replay(_nll_graph(logp, target, **attrs), registry=builtins())
        assert str(info.value) == f"node loss: op 'nll_loss' (graphsvc 0.1.0): forward raised ValueError: {message}"


def test_a_builtin_ops_forward_with_residuals_is_named_forward_and_a_plugins_by_its_name() -> None:
    vjp = lambda g, out, x, residuals=None: (g,)  # noqa: E731
    for plugin, named in (("graphsvc", "forward"), ("mine", "forward_with_residuals")):
        registry = OpRegistry()
        registry.register(
            Op("fails", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: 1 / 0), plugin=plugin
        )
        registry.register(
            Op("text", 1, forward=np.negative, vjp=vjp, forward_with_residuals=lambda x: ("abc", None)), plugin=plugin
        )
        for op, message in (
            ("fails", f"node loss: op 'fails' ({plugin}): {named} raised ZeroDivisionError: division by zero"),
            (
                "text",
                f"node loss: op 'text' ({plugin}): {named} returned str, not an array of float64, float32 or int64",
            ),
        ):
            b = GraphBuilder()
            b.add(op, [b.leaf(np.array([1.0]), name="x")], name="loss")
            with pytest.raises(ReplayError) as caught:
                graphsvc.backward(b.build(), output="loss", registry=registry)
            assert str(caught.value) == message


def test_nll_loss_of_no_classes_with_every_target_ignored_is_pytorchs() -> None:
    """Shape (N, 0): every target must be ignored; the mean of none is nan, the sum 0, no gradient."""
    logp, target = np.zeros((2, 0)), np.array([-100, -100])
    mean = graphsvc.backward(_nll_graph(logp, target), output="loss", registry=builtins())
    assert np.isnan(mean.value("loss")) and mean.grad("logp").shape == (2, 0)  # type: ignore[union-attr]
    total = graphsvc.forward(_nll_graph(logp, target, reduction="sum"), registry=builtins())
    assert total.value("loss") == 0.0


def test_a_json_loaded_graphs_arrays_are_read_only_as_a_built_or_loaded_graphs() -> None:
    from graphsvc.format import jsonio

    graph = jsonio.loads(jsonio.dumps(seed004_on_arrays()))
    a = graph.node_id("a")
    with pytest.raises(ValueError, match="read-only"):
        graph.arrays[a][0] = 5.0
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):
        graph.arrays[a].flags.writeable = True
    assert graph.value("a").tolist() == [2.0, 1.0]  # type: ignore[union-attr]
