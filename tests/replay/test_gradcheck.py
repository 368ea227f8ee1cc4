"""graphsvc.replay.gradcheck: a graph's analytic gradient against finite differences of its replays."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsvc
from cli import app
from graphsvc.errors import UsageError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.replay.gradcheck import ELEMENT_LIMIT, gradcheck
from tests.conftest import needs_torch

runner = CliRunner()

BAD_PLUGIN = """
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    __version__ = "1.0"

    @hookimpl
    def graphsvc_register_ops(register):
        # d(x*y)/dx is y, d(x*y)/dy is x: the second is wrong
        register(Op("bad_mul", 2, forward=lambda x, y: x * y, derivatives=lambda x, y, out: (y, y)))
        # a tensor op: the VJP of 2x is 2g, not 3g
        register(Op("bad_double", 1, forward=lambda x: 2 * x, vjp=lambda g, out, x: (3 * g,)))
"""


@pytest.fixture
def bad_plugin(tmp_path: Path) -> str:
    path = tmp_path / "badops.py"
    path.write_text(textwrap.dedent(BAD_PLUGIN), encoding="utf-8")
    return str(path)


@pytest.fixture
def bad_file(tmp_path: Path, bad_plugin: str) -> str:
    """L = bad_mul(a, c) + a at a=2, c=3, saved with the gradients the wrong op gives (a 4, c 3; c's is 2)."""
    builder = GraphBuilder()
    a = builder.leaf(2.0, "a")
    c = builder.leaf(3.0, "c")
    p = builder.add("bad_mul", [a, c], value=6.0, name="p")
    builder.add("add", [p, a], value=8.0, name="L")
    built = tmp_path / "built.msgpack"
    graphsvc.save(builder.build(["L"]), built)
    out = tmp_path / "bad.msgpack"
    result = runner.invoke(app, ["--plugin", bad_plugin, "backward", str(built), "--write", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


def tensor_graph(dtype: type) -> Graph:
    """sum(tanh(x @ w)) with x (2, 3) and w (3, 2)."""
    rng = np.random.default_rng(7)
    builder = GraphBuilder()
    x = builder.leaf(rng.standard_normal((2, 3)).astype(dtype), "x")
    w = builder.leaf(rng.standard_normal((3, 2)).astype(dtype), "w")
    m = builder.add("matmul", [x, w], value=np.zeros((2, 2), dtype), name="m")
    t = builder.add("tanh", [m], value=np.zeros((2, 2), dtype), name="t")
    builder.add("sum", [t], value=np.zeros((), dtype), name="s")
    return graphsvc.forward(builder.build(["s"]))


def chain_graph(leaves: int) -> Graph:
    """L = sum over i of x_i * x_{i+1}, a chain of adds, with x_i = i / leaves."""
    builder = GraphBuilder()
    xs = [builder.leaf(i / leaves, f"x{i}") for i in range(leaves)]
    total = builder.add("mul", [xs[0], xs[1]], value=0.0)
    for i in range(1, leaves - 1):
        total = builder.add("add", [total, builder.add("mul", [xs[i], xs[i + 1]], value=0.0)], value=0.0)
    builder.add("neg", [total], value=0.0, name="L")
    return graphsvc.forward(builder.build(["L"]))


def test_seed004_passes_each_element(seed004_file: Graph) -> None:
    result = gradcheck(seed004_file)
    assert result.passed and result.method == "elements" and result.culprit is None
    assert [leaf.name for leaf in result.leaves] == ["a", "b", "c"]
    assert graphsvc.backward(seed004_file).grad("a") == 22.0  # the gradient checked: 22, 17, 5
    assert (graphsvc.backward(seed004_file).grad("b"), graphsvc.backward(seed004_file).grad("c")) == (17.0, 5.0)
    assert result.replays == 7  # one backward, two forwards a leaf
    assert all(leaf.max_abs_error < 1e-7 for leaf in result.leaves)


def test_a_wrong_derivative_hidden_from_backward_check_is_found(bad_file: str, bad_plugin: str) -> None:
    check = runner.invoke(app, ["--plugin", bad_plugin, "backward", bad_file, "--check"])
    assert check.exit_code == 0  # the stored gradients are wrong the same way
    result = runner.invoke(app, ["--plugin", bad_plugin, "gradcheck", bad_file])
    assert result.exit_code == 1
    assert result.stdout == (
        "output L: 2 leaves, 2 elements, replayed in float64\n"
        "each leaf element perturbed (5 replays; eps 1e-06, rtol 0.001, atol 1e-05)\n"
        "  a: ok\n"
        "  c: FAIL at element 0: analytic 3, finite differences 2\n"
        "wrong derivative: node 2 (p), op bad_mul from badops 1.0: input 1 gets 3, finite differences 2\n"
        "FAIL: c\n"
    )
    assert result.stderr == "Error: gradcheck failed for c\n"


def test_json_of_a_failure(bad_file: str, bad_plugin: str) -> None:
    result = runner.invoke(app, ["--plugin", bad_plugin, "gradcheck", bad_file, "--json"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["passed"] is False and document["failed"] == ["c"]
    assert document["culprit"] == {
        "node": 2,
        "name": "p",
        "op": "bad_mul",
        "plugin": "badops 1.0",
        "input": 1,
        "analytic": 3.0,
        "numeric": pytest.approx(2.0, rel=1e-8),
    }
    failure = document["leaves"][1]["failure"]
    assert failure["element"] == 0 and failure["analytic"] == 3.0
    assert failure["numeric"] == pytest.approx(2.0, rel=1e-8)
    assert document["leaves"][0]["passed"] is True
    assert (document["method"], document["replays"], document["cast_float32"]) == ("elements", 5, False)


def test_leaves_chooses_which_are_checked(bad_file: str, bad_plugin: str) -> None:
    result = runner.invoke(app, ["--plugin", bad_plugin, "gradcheck", bad_file, "--leaves", "a"])
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == "ok: the gradient with respect to 1 leaf matches"


def test_set_moves_the_point(bad_file: str, bad_plugin: str) -> None:
    # at a=0 the wrong d/dc (c) and the right one (a + 0) differ: 3 against 0
    result = runner.invoke(app, ["--plugin", bad_plugin, "gradcheck", bad_file, "--set", "a=0", "--json"])
    assert json.loads(result.stdout)["leaves"][1]["failure"]["analytic"] == 3.0
    # at a=c=5 they agree
    same = runner.invoke(app, ["--plugin", bad_plugin, "gradcheck", bad_file, "--set", "a=5", "--set", "c=5"])
    assert same.exit_code == 0


def test_float32_tensor_graph_is_checked_in_float64() -> None:
    graph = tensor_graph(np.float32)
    result = gradcheck(graph, rtol=1e-7, atol=1e-9)  # tight: float32 replays would not pass this
    assert result.passed and result.cast_float32 and not result.projected
    assert result.method == "elements" and [leaf.elements for leaf in result.leaves] == [6, 6]
    assert graph.arrays[0].dtype == np.float32  # the graph given is unchanged


def test_tensor_graph_gradient_matches_pytorch() -> None:
    torch = needs_torch()
    graph = tensor_graph(np.float64)
    x = torch.tensor(graph.arrays[0], requires_grad=True)
    w = torch.tensor(graph.arrays[1], requires_grad=True)
    torch.tanh(x @ w).sum().backward()
    replayed = graphsvc.backward(graph)
    np.testing.assert_allclose(replayed.grad("x"), x.grad.numpy(), rtol=1e-12)
    assert gradcheck(graph).passed


def test_a_non_scalar_output_is_projected() -> None:
    graph = tensor_graph(np.float64)
    result = gradcheck(graph, output="t")
    assert result.passed and result.projected
    from graphsvc.console.views import graph_gradcheck_lines

    lines = graph_gradcheck_lines(result)
    assert lines[1] == "the output is not a scalar: checked is sum(output * r), r random (seed 0)"


def test_a_large_graph_takes_random_directions() -> None:
    graph = chain_graph(ELEMENT_LIMIT + 1)
    result = gradcheck(graph)
    assert result.passed and result.method == "directions"
    assert result.replays == 7  # one backward, two forwards for each of 3 directions
    from graphsvc.console.views import graph_gradcheck_lines

    assert graph_gradcheck_lines(result) == [
        "output L: 65 leaves, 65 elements, replayed in float64",
        "random directions over all the leaves, then one a leaf when one fails"
        " (7 replays; eps 1e-06, rtol 0.001, atol 1e-05)",
        "ok: the gradient with respect to 65 leaves matches",
    ]


def test_a_large_graph_with_a_wrong_op_names_the_leaf_and_the_node(bad_plugin: str) -> None:
    from graphsvc.pluginhost import load_registry

    registry, _ = load_registry([bad_plugin])
    builder = GraphBuilder()
    xs = [builder.leaf(1.0 + i / 100, f"x{i}") for i in range(ELEMENT_LIMIT + 6)]
    total = xs[0]
    for x in xs[1:-1]:
        total = builder.add("add", [total, x], value=0.0)
    bad = builder.add("bad_mul", [total, xs[-1]], value=0.0, name="scaled")
    builder.add("exp", [bad], value=0.0, name="L")
    graph = graphsvc.forward(builder.build(["L"]), registry=registry)
    result = gradcheck(graph, registry=registry)
    assert result.method == "directions" and not result.passed
    assert result.failed == [f"x{ELEMENT_LIMIT + 5}"]
    assert result.culprit is not None
    assert (result.culprit.node, result.culprit.name, result.culprit.op, result.culprit.input) == (
        bad,
        "scaled",
        "bad_mul",
        1,
    )


def test_a_wrong_op_in_the_middle_of_a_long_chain_is_found_by_bisection(
    bad_plugin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphsvc.pluginhost import load_registry
    from graphsvc.replay import gradcheck as room

    registry, _ = load_registry([bad_plugin])
    builder = GraphBuilder()
    h = builder.leaf(0.5, "x")
    step = builder.const(0.001)
    c = builder.leaf(2.0, "c")
    for i in range(10_000):
        if i == 6_000:  # bad_mul(c, h): its derivative for h (input 1) is h, not c
            h = bad = builder.add("bad_mul", [c, h], value=0.0, name="middle")
        else:
            h = builder.add("add", [h, step], value=0.0)
    graph = graphsvc.forward(builder.build([h]), registry=registry)
    checked_alone = []
    op_check = room._op_check

    def counting(graph: Graph, registry: object, node: int, *args: object) -> object:
        checked_alone.append(node)
        return op_check(graph, registry, node, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(room, "_op_check", counting)
    result = gradcheck(graph, registry=registry)
    assert result.failed == ["x"]  # dL/dx is c = 2; the wrong op gives h = 6.5
    assert result.culprit is not None
    assert (result.culprit.node, result.culprit.name, result.culprit.op, result.culprit.input) == (
        bad,
        "middle",
        "bad_mul",
        1,
    )
    # bisection's candidate was the op: one op checked alone, not the 4,000 between it and the output
    assert checked_alone == [bad]


def test_refusals(seed004_file: Graph) -> None:
    both = runner.invoke(app, ["gradcheck", "examples/seed004.msgpack", "--op", "add"])
    assert (both.exit_code, both.stderr) == (2, "Error: gradcheck takes FILE or --op, not both\n")
    alone = runner.invoke(app, ["gradcheck", "--leaves", "a"])
    assert (alone.exit_code, alone.stderr) == (2, "Error: --leaves needs FILE: gradcheck FILE --leaves ...\n")
    eps = runner.invoke(app, ["gradcheck", "examples/seed004.msgpack", "--eps", "0"])
    assert (eps.exit_code, eps.stderr) == (2, "Error: --eps must be a finite number, more than 0, not 0\n")
    leaf = runner.invoke(app, ["gradcheck", "examples/seed004.msgpack", "--leaves", "L"])
    assert leaf.exit_code == 2
    missing = runner.invoke(app, ["gradcheck", "nothere.msgpack"])
    assert missing.exit_code == 3
    with pytest.raises(UsageError, match=r"^eps must be more than 0$"):
        gradcheck(seed004_file, eps=0.0)
    with pytest.raises(TypeError):
        gradcheck("examples/seed004.msgpack")  # type: ignore[arg-type]


def test_a_tensor_op_with_a_wrong_vjp_is_named(bad_plugin: str) -> None:
    from graphsvc.pluginhost import load_registry

    registry, _ = load_registry([bad_plugin])
    builder = GraphBuilder()
    x = builder.leaf(np.array([[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]], dtype=np.float32), "x")
    w = builder.leaf(np.array([[1.0], [2.0], [-1.0]], dtype=np.float32), "w")
    m = builder.add("matmul", [x, w], value=np.zeros((2, 1), np.float32), name="m")
    d = builder.add("bad_double", [m], value=np.zeros((2, 1), np.float32), name="d")
    t = builder.add("tanh", [d], value=np.zeros((2, 1), np.float32), name="t")
    builder.add("sum", [t], value=np.zeros((), np.float32), name="s")
    graph = graphsvc.forward(builder.build(["s"]), registry=registry)
    result = gradcheck(graph, registry=registry)
    assert result.failed == ["x", "w"] and result.cast_float32
    assert result.culprit is not None
    assert (result.culprit.name, result.culprit.op, result.culprit.plugin) == ("d", "bad_double", "badops 1.0")
    # d(sum(tanh(2 m)))/dx[0, 0] is 2 (1 - tanh(2 m0)^2) w[0]; the wrong VJP gives 3/2 of it
    m0 = 0.1 * 1.0 - 0.2 * 2.0 - 0.3 * 1.0
    right = 2 * (1 - np.tanh(2 * m0) ** 2) * 1.0
    failure = result.leaves[0].failure
    assert failure is not None and failure[0] == 0
    assert failure[1] == pytest.approx(1.5 * right, rel=1e-6) and failure[2] == pytest.approx(right, rel=1e-6)


def test_int64_leaves_are_not_perturbed() -> None:
    builder = GraphBuilder()
    x = builder.leaf(np.array([1.0, 2.0, 3.0, 4.0]), "x")
    idx = builder.leaf(np.array([0, 2, 2]), "idx")
    taken = builder.add("take", [x, idx], value=np.zeros(3))
    builder.add("sum", [taken], value=np.zeros(()), name="s")
    graph = graphsvc.forward(builder.build(["s"]))
    result = gradcheck(graph)
    assert result.passed and result.skipped == ["idx"] and [leaf.name for leaf in result.leaves] == ["x"]
    np.testing.assert_array_equal(graphsvc.backward(graph).grad("x"), [1.0, 0.0, 2.0, 0.0])
    from graphsvc.console.views import graph_gradcheck_lines

    assert graph_gradcheck_lines(result) == [
        "output s: 1 leaf, 4 elements, replayed in float64",
        "not perturbed (int64): idx",
        "each leaf element perturbed (9 replays; eps 1e-06, rtol 0.001, atol 1e-05)",
        "  x: ok",
        "ok: the gradient with respect to 1 leaf matches",
    ]
    with pytest.raises(UsageError, match=r"^no float leaf to check: the gradient is with respect to float leaves$"):
        gradcheck(graph, leaves=["idx"])


def test_leaves_refuses_a_node_that_is_not_a_leaf() -> None:
    result = runner.invoke(app, ["gradcheck", "examples/seed004.msgpack", "--leaves", "L"])
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", "Error: --leaves L: not a leaf (mul)\n")


def test_plugins_from_the_environment_and_a_plugin_that_raises(tmp_path: Path, bad_file: str, bad_plugin: str) -> None:
    by_env = runner.invoke(app, ["gradcheck", bad_file], env={"GRAPHSVC_PLUGINS": bad_plugin})
    assert (by_env.exit_code, by_env.stderr) == (1, "Error: gradcheck failed for c\n")
    boom = tmp_path / "boom.py"
    boom.write_text(
        "from graphsvc.hookspecs import hookimpl\n"
        "from graphsvc.ops import Op\n"
        "def f(x, y):\n"
        "    if x != 2.0:\n"
        "        raise RuntimeError('moved')\n"
        "    return x * y\n"
        "@hookimpl\n"
        "def graphsvc_register_ops(register):\n"
        "    register(Op('bad_mul', 2, forward=f, derivatives=lambda x, y, out: (y, y), vectorized=False))\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["--plugin", str(boom), "gradcheck", bad_file])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "Error: node p: op 'bad_mul' (boom): forward raised RuntimeError: moved\n"
