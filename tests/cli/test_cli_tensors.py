"""forward and backward from the command line on tensor graphs: summaries per node, --set from
.npy files, --steps with shapes and norms, --check naming the worst element, nan located by index.

The graph is L = sum(x * w), written as a format 1.0 file of scalars (x = 2, w = 3); ``--set
x=FILE.npy`` makes x an array, so dL/dw = sum(x) and dL/dx = w in every element.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder
from graphsvc.pluginhost import load_registry
from graphsvc.replay.columns import resolve_ops
from tests.conftest import run_cli

runner = CliRunner()


run = run_cli


@pytest.fixture
def dot(tmp_path: Path) -> Path:
    b = GraphBuilder()
    x, w = b.leaf(2.0, name="x"), b.leaf(3.0, name="w")
    b.add("sum", [b.add("mul", [x, w], name="y")], name="L")
    fmt.save(b.build(), tmp_path / "dot.msgpack")
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    return tmp_path / "dot.msgpack"


def test_a_graph_of_scalars_using_a_tensor_op_lists_as_before(dot: Path) -> None:
    code, out, err = run("backward", str(dot))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "3\tL\tsum\t2\t6.0\t1.0",
        "2\ty\tmul\t0,1\t6.0\t1.0",
        "1\tw\tleaf\t-\t3.0\t2.0",
        "0\tx\tleaf\t-\t2.0\t3.0",
    ]


def test_set_from_a_npy_file_makes_a_tensor_leaf(dot: Path) -> None:
    code, out, err = run("backward", str(dot), "--set", f"x={dot.parent / 'x.npy'}")
    assert (code, err) == (0, "")
    # y = x * w is float64: numpy promotes float32 times a float64 scalar node
    assert out.splitlines() == [
        "3\tL\tsum\t2\t18.0\t1.0",
        "2\ty\tmul\t0,1\tf64[3] mean=6 max|x|=9\tf64[3] mean=1 max|g|=1",
        "1\tw\tleaf\t-\t3.0\t6.0",
        "0\tx\tleaf\t-\tf32[3] mean=2 max|x|=3\tf32[3] mean=3 max|g|=3",
    ]


def test_steps_show_shapes_and_norms(dot: Path) -> None:
    code, out, _ = run("backward", str(dot), "--set", f"x={dot.parent / 'x.npy'}", "--steps")
    assert code == 0
    assert out.split("\n\n")[0].splitlines() == [
        "step 1: L (sum) grad f64[] norm 1",
        "  -> y: f64[3] norm 1.73205",
        "step 2: y (mul) grad f64[3] norm 1.73205",
        "  -> x: f32[3] norm 5.19615",  # 3 in each element: sqrt(27)
        "  -> w: f64[] norm 6",
        "step 3: w (leaf) grad f64[] norm 6",  # the leaves end the sweep, as in a graph of scalars
        "step 4: x (leaf) grad f32[3] norm 5.19615",
    ]


def test_json_gives_dtype_shape_and_the_data_only_when_asked(dot: Path) -> None:
    npy = dot.parent / "x.npy"
    code, out, _ = run("backward", str(dot), "--set", f"x={npy}", "--json")
    assert code == 0
    document = json.loads(out)
    x = document["nodes"][3]
    assert x["value"] == {"dtype": "float32", "shape": [3], "mean": 2.0, "max_abs": 3.0}
    assert x["grad"] == {"dtype": "float32", "shape": [3], "mean": 3.0, "max_abs": 3.0}
    assert document["nodes"][0]["value"] == 18.0 and document["nonfinite"] == {"values": None, "grads": None}
    code, out, _ = run("backward", str(dot), "--set", f"x={npy}", "--json", "--data")
    assert json.loads(out)["nodes"][3]["grad"]["data"] == [3.0, 3.0, 3.0]


def test_nonfinite_names_the_node_and_the_index(dot: Path) -> None:
    np.save(dot.parent / "bad.npy", np.array([1.0, np.inf, np.nan]))
    code, out, _ = run("forward", str(dot), "--set", f"x={dot.parent / 'bad.npy'}")
    assert code == 0
    assert out.splitlines()[-1] == "nonfinite values: first at x[1] (node 0, leaf) = inf; 3 of 4 nodes"


def test_check_names_the_worst_element() -> None:
    b = GraphBuilder()
    x = b.leaf(np.array([[1.0, 2.0], [3.0, 4.0]]), name="x")
    b.add("sum", [b.add("tanh", [x], name="t", value=np.tanh(np.array([[1.0, 2.0], [3.0, 4.5]])))], name="L")
    graph = b.build()
    # No tensor writer is needed: the check compares with the graph's stored arrays.
    from graphsvc.replay import arrays as tensors

    registry, _ = load_registry(disable_third_party=True)
    values = tensors.forward(graph, resolve_ops(graph, registry))
    comparison = tensors.compare("values", graph, values, 1e-9, 1e-12)
    assert (comparison.mismatches, comparison.worst_abs_at, comparison.unstored) == (1, (1, (1, 1)), 1)
    assert comparison.worst_abs == float(np.tanh(4.5) - np.tanh(4.0))


def test_a_npy_file_that_is_missing_or_not_an_array_is_a_usage_error(dot: Path) -> None:
    missing = dot.parent / "nope.npy"
    code, out, err = run("forward", str(dot), "--set", f"x={missing}")
    assert (code, out) == (2, "")
    assert err == f"Error: --set x: {missing} cannot be read: No such file or directory\n"
    (dot.parent / "text.npy").write_text("not numpy")
    code, _, err = run("forward", str(dot), "--set", f"x={dot.parent / 'text.npy'}")
    assert code == 2
    assert err == f"Error: --set x: {dot.parent / 'text.npy'} is not a .npy file of numbers (without pickled objects)\n"
    np.save(dot.parent / "words.npy", np.array(["a", "b"]))
    code, _, err = run("forward", str(dot), "--set", f"x={dot.parent / 'words.npy'}")
    assert (code, err) == (
        2,
        f"Error: --set x: {dot.parent / 'words.npy'} holds <U1; float64, float32 or int64 arrays only\n",
    )


def test_backward_from_an_array_output_is_refused_in_one_line(dot: Path) -> None:
    code, _, err = run("backward", str(dot), "--set", f"x={dot.parent / 'x.npy'}", "--output", "y")
    assert code == 2
    assert err == (
        "Error: backward starts from a scalar (a loss), but node y holds f64[3]: "
        "reduce it first (sum, mean) or choose another output\n"
    )


def test_a_saved_tensor_graph_replays_and_inspects_from_the_command_line(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(np.array([[1.0, -1.0], [2.0, 0.5]], dtype=np.float32), name="x")
    b.add("sum", [b.add("relu", [x], name="r")], name="L")
    path = tmp_path / "t.msgpack"
    fmt.save(b.build(), path)
    code, out, _ = run("inspect", str(path))
    assert code == 0
    assert "format version: 2.0" in out.splitlines()
    assert "tensors: 1 node holds an array (float32 1); 16 bytes of values, 0 bytes of gradients" in out.splitlines()
    code, out, _ = run("backward", str(path), "--write", str(tmp_path / "replayed.msgpack"))
    assert code == 0
    assert out.splitlines() == [
        "2\tL\tsum\t1\tf32[] 3.5\tf32[] 1.0",
        "1\tr\trelu\t0\tf32[2,2] mean=0.875 max|x|=2\tf32[2,2] mean=1 max|g|=1",
        "0\tx\tleaf\t-\tf32[2,2] mean=0.625 max|x|=2\tf32[2,2] mean=0.75 max|g|=1",
    ]
    replayed = fmt.load(tmp_path / "replayed.msgpack")
    assert replayed.grad("x").tolist() == [[1.0, 0.0], [1.0, 1.0]]  # type: ignore[union-attr]
    code, out, _ = run("backward", str(tmp_path / "replayed.msgpack"), "--check")
    assert code == 0
    assert out.splitlines()[-2:] == [
        "check values (float32: rtol 1e-4, atol 1e-6): worst abs diff 0.0 at x[0,0], worst rel diff 0.0 at x[0,0]: ok",
        "check grads (float32: rtol 1e-4, atol 1e-6): worst abs diff 0.0 at x[0,0], worst rel diff 0.0 at x[0,0]: ok",
    ]
    code, out, _ = run("backward", str(tmp_path / "replayed.msgpack"), "--check", "--json")
    assert code == 0
    assert json.loads(out)["check"]["grads"] == {
        "ok": True,
        "mismatches": 0,
        "nodes": 3,
        "unstored": 0,
        "tolerance": {"float32": {"rtol": 1e-4, "atol": 1e-6}},
        "worst_abs": 0.0,
        "worst_abs_at": [0, [0, 0]],
        "worst_rel": 0.0,
        "worst_rel_at": [0, [0, 0]],
    }


def test_a_0d_or_big_endian_npy_keeps_its_shape_and_reads_natively(dot: Path) -> None:
    np.save(dot.parent / "z.npy", np.array(5.0))
    code, out, _ = run("forward", str(dot), "--set", f"x={dot.parent / 'z.npy'}")
    assert code == 0
    assert out.splitlines()[-1] == "0\tx\tleaf\t-\t5.0"  # a 0-d float64: a scalar again, not f64[1]
    np.save(dot.parent / "big.npy", np.array([1.0, 2.0], dtype=">f8"))
    code, out, _ = run("forward", str(dot), "--set", f"x={dot.parent / 'big.npy'}")
    assert (code, out.splitlines()[-1]) == (0, "0\tx\tleaf\t-\tf64[2] mean=1.5 max|x|=2")


def test_npy_files_numpy_cannot_read_safely_get_our_words(dot: Path) -> None:
    np.save(dot.parent / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, _, err = run("forward", str(dot), "--set", f"x={dot.parent / 'objects.npy'}")
    assert (code, err) == (
        2,
        f"Error: --set x: {dot.parent / 'objects.npy'} is not a .npy file of numbers (without pickled objects)\n",
    )
    fifo = dot.parent / "fifo.npy"
    os.mkfifo(fifo)
    code, _, err = run("forward", str(dot), "--set", f"x={fifo}")
    assert (code, err) == (2, f"Error: --set x: {fifo} is not a regular file\n")


def test_arrays_of_more_dimensions_than_a_graph_holds_stop_before_the_write(dot: Path, tmp_path: Path) -> None:
    # a graph holds arrays of at most 32 dimensions: a --set array or an op's result of more is
    # refused naming it, not replayed and then refused by --write as a bad graph file (exit 3)
    np.save(tmp_path / "deep.npy", np.ones((1,) * 33))
    out_path = tmp_path / "out.msgpack"
    code, out, err = run("backward", str(dot), "--set", f"x={tmp_path / 'deep.npy'}", "--write", str(out_path))
    assert (code, out, err) == (2, "", "Error: --set x: an array of 33 dimensions, more than 32\n")
    b = GraphBuilder()
    w = b.leaf(np.ones((2, 1)), name="w")
    b.add("sum", [b.add("reshape", [w], name="r", attrs={"shape": [2] + [1] * 39})], name="L")
    fmt.save(b.build(), tmp_path / "reshape.msgpack")
    code, out, err = run("backward", str(tmp_path / "reshape.msgpack"), "--write", str(out_path))
    assert (code, out) == (1, "")
    assert err == (
        "Error: node r: op 'reshape' (graphsvc 0.1.0): forward returned an array of 40 dimensions, more than 32\n"
    )
    assert not out_path.exists()


def test_identical_nans_are_no_difference_in_a_check() -> None:
    from graphsvc.replay import arrays as tensors

    b = GraphBuilder()
    x = b.leaf(np.array([1.0, np.nan]), name="x")
    b.add("neg", [x], name="y", value=np.array([-1.0, np.nan]))
    graph = b.build()
    registry, _ = load_registry(disable_third_party=True)
    comparison = tensors.compare("values", graph, tensors.forward(graph, resolve_ops(graph, registry)), 1e-9, 0.0)
    assert (comparison.ok, comparison.worst_abs, comparison.worst_rel) == (True, 0.0, 0.0)


def test_check_counts_the_nodes_without_a_gradient_to_compare(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.const(np.array([1.0, 2.0], dtype=np.float32), name="x")  # data: no gradient
    w = b.leaf(np.array([3.0, -1.0], dtype=np.float32), name="w")
    b.add("sum", [b.add("mul", [x, w], name="p")], name="L")
    path, replayed = tmp_path / "g.msgpack", tmp_path / "replayed.msgpack"
    fmt.save(b.build(), path)
    assert run("backward", str(path), "--write", str(replayed))[0] == 0
    code, out, _ = run("backward", str(replayed), "--check")
    assert code == 0
    assert out.splitlines()[-1] == (
        "check grads (float32: rtol 1e-4, atol 1e-6): 1 of 4 nodes has no gradient to compare; "
        "worst abs diff 0.0 at w[0], "
        "worst rel diff 0.0 at w[0]: ok"
    )


def test_check_json_follows_the_file_not_the_engine(tmp_path: Path) -> None:
    """A graph of scalars replayed by the tensor engine (it uses an op given only by a vjp) gives
    --check --json the keys a graph of scalars gives: the worst nodes."""
    plugin = tmp_path / "twice.py"
    plugin.write_text(
        "from graphsvc.hookspecs import hookimpl\nfrom graphsvc.ops import Op\n\n"
        "@hookimpl\ndef graphsvc_register_ops(register):\n"
        "    register(Op('twice', 1, forward=lambda x: 2 * x, vjp=lambda g, out, x: (2 * g,)))\n"
    )
    b = GraphBuilder()
    a = b.leaf(3.0, name="a")
    b.add("mul", [b.add("twice", [a], name="t"), a], name="L")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)
    written = tmp_path / "replayed.msgpack"
    args = ["--plugin", str(plugin), "backward", str(path)]
    assert runner.invoke(app, [*args, "--write", str(written)]).exit_code == 0
    result = runner.invoke(app, ["--plugin", str(plugin), "backward", str(written), "--check", "--json"])
    assert result.exit_code == 0, result.stderr
    check = json.loads(result.stdout)["check"]
    assert check["grads"] == {
        "ok": True, "mismatches": 0, "nodes": 3, "unstored": 0, "tolerance": {"float64": {"rtol": 1e-9, "atol": 1e-12}},
        "worst_abs": 0.0, "worst_abs_node": 0, "worst_rel": 0.0, "worst_rel_node": 0,
    }  # fmt: skip
    leaf = json.loads(result.stdout)["nodes"][-1]
    assert leaf == {"id": 0, "name": "a", "op": "leaf", "parents": [], "value": 3.0, "grad": 12.0}
    result = runner.invoke(app, ["--plugin", str(plugin), "forward", str(path), "--set", "a=inf", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["nonfinite"] == {  # no index into an array: there is none
        "values": {"node": 0, "name": "a", "op": "leaf", "value": "inf", "count": 3}
    }


def test_set_notes_a_tensor_leaf_given_another_dtype_or_shape(tmp_path: Path) -> None:
    b = GraphBuilder()
    w = b.leaf(np.array([[1.0], [2.0]], dtype=np.float32), name="w")
    b.add("sum", [b.add("mul", [w, w])], name="L")
    path = tmp_path / "w.msgpack"
    fmt.save(b.build(), path)
    np.save(tmp_path / "same.npy", np.array([[3.0], [4.0]], dtype=np.float32))
    np.save(tmp_path / "wide.npy", np.array([[3.0], [4.0]], dtype=np.float64))
    np.save(tmp_path / "flat.npy", np.array([3.0, 4.0, 5.0], dtype=np.float32))
    code, out, err = run("forward", str(path), "--set", f"w={tmp_path / 'same.npy'}")
    assert (code, err) == (0, "")
    code, out, err = run("forward", str(path), "--set", f"w={tmp_path / 'wide.npy'}")
    assert (code, err) == (0, "Note: --set w: f64[2,1] replaces the file's f32[2,1]\n")
    assert out.splitlines()[0] == "2\tL\tsum\t1\t25.0"  # float64 from there on: a plain number
    code, out, err = run("forward", str(path), "--set", f"w={tmp_path / 'flat.npy'}", "--set", "L=1")
    assert code == 2
    assert err.splitlines()[0] == "Note: --set w: f32[3] replaces the file's f32[2,1]"


def test_set_notes_that_an_int64_array_takes_the_gradients_away(tmp_path: Path) -> None:
    b = GraphBuilder()
    w = b.leaf(np.ones((3, 2), dtype=np.float32), name="w")
    x = b.leaf(2.0, name="x")
    b.add("sum", [b.add("mul", [w, b.const(np.full((3, 2), 0.5, dtype=np.float32))])], name="L")
    b.add("mul", [x, b.const(3.0)], name="M")
    path = tmp_path / "w.msgpack"
    fmt.save(b.build(), path)
    np.save(tmp_path / "wi.npy", np.arange(6).reshape(3, 2))
    np.save(tmp_path / "xi.npy", np.arange(3))
    lost = "; an int64 leaf gets no gradient, nor does what is computed from it alone"
    code, _, err = run("forward", str(path), "--set", f"w={tmp_path / 'wi.npy'}")
    assert (code, err) == (0, f"Note: --set w: i64[3,2] replaces the file's f32[3,2]{lost}\n")
    # a leaf the file holds as a number becomes a tensor without a note, unless it becomes int64
    code, _, err = run("forward", str(path), "--set", f"x={tmp_path / 'xi.npy'}")
    assert (code, err) == (0, f"Note: --set x: i64[3] replaces the file's f64[]{lost}\n")
    np.save(tmp_path / "xf.npy", np.arange(3.0))
    assert run("forward", str(path), "--set", f"x={tmp_path / 'xf.npy'}")[::2] == (0, "")


def test_set_gives_an_int64_leaf_a_whole_number_as_int64(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(np.arange(12.0).reshape(4, 3), name="x")
    picks = b.leaf(np.array([0, 2, 1, 3]), name="picks")
    b.add("sum", [b.add("take", [x, picks], attrs={"axis": 0})], name="L")
    path = tmp_path / "take.msgpack"
    fmt.save(b.build(), path)
    code, out, err = run("backward", str(path), "--set", "picks=3")
    assert (code, err) == (0, "Note: --set picks: i64[] replaces the file's i64[4]\n")
    assert out.splitlines()[0] == "3\tL\tsum\t2\t30.0\t1.0"  # row 3: 9 + 10 + 11
    assert run("forward", str(path), "--set", "picks=-1")[0] == 0
    for given, refused in [
        ("2.5", "2.5 is not a whole number"),
        ("nan", "nan is not a whole number"),
        ("99999999999999999999", "1e+20 is out of int64's range"),
        ("inf", "inf is out of int64's range"),
    ]:
        assert run("forward", str(path), "--set", f"picks={given}") == (
            2,
            "",
            f"Error: --set picks: {refused}, and the leaf holds int64\n",
        )
    assert run("forward", str(path), "--set", "picks=1" + "0" * 400) == (  # past float's range, as for a float leaf
        2,
        "",
        "Error: --set picks: 10000000000000000000... (401 characters) is out of float64's range "
        "(write inf or -inf for an infinity)\n",
    )


def test_an_attribute_the_op_does_not_take_is_one_line_under_forward_and_backward(tmp_path: Path) -> None:
    b = GraphBuilder()
    logp, target = b.leaf(np.zeros((2, 3)), name="logp"), b.const(np.array([0, 1]), name="target")
    b.add("nll_loss", [logp, target], attrs={"weight": [1.0, 2.0, 3.0]}, name="loss")
    fmt.save(b.build(), tmp_path / "loss.msgpack")
    for command in ("forward", "backward"):
        assert run(command, str(tmp_path / "loss.msgpack")) == (
            4,
            "",
            "Error: node loss: op 'nll_loss' (graphsvc 0.1.0) has no attribute 'weight' "
            "(it takes: ignore_index, reduction)\n",
        )


def test_exit_codes_for_attributes_are_the_readme_s(tmp_path: Path) -> None:
    """docs/cli.md: a node's attribute its op does not take, or one it needs and lacks, exits 4 (checked
    before the replay); a value the op refuses is the op's own error as it runs, exit 1."""
    b = GraphBuilder()
    logp, target = b.leaf(np.zeros((2, 3)), name="logp"), b.const(np.array([0, 1]), name="target")
    b.add("nll_loss", [logp, target], attrs={"reduction": "avg"}, name="loss")
    fmt.save(b.build(), tmp_path / "avg.msgpack")
    assert run("forward", str(tmp_path / "avg.msgpack")) == (
        1,
        "",
        "Error: node loss: op 'nll_loss' (graphsvc 0.1.0): forward raised ValueError: reduction must be one of mean, "
        "sum, none, not 'avg'\n",
    )
    b = GraphBuilder()
    b.add("pow", [b.leaf(2.0, name="x")], name="z")
    fmt.save(b.build(), tmp_path / "pow.msgpack")
    assert run("forward", str(tmp_path / "pow.msgpack")) == (
        4,
        "",
        "Error: node z: op 'pow' (graphsvc 0.1.0) needs attribute 'exponent' (the node gives none)\n",
    )
