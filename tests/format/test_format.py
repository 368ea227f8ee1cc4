"""The msgpack format v1: golden bytes, the JSON Schema, round trips, canonical bytes, atomic saves,
and every kind of bad input with its exact message."""

from __future__ import annotations

import copy
import gc
import hashlib
import io
import os
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphFileError, UnknownKeyWarning
from graphsvc.format import codec, jsonio
from graphsvc.graph import Graph, GraphBuilder, OpSource
from graphsvc.value import Value, trace
from tests.conftest import GOLDEN_DIR, ROOT, as_json_view, json_schema, make_golden

SCHEMAS = ROOT / "schemas"


golden = make_golden()

#: sha256 of each committed golden file. A change here is a change of the format.
GOLDEN_SHA256 = {
    "worked": "c0820641bf8698777066902cc06b886a17895cf07d7ba3c849efbe538a5be915",
    "seed000": "258bfed591f9f06f045967ea5dc76206a0ca003c469318ac865fac68b081a9a6",
    "grads": "d0ab797a8669445b4016d26a1572d66cb09ff73f59e91a022b797c4ce760e2f4",
    "attrs_metadata": "bffac46fa322bfaa891f46ceda51704c6efa20a98efc6139b533274ae33d8cf3",
    "special_floats": "a698e4c0f65503d998c4a0bdc040144a0aed6f1ed2ff6a1e5f1c6594a12132ba",
}

#: The worked example of FORMAT.md, byte for byte.
WORKED_HEX = (
    "88a6666f726d6174a86772617068737663a776657273696f6e920100a36f707393"
    "83a3746167a46c656166a6706c7567696ec0a776657273696f6ec0"
    "83a3746167a5636f6e7374a6706c7567696ec0a776657273696f6ec0"
    "83a3746167a36d756ca6706c7567696ec0a776657273696f6ec0"
    "a56e6f64657385a5636f756e7403"
    "a86f705f636f64657383a56474797065a33c7532a66c656e67746803a464617461c406000001000200"
    "ae706172656e745f6f66667365747383a56474797065a33c6938a66c656e67746804a464617461c420"
    "0000000000000000000000000000000000000000000000000200000000000000"
    "ae706172656e745f696e646963657383a56474797065a33c6934a66c656e67746802a464617461c408"
    "0000000001000000"
    "a676616c75657383a56474797065a33c6638a66c656e67746803a464617461c418"
    "000000000000004000000000000008400000000000001840"
    "a56e616d65739292 00a16192 02a179".replace(" ", "")
    + "a5617474727390a76f75747075747391 02a86d65746164617461 80".replace(" ", "")
)


def worked_bytes() -> bytes:
    return fmt.dumps(golden.worked())


@pytest.fixture(scope="module")
def schema_validator() -> jsonschema.Draft202012Validator:
    return json_schema("graphsvc-v1.schema.json")


def bits(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else array.view(np.uint64).tolist()


# -- golden files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_golden_file_bytes_are_pinned(name: str) -> None:
    committed = (GOLDEN_DIR / f"{name}.msgpack").read_bytes()
    assert hashlib.sha256(committed).hexdigest() == GOLDEN_SHA256[name]
    assert fmt.dumps(golden.GOLDEN[name]()) == committed


def test_worked_example_bytes() -> None:
    assert worked_bytes().hex() == WORKED_HEX
    assert len(worked_bytes()) == 390


def test_golden_names_cover_make_golden() -> None:
    assert sorted(golden.GOLDEN) == sorted(GOLDEN_SHA256)


@pytest.mark.parametrize(
    "path",
    sorted(GOLDEN_DIR.glob("*.msgpack")) + sorted((ROOT / "examples").glob("*.msgpack")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_files_validate_against_the_schema(path: Path, schema_validator: jsonschema.Draft202012Validator) -> None:
    document = msgpack.unpackb(path.read_bytes(), raw=False)
    schema_validator.validate(as_json_view(document))
    fmt.load(path)


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("outputs"), []),
        (lambda d: d.__setitem__("format", "onnx"), ["format"]),
        (lambda d: d.__setitem__("version", [2, 0]), ["version", 0]),
        (lambda d: d["nodes"]["values"].__setitem__("dtype", "<f4"), ["nodes", "values", "dtype"]),
        (lambda d: d["nodes"]["values"].__setitem__("data", {"$bin": "0g"}), ["nodes", "values", "data", "$bin"]),
        (lambda d: d.__setitem__("names", [[0, "a", 1]]), ["names", 0]),
        (lambda d: d.__setitem__("outputs", [-1]), ["outputs", 0]),
        (lambda d: d["ops"][0].__setitem__("plugin", 3), ["ops", 0, "plugin"]),
    ],
)
def test_the_schema_rejects_bad_documents(
    mutate: Callable[[dict[str, Any]], object],
    path: list[object],
    schema_validator: jsonschema.Draft202012Validator,
) -> None:
    document = as_json_view(msgpack.unpackb(worked_bytes()))
    mutate(document)
    errors = list(schema_validator.iter_errors(document))
    assert [list(e.absolute_path) for e in errors] == [path]


def test_golden_contents() -> None:
    g = fmt.load(GOLDEN_DIR / "attrs_metadata.msgpack")
    assert g.op_table == ["leaf", "pow", "mul", "clip"]
    assert g.op_sources["pow"] == OpSource("graphsvc-extra-ops", "1.2.0")
    assert g.op_sources["mul"] == OpSource(None, None)
    assert g.parents(2) == [0, 0]
    assert g.names == {0: "x", 1: "sq", 3: "clipped"}
    assert g.attrs[1] == {"exponent": 2.0}
    assert list(g.attrs[3]) == ["bounds", "extra", "inclusive", "lower", "mode", "upper"]  # written sorted
    assert g.attrs[3]["bounds"] == [-1, 5.5]
    assert g.outputs == [3, 2]
    assert g.metadata == {
        "author": "graphsvc",
        "step": 7,
        "lr": 0.5,
        "frozen": False,
        "tags": ["a", 1],
        "nested": {"k": None},
    }
    floats = fmt.load(GOLDEN_DIR / "special_floats.msgpack")
    assert bits(floats.values) == [
        0x8000000000000000,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x7FF8000000000000,
        0xFFF8000000000000,
        0x7FF8000000000123,
    ]
    assert bits(floats.grads) == [0, 0xFFF0000000000000, 0x7FF0000000000000, 0xFFF8000000000000, 0x7FF8000000000000, 0]


# -- canonical encoding --------------------------------------------------------------------------


def test_saving_the_same_graph_twice_gives_identical_bytes(tmp_path: Path) -> None:
    g = golden.attrs_metadata()
    fmt.save(g, tmp_path / "one.msgpack")
    fmt.save(g, tmp_path / "two.msgpack")
    stream = io.BytesIO()
    fmt.dump(g, stream)
    one = (tmp_path / "one.msgpack").read_bytes()
    assert one == (tmp_path / "two.msgpack").read_bytes() == stream.getvalue() == fmt.dumps(g)
    assert fmt.dumps(fmt.load(tmp_path / "one.msgpack")) == one


def test_dumps_equals_packb_of_the_document() -> None:
    data = (GOLDEN_DIR / "grads.msgpack").read_bytes()
    assert msgpack.packb(msgpack.unpackb(data), use_bin_type=True) == data


# -- round trips ----------------------------------------------------------------------------------
msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
float_bits = st.integers(min_value=0, max_value=2**64 - 1) | st.sampled_from(
    [0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000, 0x7FF0000000000001]
)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(min_value=0, max_value=25))
    b = GraphBuilder()
    names = iter(draw(st.lists(st.text(min_size=1, max_size=6), min_size=n, max_size=n, unique=True)))
    for node in range(n):
        name = next(names)
        name = name if draw(st.booleans()) else None
        attrs = draw(st.dictionaries(st.text(max_size=5), msgpack_values, max_size=3))
        if node == 0 or draw(st.integers(0, 3)) == 0:
            b.add(draw(st.sampled_from(["leaf", "const"])), [], name=name)
        else:
            parents = draw(st.lists(st.integers(0, node - 1), min_size=1, max_size=4))
            b.add(draw(st.sampled_from(["add", "mul", "pow", "σ"])), parents, name=name, attrs=attrs)
    outputs = draw(st.lists(st.integers(0, n - 1), max_size=3)) if n else []
    metadata = draw(st.dictionaries(st.text(max_size=5), msgpack_values, max_size=4))
    g = b.build(outputs=outputs, metadata=metadata)
    g.values = np.array(draw(st.lists(float_bits, min_size=n, max_size=n)), dtype=np.uint64).view("<f8")
    if draw(st.booleans()):
        g.grads = np.array(draw(st.lists(float_bits, min_size=n, max_size=n)), dtype=np.uint64).view("<f8")
    return g


def _canonical(value: dict[str, Any]) -> bytes:
    """Nan-safe comparison of attribute maps and metadata."""
    return msgpack.packb(value, use_bin_type=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_round_trip_is_exact(g: Graph) -> None:
    data = fmt.dumps(g)
    back = fmt.loads(data)
    assert back.op_table == g.op_table
    assert back.op_codes.tolist() == g.op_codes.tolist()
    assert back.parent_offsets.tolist() == g.parent_offsets.tolist()
    assert back.parent_indices.tolist() == g.parent_indices.tolist()
    assert bits(back.values) == bits(g.values)
    assert bits(back.grads) == bits(g.grads)
    assert back.names == g.names
    assert {k: _canonical(v) for k, v in back.attrs.items()} == {
        k: _canonical(dict(sorted(v.items()))) for k, v in g.attrs.items()
    }
    assert back.outputs == g.outputs
    assert _canonical(back.metadata) == _canonical(g.metadata)
    assert fmt.dumps(back) == data


def test_file_round_trip_and_version(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(golden.grads(), path)
    g, version = fmt.load_versioned(path)
    assert version == (1, 0)
    assert g.grads is not None and g.grads.tolist() == [22.0, 17.0, 5.0, 5.0, 5.0, 7.0, 1.0]


# -- versions ---------------------------------------------------------------------------------------
def _mutated(mutate: Callable[[dict[str, Any]], object]) -> bytes:
    document = msgpack.unpackb(worked_bytes())
    mutate(document)
    return msgpack.packb(document, use_bin_type=True)


def test_newer_minor_with_unknown_keys_is_read(tmp_path: Path) -> None:
    def future(d: dict[str, Any]) -> None:
        d["version"] = [1, 7]
        d["provenance"] = {"tool": "graphsvc 9", "ext": [1, 2]}
        d["nodes"]["checksums"] = {"dtype": "<u4", "length": 3, "data": b"\0" * 12}
        d["ops"][2]["license"] = "MIT"

    path = tmp_path / "future.msgpack"
    path.write_bytes(_mutated(future))
    with pytest.warns(UnknownKeyWarning) as warned:  # ignored, each said (graphsvc.format.keys)
        g, version = fmt.load_versioned(path)
    assert [str(w.message) for w in warned] == [
        f"{path}: the document: unknown key 'provenance'; ignored",
        f"{path}: nodes: unknown key 'checksums'; ignored",
        f"{path}: ops[2]: unknown key 'license'; ignored",
    ]
    assert version == (1, 7)
    assert fmt.dumps(g) == worked_bytes()  # unknown keys are dropped; the version written is ours


def test_newer_major_is_refused() -> None:
    # graphsvc reads 1.x and 2.x (tensor graphs, tests/format/test_format_v2.py); 3.0 is the first it refuses
    with pytest.raises(FormatError) as info:
        fmt.loads(_mutated(lambda d: d.__setitem__("version", [3, 0])))
    assert str(info.value) == (
        "the file uses format version 3.0, newer than this graphsvc reads (major versions 1 and 2); upgrade graphsvc"
    )


def test_grads_nil_means_no_grads() -> None:
    g = fmt.loads(_mutated(lambda d: d["nodes"].__setitem__("grads", None)))
    assert g.grads is None


# -- bad input, each with its exact message -------------------------------------------------------
def _i4(*ids: int) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


def _i8(*ids: int) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


def _column(key: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["nodes"][key].update(fields)


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


TOPO = "node ids must be in topological order (every parent id smaller than its child's)"

BAD_DOCUMENTS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    (
        "wrong format name",
        lambda d: d.__setitem__("format", "onnx"),
        "not a graphsvc file (format is 'onnx', expected 'graphsvc')",
    ),
    ("no format", lambda d: d.pop("format"), "not a graphsvc file (format is None, expected 'graphsvc')"),
    (
        "version not a pair",
        lambda d: d.__setitem__("version", "1.0"),
        "version must be an array of two non-negative integers [major, minor], not '1.0'",
    ),
    ("version 0", lambda d: d.__setitem__("version", [0, 3]), "unknown format version 0.3"),
    ("missing key", lambda d: d.pop("attrs"), "the document lacks the key attrs"),
    ("missing keys", lambda d: (d.pop("attrs"), d.pop("names")), "the document lacks the keys names, attrs"),
    ("ops not an array", lambda d: d.__setitem__("ops", {}), "ops must be an array, not a map"),
    ("op tag not a string", lambda d: d["ops"][1].__setitem__("tag", 5), "ops[1].tag must be a string, not an integer"),
    ("op listed twice", lambda d: d["ops"][2].__setitem__("tag", "leaf"), "ops lists the tag 'leaf' twice"),
    (
        "empty op tag before a broken column",  # rule 2 of FORMAT.md section 7 comes before rule 3
        lambda d: (d["ops"][1].__setitem__("tag", ""), _column("values", dtype="<f4")(d)),
        "ops[1].tag is an empty string",
    ),
    (
        "op plugin not a string",
        lambda d: d["ops"][0].__setitem__("plugin", 1),
        "ops[0].plugin must be a string, not an integer",
    ),
    ("nodes not a map", lambda d: d.__setitem__("nodes", []), "nodes must be a map, not an array"),
    (
        "count a boolean",
        lambda d: d["nodes"].__setitem__("count", True),
        "nodes.count must be an integer, not a boolean",
    ),
    (
        "count negative",
        lambda d: d["nodes"].__setitem__("count", -1),
        "nodes.count is -1, outside the limit 0..2147483647",
    ),
    ("column missing", lambda d: d["nodes"].pop("values"), "nodes.values must be a map, not nil"),
    ("wrong dtype", _column("values", dtype="<f4"), "nodes.values.dtype is '<f4', but version 1 requires '<f8'"),
    (
        "big-endian dtype",
        _column("op_codes", dtype=">u2"),
        "nodes.op_codes.dtype is '>u2', but version 1 requires '<u2'",
    ),
    ("length mismatch", _column("values", length=4), "nodes.values.length is 4, expected 3"),
    (
        "offsets length mismatch",
        _column("parent_offsets", length=3, data=_i8(0, 0, 0)),
        "nodes.parent_offsets.length is 3, expected 4",
    ),
    ("negative length", _column("parent_indices", length=-1), "nodes.parent_indices.length is negative (-1)"),
    (
        "data length mismatch",
        _column("values", data=b"\0" * 16),
        "nodes.values.data holds 16 bytes, but 3 x <f8 needs 24",
    ),
    ("data not bin", _column("values", data="abc"), "nodes.values.data must be bin data, not a string"),
    (
        "parent index out of range",
        _column("parent_indices", data=_i4(0, 7)),
        "node 2 has parent 7, which does not exist (the graph has 3 nodes)",
    ),
    ("negative parent index", _column("parent_indices", data=_i4(-1, 1)), "node 2 has a negative parent index -1"),
    (
        "parent not before child",
        lambda d: (
            _column("op_codes", data=struct.pack("<3H", 0, 2, 1))(d),
            _column("parent_offsets", data=_i8(0, 0, 2, 2))(d),
            _column("parent_indices", data=_i4(0, 2))(d),
        ),
        f"node 1 has parent 2, which does not come before it: {TOPO}",
    ),
    ("self-loop", _column("parent_indices", data=_i4(0, 2)), "node 2 lists itself as a parent (a self-loop)"),
    ("offsets not from 0", _column("parent_offsets", data=_i8(1, 1, 1, 2)), "parent_offsets must start at 0, not 1"),
    ("offsets decrease", _column("parent_offsets", data=_i8(0, 1, 0, 2)), "parent_offsets decreases at node 1"),
    (
        "offsets end short",
        _column("parent_offsets", data=_i8(0, 0, 0, 1)),
        "parent_offsets ends at 1 but there are 2 parent indices",
    ),
    (
        "op code out of range",
        _column("op_codes", data=struct.pack("<3H", 0, 1, 3)),
        "node 2 has op code 3, but the op table has 3 entries",
    ),
    ("leaf with parents", _column("parent_offsets", data=_i8(0, 0, 1, 2)), "node 1 is a const but has parents"),
    ("duplicate names", lambda d: d.__setitem__("names", [[0, "a"], [2, "a"]]), "name 'a' is used by nodes 0 and 2"),
    ("name not a string", lambda d: d.__setitem__("names", [[0, 1]]), "names[0][1] must be a string, not an integer"),
    ("empty name", lambda d: d.__setitem__("names", [[0, ""]]), "node 0 has a name that is not a non-empty string"),
    ("name entry not a pair", lambda d: d.__setitem__("names", [[0]]), "names[0] must be an array [node id, name]"),
    (
        "name for a missing node",
        lambda d: d.__setitem__("names", [[5, "a"]]),
        "names[0] refers to node 5, which does not exist (the graph has 3 nodes)",
    ),
    (
        "names out of order",
        lambda d: d.__setitem__("names", [[2, "y"], [0, "a"]]),
        "names[1]: node 0 is listed out of order (ids must increase)",
    ),
    ("name listed twice", lambda d: d.__setitem__("names", [[0, "a"], [0, "b"]]), "names[1]: node 0 is listed twice"),
    ("attrs not a map", lambda d: d.__setitem__("attrs", [[2, [1]]]), "attrs[0][1] must be a map, not an array"),
    (
        "attrs nest too deep",
        lambda d: d.__setitem__("attrs", [[2, {"k": _nested(32)}]]),
        "the attribute map of node 2 nests deeper than 32 levels",
    ),
    ("output out of range", lambda d: d.__setitem__("outputs", [3]), "output 3 does not exist (the graph has 3 nodes)"),
    ("output not an integer", lambda d: d.__setitem__("outputs", ["y"]), "outputs[0] must be an integer, not a string"),
    ("metadata not a map", lambda d: d.__setitem__("metadata", []), "metadata must be a map, not an array"),
]


@pytest.mark.parametrize(("mutate", "message"), [case[1:] for case in BAD_DOCUMENTS], ids=[c[0] for c in BAD_DOCUMENTS])
def test_bad_document(mutate: Callable[[dict[str, Any]], object], message: str) -> None:
    with pytest.raises(FormatError) as info:
        fmt.loads(_mutated(mutate))
    assert str(info.value) == message


def _packed(*items: Any) -> bytes:
    return b"".join(msgpack.packb(item, use_bin_type=True) for item in items)


BAD_BYTES: list[tuple[str, bytes, str]] = [
    ("empty", b"", "the file is truncated: it is empty"),
    (
        "truncated prefix",
        bytes.fromhex(WORKED_HEX)[:100],
        "the file is truncated: 100 bytes end in the middle of the document",
    ),
    (
        "truncated header",
        b"\x88",
        "the file is truncated: a map declares 8 entries, more than the file's 1 byte can hold",
    ),
    (
        "huge array",
        b"\xdd\xff\xff\xff\xff",
        "the file is truncated: an array declares 4294967295 entries, more than the file's 5 bytes can hold",
    ),
    ("huge bin", b"\xc6\xff\xff\xff\xff", "the file is truncated: 5 bytes end in the middle of the document"),
    (
        "trailing bytes",
        bytes.fromhex(WORKED_HEX) + b"\x00\xc0",
        "trailing bytes after the document: 2 bytes follow the first 390",
    ),
    ("not a map", _packed([1, 2]), "the document must be a map, not an array"),
    ("nil", b"\xc0", "the document must be a map, not nil"),
    (
        "duplicate map key",
        b"\x82" + _packed("format", "graphsvc", "format", "graphsvc"),
        "the document repeats the key 'format'",
    ),
    ("non-string key", b"\x81" + _packed(1, 2), "the document has a key that is not a string (an integer, entry 0)"),
    ("nil key", b"\x81" + _packed(None, 2), "the document has a key that is not a string (nil, entry 0)"),
    ("bin key", b"\x81" + _packed(b"k", 2), "the document has a key that is not a string (bin data, entry 0)"),
    ("invalid UTF-8", b"\x81\xa1\xff\x01", "the document has a key that is not valid UTF-8 (entry 0)"),
    ("ext type", _packed(msgpack.ExtType(1, b"abc")), "the file contains a msgpack ext type; graphsvc files never do"),
    ("empty ext type", b"\x81\xa1a\xc7\x00\x05", "the file contains a msgpack ext type; graphsvc files never do"),
    (
        "timestamp",
        _packed({"t": msgpack.Timestamp(1, 0)}),
        "the file contains a msgpack ext type; graphsvc files never do",
    ),
    ("reserved byte", b"\xc1", "not a valid msgpack document: it holds the reserved byte 0xc1"),
    ("nested too deeply", b"\x91" * 2000 + b"\xc0", "not a valid msgpack document: it nests too deeply"),
]


@pytest.mark.parametrize(("data", "message"), [case[1:] for case in BAD_BYTES], ids=[c[0] for c in BAD_BYTES])
def test_bad_bytes(data: bytes, message: str) -> None:
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    assert str(info.value) == message


def test_ext_type_inside_a_valid_document() -> None:
    data = _mutated(lambda d: d["metadata"].__setitem__("when", msgpack.ExtType(3, b"xy")))
    with pytest.raises(FormatError, match=r"^the file contains a msgpack ext type; graphsvc files never do$"):
        fmt.loads(data)


def test_every_prefix_of_a_file_is_refused_cleanly() -> None:
    data = (GOLDEN_DIR / "attrs_metadata.msgpack").read_bytes()
    for end in range(len(data)):
        with pytest.raises(FormatError, match=r"^the file is truncated: "):
            fmt.loads(data[:end])


def test_limits() -> None:
    data = worked_bytes()
    with pytest.raises(FormatError) as info:
        fmt.loads(data, fmt.Limits(max_nodes=2))
    assert str(info.value) == "nodes.count is 3, outside the limit 0..2"
    with pytest.raises(FormatError) as info:
        fmt.loads(data, fmt.Limits(max_edges=1))
    assert str(info.value) == "nodes.parent_indices has 2 entries, over the limit 1"
    long_name = _mutated(lambda d: d.__setitem__("names", [[0, "a" * 100]]))
    with pytest.raises(FormatError) as info:
        fmt.loads(long_name, fmt.Limits(max_string_length=50))
    assert str(info.value) == "a string of 100 bytes is longer than the limit of 50 bytes"


def test_loads_takes_bytes() -> None:
    with pytest.raises(TypeError, match=r"^loads\(\) takes bytes$"):
        fmt.loads("not bytes")  # type: ignore[arg-type]
    assert fmt.loads(bytearray(worked_bytes())).num_nodes == 3
    assert fmt.loads(memoryview(worked_bytes())).num_nodes == 3


def test_load_prefixes_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(worked_bytes()[:10])
    with pytest.raises(FormatError) as info:
        fmt.load(bad)
    assert str(info.value) == (
        f"{bad}: the file is truncated: a map declares 8 entries, more than the file's 10 bytes can hold"
    )
    with pytest.raises(GraphFileError) as missing:
        fmt.load(tmp_path / "nope.msgpack")
    assert str(missing.value) == f"{tmp_path / 'nope.msgpack'}: no such file"
    assert not isinstance(missing.value, FormatError)
    with pytest.raises(GraphFileError) as folder:
        fmt.load(tmp_path)
    assert str(folder.value) == f"{tmp_path}: is a folder, not a graph file"


def test_encoding_errors_are_format_errors() -> None:
    b = GraphBuilder()
    b.leaf()
    g = b.build(metadata={"x": object()})
    with pytest.raises(FormatError, match=r"^cannot encode the graph: can not serialize 'object' object$"):
        fmt.dumps(g)


@pytest.mark.parametrize(
    ("attrs", "metadata", "message"),
    [
        ({}, {1: "x"}, "metadata has a map key that is not a string (an integer 1)"),
        (
            {"k": {"inner": {b"k": 1}}},
            {},
            "the attribute map of node 1 has a map key that is not a string (bin data b'k')",
        ),
        ({"k": _nested(32)}, {}, "the attribute map of node 1 nests deeper than 32 levels"),
        ({}, {"k": (_nested(31),)}, "metadata nests deeper than 32 levels"),  # a tuple is written as an array
    ],
)
def test_save_refuses_what_load_would_refuse(
    tmp_path: Path, attrs: dict[str, Any], metadata: dict[Any, Any], message: str
) -> None:
    b = GraphBuilder()
    b.add("neg", [b.leaf(1.0)], attrs=attrs)
    g = b.build(metadata=metadata)
    path = tmp_path / "g.msgpack"
    for write in (fmt.dumps, lambda graph: fmt.dump(graph, io.BytesIO()), lambda graph: fmt.save(graph, path)):
        with pytest.raises(FormatError) as info:
            write(g)
        assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []


def test_save_writes_nesting_exactly_at_the_limit(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.add("neg", [b.leaf(1.0)], attrs={"k": _nested(31)})
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(metadata={"k": _nested(31)}), path)
    loaded = fmt.load(path)
    assert loaded.attrs == {1: {"k": _nested(31)}}
    assert loaded.metadata == {"k": _nested(31)}


# -- atomic save ------------------------------------------------------------------------------------
def _failing_encoder(real: Callable[[Graph], Iterator[bytes | memoryview]], error: BaseException) -> Any:
    def encode(graph: Graph, stored: Any = None) -> Iterator[bytes | memoryview]:
        chunks = real(graph, stored)
        yield next(chunks)
        yield next(chunks)
        raise error

    return encode


@pytest.mark.parametrize(
    ("error", "expected", "message"),
    [
        (OSError(28, "No space left on device"), GraphFileError, "cannot write {path}: No space left on device"),
        (KeyboardInterrupt(), KeyboardInterrupt, ""),
        (RuntimeError("boom"), RuntimeError, "boom"),
    ],
)
def test_a_failing_save_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, expected: type, message: str
) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(golden.worked(), path)
    before = path.read_bytes()
    monkeypatch.setattr(codec, "encode", _failing_encoder(codec.encode, error))
    with pytest.raises(expected) as info:
        fmt.save(golden.seed000(), path)
    assert str(info.value) == message.format(path=path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.msgpack"]


def test_save_into_a_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "no" / "g.msgpack"
    with pytest.raises(GraphFileError) as info:
        fmt.save(golden.worked(), path)
    assert str(info.value) == f"cannot write {path}: No such file or directory"


def test_save_refuses_an_invalid_graph_before_touching_the_file(tmp_path: Path) -> None:
    g = golden.worked().copy()
    g.outputs = [7]
    path = tmp_path / "g.msgpack"
    with pytest.raises(Exception, match=r"^output 7 does not exist \(the graph has 3 nodes\)$"):
        fmt.save(g, path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_saved_files_get_normal_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        fmt.save(golden.worked(), tmp_path / "new.msgpack")
        assert stat.S_IMODE((tmp_path / "new.msgpack").stat().st_mode) == 0o644
        (tmp_path / "old.msgpack").write_bytes(b"")
        (tmp_path / "old.msgpack").chmod(0o640)
        fmt.save(golden.worked(), tmp_path / "old.msgpack")
        assert stat.S_IMODE((tmp_path / "old.msgpack").stat().st_mode) == 0o640
    finally:
        os.umask(umask)


def test_loaded_documents_are_independent_of_the_input() -> None:
    document = msgpack.unpackb(worked_bytes())
    copied = copy.deepcopy(document)
    fmt.loads(worked_bytes())
    assert document == copied


def test_the_spec_hex_dump_is_the_encoder_output() -> None:
    text = (SCHEMAS / "FORMAT.md").read_text()
    block = text.split("<!-- worked-example-hexdump")[1].split("```text\n")[1].split("```")[0]
    expected_offset = 0
    dumped = bytearray()
    for line in block.splitlines():
        offset, rest = line.split("  ", 1)
        chunk = bytes.fromhex(rest[:44])
        assert int(offset, 16) == expected_offset, line
        assert chunk and rest[44:46] == "  " and rest[46:].strip(), line
        dumped += chunk
        expected_offset += len(chunk)
    assert bytes(dumped) == worked_bytes()


def test_save_refuses_strings_longer_than_a_reader_accepts(tmp_path: Path) -> None:
    limit = fmt.DEFAULT_LIMITS.max_string_length
    at_limit = GraphBuilder()
    at_limit.leaf(1.0, name="n" * limit)
    fmt.loads(fmt.dumps(at_limit.build(metadata={"note": "é" * (limit // 2)})))  # at the limit: written and read
    past = GraphBuilder()
    past.leaf(1.0, name="n" * (limit + 1))
    with pytest.raises(FormatError) as info:
        fmt.save(past.build(), tmp_path / "long.msgpack")
    assert (
        str(info.value)
        == f"the name of node 0 is {limit + 1} bytes long, longer than the {limit} bytes a reader accepts"
    )
    assert list(tmp_path.iterdir()) == []
    metadata = GraphBuilder()
    metadata.leaf(1.0)
    with pytest.raises(
        FormatError,
        match=r"^a string in metadata is 1048578 bytes long, longer than the 1048576 bytes a reader accepts$",
    ):
        fmt.dumps(metadata.build(metadata={"note": "é" * (limit // 2 + 1)}))


SURROGATE_GRAPHS: list[tuple[Callable[[GraphBuilder], object], str]] = [
    (lambda b: b.leaf(1.0, name="x\ud800"), "the name of node 0 holds a lone surrogate (\\ud800)"),
    (lambda b: b.add("neg\udfff", [b.leaf(1.0)]), "the op tag 'neg\\udfff' holds a lone surrogate (\\udfff)"),
    (
        lambda b: b.add("neg", [b.leaf(1.0)], attrs={"k\udc80": 1}),
        "a map key in the attribute map of node 1 holds a lone surrogate (\\udc80)",
    ),
    (
        lambda b: b.add("neg", [b.leaf(1.0)], attrs={"k": ["\ud83d"]}),
        "a string in the attribute map of node 1 holds a lone surrogate (\\ud83d)",
    ),
]


@pytest.mark.parametrize(("build", "message"), SURROGATE_GRAPHS)
def test_save_refuses_a_lone_surrogate_before_touching_the_file(
    build: Callable[[GraphBuilder], object], message: str, tmp_path: Path
) -> None:
    # FORMAT.md §9: every string is Unicode text; UTF-8 cannot encode a lone surrogate (Python's
    # codec error was the message, and only once encoding had begun)
    b = GraphBuilder()
    build(b)
    graph = b.build()
    target = tmp_path / "g.msgpack"
    target.write_bytes(worked_bytes())
    for write in (lambda: fmt.save(graph, target), lambda: fmt.dumps(graph), lambda: jsonio.dumps(graph)):
        with pytest.raises(FormatError) as info:
            write()
        assert str(info.value) == message + ", which is not Unicode text"
    assert [path.name for path in tmp_path.iterdir()] == ["g.msgpack"]
    assert target.read_bytes() == worked_bytes()


def test_a_lone_surrogate_in_metadata_an_op_source_or_a_values_name_is_refused() -> None:
    b = GraphBuilder()
    b.leaf(1.0)
    with pytest.raises(FormatError, match=r"^a string in metadata holds a lone surrogate \(\\udc80\), which"):
        fmt.dumps(b.build(metadata={"run": "\udc80"}))
    graph = b.build()
    graph.op_sources["leaf"] = OpSource("graphsvc-x", "1.0\udc80")
    with pytest.raises(FormatError) as info:
        fmt.dumps(graph)
    assert str(info.value) == (
        "the plugin version of the op 'leaf' holds a lone surrogate (\\udc80), which is not Unicode text"
    )
    x = Value(2.0, name="x\ud800")
    with pytest.raises(FormatError) as traced:
        fmt.dumps(trace(x * 3.0))
    assert str(traced.value) == "the name of node 0 holds a lone surrogate (\\ud800), which is not Unicode text"


def test_an_empty_attribute_map_and_no_entry_are_one_encoding() -> None:
    # FORMAT.md §5: `[id, {}]` means what no entry means; the writer writes no entry, the reader drops it
    graph = golden.worked()
    graph.attrs = {0: {}, 2: {"k": 1}}
    data = fmt.dumps(graph)
    assert msgpack.unpackb(data)["attrs"] == [[2, {"k": 1}]]
    document = msgpack.unpackb(data)
    document["attrs"] = [[0, {}], [2, {"k": 1}]]
    assert fmt.loads(msgpack.packb(document)).attrs == {2: {"k": 1}}
    assert fmt.dumps(fmt.loads(msgpack.packb(document))) == data


def test_msgpack_refuses_nesting_past_1024_levels_whatever_the_limits() -> None:
    # FORMAT.md §9: the document map is level 1, metadata's map level 2, then the arrays
    head = worked_bytes()[:-1]  # all but the empty metadata map
    limits = fmt.Limits(max_attr_depth=2000)

    def nested(levels: int) -> bytes:
        return head + b"\x81\xa1k" + b"\x91" * (levels - 3) + b"\x90"

    assert fmt.loads(nested(1024), limits).num_nodes == 3
    with pytest.raises(FormatError) as info:
        fmt.loads(nested(1025), limits)
    assert str(info.value) == "not a valid msgpack document: it nests too deeply"


def test_an_op_table_of_more_than_65536_entries_is_refused() -> None:
    # FORMAT.md §7, item 2
    document = msgpack.unpackb(worked_bytes())
    document["ops"] += [{"tag": f"op{i}", "plugin": None, "version": None} for i in range(65_533)]
    assert fmt.loads(msgpack.packb(document)).num_nodes == 3  # 3 + 65,533 = 65,536 entries: at the limit
    document["ops"].append({"tag": "one more", "plugin": None, "version": None})
    with pytest.raises(FormatError) as info:
        fmt.loads(msgpack.packb(document))
    assert str(info.value) == "too many ops: 65537 (at most 65536)"


# -- loading and saving: the compiled check, the garbage collector ------------------------------------
def test_a_loaded_graph_gets_the_compiled_structure_check_whatever_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphsvc.native as kernels
    from tests.conftest import require_compiled

    require_compiled()
    compiled = kernels.compiled_checks().kernels  # the structure kernels alone: a load imports no replay kernels
    data = fmt.dumps(golden.seed000())
    calls = []
    real = compiled.structure_ok

    def counted(*args: Any) -> bool:
        calls.append(len(args[0]) - 1)
        return bool(real(*args))

    monkeypatch.setattr(compiled, "structure_ok", counted)
    graph = fmt.loads(data)
    assert calls == [graph.num_nodes] == [6]  # far below the threshold of a replay's compiled sweeps
    assert kernels.NATIVE_THRESHOLD > 6


def test_loading_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    """A load pauses the collector (a map per node's attributes); on or off, it is as it was
    afterwards, for a file that loads, one that does not, msgpack and JSON alike."""
    b = GraphBuilder()
    b.add("pow", [b.leaf(2.0)], attrs={"exponent": 3.0})
    graph = b.build()
    good, bad, text = tmp_path / "good.msgpack", tmp_path / "bad.msgpack", tmp_path / "good.json"
    fmt.save(graph, good)
    bad.write_bytes(good.read_bytes()[:-3])
    text.write_text(jsonio.dumps(graph))
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            for path in (good, text):
                assert fmt.load(path).attrs == {1: {"exponent": 3.0}}
                assert gc.isenabled() is enabled
            with pytest.raises(FormatError):
                fmt.load(bad)
            assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_saving_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    """A save pauses the collector too (a list per node's attributes); after a save, a failed one,
    dumps and dump it is as it was."""
    b = GraphBuilder()
    b.add("pow", [b.leaf(2.0)], attrs={"exponent": 3.0})
    graph = b.build()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            fmt.save(graph, tmp_path / "g.msgpack")
            assert gc.isenabled() is enabled
            fmt.dump(graph, io.BytesIO())
            assert fmt.dumps(graph) == (tmp_path / "g.msgpack").read_bytes()
            assert gc.isenabled() is enabled
            with pytest.raises(GraphFileError):
                fmt.save(graph, tmp_path / "no such folder" / "g.msgpack")
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
