"""The C walks over Python objects (csrc/walk.c, graphsvc.native._cwalk) give what the Python references give.

``from_micrograd`` and ``trace``/``Value.backward`` each walk the objects in C where the extension
was built; the pure-Python references (``graphsvc.micrograd._from_micrograd_reference``,
``value._postorder`` and ``value._graph``) stay the oracle. Each test builds random graphs with
special numbers (nan, inf, -0.0), repeated parents (``a + a``), shared subexpressions, constants and
equal data (so the canonical order's tie-breaks matter), runs both walks and compares every column
bit for bit, the node order, the names, attrs, outputs and metadata, the errors, and the gradients
written back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc import micrograd as graphsvc_micrograd
from graphsvc import value
from graphsvc.collector import gc_paused
from graphsvc.errors import GraphStructureError
from graphsvc.graph import Graph
from graphsvc.value import Value, default_registry, zero_grad
from tests.conftest import MicrogradNode, require_native

micrograd_engine = pytest.importorskip("micrograd.engine", reason="the test extra installs micrograd")
MicroValue: Any = micrograd_engine.Value

SPECIAL = [0.0, -0.0, 1.0, 2.0, -3.5, math.nan, -math.nan, math.inf, -math.inf, 5e-324, 1e308]


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """graphsvc.native._cwalk, the walk value.native_walk() gives (see require_native)."""
    module: ModuleType = require_native("walk")
    assert value.native_walk() is module
    return module


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (every float from the same Python float: nan payloads and -0.0 too)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_graph(ours: Graph, reference: Graph, valid: bool = True) -> None:
    assert ours.op_table == reference.op_table
    for column in ("op_codes", "parent_offsets", "parent_indices", "values"):
        assert same_bits(getattr(ours, column), getattr(reference, column)), column
    if reference.grads is None:
        assert ours.grads is None
    else:
        assert ours.grads is not None and same_bits(ours.grads, reference.grads)
    assert ours.names == reference.names
    assert ours.attrs == reference.attrs
    assert ours.outputs == reference.outputs
    assert ours.metadata == reference.metadata
    assert ours.op_sources == reference.op_sources
    if valid:
        assert fmt.dumps(ours) == fmt.dumps(reference)


# -- micrograd ----------------------------------------------------------------------------------------
def random_micrograd(seed: int, size: int = 300) -> tuple[list[Any], dict[Any, str]]:
    """micrograd Values made with its constructor (any data, any tag): few distinct numbers, so many
    parents tie on data and keys; a + a and a * a (one parent in the set); numbers written in an
    expression (constant leaves); a few roots, one repeated; gradients of every kind micrograd holds
    (its int 0, floats, nan); names on some nodes."""
    rng = random.Random(seed)
    nodes = [MicroValue(rng.choice(SPECIAL)) for _ in range(5)]
    for _ in range(size):
        kind = rng.randrange(8)
        x, y = rng.choice(nodes[-30:] if rng.random() < 0.8 else nodes), rng.choice(nodes[-10:])
        data = rng.choice(SPECIAL)
        if kind == 0:
            node = MicroValue(data, (x, y), rng.choice("+*"))
        elif kind == 1:
            node = MicroValue(data, (x, x), rng.choice("+*"))  # the set keeps one
        elif kind == 2:
            node = MicroValue(data, (x, MicroValue(rng.choice([2.0, 0.5]))), "*")  # a constant
        elif kind == 3:
            node = MicroValue(data, (x,), rng.choice(["**2", "**-1", "**0.5", "**3"]))
        elif kind == 4:
            node = MicroValue(data, (x,), rng.choice(["ReLU", "tanh", "exp"]))
        else:
            node = x * y if kind == 5 else x + y if kind == 6 else -x  # -x: x * Value(-1)
        nodes.append(node)
    for node in nodes:
        if rng.random() < 0.7:
            node.grad = rng.choice([*SPECIAL, 0, 1])
    roots = [nodes[-1], nodes[-2], rng.choice(nodes), nodes[-1]]
    reachable = {id(node) for node in micrograd_nodes(roots)}
    names = {node: f"n{i}" for i, node in enumerate(nodes) if id(node) in reachable and rng.random() < 0.1}
    return roots, names


def micrograd_nodes(roots: list[Any]) -> list[Any]:
    """Every node reachable from roots."""
    seen = {id(root): root for root in roots}
    stack = list(roots)
    while stack:
        for parent in stack.pop()._prev:
            if id(parent) not in seen:
                seen[id(parent)] = parent
                stack.append(parent)
    return list(seen.values())


@pytest.mark.parametrize("seed", range(25))
def test_micrograd_walk_matches_the_reference(native: ModuleType, seed: int) -> None:
    roots, names = random_micrograd(seed)
    ours = graphsvc_micrograd._from_micrograd(roots, names, native)
    assert_same_graph(ours, graphsvc_micrograd._from_micrograd_reference(roots, names))
    assert ours.values.flags.writeable and ours.grads is not None and ours.grads.flags.writeable
    # the unnamed graph too: then only data, ops and gradients order the parents
    assert_same_graph(
        graphsvc_micrograd._from_micrograd(roots[:1], None, native),
        graphsvc_micrograd._from_micrograd_reference(roots[:1], None),
    )


def test_micrograd_parents_tied_on_data_are_ordered_by_gradient_then_name(native: ModuleType) -> None:
    """x * y with x and y equal in all but gradient (then name): the smaller second key goes first,
    whatever order the set gives; the keys are Python's hash() of tuples, computed in C."""
    for trial in range(20):
        x, y = MicroValue(2.0), MicroValue(2.0)
        x.grad, y.grad = (1.0, 3.0) if trial % 2 else (3.0, 1.0)
        product = MicroValue(4.0, (x, y), "*")
        graph = graphsvc_micrograd._from_micrograd([product], None, native)
        assert_same_graph(graph, graphsvc_micrograd._from_micrograd_reference([product], None))
        reference_tie = {x: hash((x.grad, 0)), y: hash((y.grad, 0))}
        first = min((x, y), key=reference_tie.__getitem__)
        assert graph.grads is not None and graph.grads[graph.parents(2)[0]] == first.grad
        x.grad = y.grad = 0.0
        names = {x: "x", y: "y"}
        named = graphsvc_micrograd._from_micrograd([product], names, native)
        assert_same_graph(named, graphsvc_micrograd._from_micrograd_reference([product], names))
        first_name = min("xy", key=lambda name: hash((0.0, graphsvc_micrograd._name_key(name))))
        assert named.names[named.parents(2)[0]] == first_name


def test_micrograd_mlp_after_backward(native: ModuleType) -> None:
    from micrograd.nn import MLP

    random.seed(3)
    model = MLP(4, [8, 8, 1])
    loss = (model([MicroValue(0.5), -1.5, 2.0, 0.0]) - 1.0) ** 2
    loss.backward()
    graph = graphsvc_micrograd._from_micrograd([loss], None, native)
    assert_same_graph(graph, graphsvc_micrograd._from_micrograd_reference([loss], None))
    assert graph.grads is not None and graph.grads[graph.outputs[0]] == 1.0


def micrograd_chain(length: int) -> Any:
    """length + with a constant each, one after the other: 2 * length - 1 nodes, as deep as that."""
    with gc_paused():  # a million objects: the collector's full passes would cost seconds
        node = MicroValue(1.0)
        for _ in range(length - 1):
            node = MicroValue(node.data, (node, MicroValue(0.0)), "+")
    return node


def test_micrograd_deep_chain(native: ModuleType) -> None:
    root = micrograd_chain(50_000)
    assert_same_graph(
        graphsvc_micrograd._from_micrograd([root], None, native),
        graphsvc_micrograd._from_micrograd_reference([root], None),
    )


def test_micrograd_chain_of_a_million_nodes(native: ModuleType) -> None:
    """No recursion: 1,000,000 nodes deep (the reference takes ~10 s at this size; test_micrograd_deep_chain
    compares the two on a shorter chain). Each + keeps the chain and its constant, in either order."""
    graph = graphsvc_micrograd._from_micrograd([micrograd_chain(500_000)], None, native)
    assert graph.num_nodes == 999_999 and graph.outputs == [999_998]
    assert graph.op_histogram() == {"leaf": 500_000, "add": 499_999}
    assert np.array_equal(
        np.bincount(graph.parent_indices, minlength=999_999), [*[1] * 999_998, 0]
    )  # each node feeds one other
    assert graph.values.sum() == 500_000.0  # 1.0 in the first leaf and every +, 0.0 in the constants


def errors_of(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as caught:
        call()
    return caught.type, str(caught.value)


class Node(MicrogradNode):
    """The stand-in for micrograd's Value, shown as ``Node(data=...)`` in the messages below."""

    def __repr__(self) -> str:
        return f"Node(data={self.data})"


def cycle() -> Node:
    a = Node(1.0)
    b = Node(2.0, [a], "ReLU")
    a._prev, a._op = [b], "ReLU"
    return Node(3.0, [b], "tanh")


@pytest.mark.parametrize(
    "case",
    [
        lambda: ([Node(0.0, [Node(0.0)], "sin")], None),  # unknown op
        lambda: ([Node(3.0, [Node(1.0), Node(1.0), Node(1.0)], "+")], None),  # three parents
        lambda: ([Node(3.0, [], "+")], None),  # none
        lambda: ([Node(3.0, [Node(1.0)], "")], None),  # a leaf with a parent
        lambda: ([Node(1.0), 1.0], None),  # not a micrograd Value
        lambda: ([Node(1.0, [], ["list"])], None),  # an unhashable op
        lambda: ([Node("x")], None),  # data float() refuses
        lambda: ([Node(None)], None),
        lambda: ([Node(1.0, grad="g")], None),
        lambda: ([Node(1.0, [Node(2.0)], "**x")], None),  # an exponent that is not a number
        lambda: ([Node(1.0)], {Node(5.0): "x"}),  # a name for a node not in the graph
        lambda: ([cycle()], None),
    ],
)
def test_micrograd_errors_are_the_references(native: ModuleType, case: Callable[[], Any]) -> None:
    roots, names = case()
    expected = errors_of(lambda: graphsvc_micrograd._from_micrograd_reference(roots, names))
    assert errors_of(lambda: graphsvc_micrograd._from_micrograd(roots, names, native)) == expected


def test_micrograd_cycle_is_refused() -> None:
    with pytest.raises(GraphStructureError, match=r"micrograd node Node\(data=2.0\) is its own ancestor"):
        graphsvc_micrograd._from_micrograd_reference([cycle()], None)


def test_micrograd_odd_numbers_are_converted_as_float_does(native: ModuleType) -> None:
    """Ints, bools and numpy scalars as data and gradients; a list as _prev; tags as micrograd spells them."""
    a, b = Node(3, grad=True), Node(np.float32(0.1), grad=np.float64(-0.0))
    roots = [Node(2**60, [a, b], "*", grad=7), Node(0.5, [a], "**2")]
    ours = graphsvc_micrograd._from_micrograd(roots, {a: "a"}, native)
    assert_same_graph(ours, graphsvc_micrograd._from_micrograd_reference(roots, {a: "a"}))
    assert ours.attrs == {3: {"exponent": 2.0}}


def test_from_micrograd_uses_the_c_walk(native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the reference ran")

    monkeypatch.setattr(graphsvc_micrograd, "_from_micrograd_reference", refuse)
    roots, names = random_micrograd(0)
    assert graphsvc_micrograd.from_micrograd(*roots, names=names).num_nodes > 100


# -- graphsvc.Value -----------------------------------------------------------------------------------
def random_values(seed: int, size: int = 300, special: bool = True) -> list[Value]:
    """Values of every builtin operator and method, with special numbers (else numbers near 1, where
    few gradients are nan), x * x and x + x, numbers written in expressions (const nodes), names,
    reused subexpressions; several outputs, repeated."""
    rng = random.Random(seed)
    numbers = SPECIAL if special else [0.5, 0.75, 1.0, 1.25]
    values = [Value(rng.choice(numbers), name=f"x{i}" if i % 2 else None) for i in range(5)]
    unary = ["relu", "tanh", "exp", "log", "sqrt", "sigmoid", "sin", "cos", "abs", "__neg__"]
    for i in range(size):
        x, y = rng.choice(values), rng.choice(values[-8:])
        kind = rng.randrange(7)
        if kind == 0:
            node = rng.choice([x + y, x - y, x * y, x / y, x.max(y), x.min(y)])
        elif kind == 1:
            node = rng.choice([x + x, x * x])
        elif kind == 2:
            node = rng.choice([2.0 * x, x + 1, 3 - x, x / 4.0, x.max(0.0)])
        elif kind == 3:
            node = x ** rng.choice([2, 0.5, -1.0, 3])
        elif kind == 4:
            node = getattr(x, rng.choice(unary))()
        elif kind == 5:
            node = x.apply("add", y)
        else:
            node = (x * y + x) * (x + y)  # a subexpression of shared parents
        if rng.random() < 0.05:
            node.name = f"v{i}"
        values.append(node)
    for v in values:
        if rng.random() < 0.5:
            v.grad = rng.choice(numbers)
    return [values[-1], values[-3], rng.choice(values), values[-1]]


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("extras", [True, False])
def test_value_walk_matches_the_reference(native: ModuleType, seed: int, extras: bool) -> None:
    outputs = random_values(seed)
    registry = default_registry()
    nodes, ours = value._traced(outputs, registry, extras=extras, native=native)
    reference_nodes, reference = value._traced(outputs, registry, extras=extras, native=None)
    assert len(nodes) == len(reference_nodes)
    assert all(a is b for a, b in zip(nodes, reference_nodes, strict=True))
    assert_same_graph(ours, reference)


def build_topo(root: Value) -> list[Value]:
    """micrograd's build_topo, made iterative only so that it can follow long chains."""
    topo: list[Value] = []
    visited: set[int] = set()
    stack: list[tuple[Value, int]] = [(root, 0)]
    visited.add(id(root))
    while stack:
        node, position = stack.pop()
        if position < len(node.parents):
            stack.append((node, position + 1))
            child = node.parents[position]
            if id(child) not in visited:
                visited.add(id(child))
                stack.append((child, 0))
        else:
            topo.append(node)
    return topo


@pytest.mark.parametrize("seed", range(5))
def test_value_walk_order_is_build_topo(native: ModuleType, seed: int) -> None:
    root = random_values(seed)[0]
    nodes, graph = value._traced([root], default_registry(), extras=False, native=native)
    expected = build_topo(root)
    assert [id(v) for v in nodes] == [id(v) for v in expected]
    ids = {id(v): i for i, v in enumerate(expected)}
    assert [graph.parents(i) for i in range(graph.num_nodes)] == [[ids[id(p)] for p in v.parents] for v in expected]


def grads_after_backward(
    outputs: Callable[[], list[Value]], native: bool, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    """Every value's .grad after two backward() calls on the first output, by the C walk or the reference."""
    with monkeypatch.context() as patch:
        if not native:
            patch.setattr(value, "native_walk", lambda: None)
        root = outputs()[0]
        nodes = build_topo(root)
        root.backward()
        root.backward()  # gradients accumulate
        return [node.grad for node in nodes]


@pytest.mark.parametrize("seed", range(10))
def test_value_backward_writes_the_references_gradients(
    native: ModuleType, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def outputs() -> list[Value]:  # odd seeds: small graphs of numbers near 1, few nan or inf gradients
        return random_values(seed) if seed % 2 == 0 else random_values(seed, size=40, special=False)

    ours = grads_after_backward(outputs, True, monkeypatch)
    reference = grads_after_backward(outputs, False, monkeypatch)
    assert [type(g) for g in ours] == [type(g) for g in reference]
    ours_array, reference_array = np.array(ours, dtype=np.float64), np.array(reference, dtype=np.float64)
    # every bit, -0.0 included, but a nan's sign: old + new with both nan keeps the sign of whichever
    # operand the compiler put first, in CPython's float addition as in ours (IEEE leaves it open)
    both_nan = np.isnan(ours_array) & np.isnan(reference_array)
    assert np.all((ours_array.view(np.uint64) == reference_array.view(np.uint64)) | both_nan)
    if seed % 2:  # mostly finite: the sums themselves are compared
        assert np.isfinite(ours_array).mean() > 0.5


def test_value_backward_adds_to_grads_of_any_number_type(native: ModuleType) -> None:
    """+= as Python does it: an int grad becomes a float, a numpy scalar stays one, nan and -0.0 kept."""
    a, b, c = Value(2.0), Value(3.0), Value(-0.0)
    loss = a * b + c
    a.grad, b.grad, c.grad = 1, np.float64(0.5), -0.0
    loss.grad = math.nan
    loss.backward()
    assert (a.grad, type(a.grad)) == (4.0, float)
    assert (b.grad, type(b.grad)) == (2.5, np.float64)
    assert math.copysign(1.0, c.grad) == 1.0 and c.grad == 1.0  # -0.0 + 1.0
    assert math.isnan(loss.grad)
    zero_grad(loss)
    loss.backward()
    assert (a.grad, b.grad, c.grad, loss.grad) == (3.0, 2.0, 1.0, 1.0)


def test_value_deep_chain_of_a_million_nodes(native: ModuleType) -> None:
    """No recursion: 1,000,000 values deep, the chain in order; the reference compared at 100,000."""
    x = Value(0.5, name="x")
    y = x
    with gc_paused():
        for i in range(999_999):
            y = y.relu()
            if i == 99_998:
                shorter = y
    registry = default_registry()
    nodes, ours = value._traced([y], registry, extras=True, native=native)
    assert ours.num_nodes == 1_000_000 and nodes[0] is x and nodes[-1] is y
    assert ours.parent_offsets.tolist() == [0, *range(1_000_000)]
    assert np.array_equal(ours.parent_indices, np.arange(999_999, dtype=np.int32))
    assert ours.op_table == ["leaf", "relu"] and ours.names == {0: "x"} and ours.outputs == [999_999]
    assert_same_graph(
        value._traced([shorter], registry, extras=True, native=native)[1],
        value._traced([shorter], registry, extras=True, native=None)[1],
    )
    y.backward()
    assert (x.grad, y.grad) == (1.0, 1.0)


def test_value_walk_records_a_cycle_as_the_reference_does(native: ModuleType) -> None:
    """_parents changed into a cycle: both walks record the parent still on the stack as -1, which
    trace's structure check refuses."""
    a = Value(1.0)
    b = a.relu()
    c = b.relu()
    a._parents, a._op = (c,), "relu"
    registry = default_registry()
    cyclic = value._traced([c], registry, extras=False, native=native)[1]
    assert_same_graph(cyclic, value._traced([c], registry, extras=False, native=None)[1], valid=False)
    assert cyclic.parent_indices.tolist() == [2, 0, 1]
    assert errors_of(lambda: value._traced([c], registry, extras=True, native=native)) == errors_of(
        lambda: value._traced([c], registry, extras=True, native=None)
    )


def test_trace_and_backward_use_the_c_walk(native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the reference ran")

    monkeypatch.setattr(value, "_postorder", refuse)
    a = Value(3.0)
    loss = a * a + a
    assert value.trace(loss).num_nodes == 3
    loss.backward()
    assert a.grad == 7.0


def test_add_grads_checks_its_arguments(native: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"^2 nodes but 1 gradient$"):
        native.add_grads([Value(1.0), Value(2.0)], np.zeros(1))
    with pytest.raises(TypeError, match=r"^grads: items of 4 bytes, not 8$"):
        native.add_grads([Value(1.0)], np.zeros(1, dtype=np.float32))


def test_a_micrograd_node_that_is_its_own_parent_is_a_cycle_in_both_walks() -> None:
    """A self-loop was missed (the node's own index was already set) and read unset keys in C."""
    from micrograd.engine import Value as MValue

    from graphsvc.errors import GraphStructureError
    from graphsvc.micrograd import from_micrograd

    for loop_first in (True, False):
        r = MValue(1.0, (), "ReLU")
        r._prev = {r}
        root = r if loop_first else r.relu()
        with pytest.raises(GraphStructureError, match=r"is its own ancestor: a graph with a cycle cannot be imported$"):
            from_micrograd(root)


def test_parents_changed_by_code_the_walk_runs_cannot_crash_it() -> None:
    """A property the walk reads may change or empty a Value's parents list: the walk keeps its own
    tuple of them (before, a freed or never-walked parent was read; under AddressSanitizer a
    use-after-free)."""
    from graphsvc import value

    class Sneaky(value.Value):
        __slots__ = ()

        @property  # type: ignore[override]
        def data(self) -> float:
            child._parents[:] = [value.Value(9.0)]
            return 2.0

        @data.setter
        def data(self, number: float) -> None:
            pass

    a, b = Sneaky(2.0), value.Value(3.0)
    child = value.Value(5.0, _op="add", _parents=[a, b])  # type: ignore[arg-type]
    require_native("walk")
    child.backward()  # the graph as the walk found it: child = a + b
    assert (a.grad, b.grad, child.grad) == (1.0, 1.0, 1.0)
    assert [p.data for p in child._parents] == [9.0]  # what the property did, done


@pytest.mark.parametrize("walk", ["native", "reference"])
def test_a_traced_graph_shares_no_list_or_map_of_a_values_attributes(
    native: ModuleType, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C walk copied each node's map and shared the lists in it: changing the traced graph's
    attribute in place changed the Value's, and so every later trace (the Python walk copies to the bottom)."""
    if walk == "reference":
        monkeypatch.setattr(value, "native_walk", lambda: None)
    x = Value(2.0)
    y = Value(6.0, None, "scale", (x,), {"factors": [3.0], "spec": {"axes": [0]}})
    graph = value._traced([y], default_registry(), extras=False, native=value.native_walk())[1]
    graph.attrs[1]["factors"][0] = 100.0
    graph.attrs[1]["spec"]["axes"].append(1)
    assert y._attrs == {"factors": [3.0], "spec": {"axes": [0]}}
