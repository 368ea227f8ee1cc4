"""graphsvc.console.report: the report of a replay, as text and as JSON, for a hand-checkable graph
(examples/seed004.msgpack: L = (a*b + c)*(a + b), a=2, b=3, c=1; gradients a=22, b=17, c=5), and
its pieces: the --check line and item, the nan/inf line and item, the --steps lines, the writers
of columns and of arrays, the option checks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from graphsvc.console import report
from graphsvc.errors import UsageError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.replay.compare import Comparison, NonFinite, Tolerance
from graphsvc.replay.run import ReplayRun, replay_values
from tests.conftest import SEED004_BACKWARD_PLAIN

STEPS = """\
step 1: L (mul) grad = 1.0
  -> abc: local derivative 5.0, adds 5.0
  -> apb: local derivative 7.0, adds 7.0
step 2: apb (add) grad = 7.0
  -> a: local derivative 1.0, adds 7.0
  -> b: local derivative 1.0, adds 7.0
step 3: abc (add) grad = 5.0
  -> ab: local derivative 1.0, adds 5.0
  -> c: local derivative 1.0, adds 5.0
step 4: ab (mul) grad = 5.0
  -> a: local derivative 3.0, adds 15.0
  -> b: local derivative 2.0, adds 10.0
step 5: c (leaf) grad = 5.0
step 6: b (leaf) grad = 17.0
step 7: a (leaf) grad = 22.0
"""

CHECKS_OK = (
    "check values (float64: rtol 1e-9, atol 1e-12): worst abs diff 0.0 at a, worst rel diff 0.0 at a: ok\n"
    "check grads (float64: rtol 1e-9, atol 1e-12): worst abs diff 0.0 at a, worst rel diff 0.0 at a: ok\n"
)


def backward(graph: Graph, registry: Any, **options: Any) -> ReplayRun:
    return replay_values(graph, registry, {}, 6, find_nonfinite=True, **options)


def printed(capsys: pytest.CaptureFixture[str], result: ReplayRun, as_json: bool = False) -> str:
    report.print_report(result, as_json, quiet=True)
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_backward_with_steps_and_check_as_text(
    seed004_file: Graph, registry: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    result = backward(seed004_file, registry, steps=True, check=(1e-9, 1e-12))
    assert result.ok and not result.arrays
    assert printed(capsys, result) == STEPS + "\n" + SEED004_BACKWARD_PLAIN + CHECKS_OK


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_steps_are_written_a_chunk_at_a_time_numbered_through(
    seed004_file: Graph, registry: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """--steps writes STEP_CHUNK steps at a time (their text is never all held): the same text,
    numbered through, whatever the chunk; for arrays too (norms worked out a chunk at a time)."""
    monkeypatch.setattr(report, "STEP_CHUNK", chunk)
    result = backward(seed004_file, registry, steps=True, check=(1e-9, 1e-12))
    assert printed(capsys, result) == STEPS + "\n" + SEED004_BACKWARD_PLAIN + CHECKS_OK
    arrays = replay_values(seed004_file, registry, {0: np.array(2.0)}, 6, steps=True)
    lines = printed(capsys, arrays).splitlines()
    monkeypatch.setattr(report, "STEP_CHUNK", 4096)
    assert lines == printed(capsys, arrays).splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("step")] == [f"step {i}" for i in range(1, 8)]


def test_backward_as_json(seed004_file: Graph, registry: Any, capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(printed(capsys, backward(seed004_file, registry, steps=True), as_json=True))
    assert list(document) == ["output", "steps", "nodes", "nonfinite"]  # no "check" without --check
    assert document["output"] == 6
    assert document["steps"][3] == {
        "node": 3,
        "grad": 5.0,
        "contributions": [{"parent": 0, "local": 3.0, "adds": 15.0}, {"parent": 1, "local": 2.0, "adds": 10.0}],
    }
    assert {node["name"]: (node["value"], node["grad"]) for node in document["nodes"]} == {
        "L": (35.0, 1.0),
        "apb": (5.0, 7.0),
        "abc": (7.0, 5.0),
        "ab": (6.0, 5.0),
        "c": (1.0, 5.0),
        "b": (3.0, 17.0),
        "a": (2.0, 22.0),
    }
    assert document["nonfinite"] == {"values": None, "grads": None}


def test_a_forward_report_says_where_inf_first_appears(
    seed004_file: Graph, registry: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    result = replay_values(seed004_file, registry, {0: np.inf}, find_nonfinite=True)
    assert result.nonfinite == {"values": NonFinite("values", 0, np.inf, 5)}
    lines = printed(capsys, result).splitlines()
    assert lines[0] == "6\tL\tmul\t4,5\tinf"
    assert lines[-1] == "nonfinite values: first at a (node 0, leaf) = inf; 5 of 7 nodes"
    document = json.loads(printed(capsys, result, as_json=True))
    assert document["nonfinite"] == {
        "values": {"node": 0, "name": "a", "op": "leaf", "value": "inf", "count": 5}  # no index: scalars
    }


def test_a_check_beyond_tolerance_names_the_worst_nodes(seed004_file: Graph) -> None:
    values = Comparison("values", 0.5, (4, ()), 0.5 / 7, (4, ()), 1, 0, 7, (("float64", Tolerance(1e-9, 0.0)),))
    assert report.comparison_line(seed004_file, values) == (
        "check values (float64: rtol 1e-9, atol 0): worst abs diff 0.5 at abc, worst rel diff 0.07142857142857142"
        " at abc: 1 beyond tolerance"
    )
    assert report.check_item(seed004_file, values) == {
        "ok": False,
        "mismatches": 1,
        "nodes": 7,
        "unstored": 0,
        "tolerance": {"float64": {"rtol": 1e-9, "atol": 0.0}},
        "worst_abs": 0.5,
        "worst_abs_node": 4,
        "worst_rel": 0.5 / 7,
        "worst_rel_node": 4,
    }
    unstored = Comparison("grads", 0.0, None, 0.0, None, 0, 7, 7)
    assert report.comparison_line(seed004_file, unstored) == (
        "check grads: 7 of 7 nodes have no gradient to compare; worst abs diff 0.0 at -, worst rel diff 0.0 at -: ok"
    )


def tensor_graph() -> Graph:
    b = GraphBuilder()
    x = b.leaf(np.array([[1.0, 2.0], [3.0, 4.0]]), name="x")
    b.add("sum", [b.add("mul", [x, x], name="sq")], name="loss")
    return b.build()


def test_a_tensor_graph_s_findings_say_where_in_the_array(registry: Any) -> None:
    graph = tensor_graph()
    found = NonFinite("values", 1, -np.inf, 2, (1, 0))
    assert (
        report.nonfinite_line(graph, found) == "nonfinite values: first at sq[1,0] (node 1, mul) = -inf; 2 of 3 nodes"
    )
    assert report.nonfinite_item(graph, found) == {
        "node": 1,
        "name": "sq",
        "op": "mul",
        "index": [1, 0],
        "value": "-inf",
        "count": 2,
    }
    mixed = (("float64", Tolerance(1e-9, 1e-12)), ("float32", Tolerance(1e-4, 1e-6)), ("int64", Tolerance(0.0, 0.0)))
    differs = Comparison("values", 0.25, (1, (1, 0)), 0.25 / 9, (1, (1, 0)), 1, 0, 3, mixed)
    assert report.check_item(graph, differs)["worst_abs_at"] == [1, [1, 0]]
    assert report.check_item(graph, differs)["tolerance"] == {
        "float64": {"rtol": 1e-9, "atol": 1e-12},
        "float32": {"rtol": 1e-4, "atol": 1e-6},
        "int64": {"rtol": 0.0, "atol": 0.0},
    }
    assert report.comparison_line(graph, differs).startswith(
        "check values (float64: rtol 1e-9, atol 1e-12; float32: rtol 1e-4, atol 1e-6; int64: rtol 0, atol 0): "
        "worst abs diff 0.25 at sq[1,0], "
    )


def test_the_writer_follows_the_container_of_the_numbers(registry: Any) -> None:
    graph = tensor_graph()
    result = replay_values(graph, registry, {}, 2, steps=True, find_nonfinite=True)
    assert result.arrays
    writer = report.cells(result)
    assert isinstance(writer, report.ArrayCells) and writer.align == "left"
    assert report.step_lines(graph, result.steps or [], writer) == [
        "step 1: loss (sum) grad f64[] norm 1",
        "  -> sq: f64[2,2] norm 2",
        "step 2: sq (mul) grad f64[2,2] norm 2",
        "  -> x: f64[2,2] norm 5.47723",  # mul's VJP sends each input g * the other: x, norm sqrt(30)
        "  -> x: f64[2,2] norm 5.47723",
        "step 3: x (leaf) grad f64[2,2] norm 10.9545",  # 2x
    ]


def test_the_option_checks(seed004_file: Graph) -> None:
    from pathlib import Path

    report.check_options(True, 1e-6, 0.0, False, False, Path("out.msgpack"))  # all fine
    with pytest.raises(UsageError, match=r"^--rtol goes with --check: it is the relative tolerance"):
        report.check_options(False, 1e-6, None, False, False)
    with pytest.raises(UsageError, match=r"^--atol must be a finite number, 0 or more, not -1.0$"):
        report.check_options(True, None, -1.0, False, False)
    with pytest.raises(UsageError, match=r"^--data goes with --json"):
        report.check_options(False, None, None, False, True)
    with pytest.raises(UsageError, match=r"^--write -: standard output holds the listing"):
        report.check_options(False, None, None, False, False, Path("-"))
    report.check_stored(seed004_file, backward=True)
    seed004_file.grads = None
    with pytest.raises(UsageError, match=r"^--check: the file stores no gradients to compare with$"):
        report.check_stored(seed004_file, backward=True)


def test_set_notes_say_when_a_leaf_changes_dtype_or_shape() -> None:
    graph = tensor_graph()
    assert report.set_notes(graph, {0: np.zeros((2, 2))}) == []
    assert report.set_notes(graph, {0: np.zeros(3, dtype=np.float32)}) == [
        "Note: --set x: f32[3] replaces the file's f64[2,2]"
    ]
