"""Forward and backward replay on hand-worked examples, and the fast paths against the references."""

from __future__ import annotations

import hashlib
import math
import numbers as numbers_module
import os
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

import graphsvc.native as kernels
from graphsvc.errors import MissingOpsError, OpError, ReplayError, UsageError
from graphsvc.graph import LEAF_TAGS, Graph, GraphBuilder, OpSource
from graphsvc.native import REFERENCE, Engine
from graphsvc.ops import Op, OpRegistry, opmath
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay
from graphsvc.replay import compare as checks
from graphsvc.topo import ancestors
from tests.conftest import require_compiled, same_bits, seed004_graph


def grads_by_name(graph: Graph, registry: OpRegistry, overrides: dict[int, float] | None = None) -> dict[str, float]:
    values = replay.forward(graph, registry, overrides)
    grads = replay.backward(graph, registry, replay.default_output(graph), values)
    return {name: float(grads[node]) for node, name in graph.names.items()}


def test_seed004_gradients_are_22_17_5(registry: OpRegistry) -> None:
    graph = seed004_graph()
    values = replay.forward(graph, registry)
    assert values[graph.node_id("L")] == 35.0
    grads = grads_by_name(graph, registry)
    assert (grads["a"], grads["b"], grads["c"]) == (22.0, 17.0, 5.0)
    assert (grads["abc"], grads["apb"], grads["ab"], grads["L"]) == (5.0, 7.0, 5.0, 1.0)


def test_set_changes_the_result_as_worked_out_by_hand(registry: OpRegistry) -> None:
    # a=3: L = (3*3 + 1)*(3 + 3) = 60; dL/da = b(a+b) + (ab+c) = 18 + 10; dL/db = a(a+b) + (ab+c) = 28
    graph = seed004_graph()
    values = replay.forward(graph, registry, {graph.node_id("a"): 3.0})
    assert values[graph.node_id("L")] == 60.0
    grads = grads_by_name(graph, registry, {graph.node_id("a"): 3.0})
    assert (grads["a"], grads["b"], grads["c"]) == (28.0, 28.0, 6.0)


def test_seed002_matches_the_derivative_worked_by_hand(registry: OpRegistry) -> None:
    x = 0.5
    g = GraphBuilder()
    nx = g.leaf(x, name="x")
    a = g.add("pow", [nx], attrs={"exponent": 2.0})
    b = g.add("exp", [a])
    c = g.add("add", [a, b])
    d = g.add("sqrt", [c])
    e = g.add("cos", [c])
    g.add("add", [d, e], name="f")
    graph = g.build()
    values = replay.forward(graph, registry)
    cx = x**2 + math.exp(x**2)
    assert values[graph.node_id("f")] == pytest.approx(math.sqrt(cx) + math.cos(cx), rel=1e-15)
    # f'(x) = (1/(2 sqrt(c)) - sin(c)) * (2x + 2x exp(x^2))
    expected = (1 / (2 * math.sqrt(cx)) - math.sin(cx)) * (2 * x + 2 * x * math.exp(x**2))
    assert grads_by_name(graph, registry)["x"] == pytest.approx(expected, rel=1e-14)


def test_x_times_x_counts_both_parent_slots(registry: OpRegistry) -> None:
    g = GraphBuilder()
    x = g.leaf(3.0, name="x")
    g.add("mul", [x, x], name="y")
    assert grads_by_name(g.build(), registry)["x"] == 6.0


def test_reused_non_leaf_node_gets_every_contribution(registry: OpRegistry) -> None:
    # micrograd issue #2: t = 2a is used three times. y = t*t + t, dy/dt = 2t + 1 = 13, dy/da = 26.
    g = GraphBuilder()
    a = g.leaf(3.0, name="a")
    two = g.const(2.0)
    t = g.add("mul", [two, a], name="t")
    tt = g.add("mul", [t, t])
    g.add("add", [tt, t], name="y")
    grads = grads_by_name(g.build(), registry)
    assert (grads["t"], grads["a"]) == (13.0, 26.0)


def test_max_routes_the_gradient_to_the_larger_input(registry: OpRegistry) -> None:
    g = GraphBuilder()
    x, y, w = g.leaf(4.0, name="x"), g.leaf(-1.0, name="y"), g.leaf(2.0, name="w")
    m = g.add("max", [x, y], name="m")
    g.add("mul", [m, w], name="z")
    grads = grads_by_name(g.build(), registry)
    assert (grads["x"], grads["y"], grads["w"]) == (2.0, 0.0, 4.0)


def test_every_replay_starts_from_zero_gradients(registry: OpRegistry) -> None:
    graph = seed004_graph()
    graph.values = replay.forward(graph, registry)
    graph.grads = np.full(graph.num_nodes, 100.0)  # stale gradients stored in the file
    first = replay.backward(graph, registry, graph.node_id("L"))
    second = replay.backward(graph, registry, graph.node_id("L"))
    assert first[graph.node_id("a")] == second[graph.node_id("a")] == 22.0


def test_nodes_the_output_does_not_depend_on_get_zero(registry: OpRegistry) -> None:
    # The other branch's local derivative is inf (log at 0): it must not leak into shared parents.
    g = GraphBuilder()
    x = g.leaf(0.0, name="x")
    g.add("log", [x], name="other")
    g.add("mul", [x, x], name="y")
    graph = g.build()
    values = replay.forward(graph, registry)
    grads = replay.backward(graph, registry, graph.node_id("y"), values)
    assert grads.tolist() == [0.0, 0.0, 1.0]


def test_backward_steps_show_each_contribution(registry: OpRegistry) -> None:
    graph = seed004_graph()
    values = replay.forward(graph, registry)
    grads, steps = replay.backward_steps(graph, registry, graph.node_id("L"), values)
    first = steps[0]
    assert graph.label(first.node) == "L" and first.grad == 1.0
    assert [(graph.label(p), d, c) for p, d, c in first.contributions] == [("abc", 5.0, 5.0), ("apb", 7.0, 7.0)]
    ab = next(s for s in steps if graph.label(s.node) == "ab")
    assert [(graph.label(p), d, c) for p, d, c in ab.contributions] == [("a", 3.0, 15.0), ("b", 2.0, 10.0)]
    assert grads[graph.node_id("a")] == 22.0


def test_missing_ops_are_named_with_their_recorded_plugin(registry: OpRegistry) -> None:
    g = GraphBuilder()
    x = g.leaf(1.0)
    s = g.add("softplus", [x])
    g.add("hypot", [s, x])
    g.op_sources["softplus"] = OpSource("graphsvc-activations", "0.1.0")
    graph = g.build()
    with pytest.raises(OpError) as info:
        replay.forward(graph, registry)
    assert str(info.value) == (
        "the graph uses ops not registered here: softplus (from graphsvc-activations 0.1.0), "
        "hypot (plugin unknown); install the plugin that provides them"
    )


def test_a_misspelt_op_is_given_the_registered_name_it_is_closest_to(registry: OpRegistry) -> None:
    """Like OpRegistry.get: a name with no recorded plugin that is close to a registered one gets it
    instead of the install hint; a recorded plugin says the op is real, so it keeps the hint."""
    g = GraphBuilder()
    x = g.leaf(1.0)
    g.add("sqrtt", [x])
    with pytest.raises(MissingOpsError) as info:
        replay.forward(g.build(), registry)
    assert str(info.value) == "the graph uses an op not registered here: sqrtt (plugin unknown; did you mean 'sqrt'?)"
    assert not info.value.install_hint
    g.add("cube", [x])
    g.add("tanhh", [x])
    with pytest.raises(MissingOpsError) as info:
        replay.forward(g.build(), registry)
    assert str(info.value) == (
        "the graph uses ops not registered here: sqrtt (plugin unknown; did you mean 'sqrt'?), cube (plugin unknown), "
        "tanhh (plugin unknown; did you mean 'tanh'?); install the plugin that provides the other"
    )
    assert info.value.install_hint
    g.add("hypot", [x, x])
    g.op_sources["sqrtt"] = OpSource("graphsvc-roots", "1.0")
    with pytest.raises(MissingOpsError) as info:
        replay.forward(g.build(), registry)
    assert str(info.value) == (
        "the graph uses ops not registered here: sqrtt (from graphsvc-roots 1.0), cube (plugin unknown), "
        "tanhh (plugin unknown; did you mean 'tanh'?), hypot (plugin unknown); install the plugin that provides "
        "the others"
    )


def test_parent_count_must_match_the_arity(registry: OpRegistry) -> None:
    g = GraphBuilder()
    x = g.leaf(1.0)
    g.add("exp", [x, x], name="bad")
    with pytest.raises(OpError, match=r"^node bad: op exp takes 1 input but the node has 2 parents$"):
        replay.forward(g.build(), registry)


def _refused_on_every_engine(graph: Graph, registry: OpRegistry, message: str) -> None:
    """Forward and backward each raise OpError with exactly ``message``, on the compiled engine
    (where built) and on the vectorized reference."""
    for engine in (kernels.engine_for(graph.num_nodes), REFERENCE):
        with pytest.raises(OpError) as info:
            replay.forward(graph, registry, engine=engine)
        assert str(info.value) == message
        with pytest.raises(OpError) as info:
            replay.backward(graph, registry, graph.num_nodes - 1, engine=engine)
        assert str(info.value) == message


def test_a_large_graph_names_the_same_node_with_the_wrong_parent_count(registry: OpRegistry) -> None:
    """The compiled arity check (large graphs) finds the first bad node, as the vectorized one does."""
    g = GraphBuilder()
    x = g.leaf(1.0)
    for i in range(kernels.NATIVE_THRESHOLD + 10):
        g.add("neg", [x], name=f"n{i}")
    g.add("add", [x], name="short")  # one parent for a binary op
    g.add("neg", [x, x], name="long")
    graph = g.build()
    _refused_on_every_engine(graph, registry, "node short: op add takes 2 inputs but the node has 1 parent")


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (
            [("mix", 3, "three"), ("mix", 4, "four"), ("mix", 1, "one"), ("neg", 2, "long")],
            "node four: op mix takes at most 3 inputs but the node has 4 parents",
        ),
        ([("mix", 1, "one"), ("mix", 4, "four")], "node one: op mix takes at least 2 inputs but the node has 1 parent"),
        ([("neg", 2, "long"), ("mix", 4, "four")], "node long: op neg takes 1 input but the node has 2 parents"),
    ],
    ids=["too many", "too few", "an exact arity first"],
)
def test_a_variadic_ops_node_must_have_from_arity_to_max_arity_inputs(
    registry: OpRegistry, nodes: list[tuple[str, int, str]], message: str
) -> None:
    """Refused before anything runs, the first such node named, by either engine (a graph large
    enough for the compiled one)."""
    bounded = OpRegistry()
    bounded.register(registry.get("neg"))
    mix = Op(
        "mix", 2, forward=lambda x, y, *z: x + y, vjp=lambda g, out, *xs: (g,) * len(xs), variadic=True, max_arity=3
    )
    bounded.register(mix, plugin="demo")
    g = GraphBuilder()
    x = g.leaf(1.0)
    for i in range(kernels.NATIVE_THRESHOLD + 10):
        g.add("neg", [x], name=f"n{i}")
    for tag, count, name in nodes:
        g.add(tag, [x] * count, name=name)
    _refused_on_every_engine(g.build(), bounded, message)


@pytest.mark.parametrize(
    ("tag", "attrs", "message"),
    [
        ("exp", {"base": 2.0}, "node bad: op 'exp' (graphsvc 0.1.0) has no attribute 'base' (it takes none)"),
        ("pow", {"exp": 2.0}, "node bad: op 'pow' (graphsvc 0.1.0) has no attribute 'exp' (it takes: exponent)"),
        (
            "pow",
            {"exponent": 2.0, "b": 1, "a": 1},
            "node bad: op 'pow' (graphsvc 0.1.0) has no attributes 'a', 'b' (it takes: exponent)",
        ),
        (
            "exp",
            {"\x1b[31mred": 1},  # a name from a file, escaped by repr
            "node bad: op 'exp' (graphsvc 0.1.0) has no attribute '\\x1b[31mred' (it takes none)",
        ),
        ("pow", None, "node bad: op 'pow' (graphsvc 0.1.0) needs attribute 'exponent' (the node gives none)"),
        (
            "exp",
            {f"a{i:02}": 1 for i in range(12)} | {"b" * 100: 1},  # the list cut at ten, a long name cut
            "node bad: op 'exp' (graphsvc 0.1.0) has no attributes "
            + ", ".join(f"'a{i:02}'" for i in range(10))
            + " and 3 more (it takes none)",
        ),
        (
            "pow",
            {"c" * 100: 1},
            "node bad: op 'pow' (graphsvc 0.1.0) has no attribute '"
            + "c" * 39
            + "... (102 characters) (it takes: exponent)",
        ),
    ],
)
def test_a_nodes_attributes_are_those_its_op_takes(
    registry: OpRegistry, tag: str, attrs: dict[str, object] | None, message: str
) -> None:
    """Checked before any work, on every engine, forward and backward, in one line naming the node
    and the attributes the op takes (read from its forward's signature), not as Python's TypeError."""
    g = GraphBuilder()
    x = g.leaf(2.0)
    for i in range(kernels.NATIVE_THRESHOLD + 10):  # large enough for the compiled sweeps
        x = g.add("pow", [x], attrs={"exponent": 1.0}, name=f"p{i}")
    g.add(tag, [x], attrs=attrs, name="bad")
    g.add("exp", [x], attrs={"other": 1}, name="later")  # the first wrong node is named
    _refused_on_every_engine(g.build(), registry, message)


def test_a_pow_node_without_its_exponent_is_refused_not_raised_to_the_power_0(registry: OpRegistry) -> None:
    """The compiled sweep took a missing exponent as 0 (1.0 for any x) when another pow node gave
    one, and stopped on an internal error when none did."""
    for first in ({"exponent": 2.0}, None):
        g = GraphBuilder()
        x = g.leaf(3.0)
        for _ in range(kernels.NATIVE_THRESHOLD):
            x = g.add("add", [x, g.const(0.0)])
        g.add("pow", [g.add("pow", [x], attrs=first, name="q")], name="p")
        with pytest.raises(OpError) as info:
            replay.forward(g.build(), registry)
        bad = "p" if first else "q"
        assert (
            str(info.value) == f"node {bad}: op 'pow' (graphsvc 0.1.0) needs attribute 'exponent' (the node gives none)"
        )


def test_a_plugin_ops_attributes_come_from_its_forwards_signature() -> None:
    def scaled(x: object, *, factor: float, offset: float = 0.0) -> object:
        return x

    registry = OpRegistry()
    registry.register(Op("scaled", 1, scaled, lambda x, out, **attrs: (1.0,)), plugin="demo", plugin_version="1.0")
    registry.register(Op("anything", 1, lambda x, **attrs: x, lambda x, out, **attrs: (1.0,)), plugin="demo")
    registry.register(Op("ufunc", 1, np.negative, lambda x, out: (-1.0,)), plugin="demo")  # no signature to read
    for tag, attrs, message in (
        ("scaled", {"factor": 2.0, "offset": 1.0}, None),
        ("scaled", {"offset": 1.0}, "op 'scaled' (demo 1.0) needs attribute 'factor' (the node gives: 'offset')"),
        ("scaled", {"factor": 2.0, "x": 1}, "op 'scaled' (demo 1.0) has no attribute 'x' (it takes: factor, offset)"),
        ("anything", {"whatever": 1}, None),  # **attrs: it takes any
        ("ufunc", {"dtype": "float64"}, None),  # taken on trust
    ):
        g = GraphBuilder()
        g.add(tag, [g.leaf(1.0)], attrs=attrs, name="n")
        if message is None:
            replay.forward(g.build(), registry)
            continue
        with pytest.raises(OpError) as info:
            replay.forward(g.build(), registry)
        assert str(info.value) == f"node n: {message}"


def reference_primitive_params(graph: Graph, table: np.ndarray) -> replay.PrimitivePlan:
    """replay._primitive_params as it was, node by node: the reference its bulk reads must match."""
    params, excluded, given, numbers = None, [], [], []
    for node, node_attrs in graph.attrs.items():
        code = int(table[graph.op_codes[node]])
        if code == 0 or graph.parent_offsets[node + 1] == graph.parent_offsets[node]:
            continue
        names = opmath.PRIMITIVE_ATTRS[opmath.PRIMITIVES[code - 1]]
        value = node_attrs.get(names[0]) if len(names) == 1 and len(node_attrs) == 1 else None
        if not isinstance(value, numbers_module.Real) or isinstance(value, bool):
            excluded.append(node)
            continue
        given.append(node)
        numbers.append(value)
    if given:
        params = np.zeros(graph.num_nodes, dtype=np.float64)
        params[given] = numbers
    return replay.PrimitivePlan(params, np.array(excluded, dtype=np.int64))


#: Attributes of a pow node: its one real number (of any real type), and what is not one.
POW_ATTRS = [
    {"exponent": 2.0},
    {"exponent": 3},
    {"exponent": -0.5},
    {"exponent": 2**70},
    {"exponent": np.float64(1.5)},
    {"exponent": np.int64(4)},
    {"exponent": Fraction(1, 3)},
    {"exponent": True},
    {"exponent": np.bool_(True)},
    {"exponent": "2"},
    {"exponent": None},
    {"exponent": Decimal("1.5")},
    {"exponent": 2.0, "scale": 1.0},
    {"other": 2.0},
    {},
]


@pytest.mark.parametrize("odd", [False, True])
def test_primitive_parameters_are_those_read_node_by_node(registry: OpRegistry, odd: bool) -> None:
    """The bulk read of pow's exponents gives the reference's numbers, bit for bit, and sends the
    same nodes, in the same order, to their op's functions: floats and ints, some beside another
    name (``odd=False``), and every other kind of attribute among them."""
    rng = np.random.default_rng(7)
    g = GraphBuilder()
    x = g.leaf(0.5, name="x")
    kinds = POW_ATTRS if odd else [*POW_ATTRS[:3], {"exponent": 2.0, "scale": 1.0}]
    for i in range(300):
        x = g.add("pow", [x], attrs=kinds[int(rng.integers(len(kinds)))] if i % 7 else {"exponent": rng.normal()})
        if odd and i % 50 == 0:
            x = g.add("add", [x, g.leaf(1.0)], attrs={"exponent": 2.0})  # a primitive without one
            g.add("exp", [x], attrs={"base": 2.0})
    graph = g.build()
    if odd:
        graph.attrs[0] = {"exponent": 2.0}  # a leaf's: kept, never a parameter
        graph.attrs[5] = MappingProxyType({"exponent": 2.0})  # not a dict: a graph not checked yet
        graph.attrs = dict(reversed(graph.attrs.items()))  # not in id order
    ops = [None if tag in LEAF_TAGS else registry.get(tag) for tag in graph.op_table]
    table = replay._primitive_table(ops)
    got, expected = replay._primitive_params(graph, table), reference_primitive_params(graph, table)
    assert expected.params is not None
    assert got.params is not None and got.params.tobytes() == expected.params.tobytes()
    assert got.excluded.tolist() == expected.excluded.tolist()
    assert len(expected.excluded)


def test_an_op_that_raises_is_named_with_its_plugin_and_node() -> None:
    def broken(x: object) -> object:
        raise ZeroDivisionError("boom")

    registry = OpRegistry()
    registry.register(Op("boom", 1, broken, lambda x, out: (x,)), plugin="demo", plugin_version="1.0")
    for width in (1, 40):  # node by node, and as one numpy group
        g = GraphBuilder()
        leaves = [g.leaf(float(i)) for i in range(width)]
        for i, leaf in enumerate(leaves):
            g.add("boom", [leaf], name=f"n{i}")
        with pytest.raises(ReplayError) as info:
            replay.forward(g.build(), registry)
        assert str(info.value) == "node n0: op 'boom' (demo 1.0): forward raised ZeroDivisionError: boom"


def test_only_leaves_can_be_set(registry: OpRegistry) -> None:
    graph = seed004_graph()
    with pytest.raises(UsageError, match=r"^node ab is a mul node, not a leaf: only leaves can be set$"):
        replay.forward(graph, registry, {graph.node_id("ab"): 1.0})


def test_default_output_needs_a_single_output() -> None:
    g = GraphBuilder()
    x = g.leaf(1.0, name="x")
    g.add("exp", [x], name="p")
    g.add("sin", [x], name="q")
    with pytest.raises(UsageError, match=r"^the graph has 2 outputs \(p, q\): choose one with output=$"):
        replay.default_output(g.build())


def test_default_output_lists_at_most_ten_outputs() -> None:
    g = GraphBuilder()
    x = g.leaf(1.0, name="x")
    for i in range(20_000):
        g.add("exp", [x], name=f"y{i}")
    with pytest.raises(UsageError) as info:
        replay.default_output(g.build())
    assert str(info.value) == (
        "the graph has 20,000 outputs (y0, y1, y2, y3, y4, y5, y6, y7, y8, y9 and 19,990 more): choose one with output="
    )


def test_many_missing_ops_are_listed_with_a_count(registry: OpRegistry) -> None:
    g = GraphBuilder()
    x = g.leaf(1.0)
    for i in range(25):
        g.add(f"op{i}", [x])
    with pytest.raises(OpError) as info:
        replay.forward(g.build(), registry)
    shown = ", ".join(f"op{i} (plugin unknown)" for i in range(10))
    assert str(info.value) == (
        f"the graph uses 25 ops not registered here: {shown} and 15 more; install the plugin that provides them"
    )


def test_default_output_is_an_output_listed_twice() -> None:
    g = GraphBuilder()
    x = g.leaf(1.0, name="x")
    p = g.add("exp", [x], name="p")
    g.add("sin", [x], name="q")
    assert replay.default_output(g.build(outputs=[p, p])) == p
    with pytest.raises(UsageError, match=r"^the graph has 2 outputs \(q, p\): choose one with output=$"):
        replay.default_output(g.build(outputs=["q", "p", "q"]))


def test_forward_check_of_a_graph_with_values_left_out(registry: OpRegistry) -> None:
    """A graph built without computed values (GraphBuilder's default, nan) has nothing to check them against."""
    g = GraphBuilder()
    x, y = g.leaf(2.0, name="x"), g.leaf(3.0, name="y")
    g.add("exp", [g.add("mul", [x, y], name="xy")], name="e")
    graph = g.build()
    c = checks.compare("values", replay.forward(graph, registry), graph.values, rtol=1e-9, atol=0.0)
    assert (c.ok, c.mismatches, c.unstored, c.nodes, c.worst_abs, c.worst_abs_node) == (True, 0, 2, 4, 0.0, 0)


# -- fast paths against the straightforward references -------------------------------------------
UNARY = ["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "relu", "sigmoid", "abs"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]


def random_graph(n: int, seed: int) -> Graph:
    """A random DAG over every builtin op (pow with two exponents), values in a modest range."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder()
    for i in range(min(50, n)):
        g.leaf(float(rng.uniform(-2, 2)), name=f"x{i}")
    for i in range(len(g), n):
        kind = rng.integers(0, 3)
        p = int(rng.integers(max(0, i - 200), i))
        if kind == 0:
            g.add(str(rng.choice(UNARY)), [p])
        elif kind == 1:
            g.add(str(rng.choice(BINARY)), [p, int(rng.integers(0, i))])
        else:
            g.add("pow", [p], attrs={"exponent": float(rng.choice([2.0, 3.0]))})
    return g.build()


@pytest.mark.parametrize("seed", [1, 12, 17, 18])
def test_grouped_and_node_by_node_forward_agree_bit_for_bit(registry: OpRegistry, seed: int) -> None:
    """Both paths call the op's function on float64 arrays (node by node: one-element arrays), so
    numpy runs the same loop for a node either way, whatever CPU features it dispatches to. With
    numpy scalars node by node, seeds 12, 17 and 18 differed even without AVX-512: a scalar's
    ``x ** 2.0`` is libm's ``pow``, an array's is ``x * x``."""
    graph = random_graph(3000, seed=seed)
    engine = kernels.engine_for(graph.num_nodes)
    grouped = replay.forward(graph, registry, engine=engine._replace(narrow_level=0))  # every level as numpy groups
    single = replay.forward(graph, registry, engine=engine._replace(narrow_level=10**9))  # every node on its own
    assert same_bits(grouped, single)
    assert np.isfinite(grouped).sum() > 1000  # the comparison covers real numbers, not only nan


def test_compiled_replay_matches_the_references(registry: OpRegistry) -> None:
    """Large graphs replay through compiled kernels; the result must be the pure-Python one, bit for bit.

    That holds on every CPU because the kernels compute only correctly rounded operations (the
    primitives, the sweeps' multiply-adds); exp, tanh... take the same numpy calls on both sides."""
    compiled = Engine(require_compiled())
    for graph in (random_graph(20_500, seed=2), primitives_only(20_010)):  # large enough for the counts below
        output = graph.num_nodes - 1
        values = replay.forward(graph, registry, engine=compiled)  # compiled primitives, numpy groups, Python nodes
        grads = replay.backward(graph, registry, output, values, engine=compiled)  # compiled locals and sweep
        reach = ancestors(graph, output, compiled)
        reference_values = replay.forward(graph, registry, engine=REFERENCE)
        nodes = np.flatnonzero(ancestors(graph, output, REFERENCE))
        local = replay.edge_derivatives(graph, registry, reference_values, nodes, engine=REFERENCE)
        reference_grads = replay.reference_sweep(graph, output, local, nodes)
        assert same_bits(values, reference_values)
        assert same_bits(grads, reference_grads)
        assert np.array_equal(reach, np.isin(np.arange(graph.num_nodes), nodes))
        assert np.isfinite(grads).sum() > 1000


def test_the_fused_compiled_backward_from_any_node_matches_the_reference(
    registry: OpRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-pass backward of all-primitive graphs, from outputs in the middle of the graph too
    (nodes after the output get 0), against the straightforward sweep, bit for bit."""
    graph = primitives_only(200)  # small: the engine passed decides, not the size
    fused = []
    jit = require_compiled()
    original = jit.backward_primitives

    def spy(*args):  # type: ignore[no-untyped-def]
        fused.append(args[5])
        return original(*args)

    monkeypatch.setattr(jit, "backward_primitives", spy)
    compiled = Engine(jit)
    values = replay.forward(graph, registry, engine=compiled)
    rng = np.random.default_rng(11)
    outputs = [graph.num_nodes - 1, graph.num_nodes // 2, *rng.integers(20, graph.num_nodes, 3).tolist()]
    for output in outputs:
        grads = replay.backward(graph, registry, output, values, engine=compiled)
        nodes = np.flatnonzero(ancestors(graph, output, REFERENCE))
        local = replay.edge_derivatives(graph, registry, values, nodes, engine=REFERENCE)  # pure-Python locals
        assert same_bits(grads, replay.reference_sweep(graph, output, local, nodes))
        assert not grads[output + 1 :].any()
    assert fused == outputs  # every backward above took the fused pass


def test_every_sweep_of_a_replay_runs_on_the_engine_given(
    registry: OpRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is chosen once and passed down: with the references, a graph far above the
    threshold runs no compiled sweep (the ops' own elementwise loops aside, which every path shares);
    the compiled engine runs its sweeps on a graph far below it."""
    large = random_graph(3000, seed=1)  # built (and checked) before the kernels are watched
    mixed = load_registry(disable_third_party=True)[0]
    mixed.register(Op("double", 1, lambda x: 2.0 * x, lambda x, out: (2.0,)), plugin="demo")  # no kernel
    g = GraphBuilder()
    x = g.leaf(0.5)
    for _ in range(100):
        x = g.add("tanh", [g.add("double", [x])])
    small = g.build()
    jit = require_compiled()
    calls: list[str] = []
    for name, kernel in list(vars(jit).items()):
        monkeypatch.setattr(jit, name, lambda *args, name=name, kernel=kernel: calls.append(name) or kernel(*args))
    sweeps = {name for name in vars(jit) if not name.startswith("elementwise")}
    output = large.num_nodes - 1
    values = replay.forward(large, registry, engine=REFERENCE)
    grads = replay.backward(large, registry, output, values, engine=REFERENCE)
    steps_grads, _ = replay.backward_steps(large, registry, output, values, engine=REFERENCE)
    large.check(REFERENCE)
    assert sweeps.isdisjoint(calls)
    assert same_bits(grads, steps_grads)
    calls.clear()
    compiled = Engine(jit)
    chain = replay.forward(small, mixed, engine=compiled)
    assert sorted(sweeps.intersection(calls)) == ["first_arity_mismatch", "forward_primitives", "levels"]
    calls.clear()
    chain_grads = replay.backward(small, mixed, small.num_nodes - 1, chain, engine=compiled)
    assert sorted(sweeps.intersection(calls)) == [
        "ancestors",
        "backward_sweep",
        "first_arity_mismatch",
        "primitive_derivatives",
    ]
    assert same_bits(chain, replay.forward(small, mixed, engine=REFERENCE))
    assert same_bits(chain_grads, replay.backward(small, mixed, small.num_nodes - 1, chain, engine=REFERENCE))


def test_a_deep_chain_mixing_primitives_and_other_ops_replays_like_the_reference(registry: OpRegistry) -> None:
    """x = tanh(x * w + b), repeated: narrow levels, compiled runs of mul and add between tanh calls."""
    g = GraphBuilder()
    x, w, b = g.leaf(0.3, name="x"), g.leaf(0.9, name="w"), g.leaf(0.05, name="b")
    steps = kernels.NATIVE_THRESHOLD // 3 + 10
    for _ in range(steps):
        x = g.add("tanh", [g.add("add", [g.add("mul", [x, w]), b])])
    graph = g.build()
    values = replay.forward(graph, registry)  # the engine for its size: compiled, where built
    reference = replay.forward(graph, registry, engine=REFERENCE)
    assert same_bits(values, reference)
    expected = 0.3
    for _ in range(steps):
        expected = math.tanh(expected * 0.9 + 0.05)
    assert values[-1] == pytest.approx(expected, rel=1e-12)


def primitives_only(n: int) -> Graph:
    """A random DAG of compiled primitives only (replayed in one compiled sweep)."""
    rng = np.random.default_rng(5)
    g = GraphBuilder()
    for i in range(20):
        g.leaf(float(rng.uniform(0.5, 1.5)), name=f"x{i}")
    for i in range(len(g), n):
        p = int(rng.integers(max(0, i - 50), i))
        if rng.random() < 0.3:
            g.add(str(rng.choice(["neg", "relu", "abs"])), [p])
        else:
            g.add(str(rng.choice(BINARY)), [p, int(rng.integers(0, i))])
    return g.build()


def test_a_chain_a_million_deep_replays_at_the_default_recursion_limit(registry: OpRegistry) -> None:
    n = 1_000_000
    codes = np.ones(n, dtype=np.uint16)
    codes[0] = 0
    offsets = np.concatenate(([0, 0], np.arange(1, n, dtype=np.int64)))
    parents = np.arange(0, n - 1, dtype=np.int32)
    values = np.zeros(n)
    values[0] = 0.5
    graph = Graph(["leaf", "sin"], codes, offsets, parents, values, outputs=[n - 1])
    graph.check()
    forward = replay.forward(graph, registry)
    grads = replay.backward(graph, registry, n - 1, forward)
    x = np.array([0.5])
    for _ in range(3):
        x = np.sin(x)  # numpy's sin, as replay calls it: math.sin may differ in the last bit
    assert forward[3] == x[0]
    # d/dx of sin applied n-1 times: the product of cos along the chain
    assert grads[0] == pytest.approx(float(np.prod(np.cos(forward[:-1]))), rel=1e-9)


@pytest.mark.parametrize("narrow", [0, 10**9], ids=["numpy groups", "node by node"])
def test_an_op_gets_read_only_inputs_on_every_path(narrow: int) -> None:
    def double_in_place(x: np.ndarray) -> np.ndarray:
        x *= 2.0
        return x

    registry = OpRegistry()
    registry.register(Op("twice", 1, double_in_place, lambda x, out: (2.0,)), plugin="demo")
    g = GraphBuilder()
    g.add("twice", [g.leaf(1.5, name="x")], name="y")
    with pytest.raises(ReplayError) as info:
        replay.forward(g.build(), registry, engine=Engine(narrow_level=narrow))
    assert str(info.value) == "node y: op 'twice' (demo): forward raised ValueError: output array is read-only"


def test_node_by_node_pow_is_numpys_array_pow(registry: OpRegistry) -> None:
    """x ** 2.0 on an array is numpy's x * x (correctly rounded); on a numpy scalar it would be libm's
    pow, one ulp off at this x on this project's CI machine."""
    x = -1.3275170599102342
    g = GraphBuilder()
    g.add("pow", [g.leaf(x)], attrs={"exponent": 2.0})
    node_by_node = Engine(narrow_level=10**9)
    assert replay.forward(g.build(), registry, engine=node_by_node)[1] == x * x == 1.7623015443527121


def test_the_promises_hold_with_numpys_other_cpu_dispatch(tmp_path: Path) -> None:
    """With numpy's dispatched CPU features switched off (NPY_DISABLE_CPU_FEATURES), the grouped and
    node-by-node paths still agree bit for bit, and a graph of correctly rounded ops (+ - * / sqrt
    neg abs relu max min) gives the same bits as in this process. exp, tanh, pow... may differ
    between the two dispatches: that is the one thing not promised."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    dispatched = [feature for feature in __cpu_dispatch__ if __cpu_features__.get(feature)]
    script = tmp_path / "bits.py"
    script.write_text(BITS_SCRIPT, encoding="utf-8")
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(dispatched), "GRAPHSVC_NATIVE": "0"}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "features off: " + str(sorted(f for f in __cpu_features__ if f in dispatched))
    assert lines[1:-1] == ["seed 12: grouped == node by node", "seed 17: grouped == node by node"]
    here = _correctly_rounded_bits()
    assert lines[-1] == f"correctly rounded: {here}"


BITS_SCRIPT = """
import hashlib, sys
import numpy as np
from numpy._core._multiarray_umath import __cpu_features__, __cpu_dispatch__
sys.path.insert(0, "tests/replay")
from graphsvc.replay import columns as replay
from graphsvc.native import Engine
from graphsvc.pluginhost import load_registry
from test_replay import _correctly_rounded_bits, random_graph, same_bits

registry, _ = load_registry(disable_third_party=True)
print("features off:", sorted(f for f in __cpu_dispatch__ if not __cpu_features__.get(f) and f in
      __import__("os").environ["NPY_DISABLE_CPU_FEATURES"].split()))
for seed in (12, 17):
    graph = random_graph(3000, seed=seed)
    grouped = replay.forward(graph, registry, engine=Engine(narrow_level=0))
    single = replay.forward(graph, registry, engine=Engine(narrow_level=10**9))
    print(f"seed {seed}: grouped {'==' if same_bits(grouped, single) else '!='} node by node")
print("correctly rounded:", _correctly_rounded_bits())
"""


def _correctly_rounded_bits() -> str:
    """The sha256 of a forward and backward replay over the correctly rounded builtin ops only."""
    registry, _ = load_registry(disable_third_party=True)
    rng = np.random.default_rng(3)
    g = GraphBuilder()
    for i in range(40):
        g.leaf(float(rng.uniform(0.5, 2.0)), name=f"x{i}")
    for i in range(len(g), 3000):
        p = int(rng.integers(max(0, i - 100), i))
        if rng.random() < 0.3:
            g.add(str(rng.choice(["neg", "abs", "relu", "sqrt"])), [p])
        else:
            g.add(str(rng.choice(BINARY)), [p, int(rng.integers(0, i))])
    graph = g.build()
    values = replay.forward(graph, registry)
    grads = replay.backward(graph, registry, graph.num_nodes - 1, values)
    assert np.isfinite(values).sum() > 500
    # nan's sign and payload are not promised (numpy's SIMD loops and libm set them differently)
    canonical = np.where(np.isnan(np.concatenate([values, grads])), np.nan, np.concatenate([values, grads]))
    return hashlib.sha256(canonical.tobytes()).hexdigest()


def test_an_op_that_only_takes_arrays_still_replays_node_by_node() -> None:
    def clamp(x: np.ndarray) -> np.ndarray:
        out = x.copy()  # numpy float64 scalars have no item assignment: the engine falls back
        out[out < 0] = 0.0
        return out

    registry = OpRegistry()
    registry.register(Op("clamp", 1, clamp, lambda x, out: (np.where(x > 0, 1.0, 0.0),)), plugin="demo")
    registry.register(Op("add", 2, lambda x, y: x + y, lambda x, y, out: (1.0, 1.0)), plugin="demo")
    g = GraphBuilder()
    node = g.leaf(-10.0, name="x")
    c = g.leaf(3.0, name="c")
    for _ in range(4):  # a chain, one node per level: clamp(-7) = 0, then 3, 6, 9
        node = g.add("clamp", [g.add("add", [node, c])])
    graph = g.build()
    values = replay.forward(graph, registry)
    assert values[-1] == 9.0
    grads = replay.backward(graph, registry, graph.num_nodes - 1, values)
    assert (grads[graph.node_id("x")], grads[graph.node_id("c")]) == (0.0, 3.0)
