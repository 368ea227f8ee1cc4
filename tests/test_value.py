"""graphsvc.Value: recording, gradients (seed 004, reuse, the zero-gradient trap, a million-deep
chain), plugin ops in expressions, trace, and the round trip through a file, replay and the CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsvc
from cli import app
from graphsvc import format as fmt
from graphsvc.errors import GraphStructureError, OpError
from graphsvc.graph import Graph, OpSource
from graphsvc.ops import OpRegistry
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay
from graphsvc.testing import ulp_distance
from graphsvc.value import Value, default_registry, save, trace, zero_grad
from tests.conftest import require_compiled

runner = CliRunner()


def seed004() -> tuple[Value, Value, Value, Value]:
    """Seed 004: L = (a*b + c) * (a + b) at a=2, b=3, c=1."""
    a, b, c = Value(2.0, name="a"), Value(3.0, name="b"), Value(1.0, name="c")
    loss = (a * b + c) * (a + b)
    loss.name = "L"
    return a, b, c, loss


def needs_example_plugins() -> None:
    registry = default_registry()
    if not all(op in registry for op in ("softplus", "leaky_relu", "hypot")):
        pytest.fail("the example plugins are not installed: the README's test command installs them")


# -- what a Value records -----------------------------------------------------------------------------
def test_operators_record_the_builtin_tags_with_parents_in_order() -> None:
    a, b = Value(5.0), Value(2.0)
    cases = {
        "add": a + b,
        "sub": a - b,
        "mul": a * b,
        "div": a / b,
        "max": a.max(b),
        "min": a.min(b),
    }
    for tag, value in cases.items():
        assert (value.op, value.parents) == (tag, (a, b))
    assert [(a - b).data, (a / b).data, a.max(b).data, a.min(b).data] == [3.0, 2.5, 5.0, 2.0]
    assert ((-a).op, (-a).parents, (-a).data) == ("neg", (a,), -5.0)


def test_numbers_become_const_nodes_on_the_side_they_were_written() -> None:
    a = Value(4.0)
    for value, tag, data in [(2 - a, "sub", -2.0), (2 / a, "div", 0.5), (3 * a, "mul", 12.0), (1 + a, "add", 5.0)]:
        constant, right = value.parents
        assert (value.op, constant.op, right, value.data) == (tag, "const", a, data)
    left, constant = (a - 1).parents
    assert (left, constant.op, constant.data) == (a, "const", 1.0)


def test_pow_records_a_float_exponent_attribute() -> None:
    a = Value(3.0)
    cube = a**3
    assert (cube.op, cube.attrs, cube.data) == ("pow", {"exponent": 3.0}, 27.0)
    assert isinstance(cube.attrs["exponent"], float)
    with pytest.raises(TypeError, match="the exponent must be a number, not Value"):
        a ** Value(2.0)  # type: ignore[operator]


def test_a_times_a_keeps_two_parents() -> None:
    a = Value(3.0)
    assert (a * a).parents == (a, a)


def test_unary_methods_compute_with_python_floats() -> None:
    x = Value(0.5)
    expected = {
        "relu": 0.5,
        "tanh": math.tanh(0.5),
        "exp": math.exp(0.5),
        "log": math.log(0.5),
        "sigmoid": 1 / (1 + math.exp(-0.5)),
        "sin": math.sin(0.5),
        "cos": math.cos(0.5),
        "sqrt": math.sqrt(0.5),
        "abs": 0.5,
    }
    for tag, data in expected.items():
        value = getattr(x, tag)()
        assert (value.op, value.parents, value.data) == (tag, (x,), data)
    assert Value(-2.0).relu().data == 0.0
    assert abs(Value(-2.0)).op == "abs"


def test_ieee_results_where_python_would_raise() -> None:
    # The same values a replay computes with numpy, instead of ZeroDivisionError or a complex.
    assert (Value(1.0) / 0).data == math.inf
    assert (Value(-1.0) / 0).data == -math.inf
    assert math.isnan((Value(0.0) / 0).data)
    assert (Value(0.0) ** -1).data == math.inf
    assert math.isnan((Value(-8.0) ** (1 / 3)).data)
    assert Value(0.0).log().data == -math.inf
    assert math.isnan(Value(-1.0).log().data)
    assert math.isnan(Value(-1.0).sqrt().data)
    assert Value(1000.0).exp().data == math.inf
    assert Value(-1000.0).sigmoid().data == 0.0
    assert math.isnan(Value(math.nan).relu().data)


def test_forward_values_agree_with_a_replay() -> None:
    x, y = Value(0.7, name="x"), Value(-1.3, name="y")
    outputs = [
        x + y, x - y, x * y, x / y, -x, x**2.5, x.exp(), x.log(), x.sqrt(), x.sin(), y.cos(), y.tanh(),
        y.relu(), y.sigmoid(), y.abs(), x.max(y), x.min(y), 2 / y, 1 - x,
    ]  # fmt: skip
    graph = trace(*outputs)
    replayed = replay.forward(graph, default_registry())
    np.testing.assert_allclose(replayed, graph.values, rtol=1e-15, atol=0)


def test_unsupported_operands() -> None:
    a = Value(1.0)
    with pytest.raises(TypeError):
        a + "2"  # type: ignore[operator]
    with pytest.raises(TypeError, match="expected a Value or a number, not str"):
        a.max("2")  # type: ignore[arg-type]


def test_label_is_micrograds_lecture_spelling_of_name() -> None:
    a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    c = Value(10.0, label="c")
    e = a * b
    e.label = "e"
    d = e + c
    d.label = "d"
    assert (a.name, a.label, e.name, d.label) == ("a", "a", "e", "d")
    assert trace(d).names == {0: "a", 1: "b", 2: "e", 3: "c", 4: "d"}
    assert Value(1.0, name="x", label="x").name == "x"
    assert Value(1.0, label="").name is None  # micrograd's default label: no name
    d.label = ""
    assert d.name is None
    a.name = "renamed"
    assert a.label == "renamed"
    with pytest.raises(TypeError) as info:
        Value(1.0, name="x", label="y")
    assert str(info.value) == "Value() got name='x' and label='y': label is another spelling of name, give one"
    with pytest.raises(TypeError, match="label is another spelling of name"):
        graphsvc.Value(1.0, "x", label="")


# -- gradients ---------------------------------------------------------------------------------------
def test_seed_004_gradients_are_exact() -> None:
    a, b, c, loss = seed004()
    loss.backward()
    assert loss.data == 35.0
    assert (a.grad, b.grad, c.grad, loss.grad) == (22.0, 17.0, 5.0, 1.0)


def test_zero_gradient_trap_and_zero_grad() -> None:
    a, b, c, loss = seed004()
    loss.backward()
    loss.backward()  # the trap: gradients accumulate, as in micrograd and PyTorch
    assert (a.grad, b.grad, c.grad, loss.grad) == (44.0, 34.0, 10.0, 2.0)
    zero_grad(loss)
    assert (a.grad, b.grad, c.grad, loss.grad) == (0.0, 0.0, 0.0, 0.0)
    assert all(v.grad == 0.0 for v in loss.parents)
    loss.backward()
    assert (a.grad, b.grad, c.grad) == (22.0, 17.0, 5.0)


def test_zero_grad_resets_several_graphs() -> None:
    a, b = Value(1.0), Value(2.0)
    first, second = a * 3, b + 1
    first.backward()
    second.backward()
    zero_grad(first, second)
    assert (a.grad, b.grad, first.grad, second.grad) == (0.0, 0.0, 0.0, 0.0)


def test_a_times_a_gradient_is_two_a() -> None:
    a = Value(3.0)
    (a * a).backward()
    assert a.grad == 6.0


def test_reused_non_leaf_gets_every_contribution() -> None:
    # micrograd issue #2: y is used twice, by different nodes and twice by one node.
    x = Value(2.0)
    y = x * 3  # y = 6
    z = y * y + y  # dz/dy = 2y + 1 = 13
    w = z + z  # dw/dz = 2
    w.backward()
    assert (w.data, z.grad, y.grad, x.grad) == (84.0, 2.0, 26.0, 78.0)


def test_gradients_of_every_builtin_method() -> None:
    x, y = Value(0.5), Value(2.0)
    hand = [  # (expression, d/dx, d/dy)
        (lambda: x.tanh(), 1 - math.tanh(0.5) ** 2, 0.0),
        (lambda: x.exp(), math.exp(0.5), 0.0),
        (lambda: x.log(), 2.0, 0.0),
        (lambda: x.sqrt(), 0.5 / math.sqrt(0.5), 0.0),
        (lambda: x.sigmoid(), math.exp(-0.5) / (1 + math.exp(-0.5)) ** 2, 0.0),
        (lambda: x.sin(), math.cos(0.5), 0.0),
        (lambda: x.cos(), -math.sin(0.5), 0.0),
        (lambda: (-x).abs(), 1.0, 0.0),
        (lambda: (-x).relu(), 0.0, 0.0),
        (lambda: x / y, 0.5, -0.125),
        (lambda: x - y, 1.0, -1.0),
        (lambda: x**3, 0.75, 0.0),
        (lambda: x.max(y), 0.0, 1.0),
        (lambda: x.min(y), 1.0, 0.0),
        (lambda: x.max(0.5), 0.5, 0.0),  # a tie splits the gradient
    ]
    for expression, dx, dy in hand:
        zero_grad(x, y)
        expression().backward()
        assert (x.grad, y.grad) == (pytest.approx(dx, rel=1e-13), pytest.approx(dy, rel=1e-13))


def test_million_deep_chain_at_the_default_recursion_limit() -> None:
    assert sys.getrecursionlimit() <= 10_000  # nobody raised it for us
    x = Value(0.5, name="x")
    y = x
    for _ in range(500_000):
        y = (-y).tanh()  # two ops per step: a chain 1,000,000 deep
    y.backward()
    # d tanh(-u)/du = -(1 - tanh(-u)^2); the product over the chain is tiny but positive here.
    expected = 1.0
    u = 0.5
    for _ in range(500_000):
        t = math.tanh(-u)
        expected *= -(1 - t * t)
        u = t
    assert y.data == u
    assert x.grad == pytest.approx(expected, rel=1e-9)
    assert x.grad != 0.0


# -- plugin ops in expressions ---------------------------------------------------------------------
def test_plugin_ops_with_hand_derived_gradients() -> None:
    needs_example_plugins()
    x = Value(0.0, name="x")
    soft = x.apply("softplus")  # log(1 + e^x): log 2 at 0, slope sigmoid(0) = 1/2
    soft.backward()
    assert (soft.op, x.grad) == ("softplus", 0.5)
    assert ulp_distance(soft.data, math.log(2.0)) <= 1  # numpy's log in the plugin, libm's in math

    a, b = Value(3.0), Value(4.0)
    h = a.apply("hypot", b)  # 5; d/da = a/5, d/db = b/5
    h.backward()
    assert (h.parents, h.data, a.grad, b.grad) == ((a, b), 5.0, 0.6, 0.8)

    v = Value(-2.0)
    leaky = v.apply("leaky_relu", alpha=0.1) * 2  # 2 * 0.1 * v on the negative side
    leaky.backward()
    assert leaky.parents[0].attrs == {"alpha": 0.1}
    assert (leaky.data, v.grad) == (pytest.approx(-0.4), pytest.approx(0.2))


def test_apply_takes_numbers_and_builtin_ops() -> None:
    needs_example_plugins()
    a = Value(3.0)
    h = a.apply("hypot", 4)
    assert (h.data, h.parents[1].op) == (5.0, "const")
    product = a.apply("mul", a)
    product.backward()
    assert (product.data, a.grad) == (9.0, 6.0)


def test_apply_errors_name_the_op_at_the_call() -> None:
    x = Value(1.0)
    with pytest.raises(OpError, match=r"unknown op 'no_such_op'"):
        x.apply("no_such_op")
    with pytest.raises(OpError, match=r"op 'add' \(graphsvc .*\) takes 2 inputs, got 1 \(this value and 0 more\)"):
        x.apply("add")
    with pytest.raises(OpError, match="op 'leaf' is a leaf tag"):
        x.apply("leaf")
    with pytest.raises(OpError) as info:
        x.apply("pow", exp=2.0)
    assert str(info.value) == "op 'pow' (graphsvc 0.1.0) has no attribute 'exp' (it takes: exponent)"
    with pytest.raises(OpError) as info:
        x.apply("pow")
    assert str(info.value) == "op 'pow' (graphsvc 0.1.0) needs attribute 'exponent' (the node gives none)"


# -- trace ---------------------------------------------------------------------------------------------
def test_trace_order_is_a_depth_first_post_order() -> None:
    *_, loss = seed004()
    loss.backward()
    graph = trace(loss)
    assert [graph.op(i) for i in range(graph.num_nodes)] == ["leaf", "leaf", "mul", "leaf", "add", "add", "mul"]
    assert [graph.parents(i) for i in range(graph.num_nodes)] == [[], [], [0, 1], [], [2, 3], [0, 1], [4, 5]]
    assert graph.names == {0: "a", 1: "b", 3: "c", 6: "L"}
    assert graph.outputs == [6]
    assert graph.values.tolist() == [2.0, 3.0, 6.0, 1.0, 7.0, 5.0, 35.0]
    assert graph.grads is not None
    assert graph.grads.tolist() == [22.0, 17.0, 5.0, 5.0, 5.0, 7.0, 1.0]


def build_topo(root: Value) -> list[Value]:
    """micrograd's own build_topo (engine.py), recursive, over graphsvc's parents in order."""
    topo: list[Value] = []
    visited: set[int] = set()

    def visit(v: Value) -> None:
        if id(v) not in visited:
            visited.add(id(v))
            for child in v.parents:
                visit(child)
            topo.append(v)

    visit(root)
    return topo


@pytest.mark.parametrize("seed", range(5))
def test_trace_order_is_micrograds_build_topo_on_random_graphs(seed: int) -> None:
    """Shared leaves and inner values, x * x, unary and binary ops, several roots reaching each other."""
    rng = np.random.default_rng(seed)
    values = [Value(float(rng.uniform(0.5, 1.5))) for _ in range(6)]
    for _ in range(300):
        x, y = (values[int(i)] for i in rng.integers(0, len(values), 2))
        kind = int(rng.integers(0, 4))
        values.append(x * y if kind == 0 else x + y if kind == 1 else x.relu() if kind == 2 else x * x)
    root = values[-1]
    assert trace(root).values.tolist() == [v.data for v in build_topo(root)]
    ids = {id(v): i for i, v in enumerate(build_topo(root))}
    graph = trace(root)
    assert [graph.parents(i) for i in range(graph.num_nodes)] == [
        [ids[id(p)] for p in v.parents] for v in build_topo(root)
    ]


def test_trace_of_several_outputs_and_op_sources() -> None:
    needs_example_plugins()
    x = Value(2.0, name="x")
    y = x.apply("softplus")
    z = (x**2).apply("leaky_relu", alpha=0.2)
    graph = trace(z, y)
    assert graph.outputs == [2, 3]
    assert graph.attrs == {1: {"exponent": 2.0}, 2: {"alpha": 0.2}}
    assert graph.op_sources["softplus"] == OpSource("graphsvc-activations", "0.1.0")
    assert graph.op_sources["pow"].plugin == "graphsvc"
    assert trace(z, y).parent_indices.tolist() == graph.parent_indices.tolist()
    builtins_only, _ = load_registry(disable_third_party=True)
    traced_elsewhere = trace(z, y, registry=builtins_only)
    assert "softplus" not in traced_elsewhere.op_sources  # not claimed for graphsvc: its source is unknown
    assert traced_elsewhere.op_sources["pow"] == OpSource("graphsvc", graphsvc.__version__)
    assert trace(z, y, registry=OpRegistry()).op_sources == {}  # the registry given, even an empty one


def test_trace_rejects_one_name_on_two_values() -> None:
    a, b = Value(1.0, name="w"), Value(2.0, name="w")
    with pytest.raises(GraphStructureError, match="name 'w' is used by nodes 0 and 1"):
        trace(a + b)


# -- the round trip -----------------------------------------------------------------------------------
def expression_with_plugins() -> tuple[Value, list[Value]]:
    x, y = Value(0.5, name="x"), Value(1.5, name="y")
    z = (x.apply("softplus") * y.apply("leaky_relu", alpha=0.1)).apply("hypot", x) / (1 + y.exp())
    z.name = "z"
    return z, [x, y]


@pytest.mark.parametrize("build", ["builtin", "plugins"])
def test_round_trip_through_a_file_gives_the_same_gradients(build: str, tmp_path: Path) -> None:
    if build == "plugins":
        needs_example_plugins()
        out, leaves = expression_with_plugins()
    else:
        a, b, c, out = seed004()
        leaves = [a, b, c]
    out.backward()
    path = tmp_path / "graph.msgpack"
    save(out, path)
    graph = fmt.load(path)
    registry = default_registry()
    values = replay.forward(graph, registry)
    np.testing.assert_allclose(values, graph.values, rtol=1e-15)
    grads = replay.backward(graph, registry, replay.default_output(graph), values)
    for leaf in leaves:
        node = graph.node_id(leaf.name or "")
        assert grads[node] == pytest.approx(leaf.grad, rel=1e-14)
        assert graph.grads is not None and graph.grads[node] == leaf.grad

    result = runner.invoke(app, ["backward", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    by_name = {node["name"]: node["grad"] for node in json.loads(result.stdout)["nodes"]}
    for leaf in leaves:
        assert by_name[leaf.name] == pytest.approx(leaf.grad, rel=1e-14)


def test_save_accepts_a_value_several_values_or_a_graph(tmp_path: Path) -> None:
    a, _, _, loss = seed004()
    other = a * 10
    save([loss, other], tmp_path / "two.msgpack")
    assert fmt.load(tmp_path / "two.msgpack").outputs == [6, 8]
    graph = trace(loss)
    save(graph, tmp_path / "graph.msgpack")
    save(loss, tmp_path / "value.msgpack")
    assert (tmp_path / "graph.msgpack").read_bytes() == (tmp_path / "value.msgpack").read_bytes()
    assert isinstance(fmt.load(tmp_path / "value.msgpack"), Graph)
    with pytest.raises(TypeError, match="save\\(\\) takes a Value, a sequence of Values or a Graph, not int"):
        save(3, tmp_path / "bad.msgpack")  # type: ignore[arg-type]


# -- one table of op math: Value and a replay compute the same bits ---------------------------------
def _bits(values: np.ndarray) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()


@pytest.mark.parametrize("steps", [40, 600])  # small: numpy groups and the C loop; large: the compiled sweeps
def test_value_and_replay_agree_bit_for_bit_on_every_builtin_op(steps: int) -> None:
    """exp, log, tanh, sin, cos, pow, sigmoid and sqrt chains: Value's Python floats (libm through
    math) and a replay (the C loop and sweeps, libm) come from one table, so every value is the same
    number, not one within an ulp or two."""
    require_compiled()
    x = Value(0.3, name="x")
    outputs = []
    y = x
    for i in range(steps):
        y = (y * 1.7 + 0.05).tanh()
        y = (y.exp() + 0.5).log().sin() * y.cos()
        y = (y**2.5 + (y**2 + 1.0).sqrt()) ** (0.5 if i % 2 else 3.0)
        y = (y - 1.0).sigmoid() / (y.abs() + 1.0)
        outputs.append(y)
    graph = trace(*outputs)
    replayed = replay.forward(graph, default_registry())
    assert graph.num_nodes > (1_000 if steps > 100 else 300)
    assert _bits(replayed) == _bits(graph.values)
    assert np.isfinite(replayed).all()


def test_max_and_min_of_signed_zeros_are_numpys() -> None:
    """A tie gives the second operand, as numpy.maximum and a replay do (Value gave the first)."""
    assert math.copysign(1.0, Value(0.0).max(-0.0).data) == -1.0
    assert math.copysign(1.0, Value(-0.0).min(0.0).data) == 1.0
    assert math.isnan(Value(1.0).max(math.nan).data) and math.isnan(Value(math.nan).min(1.0).data)


def test_a_square_is_correctly_rounded() -> None:
    """x ** 2 is x * x (as numpy's array power computes it), not libm's pow, one ulp off here."""
    x = -1.3275170599102342
    assert (Value(x) ** 2).data == x * x == 1.7623015443527121
