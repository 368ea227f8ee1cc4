"""forward and backward print one report, for graphs of scalars and graphs of arrays side by side:
steps, the node listing (plain text piped, a table on a terminal, or --json), the nonfinite lines,
the --check lines and --write. Only a node's value and gradient cells differ between the two kinds.

The scalar graph is seed 004, L = (a*b + c)*(a + b) at a=2, b=3, c=1 (dL/da = 22, dL/db = 17,
dL/dc = 5). The tensor graph is L = sum(x * w) with x = [1, -2] (float32) and w = 3: y = [3, -6],
L = -3, dL/dy = [1, 1], dL/dx = w = [3, 3], dL/dw = sum(x) = -1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder, OpSource
from tests.conftest import EXAMPLES, SEED004_BACKWARD_PLAIN, run_cli

SEED004 = str(EXAMPLES / "seed004.msgpack")
PIPED = {"GRAPHSVC_FORCE_TERMINAL": "0"}
TERMINAL = {"GRAPHSVC_FORCE_TERMINAL": "1", "NO_COLOR": "1", "COLUMNS": "120"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run(*args: str, env: dict[str, str] = PIPED) -> tuple[int, str, str]:
    return run_cli(*args, env=env)


@pytest.fixture
def tensor_file(tmp_path: Path) -> str:
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, -2.0], dtype=np.float32), name="x")
    w = b.leaf(3.0, name="w")
    b.add("sum", [b.add("mul", [x, w], name="y")], name="L")
    fmt.save(b.build(), tmp_path / "tensor.msgpack")
    return str(tmp_path / "tensor.msgpack")


# -- text ------------------------------------------------------------------------------------------
def test_forward_text(tensor_file: str) -> None:
    assert run("forward", SEED004) == (
        0,
        "6\tL\tmul\t4,5\t35.0\n"
        "5\tapb\tadd\t0,1\t5.0\n"
        "4\tabc\tadd\t3,2\t7.0\n"
        "3\tab\tmul\t0,1\t6.0\n"
        "2\tc\tleaf\t-\t1.0\n"
        "1\tb\tleaf\t-\t3.0\n"
        "0\ta\tleaf\t-\t2.0\n",
        "",
    )
    assert run("forward", tensor_file) == (
        0,
        "3\tL\tsum\t2\t-3.0\n"
        "2\ty\tmul\t0,1\tf64[2] mean=-1.5 max|x|=6\n"
        "1\tw\tleaf\t-\t3.0\n"
        "0\tx\tleaf\t-\tf32[2] mean=-0.5 max|x|=2\n",
        "",
    )


def test_backward_steps_then_a_blank_line_then_the_nodes(tensor_file: str) -> None:
    code, out, err = run("backward", SEED004, "--steps", "--check")
    assert (code, err) == (0, "")
    assert out == (
        "step 1: L (mul) grad = 1.0\n"
        "  -> abc: local derivative 5.0, adds 5.0\n"
        "  -> apb: local derivative 7.0, adds 7.0\n"
        "step 2: apb (add) grad = 7.0\n"
        "  -> a: local derivative 1.0, adds 7.0\n"
        "  -> b: local derivative 1.0, adds 7.0\n"
        "step 3: abc (add) grad = 5.0\n"
        "  -> ab: local derivative 1.0, adds 5.0\n"
        "  -> c: local derivative 1.0, adds 5.0\n"
        "step 4: ab (mul) grad = 5.0\n"
        "  -> a: local derivative 3.0, adds 15.0\n"
        "  -> b: local derivative 2.0, adds 10.0\n"
        "step 5: c (leaf) grad = 5.0\n"
        "step 6: b (leaf) grad = 17.0\n"
        "step 7: a (leaf) grad = 22.0\n"
        "\n"
        + SEED004_BACKWARD_PLAIN
        + "check values (float64: rtol 1e-9, atol 1e-12): worst abs diff 0.0 at a, worst rel diff 0.0 at a: ok\n"
        "check grads (float64: rtol 1e-9, atol 1e-12): worst abs diff 0.0 at a, worst rel diff 0.0 at a: ok\n"
    )
    assert run("backward", tensor_file, "--steps") == (
        0,
        "step 1: L (sum) grad f64[] norm 1\n"
        "  -> y: f64[2] norm 1.41421\n"
        "step 2: y (mul) grad f64[2] norm 1.41421\n"
        "  -> x: f32[2] norm 4.24264\n"
        "  -> w: f64[] norm 1\n"
        "step 3: w (leaf) grad f64[] norm 1\n"
        "step 4: x (leaf) grad f32[2] norm 4.24264\n"
        "\n"
        "3\tL\tsum\t2\t-3.0\t1.0\n"
        "2\ty\tmul\t0,1\tf64[2] mean=-1.5 max|x|=6\tf64[2] mean=1 max|g|=1\n"
        "1\tw\tleaf\t-\t3.0\t-1.0\n"
        "0\tx\tleaf\t-\tf32[2] mean=-0.5 max|x|=2\tf32[2] mean=3 max|g|=3\n",
        "",
    )


def test_a_tensor_backward_from_a_leaf_is_one_step(tensor_file: str) -> None:
    # as in a graph of scalars, the sweep ends at each leaf it reaches, with a step of its own
    assert run("backward", tensor_file, "--output", "w", "--steps") == (
        0,
        "step 1: w (leaf) grad f64[] norm 1\n"
        "\n"
        "3\tL\tsum\t2\t-3.0\t0.0\n"
        "2\ty\tmul\t0,1\tf64[2] mean=-1.5 max|x|=6\tf64[2] mean=0 max|g|=0\n"
        "1\tw\tleaf\t-\t3.0\t1.0\n"
        "0\tx\tleaf\t-\tf32[2] mean=-0.5 max|x|=2\tf32[2] mean=0 max|g|=0\n",
        "",
    )
    code, out, _ = run("backward", tensor_file, "--output", "w", "--steps", "--json")
    assert (code, json.loads(out)["steps"]) == (
        0,
        [{"node": 1, "grad": {"dtype": "float64", "shape": [], "norm": 1.0}, "to": []}],
    )


def test_tables_on_a_terminal_align_scalars_right_and_summaries_left(tensor_file: str) -> None:
    code, out, _ = run("backward", SEED004, env=TERMINAL)
    lines = [ANSI.sub("", line).rstrip() for line in out.splitlines()]
    assert (code, lines[0].split()) == (0, ["id", "name", "op", "parents", "value", "grad"])
    assert lines[2:4] == [" 6   L      mul    4,5        35.0    1.0", " 5   apb    add    0,1         5.0    7.0"]
    code, out, _ = run("backward", tensor_file, env=TERMINAL)
    lines = [ANSI.sub("", line).rstrip() for line in out.splitlines()]
    assert (code, lines[0].split()) == (0, ["id", "name", "op", "parents", "value", "grad"])
    assert lines[2:] == [
        " 3   L      sum    2         -3.0                        1.0",
        " 2   y      mul    0,1       f64[2] mean=-1.5 max|x|=6   f64[2] mean=1 max|g|=1",
        " 1   w      leaf   -         3.0                         -1.0",
        " 0   x      leaf   -         f32[2] mean=-0.5 max|x|=2   f32[2] mean=3 max|g|=3",
    ]


# -- --json ----------------------------------------------------------------------------------------
def test_forward_json(tensor_file: str) -> None:
    assert run("forward", SEED004, "--json") == (
        0,
        '{"nodes":[{"id":6,"name":"L","op":"mul","parents":[4,5],"value":35.0,"grad":null},'
        '{"id":5,"name":"apb","op":"add","parents":[0,1],"value":5.0,"grad":null},'
        '{"id":4,"name":"abc","op":"add","parents":[3,2],"value":7.0,"grad":null},'
        '{"id":3,"name":"ab","op":"mul","parents":[0,1],"value":6.0,"grad":null},'
        '{"id":2,"name":"c","op":"leaf","parents":[],"value":1.0,"grad":null},'
        '{"id":1,"name":"b","op":"leaf","parents":[],"value":3.0,"grad":null},'
        '{"id":0,"name":"a","op":"leaf","parents":[],"value":2.0,"grad":null}],'
        '"nonfinite":{"values":null}}\n',
        "",
    )
    assert run("forward", tensor_file, "--json") == (
        0,
        '{"nodes":[{"id":3,"name":"L","op":"sum","parents":[2],"value":-3.0,"grad":null},'
        '{"id":2,"name":"y","op":"mul","parents":[0,1],'
        '"value":{"dtype":"float64","shape":[2],"mean":-1.5,"max_abs":6.0},"grad":null},'
        '{"id":1,"name":"w","op":"leaf","parents":[],"value":3.0,"grad":null},'
        '{"id":0,"name":"x","op":"leaf","parents":[],'
        '"value":{"dtype":"float32","shape":[2],"mean":-0.5,"max_abs":2.0},"grad":null}],'
        '"nonfinite":{"values":null}}\n',
        "",
    )


def test_json_gives_the_numbers_the_listing_shows_for_integers_too(tmp_path: Path) -> None:
    """int64 arrays: min and max in the text, the same in --json (a 0-d one: its number; an empty
    one: dtype and shape alone)."""
    b = GraphBuilder()
    logp = b.leaf(np.log(np.full((3, 2), 0.5)), name="logp")
    b.add("take", [b.add("amax", [logp], name="m"), b.const(np.array([], dtype=np.int64), name="none")])
    b.add("nll_loss", [logp, b.const(np.array([1, 0, -100]), name="target")], name="loss")
    b.const(np.array(7), name="seven")
    fmt.save(b.build(), tmp_path / "ints.msgpack")
    code, out, err = run("forward", str(tmp_path / "ints.msgpack"))
    assert (code, err) == (0, "")
    assert [line.split("\t")[4] for line in out.splitlines()] == [
        "i64[] 7",
        "0.6931471805599453",
        "i64[3] min=-100 max=1",
        "f64[0]",
        "i64[0]",
        "-0.6931471805599453",
        "f64[3,2] mean=-0.693147 max|x|=0.693147",
    ]
    code, out, err = run("forward", str(tmp_path / "ints.msgpack"), "--json")
    assert (code, err) == (0, "")
    assert [node["value"] for node in json.loads(out)["nodes"]] == [
        {"dtype": "int64", "shape": [], "min": 7, "max": 7},
        0.6931471805599453,
        {"dtype": "int64", "shape": [3], "min": -100, "max": 1},
        {"dtype": "float64", "shape": [0]},
        {"dtype": "int64", "shape": [0]},
        -0.6931471805599453,
        {"dtype": "float64", "shape": [3, 2], "mean": -0.6931471805599453, "max_abs": 0.6931471805599453},
    ]


def test_backward_json_with_steps_and_check(tensor_file: str) -> None:
    assert run("backward", SEED004, "--steps", "--json", "--check") == (
        0,
        '{"output":6,"steps":['
        '{"node":6,"grad":1.0,"contributions":[{"parent":4,"local":5.0,"adds":5.0},{"parent":5,"local":7.0,"adds":7.0}]},'
        '{"node":5,"grad":7.0,"contributions":[{"parent":0,"local":1.0,"adds":7.0},{"parent":1,"local":1.0,"adds":7.0}]},'
        '{"node":4,"grad":5.0,"contributions":[{"parent":3,"local":1.0,"adds":5.0},{"parent":2,"local":1.0,"adds":5.0}]},'
        '{"node":3,"grad":5.0,"contributions":[{"parent":0,"local":3.0,"adds":15.0},{"parent":1,"local":2.0,"adds":10.0}]},'
        '{"node":2,"grad":5.0,"contributions":[]},{"node":1,"grad":17.0,"contributions":[]},'
        '{"node":0,"grad":22.0,"contributions":[]}],'
        '"nodes":[{"id":6,"name":"L","op":"mul","parents":[4,5],"value":35.0,"grad":1.0},'
        '{"id":5,"name":"apb","op":"add","parents":[0,1],"value":5.0,"grad":7.0},'
        '{"id":4,"name":"abc","op":"add","parents":[3,2],"value":7.0,"grad":5.0},'
        '{"id":3,"name":"ab","op":"mul","parents":[0,1],"value":6.0,"grad":5.0},'
        '{"id":2,"name":"c","op":"leaf","parents":[],"value":1.0,"grad":5.0},'
        '{"id":1,"name":"b","op":"leaf","parents":[],"value":3.0,"grad":17.0},'
        '{"id":0,"name":"a","op":"leaf","parents":[],"value":2.0,"grad":22.0}],'
        '"nonfinite":{"values":null,"grads":null},'
        '"check":{"values":{"ok":true,"mismatches":0,"nodes":7,"unstored":0,"tolerance":{"float64":{"rtol":1e-09,"atol":1e-12}},'
        '"worst_abs":0.0,"worst_abs_node":0,"worst_rel":0.0,"worst_rel_node":0},'
        '"grads":{"ok":true,"mismatches":0,"nodes":7,"unstored":0,"tolerance":{"float64":{"rtol":1e-09,"atol":1e-12}},'
        '"worst_abs":0.0,"worst_abs_node":0,"worst_rel":0.0,"worst_rel_node":0}}}\n',
        "",
    )
    assert run("backward", tensor_file, "--steps", "--json", "--data") == (
        0,
        '{"output":3,"steps":['
        '{"node":3,"grad":{"dtype":"float64","shape":[],"norm":1.0},"to":[{"parent":2,"norm":1.4142135623730951}]},'
        '{"node":2,"grad":{"dtype":"float64","shape":[2],"norm":1.4142135623730951},'
        '"to":[{"parent":0,"norm":4.242640687119285},{"parent":1,"norm":1.0}]},'
        '{"node":1,"grad":{"dtype":"float64","shape":[],"norm":1.0},"to":[]},'
        '{"node":0,"grad":{"dtype":"float32","shape":[2],"norm":4.242640687119285},"to":[]}],'
        '"nodes":[{"id":3,"name":"L","op":"sum","parents":[2],"value":-3.0,"grad":1.0},'
        '{"id":2,"name":"y","op":"mul","parents":[0,1],'
        '"value":{"dtype":"float64","shape":[2],"mean":-1.5,"max_abs":6.0,"data":[3.0,-6.0]},'
        '"grad":{"dtype":"float64","shape":[2],"mean":1.0,"max_abs":1.0,"data":[1.0,1.0]}},'
        '{"id":1,"name":"w","op":"leaf","parents":[],"value":3.0,"grad":-1.0},'
        '{"id":0,"name":"x","op":"leaf","parents":[],'
        '"value":{"dtype":"float32","shape":[2],"mean":-0.5,"max_abs":2.0,"data":[1.0,-2.0]},'
        '"grad":{"dtype":"float32","shape":[2],"mean":3.0,"max_abs":3.0,"data":[3.0,3.0]}}],'
        '"nonfinite":{"values":null,"grads":null}}\n',
        "",
    )


# -- nan and inf -----------------------------------------------------------------------------------
@pytest.fixture
def log_of_zero(tmp_path: Path) -> tuple[str, str]:
    """y = log(x) at x = 0 (scalars), and L = sum(log(x)) at x = [1, 0]: -inf forward, inf back."""
    b = GraphBuilder()
    b.add("log", [b.leaf(0.0, name="x")], name="y")
    fmt.save(b.build(), tmp_path / "scalar.msgpack")
    b = GraphBuilder()
    b.add("sum", [b.add("log", [b.leaf(np.array([1.0, 0.0]), name="x")], name="y")], name="L")
    fmt.save(b.build(), tmp_path / "tensor.msgpack")
    return str(tmp_path / "scalar.msgpack"), str(tmp_path / "tensor.msgpack")


def test_nonfinite_lines_follow_the_nodes(log_of_zero: tuple[str, str]) -> None:
    scalar, tensor = log_of_zero
    assert run("backward", scalar) == (
        0,
        "1\ty\tlog\t0\t-inf\t1.0\n"
        "0\tx\tleaf\t-\t0.0\tinf\n"
        "nonfinite values: first at y (node 1, log) = -inf; 1 of 2 nodes\n"
        "nonfinite grads: first in the backward sweep at x (node 0, leaf) = inf; 1 of 2 nodes\n",
        "",
    )
    assert run("backward", tensor) == (
        0,
        "2\tL\tsum\t1\t-inf\t1.0\n"
        "1\ty\tlog\t0\tf64[2] mean=-inf max|x|=inf\tf64[2] mean=1 max|g|=1\n"
        "0\tx\tleaf\t-\tf64[2] mean=0.5 max|x|=1\tf64[2] mean=inf max|g|=inf\n"
        "nonfinite values: first at y[1] (node 1, log) = -inf; 2 of 3 nodes\n"
        "nonfinite grads: first in the backward sweep at x[1] (node 0, leaf) = inf; 1 of 3 nodes\n",
        "",
    )


def test_nonfinite_json(log_of_zero: tuple[str, str]) -> None:
    scalar, tensor = log_of_zero
    assert run("backward", scalar, "--json") == (
        0,
        '{"output":1,"nodes":[{"id":1,"name":"y","op":"log","parents":[0],"value":"-inf","grad":1.0},'
        '{"id":0,"name":"x","op":"leaf","parents":[],"value":0.0,"grad":"inf"}],'
        '"nonfinite":{"values":{"node":1,"name":"y","op":"log","value":"-inf","count":1},'
        '"grads":{"node":0,"name":"x","op":"leaf","value":"inf","count":1}}}\n',
        "",
    )
    assert run("backward", tensor, "--json") == (
        0,
        '{"output":2,"nodes":[{"id":2,"name":"L","op":"sum","parents":[1],"value":"-inf","grad":1.0},'
        '{"id":1,"name":"y","op":"log","parents":[0],'
        '"value":{"dtype":"float64","shape":[2],"mean":"-inf","max_abs":"inf"},'
        '"grad":{"dtype":"float64","shape":[2],"mean":1.0,"max_abs":1.0}},'
        '{"id":0,"name":"x","op":"leaf","parents":[],'
        '"value":{"dtype":"float64","shape":[2],"mean":0.5,"max_abs":1.0},'
        '"grad":{"dtype":"float64","shape":[2],"mean":"inf","max_abs":"inf"}}],'
        '"nonfinite":{"values":{"node":1,"name":"y","op":"log","index":[1],"value":"-inf","count":2},'
        '"grads":{"node":0,"name":"x","op":"leaf","index":[1],"value":"inf","count":1}}}\n',
        "",
    )


# -- --write, then --check against what was written --------------------------------------------------
def test_write_records_the_op_sources_of_both_kinds(tensor_file: str, tmp_path: Path) -> None:
    from graphsvc import __version__

    graphsvc = OpSource("graphsvc", __version__)
    code, _, err = run("backward", SEED004, "--write", str(tmp_path / "scalar.msgpack"))
    assert (code, err) == (0, f"wrote {tmp_path / 'scalar.msgpack'} (7 nodes)\n")
    written = fmt.load(tmp_path / "scalar.msgpack")
    assert written.op_sources == {"add": graphsvc, "leaf": graphsvc, "mul": graphsvc}
    assert written.grads is not None and written.grads.tolist() == [22.0, 17.0, 5.0, 5.0, 5.0, 7.0, 1.0]

    code, _, err = run("backward", tensor_file, "--write", str(tmp_path / "replayed.msgpack"))
    assert (code, err) == (0, f"wrote {tmp_path / 'replayed.msgpack'} (4 nodes)\n")
    written = fmt.load(tmp_path / "replayed.msgpack")
    assert written.op_sources == {"leaf": graphsvc, "mul": graphsvc, "sum": graphsvc}
    assert written.grad("x").tolist() == [3.0, 3.0]  # type: ignore[union-attr]
    assert (written.grad("w"), written.grad("L"), written.value("L")) == (-1.0, 1.0, -3.0)


def test_write_keeps_the_sources_a_file_records(tensor_file: str, tmp_path: Path) -> None:
    from graphsvc import __version__

    for kind, path in (("scalar", SEED004), ("tensor", tensor_file)):
        graph = fmt.load(path)
        graph.op_sources["mul"] = OpSource("graphsvc-elsewhere", "9.9")
        fmt.save(graph, tmp_path / f"{kind}.msgpack")
        out = tmp_path / f"{kind}-replayed.msgpack"
        assert run("forward", str(tmp_path / f"{kind}.msgpack"), "--write", str(out))[0] == 0
        sources = fmt.load(out).op_sources
        assert (sources["mul"], sources["leaf"]) == (
            OpSource("graphsvc-elsewhere", "9.9"),
            OpSource("graphsvc", __version__),
        )


def test_check_against_the_written_file_with_another_w(tensor_file: str, tmp_path: Path) -> None:
    # w = 2: y = [2, -4] (worst abs diff 2 at y[1]), L = -2, w itself (rel 1/3); dL/dx = [2, 2] (x[0] first)
    replayed = str(tmp_path / "replayed.msgpack")
    assert run("backward", tensor_file, "--write", replayed)[0] == 0
    code, out, _ = run("backward", replayed, "--check", "--set", "w=2")
    assert (code, out.splitlines()[-2:]) == (
        1,
        [
            "check values (float64: rtol 1e-9, atol 1e-12; float32: rtol 1e-4, atol 1e-6)"
            ": worst abs diff 2.0 at y[1], worst rel diff 0.3333333333333333 at w: 3 beyond tolerance",
            "check grads (float64: rtol 1e-9, atol 1e-12; float32: rtol 1e-4, atol 1e-6)"
            ": worst abs diff 1.0 at x[0], worst rel diff 0.3333333333333333 at x[0]: 1 beyond tolerance",
        ],
    )
    code, out, _ = run("backward", replayed, "--check", "--set", "w=2", "--json")
    assert code == 1
    assert out.endswith(
        '"nonfinite":{"values":null,"grads":null},'
        '"check":{"values":{"ok":false,"mismatches":3,"nodes":4,"unstored":0,'
        '"tolerance":{"float64":{"rtol":1e-09,"atol":1e-12},"float32":{"rtol":0.0001,"atol":1e-06}},'
        '"worst_abs":2.0,"worst_abs_at":[2,[1]],"worst_rel":0.3333333333333333,"worst_rel_at":[1,[]]},'
        '"grads":{"ok":false,"mismatches":1,"nodes":4,"unstored":0,'
        '"tolerance":{"float64":{"rtol":1e-09,"atol":1e-12},"float32":{"rtol":0.0001,"atol":1e-06}},'
        '"worst_abs":1.0,"worst_abs_at":[0,[0]],"worst_rel":0.3333333333333333,"worst_rel_at":[0,[0]]}}}\n'
    )
