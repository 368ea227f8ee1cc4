"""The compiled kernels compute exactly what the numpy ops and the Python sweeps compute."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import graphsvc.native as kernels
from graphsvc.ops import Op, evaluate, local_derivatives, opmath
from tests.conftest import primitive_ops, require_compiled, same_bits

SPECIAL = [-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0, 2.5, -3.0, 5e-324, -5e-324, 1e308, -1e-300, 7.0]


@pytest.fixture(scope="module")
def jit():  # type: ignore[no-untyped-def]
    return require_compiled()


def test_every_primitive_is_used_by_the_builtin_op_of_its_name() -> None:
    assert sorted((op.name, op.kernel) for op in primitive_ops()) == sorted((p, p) for p in opmath.PRIMITIVES)


@pytest.mark.parametrize("op", primitive_ops(), ids=lambda op: op.name)
def test_compiled_primitive_matches_the_numpy_op_bit_for_bit(op: Op, jit) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    pairs = list(itertools.product(SPECIAL, repeat=op.arity)) + [
        tuple(rng.standard_normal(op.arity) * 10.0 ** rng.integers(-5, 5)) for _ in range(2000)
    ]
    inputs = [np.array([p[k] for p in pairs], dtype=np.float64) for k in range(op.arity)]
    m = len(pairs)
    attrs = {"exponent": 3.0} if op.kernel == "pow" else {}  # pow's exponent travels as a parameter
    expected = np.asarray(evaluate(op, inputs, attrs))
    expected_local = local_derivatives(op, inputs, expected, attrs)
    # one graph: the inputs as leaves, then one node of the op per pair
    kinds = np.zeros(m * op.arity + m, dtype=np.int8)
    nodes = np.arange(m * op.arity, m * op.arity + m, dtype=np.int64)
    kinds[nodes] = opmath.PRIMITIVES.index(op.kernel) + 1  # type: ignore[arg-type]
    offsets = np.zeros(len(kinds) + 1, dtype=np.int64)
    offsets[nodes + 1] = op.arity
    offsets = np.cumsum(offsets)
    parents = np.array([k * m + i for i in range(m) for k in range(op.arity)], dtype=np.int32)
    values = np.concatenate([*inputs, np.zeros(m)])
    params = np.full(len(kinds), attrs.get("exponent", 0.0))
    leaves = values.copy()
    assert jit.forward_primitives(nodes, kinds, offsets, parents, values, 0, params) == m
    assert same_bits(values[nodes], expected)
    # the whole-graph sweep over op codes: code 0 the leaves, code 1 the op
    codes = (kinds != 0).astype(np.uint16)
    table = np.array([0, kinds[nodes[0]]], dtype=np.int8)
    jit.forward_all_primitives(codes, table, offsets, parents, leaves, params)
    assert same_bits(leaves, values)
    local = np.zeros(len(parents))
    jit.primitive_derivatives(nodes, kinds, offsets, parents, values, local, params)
    for k in range(op.arity):
        assert same_bits(local[k :: op.arity], np.broadcast_to(expected_local[k], (m,)).astype(np.float64))


def test_forward_stops_at_the_first_node_that_is_not_a_primitive(jit) -> None:  # type: ignore[no-untyped-def]
    kinds = np.array([0, 5, 0, 5], dtype=np.int8)  # leaf, neg, (something else), neg
    offsets = np.array([0, 0, 1, 2, 3], dtype=np.int64)
    parents = np.array([0, 1, 2], dtype=np.int32)
    values = np.array([2.0, 0.0, 9.0, 0.0])
    nodes = np.array([1, 2, 3], dtype=np.int64)
    assert jit.forward_primitives(nodes, kinds, offsets, parents, values, 0) == 1
    assert values.tolist() == [2.0, -2.0, 9.0, 0.0]
    assert jit.forward_primitives(nodes, kinds, offsets, parents, values, 2) == 3
    assert values.tolist() == [2.0, -2.0, 9.0, -9.0]


def test_an_op_may_name_only_a_primitive_of_its_arity() -> None:
    from graphsvc.errors import OpError
    from graphsvc.ops import check_op_declaration

    with pytest.raises(OpError, match=r"^op 'twice': kernel 'mul' is not a primitive of arity 1 \("):
        check_op_declaration(Op("twice", 1, lambda x: 2 * x, lambda x, out: (2.0,), kernel="mul"))


def check_outcome(graph, engine: kernels.Engine) -> str:  # type: ignore[no-untyped-def]
    from graphsvc.errors import GraphStructureError

    try:
        graph.check(engine)
    except GraphStructureError as exc:
        return str(exc)
    return "ok"


def test_compiled_structure_check_accepts_and_refuses_what_the_vectorized_one_does(jit) -> None:  # type: ignore[no-untyped-def]
    from graphsvc.graph import GraphBuilder

    g = GraphBuilder()
    for i in range(6):
        g.leaf(float(i))
    for i in range(6, 40):
        g.add("mul", [i - 1, i - 6])
    valid = g.build()
    rng = np.random.default_rng(3)
    outcomes = set()
    for trial in range(400):
        graph = valid.copy()
        kind = trial % 6
        if kind == 0:
            graph.parent_indices[rng.integers(0, graph.num_edges)] = rng.integers(-3, 60)
        elif kind == 1:
            graph.parent_offsets[rng.integers(1, graph.num_nodes)] = rng.integers(-2, graph.num_edges + 5)
        elif kind == 2:
            graph.op_codes[rng.integers(0, graph.num_nodes)] = rng.integers(0, 4)
        elif kind == 3:
            graph.parent_offsets[-1] += int(rng.integers(-2, 3))
        elif kind == 4:
            node = int(rng.integers(6, graph.num_nodes))
            graph.parent_indices[graph.parent_offsets[node]] = node  # a self-loop
        # kind 5: unchanged
        compiled = check_outcome(graph, kernels.Engine(jit))
        reference = check_outcome(graph, kernels.REFERENCE)
        assert compiled == reference
        outcomes.add(reference if reference == "ok" else " ".join(reference.split(" ")[2:5]))
    assert len(outcomes) >= 5, outcomes  # accepted graphs and several kinds of refusal were all tried


def random_columns(n: int, seed: int):  # type: ignore[no-untyped-def]
    """A random DAG with 0 to 5 parents per node (repeats allowed, as in x * x), near and far."""
    from graphsvc.graph import Graph

    rng = np.random.default_rng(seed)
    counts = rng.choice([0, 1, 2, 2, 2, 3, 5], size=n)
    counts[: min(n, 5)] = 0
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    parents = np.empty(int(offsets[-1]), dtype=np.int32)
    for node in range(n):
        for slot in range(offsets[node], offsets[node + 1]):
            near = rng.random() < 0.5
            parents[slot] = rng.integers(max(0, node - 8), node) if near else rng.integers(0, node)
    codes = (counts > 0).astype(np.uint16)
    return Graph(["leaf", "add"], codes, offsets, parents, rng.standard_normal(n), outputs=[n - 1])


@pytest.mark.parametrize("seed", range(4))
def test_compiled_orders_levels_and_ancestors_match_the_references(jit, seed: int) -> None:  # type: ignore[no-untyped-def]
    from graphsvc.topo import ALGORITHMS, ancestors, levels, reverse_topological_order

    graph = random_columns(3000, seed)
    middle = int(np.flatnonzero(graph.parent_counts()[:1500] > 2)[-1])
    outputs = [None, graph.num_nodes - 1, middle, 7]

    def run(engine: kernels.Engine) -> list[np.ndarray]:
        results = [levels(graph, engine), *(ancestors(graph, o, engine) for o in outputs[1:])]
        for algorithm in ALGORITHMS:
            results += [reverse_topological_order(graph, o, algorithm, engine) for o in outputs]
        return results

    compiled = run(kernels.Engine(jit))
    reference = run(kernels.REFERENCE)
    assert len(compiled) == len(reference) == 1 + 3 + 2 * 4
    for ours, theirs in zip(compiled, reference, strict=True):
        assert ours.dtype == theirs.dtype
        assert np.array_equal(ours, theirs)
    assert 1 < len(reference[-2]) < len(reference[-4])  # a partial order was compared too


def test_the_structure_check_every_load_runs_is_compiled_from_the_threshold(
    jit, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The C kernels cost nothing to start, so the structure check is compiled for every graph of
    NATIVE_THRESHOLD nodes or more (numba's start-up once kept it in numpy below 5,000,000 nodes)."""
    calls: list[int] = []
    real = jit.structure_ok
    monkeypatch.setattr(jit, "structure_ok", lambda *args: calls.append(1) or real(*args))
    random_columns(kernels.NATIVE_THRESHOLD - 1, 0).check()
    assert calls == []
    random_columns(kernels.NATIVE_THRESHOLD, 0).check()
    assert calls == [1]


def test_the_engine_is_chosen_from_the_graphs_size(jit) -> None:  # type: ignore[no-untyped-def]
    assert kernels.NATIVE_THRESHOLD == 1_000
    assert kernels.engine_for(999) is kernels.REFERENCE
    assert kernels.engine_for(0) is kernels.REFERENCE
    compiled = kernels.engine_for(1_000)
    assert compiled.kernels is jit and compiled.narrow_level == kernels.NARROW_LEVEL == 32
    assert (compiled.name, repr(compiled)) == ("compiled", "Engine(compiled, narrow_level=32)")
    assert (kernels.REFERENCE.name, repr(kernels.REFERENCE)) == ("reference", "Engine(reference, narrow_level=32)")
