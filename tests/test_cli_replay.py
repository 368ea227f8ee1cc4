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

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--disable-plugins", *args])
    return result.exit_code, result.stdout, result.stderr


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
        "check values: worst abs diff 5.0 at L, worst rel diff 1.0 at c: 3 beyond tolerance",
        "check grads: worst abs diff 1.0 at a, worst rel diff 0.14285714285714285 at apb: 3 beyond tolerance",
    ]


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
        "Error: the graph uses op not registered here: softplus (from graphsvc-activations 0.1.0); "
        "install the plugin that provides them or pass --plugin\n"
    )
    assert not (tmp_path / "never.msgpack").exists()
    # inspection keeps working without the plugin
    assert run("order", str(path))[0] == 0
    assert run("validate", str(path))[0] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "a"], "Error: --set expects NAME=VALUE, not 'a'\n"),
        (["--set", "a=x"], "Error: --set a: 'x' is not a number or a .npy file\n"),
        (["--set", "zz=1"], "Error: no node named 'zz'\n"),
        (["--set", "ab=1"], "Error: node ab is a mul node, not a leaf: only leaves can be set\n"),
        (["--output", "nope"], "Error: no node named 'nope'\n"),
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
