"""graphsvc.format.codec: bytes <-> documents. The encoder's canonical bytes (msgpack's smallest
headers, float64 always, sorted attribute keys, payloads as views), the safe decoder's exact words
for each broken document, and value_end, which steps over the tensor table for the fast reader."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError
from graphsvc.format import codec, diagnose, fastload
from graphsvc.graph import Graph, GraphBuilder


def test_canonical_msgpack_types() -> None:
    b = GraphBuilder()
    b.leaf(1.0)
    g = b.build(metadata={"small": 7, "neg": -3, "big": 70000, "float": 0.5, "whole": 2.0, "text": "é", "raw": b"\x00"})
    packed = fmt.dumps(g)
    tail = packed[packed.index(b"\xa8metadata") + 9 :]
    assert tail == bytes.fromhex(
        "87"
        "a5736d616c6c07"  # "small": positive fixint
        "a36e6567fd"  # "neg": negative fixint
        "a3626967ce00011170"  # "big": uint32, the smallest that fits
        "a5666c6f6174cb3fe0000000000000"  # "float": always float64
        "a577686f6c65cb4000000000000000"  # "whole": a float stays a float64
        "a474657874a2c3a9"  # "text": str type, UTF-8
        "a3726177c40100"  # "raw": bin type
    )


def test_attribute_keys_are_sorted() -> None:
    def build(attrs: dict[str, Any]) -> bytes:
        b = GraphBuilder()
        x = b.leaf()
        b.add("f", [x], attrs=attrs)
        return fmt.dumps(b.build())

    assert build({"b": 1, "a": 2}) == build({"a": 2, "b": 1})
    assert fmt.loads(build({"b": 1, "a": 2})).attrs == {1: {"a": 2, "b": 1}}


def test_large_columns_use_bin16_and_bin32_headers() -> None:
    n = 9000  # values: 72,000 bytes -> bin32; op codes: 18,000 bytes -> bin16
    g = Graph(
        op_table=["leaf"],
        op_codes=np.zeros(n, dtype="<u2"),
        parent_offsets=np.zeros(n + 1, dtype="<i8"),
        parent_indices=np.zeros(0, dtype="<i4"),
        values=np.arange(n, dtype="<f8"),
    )
    data = fmt.dumps(g)
    assert b"\xa4data\xc5\x46\x50" in data
    assert b"\xa4data\xc6\x00\x01\x19\x40" in data
    assert msgpack.packb(msgpack.unpackb(data), use_bin_type=True) == data
    assert np.array_equal(fmt.loads(data).values, g.values)


def many_arrays(count: int) -> Graph:
    b = GraphBuilder()
    for k in range(count):
        b.leaf(np.array([k], dtype=np.int64))
    return b.build()


def test_a_table_of_20_000_entries_reads_the_fast_way() -> None:
    # walked in Python, 20,000 entries (160,000 msgpack items) went past the walk's budget
    data = fmt.dumps(many_arrays(20_000))
    document = codec.decode_fast(fastload.BytesSource(data), fmt.DEFAULT_LIMITS)
    assert isinstance(document["data"], np.ndarray) and len(document["tensors"]) == 20_000
    graph = fmt.loads(data)
    assert graph.value(19_999).tolist() == [19_999] and fmt.dumps(graph) == data


@pytest.mark.parametrize(
    "value", [[0] * 200_000, {"k": [1.5, "s" * 70_000, b"b" * 70_000]}, [[[[{"deep": [None, True]}]]]]]
)
def test_value_end_finds_where_a_value_ends(value: Any) -> None:
    data = b"\xc0" + msgpack.packb(value, use_bin_type=True) + b"\xc0"
    assert codec.value_end(fastload.BytesSource(data), 1) == len(data) - 1


@pytest.mark.parametrize(
    "data", [b"\x92\x01\xc1", b"\x92\x01", b"\xdb\xff\xff\xff\xff"], ids=["reserved-byte", "truncated", "long-string"]
)
def test_value_end_leaves_what_it_cannot_step_over_to_the_general_reader(data: bytes) -> None:
    with pytest.raises(fastload.NotCanonical):
        codec.value_end(fastload.BytesSource(data), 0)


# -- encode: the pieces ----------------------------------------------------------------------------
def test_encode_yields_the_bytes_of_dumps_with_each_column_payload_a_view_of_the_graph() -> None:
    b = GraphBuilder()
    x = b.leaf(2.0, name="x")
    b.add("neg", [x], name="y", value=-2.0)
    graph = b.build()
    pieces = list(codec.encode(graph))
    assert b"".join(pieces) == fmt.dumps(graph)
    views = [piece for piece in pieces if isinstance(piece, memoryview)]
    # op codes, parent offsets, parent indices, values: each column's own memory, not a copy
    assert [bytes(view) for view in views] == [
        b"\x00\x00\x01\x00",  # leaf, neg: codes 0 and 1 of the op table
        bytes(8) + (0).to_bytes(8, "little") + (1).to_bytes(8, "little"),
        bytes(4),
        b"\x00\x00\x00\x00\x00\x00\x00\x40" + b"\x00\x00\x00\x00\x00\x00\x00\xc0",
    ]
    assert np.shares_memory(np.asarray(views[3]), graph.values)


def test_bin_header_is_msgpacks_smallest_and_refuses_4_gib() -> None:
    assert (codec._bin_header(255), codec._bin_header(256), codec._bin_header(70_000)) == (
        b"\xc4\xff",
        b"\xc5\x01\x00",
        b"\xc6\x00\x01\x11\x70",
    )
    with pytest.raises(FormatError) as info:
        codec._bin_header(1 << 32)
    assert str(info.value) == "a column of 4294967296 bytes is larger than msgpack allows (4 GiB)"


# -- decode: every safety check, in exact words ------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the file is truncated: it is empty"),
        (b"\x82\xa1a\x01\xa1b", "the file is truncated: 6 bytes end in the middle of the document"),
        (b"\x82\xa1a\x01\xa1a\x02", "the document repeats the key 'a'"),
        (b"\x81\x01\x02", "the document has a key that is not a string (an integer, entry 0)"),
        (b"\x82\xa1a\x01\x01\x02", "the document has a key that is not a string (an integer, entry 1)"),
        (b"\x81\xc4\x01a\x01", "the document has a key that is not a string (bin data, entry 0)"),
        (b"\xc1", "not a valid msgpack document: it holds the reserved byte 0xc1"),
        (b"\xd4\x01x", "the file contains a msgpack ext type; graphsvc files never do"),
        (b"\x91\xa2\xff\xfe", "the string at [0] is not valid UTF-8"),
        (b"\x81\xa1a\x01\x00", "trailing bytes after the document: 1 byte follows the first 4"),
        (b"\xdb\xff\xff\xff\xff", "the file is truncated: 5 bytes end in the middle of the document"),
    ],
)
def test_decode_refuses_each_broken_document_in_exact_words(data: bytes, message: str) -> None:
    with pytest.raises(FormatError) as info:
        codec.decode(data, fmt.DEFAULT_LIMITS)
    assert str(info.value) == message


def test_decode_reads_a_valid_document_with_lists_and_text() -> None:
    data = msgpack.packb({"a": [1, -2.5, None, True], "b": {"c": b"\x00\xff"}, "é": "ü"}, use_bin_type=True)
    assert codec.decode(data, fmt.DEFAULT_LIMITS) == {"a": [1, -2.5, None, True], "b": {"c": b"\x00\xff"}, "é": "ü"}


def test_a_map_of_one_entry_and_of_many_are_checked_alike() -> None:
    assert codec._pairs_to_dict([("a", 1)]) == {"a": 1}
    assert codec._pairs_to_dict([("b", 2), ("a", 1)]) == {"b": 2, "a": 1}
    assert list(codec._pairs_to_dict([("b", 2), ("a", 1)])) == ["b", "a"]  # the file's order is kept
    for pairs in ([(1, 1)], [("a", 1), (b"k", 2)]):
        with pytest.raises(diagnose.NonStringKey):
            codec._pairs_to_dict(pairs)
    with pytest.raises(diagnose.DuplicateKey) as info:
        codec._pairs_to_dict([("a", 1), ("b", 2), ("a", 3)])
    assert info.value.args == ("a",)
