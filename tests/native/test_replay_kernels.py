"""The replay sweeps in C (csrc/replay.c through graphsvc.native.replay_kernels) against numpy's ops and
the pure-Python sweeps, bit for bit: special values, the fused backward from any node, a deep chain.

tests/native/test_kernels.py and tests/replay/test_replay.py compare the same kernels on random numbers and graphs.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import pytest

import graphsvc.native as kernels
from graphsvc.errors import OpError
from graphsvc.graph import LEAF_TAGS, Graph, GraphBuilder
from graphsvc.native import REFERENCE, Engine
from graphsvc.ops import Op, OpRegistry, evaluate, local_derivatives, opmath
from graphsvc.replay import columns as replay
from graphsvc.topo import ancestors
from tests.conftest import primitive_ops, require_compiled, require_native, same_bits

NAMES = (
    "backward_sweep",
    "elementwise",
    "elementwise_partials",
    "forward_all_primitives",
    "forward_primitives",
    "primitive_derivatives",
    "backward_primitives",
)

SUBNORMAL = 2.0**-1060
SPECIAL = [
    *(-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf),
    *(5e-324, -5e-324, SUBNORMAL, -3 * SUBNORMAL, 2.2250738585072014e-308, -2.2250738585072014e-308),
    *(1.7976931348623157e308, -1e308, 1e300, 1e-300, -1e-300),
    *(1.0, -1.0, 0.5, 2.5, -3.0, 7.0),
]


@pytest.fixture(scope="module")
def native() -> Any:
    """The compiled kernels, with every replay sweep from C."""
    compiled = require_compiled()
    for name in NAMES:
        assert getattr(compiled, name).__module__ == "graphsvc.native.replay_kernels", name
    return compiled


def test_the_replay_sweeps_in_use_are_the_c_ones(native: Any) -> None:
    from graphsvc.native import replay_kernels as _replay_kernels

    assert sorted(_replay_kernels.__all__) == sorted(NAMES)
    assert native.backward_sweep.__module__ == "graphsvc.native.replay_kernels"
    assert native.backward_sweep is _replay_kernels.backward_sweep


def one_node_per_pair(arity: int, pairs: list[tuple[float, ...]]) -> tuple[np.ndarray, ...]:
    """Columns of a graph: the inputs as leaves (input k of pair i is node k * m + i), then one
    node per pair. Returns (offsets, parents, values with the leaves set, the op nodes)."""
    m = len(pairs)
    n = m * arity + m
    nodes = np.arange(m * arity, n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    counts[nodes] = arity
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    parents = np.array([k * m + i for i in range(m) for k in range(arity)], dtype=np.int32)
    values = np.concatenate([np.array([p[k] for p in pairs], dtype=np.float64) for k in range(arity)] + [np.zeros(m)])
    return offsets, parents, values, nodes


#: Exponents pow is checked with: integers (odd, even, negative), halves, zero, non-integers.
EXPONENTS = [2.0, 3.0, -1.0, -2.0, 0.5, -0.5, 0.0, 1.0, 2.5, 1e-3]


def primitive_cases() -> list[tuple[Op, dict[str, float]]]:
    """Each primitive op with the attributes it is checked under (pow: each of EXPONENTS)."""
    cases: list[tuple[Op, dict[str, float]]] = []
    for op in primitive_ops():
        assert op.kernel is not None
        names = opmath.PRIMITIVE_ATTRS[op.kernel]
        cases += [(op, {names[0]: k}) for k in EXPONENTS] if names else [(op, {})]
    return cases


@pytest.mark.parametrize(
    ("op", "attrs"), primitive_cases(), ids=lambda case: case.name if isinstance(case, Op) else repr(case)
)
def test_every_primitive_on_special_values_matches_numpy_on_every_path(
    op: Op, attrs: dict[str, float], native: Any
) -> None:
    """Forward (both sweeps), the derivatives, and the fused backward (0 + 1 * each partial, as
    the reference sweep adds it) against the op's numpy functions, on every pair of special values."""
    pairs = list(itertools.product(SPECIAL, repeat=op.arity))
    offsets, parents, values, nodes = one_node_per_pair(op.arity, pairs)
    m, n = len(pairs), len(values)
    inputs = [values[k * m : (k + 1) * m] for k in range(op.arity)]
    with np.errstate(all="ignore"):
        expected = np.asarray(evaluate(op, inputs, attrs))
        expected_local = [
            np.broadcast_to(d, (m,)).astype(np.float64) for d in local_derivatives(op, inputs, expected, attrs)
        ]
    assert op.kernel is not None
    code = opmath.PRIMITIVES.index(op.kernel) + 1
    kinds = np.zeros(n, dtype=np.int8)
    kinds[nodes] = code
    codes = (kinds != 0).astype(np.uint16)
    table = np.array([0, code], dtype=np.int8)
    params = np.full(n, attrs.get("exponent", np.nan))  # a primitive without a parameter does not read it

    by_nodes = values.copy()
    assert native.forward_primitives(nodes, kinds, offsets, parents, by_nodes, 0, params) == m
    assert same_bits(by_nodes[nodes], expected)
    by_codes = values.copy()
    assert native.forward_all_primitives(codes, table, offsets, parents, by_codes, params) is None
    assert same_bits(by_codes, by_nodes)
    assert same_bits(by_codes[: m * op.arity], values[: m * op.arity])  # the leaves are left alone

    local = np.full(len(parents), 99.0)
    native.primitive_derivatives(nodes, kinds, offsets, parents, by_codes, local, params)
    for k in range(op.arity):
        assert same_bits(local[k :: op.arity], expected_local[k])

    # the fused backward from each op node: its inputs get 0.0 + 1.0 * partial, every other node 0
    with np.errstate(all="ignore"):
        expected_grads = [0.0 + 1.0 * d for d in expected_local]
    grads = np.empty(n)
    for i, node in enumerate(nodes.tolist()):
        both, reached = np.empty(2 * (node + 1)), np.empty(node + 1, dtype=np.bool_)
        native.backward_primitives(offsets, parents, codes, table, by_codes, node, both, reached, grads, params)
        want = np.zeros(n)
        want[node] = 1.0
        for k in range(op.arity):
            want[k * m + i] = expected_grads[k][i]
        assert same_bits(grads, want), (op.name, pairs[i])


def test_signed_zeros_and_nan_go_where_numpy_puts_them(native: Any) -> None:
    """The cases easiest to get wrong, spelled out: a tie of 0.0 and -0.0 gives the second operand
    (numpy's maximum and minimum), relu(-0.0) is 0.0, abs clears the sign (of nan too), nan wins in
    max and min from either side, x/0 is a signed inf, and sign(-0.0) (abs's derivative) is 0.0."""
    cases = [  # (primitive, x, y, expected value, expected (dx, dy))
        ("max", 0.0, -0.0, -0.0, (0.5, 0.5)),
        ("max", -0.0, 0.0, 0.0, (0.5, 0.5)),
        ("min", 0.0, -0.0, -0.0, (0.5, 0.5)),
        ("min", -0.0, 0.0, 0.0, (0.5, 0.5)),
        ("max", np.nan, 1.0, np.nan, (0.0, 0.0)),
        ("max", 1.0, np.nan, np.nan, (0.0, 0.0)),
        ("min", -np.inf, np.nan, np.nan, (0.0, 0.0)),
        ("relu", -0.0, 0.0, 0.0, (0.0, 0.0)),
        ("relu", np.nan, 0.0, np.nan, (0.0, 0.0)),
        ("relu", SUBNORMAL, 0.0, SUBNORMAL, (1.0, 0.0)),
        ("abs", -0.0, 0.0, 0.0, (0.0, 0.0)),
        ("abs", -5e-324, 0.0, 5e-324, (-1.0, 0.0)),
        ("neg", 0.0, 0.0, -0.0, (-1.0, 0.0)),
        ("div", 1.0, -0.0, -np.inf, (-np.inf, -np.inf)),  # d/dy = -(-inf) / -0.0
        ("div", -0.0, 0.0, np.nan, (np.inf, np.nan)),
        ("div", 1.0, np.inf, 0.0, (0.0, -0.0)),
        ("mul", 1e300, 1e300, np.inf, (1e300, 1e300)),
        ("mul", -1e-300, 1e-300, -0.0, (1e-300, -1e-300)),
        ("sub", np.inf, np.inf, np.nan, (1.0, -1.0)),
        ("add", -0.0, -0.0, -0.0, (1.0, 1.0)),
        ("add", 0.0, -0.0, 0.0, (1.0, 1.0)),
    ]
    for name, x, y, value, (dx, dy) in cases:
        arity = opmath.PRIMITIVE_ARITY[name]
        offsets, parents, values, nodes = one_node_per_pair(arity, [(x, y)[:arity]])
        kinds = np.zeros(len(values), dtype=np.int8)
        kinds[nodes] = opmath.PRIMITIVES.index(name) + 1
        native.forward_primitives(nodes, kinds, offsets, parents, values, 0)
        assert same_bits(values[-1], value), (name, x, y, values[-1])
        if name == "abs":
            assert not np.signbit(values[-1])
        local = np.zeros(len(parents))
        native.primitive_derivatives(nodes, kinds, offsets, parents, values, local)
        assert same_bits(local, np.array([dx, dy][:arity])), (name, x, y, local)
    abs_of_nan = np.zeros(2)
    abs_of_nan[0] = -np.nan
    native.forward_primitives(
        np.array([1]),
        np.array([0, opmath.PRIMITIVES.index("abs") + 1], dtype=np.int8),
        np.array([0, 0, 1]),
        np.array([0], dtype=np.int32),
        abs_of_nan,
        0,
    )
    assert np.isnan(abs_of_nan[1]) and not np.signbit(abs_of_nan[1]) and np.signbit(abs_of_nan[0])


def test_a_node_whose_two_parents_are_one_node_gets_both_partials(native: Any, registry: OpRegistry) -> None:
    """x * x and max(x, x): the two slots add to the same parent, one after the other."""
    g = GraphBuilder()
    x = g.leaf(3.0, name="x")
    sq = g.add("mul", [x, x])
    top = g.add("max", [sq, sq])
    g.add("div", [top, x], name="out")
    graph = g.build()
    values = replay.forward(graph, registry)
    assert values.tolist() == [3.0, 9.0, 9.0, 3.0]
    table = replay._primitive_table(replay.resolve_ops(graph, registry))
    grads = np.empty(graph.num_nodes)
    native.backward_primitives(
        graph.parent_offsets,
        graph.parent_indices,
        graph.op_codes,
        table,
        values,
        3,
        np.empty(8),
        np.empty(4, dtype=np.bool_),
        grads,
    )
    # the sweep from the output: x gets -out/x = -1 from the div, top 1/3; max splits the tie
    # (1/3 * 0.5 twice), then x * x gives x each slot: -1 + g * 3 + g * 3
    d_top = 0.0 + 1.0 * (1.0 / 3.0)
    d_sq = 0.0 + d_top * 0.5 + d_top * 0.5
    assert grads.tolist() == [0.0 + 1.0 * -1.0 + d_sq * 3.0 + d_sq * 3.0, d_sq, d_top, 1.0]
    assert grads[0] == pytest.approx(1.0)  # d(x*x / x)/dx
    local = replay.edge_derivatives(graph, registry, values)
    nodes = np.flatnonzero(ancestors(graph, 3))
    assert same_bits(native.backward_sweep(graph.parent_offsets, graph.parent_indices, local, nodes, 3, 4), grads)


def random_primitives(width: int, seed: int, layers: int = 6) -> Graph:
    """A random layered DAG of primitives summed into its last node: each node of a layer takes a
    node of the layer before (every one is used) and, for binary ops, a random earlier node (now and
    then the same one: x * x). A few leaves are special values (nan, ±inf, ±0.0, subnormals, huge),
    so nan and inf reach some values and gradients, not all."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder()
    leaves = rng.uniform(0.5, 1.5, width)
    special = rng.random(width) < 0.01
    leaves[special] = rng.choice(np.array(SPECIAL), int(special.sum()))
    layer = [g.leaf(float(v)) for v in leaves]
    for _ in range(layers):
        earlier = len(g)
        first = rng.permutation(width)
        next_layer = []
        for j in range(width):
            p = layer[first[j]]
            if rng.random() < 0.15:
                next_layer.append(g.add(str(rng.choice(["neg", "relu", "abs"])), [p]))
                continue
            q = p if rng.random() < 0.05 else int(rng.integers(0, earlier))
            next_layer.append(g.add(str(rng.choice(["add", "sub", "mul", "div", "max", "min"])), [p, q]))
        layer = next_layer
    while len(layer) > 1:  # the sum of the last layer, pairwise
        layer = [g.add("add", layer[k : k + 2]) if k + 1 < len(layer) else layer[k] for k in range(0, len(layer), 2)]
    return g.build()


def reference_backward(graph: Graph, registry: OpRegistry, output: int, values: np.ndarray) -> np.ndarray:
    """The pure-Python local derivatives (numpy's op functions) and sweep."""
    nodes = np.flatnonzero(ancestors(graph, output, REFERENCE))
    local = replay.edge_derivatives(graph, registry, values, nodes, engine=REFERENCE)
    return replay.reference_sweep(graph, output, local, nodes)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fused_backward_from_outputs_in_the_middle_matches_the_reference(
    native: Any, registry: OpRegistry, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Outputs at the first computed node, inside the layers, inside the sum and at the end: the
    fused pass (through replay.backward), the unfused compiled one (the derivatives, then the
    sweep) and the reference agree, nan and inf included."""
    graph = random_primitives(800, seed)
    n = graph.num_nodes
    compiled = Engine(native)
    calls: list[int] = []
    fused = native.backward_primitives

    def spy(*args: Any) -> None:
        calls.append(args[5])
        fused(*args)

    monkeypatch.setattr(native, "backward_primitives", spy)
    values = replay.forward(graph, registry, engine=compiled)
    assert np.isnan(values).any() and np.isinf(values).any() and np.isfinite(values).sum() > n // 2
    rng = np.random.default_rng(seed)
    outputs = [800, *rng.integers(801, 6400, 4).tolist(), 6100, n - 3, n - 2, n - 1]
    kinds = replay._primitive_kinds(graph, replay.resolve_ops(graph, registry))
    special = 0
    for output in outputs:
        grads = replay.backward(graph, registry, output, values, engine=compiled)
        reference = reference_backward(graph, registry, output, values)
        assert same_bits(grads, reference), output
        assert not grads[output + 1 :].any()
        nodes = np.flatnonzero(ancestors(graph, output))
        local = np.zeros(graph.num_edges)
        native.primitive_derivatives(nodes, kinds, graph.parent_offsets, graph.parent_indices, values, local)
        unfused = native.backward_sweep(graph.parent_offsets, graph.parent_indices, local, nodes, output, n)
        assert same_bits(unfused, reference), output
        special += int((~np.isfinite(grads)).sum())
    assert calls == outputs
    assert 1000 < np.count_nonzero(ancestors(graph, n - 3)) < n - 1000  # a middle output reaches part of it
    assert special > 50  # nan and inf gradients were compared too


def test_the_backward_sweep_adds_slot_by_slot_on_nodes_of_many_parents(native: Any, registry: OpRegistry) -> None:
    """Nodes with 0 to 5 parents (repeats too) and random local derivatives: the sweep alone."""
    rng = np.random.default_rng(4)
    n = 4000
    counts = rng.choice([0, 1, 2, 3, 5], size=n)
    counts[:5] = 0
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    parents = np.concatenate([rng.integers(0, node, counts[node]) for node in range(5, n)]).astype(np.int32)
    graph = Graph(["leaf", "add"], (counts > 0).astype(np.uint16), offsets, parents, np.zeros(n), outputs=[n - 1])
    graph.check()
    local = rng.standard_normal(len(parents)) * 10.0 ** rng.integers(-3, 3, len(parents))
    local[::97] = -0.0
    for output in (n - 1, n // 2):
        nodes = np.flatnonzero(ancestors(graph, output))
        grads = native.backward_sweep(offsets, parents, local, nodes, output, n)
        assert same_bits(grads, replay.reference_sweep(graph, output, local, nodes))
        assert grads[output] == 1.0 and not grads[output + 1 :].any()


def test_a_chain_a_million_deep_through_the_c_sweeps(native: Any, registry: OpRegistry) -> None:
    """x = (x + c) * w with c = 1, w = -1, from x0 = 0.5: every value and gradient is exact, so the
    replayed ones are checked against numbers worked out here; the fused and unfused backward agree."""
    steps = 500_000
    n = 3 + 2 * steps
    codes = np.empty(n, dtype=np.uint16)
    codes[:3] = 0
    codes[3::2], codes[4::2] = 1, 2  # add, mul
    counts = np.where(codes > 0, 2, 0)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    parents = np.empty(4 * steps, dtype=np.int32)
    adds = 3 + 2 * np.arange(steps)
    parents[0::4] = np.where(adds == 3, 0, adds - 1)  # add: x, c
    parents[1::4] = 1
    parents[2::4] = adds  # mul: the add, w
    parents[3::4] = 2
    values = np.zeros(n)
    values[:3] = (0.5, 1.0, -1.0)
    graph = Graph(["leaf", "add", "mul"], codes, offsets, parents, values, outputs=[n - 1])
    graph.check()
    forward = replay.forward(graph, registry)
    # x after step k: -1.5 after odd steps, 0.5 after even ones; the adds: 1.5 then -0.5
    assert forward[4::2].tolist() == [-1.5, 0.5] * (steps // 2)
    assert forward[3::2].tolist() == [1.5, -0.5] * (steps // 2)
    grads = replay.backward(graph, registry, n - 1, forward)
    # every step multiplies the gradient by -1: an even number of steps leaves x0's at 1
    assert grads[0] == 1.0
    # d out / d c: the output is sum over steps k of c * (-1)^(steps - k + 1) -> -1 + 1 - ... = 0
    assert grads[1] == 0.0
    # d out / d w: the sum of the adds' values times the gradient reaching each mul (+-1)
    reaching = np.where(np.arange(steps) % 2 == 0, -1.0, 1.0)  # the gradient of mul k's output
    assert grads[2] == float(np.sum(forward[3::2] * reaching)) == -1.0 * steps
    assert grads[3:].tolist()[-4:] == [1.0, -1.0, -1.0, 1.0]
    nodes = np.arange(3, n, dtype=np.int64)
    local = np.zeros(graph.num_edges)
    kinds = np.array([0, 1, 3], dtype=np.int8)[codes]
    native.primitive_derivatives(nodes, kinds, offsets, parents, forward, local)
    assert same_bits(local[1::4], np.ones(steps)) and same_bits(local[3::4], forward[3::2])
    unfused = native.backward_sweep(offsets, parents, local, np.arange(n, dtype=np.int64), n - 1, n)
    assert same_bits(unfused, grads)
    again = values.copy()
    assert native.forward_primitives(nodes, kinds, offsets, parents, again, 0) == len(nodes)
    assert same_bits(again, forward)


def test_forward_primitives_resumes_where_it_stopped(native: Any) -> None:
    neg, relu = opmath.PRIMITIVES.index("neg") + 1, opmath.PRIMITIVES.index("relu") + 1
    kinds = np.array([0, neg, 0, relu], dtype=np.int8)  # leaf, neg, (something else), relu
    offsets = np.array([0, 0, 1, 2, 3], dtype=np.int64)
    parents = np.array([0, 1, 2], dtype=np.int32)
    values = np.array([2.0, 0.0, -9.0, 7.0])
    nodes = np.array([1, 2, 3], dtype=np.int64)
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 0) == 1
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 1) == 1  # still not a primitive
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 2) == 3
    assert values.tolist() == [2.0, -2.0, -9.0, 0.0]
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 3) == 3
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 7) == 3  # nothing left


def test_wrong_arguments_are_errors_not_wild_memory_accesses() -> None:
    _creplay = require_native("replay")

    offsets = np.array([0, 0, 1], dtype=np.int64)
    parents = np.array([0], dtype=np.int32)
    values = np.array([2.0, 0.0])
    codes = np.array([0, 1], dtype=np.uint16)
    with pytest.raises(TypeError, match=r"^parents: items of 8 bytes, not 4$"):
        _creplay.forward_all_primitives(
            codes, np.array([0, 5], dtype=np.int8), offsets, parents.astype(np.int64), values
        )
    with pytest.raises(ValueError, match=r"^codes: node 1 has op code 1, beyond the table of 1 entry$"):
        _creplay.forward_all_primitives(codes, np.array([0], dtype=np.int8), offsets, parents, values)
    with pytest.raises(ValueError, match=r"^codes: node 1 has op code 2, beyond the table of 2 entries$"):
        _creplay.forward_all_primitives(
            np.array([0, 2], dtype=np.uint16), np.array([0, 5], dtype=np.int8), offsets, parents, values
        )
    with pytest.raises(ValueError, match=r"^values: 3 items, expected one per node"):
        _creplay.forward_all_primitives(codes, np.array([0, 5], dtype=np.int8), offsets, parents, np.zeros(3))
    with pytest.raises(ValueError, match=r"^values: 1 item, expected one per node \(one more for offsets\) \(2\)$"):
        _creplay.forward_all_primitives(codes, np.array([0, 5], dtype=np.int8), offsets, parents, np.zeros(1))
    with pytest.raises(ValueError, match=r"^offsets: run from 0 to 1, outside the 0 parents$"):
        _creplay.forward_all_primitives(codes, np.array([0, 5], dtype=np.int8), offsets, parents[:0], values)
    with pytest.raises(ValueError, match=r"^offsets: run from 0 to 2, outside the 1 parent$"):
        _creplay.forward_all_primitives(
            codes, np.array([0, 5], dtype=np.int8), np.array([0, 0, 2]), np.zeros(1, np.int32), values
        )
    with pytest.raises(ValueError, match=r"^output 2 is not a node of this graph of 2 nodes$"):
        _creplay.backward_sweep(offsets, parents, np.ones(1), np.array([1]), 2, np.zeros(2))
    with pytest.raises(ValueError, match=r"^output 1 is not a node of this graph of 1 node$"):
        _creplay.backward_sweep(np.array([0, 0]), parents[:0], np.ones(0), np.array([0]), 1, np.zeros(1))
    with pytest.raises(ValueError, match=r"^nodes: 5 is not a node of this graph of 2 nodes$"):
        _creplay.backward_sweep(offsets, parents, np.ones(1), np.array([0, 5]), 1, np.zeros(2))
    with pytest.raises(ValueError, match=r"^nodes: -1 is not a node of this graph of 2 nodes$"):
        _creplay.primitive_derivatives(
            np.array([-1]), np.array([0, 5], dtype=np.int8), offsets, parents, values, np.zeros(1)
        )
    with pytest.raises(ValueError, match=r"^both: 2 items, expected 2 \(output \+ 1\) \(4\)$"):
        _creplay.backward_primitives(
            offsets, parents, codes, np.array([0, 5], dtype=np.int8), values, 1,
            np.zeros(2), np.zeros(2, dtype=np.bool_), np.zeros(2),
        )  # fmt: skip
    readonly = values.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _creplay.forward_all_primitives(codes, np.array([0, 5], dtype=np.int8), offsets, parents, readonly)
    _creplay.forward_all_primitives(codes, np.array([0, 5], dtype=np.int8), offsets, parents, values)
    assert values.tolist() == [2.0, -2.0]  # the same arguments, right: neg


def test_pow_nodes_replay_compiled_with_their_exponent_as_a_parameter(
    native: Any, registry: OpRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pow with its exponent attribute is a primitive (a params column); a node with other attributes
    still goes through its op's functions; both replay like the reference, bit for bit."""
    g = GraphBuilder()
    x = g.leaf(0.7, name="x")
    for i in range(kernels.NATIVE_THRESHOLD):
        x = g.add("tanh", [g.add("pow", [x], attrs={"exponent": [2.0, 3.0, -0.5, 1.5][i % 4]})])
    g.add("pow", [x], attrs={"exponent": 2.0})
    graph = g.build()
    sweeps: list[Any] = []
    sweep = native.forward_all_primitives
    monkeypatch.setattr(native, "forward_all_primitives", lambda *args: sweeps.append(args[-1]) or sweep(*args))
    compiled = Engine(native)
    values = replay.forward(graph, registry, engine=compiled)
    assert len(sweeps) == 1 and sweeps[0][1:7].tolist() == [2.0, 0.0, 3.0, 0.0, -0.5, 0.0]  # one sweep, exponents
    grads = replay.backward(graph, registry, graph.num_nodes - 1, values, engine=compiled)
    assert same_bits(replay.forward(graph, registry, engine=REFERENCE), values)
    assert same_bits(grads, reference_backward(graph, registry, graph.num_nodes - 1, values))
    assert np.isfinite(values).all() and grads[0] != 0.0

    extra = g.add("pow", [x], attrs={"exponent": 2.0, "note": 1.0}, name="extra")  # not pow's own attributes only
    g.add("add", [extra, x])
    other = g.build()
    ops = [None if tag in LEAF_TAGS else registry.get(tag) for tag in other.op_table]  # resolve_ops refuses it:
    assert not replay._all_primitives(other, ops, replay._primitive_table(ops))
    assert replay._primitive_kinds(other, ops)[extra] == 0
    with pytest.raises(OpError) as info:  # pow does not take it
        replay.forward(other, registry)
    assert str(info.value) == "node extra: op 'pow' (graphsvc 0.1.0) has no attribute 'note' (it takes: exponent)"


def test_a_primitive_with_a_parameter_needs_the_params(native: Any) -> None:
    pow_ = opmath.PRIMITIVES.index("pow") + 1
    offsets, parents, values, nodes = one_node_per_pair(1, [(3.0,)])
    kinds = np.array([0, pow_], dtype=np.int8)
    with pytest.raises(ValueError, match=r"^params: node 1 is a primitive with a parameter \(code 6\), but no params"):
        native.forward_primitives(nodes, kinds, offsets, parents, values, 0)
    with pytest.raises(ValueError, match=r"^params: 1 item, expected one per node \(2\)$"):
        native.forward_primitives(nodes, kinds, offsets, parents, values, 0, np.ones(1))
    assert native.forward_primitives(nodes, kinds, offsets, parents, values, 0, np.array([0.0, 3.0])) == 1
    assert values.tolist() == [3.0, 27.0]


def test_the_fused_backward_reuses_its_scratch_and_leftovers_do_not_matter(
    native: Any, registry: OpRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread keeps the fused backward's scratch: a second backward, of this graph or a smaller
    one, reuses it (no fresh pages), and what an earlier backward left in it changes nothing."""
    compiled = Engine(native)
    monkeypatch.setattr(replay, "_scratch", threading.local())  # none kept from earlier tests
    big, small = random_primitives(400, seed=0), random_primitives(100, seed=1)
    values_big = replay.forward(big, registry, engine=compiled)
    values_small = replay.forward(small, registry, engine=compiled)
    first = replay.backward(small, registry, small.num_nodes - 1, values_small, engine=compiled)
    replay.backward(big, registry, big.num_nodes - 1, values_big, engine=compiled)
    kept = replay._scratch.both
    again = replay.backward(small, registry, small.num_nodes - 1, values_small, engine=compiled)
    assert replay._scratch.both is kept and len(kept) == 2 * big.num_nodes
    assert same_bits(again, first)
    assert same_bits(again, reference_backward(small, registry, small.num_nodes - 1, values_small))
