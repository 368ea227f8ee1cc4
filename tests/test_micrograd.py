"""graphsvc.from_micrograd: tags, a*a, a canonical order whatever the sets say, and replays that
give micrograd's own values and gradients.

The structural tests use a tiny stand-in with micrograd's attributes (the importer duck-types), so
they run without micrograd; the MLP test needs the real thing (``pip install micrograd==0.1.0``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import GraphStructureError
from graphsvc.micrograd import from_micrograd
from graphsvc.replay import columns as replay
from graphsvc.value import default_registry
from tests.conftest import MicrogradNode as Node


def replayed(graph: Any) -> tuple[np.ndarray, np.ndarray]:
    registry = default_registry()
    values = replay.forward(graph, registry)
    return values, replay.backward(graph, registry, graph.outputs[0], values)


def test_a_times_a_has_one_parent_in_the_set_and_two_in_the_graph() -> None:
    a = Node(3.0)
    square = Node(9.0, {a}, "*")
    total = Node(12.0, {square, a}, "+")
    graph = from_micrograd(total)
    assert [graph.op(i) for i in range(graph.num_nodes)] == ["leaf", "mul", "add"]
    assert graph.parents(1) == [0, 0]
    values, grads = replayed(graph)
    assert values.tolist() == [3.0, 9.0, 12.0]
    assert grads.tolist() == [7.0, 1.0, 1.0]  # d(a*a + a)/da = 2a + 1


def test_tags_and_the_exponent_attribute() -> None:
    a = Node(4.0)
    inverse = Node(0.25, [a], "**-1")
    root = Node(2.0, [a], "**0.5")
    relu = Node(0.0, [Node(-1.0)], "ReLU")
    graph = from_micrograd(inverse, root, relu)
    assert graph.op_table == ["leaf", "pow", "relu"]
    assert graph.attrs == {1: {"exponent": -1.0}, 2: {"exponent": 0.5}}
    assert graph.outputs == [1, 2, 4]
    assert graph.metadata == {"imported_from": "micrograd"}
    values, _ = replayed(graph)
    assert values.tolist() == [4.0, 0.25, 2.0, -1.0, 0.0]


def test_order_does_not_depend_on_set_order() -> None:
    def seed004(flip: bool) -> Node:
        """L = (a*b + c) * (a + b), every parent list reversed when ``flip``."""

        def node(data: float, prev: list[Node], op: str) -> Node:
            return Node(data, prev[::-1] if flip else prev, op)

        a, b, c = Node(2.0, grad=22.0), Node(3.0, grad=17.0), Node(1.0, grad=5.0)
        return node(35.0, [node(7.0, [node(6.0, [a, b], "*"), c], "+"), node(5.0, [a, b], "+")], "*")

    first, second = from_micrograd(seed004(False)), from_micrograd(seed004(True))
    assert fmt.dumps(first) == fmt.dumps(second)
    _, grads = replayed(first)
    leaves = [i for i in range(first.num_nodes) if first.op(i) == "leaf"]
    assert sorted(grads[leaves].tolist()) == [5.0, 17.0, 22.0]


@pytest.mark.parametrize("named", [False, True])
def test_parents_with_equal_data_are_ordered_by_gradient_and_name(named: bool) -> None:
    """a*b + b*c at a = b = c = 2: the two products, and a and b, are the same expression of the
    same numbers; their gradients (and names) still tell them apart, so set order must not."""

    def build(flip: bool) -> tuple[Node, dict[Node, str]]:
        def node(data: float, prev: list[Node], op: str, grad: float = 1.0) -> Node:
            return Node(data, prev[::-1] if flip else prev, op, grad)

        # same gradients when named: only the names can tell a and c apart
        a, b, c = Node(2.0, grad=2.0), Node(2.0, grad=4.0), Node(2.0, grad=2.0 if named else 3.0)
        names = {a: "a", b: "b", c: "c"} if named else {}
        return node(8.0, [node(4.0, [a, b], "*"), node(4.0, [b, c], "*")], "+"), names

    first, second = (from_micrograd(root, names=names) for root, names in (build(False), build(True)))
    assert fmt.dumps(first) == fmt.dumps(second)


def test_names_travel_into_the_graph() -> None:
    a = Node(3.0)
    square = Node(9.0, {a}, "*")
    graph = from_micrograd(square, names={a: "a", square: "square"})
    assert graph.names == {0: "a", 1: "square"}
    with pytest.raises(
        GraphStructureError, match=r"names: Value\(data=5.0, grad=0.0\) \(named 'x'\) is not in the graph"
    ):
        from_micrograd(square, names={Node(5.0): "x"})
    with pytest.raises(GraphStructureError, match="name 'a' is used by nodes 0 and 1"):
        from_micrograd(square, names={a: "a", square: "a"})


def test_a_deep_chain_imports_without_recursion() -> None:
    node = Node(1.0)
    for _ in range(200_000):
        node = Node(node.data, [node, Node(0.0)], "+")
    graph = from_micrograd(node)
    assert graph.num_nodes == 400_001
    assert graph.op_histogram() == {"leaf": 200_001, "add": 200_000}
    _, grads = replayed(graph)
    assert grads[graph.parents(graph.outputs[0])].tolist() == [1.0, 1.0]


def test_unknown_tags_and_objects_are_refused() -> None:
    with pytest.raises(GraphStructureError, match=r"has op 'sin', which graphsvc cannot import"):
        from_micrograd(Node(0.0, [Node(0.0)], "sin"))
    with pytest.raises(GraphStructureError, match=r"with op '\+' has 3 parents, expected 2"):
        from_micrograd(Node(3.0, [Node(1.0), Node(1.0), Node(1.0)], "+"))
    with pytest.raises(GraphStructureError, match=r"float 1.0 is not a micrograd Value \(it has no _prev\)"):
        from_micrograd(1.0)
    with pytest.raises(GraphStructureError, match=r"needs at least one micrograd Value"):
        from_micrograd()


def test_micrograd_mlp_replays_to_micrograd_gradients() -> None:
    pytest.importorskip("micrograd", reason="micrograd is optional for users; the test extra installs it")
    from micrograd.engine import Value as MicroValue
    from micrograd.nn import MLP

    random.seed(4)
    model = MLP(3, [8, 8, 1])
    inputs = [MicroValue(0.5), MicroValue(-1.5), 2.0]
    loss = (model(inputs) - 1.0) ** 2
    loss.backward()
    graph = from_micrograd(loss)
    values, grads = replayed(graph)
    np.testing.assert_allclose(values, graph.values, rtol=1e-13)
    assert graph.grads is not None
    np.testing.assert_allclose(grads, graph.grads, rtol=1e-12, atol=1e-15)


def test_micrograd_a_times_a() -> None:
    pytest.importorskip("micrograd", reason="micrograd is optional for users; the test extra installs it")
    from micrograd.engine import Value as MicroValue

    a = MicroValue(3.0)
    square = a * a
    square.backward()
    assert len(square._prev) == 1
    graph = from_micrograd(square)
    assert graph.parents(1) == [0, 0]
    _, grads = replayed(graph)
    assert grads[0] == a.grad == 6.0
