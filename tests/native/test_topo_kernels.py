"""The orderings and the structure check in C (csrc/topo.c, through graphsvc.native.topo_kernels) compute
exactly what the pure-Python references compute: orders element for element, the structure check's
verdict as graph.py's numpy check gives it, and broken columns refused without reading out of bounds.

(tests/native/test_kernels.py compares the kernels with the references through topo.py's API; this
module calls the C kernels directly, on the edge cases too.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import graphsvc.native as kernels
from graphsvc import topo
from graphsvc.errors import GraphStructureError
from graphsvc.graph import LEAF_TAGS, Graph
from graphsvc.topo import reverse_topological_order
from tests.conftest import require_compiled, require_native

NAMES = (
    "align_walk",
    "ancestors",
    "child_count_order",
    "dfs_postorder",
    "first_arity_mismatch",
    "inline_parents",
    "levels",
    "structure_ok",
)


@pytest.fixture(scope="module")
def c() -> Any:
    """graphsvc.native.topo_kernels, over graphsvc.native._ctopo (see require_native)."""
    require_native("topo")
    from graphsvc.native import topo_kernels as _topo_kernels

    return _topo_kernels


def test_the_c_kernels_are_the_ones_in_use(c: Any) -> None:
    assert sorted(c.__all__) == list(NAMES)
    compiled = kernels._compiled()
    assert compiled is not None
    assert compiled.dfs_postorder.__module__ == "graphsvc.native.topo_kernels"
    for name in NAMES:
        assert getattr(compiled, name) is getattr(c, name), name


# -- graphs -----------------------------------------------------------------------------------------
def columns(counts: npt.NDArray[np.int64], parents: npt.NDArray[np.int32]) -> Graph:
    n = len(counts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    codes = (counts > 0).astype(np.uint16)
    return Graph(["leaf", "op"], codes, offsets, parents.astype(np.int32), np.zeros(n), outputs=[max(n - 1, 0)])


def random_graph(n: int, seed: int) -> Graph:
    """0 to 5 parents per node, each a random earlier node, near (within 8) or anywhere; one slot in
    six repeats the slot before it (x * x, or a parent listed three times)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, size=n)
    counts[: min(n, 3)] = 0
    owner = np.repeat(np.arange(n), counts)
    near = np.maximum(owner - rng.integers(1, 9, size=len(owner)), 0)
    anywhere = (rng.random(len(owner)) * owner).astype(np.int64)
    parents = np.where(rng.random(len(owner)) < 0.5, near, anywhere)
    first_slot = np.concatenate(([True], owner[1:] != owner[:-1])) if len(owner) else np.zeros(0, dtype=bool)
    repeat = (rng.random(len(owner)) < 1 / 6) & ~first_slot
    for slot in np.flatnonzero(repeat):  # in order, so a run of repeats copies one parent
        parents[slot] = parents[slot - 1]
    return columns(counts, parents.astype(np.int32))


def chain(n: int) -> Graph:
    """Node k's only parent is k - 1: a graph as deep as it is long."""
    counts = np.ones(n, dtype=np.int64)
    counts[0] = 0
    return columns(counts, np.arange(n - 1, dtype=np.int32))


def lists(graph: Graph) -> tuple[list[int], list[int]]:
    return graph.parent_offsets.tolist(), graph.parent_indices.tolist()


def scratch(n: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Scratch as topo.py passes it, filled with rubbish the kernels must not rely on."""
    return np.full(2 * n, 77, dtype=np.int32), np.ones(n, dtype=np.bool_), np.full(n, 5, dtype=np.int64)


def dfs(c: Any, graph: Graph, starts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    pairs, visited, _ = scratch(graph.num_nodes)
    return c.dfs_postorder(starts, graph.parent_offsets, graph.parent_indices, pairs, visited)


def kahn(c: Any, graph: Graph, starts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    pairs, reached, counts = scratch(graph.num_nodes)
    return c.child_count_order(starts, graph.parent_offsets, graph.parent_indices, pairs, counts, reached)


def reference(function: Any, *args: Any) -> Any:
    """topo.py's pure-Python answer (the reference engine, whatever the graph's size)."""
    return function(*args, engine=kernels.REFERENCE)


def start_sets(graph: Graph, rng: np.random.Generator) -> list[npt.NDArray[np.int64]]:
    n = graph.num_nodes
    many = rng.integers(0, n, size=300)
    with_repeats = np.concatenate([many, many[::7], [n - 1, n - 1, 0]])
    rng.shuffle(with_repeats)
    return [graph.sinks(), np.array([n - 1]), np.array([n // 2]), np.unique(many), with_repeats.astype(np.int64)]


# -- orders -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_orders_match_the_references_on_random_graphs(c: Any, seed: int) -> None:
    graph = random_graph(20_000, seed)
    assert (graph.parent_counts() > 2).sum() > 5000  # many nodes take the CSR path, not the pairs
    slots = graph.parent_indices
    owners = graph.child_ids()
    assert np.any((slots[1:] == slots[:-1]) & (owners[1:] == owners[:-1]))  # repeated parents
    offsets, parents = lists(graph)
    rng = np.random.default_rng(seed)
    for starts in start_sets(graph, rng):
        expected = topo._dfs_postorder(starts.tolist(), offsets, parents, graph.num_nodes)
        got = dfs(c, graph, starts)
        assert got.dtype == np.int64
        assert got.tolist() == expected
        expected = topo._child_count_order(starts.tolist(), offsets, parents, graph.num_nodes)
        got = kahn(c, graph, starts)
        assert got.dtype == np.int64
        assert got.tolist() == expected
    assert len(expected) > 1000  # the last start set reaches a large part of the graph


def test_a_repeated_start_counts_once_in_the_child_count_order(c: Any) -> None:
    # 0, 1 leaves; 2 = f(0, 1); 3 = g(2, 2)
    graph = columns(np.array([0, 0, 2, 2]), np.array([0, 1, 2, 2], dtype=np.int32))
    assert kahn(c, graph, [3, 1, 3]).tolist() == [3, 2, 1, 0]
    assert topo._child_count_order([3, 1, 3], *lists(graph), 4) == [3, 2, 1, 0]
    assert kahn(c, graph, [1, 3, 1, 3]).tolist() == [3, 2, 1, 0]
    assert dfs(c, graph, [1, 3, 1, 3]).tolist() == [1, 0, 2, 3]


def test_start_nodes_of_any_integer_dtype(c: Any) -> None:
    graph = random_graph(500, 9)
    for dtype in (np.int32, np.uint16, np.int64):
        starts = graph.sinks().astype(dtype)
        assert dfs(c, graph, starts).tolist() == topo._dfs_postorder(starts.tolist(), *lists(graph), 500)
        assert kahn(c, graph, starts).tolist() == topo._child_count_order(starts.tolist(), *lists(graph), 500)


def test_the_empty_graph_and_a_single_node(c: Any) -> None:
    empty = columns(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32))
    for kernel in (dfs, kahn):
        got = kernel(c, empty, np.zeros(0, dtype=np.int64))
        assert got.dtype == np.int64 and got.tolist() == []
    assert c.levels(empty.parent_offsets, empty.parent_indices, 0).tolist() == []
    assert c.structure_ok(empty.parent_offsets, empty.parent_indices, empty.op_codes, 2, np.array([True, False]))
    assert c.first_arity_mismatch(empty.op_codes, empty.parent_offsets, np.array([-1, 2])) == -1
    single = columns(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32))
    assert dfs(c, single, [0]).tolist() == [0]
    assert dfs(c, single, [0, 0]).tolist() == [0]
    assert kahn(c, single, [0]).tolist() == [0]
    assert c.levels(single.parent_offsets, single.parent_indices, 1).tolist() == [0]
    assert c.ancestors(single.parent_offsets, single.parent_indices, 0, 1).tolist() == [True]
    assert c.first_arity_mismatch(single.op_codes, single.parent_offsets, np.array([0, 1])) == -1
    assert c.first_arity_mismatch(single.op_codes, single.parent_offsets, np.array([1, 1])) == 0


def test_a_chain_a_million_nodes_deep(c: Any) -> None:
    n = 1_000_000
    graph = chain(n)
    ids = np.arange(n)
    assert np.array_equal(dfs(c, graph, [n - 1]), ids)  # post-order: the deepest parent first
    assert np.array_equal(kahn(c, graph, [n - 1]), ids[::-1])
    assert np.array_equal(dfs(c, graph, [n // 2, n - 1]), ids)
    assert np.array_equal(c.levels(graph.parent_offsets, graph.parent_indices, n), ids)
    mask = c.ancestors(graph.parent_offsets, graph.parent_indices, n // 3, n)
    assert mask.dtype == np.bool_ and np.array_equal(mask, ids <= n // 3)
    assert c.structure_ok(graph.parent_offsets, graph.parent_indices, graph.op_codes, 2, np.array([True, False]))


def test_inline_parents_puts_the_first_two_parents_side_by_side(c: Any) -> None:
    # counts 0, 1, 2, 2 (repeat), 3, 5
    graph = columns(np.array([0, 1, 2, 2, 3, 5]), np.array([0, 1, 0, 2, 2, 3, 1, 2, 0, 1, 2, 3, 4], dtype=np.int32))
    pairs = np.full(12, 99, dtype=np.int32)
    c.inline_parents(graph.parent_offsets, graph.parent_indices, pairs)
    assert pairs.tolist() == [-1, -1, 0, -1, 1, 0, 2, 2, -2, -1, -2, -1]


# -- levels, ancestors ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_levels_and_ancestors_match_the_references(c: Any, seed: int) -> None:
    graph = random_graph(20_000, seed)
    n = graph.num_nodes
    got = c.levels(graph.parent_offsets, graph.parent_indices, n)
    expected = reference(topo.levels, graph)
    assert got.dtype == np.int64 and np.array_equal(got, expected)
    assert int(got.max()) > 100
    for output in (n - 1, n // 2, 2, 0):
        got = c.ancestors(graph.parent_offsets, graph.parent_indices, output, n)
        expected = reference(topo.ancestors, graph, output)
        assert got.dtype == np.bool_ and np.array_equal(got, expected)


# -- the structure check ----------------------------------------------------------------------------
def numpy_verdict(graph: Graph) -> str:
    """graph.py's vectorized column check: "ok" or its message."""
    leaf_codes = [i for i, tag in enumerate(graph.op_table) if tag in LEAF_TAGS]
    try:
        graph._check_columns(graph.num_nodes, graph.num_edges, leaf_codes)
    except GraphStructureError as exc:
        return str(exc)
    return "ok"


def c_verdict(c: Any, graph: Graph) -> bool:
    leaf = np.array([tag in LEAF_TAGS for tag in graph.op_table] or [False])
    return bool(c.structure_ok(graph.parent_offsets, graph.parent_indices, graph.op_codes, len(graph.op_table), leaf))


def small_graph() -> Graph:
    """leaves 0-3, then nodes of 1 to 4 parents (repeats too): 12 nodes, 24 edges."""
    counts = np.array([0, 0, 0, 0, 2, 1, 3, 2, 4, 2, 1, 4])
    parents = [0, 1, 4, 2, 5, 5, 3, 6, 0, 1, 7, 2, 8, 8, 9, 1, 2, 10, 10]
    return columns(counts, np.array(parents, dtype=np.int32))


BROKEN = {
    "a parent id equal to its child's": lambda g: g.parent_indices.__setitem__(g.parent_offsets[5], 5),
    "a parent id above its child's": lambda g: g.parent_indices.__setitem__(g.parent_offsets[6] + 1, 9),
    "a parent id beyond the graph": lambda g: g.parent_indices.__setitem__(-1, 12),
    "a negative parent id": lambda g: g.parent_indices.__setitem__(3, -1),
    "the most negative parent id": lambda g: g.parent_indices.__setitem__(3, np.iinfo(np.int32).min),
    "an op code beyond the table": lambda g: g.op_codes.__setitem__(7, 2),
    "the largest op code": lambda g: g.op_codes.__setitem__(0, 65535),
    "a leaf with parents": lambda g: g.op_codes.__setitem__(9, 0),
    "offsets not starting at 0": lambda g: g.parent_offsets.__setitem__(0, 1),
    "negative first offset": lambda g: g.parent_offsets.__setitem__(0, -2),
    "a negative offset": lambda g: g.parent_offsets.__setitem__(3, -1),
    "the most negative offset": lambda g: g.parent_offsets.__setitem__(6, np.iinfo(np.int64).min),
    "a decreasing offset": lambda g: g.parent_offsets.__setitem__(7, g.parent_offsets[6] - 1),
    "an offset past the edges": lambda g: g.parent_offsets.__setitem__(8, 1000),
    "the largest offset": lambda g: g.parent_offsets.__setitem__(8, np.iinfo(np.int64).max),
    "offsets ending short of the edges": lambda g: g.parent_offsets.__setitem__(-1, g.num_edges - 1),
}


@pytest.mark.parametrize("broken", BROKEN, ids=list(BROKEN))
def test_the_structure_check_refuses_what_numpy_refuses(c: Any, broken: str) -> None:
    graph = small_graph()
    assert numpy_verdict(graph) == "ok" and c_verdict(c, graph)
    BROKEN[broken](graph)
    assert numpy_verdict(graph) != "ok"
    assert not c_verdict(c, graph)


def test_the_structure_check_agrees_with_numpy_on_random_damage(c: Any) -> None:
    rng = np.random.default_rng(11)
    verdicts: dict[str, int] = {}
    for trial in range(3000):
        graph = random_graph(60, trial)
        for _ in range(int(rng.integers(0, 3))):  # (an extreme offset plus a little wraps: fine)
            kind = int(rng.integers(0, 4))
            if kind == 0 and graph.num_edges:
                graph.parent_indices[rng.integers(0, graph.num_edges)] = rng.integers(-3, 70)
            elif kind == 1:
                with np.errstate(over="ignore"):
                    graph.parent_offsets[rng.integers(0, 61)] += int(rng.integers(-3, 4))
            elif kind == 2:
                graph.op_codes[rng.integers(0, 60)] = rng.integers(0, 4)
            else:
                graph.parent_offsets[rng.integers(0, 61)] = rng.choice([np.iinfo(np.int64).min, np.iinfo(np.int64).max])
        verdict = numpy_verdict(graph)
        assert c_verdict(c, graph) == (verdict == "ok"), (trial, verdict)
        key = verdict if verdict == "ok" else " ".join(verdict.split(" ")[2:4])
        verdicts[key] = verdicts.get(key, 0) + 1
    assert verdicts["ok"] > 500 and len(verdicts) >= 6, verdicts


def test_the_structure_check_refuses_offsets_of_the_wrong_length(c: Any) -> None:
    graph = small_graph()
    leaf = np.array([True, False])
    assert not c.structure_ok(graph.parent_offsets[:-1], graph.parent_indices, graph.op_codes, 2, leaf)
    assert not c.structure_ok(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), graph.op_codes[:0], 2, leaf)
    with pytest.raises(ValueError, match=r"^is_leaf_code: 2 entries, expected 3$"):
        c.structure_ok(graph.parent_offsets, graph.parent_indices, graph.op_codes, 3, leaf)
    with pytest.raises(ValueError, match=r"^is_leaf_code: 1 entry, expected 3$"):
        c.structure_ok(graph.parent_offsets, graph.parent_indices, graph.op_codes, 3, leaf[:1])


def test_graph_check_runs_the_c_kernel_and_names_the_broken_rule(c: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph.check's fast path (compiled kernels running) is the C check; on a refusal the numpy
    check names the rule."""
    compiled = kernels._compiled()
    verdicts: list[bool] = []
    monkeypatch.setattr(compiled, "structure_ok", lambda *args: verdicts.append(c.structure_ok(*args)) or verdicts[-1])
    engine = kernels.Engine(compiled)  # a small graph: the engine passed decides, not the size
    graph = small_graph()
    graph.check(engine)
    graph.parent_indices[graph.parent_offsets[5]] = 5
    with pytest.raises(GraphStructureError, match=r"^node 5 lists itself as a parent \(a self-loop\)$"):
        graph.check(engine)
    assert verdicts == [True, False]


# -- the arity check --------------------------------------------------------------------------------
def vectorized_arity_check(codes: npt.NDArray[np.uint16], counts: npt.NDArray[np.int64], arity: Any) -> int:
    """replay.resolve_ops's numpy path."""
    expected = arity[codes]
    wrong = np.flatnonzero((expected >= 0) & (expected != counts))
    return int(wrong[0]) if len(wrong) else -1


@pytest.mark.parametrize("seed", range(3))
def test_first_arity_mismatch_matches_the_vectorized_check(c: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    graph = random_graph(5000, seed)
    counts = graph.parent_counts()
    codes = np.minimum(counts, 4).astype(np.uint16)  # op k takes k parents; op 4 takes 4 or 5
    arity = np.array([-1, 1, 2, 3, 4], dtype=np.int64)
    first_five = int(np.flatnonzero(counts == 5)[0])
    assert c.first_arity_mismatch(codes, graph.parent_offsets, arity) == first_five
    assert vectorized_arity_check(codes, counts, arity) == first_five
    arity[4] = -1  # not checked: every node agrees
    got = c.first_arity_mismatch(codes, graph.parent_offsets, arity)
    assert type(got) is int and got == -1
    for node in rng.choice(np.flatnonzero(counts > 0), size=20):
        wrong = codes.copy()
        wrong[node] = 1 if counts[node] != 1 else 2
        wrong[rng.choice(np.flatnonzero(counts > 0), size=3)] = 4  # unchecked anywhere
        expected = vectorized_arity_check(wrong, counts, arity)
        assert expected == node
        assert c.first_arity_mismatch(wrong, graph.parent_offsets, arity) == expected


def test_first_arity_mismatch_refuses_an_op_code_beyond_the_table(c: Any) -> None:
    codes = np.array([0, 1, 3], dtype=np.uint16)
    offsets = np.array([0, 0, 1, 2], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^node 2 has an op code beyond the table$"):
        c.first_arity_mismatch(codes, offsets, np.array([0, 1], dtype=np.int64))
    assert c.first_arity_mismatch(codes, offsets, np.array([0, 1, 0, 2], dtype=np.int64)) == 2


# -- broken columns: an error, never a read outside the arrays -------------------------------------
def test_broken_columns_raise_instead_of_reading_out_of_bounds(c: Any) -> None:
    graph = random_graph(200, 1)
    n, offsets, parents = graph.num_nodes, graph.parent_offsets, graph.parent_indices
    many = int(np.flatnonzero(graph.parent_counts() > 2)[5])
    pairs, visited, counts = scratch(n)
    for kernel in ("dfs_postorder", "child_count_order"):
        extra = (counts, visited) if kernel == "child_count_order" else (visited,)
        run = getattr(c, kernel)
        with pytest.raises(ValueError, match=r"^start node 200 out of range$"):
            run([0, 200], offsets, parents, pairs, *extra)
        with pytest.raises(ValueError, match=r"^start node -1 out of range$"):
            run([-1], offsets, parents, pairs, *extra)
        bad = parents.copy()
        bad[offsets[many] + 2] = n  # the third parent: read from the CSR columns, not pairs
        with pytest.raises(ValueError, match=rf"^node {many} has a parent id out of range \(not below its own\)$"):
            run([n - 1, many], offsets, bad, pairs, *extra)
        bad = parents.copy()
        bad[offsets[many] + 2] = -1  # not taken for "no more parents"
        with pytest.raises(ValueError, match=rf"^node {many} has a parent id out of range \(not below its own\)$"):
            run([many], offsets, bad, pairs, *extra)
        shifted = offsets.copy()
        shifted[-1] = len(parents) + 1
        with pytest.raises(ValueError, match=rf"^offsets out of order or out of range at node {n - 1}$"):
            run([n - 1], shifted, parents, pairs, *extra)
        with pytest.raises(ValueError, match=r"^pairs: 398 entries, expected 400$"):
            run([0], offsets, parents, pairs[:-2], *extra)
        with pytest.raises(TypeError, match=r"^pairs: items of 8 bytes, not 4$"):
            run([0], offsets, parents, pairs.astype(np.int64), *extra)
    with pytest.raises(ValueError, match=r"^start node 200 out of range$"):
        c.ancestors(offsets, parents, 200, n)
    owner = int(graph.child_ids()[-1])  # the node that owns the last parent slot
    bad = parents.copy()
    bad[-1] = owner  # lists itself
    with pytest.raises(ValueError, match=rf"^node {owner} has a parent id out of range \(not below its own\)$"):
        c.levels(offsets, bad, n)
    bad[-1] = n
    with pytest.raises(ValueError, match=rf"^node {owner} has a parent id out of range \(not below its own\)$"):
        c.ancestors(offsets, bad, owner, n)
    with pytest.raises(ValueError, match=r"^offsets: 200 entries, expected 201$"):
        c.levels(offsets[:-1], parents, n)


@pytest.mark.parametrize("algorithm", ["dfs", "kahn"])
def test_unchecked_columns_with_a_cycle_are_a_value_error_not_a_heap_overflow(algorithm: str) -> None:
    """Both orderings refuse a parent id that is not below its child's (Graph.check has not run on
    these columns); the child-count order used to push the cycle's nodes past its stack."""
    n = 1000
    rows = {0: [1], 1: [0], n - 1: [0]}  # node 0 <-> node 1, ids not increasing
    offsets = np.zeros(n + 1, dtype=np.int64)
    parents: list[int] = []
    for i in range(n):
        parents += rows.get(i, [])
        offsets[i + 1] = len(parents)
    graph = Graph(
        op_table=["leaf", "neg"],
        op_codes=np.array([1 if i in rows else 0 for i in range(n)], dtype=np.uint16),
        parent_offsets=offsets,
        parent_indices=np.array(parents, dtype=np.int32),
        values=np.zeros(n),
    )
    require_compiled()
    with pytest.raises(ValueError, match=r"^node 0 has a parent id out of range \(not below its own\)$"):
        reverse_topological_order(graph, n - 1, algorithm)
