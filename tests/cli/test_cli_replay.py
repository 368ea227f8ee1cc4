"""The replay commands: backward and forward, from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder, OpSource
from tests.conftest import EXAMPLES, run_cli

runner = CliRunner()


run = run_cli


def test_backward_prints_every_node_with_its_gradient() -> None:
    code, out, err = run("backward", str(EXAMPLES / "seed004.msgpack"))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "6\tL\tmul\t4,5\t35.0\t1.0",
        "5\tapb\tadd\t0,1\t5.0\t7.0",
        "4\tabc\tadd\t3,2\t7.0\t5.0",
        "3\tab\tmul\t0,1\t6.0\t5.0",
        "2\tc\tleaf\t-\t1.0\t5.0",
        "1\tb\tleaf\t-\t3.0\t17.0",
        "0\ta\tleaf\t-\t2.0\t22.0",
    ]


def test_backward_steps_draw_the_pass_as_the_seeds_do() -> None:
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--steps")
    assert code == 0
    assert out.splitlines()[:8] == [
        "step 1: L (mul) grad = 1.0",
        "  -> abc: local derivative 5.0, adds 5.0",
        "  -> apb: local derivative 7.0, adds 7.0",
        "step 2: apb (add) grad = 7.0",
        "  -> a: local derivative 1.0, adds 7.0",
        "  -> b: local derivative 1.0, adds 7.0",
        "step 3: abc (add) grad = 5.0",
        "  -> ab: local derivative 1.0, adds 5.0",
    ]
    assert "step 7: a (leaf) grad = 22.0" in out.splitlines()


def test_backward_json_lists_nodes_in_reverse_topological_order() -> None:
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["output"] == 6
    assert [n["name"] for n in doc["nodes"]] == ["L", "apb", "abc", "ab", "c", "b", "a"]
    assert doc["nodes"][-1] == {"id": 0, "name": "a", "op": "leaf", "parents": [], "value": 2.0, "grad": 22.0}


def test_set_changes_the_replayed_result() -> None:
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--set", "a=3", "--json")
    assert code == 0
    nodes = {n["name"]: n for n in json.loads(out)["nodes"]}
    assert (nodes["L"]["value"], nodes["a"]["grad"], nodes["b"]["grad"], nodes["c"]["grad"]) == (60.0, 28.0, 28.0, 6.0)


def test_check_passes_on_the_shipped_examples() -> None:
    for name in ("seed000", "seed002", "seed004", "square", "max_gate"):
        code, out, _ = run("backward", str(EXAMPLES / f"{name}.msgpack"), "--check")
        assert code == 0, out
        assert out.splitlines()[-1].endswith(": ok")


def test_check_fails_with_exit_1_and_names_the_worst_node() -> None:
    # c=2: abc 8 (was 7), L 40 (was 35); dL/dapb = abc = 8 (was 7), dL/da = 3*5 + 8 = 23 (was 22),
    # dL/db = 2*5 + 8 = 18 (was 17). Ties in the abs diff go to the lowest id (a).
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--check", "--set", "c=2")
    assert code == 1
    assert out.splitlines()[-2:] == [
        "check values (float64: rtol 1e-9, atol 1e-12)"
        ": worst abs diff 5.0 at L, worst rel diff 1.0 at c: 3 beyond tolerance",
        "check grads (float64: rtol 1e-9, atol 1e-12)"
        ": worst abs diff 1.0 at a, worst rel diff 0.14285714285714285 at apb: 3 beyond tolerance",
    ]


@pytest.mark.parametrize("command", ["forward", "backward"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--rtol", "-1"], "--rtol must be a finite number, 0 or more, not -1.0"),
        (["--rtol", "nan"], "--rtol must be a finite number, 0 or more, not nan"),
        (["--rtol", "inf"], "--rtol must be a finite number, 0 or more, not inf"),
        (["--atol", "-5"], "--atol must be a finite number, 0 or more, not -5.0"),
        (["--atol", "inf"], "--atol must be a finite number, 0 or more, not inf"),
        (["--atol", "-inf"], "--atol must be a finite number, 0 or more, not -inf"),
    ],
)
def test_a_tolerance_that_is_negative_nan_or_inf_is_a_usage_error(
    tmp_path: Path, command: str, options: list[str], message: str
) -> None:
    """They were taken silently: a negative or nan tolerance failed every number, inf passed them (and numpy warned)."""
    out = tmp_path / "out.msgpack"
    result = run(command, str(EXAMPLES / "seed004.msgpack"), "--check", *options, "--write", str(out))
    assert result == (2, "", f"Error: {message}\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["forward", "backward"])
def test_tolerances_of_0_and_large_ones_are_taken(command: str) -> None:
    for options in (["--rtol", "0", "--atol", "0"], ["--rtol", "1e300", "--atol", "1e300"]):
        code, out, err = run(command, str(EXAMPLES / "seed004.msgpack"), "--check", *options)
        assert (code, err) == (0, ""), out
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--check", "--set", "c=2", "--atol", "1e300")
    # every stored number is within atol: the absolute tolerance decides, there is no relative figure
    assert (
        code == 0
        and out.splitlines()[-1]
        == "check grads (float64: rtol 1e-9, atol 1e300): worst abs diff 1.0 at a, worst rel diff 0.0 at a: ok"
    )
    code, out, _ = run("backward", str(EXAMPLES / "seed004.msgpack"), "--check", "--set", "c=2", "--atol", "1")
    assert out.splitlines()[-1] == (
        "check grads (float64: rtol 1e-9, atol 1.0): worst abs diff 1.0 at a, "
        "worst rel diff 0.14285714285714285 at apb: ok"
    )


@pytest.mark.parametrize("command", ["forward", "backward"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--rtol", "1e-3"], "--rtol goes with --check: it is the relative tolerance of that comparison"),
        (["--atol", "0"], "--atol goes with --check: it is the absolute tolerance of that comparison"),
        (["--data"], "--data goes with --json: it adds every array's elements to the JSON"),
    ],
)
def test_an_option_without_the_one_it_goes_with_is_a_usage_error(
    command: str, options: list[str], message: str
) -> None:
    """They were taken and did nothing."""
    assert run(command, str(EXAMPLES / "seed004.msgpack"), *options) == (2, "", f"Error: {message}\n")


def test_write_saves_replayed_values_and_gradients(tmp_path: Path) -> None:
    g = GraphBuilder()
    x = g.leaf(3.0, name="x")
    g.add("mul", [x, x], name="y")
    source = tmp_path / "in.msgpack"
    fmt.save(g.build(), source)  # values of y unknown (nan), no gradients
    out = tmp_path / "out.msgpack"
    code, _, _ = run("backward", str(source), "--write", str(out))
    assert code == 0
    written = fmt.load(out)
    assert written.values.tolist() == [3.0, 9.0]
    assert written.grads is not None and written.grads.tolist() == [6.0, 1.0]
    assert written.op_sources["mul"].plugin == "graphsvc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.msgpack", "out.msgpack"]


def test_backward_check_without_stored_gradients_fails_before_writing(tmp_path: Path) -> None:
    g = GraphBuilder()
    x = g.leaf(3.0, name="x")
    g.add("mul", [x, x], name="y", value=9.0)
    source = tmp_path / "in.msgpack"
    fmt.save(g.build(), source)  # no gradients
    out = tmp_path / "out.msgpack"
    assert run("backward", str(source), "--check", "--write", str(out)) == (
        2,
        "",
        "Error: --check: the file stores no gradients to compare with\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.msgpack"]


def test_forward_recomputes_values_from_the_leaves() -> None:
    code, out, _ = run("forward", str(EXAMPLES / "seed004.msgpack"), "--set", "a=3", "--set", "b=1")
    assert code == 0
    # L = (3*1 + 1)*(3 + 1) = 16; forward keeps the file's (now stale) gradients out of its output
    assert out.splitlines()[0] == "6\tL\tmul\t4,5\t16.0"


def test_a_misspelt_op_is_named_with_its_likely_spelling(tmp_path: Path) -> None:
    g = GraphBuilder()
    x = g.leaf(np.zeros((2, 3)), name="x")
    g.add("log_sofmax", [x], name="y")
    path = tmp_path / "typo.msgpack"
    fmt.save(g.build(), path)
    result = runner.invoke(app, ["forward", str(path)])
    assert (result.exit_code, result.stdout, result.stderr) == (
        4,
        "",
        "Error: the graph uses an op not registered here: log_sofmax (plugin unknown; did you mean 'log_softmax'?)\n",
    )
    g.add("cube", [x])
    fmt.save(g.build(), path)
    result = runner.invoke(app, ["forward", str(path)])
    assert (result.exit_code, result.stderr) == (
        4,
        "Error: the graph uses ops not registered here: log_sofmax (plugin unknown; did you mean 'log_softmax'?), "
        "cube (plugin unknown); install the plugin that provides the other or pass --plugin\n",
    )
    g = GraphBuilder()
    g.add("exq", [g.leaf(1.0)])
    fmt.save(g.build(), path)
    assert run("forward", str(path))[::2] == (
        4,
        "Error: the graph uses an op not registered here: exq (plugin unknown; did you mean 'exp'?); if not, run "
        "without --disable-plugins (it keeps out every plugin, --plugin ones too)\n",
    )


def test_missing_op_fails_before_any_work_with_exit_4(tmp_path: Path) -> None:
    g = GraphBuilder()
    x = g.leaf(1.0, name="x")
    g.add("softplus", [x], name="y")
    g.op_sources["softplus"] = OpSource("graphsvc-activations", "0.1.0")
    path = tmp_path / "plugin.msgpack"
    fmt.save(g.build(), path)
    code, out, err = run("backward", str(path), "--write", str(tmp_path / "never.msgpack"))
    assert (code, out) == (4, "")
    assert err == (
        "Error: the graph uses an op not registered here: softplus (from graphsvc-activations 0.1.0); "
        "install the plugin that provides it, without --disable-plugins "
        "(it keeps out every plugin, --plugin ones too)\n"
    )
    assert not (tmp_path / "never.msgpack").exists()
    # inspection keeps working without the plugin; validate says a replay here cannot run the file
    assert run("order", str(path))[0] == 0
    assert run("validate", "--format-only", str(path))[0] == 0
    assert run("validate", str(path)) == (
        4,
        "",
        f"Error: {path}: a valid graph file, but it cannot be replayed here: the graph uses an op not registered "
        "here: softplus (from graphsvc-activations 0.1.0); install the plugin that provides it, without "
        "--disable-plugins (it keeps out every plugin, --plugin ones too)\n",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "a"], "Error: --set expects NAME=VALUE, not 'a'\n"),
        (["--set", "a=x"], "Error: --set a: 'x' is not a number or a .npy file\n"),
        (["--set", "zz=1"], "Error: no node named 'zz' (the leaves: a, b, c)\n"),
        (["--set", "ab=1"], "Error: node ab is a mul node, not a leaf: only leaves can be set\n"),
        (["--output", "nope"], "Error: no node named 'nope' (the outputs: L)\n"),
        (["--output", "l"], "Error: no node named 'l'; did you mean 'L'? (the outputs: L)\n"),
        (["--output", "ac"], "Error: no node named 'ac'; did you mean 'abc' or 'c' or 'a'? (the outputs: L)\n"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    code, out, err = run("backward", str(EXAMPLES / "seed004.msgpack"), *args)
    assert (code, out, err) == (2, "", message)


def test_gradients_of_another_output(tmp_path: Path) -> None:
    g = GraphBuilder()
    x = g.leaf(2.0, name="x")
    g.add("mul", [x, x], name="sq")
    g.add("exp", [x], name="ex")
    path = tmp_path / "two.msgpack"
    fmt.save(g.build(), path)
    code, _, err = run("backward", str(path))
    assert (code, err) == (2, "Error: the graph has 2 outputs (sq, ex): choose one with --output\n")
    code, out, _ = run("backward", str(path), "--output", "sq", "--json")
    nodes = {n["name"]: n for n in json.loads(out)["nodes"]}
    assert (nodes["x"]["grad"], nodes["ex"]["grad"]) == (4.0, 0.0)
    assert np.isclose(nodes["ex"]["value"], np.exp(2.0))


# -- the CLI takes --set as graphsvc.forward(graph, set=...) does --------------------------------
@pytest.mark.parametrize("command", ["forward", "backward"])
@pytest.mark.parametrize(
    "sets",
    [
        ["a=1", "a=5"],  # one name twice: never the last one silently kept
        ["a=1", "0=5"],  # a name and the id of the same node
        ["0=1", "0=1"],  # the same value twice is still two values
        ["a=1", "b=2", "a=1"],
    ],
)
def test_set_refuses_a_node_given_twice_as_the_library_does(command: str, sets: list[str]) -> None:
    args = [word for assignment in sets for word in ("--set", assignment)]
    code, out, err = run(command, str(EXAMPLES / "seed004.msgpack"), *args)
    assert (code, out, err) == (2, "", "Error: --set gives node a two values\n")


def test_set_and_the_library_refuse_the_same_assignments() -> None:
    """The CLI resolves --set with graphsvc.replay.run.resolve_set, the library's own resolver: the same
    error, worded for each (``set`` in Python, ``--set`` on the command line)."""
    import graphsvc
    from graphsvc.errors import UsageError

    graph = fmt.load(EXAMPLES / "seed004.msgpack")
    cases = [
        ({"a": 1.0, "0": 5.0}, ["a=1", "0=5"], "set gives node a two values"),
        ({"zz": 1.0}, ["zz=1"], "no node named 'zz' (the leaves: a, b, c)"),
        ({"A": 1.0}, ["A=1"], "no node named 'A'; did you mean 'a'? (the leaves: a, b, c)"),
        ({"9": 1.0}, ["9=1"], "no node with id 9 (the graph has 7 nodes)"),
        ({"ab": 1.0}, ["ab=1"], "node ab is a mul node, not a leaf: only leaves can be set"),
    ]
    for mapping, sets, words in cases:
        with pytest.raises(UsageError) as caught:
            graphsvc.forward(graph, set=mapping)
        assert str(caught.value) == words
        code, _, err = run("forward", str(EXAMPLES / "seed004.msgpack"), *(w for s in sets for w in ("--set", s)))
        cli_words = "--" + words if words.startswith("set ") else words
        assert (code, err) == (2, f"Error: {cli_words}\n")


def test_set_names_an_escaped_node_given_twice(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.add("neg", [b.leaf(2.0, name="a\tb\x1b")], name="y")
    path = tmp_path / "odd.msgpack"
    fmt.save(b.build(), path)
    code, out, err = run("forward", str(path), "--set", "0=1", "--set", "0=2")
    assert (code, out, err) == (2, "", "Error: --set gives node a\\tb\\x1b two values\n")


def test_set_refuses_a_tensor_leaf_given_twice(tmp_path: Path) -> None:
    b = GraphBuilder()
    w = b.leaf(np.array([1.0, 2.0]), name="w")
    b.add("sum", [w], name="L")
    path = tmp_path / "w.msgpack"
    fmt.save(b.build(), path)
    np.save(tmp_path / "w.npy", np.array([3.0, 4.0]))
    npy = str(tmp_path / "w.npy")
    for sets in (["w=" + npy, "w=2"], ["0=" + npy, "w=" + npy]):
        code, out, err = run("backward", str(path), *(w for s in sets for w in ("--set", s)))
        assert (code, out, err) == (2, "", "Error: --set gives node w two values\n")
    code, out, _ = run("backward", str(path), "--set", "w=" + npy)
    assert (code, out.splitlines()[0]) == (0, "1\tL\tsum\t0\t7.0\t1.0")


@pytest.mark.parametrize("command", ["forward", "backward"])
@pytest.mark.parametrize("tensor", [False, True], ids=["scalars", "tensors"])
def test_write_saves_the_bytes_the_library_saves(tmp_path: Path, command: str, tensor: bool) -> None:
    """``--set ... --write OUT`` and ``graphsvc.save(graphsvc.forward(graph, set=...))`` write the
    same file, byte for byte (stored gradients dropped by forward, the op sources filled in)."""
    import graphsvc
    from graphsvc.pluginhost import load_registry

    b = GraphBuilder()
    if tensor:
        x = b.const(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), name="x")
        w = b.leaf(np.array([[0.5], [-1.0]], dtype=np.float32), name="w")
        b.add("mean", [b.add("tanh", [b.add("matmul", [x, w])])], name="loss")
        value: float | np.ndarray = np.array([[1.5], [2.0]], dtype=np.float32)
        np.save(tmp_path / "w.npy", value)
        assignment = f"w={tmp_path / 'w.npy'}"
    else:
        w = b.leaf(2.0, name="w")
        b.add("tanh", [b.add("mul", [w, b.const(3.0)])], name="loss")
        value, assignment = 0.25, "w=0.25"
    registry = load_registry(disable_third_party=True)[0]
    graph = graphsvc.backward(b.build(), registry=registry)  # a file with gradients stored
    path = tmp_path / "g.msgpack"
    fmt.save(graph, path)
    code, _, _ = run(command, str(path), "--set", assignment, "--write", str(tmp_path / "cli.msgpack"))
    replay = graphsvc.forward if command == "forward" else graphsvc.backward
    fmt.save(replay(fmt.load(path), set={"w": value}, registry=registry), tmp_path / "lib.msgpack")
    assert code == 0
    assert (tmp_path / "cli.msgpack").read_bytes() == (tmp_path / "lib.msgpack").read_bytes()


def test_forward_check_refuses_a_file_that_stores_no_computed_value(tmp_path: Path) -> None:
    b = GraphBuilder()
    a = b.leaf(2.0, name="a")
    b.add("mul", [a, a], name="y")  # built, never evaluated: y's value is nan, "none"
    path = tmp_path / "unevaluated.msgpack"
    fmt.save(b.build(), path)
    assert run("forward", str(path), "--check") == (
        2,
        "",
        "Error: --check: the file stores no value of a computed node to compare with\n",
    )
    code, out, _ = run("forward", str(path))  # without --check the replay is what it was
    assert (code, out) == (0, "1\ty\tmul\t0,0\t4.0\n0\ta\tleaf\t-\t2.0\n")


def test_has_computed_values_looks_past_leaves_to_columns_and_arrays() -> None:
    b = GraphBuilder()
    a = b.leaf(2.0, name="a")
    b.add("mul", [a, b.const(3.0)], name="y")
    graph = b.build()
    assert not graph.has_computed_values  # a leaf's and a const's values are inputs, not results
    graph.values[2] = 6.0
    assert graph.has_computed_values
    b = GraphBuilder()
    x = b.leaf(np.ones(2))
    b.add("sum", [x])
    graph = b.build()
    assert not graph.has_computed_values
    graph.arrays[1] = np.array(2.0)
    assert graph.has_computed_values


@pytest.mark.parametrize("number", ["-0", "-0.0", "-00", " -0"])
def test_set_keeps_the_sign_of_a_negative_zero(tmp_path: Path, number: str) -> None:
    """``--set s=-0`` gives a float leaf -0.0, as float('-0') does and graphsvc.forward(set={'s': -0.0}):
    1/s is then -inf, not inf (an integer literal is parsed exactly for an int64 leaf, and int('-0') is 0)."""
    b = GraphBuilder()
    s = b.leaf(1.0, name="s")
    b.add("div", [b.const(1.0, name="one"), s], name="r")
    path = tmp_path / "div.msgpack"
    fmt.save(b.build(), path)
    code, out, _ = run("forward", str(path), "--set", f"s={number}", "--json")
    values = {n["name"]: n["value"] for n in json.loads(out)["nodes"]}
    assert code == 0
    assert values["r"] == "-inf"
    assert str(values["s"]) == "-0.0"


@pytest.mark.parametrize(
    ("number", "shown"),
    [
        ("1e400", "1e400"),
        ("-1E400", "-1E400"),
        ("1" + "0" * 400, "10000000000000000000... (401 characters)"),
    ],
)
def test_set_refuses_a_number_past_float64s_range(number: str, shown: str) -> None:
    """A number that overflows when parsed is refused, as GraphBuilder and the JSON form refuse it,
    not made inf; inf written as inf is a value like any other."""
    code, out, err = run("forward", str(EXAMPLES / "seed004.msgpack"), "--set", f"a={number}")
    assert (code, out, err) == (
        2,
        "",
        f"Error: --set a: {shown} is out of float64's range (write inf or -inf for an infinity)\n",
    )


@pytest.mark.parametrize(("number", "value"), [("inf", "inf"), ("-Infinity", "-inf"), ("+INF", "inf")])
def test_set_takes_an_infinity_written_as_one(number: str, value: str) -> None:
    code, out, _ = run("forward", str(EXAMPLES / "seed004.msgpack"), "--set", f"a={number}", "--json")
    assert code == 0
    leaf = {"id": 0, "name": "a", "op": "leaf", "parents": [], "value": value, "grad": None}
    assert json.loads(out)["nodes"][-1] == leaf
