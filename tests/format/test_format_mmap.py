"""``load(path, mmap=True)``: a 2.0 file's arrays as read-only views into a mapping of the file,
exactly the arrays ``load`` reads, the same errors for every hostile file, the graph intact after
the file is replaced, and the documented danger (truncating a mapped file) shown in a child process."""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphFileError
from graphsvc.format import jsonio
from graphsvc.graph import Graph, GraphBuilder
from tests.conftest import ROOT
from tests.format.test_format_v2 import BAD_TABLES, V2_DIR, V2_SAMPLES, mutated


def tensor_graph() -> Graph:
    """Every dtype, a 0-d and an empty array, gradient arrays, a scalar node, odd sizes (so the
    payloads need padding to stay 64-aligned)."""
    b = GraphBuilder()
    x = b.leaf(np.arange(15, dtype=np.float32).reshape(3, 5) - 7.5, name="x", grad=np.full((3, 5), -0.25, np.float32))
    w = b.leaf(np.array([1.5, -0.0, np.inf], dtype=np.float64), name="w", grad=np.array([1.0, 2.0, 3.0]))
    s = b.leaf(2.0, name="s", grad=0.5)
    i = b.const(np.array([2, 0, -1], dtype=np.int64), name="i")
    e = b.const(np.zeros((0, 4), dtype=np.float32), name="e")
    z = b.const(np.array(7.25, dtype=np.float64), name="z")
    b.add("mul", [w, s], name="y", value=np.array([3.0, -0.0, np.inf]), grad=np.ones(3))
    del x, i, e, z
    return b.build(outputs=["y"])


def mapped_files() -> set[str]:
    """The files this process has mapped, from /proc/self/maps."""
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            found.add(fields[5])
    return found


def mapping_of(array: np.ndarray) -> str | None:
    """The file whose mapping holds the array's first byte, or None (the heap, anonymous memory)."""
    address = array.ctypes.data
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) == 6 and fields[5].startswith("/") else None
    return None


def outcome(load: Callable[[], Graph]) -> tuple[str, str]:
    """``("graph", canonical bytes)`` or ``(error type, message)``."""
    try:
        return "graph", fmt.dumps(load()).hex()
    except GraphFileError as exc:
        return type(exc).__name__, str(exc)


# -- the arrays ---------------------------------------------------------------------------------
def test_mapped_arrays_are_exactly_the_saved_ones_and_views_of_the_file(tmp_path: Path) -> None:
    graph = tensor_graph()
    path = tmp_path / "g.msgpack"
    fmt.save(graph, path)
    loaded = fmt.load(path, mmap=True)
    assert fmt.dumps(loaded) == fmt.dumps(graph) == path.read_bytes()
    assert sorted(loaded.arrays) == [0, 1, 3, 4, 5, 6] and sorted(loaded.grad_arrays) == [0, 1, 6]
    for mine, theirs in ((loaded.arrays, graph.arrays), (loaded.grad_arrays, graph.grad_arrays)):
        for node, array in mine.items():
            assert (array.dtype, array.shape) == (theirs[node].dtype, theirs[node].shape)
            assert array.tobytes() == theirs[node].tobytes()
    assert loaded.value("w").tolist() == [1.5, -0.0, np.inf]
    assert str(loaded.value("w")[1]) == "-0.0"
    assert loaded.value("s") == 2.0 and loaded.grad("s") == 0.5
    assert loaded.value("z").shape == () and float(loaded.value("z")) == 7.25
    # every non-empty array lies in a mapping of the file; the plain load's in anonymous memory
    for array in [*loaded.arrays.values(), *loaded.grad_arrays.values()]:
        if array.size:
            assert mapping_of(array) == str(path)
    assert mapping_of(fmt.load(path).value("x")) is None


def test_mapped_arrays_are_read_only(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(tensor_graph(), path)
    x = fmt.load(path, mmap=True).value("x")
    assert not x.flags.writeable
    with pytest.raises(ValueError, match="assignment destination is read-only"):
        x[0, 0] = 1.0
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
        x.flags.writeable = True
    assert float(x[0, 0]) == -7.5


def test_the_mapping_lives_as_long_as_an_array_and_no_longer(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(tensor_graph(), path)
    graph = fmt.load(path, mmap=True)
    w = graph.value("w")
    del graph
    gc.collect()
    assert str(path) in mapped_files()
    assert w.tolist() == [1.5, -0.0, np.inf]
    del w
    gc.collect()
    assert str(path) not in mapped_files()


def test_a_replays_result_holds_no_view_of_the_mapping(tmp_path: Path) -> None:
    """A replay shares a graph's arrays when nothing can write into their memory, and a mapping's
    pages are read-only to this process; but the file can be rewritten or truncated by others (the
    danger load() documents), so a result, which a caller keeps after dropping the graph it came
    from, copies them: it neither keeps the file mapped nor changes with it."""
    import graphsvc
    from graphsvc.pluginhost import load_registry

    registry, _ = load_registry(disable_third_party=True)
    path = tmp_path / "g.msgpack"
    fmt.save(tensor_graph(), path)
    graph = fmt.load(path, mmap=True)
    result = graphsvc.forward(graph, registry=registry)
    assert all(mapping_of(a) is None for a in result.arrays.values() if a.size)
    del graph
    gc.collect()
    assert str(path) not in mapped_files()
    assert result.value("w").tolist() == [1.5, -0.0, np.inf]  # type: ignore[union-attr]


def test_the_graph_survives_the_file_being_replaced(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(tensor_graph(), path)
    graph = fmt.load(path, mmap=True)
    expected = fmt.dumps(graph)
    other = GraphBuilder()
    other.leaf(np.full((3, 5), 9.0, np.float32), name="x")
    fmt.save(other.build(), path)  # the atomic save renames a new file over the mapped one
    assert fmt.dumps(graph) == expected
    assert graph.value("x")[0].tolist() == [-7.5, -6.5, -5.5, -4.5, -3.5]
    assert fmt.load(path, mmap=True).value("x")[0].tolist() == [9.0] * 5
    os.replace(fmt_file(tmp_path, other.build()), path)  # and so does a plain rename
    assert fmt.dumps(graph) == expected


def fmt_file(folder: Path, graph: Graph) -> Path:
    path = folder / "other.msgpack"
    path.write_bytes(fmt.dumps(graph))
    return path


def test_truncating_a_mapped_file_kills_the_reader_with_sigbus(tmp_path: Path) -> None:
    # the danger the docstring and FORMAT.md name: a file truncated in place under the mapping
    path = tmp_path / "g.msgpack"
    big = GraphBuilder()
    big.leaf(np.ones(1 << 16, np.float64), name="x")
    fmt.save(big.build(), path)
    script = (
        "import os, sys\n"
        "from graphsvc import format\n"
        "x = format.load(sys.argv[1], mmap=True).value('x')\n"
        "os.truncate(sys.argv[1], 0)\n"
        "print(float(x.sum()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == -signal.SIGBUS
    assert done.stdout == ""


# -- the same outcome as load, whatever the file ------------------------------------------------
@pytest.mark.parametrize(("mutate", "message"), BAD_TABLES, ids=[m for _, m in BAD_TABLES])
def test_each_bad_tensor_table_gives_load_s_exact_error(
    mutate: Callable[[dict[str, Any]], object], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.msgpack"
    path.write_bytes(mutated(mutate))
    with pytest.raises(FormatError) as info:
        fmt.load(path, mmap=True)
    assert str(info.value) == f"{path}: {message}"
    assert outcome(lambda: fmt.load(path)) == ("FormatError", f"{path}: {message}")


@pytest.mark.parametrize("name", ["tensor_worked", "tensor_kinds"])
def test_every_prefix_and_a_trailing_byte_give_load_s_error(name: str, tmp_path: Path) -> None:
    data = (V2_DIR / f"{name}.msgpack").read_bytes()
    path = tmp_path / "cut.msgpack"
    for end in [*range(0, len(data), 7), len(data) - 1]:
        path.write_bytes(data[:end])
        plain = outcome(lambda: fmt.load(path))
        assert plain[0] == "FormatError" and "truncated" in plain[1], end
        assert outcome(lambda: fmt.load(path, mmap=True)) == plain, end
    path.write_bytes(data + b"\xc0")
    expected = f"{path}: trailing bytes after the document: 1 byte follows the first {len(data)}"
    assert outcome(lambda: fmt.load(path, mmap=True)) == outcome(lambda: fmt.load(path)) == ("FormatError", expected)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample=st.sampled_from(V2_SAMPLES), data=st.data())
def test_mutated_files_give_the_same_graph_or_error_mapped_or_not(sample: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, len(sample) - 1))
    replacement = data.draw(st.binary(min_size=1, max_size=4))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.msgpack"
        path.write_bytes(sample[:position] + replacement + sample[position + len(replacement) :])
        assert outcome(lambda: fmt.load(path, mmap=True)) == outcome(lambda: fmt.load(path))


def test_what_cannot_be_mapped_is_read_as_load_reads_it(tmp_path: Path) -> None:
    graph = tensor_graph()
    empty = tmp_path / "empty.msgpack"
    empty.write_bytes(b"")
    assert outcome(lambda: fmt.load(empty, mmap=True)) == (
        "FormatError",
        f"{empty}: the file is truncated: it is empty",
    )
    as_json = tmp_path / "g.json"
    as_json.write_text(jsonio.dumps(graph))
    assert fmt.dumps(fmt.load(as_json, mmap=True)) == fmt.dumps(graph)
    stream = io.BytesIO(fmt.dumps(graph))
    assert fmt.dumps(fmt.load(stream, mmap=True)) == fmt.dumps(graph)
    reordered = tmp_path / "reordered.msgpack"
    document = msgpack.unpackb(fmt.dumps(graph))
    reordered.write_bytes(msgpack.packb(dict(reversed(list(document.items())))))
    loaded = fmt.load(reordered, mmap=True)  # another layout: the general reader, arrays of its own
    assert fmt.dumps(loaded) == fmt.dumps(graph)
    assert mapping_of(loaded.value("x")) is None
    assert str(reordered) not in mapped_files()
    missing = tmp_path / "missing.msgpack"
    assert outcome(lambda: fmt.load(missing, mmap=True)) == ("GraphFileError", f"{missing}: no such file")


def test_a_1_0_file_maps_to_the_same_graph_and_keeps_no_mapping(tmp_path: Path) -> None:
    source = ROOT / "examples" / "seed004.msgpack"
    graph = fmt.load(source, mmap=True)
    assert fmt.dumps(graph) == source.read_bytes()
    assert graph.value("L") == 35.0
    gc.collect()
    assert str(source) not in mapped_files()


# -- the tensor table, stepped over by msgpack ----------------------------------------------------


def test_an_ext_type_in_the_table_is_stepped_over_then_refused_by_the_decoder() -> None:
    document = msgpack.unpackb((V2_DIR / "tensor_worked.msgpack").read_bytes())
    document["tensors"].append(msgpack.ExtType(1, b"x"))
    data = msgpack.packb(document)
    with pytest.raises(FormatError) as info:
        fmt.loads(data)
    assert str(info.value) == "the file contains a msgpack ext type; graphsvc files never do"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda t: (t[1].__setitem__(0, 0), t[2].__setitem__(0, 1)),
            "tensors[1]: the value of node 0 is listed twice",
        ),
        (
            lambda t: (t.insert(1, [1, "value", "I64", [1], 0, 8]), t[3].__setitem__(0, 2)),
            "tensors[1]: node 1 holds a value array, so its entry in the values column must be nan, not 5.0",
        ),
    ],
)
def test_the_first_broken_entry_is_named_whatever_else_follows(
    mutate: Callable[[list[Any]], object], message: str
) -> None:
    b = GraphBuilder()
    b.leaf(np.array([1], dtype=np.int64))
    b.leaf(5.0)
    b.leaf(np.array([2], dtype=np.int64))
    b.leaf(np.array([3], dtype=np.int64))
    document = msgpack.unpackb(fmt.dumps(b.build()))
    mutate(document["tensors"])
    with pytest.raises(FormatError) as info:
        fmt.loads(msgpack.packb(document))
    assert str(info.value) == message
