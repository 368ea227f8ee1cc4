"""The JSON form written a chunk of nodes at a time: the same bytes as the whole document through
``json.dumps``, in C and in Python, across chunks; a refused graph writes nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from graphsvc.errors import GraphsvcError
from graphsvc.format import jsonio
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.text import json_escaped
from tests.conftest import make_golden, require_native

golden = make_golden()


def whole_document(graph: Graph) -> str:
    """The JSON form as one ``json.dumps`` of the whole document (what ``dumps`` wrote before it
    streamed): the oracle the chunked writer must match byte for byte."""
    text = json.dumps(jsonio.to_document(graph), indent=1, ensure_ascii=False, allow_nan=False)
    return json_escaped(jsonio._FLAT_ARRAY.sub(jsonio._one_line, text)) + "\n"


def hostile() -> Graph:
    """Names, tags, attributes and metadata that need escapes, numbers at the edges of repr."""
    b = GraphBuilder()
    x = b.leaf(math.nan, name='a"\\\n\t\x01\u202e\u200b\U0001f600\x7f\x9b')
    y = b.add(
        'op "\u202e',
        [x, x],
        value=math.inf,
        name="é",
        attrs={"k\u202e": [1, 2.5, "s\n"], "n": {"deep": [[1, 2], [3]]}, "e": []},
    )
    b.add("mul", [y, x], value=-0.0, attrs={})
    graph = b.build(metadata={"m": [1, {"q": "\u2028"}], "nodes": []})
    graph.grads = np.array([1e-320, -math.inf, 5e16])
    return graph


def tensors_and_scalars() -> Graph:
    """Array nodes and scalar nodes with attributes mixed, so that specials fall in every chunk."""
    b = GraphBuilder()
    w = b.leaf(np.arange(6, dtype=np.float32).reshape(2, 3) / 7, name="w")
    nodes = [w]
    for i in range(9):
        if i % 3 == 0:
            nodes.append(b.add("relu", [nodes[-1]], value=np.full((2, 3), i, dtype=np.float64)))
        else:
            nodes.append(b.add("scale", [nodes[-1]], attrs={"by": i, "tag": f"s{i}"}, value=float(i)))
    graph = b.build()
    graph.grad_arrays = {w: np.ones((2, 3), dtype=np.float32)}
    return graph


def array_shapes() -> Graph:
    """Arrays of every kind of shape (0-d, empty along any axis, deep) and dtype, nan and inf in them."""
    b = GraphBuilder()
    f32 = np.array([[0.1, np.nan], [np.inf, -1e-45], [3.4e38, -0.0]], dtype=np.float32)
    for i, array in enumerate(
        [
            np.float64(2.5).reshape(()),
            np.zeros((0,)),
            np.zeros((2, 0)),
            np.zeros((0, 3)),
            np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 12,
            f32,
            np.array([np.nan, -np.inf, 1e300]),
            np.ones((1, 1, 1, 2)),
        ]
    ):
        b.leaf(array, name=f"a{i}")
    return b.build()


GRAPHS: dict[str, Callable[[], Graph]] = {
    **{f"golden v2 {name}": make for name, make in golden.GOLDEN_V2.items()},
    "array shapes": array_shapes,
    **{f"golden {name}": make for name, make in golden.GOLDEN.items()},
    "hostile": hostile,
    "tensors and scalars": tensors_and_scalars,
    "empty": lambda: GraphBuilder().build(),
}


@pytest.fixture(params=["C", "Python"])
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "C":
        require_native("text")
    else:
        monkeypatch.setattr(jsonio, "extension", lambda name: None)
    return str(request.param)


@pytest.mark.parametrize("chunk", [1, 2, 4, 1 << 16])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_chunks_give_the_whole_documents_bytes(
    name: str, chunk: int, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonio, "CHUNK_NODES", chunk)
    graph = GRAPHS[name]()
    pieces = list(jsonio.chunks(graph))
    expected = whole_document(graph)
    assert b"".join(pieces).decode() == expected
    assert jsonio.dumps(graph) == expected
    assert len(pieces) == (1 if not graph.num_nodes else 2 + -(-graph.num_nodes // chunk))


def test_the_text_of_a_small_graph(writer: str) -> None:
    b = GraphBuilder()
    a = b.leaf(2.0, name="a\u202e")
    y = b.add("pow", [a], value=4.0, attrs={"exponent": 2.0, "axes": [0, 1]})
    graph = b.build(outputs=[y], metadata={"by": "hand"})
    graph.grads = np.array([4.0, math.nan])
    assert jsonio.dumps(graph) == (
        "{\n"
        ' "format": "graphsvc-json",\n'
        ' "version": [1, 0],\n'
        ' "ops": {\n  "leaf": {\n   "plugin": null,\n   "version": null\n  },\n'
        '  "pow": {\n   "plugin": null,\n   "version": null\n  }\n },\n'
        ' "nodes": [\n'
        '  {\n   "id": 0,\n   "name": "a\\u202e",\n   "op": "leaf",\n   "parents": [],\n'
        '   "value": 2.0,\n   "grad": 4.0\n  },\n'
        '  {\n   "id": 1,\n   "name": null,\n   "op": "pow",\n   "parents": [0],\n'
        '   "value": 4.0,\n   "grad": "nan",\n   "attrs": {\n    "exponent": 2.0,\n    "axes": [0, 1]\n   }\n  }\n'
        " ],\n"
        ' "outputs": [1],\n'
        ' "metadata": {\n  "by": "hand"\n }\n'
        "}\n"
    )


def test_a_chain_of_many_chunks_reads_back(writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonio, "CHUNK_NODES", 1000)
    b = GraphBuilder()
    node = b.leaf(0.5, name="x")
    for i in range(2500):
        node = b.add("tanh" if i % 2 else "mul", [node, node] if i % 2 == 0 else [node], value=i / 3)
    graph = b.build()
    text = jsonio.dumps(graph)
    assert text == whole_document(graph)
    again = jsonio.loads(text)
    assert again.values.tolist() == graph.values.tolist()
    assert again.parent_indices.tolist() == graph.parent_indices.tolist()


@pytest.mark.parametrize(
    ("where", "bad", "said"),
    [
        ("attrs", math.nan, "Out of range float values are not JSON compliant: nan"),
        ("attrs", b"\x00", "Object of type bytes is not JSON serializable"),
        ("metadata", -math.inf, "Out of range float values are not JSON compliant: -inf"),
    ],
)
def test_a_graph_json_cannot_hold_is_refused_before_any_chunk(
    where: str, bad: Any, said: str, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonio, "CHUNK_NODES", 2)
    b = GraphBuilder()
    node = b.leaf(1.0)
    for _ in range(6):
        node = b.add("scale", [node], value=1.0, attrs={"by": 2})
    graph = b.build()
    if where == "attrs":
        graph.attrs[node] = {"by": [1, bad]}  # the last node: its chunk would be the last
    else:
        graph.metadata = {"x": bad}
    stream = jsonio.chunks(graph)
    with pytest.raises(GraphsvcError) as raised:
        next(stream)
    assert str(raised.value) == (
        f"cannot write the graph as JSON: {said} (in JSON, attributes and metadata cannot hold nan, inf or bin data)"
    )


def test_rows_of_floats_in_c_are_what_json_dumps_writes() -> None:
    text = require_native("text")
    bits = np.random.default_rng(7).integers(0, 2**64, size=6009, dtype=np.uint64)
    special = [0.0, -0.0, 5e-324, 1e16, 1e-5, 0.1, 2.0**53, math.nan, math.inf, -math.inf, 1.7976931348623157e308]
    values = np.concatenate([bits.view(np.float64), special])  # any bits: nan, subnormal, huge, tiny
    rows = text.json_float_rows(values, 7)
    items = [jsonio.json_float(x) for x in values.tolist()]
    assert rows == [json.dumps(items[i : i + 7]) for i in range(0, len(items), 7)]
    with pytest.raises(ValueError, match=r"^json_float_rows: the values are not rows of that width$"):
        text.json_float_rows(values[:10], 7)


def test_attributes_are_refused_before_metadata_as_in_the_document(writer: str) -> None:
    b = GraphBuilder()
    b.add("scale", [b.leaf(1.0)], value=1.0, attrs={"lr": math.nan})
    graph = b.build(metadata={"blob": b"\x00"})
    with pytest.raises(GraphsvcError, match=r"^cannot write the graph as JSON: Out of range float values .*: nan "):
        next(jsonio.chunks(graph))
