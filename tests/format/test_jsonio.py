"""The readable JSON form: exact round trips, hand-written graphs, cycle errors, bad documents."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import jsonschema
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphStructureError, GraphsvcError, UnknownKeyWarning
from graphsvc.format import jsonio
from graphsvc.graph import GraphBuilder
from tests.conftest import ROOT, json_schema, make_golden

golden = make_golden()
EXACT_IN_JSON = ["worked", "seed000", "grads", "attrs_metadata"]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return json_schema("graphsvc-json-v1.schema.json")


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
        (_doc([{"op": "leaf", "attrs": [1]}]), "node 0: attrs must be an object, not an array"),
        (_doc([{"op": "leaf"}], outputs=[4]), "output 4 does not exist"),
        (_doc([{"op": "leaf"}], outputs=[True]), "outputs: True is not a node id or name"),
        (_doc([{"op": "leaf"}], outputs=0), "outputs must be a list"),
        (_doc([{"op": "leaf"}], metadata=[]), "metadata must be an object"),
        (_doc([{"op": "leaf"}], ops=[]), "ops must be an object"),
        (_doc([{"op": "leaf"}], ops={"leaf": "x"}), "ops['leaf'] must be an object, not a string"),
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
    assert '"name": "x [1,\\n 2] \\"q\\" \\\\ \\u2028 ]"' in text  # U+2028 as its escape, inert on a terminal
    back = jsonio.loads(text)
    assert back.names == {0: name, 1: "s"}
    assert back.attrs == {1: {"axis": [0, 1], "tags": ["a, b", "]"]}}
    assert json.loads(text) == json.loads(json.dumps(jsonio.to_document(b.build())))  # the same document


# -- the JSON form holds the graphs the msgpack form holds, no more (FORMAT.md §13) -------------------
def _text(nodes: str, rest: str = "", version: str = "1, 0") -> str:
    return f'{{"format": "graphsvc-json", "version": [{version}], "nodes": [{nodes}]{rest}}}'


LONE_SURROGATES = [
    (_text('{"op": "leaf", "name": "a\\ud800"}'), "the string at nodes[0].name holds a lone surrogate (\\ud800)"),
    (_text('{"op": "neg\\uDFFF"}'), "the string at nodes[0].op holds a lone surrogate (\\udfff)"),
    (
        _text('{"op": "leaf", "attrs": {"k": ["x", "\\udc80"]}}'),
        "the string at nodes[0].attrs.k[1] holds a lone surrogate (\\udc80)",
    ),
    (
        _text('{"op": "leaf", "attrs": {"ok": 1, "k\\ud83d": 1}}'),
        "a key of the object at nodes[0].attrs (entry 1) holds a lone surrogate (\\ud83d)",
    ),
    (
        _text('{"op": "leaf"}', ', "metadata": {"run": "\\ude00\\ud83d"}'),
        "the string at metadata.run holds a lone surrogate (\\ude00)",
    ),
    (
        _text('{"op": "leaf"}', ', "metadata": {"a b": {"\\udc80": 1}}'),
        "a key of the object at metadata['a b'] (entry 0) holds a lone surrogate (\\udc80)",
    ),
    (
        _text('{"op": "leaf"}', ', "ops": {"leaf": {"plugin": "p\\udc80"}}'),
        "the string at ops.leaf.plugin holds a lone surrogate (\\udc80)",
    ),
    (
        _text('{"op": "leaf"}', ', "ops": {"unused": {"version": "\\udc80"}}'),
        "the string at ops.unused.version holds a lone surrogate (\\udc80)",
    ),
    (_text('{"op": "leaf"}', ', "future": ["\\udc80"]'), "the string at future[0] holds a lone surrogate (\\udc80)"),
    (
        _text('{"op": "leaf", "\\udc80": 1}'),
        "a key of the object at nodes[0] (entry 1) holds a lone surrogate (\\udc80)",
    ),
    ('{"\\udc80": 1, "format": "graphsvc-json"}', "a key of the document (entry 0) holds a lone surrogate (\\udc80)"),
    (
        _text('{"op": "leaf", "name": "\ud800"}'),
        "the string at nodes[0].name holds a lone surrogate (\\ud800)",
    ),  # in the text
]


@pytest.mark.parametrize(("text", "message"), LONE_SURROGATES)
def test_a_lone_surrogate_anywhere_is_refused_naming_where_it_is(text: str, message: str) -> None:
    # not Unicode text: msgpack's strings are UTF-8, which cannot encode it (the msgpack reader
    # refuses one as invalid UTF-8)
    with pytest.raises(FormatError) as info:
        jsonio.loads(text)
    assert str(info.value) == message + ", which is not Unicode text"


def test_surrogate_pairs_and_text_that_only_spells_an_escape_are_text() -> None:
    text = _text('{"op": "leaf", "name": "\\ud83d\\ude00 \\\\ud800 \U0001f600", "attrs": {"\\uD83D\\uDE00": 1}}')
    graph = jsonio.loads(text)
    assert graph.names == {0: "\U0001f600 \\ud800 \U0001f600"}
    assert graph.attrs == {0: {"\U0001f600": 1}}
    assert fmt.loads(fmt.dumps(graph)).names == graph.names
    assert not jsonio._may_hold_surrogates('"\\ud83d\\ude00", "\\u00e9"')  # a pair: no second parse
    assert jsonio._may_hold_surrogates('"\\ud83d\\ud83d\\ude00"') and jsonio._may_hold_surrogates('"\\ude00"')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_text('{"op": "leaf"}', ', "outputs": [], "outputs": [0]'), "the document repeats the key 'outputs'"),
        (_text('{"op": "leaf", "value": 1, "value": 2}'), "the object at nodes[0] repeats the key 'value'"),
        (
            _text('{"op": "leaf", "attrs": {"a": {"b": 1, "b": 1}}}'),
            "the object at nodes[0].attrs.a repeats the key 'b'",
        ),
        (_text('{"op": "leaf"}', ', "ops": {"leaf": {}, "leaf": {}}'), "the object at ops repeats the key 'leaf'"),
        (
            _text(
                '{"op": "leaf", "value": {"dtype": "float32", "dtype": "int64", "shape": [], "data": 1}}',
                version="2, 0",
            ),
            "the object at nodes[0].value repeats the key 'dtype'",
        ),
        (
            _text('{"op": "leaf", "\\u006fp": "neg"}'),
            "the object at nodes[0] repeats the key 'op'",
        ),  # escaped, still "op"
    ],
)
def test_a_repeated_key_is_refused_naming_the_object(text: str, message: str) -> None:
    # json keeps the last value; the msgpack reader refuses a map that repeats a key (FORMAT.md §9)
    with pytest.raises(FormatError) as info:
        jsonio.loads(text)
    assert str(info.value) == message


def test_a_problem_before_a_repeated_key_is_reported_first() -> None:
    with pytest.raises(FormatError) as info:
        jsonio.loads(_text('{"op": "leaf", "value": 1e999, "value": 2}'))
    assert str(info.value) == 'the number 1e999 is too large for a float64 (write "inf" or "-inf" for an infinity)'


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (_doc([{"op": "leaf", "attrs": None}]), "node 0: attrs must be an object, not null"),
        (_doc([{"op": "leaf", "attrs": []}]), "node 0: attrs must be an object, not an array"),
        (_doc([{"op": "leaf", "attrs": False}]), "node 0: attrs must be an object, not false"),
        (_doc([{"op": "leaf"}], ops={"leaf": None}), "ops['leaf'] must be an object, not null"),
        (_doc([{"op": "leaf"}], ops={"unused": 0}), "ops['unused'] must be an object, not a number"),
        (
            _doc([{"op": "leaf"}], ops={"u\x1b" * 30: 0}),
            "ops['" + "u\\x1b" * 10 + "u... (60 characters)'] must be an object, not a number",
        ),
        (
            _doc([{"op": "leaf"}], ops={"leaf": {"plugin": [1] * 10_000}}),
            "ops['leaf'].plugin must be a string or null, not an array",
        ),
        (
            _doc([{"op": "leaf"}], ops={"leaf": {"plugin": True}}),
            "ops['leaf'].plugin must be a string or null, not true",
        ),
        (
            _doc([{"op": "leaf"}], ops={"unused": {"version": 1.5}}),
            "ops['unused'].version must be a string or null, not 1.5",
        ),
        (
            _doc([{"op": "leaf", "value": {"dtype": "float32", "shape": [1], "data": [1.0]}}]),
            "node 0: value is an array object, which needs JSON version 2.0 (the document's version is 1.0)",
        ),
        (
            _doc([{"op": "leaf", "grad": {"dtype": "int64", "shape": [], "data": 1}}], version=[1, 3]),
            "node 0: grad is an array object, which needs JSON version 2.0 (the document's version is 1.3)",
        ),
        (_doc([{"id": 1.0, "op": "leaf"}]), "nodes[0].id must be a non-negative integer"),
        (_doc([{"id": True, "op": "leaf"}]), "nodes[0].id must be a non-negative integer"),
        (_doc([{"op": "leaf"}, {"op": "neg", "parents": [0.0]}]), "node 1: 0.0 is not a node id or name"),
        (_doc([{"op": "leaf"}], outputs=[0.0]), "outputs: 0.0 is not a node id or name"),
        (_doc([{"op": "leaf"}], version=[1.0, 0]), "version must be [major, minor]"),
        (
            _doc([{"op": "leaf", "value": True}]),
            'node 0: value must be a number or one of "nan", "inf", "-inf", not True',
        ),
    ],
)
def test_what_the_msgpack_form_cannot_hold_is_refused(document: dict[str, Any], message: str) -> None:
    with pytest.raises(FormatError) as info:
        jsonio.loads(json.dumps(document))
    assert str(info.value) == message


def test_an_empty_attrs_object_is_no_attributes() -> None:
    assert jsonio.loads(json.dumps(_doc([{"op": "leaf", "attrs": {}}]))).attrs == {}


def test_unknown_keys_are_ignored_in_every_object_as_a_newer_minor_version_may_add_them() -> None:
    # FORMAT.md §2 and §13: the document, a node, an ops entry and a tensor object
    plain = _doc([{"op": "leaf", "value": {"dtype": "float32", "shape": [2], "data": [1.5, -2.0]}}], version=[2, 0])
    extended = _doc(
        [{"op": "leaf", "value": {"dtype": "float32", "shape": [2], "data": [1.5, -2.0], "unit": "m"}, "x": 1}],
        version=[2, 1],
        ops={"leaf": {"plugin": None, "version": None, "hash": "ab"}},
        future={"k": [1]},
    )
    with pytest.warns(UnknownKeyWarning) as warned:  # ignored, each said (graphsvc.format.keys)
        read = jsonio.loads(json.dumps(extended))
    assert [str(w.message) for w in warned] == [
        "the document: unknown key 'future'; ignored",
        "ops['leaf']: unknown key 'hash'; ignored",
        "nodes[0]: unknown key 'x'; ignored",
        "nodes[0].value: unknown key 'unit'; ignored",
    ]
    assert fmt.dumps(read) == fmt.dumps(jsonio.loads(json.dumps(plain)))
    schema = json.loads((ROOT / "schemas" / "graphsvc-json-v2.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(extended)


def test_a_string_longer_than_the_limit_is_refused_as_the_msgpack_reader_refuses_it() -> None:
    limits = fmt.Limits(max_string_length=40)
    at_limit = json.dumps(_doc([{"op": "leaf", "name": "x" * 40}], metadata={"k": ["é" * 20]}))
    assert fmt.load(io.BytesIO(at_limit.encode()), limits).names == {0: "x" * 40}
    for document, message in [
        (_doc([{"op": "leaf", "name": "x" * 41}]), "the name of node 0 is 41 bytes long"),
        (_doc([{"op": "leaf"}], metadata={"k": ["é" * 21]}), "a string in metadata is 42 bytes long"),
        (_doc([{"op": "leaf", "attrs": {"é" * 21: 1}}]), "a map key in the attribute map of node 0 is 42 bytes long"),
        (_doc([{"op": "o" * 41}]), f"the op tag '{'o' * 21}... (41 characters)' is 41 bytes long"),
        (_doc([{"op": "leaf"}], ops={"leaf": {"plugin": "p" * 41}}), "the plugin of the op 'leaf' is 41 bytes long"),
    ]:
        with pytest.raises(FormatError) as info:
            fmt.load(io.BytesIO(json.dumps(document).encode()), limits)
        assert str(info.value) == "the stream: " + message + ", longer than the 40 bytes a reader accepts"


def test_the_json_writer_refuses_what_its_reader_refuses() -> None:
    b = GraphBuilder()
    b.leaf(1.0, name="x\udc80")
    with pytest.raises(FormatError) as info:
        jsonio.dumps(b.build())
    assert str(info.value) == "the name of node 0 holds a lone surrogate (\\udc80), which is not Unicode text"
    b = GraphBuilder()
    b.leaf(1.0)
    with pytest.raises(FormatError) as deep:
        jsonio.dumps(b.build(metadata={"k": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}))
    assert str(deep.value) == "metadata nests deeper than 32 levels"


def test_the_surrogate_scan_misses_no_lone_surrogate_after_an_escaped_backslash() -> None:
    """``"\\\\ud800\\udc00"`` is a backslash, ``ud800`` and a lone low surrogate: the scan took the
    text after the escaped backslash for a high surrogate's escape and the low one for its pair."""
    import random

    from graphsvc.text import first_surrogate

    pieces = ["\\\\", "\\ud800", "\\udc00", "\\uD83D", "\\uDE00", "\\u0041", "u", "d800", "a"]
    rng = random.Random(3)
    missed = []
    for _ in range(5000):
        literal = '"' + "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 7))) + '"'
        holds = first_surrogate(json.loads(literal)) is not None
        if holds and not jsonio._may_hold_surrogates(literal):
            missed.append(literal)
    assert missed == []
    document = {
        "format": "graphsvc-json",
        "version": [1, 0],
        "ops": {"leaf": {"plugin": None, "version": None}},
        "nodes": [{"id": 0, "name": "x", "op": "leaf", "parents": [], "value": 1.0}],
        "outputs": [0],
        "metadata": {},
    }
    text = json.dumps(document).replace('"x"', '"\\\\ud800\\udc00"')
    with pytest.raises(FormatError) as info:
        jsonio.loads(text)
    assert str(info.value) == "the string at nodes[0].name holds a lone surrogate (\\udc00), which is not Unicode text"
