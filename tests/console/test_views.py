"""graphsvc.console.views: what order, validate, inspect, ops and gradcheck print, for
examples/seed004.msgpack (L = (a*b + c)*(a + b)) and the builtin ops."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from graphsvc.console import views
from graphsvc.graph import Graph
from graphsvc.topo import reverse_topological_order

SEED004_INFO_TEXT = """\
file: examples/seed004.msgpack (685 bytes)
format version: 1.0
nodes: 7
edges: 8
leaves: 3 (a, b, c)
outputs: L
depth: 3
gradients stored: yes
ops: add 2, leaf 3, mul 2
plugins: graphsvc 0.1.0 (add, leaf, mul)
metadata: source: seed 004; expression: L = (a*b + c)*(a + b)
"""


@pytest.fixture(autouse=True)
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "0")  # plain text, as in a pipe


def test_order_as_text_and_json(seed004_file: Graph, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = reverse_topological_order(seed004_file, None, "kahn")
    views.print_order(seed004_file, nodes, "kahn", None, as_json=False, quiet=True)
    assert capsys.readouterr().out.splitlines()[:4] == [
        "6\tL\tmul\t4,5",
        "5\tapb\tadd\t0,1",
        "4\tabc\tadd\t3,2",
        "2\tc\tleaf\t-",
    ]
    views.print_order(seed004_file, nodes[:2], "kahn", 6, as_json=True, quiet=True)
    assert json.loads(capsys.readouterr().out) == {
        "algorithm": "kahn",
        "output": 6,
        "nodes": [
            {"id": 6, "name": "L", "op": "mul", "parents": [4, 5]},
            {"id": 5, "name": "apb", "op": "add", "parents": [0, 1]},
        ],
    }


def test_validity_line_escapes_the_file_name(seed004_file: Graph) -> None:
    assert views.validity_line("g\t.msgpack", seed004_file) == "g\\t.msgpack: valid graphsvc graph, 7 nodes, 8 edges"


def test_inspect_as_text_and_json(seed004_file: Graph, capsys: pytest.CaptureFixture[str]) -> None:
    views.print_info(seed004_file, (1, 0), "examples/seed004.msgpack", 685, as_json=False)
    assert capsys.readouterr().out == SEED004_INFO_TEXT
    info = views.graph_info(seed004_file, (1, 0), "-", None)
    assert {key: info[key] for key in ("file", "file_size", "nodes", "edges", "leaves", "depth", "tensors")} == {
        "file": "-",
        "file_size": None,
        "nodes": 7,
        "edges": 8,
        "leaves": 3,
        "depth": 3,
        "tensors": None,
    }
    assert info["outputs"] == [{"id": 6, "name": "L"}] and info["ops"] == {"leaf": 3, "mul": 2, "add": 2}
    assert views.info_rows(seed004_file, info)[0] == ["file", "-"]  # no size for standard input


def test_tensor_info_text() -> None:
    info = {"nodes": 1, "dtypes": {"float32": 1}, "value_bytes": 4096, "grad_bytes": 0}
    assert (
        views.tensor_info_text(info) == "1 node holds an array (float32 1); 4,096 bytes of values, 0 bytes of gradients"
    )


def test_ops_rows_and_json(registry: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rows = views.op_rows(registry)
    assert rows[:2] == [
        ["abs", "1", "1", "graphsvc 0.1.0", "vectorized"],
        ["add", "2", "1", "graphsvc 0.1.0", "vectorized"],
    ]
    views.print_ops(registry, as_json=True)
    add = next(op for op in json.loads(capsys.readouterr().out)["ops"] if op["name"] == "add")
    assert (add["arity"], add["plugin"], add["vectorized"], add["vjp"]) == (2, "graphsvc", True, False)


def test_op_detail_of_ops_taking_other_attributes_too() -> None:
    """An op whose forward takes ``**kwargs`` names what it declares and says it takes any others;
    its --json ``attributes`` is null (the replay checks none of its nodes' attributes)."""
    from graphsvc.ops import Op

    def some(x: Any, *, k: int = 2, **rest: Any) -> Any:
        return x

    def every(x: Any, y: Any, **rest: Any) -> Any:
        return x

    some_op = Op("some", 1, forward=some, vjp=lambda g, out, x, **a: (g,))
    every_op = Op("every", 2, forward=every, vjp=lambda g, out, x, y, **a: (g, g), variadic=True, max_arity=4)
    assert views.op_detail_lines(some_op)[2:4] == ["inputs: 1", "attributes: k=2; any others (not checked)"]
    assert views.op_detail_lines(every_op)[2:4] == ["inputs: 2 to 4 (variadic)", "attributes: any (not checked)"]
    assert views.op_detail(some_op)["attributes"] is None
    assert views.op_inputs(Op("cat", 1, forward=lambda *xs: xs[0], variadic=True)) == "1 or more"


def test_json_defaults_are_values_or_their_repr() -> None:
    assert views._json_default((1, [2.5, None], "s", True)) == [1, [2.5, None], "s", True]
    assert views._json_default(float("-inf")) == "-inf"
    assert views._json_default((1, frozenset())) == {"repr": "(1, frozenset())"}


def test_gradcheck_lines(registry: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from graphsvc.testing import check_registry

    results = check_registry(registry, ["add", "leaf"])
    views.print_gradcheck(results, as_json=False)
    assert capsys.readouterr().out == (
        "add (graphsvc 0.1.0): ok (20 points; max abs error 1.4e-10, max rel error 1.4e-10)\n"
        "leaf (graphsvc 0.1.0): nothing to check (a leaf tag)\n"
    )
    views.print_gradcheck(results, as_json=True)
    document = json.loads(capsys.readouterr().out)
    assert (document["ok"], document["failed"], [op["op"] for op in document["ops"]]) == (True, [], ["add", "leaf"])


def test_metadata_text_is_escaped_and_cut() -> None:
    from graphsvc.console.views import metadata_text

    many = {f"k{i}": i for i in range(22)}
    assert metadata_text({"a\tb": "x\ny", "n": [1, None], "long": "z" * 100}) == (
        "a\\tb: x\\ny; n: [1,null]; long: " + "z" * 60 + "... (100 characters)"
    )
    assert metadata_text(many).endswith("; k19: 19; and 2 more")


def _captured_like() -> Graph:
    """Names as a captured step has them: module paths, parameters with gradients, an input without."""
    import graphsvc
    from graphsvc.graph import GraphBuilder

    b = GraphBuilder()
    x = b.leaf(np.ones((2, 3)), name="input0")
    h = x
    for i in range(2):
        w = b.leaf(np.full((2, 3), 0.5), name=f"layers.{i}.linear.weight")
        h = b.add("tanh", [b.add("mul", [h, w], name=f"layers.{i}.linear.mul")], name=f"layers.{i}.act.tanh")
    # a fused op written as two (head.addmm.mm then head.addmm), and a 0-d parameter
    head = b.add("mul", [h, b.leaf(np.full((2, 3), 2.0), name="head.weight")], name="head.addmm.mm")
    head = b.add("mul", [head, b.leaf(2.0, name="head.scale")], name="head.addmm")
    head = b.add("mul", [head, b.const(np.array(0.5), name="mul.scalar")], name="mul")  # not a module
    loss = b.add("sum", [head], name="sum")
    graph = graphsvc.backward(b.build(outputs=[loss], metadata={"captured": {"torch": "2.13.0"}}))
    del graph.grad_arrays[0]  # PyTorch computed none for the input
    return graph


def test_a_captured_steps_module_tree_from_its_names() -> None:
    assert views.module_tree(_captured_like()) == [
        {"module": "layers", "depth": 0, "nodes": 6, "parameters": 12},
        {"module": "layers.0", "depth": 1, "nodes": 3, "parameters": 6},
        {"module": "layers.0.linear", "depth": 2, "nodes": 2, "parameters": 6},
        {"module": "layers.0.act", "depth": 2, "nodes": 1, "parameters": 0},
        {"module": "layers.1", "depth": 1, "nodes": 3, "parameters": 6},
        {"module": "layers.1.linear", "depth": 2, "nodes": 2, "parameters": 6},
        {"module": "layers.1.act", "depth": 2, "nodes": 1, "parameters": 0},
        {"module": "head", "depth": 0, "nodes": 4, "parameters": 7},
    ]
    rows = views.module_rows(views.module_tree(_captured_like()))
    assert rows[:3] == [["modules", "8 (nodes, parameters)"], ["  layers", "6, 12"], ["    0", "3, 6"]]
    assert rows[-1] == ["  head", "4, 7"]
