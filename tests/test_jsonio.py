"""The readable JSON form: exact round trips, hand-written graphs, cycle errors, bad documents."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc import jsonio
from graphsvc.errors import FormatError, GraphStructureError, GraphsvcError
from graphsvc.graph import GraphBuilder

ROOT = Path(__file__).resolve().parent.parent


def _import_golden() -> Any:
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "schemas" / "examples" / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _import_golden()
EXACT_IN_JSON = ["worked", "seed000", "grads", "attrs_metadata"]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "schemas" / "graphsvc-json-v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name", EXACT_IN_JSON)
def test_msgpack_json_msgpack_gives_identical_bytes(name: str) -> None:
    data = fmt.dumps(golden.GOLDEN[name]())
    assert fmt.dumps(jsonio.loads(jsonio.dumps(fmt.loads(data)))) == data


@pytest.mark.parametrize("name", sorted(golden.GOLDEN))
def test_json_documents_validate_against_the_schema(name: str, validator: jsonschema.Draft202012Validator) -> None:
    validator.validate(json.loads(jsonio.dumps(golden.GOLDEN[name]())))


def test_worked_example_json_text() -> None:
    assert json.loads(jsonio.dumps(golden.worked())) == {
        "format": "graphsvc-json",
        "version": [1, 0],
        "ops": {
            "leaf": {"plugin": None, "version": None},
            "const": {"plugin": None, "version": None},
            "mul": {"plugin": None, "version": None},
        },
        "nodes": [
            {"id": 0, "name": "a", "op": "leaf", "parents": [], "value": 2.0},
            {"id": 1, "name": None, "op": "const", "parents": [], "value": 3.0},
            {"id": 2, "name": "y", "op": "mul", "parents": [0, 1], "value": 6.0},
        ],
        "outputs": [2],
        "metadata": {},
    }
    assert jsonio.dumps(golden.worked()).startswith('{\n "format": "graphsvc-json",\n "version": [1, 0],')


def test_special_floats_become_strings_and_come_back() -> None:
    text = jsonio.dumps(golden.special_floats())
    values = [node["value"] for node in json.loads(text)["nodes"]]
    assert values == [-0.0, "inf", "-inf", "nan", "nan", "nan"]
    assert math.copysign(1.0, values[0]) == -1.0
    back = jsonio.loads(text)
    assert back.values[0] == 0.0 and math.copysign(1.0, back.values[0]) == -1.0
    assert back.values[1] == math.inf and back.values[2] == -math.inf
    assert all(math.isnan(v) for v in back.values[3:])  # JSON keeps no nan sign or payload


def test_shortest_repr_floats_survive_exactly() -> None:
    b = GraphBuilder()
    for value in (0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -2.5e-10):
        b.leaf(value)
    g = b.build()
    assert jsonio.loads(jsonio.dumps(g)).values.tolist() == g.values.tolist()


def _doc(nodes: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    return {"format": "graphsvc-json", "version": [1, 0], "nodes": nodes, **rest}


def test_hand_written_graph_with_ids_out_of_order_and_parents_by_name() -> None:
    g = jsonio.from_document(
        _doc(
            [
                {"id": 5, "name": "y", "op": "mul", "parents": ["a", 2]},
                {"id": 2, "op": "const", "value": 3},
                {"id": 9, "name": "a", "op": "leaf", "value": 2},
            ],
            outputs=["y"],
            ops={"mul": {"plugin": "graphsvc-extra-ops", "version": "1.0"}},
        )
    )
    # Parents first; ties keep the listed order: 2 (const) before 9 (a).
    assert [g.op(i) for i in range(3)] == ["const", "leaf", "mul"]
    assert g.parents(2) == [1, 0]
    assert g.names == {1: "a", 2: "y"}
    assert g.outputs == [2]
    assert g.values[:2].tolist() == [3.0, 2.0] and math.isnan(g.values[2])
    assert g.grads is None
    assert g.op_sources["mul"].plugin == "graphsvc-extra-ops"


def test_ids_default_to_list_positions() -> None:
    g = jsonio.from_document(_doc([{"op": "leaf", "value": 1}, {"op": "neg", "parents": [0], "grad": 1}]))
    assert g.parents(1) == [0]
    assert g.grads is not None and math.isnan(g.grads[0]) and g.grads[1] == 1.0


def test_outputs_left_out_are_the_sinks_and_an_empty_list_is_kept() -> None:
    nodes = [{"op": "leaf", "value": 2}, {"op": "exp", "parents": [0]}, {"op": "sin", "parents": [0]}]
    assert jsonio.from_document(_doc(nodes)).outputs == [1, 2]
    assert jsonio.from_document(_doc(nodes, outputs=[])).outputs == []


def test_a_cycle_is_refused_naming_its_nodes() -> None:
    nodes = [
        {"id": 0, "name": "a", "op": "f", "parents": ["c"]},
        {"id": 1, "name": "b", "op": "f", "parents": ["a"]},
        {"id": 2, "name": "c", "op": "f", "parents": [1]},
        {"id": 3, "op": "leaf"},
    ]
    with pytest.raises(GraphStructureError) as info:
        jsonio.from_document(_doc(nodes))
    assert str(info.value) == "the graph has a cycle: 0 (a) -> 1 (b) -> 2 (c) -> 0 (a)"
    with pytest.raises(FormatError) as as_text:
        jsonio.loads(json.dumps(_doc(nodes)))
    assert str(as_text.value) == "the graph has a cycle: 0 (a) -> 1 (b) -> 2 (c) -> 0 (a)"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "graphsvc"}, 'not a graphsvc JSON document (expected "format": "graphsvc-json")'),
        ({"format": "graphsvc-json", "version": [1]}, "version must be [major, minor]"),
        (
            {"format": "graphsvc-json", "version": [3, 0], "nodes": []},
            "the document uses JSON version 3.0, newer than this graphsvc reads",
        ),
        ({"format": "graphsvc-json", "version": [1, 0]}, "nodes must be a list"),
        (_doc([1]), "nodes[0] must be an object"),
        (_doc([{"id": -1, "op": "leaf"}]), "nodes[0].id must be a non-negative integer"),
        (_doc([{"id": 0, "op": "leaf"}, {"id": 0, "op": "leaf"}]), "nodes[1]: id 0 is used twice"),
        (_doc([{"op": "leaf", "name": 5}]), "nodes[0].name must be a non-empty string"),
        (_doc([{"op": "leaf", "name": "a"}, {"op": "leaf", "name": "a"}]), "name 'a' is used by nodes 0 and 1"),
        (_doc([{"op": "f", "parents": ["ghost"]}]), "node 0: no node is named 'ghost'"),
        (_doc([{"op": "f", "parents": [True]}]), "node 0: True is not a node id or name"),
        (_doc([{"op": "f", "parents": 0}]), "node 0: parents must be a list"),
        (_doc([{"op": "f", "parents": [7]}]), "node 0 has parent 7, which does not exist"),
        (_doc([{"op": "f", "parents": [0]}]), "the graph has a cycle: 0 -> 0"),
        (_doc([{"op": ""}]), "node 0: op must be a non-empty string"),
        (
            _doc([{"op": "leaf", "value": "NaN"}]),
            'node 0: value must be a number or one of "nan", "inf", "-inf", not \'NaN\'',
        ),
        (_doc([{"op": "leaf", "attrs": [1]}]), "node 0: attrs must be an object"),
        (_doc([{"op": "leaf"}], outputs=[4]), "output 4 does not exist"),
        (_doc([{"op": "leaf"}], outputs=[True]), "outputs: True is not a node id or name"),
        (_doc([{"op": "leaf"}], outputs=0), "outputs must be a list"),
        (_doc([{"op": "leaf"}], metadata=[]), "metadata must be an object"),
        (_doc([{"op": "leaf"}], ops=[]), "ops must be an object"),
        (_doc([{"op": "leaf"}], ops={"leaf": "x"}), "ops['leaf'] must be an object"),
        (_doc([{"op": "leaf"}], ops={"leaf": {"plugin": 3}}), "ops['leaf'].plugin must be a string or null, not 3"),
        (_doc([{"op": "leaf", "parents": [0]}]), "the graph has a cycle: 0 -> 0"),
        (_doc([{"op": "leaf"}, {"op": "leaf", "parents": [0]}]), "node 1 is a leaf but has parents"),
    ],
)
def test_bad_documents(document: dict[str, Any], message: str) -> None:
    with pytest.raises(FormatError) as info:
        jsonio.loads(json.dumps(document))
    assert str(info.value) == message


def test_bad_json_text() -> None:
    with pytest.raises(FormatError) as info:
        jsonio.loads('{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "value": NaN}]}')
    assert str(info.value) == 'JSON has a bare NaN; write it as a string ("nan", "inf", "-inf")'
    with pytest.raises(FormatError) as broken:
        jsonio.loads("{")
    assert (
        str(broken.value)
        == "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    with pytest.raises(FormatError, match=r"^not valid JSON: nested too deeply$"):
        jsonio.loads("[" * 100_000 + "]" * 100_000)


def test_metadata_json_cannot_hold_is_refused_with_a_message() -> None:
    b = GraphBuilder()
    b.leaf()
    with pytest.raises(GraphsvcError) as info:
        jsonio.dumps(b.build(metadata={"blob": b"\x00"}))
    assert str(info.value) == (
        "cannot write the graph as JSON: Object of type bytes is not JSON serializable "
        "(in JSON, attributes and metadata cannot hold nan, inf or bin data)"
    )


def test_arrays_of_numbers_and_strings_take_one_line_and_strings_stay_whole() -> None:
    b = GraphBuilder()
    name = 'x [1,\n 2] "q" \\ \u2028 ]'  # brackets, an escaped quote and backslash, a newline, U+2028
    x = b.leaf(np.arange(6, dtype=np.float32).reshape(2, 3), name=name)
    b.add("sum", [x], name="s", attrs={"axis": [0, 1], "tags": ["a, b", "]"]})
    text = jsonio.dumps(b.build())
    assert '   "parents": [0],\n' in text
    assert '    "shape": [2, 3],\n    "data": [\n     [0.0, 1.0, 2.0],\n     [3.0, 4.0, 5.0]\n    ]\n' in text
    assert '    "tags": ["a, b", "]"]\n' in text
    back = jsonio.loads(text)
    assert back.names == {0: name, 1: "s"}
    assert back.attrs == {1: {"axis": [0, 1], "tags": ["a, b", "]"]}}
    assert json.loads(text) == json.loads(json.dumps(jsonio.to_document(b.build())))  # the same document
