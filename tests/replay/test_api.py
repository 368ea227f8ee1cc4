"""graphsvc.forward and graphsvc.backward: replay from Python without a registry, on seed 004's
L = (a*b + c)*(a + b) at a=2, b=3, c=1, with gradients worked out by hand."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import graphsvc
from graphsvc import format as fmt
from graphsvc.errors import OpError, UsageError
from graphsvc.graph import Graph, GraphBuilder, OpSource
from graphsvc.ops import OpRegistry
from graphsvc.pluginhost import PluginProblem, load_registry
from graphsvc.replay import arrays as tensors
from graphsvc.replay import compare as checks
from graphsvc.replay.run import comparisons, nonfinite_findings, output_node, replay_values, replayed_graph
from tests.conftest import ROOT

SEED004 = ROOT / "examples" / "seed004.msgpack"


def seed004() -> Graph:
    return graphsvc.load(SEED004)


def test_output_node_is_the_node_asked_for_or_the_single_output() -> None:
    graph = seed004()
    assert (output_node(graph, None), output_node(graph, "abc"), output_node(graph, 2)) == (6, 4, 2)
    b = GraphBuilder()
    b.leaf(1.0, name="x"), b.leaf(2.0, name="y")
    with pytest.raises(UsageError, match=r"^the graph has 2 outputs \(x, y\): choose one with --output$"):
        output_node(b.build(), None, "--output")


def test_backward_gives_seed_004s_gradients() -> None:
    graph = graphsvc.backward(seed004())
    # dL/da = b(a+b) + (ab+c) = 15 + 7; dL/db = a(a+b) + (ab+c) = 10 + 7; dL/dc = a+b
    assert [graph.grad(name) for name in "abc"] == [22.0, 17.0, 5.0]
    assert (graph.grad("L"), graph.grad("abc"), graph.grad("apb"), graph.grad(3)) == (1.0, 5.0, 7.0, 5.0)
    assert graph.value("L") == 35.0 and isinstance(graph.value("L"), float)


def test_set_changes_leaves_before_the_replay() -> None:
    graph = graphsvc.backward(seed004(), set={"c": 2.0, 0: 1.0})  # a=1, b=3, c=2
    # L = (3 + 2) * 4 = 20; dL/da = 3*4 + 5 = 17; dL/db = 1*4 + 5 = 9; dL/dc = 4
    assert graph.value("L") == 20.0
    assert [graph.grad(name) for name in "abc"] == [17.0, 9.0, 4.0]
    assert graphsvc.forward(seed004(), {"a": 3}).values.tolist() == [3.0, 3.0, 1.0, 9.0, 10.0, 6.0, 60.0]


def test_output_by_name_or_id() -> None:
    by_name = graphsvc.backward(seed004(), output="abc")  # abc = a*b + c
    assert by_name.grads is not None
    assert by_name.grads.tolist() == [3.0, 2.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert graphsvc.backward(seed004(), output=5).grads.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # type: ignore[union-attr]


def test_the_input_graph_is_not_changed() -> None:
    graph = seed004()
    values, grads = graph.values.copy(), graph.grads.copy()  # type: ignore[union-attr]
    sources = dict(graph.op_sources)
    result = graphsvc.backward(graph, set={"a": 10.0})
    assert result is not graph
    assert result.value("a") == 10.0
    assert np.array_equal(graph.values, values) and np.array_equal(graph.grads, grads)  # type: ignore[arg-type]
    assert graph.op_sources == sources
    result.op_codes[0] = 1  # the copy's columns are its own
    assert graph.op_codes[0] == 0


def test_the_engine_given_runs_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine=`` picks the compiled kernels even for a graph of 7 nodes, or the references; the
    numbers are the same."""
    from graphsvc.native import REFERENCE, Engine
    from tests.conftest import require_compiled

    jit = require_compiled()
    calls: list[str] = []
    for name in ("forward_all_primitives", "backward_primitives"):
        kernel = getattr(jit, name)
        monkeypatch.setattr(jit, name, lambda *args, name=name, kernel=kernel: calls.append(name) or kernel(*args))
    compiled = graphsvc.backward(seed004(), engine=Engine(jit))
    assert calls == ["forward_all_primitives", "backward_primitives"]
    assert graphsvc.forward(seed004(), {"a": 3}, engine=Engine(jit)).values.tolist() == [3, 3, 1, 9, 10, 6, 60]
    assert calls[2:] == ["forward_all_primitives"]
    reference = graphsvc.backward(seed004(), engine=REFERENCE)
    assert graphsvc.forward(seed004(), engine=REFERENCE).values.tolist() == reference.values.tolist()
    assert len(calls) == 3  # the references ran no kernel
    assert [compiled.grad(name) for name in "abc"] == [reference.grad(name) for name in "abc"] == [22.0, 17.0, 5.0]
    assert compiled.values.tolist() == reference.values.tolist() == [2.0, 3.0, 1.0, 6.0, 7.0, 5.0, 35.0]


def test_a_replay_resolves_its_ops_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward then backward (with or without the steps, scalars or tensors) resolve the ops, and
    check every node's attributes against its op, once: the backward pass takes the forward's."""
    from graphsvc.replay import columns as replay

    calls: list[int] = []
    resolve = replay.resolve_ops
    monkeypatch.setattr(
        replay, "resolve_ops", lambda graph, *args: calls.append(graph.num_nodes) or resolve(graph, *args)
    )
    from graphsvc.value import default_registry

    registry = default_registry()
    b = GraphBuilder()
    b.add("pow", [b.leaf(3.0, name="x")], attrs={"exponent": 2.0}, name="y")
    graph = b.build()
    for steps in (False, True):
        run = replay_values(graph, registry, {}, graph.node_id("y"), steps=steps)
        assert (run.values.tolist(), run.grads.tolist()) == ([3.0, 9.0], [6.0, 1.0])  # type: ignore[union-attr]
    tensor_run = replay_values(graph, registry, {0: np.array(3.0)}, 1)  # an array: the tensor engine
    assert (tensor_run.arrays, tensor_run.grads[0].tolist()) == (True, 6.0)  # type: ignore[index]
    assert calls == [2, 2, 2]
    assert graphsvc.backward(graph, output="y").grad("x") == 6.0
    assert calls == [2, 2, 2, 2]


def test_a_tensor_replay_finds_the_outputs_ancestors_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward pass keeps residuals for the output's ancestors; the backward pass sweeps the same
    nodes: found once."""
    from graphsvc import topo

    calls: list[int] = []
    found = topo.ancestors

    def counted_ancestors(graph: Graph, output: int, *args: object) -> np.ndarray:
        calls.append(output)
        return found(graph, output, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(topo, "ancestors", counted_ancestors)
    monkeypatch.setattr(tensors, "ancestors", counted_ancestors)
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, 2.0]), name="x")
    b.add("sum", [b.add("mul", [x, x])], name="loss")
    graph = b.build()
    assert graphsvc.backward(graph, output="loss").grad("x").tolist() == [2.0, 4.0]  # type: ignore[union-attr]
    assert calls == [graph.node_id("loss")]


def test_a_compiled_replay_reads_the_primitives_parameters_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """pow's exponent, read node by node for the compiled kernels, is read once for both passes."""
    import math

    from graphsvc.native import Engine
    from graphsvc.replay import columns as replay
    from graphsvc.value import default_registry
    from tests.conftest import require_compiled

    compiled = Engine(require_compiled())
    calls: list[int] = []
    params = replay._primitive_params
    monkeypatch.setattr(replay, "_primitive_params", lambda graph, table: calls.append(1) or params(graph, table))
    b = GraphBuilder()
    x = b.leaf(3.0, name="x")
    b.add("tanh", [b.add("pow", [x], attrs={"exponent": 2.0})], name="y")
    graph = b.build()
    for steps in (False, True):
        run = replay_values(graph, default_registry(), {}, graph.node_id("y"), steps=steps, engine=compiled)
        assert run.grads[0] == 6.0 * (1.0 - math.tanh(9.0) ** 2)  # type: ignore[index]
    assert calls == [1, 1]


def test_forward_drops_the_old_gradients() -> None:
    graph = graphsvc.forward(seed004(), set={"b": 0.0})
    assert graph.grads is None
    assert graph.value("L") == 2.0  # (0 + 1) * 2
    with pytest.raises(UsageError, match=r"^the graph holds no gradients, so node b has none: replay it with "):
        graph.grad("b")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda g: graphsvc.forward(g, set={"ab": 1.0}),
            UsageError,
            "node ab is a mul node, not a leaf: only leaves can be set",
        ),
        (
            lambda g: graphsvc.backward(g, set={"nope": 1.0}),
            UsageError,
            "no node named 'nope' (the leaves: a, b, c)",
        ),
        (lambda g: graphsvc.backward(g, set={7: 1.0}), UsageError, "no node with id 7 (the graph has 7 nodes)"),
        (lambda g: graphsvc.backward(g, output="nope"), UsageError, "no node named 'nope' (the outputs: L)"),
        (
            lambda g: graphsvc.backward(g, output="ll"),
            UsageError,
            "no node named 'll'; did you mean 'L'? (the outputs: L)",
        ),
        (lambda g: graphsvc.forward(g, set={"a": 1.0, 0: 2.0}), UsageError, "set gives node a two values"),
        (lambda g: graphsvc.forward(g, set={"a": "3"}), TypeError, "set['a'] must be a number or an array, not str"),
        (
            lambda g: graphsvc.backward(g, output=1.5),
            TypeError,
            "a node is given by its id (an int) or its name (a str), not float",
        ),
        (lambda g: g.value("nope"), UsageError, "no node named 'nope'"),
        (lambda g: g.grad("B"), UsageError, "no node named 'B'; did you mean 'b'?"),
    ],
)
def test_errors(call, error: type[Exception], message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call(seed004())
    assert str(info.value) == message


def test_several_outputs_need_output() -> None:
    b = GraphBuilder()
    x = b.leaf(2.0, name="x")
    b.add("neg", [x], name="y")
    b.add("exp", [x], name="z\n")
    graph = b.build()
    with pytest.raises(UsageError) as info:
        graphsvc.backward(graph)
    assert str(info.value) == "the graph has 2 outputs (y, z\\n): choose one with output="
    assert graphsvc.backward(graph, output="y").grad("x") == -1.0
    graph.outputs = []
    with pytest.raises(UsageError, match=r"^the graph lists no outputs: choose one with output=$"):
        graphsvc.backward(graph)


def test_an_op_not_registered_is_an_op_error() -> None:
    with pytest.raises(OpError) as info:
        graphsvc.backward(seed004(), registry=OpRegistry())
    assert str(info.value) == (
        "the graph uses ops not registered here: mul (from graphsvc 0.1.0), add (from graphsvc 0.1.0); "
        "install the plugin that provides them"
    )


def test_the_result_records_the_plugin_of_each_op_it_used(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(0.0, name="x")
    b.add("softplus", [b.add("mul", [x, b.const(2.0)])], name="y")
    b.op_sources["mul"] = OpSource("someone", "9")  # a source the file records is kept
    graph = b.build()
    registry, _ = load_registry()
    if "softplus" not in registry:
        pytest.fail("the example plugins are not installed: the README's test command installs them")
    result = graphsvc.backward(graph)
    softplus = registry.get("softplus")
    assert result.op_sources == {
        "leaf": OpSource("graphsvc", graphsvc.__version__),
        "const": OpSource("graphsvc", graphsvc.__version__),
        "mul": OpSource("someone", "9"),
        "softplus": OpSource(softplus.plugin, softplus.plugin_version),
    }
    assert result.grad("x") == 1.0  # d softplus(2x)/dx at 0 = 2 * sigmoid(0)
    assert graph.op_sources == {"mul": OpSource("someone", "9")}
    fmt.save(result, tmp_path / "r.msgpack")
    assert graphsvc.load(tmp_path / "r.msgpack").op_sources == result.op_sources


def test_replayed_graph_is_what_the_cli_writes() -> None:
    graph = seed004()
    graph.op_sources = {}
    registry, _ = load_registry(disable_third_party=True)
    values = np.arange(7, dtype=np.float64)
    result = replayed_graph(graph, registry, values)
    assert result.values is values and result.grads is None
    assert set(result.op_sources) == {"leaf", "mul", "add"}


def square_sum() -> Graph:
    """loss = sum(w * w), w a 2x2 leaf: a tensor graph, which the tensor engine replays."""
    b = graphsvc.GraphBuilder()
    w = b.leaf(np.zeros((2, 2)), name="w")
    b.add("sum", [b.add("mul", [w, w], name="sq")], name="loss")
    return b.build()


def test_a_run_of_either_engine_makes_its_replayed_graph() -> None:
    registry, _ = load_registry(disable_third_party=True)
    graph = seed004()
    graph.op_sources = {}
    scalar = replay_values(graph, registry, {0: 1.0}, 6)  # a=1; b=3 and c=1 as stored
    assert not scalar.arrays
    result = scalar.replayed()
    assert result.values is scalar.values and result.grads is scalar.grads  # the columns themselves, no copy
    # L = (1*3 + 1)*(1 + 3) = 16; dL/da = 3*4 + 4 = 16; dL/db = 1*4 + 4 = 8; dL/dc = 4
    assert result.values.tolist() == [1.0, 3.0, 1.0, 3.0, 4.0, 4.0, 16.0]
    assert [result.grad(name) for name in "abc"] == [16.0, 8.0, 4.0]
    assert set(result.op_sources) == {"leaf", "mul", "add"} and graph.op_sources == {}

    graph = square_sum()
    w = np.array([[1.0, 2.0], [3.0, 4.0]])
    tensor = replay_values(graph, registry, {0: w}, 2)
    assert tensor.arrays and isinstance(tensor.values, list)
    result = tensor.replayed()
    assert result.value("loss") == 30.0 and isinstance(result.value("loss"), float)  # a 0-d result: the column
    assert result.grad("w").tolist() == [[2.0, 4.0], [6.0, 8.0]]  # type: ignore[union-attr]
    assert result.value("sq").tolist() == [[1.0, 4.0], [9.0, 16.0]]  # type: ignore[union-attr]
    assert set(result.op_sources) == {"leaf", "mul", "sum"}


def test_the_first_nan_or_inf_is_found_by_the_engine_that_ran() -> None:
    values = np.array([1.0, np.inf, 2.0, -np.inf])
    grads = np.array([-np.inf, 0.5, np.inf, 1.0])
    assert nonfinite_findings(False, values, grads) == {
        "values": checks.NonFinite("values", 1, np.inf, 2),  # values: the lowest id, which forward meets first
        "grads": checks.NonFinite("grads", 2, np.inf, 2),  # gradients: the highest, which backward meets first
    }
    assert nonfinite_findings(False, values[[0, 2]], None) == {"values": None}  # forward: no "grads"

    arrays = [np.array([1.0, 2.0]), None, np.array([[0.0, 1.0], [-np.inf, np.inf]]), np.array([np.inf])]
    grad_arrays = [np.array([np.inf, 1.0]), None, np.zeros((2, 2)), np.array([1.0])]
    assert nonfinite_findings(True, arrays, grad_arrays) == {
        "values": checks.NonFinite("values", 2, -np.inf, 2, (1, 0)),  # its first element in C order
        "grads": checks.NonFinite("grads", 0, np.inf, 1, (0,)),
    }
    assert nonfinite_findings(True, arrays[:2], None) == {"values": None}


def test_a_run_is_compared_with_the_stored_numbers_by_the_engine_that_ran() -> None:
    graph = seed004()  # stores values [2, 3, 1, 6, 7, 5, 35] and gradients [22, 17, 5, 5, 5, 7, 1]
    values, grads = graph.values.copy(), graph.grads.copy()  # type: ignore[union-attr]
    values[4] += 0.5  # abc off by 0.5 (relative 0.5/7)
    grads[1] = np.nan  # replayed a nan where the file has 17: an infinite difference
    values_check, grads_check = comparisons(False, graph, values, grads, 1e-9, 1e-12)
    f64 = (("float64", checks.Tolerance(1e-9, 1e-12)),)
    assert values_check == checks.Comparison("values", 0.5, (4, ()), 0.5 / 7, (4, ()), 1, 0, 7, f64)
    assert grads_check == checks.Comparison("grads", np.inf, (1, ()), np.inf, (1, ()), 1, 0, 7, f64)
    assert (values_check.worst_abs_node, grads_check.worst_rel_node) == (4, 1)
    graph.grads = None  # a file without gradients: only the values are compared
    assert [c.what for c in comparisons(False, graph, values, grads, 1e-9, 1e-12)] == ["values"]

    registry, _ = load_registry(disable_third_party=True)
    plain = square_sum()
    run = replay_values(plain, registry, {0: np.array([[1.0, 2.0], [3.0, 4.0]])}, 2)
    stored = run.replayed()  # the file: w, sq = w*w, loss = 30 and their gradients
    arrays = [array.copy() for array in run.values]
    arrays[1][1, 0] = 9.25  # sq[1,0] off by 0.25 (relative 0.25/9)
    values_check, grads_check = comparisons(True, stored, arrays, run.grads, 1e-9, 1e-12)
    assert values_check == checks.Comparison("values", 0.25, (1, (1, 0)), 0.25 / 9, (1, (1, 0)), 1, 0, 3, f64)
    assert grads_check == checks.Comparison("grads", 0.0, (0, (0, 0)), 0.0, (0, (0, 0)), 0, 0, 3, f64)


def test_a_run_of_scalars_never_loads_the_tensor_engine() -> None:
    code = (
        "import sys, graphsvc\n"
        "from graphsvc.replay.run import replay_values\n"
        "from graphsvc.pluginhost import load_registry\n"
        "registry, _ = load_registry(disable_third_party=True)\n"
        "graph = graphsvc.load('examples/seed004.msgpack')\n"
        "run = replay_values(graph, registry, {}, 6, steps=True, find_nonfinite=True, check=(1e-9, 1e-12))\n"
        "run.replayed()\n"
        "print(run.arrays, [c.ok for c in run.comparisons], run.nonfinite, 'graphsvc.replay.arrays' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert (done.stdout, done.stderr) == ("False [True, True] {'values': None, 'grads': None} False\n", "")


def test_plugin_problems_are_one_line_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphsvc.pluginhost as plugins

    def broken(*args: object, **kwargs: object) -> tuple[OpRegistry, list[PluginProblem]]:
        registry, _ = load_registry(disable_third_party=True)
        return registry, [PluginProblem("bad_plugin", "failed\nto import")]

    monkeypatch.setattr(plugins, "load_registry", broken)
    monkeypatch.setattr(plugins, "_registry", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert graphsvc.backward(seed004()).grad("a") == 22.0
    assert [str(w.message) for w in caught] == ["plugin bad_plugin: failed\\nto import"]
    assert caught[0].category is RuntimeWarning
    monkeypatch.setattr(plugins, "_registry", None)  # the next user loads the real one


def test_import_graphsvc_stays_lazy() -> None:
    code = "import sys, graphsvc; print('numpy' in sys.modules, {'forward', 'backward'} <= set(graphsvc.__all__))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "False True\n"
    assert graphsvc.forward is graphsvc.replay.run.forward and graphsvc.backward is graphsvc.replay.run.backward


def test_set_takes_a_big_endian_or_fortran_ordered_array_as_a_graph_does() -> None:
    b = graphsvc.GraphBuilder()
    w = b.leaf(np.zeros((2, 2)), name="w")
    b.add("sum", [b.add("mul", [w, w], name="sq")], name="loss")
    graph = b.build()
    big_endian = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=">f8")
    fortran = np.asfortranarray(np.array([[1.0, 2.0], [3.0, 4.0]]))
    for given in (big_endian, fortran):
        replayed = graphsvc.backward(graph, output="loss", set={"w": given})
        assert replayed.value("loss") == 30.0
        assert replayed.grad("w").tolist() == [[2.0, 4.0], [6.0, 8.0]]  # type: ignore[union-attr]
    with pytest.raises(TypeError, match=r"^set\['w'\] must be an array of float64, float32 or int64, not float16$"):
        graphsvc.backward(graph, output="loss", set={"w": np.zeros((2, 2), dtype=np.float16)})
    with pytest.raises(UsageError, match=r"^set w: an array of 33 dimensions, more than 32$"):
        graphsvc.backward(graph, output="loss", set={"w": np.zeros((1,) * 33)})  # a Graph holds 32 at most


def test_a_number_set_on_an_int64_leaf_stays_an_integer() -> None:
    b = graphsvc.GraphBuilder()
    x = b.leaf(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), name="x")
    picks = b.leaf(np.array([0, 2]), name="picks")
    b.add("sum", [b.add("take", [x, picks], attrs={"axis": 0})], name="loss")
    graph = b.build()
    for given in (2, 2.0, np.int64(2)):
        replayed = graphsvc.forward(graph, set={"picks": given})
        assert replayed.value("loss") == 11.0  # take row 2: 5 + 6
        assert replayed.value("picks").dtype == np.int64  # type: ignore[union-attr]
    with pytest.raises(UsageError) as info:
        graphsvc.forward(graph, set={"picks": 2.5})
    assert str(info.value) == "set picks: 2.5 is not a whole number, and the leaf holds int64"
    with pytest.raises(UsageError) as info:
        graphsvc.forward(graph, set={"picks": 2**63})
    assert str(info.value) == "set picks: 9,223,372,036,854,775,808 is out of int64's range, and the leaf holds int64"


def test_a_number_beyond_float64_on_a_float_leaf_is_one_usage_error() -> None:
    """Python refuses to round an integer of hundreds of digits (or such a Fraction) to a float: the
    words say so, instead of Python's OverflowError escaping."""
    from fractions import Fraction

    b = graphsvc.GraphBuilder()
    b.add("neg", [b.leaf(2.0, name="x")], name="y")
    graph = b.build()
    cases = [
        (10**400, "an integer of 401 digits"),
        (-(10**5000), "an integer of 5,001 digits"),
        (Fraction(10**400, 3), "a Fraction"),
    ]
    for given, shown in cases:
        with pytest.raises(UsageError) as info:
            graphsvc.forward(graph, set={"x": given})
        assert str(info.value) == f"set x: {shown} is out of float64's range"
    assert graphsvc.forward(graph, set={"x": 10**300}).value("y") == -1e300


def test_a_number_beyond_int64_on_an_int64_leaf_is_one_bounded_usage_error() -> None:
    """However large the number, the words say it is out of int64's range: an infinity (what the CLI
    passes for an integer literal past float's range) is not called "not a whole number", and an
    integer of thousands of digits is counted, not written out (nor refused by Python's limit on
    converting integers to text)."""
    from fractions import Fraction

    b = graphsvc.GraphBuilder()
    x = b.leaf(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), name="x")
    picks = b.leaf(np.array([0, 2]), name="picks")
    b.add("sum", [b.add("take", [x, picks], attrs={"axis": 0})], name="loss")
    graph = b.build()
    cases = [
        (float("inf"), "inf"),
        (-float("inf"), "-inf"),
        (1e300, "1e+300"),
        (10**30 - 1, "999,999,999,999,999,999,999,999,999,999"),
        (10**30, "an integer of 31 digits"),
        (-(10**400), "an integer of 401 digits"),
        (10**5000 - 1, "an integer of 5,000 digits"),
        (Fraction(10**400, 3), "a Fraction"),  # past float's range: Python's OverflowError escaped before
    ]
    for given, shown in cases:
        with pytest.raises(UsageError) as info:
            graphsvc.forward(graph, set={"picks": given})
        assert str(info.value) == f"set picks: {shown} is out of int64's range, and the leaf holds int64"
    with pytest.raises(UsageError) as info:
        graphsvc.forward(graph, set={"picks": float("nan")})
    assert str(info.value) == "set picks: nan is not a whole number, and the leaf holds int64"


# -- misuse: a TypeError naming what was wrong, not an AttributeError from deep inside ---------------
MISUSES = [
    (
        lambda g: graphsvc.forward(g, set=[("a", 1.0)]),
        "set must be a mapping of node (id or name) to a number or an array, such as {'a': 3.0}, not list",
    ),
    (
        lambda g: graphsvc.backward(g, set="a=1"),
        "set must be a mapping of node (id or name) to a number or an array, such as {'a': 3.0}, not str",
    ),
    (
        lambda g: graphsvc.forward(str(SEED004)),
        "forward() takes a Graph, not str: load the file first, graphsvc.load(path)",
    ),
    (
        lambda g: graphsvc.backward(SEED004),
        "backward() takes a Graph, not PosixPath: load the file first, graphsvc.load(path)",
    ),
    (lambda g: graphsvc.backward(None), "backward() takes a Graph, not NoneType"),
    (
        lambda g: graphsvc.dumps(str(SEED004)),
        "dumps() takes a Graph, not str: load the file first, graphsvc.load(path)",
    ),
    (
        lambda g: fmt.save(SEED004.read_bytes(), "out.msgpack"),
        "save() takes a Graph, not bytes: decode it first, graphsvc.loads(data)",
    ),
    (
        lambda g: graphsvc.reverse_topological_order(str(SEED004)),
        "reverse_topological_order() takes a Graph, not str: load the file first, graphsvc.load(path)",
    ),
    (lambda g: graphsvc.load(g), "load() takes a path or a binary stream, not Graph"),
    (lambda g: graphsvc.forward(g, registry=42), "registry must be an OpRegistry, not int"),
    (lambda g: graphsvc.backward(g, registry=42), "registry must be an OpRegistry, not int"),
    (
        lambda g: graphsvc.backward(g, registry=load_registry(disable_third_party=True)),
        "registry must be an OpRegistry, not tuple: graphsvc.load_registry() returns a pair, "
        "registry, problems = graphsvc.load_registry()",
    ),
    (lambda g: graphsvc.use_registry(42), "registry must be an OpRegistry, not int"),
    (lambda g: graphsvc.trace(graphsvc.Value(1.0), registry="builtins"), "registry must be an OpRegistry, not str"),
    (lambda g: graphsvc.zero_grad("x"), "zero_grad() takes Values, not str"),
    (
        lambda g: graphsvc.load_registry("my_ops.py"),
        "extra must be a list of module names or paths of .py files, such as ['my_ops.py'], not str",
    ),
    (lambda g: graphsvc.load_registry([42]), "extra must hold module names or paths of .py files, not int"),
    (
        lambda g: graphsvc.reverse_topological_order(g, output=[1]),
        "a node is given by its id (an int) or its name (a str), not list",
    ),
]


@pytest.mark.parametrize(("call", "message"), MISUSES, ids=[message[:40] for _, message in MISUSES])
def test_a_misuse_of_the_api_is_a_type_error_naming_it(
    call: object, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They raised AttributeError ('list' object has no attribute 'items', 'str' object has no
    attribute 'num_nodes'), "argument of type 'int' is not iterable", or were taken (use_registry(42))."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as info:
        call(seed004())  # type: ignore[operator]
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []
    graphsvc.use_registry(None)


def test_reverse_topological_order_takes_the_output_by_id_or_name_and_refuses_another_node() -> None:
    """output=-1 gave [-1] and output=99 an IndexError (bytearray index out of range)."""
    graph = seed004()
    assert graphsvc.reverse_topological_order(graph, output="apb").tolist() == [5, 1, 0]
    assert graphsvc.reverse_topological_order(graph, output=5).tolist() == [5, 1, 0]
    for output in (-1, 99):
        with pytest.raises(UsageError) as info:
            graphsvc.reverse_topological_order(graph, output=output)
        assert str(info.value) == f"no node with id {output} (the graph has 7 nodes)"


def test_load_registry_takes_paths_as_well_as_names(tmp_path: Path) -> None:
    path = tmp_path / "empty_plugin.py"
    path.write_text("", encoding="utf-8")
    registry, problems = load_registry([path])
    assert "add" in registry and [p.plugin for p in problems] == [str(path)]  # no hook: a problem, named


def test_check_replayable_raises_what_a_replay_raises_before_it_runs(registry: OpRegistry) -> None:
    from graphsvc.errors import MissingOpsError
    from graphsvc.replay.run import check_replayable

    check_replayable(seed004(), registry)  # nothing wrong: nothing raised
    b = GraphBuilder()
    b.add("ad", [b.leaf(1.0, name="x"), b.leaf(2.0)], name="y")
    with pytest.raises(MissingOpsError) as raised:
        check_replayable(b.build(), registry, "f.json")
    assert str(raised.value) == (
        "f.json: a valid graph file, but it cannot be replayed here: the graph uses an op not registered here: "
        "ad (plugin unknown; did you mean 'add'?)"
    )
    assert raised.value.install_hint is False  # kept: the CLI adds no "pass --plugin" to a likely misspelling
    b = GraphBuilder()
    b.add("neg", [b.leaf(1.0, name="x"), b.leaf(2.0)], name="y")
    with pytest.raises(OpError) as raised:
        check_replayable(b.build(), registry)
    assert str(raised.value) == (
        "a valid graph, but it cannot be replayed here: node y: op neg takes 1 input but the node has 2 parents"
    )
    with pytest.raises(TypeError):
        check_replayable("f.json", registry)  # type: ignore[arg-type]


def test_set_refuses_a_number_past_float64s_range_and_takes_inf() -> None:
    """As GraphBuilder does: an integer too large for a float is refused, not rounded to inf; inf
    given as inf is a value."""
    graph = graphsvc.load(SEED004)
    with pytest.raises(UsageError, match=r"^set a: an integer of 401 digits is out of float64's range$"):
        graphsvc.forward(graph, set={"a": 10**400})
    assert graphsvc.forward(graph, set={"a": math.inf}).value("a") == math.inf


# -- --set NAME=FILE.npy: what was opened decides, and its first bytes -----------------------------
def _refused_within(seconds: float, call: Callable[[], object]) -> BaseException:
    """The exception ``call`` raises, which it must raise within ``seconds`` (run in a thread: a
    FIFO that is waited for would otherwise hang the test run)."""
    import threading

    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "it blocked"
    assert len(raised) == 1
    return raised[0]


def test_a_fifo_given_as_the_npy_file_is_refused_at_once(tmp_path: Path) -> None:
    from graphsvc.replay.run import read_npy

    fifo = tmp_path / "w.npy"
    os.mkfifo(fifo)
    refused = _refused_within(5, lambda: read_npy("w", str(fifo)))
    assert (type(refused), str(refused)) == (UsageError, f"--set w: {fifo} is not a regular file")


def test_a_fifo_swapped_in_after_the_path_looked_like_a_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of a check of the path, then an open of it: here every look at the path says it is
    a regular file (as it was a moment before), and it is a FIFO when opened. Only the opened
    descriptor's fstat decides, so it is refused at once, never waited for."""
    from graphsvc.replay.run import read_npy

    regular = tmp_path / "regular"
    regular.write_bytes(b"x")
    fifo = tmp_path / "w.npy"
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(
        os, "stat", lambda path, *a, **k: real_stat(regular if str(path) == str(fifo) else path, *a, **k)
    )
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    refused = _refused_within(5, lambda: read_npy("w", str(fifo)))
    assert (type(refused), str(refused)) == (UsageError, f"--set w: {fifo} is not a regular file")


@pytest.mark.parametrize("head", [b"\x00", b"\x93NUMPY\x00\x00", b"PK\x03\x04"])
def test_a_huge_npy_file_whose_first_bytes_rule_it_out_is_refused_from_them(tmp_path: Path, head: bytes) -> None:
    """3 GB, sparse: refused in a subprocess whose peak memory stays small (VmHWM, the peak of the
    process's own address space: getrusage's ru_maxrss keeps the peak of the parent it was forked
    from, a test worker of a gigabyte)."""
    path = tmp_path / "w.npy"
    path.write_bytes(head)
    os.truncate(path, 3 << 30)
    script = (
        "import sys\n"
        "from graphsvc.replay.run import read_npy\n"
        "try:\n"
        "    read_npy('w', sys.argv[1])\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1].split()\n"
        "print(int(status[0]) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    message, peak_mib = done.stdout.splitlines()
    assert message == f"--set w: {path} is not a .npy file of numbers (without pickled objects)"
    assert int(peak_mib) < 300


def test_a_npy_file_declaring_more_data_than_it_holds_is_refused_from_its_header(tmp_path: Path) -> None:
    from graphsvc.replay.run import read_npy

    path = tmp_path / "w.npy"
    np.save(path, np.zeros(4))
    data = path.read_bytes()
    path.write_bytes(data.replace(b"(4,)", b"(9,)"))  # the same header length: 72 bytes declared, 32 held
    with pytest.raises(UsageError) as refused:
        read_npy("w", str(path))
    assert str(refused.value) == f"--set w: {path} is truncated: its header declares 72 bytes of data, it holds 32"
    path.write_bytes(data)
    assert read_npy("w", str(path)).tolist() == [0.0] * 4
