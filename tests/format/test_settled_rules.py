"""What the outside implementer's reading of schemas/FORMAT.md left open, settled (issue 25): the order
of the rules (§7, §15.3), a gradient's dtype, ``pad``'s type, an empty tensor table, the nan of the
columns, how a tensor entry may grow, nested attribute maps in §16. Each is checked on the C path
and, with ``_ctable`` off, on the Python path: the same error, word for word."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphStructureError
from graphsvc.format import document, fastload
from graphsvc.graph import GraphBuilder
from tests.conftest import GOLDEN_DIR

V2_DIR = GOLDEN_DIR / "v2"


@pytest.fixture(params=["C", "Python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test twice: with the C table check and header walk (where built), and without them."""
    if request.param == "Python":
        monkeypatch.setattr(document, "_ctable", None)
        monkeypatch.setattr(fastload, "_ctable", None)
    yield request.param


def worked(mutate: Callable[[dict[str, Any]], object] = lambda d: None, name: str = "tensor_worked") -> bytes:
    doc: dict[str, Any] = msgpack.unpackb((V2_DIR / f"{name}.msgpack").read_bytes())
    doc = copy.deepcopy(doc)
    mutate(doc)
    return msgpack.packb(doc)


def error(data: bytes) -> str:
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    return str(info.value)


def _column(values: list[int], dtype: str) -> bytes:
    return np.array(values, dtype=dtype).tobytes()


# -- §7: the tensor table (rule 5) before the graph (rule 6) -----------------------------------------
def _parent_after_child(d: dict[str, Any]) -> None:
    """Rule 6: node 2's parents become 2 and 1 (a self-loop)."""
    d["nodes"]["parent_indices"]["data"] = _column([2, 1], "<i4")


def test_a_file_breaking_the_graph_rules_alone_gets_their_error(path: str) -> None:
    assert error(worked(_parent_after_child)) == "node 2 lists itself as a parent (a self-loop)"


def test_a_file_breaking_the_tensor_table_and_the_graph_gets_the_tables_error(path: str) -> None:
    def both(d: dict[str, Any]) -> None:
        _parent_after_child(d)
        d["tensors"][1][5] = 12  # rule 6 of §15.3: nbytes

    assert error(worked(both)) == "tensors[1]: nbytes is 12, but an F32 array of shape [2] takes 8"


def test_a_tensor_table_fine_for_c_but_wrong_for_the_graph_is_the_graphs_error(path: str) -> None:
    """A table the C check accepts whole: the graph's rules are still checked after it."""

    def both(d: dict[str, Any]) -> None:
        _parent_after_child(d)

    assert error(worked(both)) == "node 2 lists itself as a parent (a self-loop)"


def test_too_many_ops_is_rule_2_before_the_columns_of_rule_3(path: str) -> None:
    def many(d: dict[str, Any]) -> None:
        d["ops"] = d["ops"] + [{"tag": f"op{i}", "plugin": None, "version": None} for i in range(65_535)]
        d["nodes"]["count"] = 4  # rule 3: no column has 4 entries

    assert error(worked(many)) == "too many ops: 65537 (at most 65536)"


# -- §15.3: the entries of the table, in three passes -------------------------------------------------
def test_rules_2_to_6_go_entry_by_entry(path: str) -> None:
    def two(d: dict[str, Any]) -> None:
        d["tensors"][0][5] = 12  # entry 0, rule 6
        d["tensors"][1][1] = "values"  # entry 1, rule 2

    assert error(worked(two)) == "tensors[0]: nbytes is 12, but an F32 array of shape [2] takes 8"


def test_rules_7_and_8_come_after_rules_2_to_6_of_every_entry(path: str) -> None:
    def two(d: dict[str, Any]) -> None:
        d["nodes"]["values"]["data"] = _column([0, 0, 0], "<f8")  # entry 0, rule 8 (not nan)
        d["tensors"][1][2] = "BF16"  # entry 1, rule 2

    assert error(worked(two)) == 'tensors[1][2] must be a dtype "F64", "F32" or "I64", not \'BF16\''


def test_rule_9_comes_last(path: str) -> None:
    def two(d: dict[str, Any]) -> None:
        d["tensors"][1][4] = 0  # overlaps entry 0 (rule 9)
        d["tensors"][1][0] = 0  # and repeats node 0's value (rule 7)

    assert error(worked(two)) == "tensors[1]: the value of node 0 is listed twice"


# -- a gradient has its value's dtype ------------------------------------------------------------------
def _int64_gradient(d: dict[str, Any]) -> None:
    d["tensors"].insert(1, [0, "grad", "I64", [2], 64, 16])
    d["tensors"][2][4] = 128
    d["data"] = bytes(136)


def test_a_gradient_of_another_dtype_than_its_value_is_refused(path: str) -> None:
    assert error(worked(_int64_gradient)) == (
        "tensors[1]: node 0's gradient is I64, but its value is F32 (a gradient has its value's dtype)"
    )


def test_a_gradient_of_its_values_dtype_is_read(path: str) -> None:
    def float32_gradient(d: dict[str, Any]) -> None:
        _int64_gradient(d)
        d["tensors"][1][2:] = ["F32", [2], 64, 8]

    graph = fmt.loads(worked(float32_gradient))
    assert graph.grad_arrays[0].dtype == np.float32


def test_neither_a_builder_nor_save_makes_a_gradient_of_another_dtype(tmp_path: Path) -> None:
    b = GraphBuilder()
    with pytest.raises(GraphStructureError) as built:
        b.leaf(np.array([1.5, 2.0], dtype=np.float32), grad=np.array([1, 2], dtype=np.int64))
        b.build()
    assert str(built.value) == "node 0's gradient array has dtype int64, but its value array has dtype float32"
    graph = fmt.loads(worked())
    graph.grad_arrays = {0: np.array([1, 2], dtype=np.int64)}
    with pytest.raises((FormatError, GraphStructureError)) as saved:
        fmt.save(graph, tmp_path / "g.msgpack")
    assert str(saved.value) == "node 0's gradient array has dtype int64, but its value array has dtype float32"
    assert not (tmp_path / "g.msgpack").exists()


# -- pad ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("pad", "message"), [("x", "a string"), (None, "nil"), ([], "an array"), (0, "an integer")])
def test_a_pad_that_is_not_bin_data_is_refused(path: str, pad: Any, message: str) -> None:
    assert error(worked(lambda d: d.__setitem__("pad", pad))) == f"pad must be bin data, not {message}"


def test_a_pad_may_be_absent_or_hold_any_bytes(path: str) -> None:
    expected = fmt.dumps(fmt.loads(worked()))
    assert fmt.dumps(fmt.loads(worked(lambda d: d.pop("pad")))) == expected
    assert fmt.dumps(fmt.loads(worked(lambda d: d.__setitem__("pad", b"\xff" * 70)))) == expected


# -- an empty tensor table ---------------------------------------------------------------------------------
def test_a_2_0_file_with_an_empty_tensor_table_is_the_1_0_files_graph(path: str) -> None:
    one = (GOLDEN_DIR / "worked.msgpack").read_bytes()
    doc: dict[str, Any] = {}
    for key, value in msgpack.unpackb(one).items():
        doc[key] = value
        if key == "nodes":
            doc.update(tensors=[], pad=bytes(7), data=bytes(64))
    doc["version"] = [2, 0]
    graph = fmt.loads(msgpack.packb(doc))
    assert not graph.is_tensor_graph
    assert fmt.dumps(graph) == one


# -- the nan in the columns ----------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF])
def test_any_nan_is_read_in_an_array_nodes_column_and_the_quiet_nan_written(path: str, bits: int) -> None:
    def other_nan(d: dict[str, Any]) -> None:
        d["nodes"]["values"]["data"] = _column([bits, 0x4008000000000000, bits], "<u8")

    canonical = (V2_DIR / "tensor_worked.msgpack").read_bytes()
    assert fmt.dumps(fmt.loads(worked(other_nan))) == canonical
    assert canonical.count(bytes.fromhex("000000000000f87f")) == 2


# -- how a tensor entry grows: it does not -----------------------------------------------------------------
def test_a_seventh_item_in_a_tensor_entry_is_refused(path: str) -> None:
    assert error(worked(lambda d: d["tensors"][0].append(None))) == (
        "tensors[0] must be an array [node, which, dtype, shape, offset, nbytes]"
    )


def test_what_a_later_minor_says_about_arrays_goes_in_a_key_of_its_own(path: str) -> None:
    def minor(d: dict[str, Any]) -> None:
        d["version"] = [2, 1]
        d["tensor_notes"] = [{"layout": "nchw"}, {"layout": "nchw"}]  # one per tensors entry

    assert fmt.dumps(fmt.loads(worked(minor))) == (V2_DIR / "tensor_worked.msgpack").read_bytes()


# -- §16: "compared as a map" is the attribute map, not the maps nested in it ----------------------------
def _with_attrs(attrs: dict[str, Any]) -> bytes:
    b = GraphBuilder()
    x = b.leaf(1.0)
    b.add("f", [x], value=1.0, attrs=attrs)
    return fmt.dumps(b.build())


def test_an_attribute_maps_own_key_order_does_not_make_another_graph() -> None:
    assert _with_attrs({"x": 1, "y": 2}) == _with_attrs({"y": 2, "x": 1})


def test_a_nested_maps_key_order_makes_another_graph() -> None:
    one, two = _with_attrs({"a": {"x": 1, "y": 2}}), _with_attrs({"a": {"y": 2, "x": 1}})
    assert one != two
    assert fmt.dumps(fmt.loads(one)) == one and fmt.dumps(fmt.loads(two)) == two


# -- the JSON Schema agrees with the readers --------------------------------------------------------------
def _schema_errors(doc: dict[str, Any]) -> list[list[Any]]:
    from tests.conftest import as_json_view, json_schema

    validator = json_schema("graphsvc-v2.schema.json")
    return [list(e.absolute_path) for e in validator.iter_errors(as_json_view(doc))]


def test_the_schema_refuses_a_pad_that_is_not_bin_data_as_the_readers_do() -> None:
    doc: dict[str, Any] = msgpack.unpackb(worked(lambda d: d.__setitem__("pad", "x")))
    assert _schema_errors(doc) == [["pad"]]
    doc.pop("pad")
    assert _schema_errors(doc) == []


def test_the_schema_accepts_an_empty_tensor_table_as_the_readers_do() -> None:
    doc: dict[str, Any] = msgpack.unpackb(worked())
    doc["tensors"], doc["data"] = [], b""
    doc["nodes"]["values"]["data"] = bytes(24)
    assert _schema_errors(doc) == []
    fmt.loads(msgpack.packb(doc))


def test_the_json_form_refuses_a_gradient_of_another_dtype(tmp_path: Path) -> None:
    import json

    node = {"id": 0, "op": "leaf", "parents": [], "value": {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}}
    node["grad"] = {"dtype": "int64", "shape": [2], "data": [1, 2]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"format": "graphsvc-json", "version": [2, 0], "nodes": [node]}))
    with pytest.raises(FormatError) as info:
        fmt.load(path)
    assert str(info.value) == f"{path}: node 0's gradient array has dtype int64, but its value array has dtype float32"
