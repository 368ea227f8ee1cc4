"""The graphsvc msgpack wire format, version 1: the only module that imports msgpack.

``dumps``/``dump``/``save`` write, ``loads``/``load`` read. The byte-level spec is
``schemas/FORMAT.md``; the JSON Schema of the decoded document is ``schemas/graphsvc-v1.schema.json``.

A file is data, never code: no msgpack ext types, no pickle, nothing is imported or evaluated.
Every size the file declares is checked against the bytes actually present before anything is
allocated, and every structural rule is checked before the graph is returned.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import msgpack
import numpy as np
import numpy.typing as npt

from graphsvc import fastload
from graphsvc.atomic import atomic_writer
from graphsvc.errors import FormatError, GraphFileError, GraphStructureError
from graphsvc.graph import (
    FLOAT_DTYPE,
    INDEX_DTYPE,
    MAX_NODES,
    OFFSET_DTYPE,
    OP_CODE_DTYPE,
    Graph,
    OpSource,
)

FORMAT_NAME = "graphsvc"
#: The version this module writes. A reader refuses a newer major and reads a newer minor.
VERSION = (1, 0)

#: Column name -> the dtype version 1 requires (little-endian, numpy notation).
COLUMN_DTYPES: dict[str, np.dtype[Any]] = {
    "op_codes": OP_CODE_DTYPE,
    "parent_offsets": OFFSET_DTYPE,
    "parent_indices": INDEX_DTYPE,
    "values": FLOAT_DTYPE,
    "grads": FLOAT_DTYPE,
}
#: The columns every file has, in the order files list them; ``grads`` may follow.
_COLUMNS = ("op_codes", "parent_offsets", "parent_indices", "values")
_REQUIRED_KEYS = ("format", "version", "ops", "nodes", "names", "attrs", "outputs", "metadata")


@dataclass(frozen=True)
class Limits:
    """Resource limits applied while reading a file. Each is checked before allocating."""

    max_nodes: int = MAX_NODES
    max_edges: int = MAX_NODES
    max_string_length: int = 1 << 20
    max_attr_depth: int = 32


DEFAULT_LIMITS = Limits()


# -- writing ------------------------------------------------------------------------------------
def _column(array: npt.NDArray[Any], dtype: np.dtype[Any]) -> tuple[dict[str, Any], memoryview]:
    data = np.ascontiguousarray(array, dtype=dtype)
    return {"dtype": dtype.str, "length": len(data)}, data.view(np.uint8).data


def _op_entry(tag: str, source: OpSource | None) -> dict[str, Any]:
    source = source or OpSource()
    return {"tag": tag, "plugin": source.plugin, "version": source.version}


def _encode(graph: Graph) -> Iterator[bytes | memoryview]:
    """Yield the document's bytes in order; column payloads are yielded as views, not copies.

    The output is exactly ``msgpack.packb(document)`` of the document described in the spec,
    written piece by piece so a large graph is never copied into one buffer.
    """
    packer = msgpack.Packer(use_bin_type=True, use_single_float=False, strict_types=False, autoreset=True)
    pack = packer.pack
    yield packer.pack_map_header(len(_REQUIRED_KEYS))
    yield pack("format") + pack(FORMAT_NAME)
    yield pack("version") + pack(list(VERSION))
    yield pack("ops") + pack([_op_entry(tag, graph.op_sources.get(tag)) for tag in graph.op_table])
    columns: list[tuple[str, npt.NDArray[Any]]] = [(key, getattr(graph, key)) for key in _COLUMNS]
    if graph.grads is not None:
        columns.append(("grads", graph.grads))
    yield pack("nodes") + packer.pack_map_header(len(columns) + 1) + pack("count") + pack(graph.num_nodes)
    for key, array in columns:
        header, payload = _column(array, COLUMN_DTYPES[key])
        yield pack(key) + packer.pack_map_header(3)
        yield pack("dtype") + pack(header["dtype"]) + pack("length") + pack(header["length"])
        yield pack("data") + _bin_header(len(payload))
        yield payload
    yield pack("names") + pack([[node, graph.names[node]] for node in sorted(graph.names)])
    yield pack("attrs") + pack([[node, _sorted_map(graph.attrs[node])] for node in sorted(graph.attrs)])
    yield pack("outputs") + pack([int(o) for o in graph.outputs])
    yield pack("metadata") + pack(graph.metadata)


def _bin_header(length: int) -> bytes:
    """The msgpack bin header for ``length`` bytes (what ``packb(bytes)`` writes before them)."""
    if length < 1 << 8:
        return struct.pack(">BB", 0xC4, length)
    if length < 1 << 16:
        return struct.pack(">BH", 0xC5, length)
    if length < 1 << 32:
        return struct.pack(">BI", 0xC6, length)
    raise FormatError(f"a column of {length} bytes is larger than msgpack allows (4 GiB)")


def _sorted_map(attrs: dict[str, Any]) -> dict[str, Any]:
    return {key: attrs[key] for key in sorted(attrs)}


def _check_writable(graph: Graph) -> None:
    """Every structural rule, and what a reader refuses in attributes and metadata (a map key that
    is not a string, nesting deeper than the default limit), so that ``load`` reads what ``save`` writes."""
    graph.check()
    for node in sorted(graph.attrs):
        _check_nesting(graph.attrs[node], DEFAULT_LIMITS.max_attr_depth, f"attributes of node {node}", True)
    _check_nesting(graph.metadata, DEFAULT_LIMITS.max_attr_depth, "metadata", True)
    for tag in graph.op_table:
        _check_string_length(tag, "an op tag")
    if graph.names and max(map(len, graph.names.values())) * 4 > DEFAULT_LIMITS.max_string_length:
        for node in sorted(graph.names):
            _check_string_length(graph.names[node], f"the name of node {node}")


def _check_string_length(text: str, where: str) -> None:
    """No longer, in UTF-8, than the longest string a reader accepts by default."""
    limit = DEFAULT_LIMITS.max_string_length
    if len(text) * 4 > limit:  # a character takes at most 4 bytes: only long strings need encoding
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise FormatError(f"{where} is {size} bytes long, longer than the {limit} bytes a reader accepts")


def dumps(graph: Graph) -> bytes:
    """Encode a graph. The same graph always gives the same bytes."""
    _check_writable(graph)
    try:
        return b"".join(_encode(graph))
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"cannot encode the graph: {exc}") from exc


def dump(graph: Graph, stream: IO[bytes]) -> None:
    """Write a graph to an open binary stream."""
    _check_writable(graph)
    _write(graph, stream)


def _write(graph: Graph, stream: IO[bytes]) -> None:
    try:
        for chunk in _encode(graph):
            stream.write(chunk)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"cannot encode the graph: {exc}") from exc


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write a graph to ``path`` atomically (see :mod:`graphsvc.atomic`): a reader sees the old
    file or the new one, never a part."""
    _check_writable(graph)
    with atomic_writer(path) as stream:
        _write(graph, stream)


# -- reading ------------------------------------------------------------------------------------
class _DuplicateKey(Exception):
    pass


class _NonStringKey(Exception):
    pass


class _ExtType(Exception):
    pass


_NON_STRING_KEY = "a map has a key that is not a string"
_EXT_MESSAGE = "the file contains a msgpack ext type; graphsvc files never do"


def _reject_ext(code: int, data: bytes) -> Any:
    raise _ExtType(code)


def _pairs_to_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    if not all(type(key) is str for key, _ in pairs):  # strict_map_key lets bin keys through
        raise _NonStringKey
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return result


def _decode(data: bytes, limits: Limits) -> Any:
    size = len(data)
    if not size:
        raise FormatError("the file is truncated: it is empty")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_pairs_hook=_pairs_to_dict,
            # Each array item or map entry takes at least one byte (two for a map entry), so a
            # count larger than the file cannot be honest: refusing it avoids a huge allocation.
            max_array_len=size,
            max_map_len=size // 2,
            max_bin_len=size,
            max_str_len=min(size, limits.max_string_length),
            max_ext_len=0,  # refuses every ext type but the empty ones, which reach _reject_ext
            ext_hook=_reject_ext,
        )
    except msgpack.ExtraData as exc:
        raise FormatError(
            f"trailing bytes after the document: {len(exc.extra)} bytes follow the first {size - len(exc.extra)}"
        ) from None
    except _ExtType:
        raise FormatError(_EXT_MESSAGE) from None
    except _NonStringKey:
        raise FormatError(_locate_bad_key_or_string(data, limits) or _NON_STRING_KEY) from None
    except _DuplicateKey as exc:
        located = _locate_bad_key_or_string(data, limits)
        raise FormatError(located or f"a map repeats the key {exc.args[0]!r}") from None
    except UnicodeDecodeError:
        raise FormatError(_locate_bad_key_or_string(data, limits) or "a string is not valid UTF-8") from None
    except msgpack.StackError:
        raise FormatError("not a valid msgpack document: it nests too deeply") from None
    except msgpack.FormatError:  # the one byte msgpack never uses: 0xc1
        raise FormatError("not a valid msgpack document: it holds the reserved byte 0xc1") from None
    except ValueError as exc:
        text = str(exc)
        if "incomplete" in text:
            raise FormatError(f"the file is truncated: {size} bytes end in the middle of the document") from None
        too_long = re.match(r"(\d+) exceeds max_(\w+)_len\((\d+)\)", text)
        if too_long:
            declared, kind, allowed = too_long.groups()
            if kind == "ext":
                raise FormatError(_EXT_MESSAGE) from None
            if kind == "str" and int(allowed) == limits.max_string_length < size:
                raise FormatError(f"a string of {declared} bytes is longer than the limit of {allowed} bytes") from None
            noun = {"str": "a string", "bin": "bin data", "array": "an array", "map": "a map"}.get(kind, kind)
            raise FormatError(
                f"the file is truncated: {noun} declares {declared} "
                f"{'entries' if kind in ('array', 'map') else 'bytes'}, more than the file's {size} bytes can hold"
            ) from None
        if "not allowed for map key" in text:
            raise FormatError(_locate_bad_key_or_string(data, limits) or _NON_STRING_KEY) from None
        raise FormatError(f"not a valid msgpack document: {text}") from None
    except Exception as exc:  # msgpack's own errors: FormatError, StackError, ...
        raise FormatError(f"not a valid msgpack document: {type(exc).__name__}: {exc}") from None


class _Pairs(list[tuple[Any, Any]]):
    """A map decoded as its (key, value) pairs, by :func:`_locate_bad_key_or_string`."""


#: What invalid UTF-8 becomes when decoded with "surrogateescape"; valid UTF-8 never gives these.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def _locate_bad_key_or_string(data: bytes, limits: Limits) -> str | None:
    """Say where the first repeated key, non-string key or invalid UTF-8 is, as a path such as
    ``metadata.notes[2]``; None when it cannot tell.

    Only called after the fast decode failed: the bytes are decoded again permissively (maps as
    their pairs, any key type, invalid UTF-8 kept as lone surrogates) and the document is walked
    in order, without recursion.
    """
    size = len(data)
    try:
        doc = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            unicode_errors="surrogateescape",
            object_pairs_hook=_Pairs,
            max_array_len=size,
            max_map_len=size // 2,
            max_bin_len=size,
            max_str_len=min(size, limits.max_string_length),
            max_ext_len=0,
            ext_hook=_reject_ext,
        )
    except Exception:  # another problem comes first: the caller keeps its plain message
        return None
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _ESCAPED_BYTE.search(value):
                return f"the string at {_path(path)} is not valid UTF-8"
        elif isinstance(value, _Pairs):
            where = f"the map at {_path(path)}" if path else "the document"
            seen: set[str] = set()
            for i, (key, _) in enumerate(value):
                if type(key) is not str:
                    return f"{where} has a key that is not a string ({_describe(key)}, entry {i})"
                if _ESCAPED_BYTE.search(key):
                    return f"{where} has a key that is not valid UTF-8 (entry {i})"
                if key in seen:
                    return f"{where} repeats the key {key!r}"
                seen.add(key)
            stack.extend((item, (*path, key)) for key, item in reversed(value))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))
    return None


def _path(segments: tuple[str | int, ...]) -> str:
    """``("ops", 1, "tag")`` -> ``ops[1].tag``; keys that are not identifiers are quoted."""
    text = ""
    for segment in segments:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif segment.isidentifier():
            text += f".{segment}" if text else segment
        else:
            text += f"[{segment!r}]"
    return text or "the document"


def _expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise FormatError(f"{where} must be {_article(names)}, not {_describe(value)}")
    return value


def _article(names: str) -> str:
    plain = {"int": "an integer", "str": "a string", "list": "an array", "dict": "a map", "bytes": "bin data"}
    return " or ".join(plain.get(n, n) for n in names.split(" or "))


def _describe(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, _Pairs):
        return "a map"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        bytes: "bin data",
        list: "an array",
        dict: "a map",
    }.get(type(value), type(value).__name__)


def _read_column(nodes: dict[str, Any], key: str, expected_length: int | None) -> npt.NDArray[Any]:
    where = f"nodes.{key}"
    column = _expect(nodes.get(key), dict, where)
    dtype_name = _expect(column.get("dtype"), str, f"{where}.dtype")
    expected_dtype = COLUMN_DTYPES[key]
    if dtype_name != expected_dtype.str:
        raise FormatError(f"{where}.dtype is {dtype_name!r}, but version 1 requires {expected_dtype.str!r}")
    length = _expect(column.get("length"), int, f"{where}.length")
    if length < 0:
        raise FormatError(f"{where}.length is negative ({length})")
    if expected_length is not None and length != expected_length:
        raise FormatError(f"{where}.length is {length}, expected {expected_length}")
    data = column.get("data")
    if not isinstance(data, np.ndarray):  # read by fastload: a buffer of its own, else bytes
        data = _expect(data, bytes, f"{where}.data")
    if len(data) != length * expected_dtype.itemsize:
        raise FormatError(
            f"{where}.data holds {len(data)} bytes, but {length} x {expected_dtype.str} needs "
            f"{length * expected_dtype.itemsize}"
        )
    array = np.frombuffer(data, dtype=expected_dtype)
    array.flags.writeable = False  # as a view of bytes is: a loaded graph's columns are read-only
    return array


def _read_version(doc: dict[str, Any]) -> tuple[int, int]:
    version = doc.get("version")
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)
    ):
        raise FormatError(f"version must be an array of two non-negative integers [major, minor], not {version!r}")
    major, minor = version
    if major > VERSION[0]:
        raise FormatError(
            f"the file uses format version {major}.{minor}, newer than this graphsvc reads "
            f"(major version {VERSION[0]}); upgrade graphsvc"
        )
    if major < 1:
        raise FormatError(f"unknown format version {major}.{minor}")
    return major, minor


def _read_ops(doc: dict[str, Any]) -> tuple[list[str], dict[str, OpSource]]:
    ops = _expect(doc["ops"], list, "ops")
    table: list[str] = []
    sources: dict[str, OpSource] = {}
    for i, entry in enumerate(ops):
        entry = _expect(entry, dict, f"ops[{i}]")
        tag = _expect(entry.get("tag"), str, f"ops[{i}].tag")
        if not tag:
            raise FormatError(f"ops[{i}].tag is an empty string")
        plugin = entry.get("plugin")
        version = entry.get("version")
        if plugin is not None:
            _expect(plugin, str, f"ops[{i}].plugin")
        if version is not None:
            _expect(version, str, f"ops[{i}].version")
        if tag in sources:
            raise FormatError(f"ops lists the tag {tag!r} twice")
        table.append(tag)
        sources[tag] = OpSource(plugin, version)
    return table, sources


def _read_sparse(doc: dict[str, Any], key: str, kind: type, n: int) -> dict[int, Any]:
    entries = _expect(doc[key], list, key)
    result: dict[int, Any] = {}
    previous = -1
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, list) or len(entry) != 2:
            raise FormatError(f"{where} must be an array [node id, {'name' if kind is str else 'map'}]")
        node = _expect(entry[0], int, f"{where}[0]")
        if not 0 <= node < n:
            raise FormatError(f"{where} refers to node {node}, which does not exist (the graph has {n} nodes)")
        if node <= previous:
            what = "twice" if node == previous else "out of order (ids must increase)"
            raise FormatError(f"{where}: node {node} is listed {what}")
        previous = node
        result[node] = _expect(entry[1], kind, f"{where}[1]")
    return result


def _check_nesting(value: Any, limit: int, where: str, check_strings: bool = False) -> None:
    """Nested at most ``limit`` levels, every map key a string (a decoded file's always are); with
    ``check_strings`` (when writing), no string longer than a reader accepts."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            raise FormatError(f"{where} nests deeper than {limit} levels")
        if isinstance(item, str):
            if check_strings:
                _check_string_length(item, f"a string in {where}")
        elif isinstance(item, dict):
            for key in item:
                if type(key) is not str:
                    raise FormatError(f"{where} has a map key that is not a string ({_describe(key)} {key!r})")
                if check_strings:
                    _check_string_length(key, f"a map key in {where}")
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, level + 1) for v in item)


def loads(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Decode and validate a graph. Any problem raises :class:`FormatError`, never another error."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("loads() takes bytes")
    data = bytes(data)
    return _read(fastload.BytesSource(data), lambda: data, limits)[0]


def _read(source: fastload.Source, everything: Callable[[], bytes], limits: Limits) -> tuple[Graph, tuple[int, int]]:
    """Read a canonical file the fast way; anything else (or any problem) the general way, which
    gets ``everything`` and words the error."""
    try:
        doc = _decode_canonical(source, limits)
    except (fastload.NotCanonical, FormatError):
        doc = None  # decoded below, once the traceback (and any column read so far) is let go
    if doc is None:
        data = everything()
        doc = _decode(data, limits)
        del data  # the decoded columns hold their own copy; free the file's bytes before validating
    return _validate_versioned(doc, limits)


_TAIL_KEYS = _REQUIRED_KEYS[4:]


def _decode_canonical(source: fastload.Source, limits: Limits) -> dict[str, Any]:
    """The document of a file in graphsvc's own layout, each column read into a buffer of its own.

    The parts around the columns are decoded by msgpack with every check, as maps of their own.
    """
    layout = fastload.scan(source, _COLUMNS, "grads")
    head_start, head_end = layout.head
    head = _decode(b"\x83" + source.read(head_start, head_end - head_start), limits)
    tail_start, tail_end = layout.tail
    tail = _decode(bytes([0x80 | len(_TAIL_KEYS)]) + source.read(tail_start, tail_end - tail_start), limits)
    if tuple(tail) != _TAIL_KEYS:
        raise fastload.NotCanonical
    nodes: dict[str, Any] = {"count": layout.count}
    for span in layout.columns:
        data = fastload.read_column(source, span)
        nodes[span.key] = {"dtype": span.dtype, "length": span.length, "data": data}
    return {**head, "nodes": nodes, **tail}


def _validate_versioned(doc: Any, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    try:
        return _from_document(doc, limits)
    except GraphStructureError as exc:
        raise FormatError(str(exc)) from None
    except FormatError:
        raise
    except (
        ValueError,
        TypeError,
        OverflowError,
        IndexError,
        KeyError,
        MemoryError,
        RecursionError,
    ) as exc:  # pragma: no cover
        # a safety net: the fuzz harness and tests/test_hostile_files.py treat reaching it as a bug
        raise FormatError(f"invalid document: {type(exc).__name__}: {exc}") from None


def _from_document(doc: Any, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    doc = _expect(doc, dict, "the document")
    if doc.get("format") != FORMAT_NAME:
        raise FormatError(f"not a graphsvc file (format is {doc.get('format')!r}, expected {FORMAT_NAME!r})")
    version = _read_version(doc)
    missing = [key for key in _REQUIRED_KEYS if key not in doc]
    if missing:
        raise FormatError(f"the document lacks the key{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    op_table, op_sources = _read_ops(doc)
    nodes = _expect(doc["nodes"], dict, "nodes")
    count = _expect(nodes.get("count"), int, "nodes.count")
    if not 0 <= count <= limits.max_nodes:
        raise FormatError(f"nodes.count is {count}, outside the limit 0..{limits.max_nodes}")
    op_codes = _read_column(nodes, "op_codes", count)
    offsets = _read_column(nodes, "parent_offsets", count + 1)
    parents = _read_column(nodes, "parent_indices", None)
    if len(parents) > limits.max_edges:
        raise FormatError(f"nodes.parent_indices has {len(parents)} entries, over the limit {limits.max_edges}")
    values = _read_column(nodes, "values", count)
    grads = _read_column(nodes, "grads", count) if nodes.get("grads") is not None else None
    names = _read_sparse(doc, "names", str, count)
    attrs = _read_sparse(doc, "attrs", dict, count)
    for node, node_attrs in attrs.items():
        _check_nesting(node_attrs, limits.max_attr_depth, f"attributes of node {node}")
    outputs = [_expect(o, int, f"outputs[{i}]") for i, o in enumerate(_expect(doc["outputs"], list, "outputs"))]
    metadata = _expect(doc["metadata"], dict, "metadata")
    _check_nesting(metadata, limits.max_attr_depth, "metadata")
    graph = Graph(
        op_table=op_table,
        op_codes=op_codes,
        parent_offsets=offsets,
        parent_indices=parents,
        values=values,
        grads=grads,
        names=names,
        attrs=attrs,
        outputs=outputs,
        metadata=metadata,
        op_sources=op_sources,
    )
    graph.check()
    return graph, version


def load(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Read and validate the graph file at ``path``."""
    return load_versioned(path, limits)[0]


def load_versioned(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> tuple[Graph, tuple[int, int]]:
    """Like :func:`load`, and also return the file's format version ``(major, minor)``."""
    try:
        with open(path, "rb", buffering=0) as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # a pipe, say: read it once
                data = file.read()
                return _read(fastload.BytesSource(data), lambda: data, limits)

            def everything() -> bytes:
                file.seek(0)
                return file.read()

            return _read(fastload.FileSource(file.fileno()), everything, limits)
    except FileNotFoundError:
        raise GraphFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GraphFileError(f"{path}: is a folder, not a graph file") from None
    except OSError as exc:
        raise GraphFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None
