"""The fast reader of canonical files: where it finds each part, that it reads exactly what the
general reader (msgpack decoding the whole document) reads, and that it hands anything else over."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from fuzz.property import general_outcome
from graphsvc import format as fmt
from graphsvc.format import codec, fastload
from graphsvc.graph import GraphBuilder
from tests.conftest import ROOT

SAMPLE_FILES = sorted((ROOT / "schemas" / "examples").glob("*.msgpack")) + sorted((ROOT / "examples").glob("*.msgpack"))
COLUMNS = ("op_codes", "parent_offsets", "parent_indices", "values")


def scan(data: bytes) -> fastload.Layout:
    return fastload.scan(fastload.BytesSource(data), COLUMNS, "grads", fmt.DEFAULT_LIMITS.max_string_length)


def chain(n: int, grads: bool = False) -> bytes:
    """x, then n - 1 nodes each adding the one before to x; large enough for 4-byte bin headers."""
    b = GraphBuilder()
    x = b.leaf(0.5, name="x")
    node = x
    for _ in range(n - 1):
        node = b.add("add", [node, x], value=1.25)
    graph = b.build(outputs=[node], metadata={"by": "test"})
    if grads:
        graph.grads = np.arange(n, dtype=np.float64)
    return fmt.dumps(graph)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_file_is_canonical_and_reads_as_the_general_reader_does(path: Path) -> None:
    data = path.read_bytes()
    document = msgpack.unpackb(data)
    layout = scan(data)
    assert [span.key for span in layout.columns] == [*COLUMNS, *(["grads"] if "grads" in document["nodes"] else [])]
    for span in layout.columns:
        column = document["nodes"][span.key]
        assert (span.dtype, span.length) == (column["dtype"], column["length"])
        assert data[span.offset : span.offset + span.size] == column["data"]
    assert layout.node_count == document["nodes"]["count"]
    (head_start, head_end), (tail_start, tail_end) = layout.rest
    assert (head_start, layout.rest_entries) == (1, 7)
    assert data[head_start : head_start + 7] == b"\xa6format"
    assert data[head_end : head_end + 6] == b"\xa5nodes"
    assert data[tail_start : tail_start + 6] == b"\xa5names"
    assert tail_end == len(data)
    doc = codec.decode_fast(fastload.BytesSource(data), fmt.DEFAULT_LIMITS)
    assert all(isinstance(doc["nodes"][span.key]["data"], np.ndarray) for span in layout.columns)
    assert fmt.dumps(fmt.loads(data)) == general_outcome(data) == data


def test_large_columns_read_from_a_file_into_aligned_read_only_arrays(tmp_path: Path) -> None:
    data = chain(70_000, grads=True)  # columns of 140 KB to 560 KB: bin 32 headers, past one read window
    assert scan(data).columns[3].size == 8 * 70_000
    path = tmp_path / "chain.msgpack"
    path.write_bytes(data)
    graph = fmt.load(path)
    assert fmt.dumps(graph) == data == general_outcome(data)
    assert graph.grads is not None
    for array in (graph.op_codes, graph.parent_offsets, graph.parent_indices, graph.values, graph.grads):
        assert array.flags.aligned and not array.flags.writeable
    assert graph.values[1] == 1.25 and graph.parents(69_999) == [69_998, 0] and graph.grads[7] == 7.0
    assert graph.copy().values.flags.writeable


def reordered(data: bytes) -> bytes:
    """The same document with its top-level keys in reverse order: valid, but not canonical."""
    document = msgpack.unpackb(data)
    return msgpack.packb(dict(reversed(list(document.items()))), use_bin_type=True)


def test_other_key_orders_and_header_widths_are_read_the_fast_way() -> None:
    data = chain(100, grads=True)
    document = msgpack.unpackb(data)
    document["nodes"] = {
        key: dict(reversed(column.items())) if isinstance(column, dict) else column
        for key, column in reversed(document["nodes"].items())
    }
    other = reordered(msgpack.packb(document, use_bin_type=True))
    # non-smallest headers too: the document as a map16, "nodes" as a str8
    wide = b"\xde\x00\x08" + other[1:].replace(b"\xa5nodes", b"\xd9\x05nodes")
    for variant in (other, wide):
        layout = scan(variant)
        assert [span.key for span in layout.columns] == [
            "grads",
            "values",
            "parent_indices",
            "parent_offsets",
            "op_codes",
        ]
        doc = codec.decode_fast(fastload.BytesSource(variant), fmt.DEFAULT_LIMITS)
        assert isinstance(doc["nodes"]["values"]["data"], np.ndarray)
        assert fmt.dumps(fmt.loads(variant)) == data == general_outcome(variant)


@pytest.mark.parametrize(
    ("change", "old", "new"),
    [
        (lambda doc: doc["nodes"].update(extra=1), b"", b""),  # a nodes key of a newer minor version
        (lambda doc: doc["nodes"]["values"].update(extra=1), b"", b""),  # a column key of one
        (lambda doc: None, b"\xa5count\x64", b"\xa5count\xd0\x64"),  # count as a signed int
        (lambda doc: None, b"\xa4data\xc5", b"\xa4data\xda"),  # a column's data as a str
        (lambda doc: doc.pop("nodes"), b"", b""),
    ],
    ids=["nodes-key", "column-key", "signed-count", "str-data", "no-nodes"],
)
def test_what_the_walk_does_not_know_is_left_to_the_general_reader(change: Any, old: bytes, new: bytes) -> None:
    document = msgpack.unpackb(chain(100))
    change(document)
    data = msgpack.packb(document, use_bin_type=True).replace(old, new)
    with pytest.raises(fastload.NotCanonical):
        scan(data)


@pytest.mark.parametrize(
    "change",
    [
        lambda doc: doc["nodes"].update(extra=1),  # a column map with a key a newer minor may add
        lambda doc: doc.update(extra=1),  # a top-level key after metadata
        lambda doc: doc["nodes"]["values"].update(dtype="<f4"),  # a dtype version 1 does not allow
        lambda doc: doc["nodes"].update(count=-1),
    ],
    ids=["column-key", "document-key", "dtype", "negative-count"],
)
def test_documents_the_fast_reader_refuses_read_or_fail_as_the_general_reader_says(change: Any) -> None:
    document = msgpack.unpackb(chain(10))
    change(document)
    data = msgpack.packb(document, use_bin_type=True)
    expected = general_outcome(data)
    try:
        got: bytes | str = fmt.dumps(fmt.loads(data))
    except fmt.FormatError as exc:
        got = str(exc)
    assert got == expected


def test_a_file_that_shrinks_while_being_read_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    path.write_bytes(chain(1_000))
    with open(path, "rb") as file:
        source = fastload.FileSource(file.fileno())
        layout = fastload.scan(source, COLUMNS, "grads", 1 << 20)
        path.write_bytes(b"")
        with pytest.raises(fastload.NotCanonical):
            fastload.read_column(source, layout.columns[0])


def test_skip_object_steps_over_every_kind_of_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastload, "_SKIP_BUDGET", 200_000)  # for the 32-bit map header: 65,536 entries
    value = [
        None,
        True,
        False,
        *(sign * 2**bits for bits in (0, 6, 7, 8, 15, 16, 31, 32, 63) for sign in (1, -1)),
        2**64 - 1,
        0.1,
        "s" * 5,
        "s" * 40,
        "s" * 300,
        "s" * 70_000,
        b"b" * 5,
        b"b" * 300,
        b"b" * 70_000,
        list(range(20)),
        {str(i): i for i in range(20)},
        {str(i): i for i in range(300)},
        [[[[{"deep": [1.5]}]]]],
    ]
    packed = msgpack.packb(value, use_bin_type=True)
    single = msgpack.packb(1.5, use_single_float=True)
    for data in (packed, single, msgpack.packb(list(range(70_000))), msgpack.packb({str(i): 0 for i in range(70_000)})):
        cursor = fastload._Cursor(fastload.BytesSource(data + b"\xc0"))  # one more value after it
        fastload._skip_object(cursor)
        assert cursor.pos == len(data)


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb([0] * (fastload._SKIP_BUDGET + 1)),  # left to msgpack: it is faster at that
        msgpack.packb([msgpack.ExtType(1, b"x")]),
        b"\x92\x01\xc1",
        b"\x92\x01",  # ends early
        b"\xdb\xff\xff\xff\xff",  # a string longer than the bytes
    ],
    ids=["long", "ext", "reserved-byte", "truncated", "long-string"],
)
def test_skip_object_refuses_what_graphsvc_never_writes(data: bytes) -> None:
    with pytest.raises(fastload.NotCanonical):
        fastload._skip_object(fastload._Cursor(fastload.BytesSource(data)))


def test_a_graph_read_from_a_pipe(tmp_path: Path) -> None:
    data = chain(1_000)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,))
    writer.start()
    try:
        assert fmt.dumps(fmt.load(fifo)) == data
    finally:
        writer.join()


# -- the canonical file's short cuts ---------------------------------------------------------------------
V2_FILES = sorted((ROOT / "schemas" / "examples" / "v2").glob("*.msgpack"))


@pytest.mark.parametrize("path", SAMPLE_FILES + V2_FILES, ids=lambda path: path.name)
def test_a_canonical_column_is_matched_whole_not_walked_field_by_field(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = path.read_bytes()
    expected = scan(data)

    def refuse(*args: Any) -> Any:
        raise AssertionError("walked field by field")

    monkeypatch.setattr(fastload, "_scan_column", refuse)
    assert scan(data) == expected
    assert [span.dtype for span in expected.columns] == [fmt.COLUMN_DTYPES[span.key].str for span in expected.columns]


def test_a_column_in_another_encoding_is_walked_field_by_field_to_the_same_place() -> None:
    data = chain(5)
    canonical = scan(data)
    # the same op_codes column with its dtype as a str8 (0xd9), which msgpack reads the same
    index = data.index(b"\xa5dtype\xa3<u2")
    wider = data[:index] + b"\xa5dtype\xd9\x03<u2" + data[index + 10 :]
    widened = scan(wider)
    assert widened.columns[0] == fastload.ColumnSpan("op_codes", "<u2", 5, canonical.columns[0].offset + 1, 10)
    assert [span.offset - 1 for span in widened.columns[1:]] == [span.offset for span in canonical.columns[1:]]


def test_a_file_source_answers_reads_within_its_head_without_reading_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "g.bin"
    path.write_bytes(bytes(range(200)))
    calls: list[tuple[int, int]] = []
    real = os.pread

    def counted(fd: int, count: int, offset: int) -> bytes:
        calls.append((count, offset))
        return real(fd, count, offset)

    with open(path, "rb") as file:
        source = fastload.FileSource(file.fileno(), head=bytes(range(100)))
        monkeypatch.setattr(os, "pread", counted)
        assert source.read(10, 5) == bytes(range(10, 15))
        assert calls == []
        assert source.read(95, 10) == bytes(range(95, 105))  # past the head: from the file
        assert calls == [(10, 95)]
        assert source.size == 200


def test_a_column_within_the_head_is_copied_from_it_into_a_buffer_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "g.bin"
    path.write_bytes(bytes(range(200)))
    with open(path, "rb") as file:
        source = fastload.FileSource(file.fileno(), head=bytes(range(100)))
        monkeypatch.setattr(os, "preadv", None)  # no read of the file
        column = fastload.read_column(source, fastload.ColumnSpan("values", "<f8", 2, 80, 16))
    assert column.tolist() == list(range(80, 96)) and column.dtype == np.uint8
    assert column.flags.owndata and column.flags.writeable and column.ctypes.data % 8 == 0


def test_loading_a_small_tensor_file_reads_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Header, tensor table, columns and data of a file within the first read: one system call."""
    path = tmp_path / "g.msgpack"
    path.write_bytes((ROOT / "schemas" / "examples" / "v2" / "tensor_kinds.msgpack").read_bytes())
    expected = fmt.load(path)
    calls: list[str] = []
    for name in ("pread", "preadv", "read", "readv"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *args, _real=real, _name=name: calls.append(_name) or _real(*args))
    graph = fmt.load(path)
    assert calls == ["pread"]
    assert fmt.dumps(graph) == fmt.dumps(expected)


def test_a_source_stream_reads_a_little_first_then_twice_as_much_each_time() -> None:
    source = fastload.BytesSource(bytes(100_000))
    stream = fastload.SourceStream(source, 10)
    assert [len(stream.read(65_536)) for _ in range(6)] == [4096, 8192, 16_384, 32_768, 38_550, 0]


# -- large payloads: read in two halves at once, the second by a helper thread -------------------------
def _big_tensor_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    array = np.random.default_rng(5).standard_normal((fastload.SPLIT_BYTES + (1 << 20)) // 8)  # float64
    builder = GraphBuilder()
    builder.leaf(array, name="w")
    path = tmp_path / "big.msgpack"
    fmt.save(builder.build(), path)
    return path, array


def _helper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "graphsvc-read"]


@pytest.mark.skipif(not fastload._SECOND_CORE, reason="one CPU: large payloads are read in one piece")
def test_a_large_payload_is_read_in_two_halves_at_once_to_the_same_bits(tmp_path: Path) -> None:
    path, array = _big_tensor_file(tmp_path)
    assert array.nbytes >= fastload.SPLIT_BYTES
    graph = fmt.load(path)
    assert graph.value("w").tobytes() == array.tobytes()  # type: ignore[union-attr]
    assert len(_helper_threads()) == 1
    fmt.load(path)
    assert len(_helper_threads()) == 1  # kept, not one per read


def test_the_helpers_half_failing_is_the_readers_failure(tmp_path: Path) -> None:
    """The file ends inside the helper's half (it shrank since its size was read): the read says
    NotCanonical, as a short read of one piece does, and the helper is free again."""
    path = tmp_path / "short.bin"
    half = fastload.SPLIT_BYTES // 2
    path.write_bytes(bytes(range(256)) * ((half + (1 << 16)) // 256))  # the helper's half starts, then ends
    out = np.empty(fastload.SPLIT_BYTES, dtype=np.uint8)
    with open(path, "rb") as file:
        source = fastload.FileSource(file.fileno(), size=fastload.SPLIT_BYTES)
        for _ in range(2):
            with pytest.raises(fastload.NotCanonical):
                source.read_into(0, out)
        path.write_bytes(bytes(range(256)) * (fastload.SPLIT_BYTES // 256))
        source.read_into(0, out)
    assert out.tobytes() == path.read_bytes()


def test_a_helper_that_cannot_start_reads_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread to be had (a process at its limit): the payload is read in one piece, and the helper
    is not left taken."""
    path, array = _big_tensor_file(tmp_path)
    helper = fastload._Helper()
    monkeypatch.setattr(fastload, "_helper", helper)

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    for _ in range(2):
        assert fmt.load(path).value("w").tobytes() == array.tobytes()  # type: ignore[union-attr]
    assert not helper._busy.locked()


def test_cached_says_whether_a_read_would_wait_for_the_disk(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 8192)  # just written: in the page cache
    with open(path, "rb") as file:
        assert fastload._cached(file.fileno(), 0) is hasattr(os, "RWF_NOWAIT")
        assert fastload._cached(file.fileno(), 8192) is False  # past the end: nothing to read


def test_threads_loading_large_files_at_once_each_get_their_own_bits(tmp_path: Path) -> None:
    path, array = _big_tensor_file(tmp_path)
    results: list[bytes] = []

    def load() -> None:
        for _ in range(3):
            results.append(fmt.load(path).value("w").tobytes())  # type: ignore[union-attr]

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [array.tobytes()] * 12


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_after_a_large_load_reads_large_files_too(tmp_path: Path) -> None:
    """The child of a fork has no helper thread (only the thread that forked): it starts its own."""
    path, array = _big_tensor_file(tmp_path)
    fmt.load(path)  # the parent's helper is running
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when the load gives the bits, within 60 s; never back to pytest
        try:
            import signal

            signal.alarm(60)
            os._exit(0 if fmt.load(path).value("w").tobytes() == array.tobytes() else 1)  # type: ignore[union-attr]
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- the C walk (csrc/table.c's scan) ---------------------------------------------------------------
# fastload.scan first asks the C twin of its walk, over the bytes in memory; the twin says where
# every part is, or None ("look closer": the Python walk, fastload._walk, decides). It must never
# accept what the Python walk refuses, nor find anything else than it finds.
V2_FILES = sorted((ROOT / "schemas" / "examples" / "v2").glob("*.msgpack"))
LIMIT = fmt.DEFAULT_LIMITS.max_string_length


def native_scan(window: bytes, size: int | None = None) -> fastload.Layout | None:
    from tests.conftest import require_native

    require_native("table")
    return fastload._native_scan(window, len(window) if size is None else size, COLUMNS, "grads", LIMIT)


def python_walks(data: bytes) -> list[fastload.Layout | str]:
    """The Python walk's layout of ``data`` (or "not canonical"), with msgpack stepping over the
    values outside nodes (as a load does) and without (its own step, within a budget of items)."""
    found: list[fastload.Layout | str] = []
    for value_end in (codec.value_end, None):
        try:
            found.append(fastload._walk(fastload.BytesSource(data), COLUMNS, "grads", LIMIT, value_end))
        except fastload.NotCanonical:
            found.append("not canonical")
    return found


@pytest.mark.parametrize("path", SAMPLE_FILES + V2_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_c_walk_finds_what_the_python_walk_finds_in_every_shipped_file(path: Path) -> None:
    data = path.read_bytes()
    layout = native_scan(data)
    assert layout is not None and python_walks(data) == [layout, layout]
    assert native_scan(data[:200], len(data)) in (None, layout)  # a window too short: look closer


#: Bytes put at each position of a file's header: every kind of msgpack type byte, and the edges
#: of each fix form.
TYPE_BYTES = (
    0x00, 0x01, 0x05, 0x7F, 0x80, 0x83, 0x8F, 0x90, 0x92, 0x9F, 0xA0, 0xA5, 0xBF, 0xC0, 0xC1, 0xC2, 0xC4,
    0xC5, 0xC6, 0xC7, 0xCA, 0xCB, 0xCC, 0xCF, 0xD0, 0xD3, 0xD4, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0,
    0xFF,
)  # fmt: skip


def hostile_variants(data: bytes, end: int) -> Any:
    """``data`` with each byte before ``end`` replaced by each of :data:`TYPE_BYTES` (and by itself
    plus one), then cut at each length up to ``end``."""
    for position in range(end):
        for byte in {*TYPE_BYTES, (data[position] + 1) % 256}:
            if byte != data[position]:
                yield data[:position] + bytes([byte]) + data[position + 1 :]
    for length in range(end):
        yield data[:length]


@pytest.mark.parametrize("path", [V2_FILES[0], SAMPLE_FILES[0]], ids=lambda p: p.name)
def test_the_c_walk_never_accepts_what_the_python_walk_refuses_nor_finds_else(path: Path) -> None:
    data = path.read_bytes()
    layout = scan(data)
    end = layout.data[0] if layout.data is not None else layout.rest[-1][0] + 8  # every header byte
    accepted = refused = 0
    for variant in hostile_variants(data, end):
        native = native_scan(variant)
        if native is None:
            refused += 1
            continue
        accepted += 1
        assert python_walks(variant) == [native, native], variant
    assert accepted > 100 and refused > 1000  # both outcomes met (a payload's bytes change nothing)


def test_the_c_walk_over_a_window_agrees_with_the_python_walk_reading_past_it() -> None:
    data = chain(3_000, grads=True)  # columns past the first 16 KB
    layout = scan(data)
    for length in (0, 1, 30, 100, 1 << 12, 1 << 14, 1 << 16, len(data) - 1, len(data)):
        assert native_scan(data[:length], len(data)) in (None, layout), length
    assert native_scan(data, len(data)) == layout


def test_a_canonical_file_is_walked_in_c_alone_to_the_same_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import require_native

    require_native("table")
    path = tmp_path / "kinds.msgpack"
    path.write_bytes(V2_FILES[0].read_bytes())
    with monkeypatch.context() as without_c:
        without_c.setattr(fastload, "_ctable", None)
        expected = fmt.dumps(fmt.load(path))

    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python walk ran")

    monkeypatch.setattr(fastload, "_walk", refuse)
    assert fmt.dumps(fmt.load(path)) == fmt.dumps(fmt.loads(path.read_bytes())) == expected


def test_the_c_walk_leaves_deep_and_ext_values_to_the_python_walk() -> None:
    document = msgpack.unpackb(chain(5))
    nested: Any = 1
    for _ in range(20):
        nested = [nested]
    for extra in (nested, msgpack.ExtType(1, b"x")):
        data = msgpack.packb({"extra": extra, **document}, use_bin_type=True)
        assert native_scan(data) is None
    assert native_scan(msgpack.packb({"extra": [[[1]]], **document}, use_bin_type=True)) is not None


def test_a_table_extension_built_from_older_sources_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout whose graphsvc.native._ctable predates csrc/table.c's scan (not rebuilt) loads through
    the Python walk and checks, instead of failing every load with an AttributeError."""
    import sys
    import types

    import graphsvc.native as kernels
    from tests.conftest import require_native

    require_native("table")
    stale = types.ModuleType("graphsvc.native._ctable")
    stale.tensor_views = lambda *args: None  # type: ignore[attr-defined]  # what an older build had
    monkeypatch.setitem(sys.modules, "graphsvc.native._ctable", stale)
    monkeypatch.setattr(kernels, "_ctable", stale, raising=False)
    kernels.extension.cache_clear()
    try:
        assert kernels.compiled_table() is None
        del stale.tensor_views
        stale.scan = lambda *args: None  # type: ignore[attr-defined]
        assert kernels.compiled_table() is stale
    finally:
        monkeypatch.undo()
        kernels.extension.cache_clear()
