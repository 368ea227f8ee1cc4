"""Reverse topological orders (dfs and kahn), levels, depth, and the sort with cycle errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from graphsvc.errors import GraphStructureError, UsageError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.topo import depth, levels, reverse_topological_order, topological_sort


def _names(graph: Graph, order: np.ndarray) -> list[str]:
    return [graph.label(int(i)) for i in order]


def seed000() -> Graph:
    """Seed 000, node for node: z = Node('z', []), ..., y = Node('y', t3)."""
    b = GraphBuilder()
    z = b.leaf(name="z")
    t1 = b.add("f", [z], name="t1")
    t2 = b.add("f", [t1], name="t2")
    one = b.const(1.0, name="1")
    t3 = b.add("f", [one, t2], name="t3")
    b.add("f", [t3], name="y")
    return b.build()


@pytest.mark.parametrize("algorithm", ["dfs", "kahn"])
@pytest.mark.parametrize("output", [None, 5])
def test_seed000_order(algorithm: str, output: int | None) -> None:
    g = seed000()
    order = reverse_topological_order(g, output, algorithm)  # type: ignore[arg-type]
    assert _names(g, order) == ["y", "t3", "t2", "t1", "z", "1"]
    assert order.dtype == np.int64


def diverging() -> Graph:
    """c = h(a, b); e = f(b, c). DFS reaches b first (e's first parent), so b finishes first and
    comes last; kahn releases b only after c, its last child, and pops it before a."""
    b = GraphBuilder()
    a = b.leaf(name="a")
    bb = b.leaf(name="b")
    c = b.add("h", [a, bb], name="c")
    b.add("f", [bb, c], name="e")
    return b.build()


def test_dfs_visits_parents_in_stored_order_and_differs_from_kahn() -> None:
    g = diverging()
    assert _names(g, reverse_topological_order(g, algorithm="dfs")) == ["e", "c", "a", "b"]
    assert _names(g, reverse_topological_order(g, algorithm="kahn")) == ["e", "c", "b", "a"]


def test_dfs_order_follows_parent_order() -> None:
    b = GraphBuilder()
    p = b.leaf(name="p")
    q = b.leaf(name="q")
    b.add("f", [p, q], name="pq")
    b.add("f", [q, p], name="qp")
    g = b.build()
    assert _names(g, reverse_topological_order(g, 2, "dfs")) == ["pq", "q", "p"]
    assert _names(g, reverse_topological_order(g, 3, "dfs")) == ["qp", "p", "q"]


def several_sinks() -> Graph:
    """x, y -> s = x + y; p = x * s; q = -y. Sinks p and q."""
    b = GraphBuilder()
    x = b.leaf(name="x")
    y = b.leaf(name="y")
    s = b.add("add", [x, y], name="s")
    b.add("mul", [x, s], name="p")
    b.add("neg", [y], name="q")
    return b.build()


@pytest.mark.parametrize("algorithm", ["dfs", "kahn"])
def test_whole_graph_versus_one_output(algorithm: str) -> None:
    g = several_sinks()
    assert g.sinks().tolist() == [3, 4]

    def order(output: int | None) -> list[str]:
        return _names(g, reverse_topological_order(g, output, algorithm))  # type: ignore[arg-type]

    # The whole graph starts from every sink; the highest-id sink comes first.
    assert order(None) == ["q", "p", "s", "y", "x"]
    assert order(3) == ["p", "s", "y", "x"]
    assert order(4) == ["q", "y"]
    assert order(0) == ["x"]


def test_every_node_once_each_after_all_its_children() -> None:
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    for node in range(300):
        if node < 5:
            b.leaf()
        else:
            b.add("f", rng.integers(0, node, size=int(rng.integers(1, 4))).tolist())
    g = b.build()
    for algorithm in ("dfs", "kahn"):
        order = reverse_topological_order(g, algorithm=algorithm)  # type: ignore[arg-type]
        assert sorted(order.tolist()) == list(range(300))
        position = np.empty(300, dtype=np.int64)
        position[order] = np.arange(300)
        assert (position[g.child_ids()] < position[g.parent_indices]).all()


def test_unknown_algorithm() -> None:
    with pytest.raises(UsageError) as info:
        reverse_topological_order(seed000(), algorithm="bfs")  # type: ignore[arg-type]
    assert str(info.value) == "unknown algorithm 'bfs' (choose from dfs, kahn)"


def test_a_chain_a_million_deep_at_the_default_recursion_limit() -> None:
    n = 1_000_000
    assert sys.getrecursionlimit() <= 1000
    chain = Graph(
        op_table=["leaf", "neg"],
        op_codes=np.r_[0, np.ones(n - 1)].astype("<u2"),
        parent_offsets=np.r_[0, np.arange(n)].astype("<i8"),
        parent_indices=np.arange(n - 1, dtype="<i4"),
        values=np.zeros(n),
    )
    chain.check()
    expected = np.arange(n - 1, -1, -1)
    assert np.array_equal(reverse_topological_order(chain, algorithm="dfs"), expected)
    assert np.array_equal(reverse_topological_order(chain, n - 1, "kahn"), expected)
    assert depth(chain) == n - 1


def test_levels_and_depth() -> None:
    g = seed000()
    assert levels(g).tolist() == [0, 1, 2, 0, 3, 4]
    assert depth(g) == 4
    assert depth(several_sinks()) == 2
    assert depth(GraphBuilder().build()) == 0


def test_topological_sort_keeps_listed_order_for_ties() -> None:
    assert topological_sort({"c": ["a", "b"], "b": [], "a": []}) == ["b", "a", "c"]
    assert topological_sort({3: [], 1: [3], 2: [3, 1]}) == [3, 1, 2]


@pytest.mark.parametrize(
    ("parents_of", "message"),
    [
        ({"a": ["c"], "b": ["a"], "c": ["b"], "d": []}, "the graph has a cycle: a -> b -> c -> a"),
        ({0: [], 1: [0, 3], 2: [1], 3: [2], 4: [3]}, "the graph has a cycle: 1 -> 2 -> 3 -> 1"),
        ({5: [5]}, "the graph has a cycle: 5 -> 5"),
        ({"c": ["zz"]}, "node c has parent 'zz', which does not exist"),
    ],
)
def test_topological_sort_errors(parents_of: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(GraphStructureError) as info:
        topological_sort(parents_of)
    assert str(info.value) == message


def test_cycle_error_uses_descriptions() -> None:
    with pytest.raises(GraphStructureError) as info:
        topological_sort({0: [], 1: [0, 3], 2: [1], 3: [2]}, {1: "1 (p)", 2: "2 (q)"})
    assert str(info.value) == "the graph has a cycle: 1 (p) -> 2 (q) -> 3 -> 1 (p)"
