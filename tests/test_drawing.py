"""graphsvc.draw (graphsvc/drawing.py): the picture a notebook shows; the short reprs of Graph and Value."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import graphsvc
from graphsvc import GraphBuilder, Value
from graphsvc.console.notebook import Drawing
from graphsvc.errors import TooLargeToDraw, UsageError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    """Every text of an SVG, as a viewer reads it (the XML parses: names are escaped)."""
    return [(t.text or "").strip() for t in ET.fromstring(svg).iter(f"{SVG}text")]


def seed004_values() -> Value:
    a, b, c = Value(2.0, name="a"), Value(3.0, name="b"), Value(1.0, name="c")
    loss = (a * b + c) * (a + b)
    loss.name = "L"
    loss.backward()
    return loss


@pytest.mark.usefixtures("graphviz_dot")
def test_a_value_draws_its_graph_with_numbers() -> None:
    drawing = graphsvc.draw(seed004_values())
    assert isinstance(drawing, Drawing) and drawing.nodes == list(range(7))
    svg = drawing._repr_svg_()
    assert svg is not None and svg == drawing.svg
    shown = texts(svg)
    # each value node is a record name | data | grad; micrograd's draw_dot shows the same three
    for name, data, grad in [("a", "2", "22"), ("b", "3", "17"), ("c", "1", "5"), ("L", "35", "1")]:
        assert name in shown and f"data {data}" in shown and f"grad {grad}" in shown
    assert shown.count("mul") == 2 and shown.count("add") == 2
    assert repr(drawing) == "<Drawing of 7 nodes>"


@pytest.mark.usefixtures("graphviz_dot")
def test_a_graph_and_a_neighbourhood(tmp_path: Path) -> None:
    graph = graphsvc.load(EXAMPLES / "micrograd_mlp.msgpack")
    near = graphsvc.draw(graph, around="loss", depth=1)
    assert near.nodes == sorted([graph.node_id("loss"), *graph.parents(graph.node_id("loss"))])
    out = near.save(tmp_path / "loss.svg")
    assert out.read_text(encoding="utf-8") == near.svg
    assert near.save(tmp_path / "loss.dot").read_text(encoding="utf-8") == near.dot


def test_too_big_and_bad_arguments() -> None:
    b = GraphBuilder()
    node = b.leaf(1.0, "x")
    for _ in range(2000):
        node = b.add("neg", [node])
    graph = b.build()
    with pytest.raises(TooLargeToDraw) as caught:
        graphsvc.draw(graph)
    assert str(caught.value) == (
        "the graph has 2001 nodes, more than one picture can show (2000); draw one node's neighbourhood "
        "(around=, depth=)"
    )
    assert graphsvc.draw(graph, around="x", depth=3).nodes == [0, 1, 2, 3]
    with pytest.raises(
        UsageError, match=r"^depth= goes with around=: it limits the picture to the nodes near that one$"
    ):
        graphsvc.draw(graph, depth=3)
    with pytest.raises(UsageError, match=r"^draw\(\) takes a Graph, a graphsvc Value or a micrograd Value, not int$"):
        graphsvc.draw(3)


@pytest.mark.usefixtures("graphviz_dot")
def test_names_are_escaped() -> None:
    b = GraphBuilder()
    name = '<script>alert("x")</script> & co'
    b.add("neg", [b.leaf(1.0, name)], name="out")
    shown = texts(graphsvc.draw(b.build()).svg)
    assert name in shown


def test_micrograd_values_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    micrograd = pytest.importorskip("micrograd.engine", reason="needs micrograd: pip install micrograd==0.1.0")
    a, b = micrograd.Value(2.0), micrograd.Value(-3.0)
    out = a * b + a
    out.backward()
    drawing = graphsvc.draw(out)
    assert drawing.graph.num_nodes == 4 and "grad 1" in drawing.dot.replace("\\", "")


def test_graph_repr_is_one_short_line() -> None:
    graph = graphsvc.load(EXAMPLES / "seed004.msgpack")
    assert repr(graph) == "<Graph: 7 nodes (3 leaves), 8 edges, ops add×2 mul×2, output 'L', float64 scalars, grads>"
    b = GraphBuilder()
    w = b.leaf(np.zeros((64, 128), dtype=np.float32), "w")
    b.add("sum", [b.add("mul", [w, b.const(np.float32(2.0))])], name="loss")
    assert repr(b.build()) == (
        "<Graph: 4 nodes (1 leaf, 1 const), 3 edges, ops mul×1 sum×1, output 'loss', "
        "tensors float32 (largest [64, 128])>"
    )
    b = GraphBuilder()
    node = b.leaf(1.0)
    for _ in range(999_999):
        node = b.add("neg", [node])
    big = b.build()
    start = time.perf_counter()
    text = repr(big)
    assert time.perf_counter() - start < 0.5
    assert text == "<Graph: 1,000,000 nodes (1 leaf), 999,999 edges, ops neg×999,999, output #999999, float64 scalars>"


def test_value_repr_is_short() -> None:
    loss = seed004_values()
    assert repr(loss) == "Value(name='L', data=35.0, grad=1.0)"
    big = Value(1.0)
    big.data = np.zeros((1000, 1000))  # type: ignore[assignment]
    assert repr(big) == "Value(data=<array [1000, 1000] float64>, grad=0.0)"


def test_draw_is_graphsvc_draw() -> None:
    from graphsvc.drawing import draw

    assert graphsvc.draw is draw
