"""Format 2.0, tensor graphs on disk: golden bytes, the worked example of FORMAT.md §15, bit-exact
round trips of every dtype and shape, loading as read-only views of one buffer, streaming saves,
the fast reader, the JSON form, and every hostile tensor table with its exact one-line error."""

from __future__ import annotations

import copy
import hashlib
import io
import itertools
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import app
from fuzz.property import check_input, general_outcome
from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphStructureError
from graphsvc.format import document, fastload, jsonio
from graphsvc.format import layout as file_layout
from graphsvc.graph import MAX_DIMENSIONS, Graph, GraphBuilder
from graphsvc.pluginhost import load_registry
from tests.conftest import GOLDEN_DIR, ROOT, as_json_view, import_script, json_schema, make_golden

SCHEMAS = ROOT / "schemas"
V2_DIR = GOLDEN_DIR / "v2"


golden = make_golden()

#: sha256 of each committed 2.0 golden file. A change here is a change of the format.
GOLDEN_SHA256 = {
    "tensor_worked": "55e821ec68891d2b38b8c3a9046b3faa05a96d8c17c7fcce4a6f21e7999e0f1e",
    "tensor_kinds": "c2695246dd0baf5d865f98e0d70d606a7f29117242cc25bd2d1106371a4022b0",
}


def bits(array: np.ndarray) -> list[int]:
    return array.reshape(-1).view({8: np.uint64, 4: np.uint32}[array.dtype.itemsize]).tolist()


def base_buffer(array: np.ndarray) -> Any:
    """The object at the end of an array's chain of bases: the buffer its bytes live in."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base if array.base is not None else array


def worked_document() -> dict[str, Any]:
    document: dict[str, Any] = msgpack.unpackb((V2_DIR / "tensor_worked.msgpack").read_bytes())
    return document


def mutated(mutate: Callable[[dict[str, Any]], object]) -> bytes:
    document = copy.deepcopy(worked_document())
    mutate(document)
    return msgpack.packb(document)


# -- golden files, the worked example, the schema --------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_golden_file_bytes_are_pinned(name: str) -> None:
    committed = (V2_DIR / f"{name}.msgpack").read_bytes()
    assert hashlib.sha256(committed).hexdigest() == GOLDEN_SHA256[name]
    assert fmt.dumps(golden.GOLDEN_V2[name]()) == committed


def test_golden_names_cover_make_golden() -> None:
    assert sorted(golden.GOLDEN_V2) == sorted(GOLDEN_SHA256) == sorted(p.stem for p in V2_DIR.glob("*.msgpack"))


def test_the_spec_hex_dump_is_the_encoder_output() -> None:
    text = (SCHEMAS / "FORMAT.md").read_text()
    block = text.split("<!-- tensor-example-hexdump")[1].split("```text\n")[1].split("```")[0]
    annotate = import_script(GOLDEN_DIR / "annotate_worked.py")
    data = fmt.dumps(golden.tensor_worked())
    assert block == annotate.dump(data, annotate.tensor_notes()) + "\n"
    assert len(data) == 502
    assert data.index(b"\xa4data\xc6") + 10 == 0x180 == 6 * 64  # the payload starts aligned


@pytest.fixture(scope="module")
def schema_validator() -> jsonschema.Draft202012Validator:
    return json_schema("graphsvc-v2.schema.json")


@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_files_validate_against_the_schema(name: str, schema_validator: jsonschema.Draft202012Validator) -> None:
    document = msgpack.unpackb((V2_DIR / f"{name}.msgpack").read_bytes())
    schema_validator.validate(as_json_view(document))
    v1 = json_schema("graphsvc-v1.schema.json")
    assert [list(e.absolute_path) for e in v1.iter_errors(as_json_view(document))] == [["version", 0]]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.__setitem__("version", [1, 0]), ["version", 0]),
        (lambda d: d["tensors"][0].__setitem__(2, "BF16"), ["tensors", 0, 2]),
        (lambda d: d["tensors"][0].__setitem__(1, "values"), ["tensors", 0, 1]),
        (lambda d: d["tensors"][0].__setitem__(3, [-1]), ["tensors", 0, 3, 0]),
        (lambda d: d["tensors"][0].__setitem__(4, 8), ["tensors", 0, 4]),
        (lambda d: d["tensors"][0].pop(), ["tensors", 0]),
        (lambda d: d.pop("data"), []),
    ],
)
def test_the_schema_rejects_bad_documents(
    mutate: Callable[[dict[str, Any]], object], path: list[object], schema_validator: jsonschema.Draft202012Validator
) -> None:
    document = as_json_view(worked_document())
    mutate(document)
    assert [list(e.absolute_path) for e in schema_validator.iter_errors(document)] == [path]


# -- which version is written ----------------------------------------------------------------------
def test_a_scalar_graph_is_still_written_as_1_0_and_a_tensor_graph_as_2_0() -> None:
    graph = golden.tensor_worked()
    assert msgpack.unpackb(fmt.dumps(graph))["version"] == [2, 0]
    b = GraphBuilder()
    b.leaf(2.0, name="a")
    assert msgpack.unpackb(fmt.dumps(b.build()))["version"] == [1, 0]
    assert list(msgpack.unpackb(fmt.dumps(graph))) == list(fmt.KEYS_2)


def test_a_3_0_file_is_refused_in_one_line() -> None:
    with pytest.raises(FormatError) as info:
        fmt.loads(mutated(lambda d: d.__setitem__("version", [3, 0])))
    assert str(info.value) == (
        "the file uses format version 3.0, newer than this graphsvc reads (major versions 1 and 2); upgrade graphsvc"
    )


def test_a_newer_minor_with_unknown_keys_is_read() -> None:
    def newer(d: dict[str, Any]) -> None:
        d["version"] = [2, 3]
        d["future"] = {"x": 1}
        d["tensors"][0].append("ignored?")  # an entry is exactly six items: not ignored

    with pytest.raises(FormatError) as info:
        fmt.loads(mutated(newer))
    assert str(info.value) == "tensors[0] must be an array [node, which, dtype, shape, offset, nbytes]"
    graph, version = fmt._read_msgpack(
        mutated(lambda d: (d.__setitem__("version", [2, 3]), d.__setitem__("future", 1))), fmt.DEFAULT_LIMITS
    )
    assert version == (2, 3) and fmt.dumps(graph) == (V2_DIR / "tensor_worked.msgpack").read_bytes()


# -- round trips -----------------------------------------------------------------------------------
def test_every_dtype_shape_and_special_value_round_trips_bit_for_bit(tmp_path: Path) -> None:
    path = tmp_path / "kinds.msgpack"
    fmt.save(golden.tensor_kinds(), path)
    graph = fmt.load(path)
    x, labels, scale, empty, picked = (graph.arrays[i] for i in (0, 1, 2, 3, 5))
    assert (x.dtype, x.shape) == (np.dtype("float32"), (2, 3))
    assert bits(x) == [0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000]
    assert graph.grad_arrays[0].tolist() == [[0.5] * 3] * 2 and graph.grad_arrays[0].dtype == np.float32
    assert labels.dtype == np.int64 and labels.tolist() == [-(1 << 63), -1, 0, (1 << 63) - 1]
    assert (scale.shape, scale.dtype, float(scale)) == ((), np.float64, 2.0)
    assert bits(graph.grad_arrays[2]) == [0x8000000000000000]  # -0.0, 0-d
    assert (empty.shape, picked.shape, picked.dtype) == ((0, 4), (2, 0), np.float32)
    assert sorted(graph.arrays) == [0, 1, 2, 3, 5] and sorted(graph.grad_arrays) == [0, 2]
    assert graph.grads is not None and graph.grads[4] == 0.25 and np.isnan(graph.grads[0])
    assert graph.values[4] == 1.0 and np.isnan(graph.values[0])
    assert graph.attrs == {5: {"axis": 1}} and graph.metadata == {"made by": "make_golden.tensor_kinds"}
    assert fmt.dumps(graph) == path.read_bytes()


def test_loaded_arrays_are_read_only_views_of_one_buffer(tmp_path: Path) -> None:
    path = tmp_path / "kinds.msgpack"
    fmt.save(golden.tensor_kinds(), path)
    for graph in (fmt.load(path), fmt.loads(path.read_bytes())):
        arrays = [*graph.arrays.values(), *graph.grad_arrays.values()]
        assert all(not a.flags.writeable and not a.flags.owndata and a.flags.aligned for a in arrays)
        assert len({id(base_buffer(a)) for a in arrays}) == 1
        with pytest.raises(ValueError, match="read-only"):
            graph.arrays[0][0, 0] = 1.0
        assert graph.copy().arrays[0].flags.writeable


def test_loads_views_the_bytes_it_was_given() -> None:
    data = (V2_DIR / "tensor_kinds.msgpack").read_bytes()
    graph = fmt.loads(data)
    assert base_buffer(graph.arrays[0]) is data


def test_non_contiguous_fortran_and_big_endian_arrays_are_written_c_order_little_endian() -> None:
    matrix = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = GraphBuilder()
    b.leaf(np.zeros(1), name="a")  # replaced below by arrays the builder would have copied
    b.leaf(np.zeros(1), name="b")
    b.leaf(np.arange(3, dtype="<i8"), name="big")
    graph = b.build()
    graph.arrays[0] = matrix[:, ::2]  # non-contiguous
    graph.arrays[1] = np.asfortranarray(matrix)
    data = fmt.dumps(graph)
    payload = msgpack.unpackb(data)["data"]
    assert payload[:48] == np.array([[0, 2], [4, 6], [8, 10]], dtype="<f8").tobytes()
    assert payload[64 : 64 + 96] == matrix.astype("<f8").tobytes()
    assert payload[192:] == b"\x00" * 8 + b"\x01" + b"\x00" * 7 + b"\x02" + b"\x00" * 7
    loaded = fmt.loads(data)
    assert loaded.arrays[0].tolist() == [[0, 2], [4, 6], [8, 10]] and loaded.arrays[1].tolist() == matrix.tolist()
    assert bytes(document.little_endian_bytes(np.array([1.0], dtype=">f4"))) == b"\x00\x00\x80\x3f"


# -- saving streams --------------------------------------------------------------------------------
class Recorder(io.RawIOBase):
    def __init__(self) -> None:
        self.chunks: list[Any] = []

    def writable(self) -> bool:
        return True

    def write(self, chunk: Any) -> int:
        self.chunks.append(chunk)
        return len(chunk)


def test_dump_writes_each_array_as_a_view_of_its_own_buffer() -> None:
    big = np.arange(1 << 16, dtype=np.float32)
    b = GraphBuilder()
    b.leaf(big, name="w")
    b.leaf(np.ones(3), name="v")
    graph = b.build()
    stream = Recorder()
    fmt.dump(graph, stream)  # type: ignore[arg-type]
    sizes = [len(chunk) for chunk in stream.chunks]
    assert max(sizes) == big.nbytes and sum(sizes) == len(fmt.dumps(graph))
    [payload] = [chunk for chunk in stream.chunks if len(chunk) == big.nbytes]
    assert isinstance(payload, memoryview) and np.shares_memory(np.asarray(payload), graph.arrays[0])


def test_load_peak_memory_stays_near_the_arrays_bytes(tmp_path: Path) -> None:
    arrays = [np.full((512, 1024), float(i), dtype=np.float32) for i in range(8)]  # 16 MiB
    b = GraphBuilder()
    for i, array in enumerate(arrays):
        b.leaf(array, name=f"w{i}", grad=array)
    path = tmp_path / "big.msgpack"
    fmt.save(b.build(), path)
    del b
    tracemalloc.start()
    graph = fmt.load(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stored = 2 * sum(a.nbytes for a in arrays)
    assert stored <= peak <= 1.01 * stored  # 32 MiB of arrays: the payloads, read once, and 0.3 MiB more
    assert graph.grad_arrays[7][511, 1023] == 7.0


# -- the fast reader -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_the_fast_reader_finds_the_data_section_and_reads_what_the_general_reader_does(name: str) -> None:
    data = (V2_DIR / f"{name}.msgpack").read_bytes()
    layout = fastload.scan(
        fastload.BytesSource(data), file_layout.COLUMNS, "grads", fmt.DEFAULT_LIMITS.max_string_length
    )
    assert layout.data is not None and layout.data[0] % 64 == 0
    assert data[layout.data[0] - 10 : layout.data[0]] == b"\xa4data\xc6" + layout.data[1].to_bytes(4, "big")
    assert layout.data[0] + layout.data[1] < len(data)
    keys = [b"\xa6format", b"\xa7tensors", b"\xa5names"]
    assert [data[start:end][: len(key)] for (start, end), key in zip(layout.rest, keys, strict=True)] == keys
    assert layout.rest_entries == 8
    assert general_outcome(data) == fmt.dumps(fmt.loads(data)) == data


def test_a_reordered_2_0_file_reads_the_general_way_to_the_same_graph() -> None:
    document = msgpack.unpackb((V2_DIR / "tensor_kinds.msgpack").read_bytes())
    reordered = msgpack.packb(dict(reversed(list(document.items()))))
    with pytest.raises(fastload.NotCanonical):
        fastload.scan(fastload.BytesSource(b"\x81\xa4data\xc4\x00"), file_layout.COLUMNS, "grads", 100)
    assert fmt.dumps(fmt.loads(reordered)) == (V2_DIR / "tensor_kinds.msgpack").read_bytes()


# -- hostile tensor tables -------------------------------------------------------------------------
BAD_TABLES: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (lambda d: d.pop("tensors"), "the document lacks the key tensors"),
    (lambda d: d.pop("data"), "the document lacks the key data"),
    (lambda d: d.__setitem__("tensors", {}), "tensors must be an array, not a map"),
    (lambda d: d.__setitem__("data", "x"), "data must be bin data, not a string"),
    (lambda d: d["tensors"][0].pop(), "tensors[0] must be an array [node, which, dtype, shape, offset, nbytes]"),
    (
        lambda d: d["tensors"].__setitem__(0, {}),
        "tensors[0] must be an array [node, which, dtype, shape, offset, nbytes]",
    ),
    (lambda d: d["tensors"][0].__setitem__(0, "0"), "tensors[0][0] must be an integer, not a string"),
    (
        lambda d: d["tensors"][0].__setitem__(0, -1),
        "tensors[0] refers to node -1, which does not exist (the graph has 3 nodes)",
    ),
    (
        lambda d: d["tensors"][1].__setitem__(0, 3),
        "tensors[1] refers to node 3, which does not exist (the graph has 3 nodes)",
    ),
    (lambda d: d["tensors"][0].__setitem__(1, "values"), 'tensors[0][1] must be "value" or "grad", not \'values\''),
    (lambda d: d["tensors"][0].__setitem__(1, 0), 'tensors[0][1] must be "value" or "grad", not 0'),
    (
        lambda d: d["tensors"][0].__setitem__(2, "BF16"),
        'tensors[0][2] must be a dtype "F64", "F32" or "I64", not \'BF16\'',
    ),
    (
        lambda d: d["tensors"][0].__setitem__(2, "f32"),
        'tensors[0][2] must be a dtype "F64", "F32" or "I64", not \'f32\'',
    ),
    (lambda d: d["tensors"][0].__setitem__(2, None), 'tensors[0][2] must be a dtype "F64", "F32" or "I64", not nil'),
    (
        lambda d: d["tensors"][0].__setitem__(2, "\x1b[2J" + "F" * 100),
        'tensors[0][2] must be a dtype "F64", "F32" or "I64", not \'\\x1b[2JFFFFFFFFFFFF... (109 characters)',
    ),
    (lambda d: d["tensors"][0].__setitem__(3, 2), "tensors[0][3] must be an array, not an integer"),
    (
        lambda d: d["tensors"][0].__setitem__(3, [-2]),
        "tensors[0][3][0] must be a non-negative integer (a dimension), not -2",
    ),
    (
        lambda d: d["tensors"][0].__setitem__(3, [2.0]),
        "tensors[0][3][0] must be a non-negative integer (a dimension), not a float",
    ),
    (
        lambda d: d["tensors"][0].__setitem__(3, [True, 2]),
        "tensors[0][3][0] must be a non-negative integer (a dimension), not a boolean",
    ),
    (lambda d: d["tensors"][0].__setitem__(3, [1] * 33), "tensors[0]: the shape has 33 dimensions, more than 32"),
    (
        lambda d: d["tensors"][0].__setitem__(3, [1 << 32, 1 << 32]),
        "tensors[0]: the shape [4294967296, 4294967296] is too large (more than 2**63 - 1 bytes)",
    ),
    (
        lambda d: d["tensors"][0].__setitem__(3, [0, 1 << 62]),
        "tensors[0]: the shape [0, 4611686018427387904] is too large (more than 2**63 - 1 bytes)",
    ),
    (
        lambda d: d["tensors"][0].__setitem__(3, [1000]),
        "tensors[0]: an F32 array of shape [1000] takes 4,000 bytes, more than the data section's 72",
    ),
    (lambda d: d["tensors"][0].__setitem__(5, 12), "tensors[0]: nbytes is 12, but an F32 array of shape [2] takes 8"),
    (lambda d: d["tensors"][0].__setitem__(5, -8), "tensors[0]: nbytes is -8, but an F32 array of shape [2] takes 8"),
    (lambda d: d["tensors"][0].__setitem__(5, "8"), "tensors[0][5] must be an integer, not a string"),
    (lambda d: d["tensors"][0].__setitem__(4, 8), "tensors[0]: the offset 8 is not a multiple of 64"),
    (lambda d: d["tensors"][0].__setitem__(4, -64), "tensors[0]: the offset -64 is negative"),
    (
        lambda d: d["tensors"][1].__setitem__(4, 128),
        "tensors[1]: bytes 128 to 136 lie outside the data section's 72 bytes",
    ),
    (
        lambda d: (d.__setitem__("data", bytes(1)), d["tensors"].__setitem__(0, [0, "value", "F32", [0], 64, 0])),
        "tensors[0]: bytes 64 to 64 lie outside the data section's 1 byte",
    ),
    (lambda d: d["tensors"][1].__setitem__(4, 0), "tensors[0] and tensors[1] overlap in the data section (at byte 0)"),
    (lambda d: d["tensors"][1].__setitem__(0, 0), "tensors[1]: the value of node 0 is listed twice"),
    (
        lambda d: d["tensors"].reverse(),
        "tensors[1]: the value of node 0 is listed out of order (entries are sorted by node, a value first)",
    ),
    (
        lambda d: d["tensors"][0].__setitem__(0, 1),
        "tensors[0]: node 1 holds a value array, so its entry in the values column must be nan, not 3.0",
    ),
    (
        lambda d: d["tensors"].insert(1, [0, "grad", "F32", [1], 64, 4]),
        "tensors[1]: node 0's gradient has shape [1], but its value has shape [2]",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_TABLES, ids=[m for _, m in BAD_TABLES])
def test_each_bad_tensor_table_is_one_exact_error_from_either_reader(
    mutate: Callable[[dict[str, Any]], object], message: str
) -> None:
    data = mutated(mutate)
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    assert str(info.value) == message
    assert general_outcome(data) == message


def test_an_overlap_is_found_whatever_the_order_of_the_payloads() -> None:
    def overlapping(d: dict[str, Any]) -> None:
        d["data"] = bytes(256)
        d["tensors"] = [[0, "value", "F32", [2], 128, 8], [2, "value", "F64", [20], 0, 160]]

    with pytest.raises(FormatError) as info:
        fmt.loads(mutated(overlapping))
    assert str(info.value) == "tensors[0] and tensors[1] overlap in the data section (at byte 128)"


def test_empty_arrays_may_share_an_offset_and_sit_at_the_end() -> None:
    def empties(d: dict[str, Any]) -> None:
        d["tensors"] = [[0, "value", "F32", [0, 5], 64, 0], [2, "value", "I64", [3, 0], 64, 0]]
        d["data"] = bytes(64)

    graph = fmt.loads(mutated(empties))
    assert (graph.arrays[0].shape, graph.arrays[2].shape, graph.arrays[2].dtype) == ((0, 5), (3, 0), np.int64)


def test_a_huge_declared_shape_is_refused_without_allocating() -> None:
    data = mutated(lambda d: d["tensors"][0].__setitem__(3, [1 << 30, 1 << 30]))
    tracemalloc.start()
    with pytest.raises(FormatError, match="takes 4,611,686,018,427,387,904 bytes, more than the data section's 72"):
        fmt.loads(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


# -- what save refuses -----------------------------------------------------------------------------
def _graph_with(**changes: Any) -> Graph:
    graph = golden.tensor_worked()
    for key, value in changes.items():
        setattr(graph, key, value)
    return graph


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        (
            _graph_with(values=np.array([1.0, 3.0, np.nan])),
            "node 0 holds a value array, so its entry in the values column must be nan, not 1.0",
        ),
        (
            _graph_with(grads=np.zeros(3), grad_arrays={2: np.ones(2, dtype=np.float32)}),
            "node 2 holds a gradient array, so its entry in the grads column must be nan, not 0.0",
        ),
        (
            _graph_with(grad_arrays={2: np.ones((2, 1), dtype=np.float32)}),
            "node 2's gradient array has shape [2, 1], but its value array has shape [2]",
        ),
        (
            _graph_with(arrays={0: np.zeros((1,) * 33)}),
            "node 0: a value array has 33 dimensions, more than 32",  # Graph.check's words
        ),
    ],
)
def test_save_refuses_what_load_would_refuse(graph: Graph, message: str, tmp_path: Path) -> None:
    target = tmp_path / "g.msgpack"
    target.write_bytes(b"old")
    with pytest.raises((FormatError, GraphStructureError)) as info:  # both exit 3
        fmt.save(graph, target)
    assert str(info.value) == message
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["g.msgpack"]


def test_more_than_4_gib_of_arrays_is_refused_before_writing() -> None:
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.float64), shape=(1 << 29,), strides=(0,))
    graph = _graph_with(arrays={0: huge})
    with pytest.raises(FormatError) as info:
        fmt.dumps(graph)
    assert str(info.value) == (
        "the graph's arrays take 4,294,967,296 bytes with their alignment, more than the 4 GiB a msgpack bin holds "
        "(4,294,967,295 bytes)"
    )


# -- the JSON form ---------------------------------------------------------------------------------
def test_the_json_form_of_a_tensor_node() -> None:
    b = GraphBuilder()
    b.leaf(np.array([[0.1, np.nan, -0.0], [np.inf, 16777217.0, 1e-45]], dtype=np.float32), name="x")
    b.leaf(np.array(7, dtype=np.int64), name="k", grad=None)
    document = jsonio.to_document(b.build())
    assert document["version"] == [2, 0]
    assert document["nodes"][0]["value"] == {
        "dtype": "float32",
        "shape": [2, 3],
        "data": [[0.1, "nan", -0.0], ["inf", 16777216.0, 1e-45]],
    }
    assert document["nodes"][1]["value"] == {"dtype": "int64", "shape": [], "data": 7}


@pytest.mark.parametrize("name", ["tensor_worked", "tensor_kinds"])
def test_json_round_trips_through_convert_both_ways(name: str, tmp_path: Path) -> None:
    source = V2_DIR / f"{name}.msgpack"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(source), "--to", "json"])
    assert (result.exit_code, result.stderr) == (0, "")
    json_path = tmp_path / f"{name}.json"
    json_path.write_text(result.stdout)
    back = tmp_path / f"{name}.msgpack"
    result = runner.invoke(app, ["convert", str(json_path), "--to", "msgpack"])
    assert (result.exit_code, result.stderr) == (0, f"wrote {back} ({fmt.load(source).num_nodes} nodes)\n")
    if name == "tensor_worked":
        assert back.read_bytes() == source.read_bytes()
    else:  # JSON keeps every bit but a nan's sign and payload (as in 1.0): x's -nan and payload nan
        original, again = fmt.load(source), fmt.load(back)
        assert bits(again.arrays[0]) == [0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00000, 0x3F800000]
        assert bits(again.grad_arrays[2]) == bits(original.grad_arrays[2]) == [1 << 63]
        assert again.arrays[1].tolist() == original.arrays[1].tolist()
        again.arrays[0] = original.arrays[0]
        assert fmt.dumps(again) == source.read_bytes()


def _json(value: Any) -> str:
    return json.dumps({"format": "graphsvc-json", "version": [2, 0], "nodes": [{"op": "leaf", "value": value}]})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"dtype": "float16", "shape": [], "data": 1},
            'node 0: value: dtype must be "float64", "float32" or "int64", not \'float16\'',
        ),
        (
            {"dtype": "float32", "shape": [-1], "data": []},
            "node 0: value: shape must be a list of non-negative integers",
        ),
        ({"dtype": "float32", "shape": [2]}, "node 0: value: the array has no data"),
        (
            {"dtype": "float32", "shape": [2, 2], "data": [[1, 2], [3]]},
            "node 0: value: data does not have the shape [2, 2] (at depth 1)",
        ),
        (
            {"dtype": "float32", "shape": [], "data": [1]},
            'node 0: value: an item must be a number or one of "nan", "inf", "-inf", not [1]',
        ),
        (
            {"dtype": "float32", "shape": [1], "data": [1e39]},
            "node 0: value: the item 1e+39 is too large for a float32",
        ),
        (
            {"dtype": "int64", "shape": [1], "data": [1 << 63]},
            "node 0: value: an int64 array holds 9223372036854775808, not an integer of 64 bits",
        ),
        (
            {"dtype": "int64", "shape": [1], "data": [1.0]},
            "node 0: value: an int64 array holds 1.0, not an integer of 64 bits",
        ),
    ],
)
def test_bad_json_tensors(value: Any, message: str) -> None:
    with pytest.raises(FormatError) as info:
        jsonio.loads(_json(value))
    assert str(info.value) == message


# -- the fuzz property on 2.0 files ----------------------------------------------------------------
REGISTRY, _ = load_registry(disable_third_party=True)
V2_SAMPLES = [path.read_bytes() for path in sorted(V2_DIR.glob("*.msgpack"))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample=st.sampled_from(V2_SAMPLES), data=st.data())
def test_mutated_2_0_files_keep_the_property(sample: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, len(sample) - 1))
    replacement = data.draw(st.binary(min_size=1, max_size=4))
    check_input(sample[:position] + replacement + sample[position + len(replacement) :], REGISTRY)


def test_the_nan_in_an_array_nodes_column_entry_is_not_part_of_the_graph() -> None:
    # FORMAT.md §16: any nan there reads; the canonical writer writes 7ff8000000000000
    document = worked_document()
    document["nodes"]["values"]["data"] = bytes.fromhex("010000000000f0ff0000000000000840000000000000f87f")
    graph = fmt.loads(msgpack.packb(document))
    assert bits(graph.values) == [0xFFF0000000000001, 0x4008000000000000, 0x7FF8000000000000]
    assert fmt.dumps(graph) == (V2_DIR / "tensor_worked.msgpack").read_bytes()


@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_json_documents_validate_against_the_json_v2_schema(name: str) -> None:
    schema = json.loads((SCHEMAS / "graphsvc-json-v2.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    document = json.loads(jsonio.dumps(golden.GOLDEN_V2[name]()))
    validator.validate(document)
    document["nodes"][0]["value"]["dtype"] = "float16"
    assert [list(e.absolute_path) for e in validator.iter_errors(document)] == [["nodes", 0, "value"]]


@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_every_prefix_says_truncated_and_a_trailing_byte_is_refused(name: str) -> None:
    data = (V2_DIR / f"{name}.msgpack").read_bytes()
    for end in range(len(data)):
        with pytest.raises(FormatError) as info:
            fmt.loads(data[:end])
        assert str(info.value).startswith("the file is truncated: "), end
    with pytest.raises(FormatError) as info:
        fmt.loads(data + b"\xc0")
    assert str(info.value) == f"trailing bytes after the document: 1 byte follows the first {len(data)}"


def test_a_4_gib_data_header_in_a_small_file_is_refused_at_once() -> None:
    data = (
        (V2_DIR / "tensor_worked.msgpack")
        .read_bytes()
        .replace(b"\xa4data\xc6\x00\x00\x00\x48", b"\xa4data\xc6\xff\xff\xff\xff")
    )
    tracemalloc.start()
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert str(info.value) == "the file is truncated: 502 bytes end in the middle of the document"
    assert peak < 1 << 20


# -- the tensor table's C check ---------------------------------------------------------------------
# graphsvc.native._ctable.tensor_views (C) checks a whole table at once and only says "every rule holds" or
# "look closer"; document._checked_table, its twin, checks entry by entry and words the first broken
# rule. The C check must accept exactly what _checked_table accepts with the payloads in table order.
def table_inputs(doc: dict[str, Any]) -> tuple[list[Any], int, int, np.ndarray, np.ndarray | None]:
    nodes = doc["nodes"]
    count = nodes["count"]
    values = np.frombuffer(nodes["values"]["data"], dtype="<f8")
    grads = None if nodes.get("grads") is None else np.frombuffer(nodes["grads"]["data"], dtype="<f8")
    return doc["tensors"], count, len(doc["data"]), values, grads


def native_views(doc: dict[str, Any]) -> Any:
    """What the C twin returns for the document's table (skipped where it was not built)."""
    from tests.conftest import require_native

    ctable = require_native("table")
    entries, count, size, values, grads = table_inputs(doc)
    buffer = np.frombuffer(bytes(size), dtype=np.uint8)
    items = {name: (dtype, dtype.itemsize) for name, dtype in file_layout.TENSOR_DTYPES.items()}
    return ctable.tensor_views(entries, count, size, 64, items, values, grads, np.ndarray, buffer)


def test_the_c_table_check_allows_as_many_dimensions_as_a_graph() -> None:
    """csrc/table.c has its own copy of the limit (it sizes the buffers of a shape): the module exports it."""
    from tests.conftest import require_native

    assert require_native("table").MAX_DIMENSIONS == MAX_DIMENSIONS


def checked_or_error(doc: dict[str, Any]) -> Any:
    try:
        return document._checked_table(*table_inputs(doc))
    except FormatError as exc:
        return str(exc)


@pytest.mark.parametrize(("mutate", "message"), BAD_TABLES[4:], ids=[m for _, m in BAD_TABLES[4:]])
def test_the_c_table_check_refuses_each_bad_table_and_leaves_its_words_to_the_entry_checks(
    mutate: Callable[[dict[str, Any]], object], message: str
) -> None:
    doc = copy.deepcopy(worked_document())
    mutate(doc)
    assert native_views(doc) is None
    assert checked_or_error(doc) == message


#: Values put into each field of each entry of the worked table (a valid one among them).
PERTURBATIONS: list[Any] = [
    -1, 0, 1, 2, 3, 8, 63, 64, 128, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), True, 1.0, None, "value", "grad",
    "F32", "F64", "I64", "f32", [], [2], [0], [1, 2], [2**62, 4], [2**32, 2**32], [-1], [2.0], [True], [1] * 33,
]  # fmt: skip


@pytest.mark.parametrize("field", range(6))
def test_the_c_table_check_agrees_with_the_entry_checks(field: int) -> None:
    """Every perturbation of every field: the C check accepts a table exactly when the entry-by-entry
    check does and the payloads are in table order, and then gives the arrays it describes."""
    accepted = 0
    for entry in range(2):
        for value in PERTURBATIONS:
            doc = copy.deepcopy(worked_document())
            doc["tensors"][entry][field] = copy.deepcopy(value)
            native = native_views(doc)
            checked = checked_or_error(doc)
            pairs = itertools.pairwise(doc["tensors"])  # [node, which, dtype, shape, offset, nbytes]
            in_table_order = not isinstance(checked, str) and all(b[4] >= a[4] + a[5] for a, b in pairs)
            assert (native is not None) == in_table_order, (entry, value, checked)
            if native is not None:
                accepted += 1
                rows = [(node, which, dtype, list(array.shape)) for node, which, dtype, array in _native_rows(native)]
                assert rows == [(node, which, dtype, list(shape)) for node, which, dtype, shape, _ in checked]
    assert accepted >= 2  # the unchanged table, at least


def _native_rows(views: tuple[dict[int, np.ndarray], dict[int, np.ndarray]]) -> list[tuple[int, int, Any, Any]]:
    rows = [(node, which, array.dtype, array) for which in (0, 1) for node, array in views[which].items()]
    return sorted(rows, key=lambda row: (row[0], row[1]))


@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_a_canonical_table_takes_the_c_check_alone_and_reads_as_the_entry_checks_read_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import require_native

    require_native("table")
    data = (V2_DIR / f"{name}.msgpack").read_bytes()
    with monkeypatch.context() as without_c:
        without_c.setattr(document, "_ctable", None)
        expected = fmt.loads(data)

    def refuse(*args: Any) -> Any:
        raise AssertionError("the entry-by-entry check ran")

    monkeypatch.setattr(document, "_checked_table", refuse)
    graph = fmt.loads(data)
    for which in ("arrays", "grad_arrays"):
        got, want = getattr(graph, which), getattr(expected, which)
        assert sorted(got) == sorted(want)
        for node, array in want.items():
            assert got[node].dtype == array.dtype and got[node].shape == array.shape
            assert got[node].tobytes() == array.tobytes() and not got[node].flags.writeable


def test_a_valid_table_in_another_order_of_payloads_reads_the_same_the_slow_way() -> None:
    def swapped(d: dict[str, Any]) -> None:
        d["data"] = d["data"][64:] + bytes(56) + d["data"][:8]
        d["tensors"][0][4], d["tensors"][1][4] = 64, 0

    doc = copy.deepcopy(worked_document())
    swapped(doc)
    assert native_views(doc) is None  # not as a writer lays it out
    moved, original = fmt.loads(mutated(swapped)), fmt.loads(msgpack.packb(worked_document()))
    assert {node: a.tobytes() for node, a in moved.arrays.items()} == {
        node: a.tobytes() for node, a in original.arrays.items()
    }


# -- saving ------------------------------------------------------------------------------------------
def test_a_save_lays_out_the_tensor_table_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = golden.GOLDEN_V2["tensor_kinds"]()
    calls = []
    real = document.stored_arrays

    def counted(g: Graph) -> list[document.Stored]:
        calls.append(g)
        return real(g)

    monkeypatch.setattr(document, "stored_arrays", counted)
    fmt.save(graph, tmp_path / "g.msgpack")
    assert len(calls) == 1
    assert (tmp_path / "g.msgpack").read_bytes() == (V2_DIR / "tensor_kinds.msgpack").read_bytes()


def test_a_load_checks_the_arrays_once_in_the_tensor_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kinds.msgpack"
    path.write_bytes((V2_DIR / "tensor_kinds.msgpack").read_bytes())

    def refuse(*args: Any) -> None:
        raise AssertionError("the arrays were checked again")

    with monkeypatch.context() as checked_once:
        checked_once.setattr(Graph, "_check_arrays", refuse)
        graph = fmt.load(path)
    assert fmt.dumps(graph) == path.read_bytes()


@pytest.mark.parametrize("name", sorted(GOLDEN_SHA256))
def test_the_c_table_views_are_the_arrays_the_constructor_makes(name: str) -> None:
    """The C twin makes a non-empty array by slicing the buffer viewed as its dtype and reshaping:
    the same bytes, shape, strides and flags as ``np.ndarray(shape, dtype, buffer, offset)``."""
    doc: dict[str, Any] = msgpack.unpackb((V2_DIR / f"{name}.msgpack").read_bytes())
    doc["data"] = doc["data"] + bytes(3)  # a section whose length no itemsize divides
    entries, count, _, values, grads = table_inputs(doc)
    buffer = np.frombuffer(doc["data"], dtype=np.uint8)
    views = document._read_tensors(doc, count, values, grads)
    kinds = set()
    for node, which, dtype_name, shape, offset, _ in entries:
        array = views[file_layout.WHICH.index(which)][node]
        expected = np.ndarray(shape, file_layout.TENSOR_DTYPES[dtype_name], buffer, offset)
        assert (array.dtype, array.shape, array.strides) == (expected.dtype, expected.shape, expected.strides)
        assert array.ctypes.data == expected.ctypes.data and base_buffer(array) is doc["data"]
        assert not array.flags.writeable and array.flags.c_contiguous and array.flags.aligned
        kinds.add((len(shape), array.size > 0))
    if name == "tensor_kinds":
        assert kinds == {(0, True), (1, True), (2, True), (2, False)}
