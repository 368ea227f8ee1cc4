"""graphsvc.format.document: the document a file holds, both ways: the entries a writer lays out
from a graph (op table, attributes, arrays in little-endian bytes) and the checks a reader runs on a
decoded document (op table, sparse entries, nesting) with the exact words of each broken rule."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from graphsvc.errors import FormatError
from graphsvc.format import document
from graphsvc.graph import GraphBuilder, OpSource

# -- the reader's checks: nesting, the op table, sparse entries ----------------------------------------
NESTED: list[tuple[Any, bool]] = [
    ({"axis": -1, "keepdims": True, "shape": [8, 64], "eps": 1e-5, "name": "x", "none": None}, True),
    ({"a": [[{"b": 1}]]}, True),  # 4 levels below the map: the limit
    ({"a": [[[[1]]]]}, False),  # 5 levels below the map: deeper than the limit 4
    ({"a": {1: 2}}, False),  # a key that is not a string
    ({"a": 2**64}, False),  # outside msgpack's integers
    ({"a": (1, 2)}, False),  # a tuple: for check_nesting to judge
    ({"a": "x" * 100}, False),  # longer than the string limit below allows
    ({"x" * 100: 1}, False),
]


@pytest.mark.parametrize(("value", "ok"), NESTED)
def test_nesting_is_checked_a_level_at_a_time_and_any_doubt_left_to_check_nesting(value: Any, ok: bool) -> None:
    assert document._nesting_ok([value], 4, string_limit=200) is ok
    if ok:
        document.check_nesting(value, 4, "v", string_limit=200)


def test_the_op_table_of_a_file_is_read_at_once_one_source_per_plugin() -> None:
    doc = {
        "ops": [
            {"tag": "leaf", "plugin": "graphsvc", "version": "0.1"},
            {"tag": "add", "plugin": "graphsvc", "version": "0.1"},
            {"tag": "conv2d", "plugin": "graphsvc-conv", "version": None},
        ]
    }
    table, sources = document._read_ops(doc)
    assert table == ["leaf", "add", "conv2d"]
    assert sources == {
        "leaf": OpSource("graphsvc", "0.1"),
        "add": OpSource("graphsvc", "0.1"),
        "conv2d": OpSource("graphsvc-conv", None),
    }
    assert sources["leaf"] is sources["add"]
    doc["ops"][2]["tag"] = "add"
    with pytest.raises(FormatError) as info:
        document._read_ops(doc)
    assert str(info.value) == "ops lists the tag 'add' twice"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([[0, "a"], [2, "b"]], None),
        ([[2, "a"], [0, "b"]], "names[1]: node 0 is listed out of order (ids must increase)"),
        ([[0, "a"], [0, "b"]], "names[1]: node 0 is listed twice"),
        ([[0, "a"], [3, "b"]], "names[1] refers to node 3, which does not exist (the graph has 3 nodes)"),
        ([[0, 1]], "names[0][1] must be a string, not an integer"),
        ([[True, "a"]], "names[0][0] must be an integer, not a boolean"),
        ([[0, "a", 1]], "names[0] must be an array [node id, name]"),
    ],
)
def test_sparse_entries_are_read_at_once_and_a_broken_rule_worded_entry_by_entry(
    entries: list[Any], message: str | None
) -> None:
    if message is None:
        assert document._read_sparse({"names": entries}, "names", str, 3) == {0: "a", 2: "b"}
        return
    with pytest.raises(FormatError) as info:
        document._read_sparse({"names": entries}, "names", str, 3)
    assert str(info.value) == message


# -- the writer's entries ----------------------------------------------------------------------------
def test_attribute_entries_sort_each_maps_keys_and_leave_out_empty_maps() -> None:
    b = GraphBuilder()
    x = b.leaf(2.0)
    for attrs in ({"b": 1, "a": [2]}, {}, {"only": 3.0}, {"z": None, "y": "s", "x": 1}):
        b.add("f", [x], attrs=attrs)
    entries = document.attrs_entries(b.build())
    assert entries == [[1, {"a": [2], "b": 1}], [3, {"only": 3.0}], [4, {"x": 1, "y": "s", "z": None}]]
    assert [list(entry[1]) for entry in entries] == [["a", "b"], ["only"], ["x", "y", "z"]]  # the keys' order
    one_key = GraphBuilder()
    y = one_key.leaf(1.0)
    for node in range(3):
        one_key.add("pow", [y], attrs={"exponent": float(node)})
    assert document.attrs_entries(one_key.build()) == [[node + 1, {"exponent": float(node)}] for node in range(3)]


# -- the nesting check a level at a time, against an item at a time ------------------------------------
def _nesting_ok_an_item_at_a_time(items: list[Any], limit: int, string_limit: int | None) -> bool:
    """document._nesting_ok as it was written before its checks went a level at a time in C."""
    level, longest = 0, None if string_limit is None else string_limit // 4
    while items:
        if level > limit:
            return False
        nested: list[Any] = []
        for item in items:
            kind = type(item)
            if kind is str:
                if longest is not None and len(item) > longest:
                    return False
            elif kind is dict:
                if item and (set(map(type, item)) != {str} or (longest is not None and max(map(len, item)) > longest)):
                    return False
                nested.extend(item.values())
            elif kind is list:
                nested.extend(item)
            elif kind is int:
                if not -(1 << 63) <= item < 1 << 64:
                    return False
            elif kind not in {str, float, bool, type(None), bytes}:
                return False
        items = nested
        level += 1
    return True


class _Text(str):
    pass


def _random_value(rng: random.Random, depth: int) -> Any:
    leaves: list[Any] = [
        1.5, -0.0, True, None, b"\x00", "", "x" * 60, "é" * 3, 0, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1,
        (1, 2), _Text("t"), 3 + 0j,
    ]  # fmt: skip
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return [_random_value(rng, depth - 1) for _ in range(rng.randrange(4))]
    keys: list[Any] = ["a", "b", "k" * 60, 1, b"k", _Text("s")]
    return {
        rng.choice(keys) if rng.random() < 0.1 else f"k{i}": _random_value(rng, depth - 1)
        for i in range(rng.randrange(4))
    }


def test_nesting_checked_a_level_at_a_time_judges_as_an_item_at_a_time() -> None:
    rng = random.Random(7)
    judged = set()
    for _ in range(3000):
        items = [_random_value(rng, rng.randrange(7)) for _ in range(rng.randrange(1, 6))]
        for limit, string_limit in ((4, 200), (6, None), (2, 100)):
            expected = _nesting_ok_an_item_at_a_time(items, limit, string_limit)
            assert document._nesting_ok(items, limit, string_limit) is expected, (items, limit, string_limit)
            judged.add(expected)
    assert judged == {True, False}


def test_a_native_contiguous_array_is_written_from_its_own_memory() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    payload = document.little_endian_bytes(array)
    assert payload.obj is array and bytes(payload) == array.tobytes()
    assert bytes(document.little_endian_bytes(np.zeros((0, 3), dtype=np.float64))) == b""
    assert bytes(document.little_endian_bytes(np.float64(1.5) * np.ones(()))) == b"\x00\x00\x00\x00\x00\x00\xf8?"
    transposed = np.arange(4, dtype=np.int64).reshape(2, 2).T
    assert bytes(document.little_endian_bytes(transposed)) == np.array([0, 2, 1, 3], dtype="<i8").tobytes()


# -- empty arrays: one a dtype and shape ------------------------------------------------------------
@pytest.mark.parametrize("compiled", [True, False])
def test_empty_arrays_of_one_dtype_and_shape_are_one_shared_read_only_array(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of many empty arrays holds one array a dtype and shape (the C walk and the Python
    twin alike), read-only, not an array a node: a million of them cost a dict entry each."""
    from graphsvc import format as fmt

    if not compiled:
        monkeypatch.setattr(document, "_ctable", None)
    elif document._ctable is None:
        pytest.skip("the C extension _ctable is not built")
    b = GraphBuilder()
    empty32, empty64 = np.empty((0,), np.float32), np.empty((2, 0), np.float64)
    x = b.leaf(empty32, name="x", grad=empty32)
    node = x
    for _ in range(50):
        node = b.add("neg", [node], value=empty32, grad=empty32)
    y = b.leaf(empty64, name="y", grad=empty64)
    b.add("neg", [y], value=empty64, grad=empty64)
    full = b.leaf(np.array([1.0, 2.0], np.float32), name="full")
    b.add("neg", [full], value=np.array([-1.0, -2.0], np.float32))
    graph = fmt.loads(fmt.dumps(b.build()))
    arrays = [*graph.arrays.values(), *graph.grad_arrays.values()]
    assert len(arrays) == 2 * 51 + 2 * 2 + 2
    assert len({id(a) for a in arrays}) == 1 + 1 + 2  # one f32[0], one f64[2,0], the two full arrays
    shared = graph.arrays[0]
    assert (shared.dtype, shared.shape, shared.flags.writeable) == (np.dtype(np.float32), (0,), False)
    assert graph.arrays[50] is shared and graph.grad_arrays[17] is shared
    assert graph.arrays[51] is graph.grad_arrays[52] and graph.arrays[51].shape == (2, 0)
    assert not graph.arrays[51].flags.writeable
    assert graph.arrays[54].tolist() == [-1.0, -2.0]
