"""Reading is bounded: pipes, devices and streams are read in chunks up to Limits.max_file_bytes, a
FIFO with no writer is waited for a bounded time, the JSON form is recognised by content, the
error-locating pass and non-canonical files take memory linear in the file, and running out of
memory (or range) is a FormatError."""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphFileError
from graphsvc.format import codec, fastload, jsonio
from graphsvc.format import document as doc_module
from graphsvc.graph import Graph
from tests.conftest import ROOT

GRADS = ROOT / "schemas" / "examples" / "grads.msgpack"


def refusal(source: Any, limits: fmt.Limits = fmt.DEFAULT_LIMITS) -> tuple[str, float, int]:
    """The error text, the seconds and the peak bytes traced while loading ``source``."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(GraphFileError) as info:
            fmt.load(source, limits)
        return str(info.value), time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- the JSON form, recognised by content --------------------------------------------------------
def test_the_json_form_loads_from_a_path_a_stream_and_with_a_bom(tmp_path: Path) -> None:
    graph = fmt.load(GRADS)
    text = jsonio.dumps(graph)
    path = tmp_path / "graph.msgpack"  # the extension does not matter
    path.write_text(text, encoding="utf-8")
    loaded, version = fmt.load_versioned(path)
    assert (fmt.dumps(loaded), version) == (GRADS.read_bytes(), (1, 0))
    with_bom = io.BytesIO(b"\xef\xbb\xbf \r\n\t" + text.encode())
    assert fmt.dumps(fmt.load(with_bom)) == GRADS.read_bytes()
    newer = json.dumps({**json.loads(text), "version": [1, 7]}).encode()
    assert fmt.load_versioned(io.BytesIO(newer))[1] == (1, 7)
    assert fmt.dumps(fmt.load(io.BytesIO(GRADS.read_bytes()))) == GRADS.read_bytes()


def test_json_pieces_arriving_one_byte_at_a_time_are_recognised() -> None:
    data = b"\xef\xbb\xbf\n" + jsonio.dumps(fmt.load(GRADS)).encode()
    stream = iter(data[i : i + 1] for i in range(len(data)))

    class Trickle(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            return next(stream, b"")

    assert fmt.load(Trickle()).num_nodes == 7  # type: ignore[arg-type]


JSON_HEAD = b'{"format": "graphsvc-json", "version": [1, 0], "nodes": '
BAD_JSON: list[tuple[str, bytes, str]] = [
    (
        "integer too large for a float64",
        JSON_HEAD + b'[{"op": "leaf", "value": 1' + b"0" * 400 + b"}]}",
        "F: node 0: value is an integer too large for a float64 (401 digits)",
    ),
    (
        "float literal out of range",
        JSON_HEAD + b'[{"op": "leaf", "value": -1e400}]}',
        'F: the number -1e400 is too large for a float64 (write "inf" or "-inf" for an infinity)',
    ),
    (
        "integer of more digits than Python reads",
        JSON_HEAD + b'[{"op": "leaf", "value": 1' + b"0" * 5000 + b"}]}",
        "F: not valid JSON: Exceeds the limit (4300 digits) for integer string conversion: value has 5001 digits",
    ),
    (
        "more op tags than op codes",
        JSON_HEAD + b"[" + b",".join(b'{"op": "t%d"}' % i for i in range(65_537)) + b"]}",
        "F: the graph uses more than 65,536 op tags, the most the format holds",
    ),
    ("invalid UTF-8", b'{"a": "\xff"}', "F: the JSON text is not valid UTF-8 (at byte 7)"),
    (
        "broken JSON",
        b"{\n",
        "F: not valid JSON: Expecting property name enclosed in double quotes: line 2 column 1 (char 2)",
    ),
    ("empty", b"", "F: the file is truncated: it is empty"),
    (
        "a control character from the file",
        JSON_HEAD + b'[{"op": "leaf", "parents": ["\\u001b[31m"]}]}',
        "F: node 0: no node is named '\\x1b[31m'",
    ),
    (
        "attributes deeper than the limit",
        JSON_HEAD + b'[{"op": "leaf", "attrs": {"k": ' + b"[" * 33 + b"]" * 33 + b"}}]}",
        "F: the attribute map of node 0 nests deeper than 32 levels",
    ),
]


NEITHER: list[tuple[str, bytes, str, str]] = [
    (
        "only whitespace",
        b" \n\t ",
        "not a graphsvc file: it holds only whitespace",
        "not a graphsvc file: it starts with b' \\n\\t ', not a msgpack map",
    ),
    (
        "an array",
        b"[1, 2]",
        "not a graphsvc file: it starts with b'[1, 2]', not a msgpack map or a JSON object",
        "not a graphsvc file: it starts with b'[1, 2]', not a msgpack map",
    ),
    (
        "a text file",
        b"hello world\n",
        "not a graphsvc file: it starts with b'hello wo', not a msgpack map or a JSON object",
        "not a graphsvc file: it starts with b'hello wo', not a msgpack map",
    ),
    (
        "the reserved byte",
        b"\xc1",
        "not a graphsvc file: it starts with b'\\xc1', not a msgpack map or a JSON object",
        "not a valid msgpack document: it holds the reserved byte 0xc1",
    ),
]


@pytest.mark.parametrize(("data", "from_stream", "from_file"), [c[1:] for c in NEITHER], ids=[c[0] for c in NEITHER])
def test_bytes_of_neither_form(tmp_path: Path, data: bytes, from_stream: str, from_file: str) -> None:
    """A stream is refused at its first bytes (it may never end); a regular file, whose size is
    known, gets the msgpack reader's words, as loads() gives them."""
    with pytest.raises(FormatError) as stream:
        fmt.load(io.BytesIO(data))
    assert str(stream.value) == f"the stream: {from_stream}"
    path = tmp_path / "f"
    path.write_bytes(data)
    with pytest.raises(FormatError) as file:
        fmt.load(path)
    assert str(file.value) == f"{path}: {from_file}" == f"{path}: {message_of_loads(data)}"


def message_of_loads(data: bytes) -> str:
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    return str(info.value)


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in BAD_JSON], ids=[c[0] for c in BAD_JSON])
def test_bad_json_files_are_one_line_format_errors_naming_the_file(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "F"
    path.write_bytes(data)
    for source in (str(path), io.BytesIO(data)):
        with pytest.raises(FormatError) as info:
            fmt.load(source)
        shown = expected if isinstance(source, str) else expected.replace("F: ", "the stream: ", 1)
        assert str(info.value) == shown.replace("F: ", f"{path}: ", 1)
        assert "\n" not in str(info.value) and "\x1b" not in str(info.value)


def test_json_limits_of_nodes_and_edges() -> None:
    data = jsonio.dumps(fmt.load(GRADS)).encode()
    with pytest.raises(FormatError) as nodes:
        fmt.load(io.BytesIO(data), fmt.Limits(max_nodes=6))
    assert str(nodes.value) == "the stream: the graph has 7 nodes, over the limit 6"
    with pytest.raises(FormatError) as edges:
        fmt.load(io.BytesIO(data), fmt.Limits(max_edges=5))
    assert str(edges.value) == "the stream: the graph has 8 edges, over the limit 5"


# -- bounded reading of what is not a regular file ---------------------------------------------------
SMALL = fmt.Limits(max_file_bytes=1 << 20)


def test_dev_zero_is_refused_at_its_first_bytes() -> None:
    text, seconds, peak = refusal("/dev/zero", fmt.DEFAULT_LIMITS)
    assert text == f"/dev/zero: not a graphsvc file: it starts with {bytes(8)!r}, not a msgpack map or a JSON object"
    assert seconds < 2
    assert peak < 4 * (1 << 20)


def test_dev_urandom_is_refused_in_bounded_time_and_memory_with_one_line() -> None:
    """What /dev/urandom gives differs run to run (a first byte 0x80-0x8f begins a msgpack map, and
    the error is then about what follows), so the exact texts are checked on seeded bytes below."""
    text, seconds, peak = refusal("/dev/urandom", SMALL)
    assert text.startswith("/dev/urandom: ") and text.isprintable()
    assert seconds < 2
    assert peak < 4 * (1 << 20)


def test_random_bytes_that_are_not_a_map_are_refused_at_their_first_bytes() -> None:
    data = random.Random(1).randbytes(1 << 12).replace(b"\x7b", b"\x00")  # no "{"
    data = b"\x01" + data
    with pytest.raises(FormatError) as info:
        fmt.load(io.BytesIO(data), SMALL)
    assert str(info.value) == (
        f"the stream: not a graphsvc file: it starts with {data[:8]!r}, not a msgpack map or a JSON object"
    )


@pytest.mark.parametrize("seed", range(200))
def test_random_bytes_that_begin_a_map_are_one_line_format_errors(seed: int) -> None:
    generator = random.Random(seed)
    data = bytes([0x80 | generator.randrange(16)]) + generator.randbytes(1 << 12)
    with pytest.raises(FormatError) as info:
        fmt.load(io.BytesIO(data), SMALL)
    assert str(info.value).startswith("the stream: ") and str(info.value).isprintable()


def test_an_endless_stream_that_begins_like_a_graph_is_read_only_up_to_the_stream_limit() -> None:
    """A stream that starts like a graph (a map whose value is bin data of 4 GiB) and never ends
    is read up to Limits.max_stream_bytes, not up to the much larger limit for regular files."""
    assert (fmt.DEFAULT_LIMITS.max_stream_bytes, fmt.DEFAULT_LIMITS.max_file_bytes) == (1 << 30, 16 << 30)
    endless = io.BufferedReader(_Endless(b"\x81\xa4data\xc6\xff\xff\xff\xff"))
    tracemalloc.start()
    with pytest.raises(fmt.FormatError) as refused:
        fmt.load(endless, fmt.Limits(max_stream_bytes=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert str(refused.value) == "the stream: it holds more than 1,048,576 bytes, the limit (Limits.max_stream_bytes)"
    assert peak < 4 * (1 << 20)


class _Endless(io.RawIOBase):
    """A stream of ``head`` and then bytes without end."""

    def __init__(self, head: bytes) -> None:
        self.head = head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data, self.head = (self.head or b"\x01" * len(view))[: len(view)], b""
        view[: len(data)] = data
        return len(data)


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


def test_a_fifo_fed_forever_is_refused_at_the_limit(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)

    def feed() -> None:
        try:
            with open(fifo, "wb") as writer:
                writer.write(b"\x81\xa4data\xc6\xff\xff\xff\xff")  # a map of 4 GiB of bin data: only the limit stops it
                while True:
                    writer.write(bytes(1 << 16))
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        text, seconds, peak = refusal(fifo, SMALL)
    finally:
        thread.join()
    assert text == f"{fifo}: it holds more than 1,048,576 bytes, the limit (Limits.max_file_bytes)"
    assert seconds < 2 and peak < 4 * (1 << 20)


def test_a_fifo_with_nothing_writing_to_it_is_refused_after_the_wait(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    text, seconds, _ = refusal(fifo, fmt.Limits(max_fifo_wait_seconds=0.3))
    assert text == f"{fifo}: a FIFO with nothing writing to it (no data within 0.3 seconds)"
    assert 0.25 < seconds < 2


def test_a_fifo_whose_writer_comes_late_is_read(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    data = GRADS.read_bytes()
    thread = threading.Timer(0.2, fifo.write_bytes, args=(data,))
    thread.start()
    try:
        assert fmt.dumps(fmt.load(fifo)) == data
    finally:
        thread.join()


def test_a_stream_past_the_limit_and_a_regular_file_past_it(tmp_path: Path) -> None:
    data = GRADS.read_bytes()
    limits = fmt.Limits(max_file_bytes=len(data) - 1)
    with pytest.raises(FormatError) as stream:
        fmt.load(io.BytesIO(data), limits)
    assert (
        str(stream.value)
        == f"the stream: it holds more than {len(data) - 1:,} bytes, the limit (Limits.max_file_bytes)"
    )
    with pytest.raises(FormatError) as regular:
        fmt.load(GRADS, limits)
    assert (
        str(regular.value) == f"{GRADS}: it holds more than {len(data) - 1:,} bytes, the limit (Limits.max_file_bytes)"
    )
    assert fmt.load(GRADS, fmt.Limits(max_file_bytes=len(data))).num_nodes == 7


def test_standard_input_is_named_so() -> None:
    class Stdin(io.BytesIO):
        name = "<stdin>"

    with pytest.raises(FormatError) as info:
        fmt.load(Stdin(b""))  # type: ignore[arg-type]
    assert str(info.value) == "standard input: the file is truncated: it is empty"


# -- memory linear in the file -----------------------------------------------------------------------
def test_locating_a_bad_string_after_deep_nesting_takes_memory_linear_in_the_file() -> None:
    """~1 MB: 1,000 nested arrays around 100,000 items, a 900 KB blob, then invalid UTF-8. Walking it
    with a path per item took ~800 MB; now the path is held once."""
    items = 100_000
    deep = b"\x91" * 1000 + b"\xdd" + items.to_bytes(4, "big") + b"\x01" * items
    data = b"\x83\xa1x" + deep + b"\xa4blob\xc6" + (900_000).to_bytes(4, "big") + bytes(900_000) + b"\xa1y\xa1\xff"
    assert 1_000_000 < len(data) < 1_100_000
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as info:
            fmt.loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == "the string at y is not valid UTF-8"
    assert peak < 50_000_000, peak


def _big_graph(nodes: int) -> Graph:
    rng = np.random.default_rng(7)
    return Graph(
        op_table=["leaf", "neg"],
        op_codes=np.r_[0, np.ones(nodes - 1)].astype(np.uint16),
        parent_offsets=np.r_[0, 0, np.arange(1, nodes)].astype(np.int64),
        parent_indices=np.arange(nodes - 1, dtype=np.int32),
        values=rng.random(nodes),
        grads=rng.random(nodes),
        names={0: "x"},
        attrs={},
        outputs=[nodes - 1],
        metadata={"by": "test"},
    )


def test_a_large_non_canonical_file_is_copied_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~50 MB with its keys in reverse order (as another tool may write them): the columns are read
    from the file straight into their arrays, as for a canonical file. Reading it peaked at twice
    its size before (the whole file, then msgpack's copy of every column); now once."""
    canonical = fmt.dumps(_big_graph(1_500_000))
    document = msgpack.unpackb(canonical)
    document["nodes"] = dict(reversed(document["nodes"].items()))
    data = msgpack.packb(dict(reversed(document.items())), use_bin_type=True)
    del document
    path = tmp_path / "other.msgpack"
    path.write_bytes(data)
    assert len(data) > 45_000_000 and data != canonical
    del data
    read: list[Any] = []
    monkeypatch.setattr(doc_module, "validate", lambda doc, limits: read.append(doc) or (None, (1, 0)))
    tracemalloc.start()
    try:
        fmt.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(read[0]["nodes"]["values"]["data"], np.ndarray)
    assert peak < 1.1 * path.stat().st_size, peak
    monkeypatch.undo()
    assert fmt.dumps(fmt.load(path)) == canonical


# -- out of memory ------------------------------------------------------------------------------------
def _no_memory(*args: Any, **kwargs: Any) -> Any:
    raise MemoryError


@pytest.mark.parametrize(
    ("target", "name"),
    [(fastload, "read_column"), (codec, "decode"), (jsonio, "from_document")],
    ids=["fast-reader", "general-reader", "json"],
)
def test_running_out_of_memory_is_a_format_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any, name: str
) -> None:
    data = GRADS.read_bytes()
    if target is jsonio:
        data = jsonio.dumps(fmt.load(GRADS)).encode()
        monkeypatch.setattr(jsonio, "read_columns", lambda data: None)  # the long way, whose steps take memory
    path = tmp_path / "g"
    path.write_bytes(data)
    monkeypatch.setattr(target, name, _no_memory)
    with pytest.raises(FormatError) as info:
        fmt.load(path)
    expected = {
        "jsonio": f"{path}: not enough memory to build the graph of {len(data):,} characters of JSON",
    }.get(target.__name__.split(".")[-1], f"{path}: not enough memory to load a graph of {len(data):,} bytes")
    assert str(info.value) == expected
    with pytest.raises(FormatError) as stream:
        fmt.load(io.BytesIO(data))
    assert str(stream.value) == expected.replace(str(path), "the stream")


def test_json_integers_msgpack_cannot_store_are_refused_when_read(tmp_path: Path) -> None:
    document = {
        "format": "graphsvc-json",
        "version": [1, 0],
        "nodes": [{"op": "leaf", "attrs": {"k": [1, 2**64]}}],
        "metadata": {"big": -(2**63) - 1},
    }
    path = tmp_path / "big.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(FormatError) as refused:
        fmt.load(path)
    assert str(refused.value) == (
        f"{path}: the attribute map of node 0 holds 18446744073709551616, outside the integers msgpack stores"
        " (-2**63 to 2**64 - 1)"
    )
    document["nodes"] = [{"op": "leaf", "attrs": {"k": [1, 2**64 - 1, -(2**63)]}}]
    document["metadata"] = {"big": 10**400}
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(FormatError) as refused:
        fmt.load(path)
    assert str(refused.value) == (
        f"{path}: metadata holds an integer of 401 digits, outside the integers msgpack stores (-2**63 to 2**64 - 1)"
    )


# -- a file whose first bytes rule it out is refused from them, however large -------------------------
#: 3 GB: sparse files of this size cost no disk; reading one whole took 6.3 GB of memory and 11-35 s.
HUGE = 3 << 30

#: First bytes that rule a file out, and the error every reader gives (the same as for the whole file).
RULED_OUT = [
    (b"\x00", "not a graphsvc file: it starts with b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00', not a msgpack map"),
    (b"\x01", "not a graphsvc file: it starts with b'\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00', not a msgpack map"),
    (b"\x81\x00", "a map has a key that is not a string"),
    (b"\x81\xa6format\xc1", "not a valid msgpack document: it holds the reserved byte 0xc1"),
    (b"\x81\xa6format", f"trailing bytes after the document: {HUGE - 9} bytes follow the first 9"),
    (
        b"\x81\xa6format\xdd\xff\xff\xff\xff",
        f"the file is truncated: an array declares 4294967295 entries, more than the file's {HUGE} bytes can hold",
    ),
    (b"{", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (
        b' \n{"format": 1,',
        "not valid JSON: Expecting property name enclosed in double quotes: line 2 column 14 (char 15)",
    ),
    (b'{"a": "\xff"}', "the JSON text is not valid UTF-8 (at byte 7)"),
]


def _huge(tmp_path: Path, head: bytes) -> Path:
    path = tmp_path / "huge.msgpack"
    path.write_bytes(head)
    os.truncate(path, HUGE)  # zeros after the head, none of them on disk
    return path


class _Counted:
    """Counts the bytes the reader asks the operating system for (pread, preadv, read), whatever the path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        for name in ("pread", "preadv", "read", "readv"):
            monkeypatch.setattr(os, name, self._counting(getattr(os, name)))

    def _counting(self, real: Any) -> Any:
        def counted(*args: Any) -> Any:
            got = real(*args)
            self.bytes += got if isinstance(got, int) else len(got)
            return got

        return counted


@pytest.mark.parametrize(("head", "message"), RULED_OUT)
def test_a_huge_file_whose_first_bytes_rule_it_out_is_refused_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: bytes, message: str
) -> None:
    path = _huge(tmp_path, head)
    counted = _Counted(monkeypatch)
    text, seconds, peak = refusal(path)
    assert text == f"{path}: {message}"
    assert counted.bytes <= 1 << 17  # the first 64 KiB (twice at most), not 3 GB
    assert peak < 4 << 20 and seconds < 5


@pytest.mark.parametrize(("head", "message"), RULED_OUT[:4] + RULED_OUT[6:])
def test_a_stream_whose_first_bytes_rule_it_out_is_refused_from_them(head: bytes, message: str) -> None:
    """Standard input: its size is not known, so what needs it (trailing bytes, a count larger than
    the file) is left for the end; everything else is refused after the first 64 KiB or so."""
    stream = io.BufferedReader(_Endless(head + bytes(1 << 17)), buffer_size=1 << 16)
    source = _CountingStream(stream)
    with pytest.raises(FormatError) as refused:
        fmt.load(source)  # type: ignore[arg-type]
    if message.startswith("not a graphsvc file"):  # refused at the first byte, before the kind is known
        message += " or a JSON object"
    assert str(refused.value) == f"the stream: {message}"
    assert source.bytes <= 1 << 18


class _CountingStream:
    def __init__(self, stream: io.BufferedReader) -> None:
        self.stream, self.bytes = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.bytes += len(data)
        return data


def test_the_same_file_gives_the_same_error_read_whole_mapped_or_as_bytes(tmp_path: Path) -> None:
    """The first bytes decide for every way in, so a file gives one error however it is read."""
    head = b"\x82\xa6format\xa8graphsvc\x81" + bytes(1 << 17)  # larger than the first read: cut to 64 KiB
    path = tmp_path / "g.msgpack"
    path.write_bytes(head)
    expected = "a map has a key that is not a string"
    for load in (lambda: fmt.load(path), lambda: fmt.load(path, mmap=True), lambda: fmt.loads(head)):
        with pytest.raises(FormatError) as refused:
            load()
        assert str(refused.value).removeprefix(f"{path}: ") == expected


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ('{"a": [1, 2, 3], "b": tru' + " " * 100, "not valid JSON: Expecting value: line 1 column 23 (char 22)"),
        ('{"a": [1, 2, 3], "b": tru', None),  # cut off at the end: "true" may follow
        ('{"a": "' + "x" * 200, None),  # a string the rest may close
        ('{"a": 1e', None),
        ('{"a": "\\u12', None),
        ('{"a": 1, "a": 2}' + " " * 100, None),  # a key twice: the whole text words it
        (
            "[" * 100 + "]" * 99 + "}" + " " * 100,
            "not valid JSON: Expecting ',' delimiter: line 1 column 200 (char 199)",
        ),
    ],
)
def test_json_first_bytes_decide_only_an_error_well_before_their_end(text: str, refused: str | None) -> None:
    if refused is None:
        jsonio.check_head(text)
    else:
        with pytest.raises(FormatError) as caught:
            jsonio.check_head(text)
        assert str(caught.value) == refused


def test_a_json_file_valid_in_its_first_bytes_is_read_whole(tmp_path: Path) -> None:
    """First bytes that start a valid document decide nothing: a JSON graph of more than 64 KiB loads."""
    from tests.conftest import seed004_graph

    graph = seed004_graph(names=("a" * 40_000, "b" * 40_000, "c", "ab", "abc", "apb", "L"))
    path = tmp_path / "g.json"
    path.write_text(jsonio.dumps(graph), encoding="utf-8")
    assert path.stat().st_size > 1 << 16
    assert fmt.dumps(fmt.load(path)) == fmt.dumps(graph)


def test_load_regular_refuses_anything_but_a_regular_file_at_once(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    started = time.perf_counter()
    with pytest.raises(GraphFileError) as refused:
        fmt.load_regular(fifo)
    assert (str(refused.value), time.perf_counter() - started < 2) == (f"{fifo}: not a regular file", True)
    with pytest.raises(GraphFileError) as refused:
        fmt.load_regular(os.devnull)
    assert str(refused.value) == f"{os.devnull}: not a regular file"
    assert fmt.dumps(fmt.load_regular(GRADS)) == GRADS.read_bytes()
