"""Keys a reader does not know (graphsvc.format.keys): warned about with the closest known key, or
refused by a strict read, in both forms and at every place a document has keys."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError, UnknownKeyWarning
from graphsvc.format import jsonio, keys
from graphsvc.graph import GraphBuilder

TYPO_JSON = {
    "format": "graphsvc-json",
    "version": [1, 0],
    "nodes": [
        {"id": 0, "name": "a", "op": "leaf", "vaule": 2.0},
        {"id": 1, "name": "b", "op": "leaf", "value": 3.0},
        {"id": 2, "name": "y", "op": "add", "parnets": [0, 1]},
    ],
    "output": [2],
}


def warned(read: Any) -> tuple[Any, list[str]]:
    """What ``read()`` returns, and the texts of the UnknownKeyWarnings it gave (no other warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = read()
    assert [w.category for w in caught] == [UnknownKeyWarning] * len(caught)
    return result, [str(w.message) for w in caught]


def write_json(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_a_misspelt_json_key_is_warned_about_with_the_key_it_likely_means(tmp_path: Path) -> None:
    path = write_json(tmp_path, TYPO_JSON)
    graph, said = warned(lambda: fmt.load(path))
    assert said == [
        f"{path}: the document: unknown key 'output' (did you mean 'outputs'?); ignored",
        f"{path}: nodes[0]: unknown key 'vaule' (did you mean 'value'?); ignored",
        f"{path}: nodes[2]: unknown key 'parnets' (did you mean 'parents'?); ignored",
    ]
    assert graph.num_edges == 0  # ignored, as FORMAT.md §2 says: the node has no parents


def test_a_strict_read_refuses_the_first_unknown_key_and_counts_the_others(tmp_path: Path) -> None:
    path = write_json(tmp_path, TYPO_JSON)
    with pytest.raises(FormatError) as raised:
        fmt.load(path, strict=True)
    assert str(raised.value) == (
        f"{path}: the document: unknown key 'output' (did you mean 'outputs'?) (2 more unknown keys); "
        "a strict read refuses unknown keys"
    )
    with pytest.raises(FormatError) as raised:
        fmt.load_versioned(path, strict=True)
    assert str(raised.value).startswith(f"{path}: the document: unknown key 'output'")


def test_a_file_without_unknown_keys_warns_about_nothing_and_passes_a_strict_read(tmp_path: Path) -> None:
    doc = {k: v for k, v in TYPO_JSON.items() if k != "output"}
    doc["nodes"] = [{"id": 0, "op": "leaf", "value": 1.0}]
    path = write_json(tmp_path, doc)
    assert warned(lambda: fmt.load(path))[1] == []
    assert fmt.load(path, strict=True).num_nodes == 1
    assert warned(lambda: fmt.load("examples/seed004.msgpack", strict=True))[1] == []


def test_a_key_unknown_in_many_nodes_is_one_line_and_past_five_keys_the_rest_are_counted(tmp_path: Path) -> None:
    doc: dict[str, Any] = {"format": "graphsvc-json", "version": [1, 0]}
    doc["nodes"] = [{"id": i, "op": "leaf", "vaule": 1.0} for i in range(1000)]
    for extra in ("a1", "a2", "a3", "a4", "a5", "a6"):
        doc[extra] = 1
    path = write_json(tmp_path, doc)
    said = warned(lambda: fmt.load(path))[1]
    assert said == [
        f"{path}: the document: unknown key 'a1'; ignored",
        f"{path}: the document: unknown key 'a2'; ignored",
        f"{path}: the document: unknown key 'a3'; ignored",
        f"{path}: the document: unknown key 'a4'; ignored",
        f"{path}: the document: unknown key 'a5'; ignored",
        f"{path}: 1,001 more unknown keys ignored",
    ]
    del doc["a1"], doc["a2"], doc["a3"], doc["a4"], doc["a5"], doc["a6"]
    said = warned(lambda: fmt.load(write_json(tmp_path, doc)))[1]
    assert said == [f"{path}: nodes[0]: unknown key 'vaule' (did you mean 'value'?), and in 999 more nodes; ignored"]


def test_a_key_is_text_from_the_file_and_is_escaped_and_cut(tmp_path: Path) -> None:
    doc = {**TYPO_JSON, "nodes": [{"id": 0, "op": "leaf", "\x1b[31mred": 1, "x" * 100: 2}]}
    del doc["output"]
    said = warned(lambda: fmt.load(write_json(tmp_path, doc)))[1]
    assert said == [
        f"{tmp_path / 'g.json'}: nodes[0]: unknown key '\\x1b[31mred'; ignored",
        f"{tmp_path / 'g.json'}: nodes[0]: unknown key '{'x' * 20}... (100 characters)'; ignored",
    ]


def test_json_ops_entries_and_array_objects_are_looked_at_too() -> None:
    doc = {
        "format": "graphsvc-json",
        "version": [2, 0],
        "ops": {"leaf": {"plugin": None, "versoin": "1"}},
        "nodes": [{"id": 0, "op": "leaf", "value": {"dtype": "float64", "shape": [2], "data": [1, 2], "shpae": 1}}],
    }
    graph, said = warned(lambda: jsonio.loads(json.dumps(doc)))
    assert graph.is_tensor_graph
    assert said == [
        "ops['leaf']: unknown key 'versoin' (did you mean 'version'?); ignored",
        "nodes[0].value: unknown key 'shpae' (did you mean 'shape'?); ignored",
    ]


def msgpack_doc(tensor: bool = False) -> dict[str, Any]:
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, 2.0]) if tensor else 2.0, name="x")
    b.add("exp", [x], name="y")
    decoded: dict[str, Any] = msgpack.unpackb(fmt.dumps(b.build()))
    return decoded


@pytest.mark.parametrize("tensor", [False, True], ids=["1.0", "2.0"])
def test_msgpack_documents_are_looked_at_the_top_level_nodes_columns_and_ops_entries(tensor: bool) -> None:
    doc = msgpack_doc(tensor)
    doc["outptus"] = [1]
    doc["nodes"]["cuont"] = 2
    doc["nodes"]["values"]["dtpye"] = "<f8"
    doc["ops"][1]["plugni"] = None
    graph, said = warned(lambda: fmt.loads(msgpack.packb(doc)))
    assert graph.num_nodes == 2
    assert said == [
        "the document: unknown key 'outptus' (did you mean 'outputs'?); ignored",
        "nodes: unknown key 'cuont' (did you mean 'count'?); ignored",
        "nodes.values: unknown key 'dtpye' (did you mean 'dtype'?); ignored",
        "ops[1]: unknown key 'plugni' (did you mean 'plugin'?); ignored",
    ]
    with pytest.raises(FormatError) as raised:
        fmt.loads(msgpack.packb(doc), strict=True)
    assert str(raised.value) == (
        "the document: unknown key 'outptus' (did you mean 'outputs'?) (3 more unknown keys); "
        "a strict read refuses unknown keys"
    )


def test_a_version_2_key_is_unknown_in_a_version_1_file_and_pad_is_known_in_2() -> None:
    doc = msgpack_doc()
    doc["pad"] = b""
    assert warned(lambda: fmt.loads(msgpack.packb(doc)))[1] == ["the document: unknown key 'pad'; ignored"]
    assert warned(lambda: fmt.loads(fmt.dumps(fmt.loads(msgpack.packb(msgpack_doc(True))))))[1] == []


def test_an_unknown_top_level_key_of_a_file_on_disk_is_found_by_the_fast_path_too(tmp_path: Path) -> None:
    """The fast path reads the columns itself and everything else with msgpack: the key is there."""
    doc = msgpack_doc()
    doc["metdata"] = {}
    path = tmp_path / "g.msgpack"
    path.write_bytes(msgpack.packb(doc))
    for mapped in (False, True):
        assert warned(lambda mapped=mapped: fmt.load(path, mmap=mapped))[1] == [
            f"{path}: the document: unknown key 'metdata' (did you mean 'metadata'?); ignored"
        ]


def test_the_warning_points_at_the_caller_of_load_and_loads(tmp_path: Path) -> None:
    doc = msgpack_doc()
    doc["x"] = 1
    data = msgpack.packb(doc)
    path = tmp_path / "g.msgpack"
    path.write_bytes(data)
    for read in (lambda: fmt.loads(data), lambda: fmt.load(path), lambda: fmt.load_versioned(path)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            read()
        assert [w.filename for w in caught] == [__file__]


def test_lines_without_a_close_key_and_one_key_in_several_places_of_one_kind() -> None:
    found = [
        keys.UnknownKey("ops[0]", "zzz", ("tag", "plugin", "version"), "ops entries"),
        keys.UnknownKey("ops[3]", "zzz", ("tag", "plugin", "version"), "ops entries"),
        keys.UnknownKey("the document", "zzz", keys.JSON_KEYS, ""),
    ]
    assert keys.lines(found) == [
        "ops[0]: unknown key 'zzz', and in 1 more ops entries; ignored",
        "the document: unknown key 'zzz'; ignored",
    ]
    assert keys.lines(found, shown=1) == [
        "ops[0]: unknown key 'zzz', and in 1 more ops entries; ignored",
        "1 more unknown key ignored",
    ]
