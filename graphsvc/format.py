"""The graphsvc msgpack wire format, versions 1.0 and 2.0: the only module that imports msgpack.

``dumps``/``dump``/``save`` write, ``loads``/``load`` read. The byte-level spec is
``schemas/FORMAT.md``; the JSON Schemas of the decoded document are ``schemas/graphsvc-v1.schema.json``
and ``schemas/graphsvc-v2.schema.json``. A graph of float64 scalars is written as 1.0; a tensor
graph (:attr:`Graph.is_tensor_graph`) as 2.0: the same document plus a tensor table and one data
section whose payloads are aligned, so that loading views them where they were read, without a copy
(or, with ``load(path, mmap=True)``, where the file is mapped, without reading them at all).

A file is data, never code: no msgpack ext types, no pickle, nothing is imported or evaluated.
Every size the file declares is checked against the bytes actually present before anything is
allocated, and every structural rule is checked before the graph is returned.
"""

from __future__ import annotations

import itertools
import mmap as _mmap
import os
import re
import select
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import msgpack
import numpy as np

from graphsvc import fastload
from graphsvc.errors import FormatError, GraphFileError, GraphStructureError
from graphsvc.graph import (
    FLOAT_DTYPE,
    INDEX_DTYPE,
    MAX_DIMENSIONS,
    MAX_NODES,
    OFFSET_DTYPE,
    OP_CODE_DTYPE,
    Graph,
    OpSource,
)
from graphsvc.text import one_line, shorten

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt

FORMAT_NAME = "graphsvc"
#: The version this module writes for a graph of float64 scalars. A reader refuses a newer major
#: and reads a newer minor.
VERSION = (1, 0)
#: The version this module writes for a tensor graph.
TENSOR_VERSION = (2, 0)
#: The major versions this module reads.
READ_MAJORS = (1, 2)

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
#: Version 2.0's keys, in the order it writes them; ``pad`` is optional (readers ignore it).
KEYS_2 = (*_REQUIRED_KEYS[:4], *fastload.TENSOR_KEYS, *_REQUIRED_KEYS[4:])
_REQUIRED_KEYS_2 = (*_REQUIRED_KEYS, "tensors", "data")

#: A stored array's dtype, by its name in the tensor table (safetensors' names): little-endian.
TENSOR_DTYPES: dict[str, np.dtype[Any]] = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "I64": np.dtype("<i8")}
_DTYPE_NAMES = {(dtype.kind, dtype.itemsize): name for name, dtype in TENSOR_DTYPES.items()}
#: Every payload starts at a multiple of this many bytes, counted from the data section's start,
#: which itself starts at a multiple of it in the file.
ALIGNMENT = 64
#: The largest number of bytes one array may take (what numpy can index).
MAX_ARRAY_BYTES = (1 << 63) - 1
#: A tensor table entry's ``which``: a node's value, or its gradient (in this order).
WHICH = ("value", "grad")
#: The bytes between the tensor table and the data payload other than the padding: the ``pad`` key
#: (4), its bin8 header (2), the ``data`` key (5) and its bin32 header (5).
_PAD_OVERHEAD = 16


@dataclass(frozen=True)
class Limits:
    """Resource limits applied while reading a file. Each is checked before allocating."""

    max_nodes: int = MAX_NODES
    max_edges: int = MAX_NODES
    max_string_length: int = 1 << 20
    max_attr_depth: int = 32
    #: The most bytes read from any file or stream: a regular file is refused by its size, a pipe,
    #: device or stream as soon as it passes the limit (it is read in chunks, never all at once).
    max_file_bytes: int = 16 << 30
    #: The most bytes read from a pipe, a device or a stream, whose size cannot be known first (so
    #: /dev/urandom costs at most this much memory and time before it is refused).
    max_stream_bytes: int = 1 << 30
    #: How long a FIFO is waited for before its first byte; then it is refused as having no writer.
    max_fifo_wait_seconds: float = 5.0


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
    stored = _stored_arrays(graph) if graph.is_tensor_graph else None
    written = 0
    for chunk in _encode_head(graph, packer, stored is not None):
        written += len(chunk)
        yield chunk
    if stored is not None:
        yield from _encode_tensors(stored, packer, written)
    yield pack("names") + pack([[node, graph.names[node]] for node in sorted(graph.names)])
    # an empty map is no attributes: no entry (FORMAT.md §5), so both spellings give one encoding
    yield pack("attrs") + pack(
        [[node, _sorted_map(graph.attrs[node])] for node in sorted(graph.attrs) if graph.attrs[node]]
    )
    yield pack("outputs") + pack([int(o) for o in graph.outputs])
    yield pack("metadata") + pack(graph.metadata)


def _encode_head(graph: Graph, packer: msgpack.Packer, tensors: bool) -> Iterator[bytes | memoryview]:
    """The document's map header, ``format``, ``version``, ``ops`` and ``nodes``."""
    pack = packer.pack
    yield packer.pack_map_header(len(KEYS_2) if tensors else len(_REQUIRED_KEYS))
    yield pack("format") + pack(FORMAT_NAME)
    yield pack("version") + pack(list(TENSOR_VERSION if tensors else VERSION))
    yield pack("ops") + pack([_op_entry(tag, graph.op_sources.get(tag)) for tag in graph.op_table])
    columns: list[tuple[str, npt.NDArray[Any]]] = [(key, getattr(graph, key)) for key in _COLUMNS]
    if graph.grads is not None:
        columns.append(("grads", graph.grads))
    if tensors:  # an array node's column entry is the one quiet nan, whatever nan the graph holds
        columns = [(key, _with_canonical_nan(array, _array_nodes(graph, key))) for key, array in columns]
    yield pack("nodes") + packer.pack_map_header(len(columns) + 1) + pack("count") + pack(graph.num_nodes)
    for key, array in columns:
        header, payload = _column(array, COLUMN_DTYPES[key])
        dtype_key, length_key, data_key = fastload.COLUMN_FIELDS
        yield pack(key) + packer.pack_map_header(len(fastload.COLUMN_FIELDS))
        yield pack(dtype_key) + pack(header["dtype"]) + pack(length_key) + pack(header["length"])
        yield pack(data_key) + _bin_header(len(payload))
        yield payload


#: The nan a canonical 2.0 file holds in the columns where a node holds an array.
CANONICAL_NAN_BITS = 0x7FF8000000000000


def _array_nodes(graph: Graph, key: str) -> list[int]:
    arrays = {"values": graph.arrays, "grads": graph.grad_arrays}.get(key, {})
    return sorted(arrays)


def _with_canonical_nan(column: npt.NDArray[Any], nodes: list[int]) -> npt.NDArray[Any]:
    """``column`` with the canonical nan at ``nodes`` (a copy only when some entry differs)."""
    if not nodes or bool((column[nodes].view(np.uint64) == CANONICAL_NAN_BITS).all()):
        return column
    fixed = np.array(column, dtype=FLOAT_DTYPE)
    fixed.view(np.uint64)[nodes] = CANONICAL_NAN_BITS
    return fixed


@dataclass(frozen=True)
class _Stored:
    """One array as version 2.0 stores it: a tensor table entry and the array it describes."""

    node: int
    which: str
    array: np.ndarray
    offset: int

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES[(self.array.dtype.kind, self.array.dtype.itemsize)]

    def entry(self) -> list[Any]:
        """``[node, which, dtype, shape, offset, nbytes]``."""
        return [self.node, self.which, self.dtype_name, list(self.array.shape), self.offset, self.array.nbytes]


def _stored_arrays(graph: Graph) -> list[_Stored]:
    """The tensor table in its canonical order (by node, a value before its gradient), each payload
    at the first multiple of :data:`ALIGNMENT` after the one before it."""
    stored: list[_Stored] = []
    end = 0
    for node, which in sorted(
        [(node, 0) for node in graph.arrays] + [(node, 1) for node in graph.grad_arrays],
    ):
        array = (graph.arrays if which == 0 else graph.grad_arrays)[node]
        offset = _aligned(end)
        stored.append(_Stored(node, WHICH[which], array, offset))
        end = offset + array.nbytes
    return stored


def _aligned(position: int) -> int:
    return -(-position // ALIGNMENT) * ALIGNMENT


def _data_length(stored: list[_Stored]) -> int:
    """The data section's length: up to the end of the last payload."""
    return stored[-1].offset + stored[-1].array.nbytes if stored else 0


def _encode_tensors(stored: list[_Stored], packer: msgpack.Packer, written: int) -> Iterator[bytes | memoryview]:
    """``tensors``, ``pad`` and ``data``, given that ``written`` bytes come before them. The pad
    makes the data payload start at a multiple of :data:`ALIGNMENT` in the file; each array's bytes
    are yielded as a view (a copy only of an array not already little-endian and C-ordered)."""
    pack = packer.pack
    tensors_key, pad_key, data_key = fastload.TENSOR_KEYS
    table = pack(tensors_key) + pack([item.entry() for item in stored])
    pad = (-(written + len(table) + _PAD_OVERHEAD)) % ALIGNMENT
    yield table + pack(pad_key) + struct.pack(">BB", 0xC4, pad) + bytes(pad)
    yield pack(data_key) + struct.pack(">BI", 0xC6, _data_length(stored))
    end = 0
    for item in stored:
        if item.offset > end:
            yield bytes(item.offset - end)
        payload = _little_endian_bytes(item.array)
        yield payload
        end = item.offset + len(payload)


def _little_endian_bytes(array: np.ndarray) -> memoryview:
    """The array's items, C order, little-endian, as bytes (a view when it already is so)."""
    data = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    return data.reshape(-1).view(np.uint8).data


def _bin_header(length: int) -> bytes:
    """The msgpack bin header for ``length`` bytes (what ``packb(bytes)`` writes before them)."""
    if length < 1 << 8:
        return struct.pack(">BB", 0xC4, length)
    if length < 1 << 16:
        return struct.pack(">BH", 0xC5, length)
    if length < 1 << 32:
        return struct.pack(">BI", 0xC6, length)
    raise FormatError(f"a column of {length} bytes is larger than msgpack allows (4 GiB)")


def _map_header(entries: int) -> bytes:
    """The msgpack map header for ``entries`` entries (what ``packb(dict)`` writes before them)."""
    if entries < 16:
        return bytes([0x80 | entries])
    if entries < 1 << 16:
        return struct.pack(">BH", 0xDE, entries)
    return struct.pack(">BI", 0xDF, entries)


def _sorted_map(attrs: dict[str, Any]) -> dict[str, Any]:
    return {key: attrs[key] for key in sorted(attrs)}


def _check_writable(graph: Graph) -> None:
    """Every structural rule, and what a reader refuses in attributes and metadata (a map key that
    is not a string, nesting deeper than the default limit), so that ``load`` reads what ``save`` writes."""
    graph.check()
    if graph.is_tensor_graph:
        _check_arrays_writable(graph)
    for node in sorted(graph.attrs):
        _check_nesting(graph.attrs[node], DEFAULT_LIMITS.max_attr_depth, f"attributes of node {node}", True)
    _check_nesting(graph.metadata, DEFAULT_LIMITS.max_attr_depth, "metadata", True)
    for tag in graph.op_table:
        _check_string_length(tag, "an op tag")
    if graph.names and max(map(len, graph.names.values())) * 4 > DEFAULT_LIMITS.max_string_length:
        for node in sorted(graph.names):
            _check_string_length(graph.names[node], f"the name of node {node}")


def _check_arrays_writable(graph: Graph) -> None:
    """What version 2.0 requires of a tensor graph beyond :meth:`Graph.check` (which holds a
    gradient to its value's shape and arrays to 32 dimensions): nan in the columns where a node
    holds an array, and a data section a msgpack bin can hold."""
    for what, arrays, column in (("value", graph.arrays, graph.values), ("gradient", graph.grad_arrays, graph.grads)):
        for node in sorted(arrays):
            if column is not None and not np.isnan(column[node]):
                key = "values" if what == "value" else "grads"
                raise FormatError(
                    f"node {node} holds a {what} array, so its entry in the {key} column must be nan, "
                    f"not {float(column[node])!r}"
                )
    size = _data_length(_stored_arrays(graph))
    if size >= 1 << 32:
        raise FormatError(
            f"the graph's arrays take {size:,} bytes with their alignment, more than the 4 GiB a msgpack bin holds "
            "(4,294,967,295 bytes)"
        )


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
    from graphsvc.atomic import atomic_writer  # here, not at the top: reading needs none of hashlib/secrets

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


def _decode(data: fastload.Buffer, limits: Limits) -> Any:
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
    except MemoryError:
        raise  # the caller says how large the file was
    except Exception as exc:  # msgpack's own errors: FormatError, StackError, ...
        raise FormatError(f"not a valid msgpack document: {type(exc).__name__}: {exc}") from None


class _Pairs(list[tuple[Any, Any]]):
    """A map decoded as its (key, value) pairs, by :func:`_locate_bad_key_or_string`."""


#: What invalid UTF-8 becomes when decoded with "surrogateescape"; valid UTF-8 never gives these.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def _locate_bad_key_or_string(data: fastload.Buffer, limits: Limits) -> str | None:
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
    # One iterator per open container and the key that leads into it: memory grows with the depth
    # and the document, never with their product; a path is spelled only once a problem is found.
    path: list[str | int] = []
    open_containers: list[Iterator[tuple[str | int, Any]]] = [iter([("", doc)])]
    while open_containers:
        entry = next(open_containers[-1], None)
        if entry is None:
            open_containers.pop()
            if path:
                path.pop()
            continue
        key, value = entry
        if isinstance(value, str):
            if _ESCAPED_BYTE.search(value):
                return f"the string at {_path(_where(path, key))} is not valid UTF-8"
        elif isinstance(value, _Pairs):
            problem = _bad_key(value)
            if problem is not None:
                where = _where(path, key)
                return f"{f'the map at {_path(where)}' if where else 'the document'} {problem}"
            path.append(key)
            open_containers.append(iter(value))
        elif isinstance(value, list):
            path.append(key)
            open_containers.append(enumerate(value))
    return None


def _where(path: list[str | int], key: str | int) -> tuple[str | int, ...]:
    """The segments from the document to ``key`` (the first of ``path`` leads into the document)."""
    return tuple([*path, key][1:])


def _bad_key(pairs: _Pairs) -> str | None:
    """What is wrong with a map's keys (as the end of a sentence), or None."""
    seen: set[str] = set()
    for i, (key, _) in enumerate(pairs):
        if type(key) is not str:
            return f"has a key that is not a string ({_describe(key)}, entry {i})"
        if _ESCAPED_BYTE.search(key):
            return f"has a key that is not valid UTF-8 (entry {i})"
        if key in seen:
            return f"repeats the key {key!r}"
        seen.add(key)
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
    if major > READ_MAJORS[-1]:
        raise FormatError(
            f"the file uses format version {major}.{minor}, newer than this graphsvc reads "
            f"(major versions {' and '.join(map(str, READ_MAJORS))}); upgrade graphsvc"
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
        elif type(item) is int and not -(1 << 63) <= item < 1 << 64:
            digits = str(item) if abs(item) < 10**30 else f"an integer of {len(str(abs(item)))} digits"
            raise FormatError(f"{where} holds {digits}, outside the integers msgpack stores (-2**63 to 2**64 - 1)")


def loads(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Decode and validate a graph. Any problem raises :class:`FormatError`, never another error."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("loads() takes bytes")
    data = bytes(data)
    try:
        return _read_msgpack(data, limits)[0]
    except MemoryError:
        raise FormatError(_no_memory(len(data))) from None


def _no_memory(size: int) -> str:
    return f"not enough memory to load a graph of {size:,} bytes"


def _read_msgpack(data: bytes | bytearray, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    return _read(fastload.BytesSource(data), lambda: data, limits)


def _read(
    source: fastload.Source, everything: Callable[[], fastload.Buffer], limits: Limits
) -> tuple[Graph, tuple[int, int]]:
    """Read the columns straight into arrays when :func:`fastload.scan` finds them; anything else
    (or any problem) the general way, which gets ``everything`` and words the error."""
    try:
        doc = _decode_fast(source, limits)
    except (fastload.NotCanonical, FormatError):
        doc = None  # decoded below, once the traceback (and any column read so far) is let go
    if doc is None:
        data = everything()
        doc = _decode(data, limits)
        del data  # the decoded columns hold their own copy; free the file's bytes before validating
    return _validate_versioned(doc, limits)


def _decode_fast(source: fastload.Source, limits: Limits) -> dict[str, Any]:
    """The document, each column read into a buffer of its own (the file's bytes are copied once).

    Everything outside ``nodes`` is decoded by msgpack with every check, as one map of its own.
    """
    layout = fastload.scan(source, _COLUMNS, "grads", limits.max_string_length, _value_end)
    rest = _decode(
        _map_header(layout.rest_entries) + b"".join(source.read(start, end - start) for start, end in layout.rest),
        limits,
    )
    if not isinstance(rest, dict) or not rest.keys().isdisjoint(("nodes", "pad", "data")):
        raise fastload.NotCanonical  # a key twice: the general reader words it
    nodes: dict[str, Any] = {"count": layout.count}
    for span in layout.columns:
        data = fastload.read_column(source, span)
        nodes[span.key] = {"dtype": span.dtype, "length": span.length, "data": data}
    if layout.data is not None:
        rest["data"] = fastload.read_data(source, *layout.data)
    return {**rest, "nodes": nodes}


#: The most bytes :func:`_value_end` buffers: a longer tensor table is read the general way.
_SKIP_BUFFER = 64 << 20


def _value_end(source: fastload.Source, offset: int) -> int:
    """Where the msgpack value at ``offset`` ends, found by msgpack (in C, reading the source in
    windows); anything it cannot step over, it leaves to the general reader."""
    unpacker = msgpack.Unpacker(
        fastload.SourceStream(source, offset), read_size=1 << 16, max_buffer_size=_SKIP_BUFFER, raw=True
    )
    try:
        unpacker.skip()
    except Exception:  # truncated, too long, the reserved byte...: not canonical
        raise fastload.NotCanonical from None
    end = offset + unpacker.tell()
    if end > source.size:
        raise fastload.NotCanonical
    return end


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
    missing = [key for key in (_REQUIRED_KEYS if version[0] == 1 else _REQUIRED_KEYS_2) if key not in doc]
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
    attrs = {node: node_attrs for node, node_attrs in _read_sparse(doc, "attrs", dict, count).items() if node_attrs}
    for node, node_attrs in attrs.items():
        _check_nesting(node_attrs, limits.max_attr_depth, f"attributes of node {node}")
    outputs = [_expect(o, int, f"outputs[{i}]") for i, o in enumerate(_expect(doc["outputs"], list, "outputs"))]
    metadata = _expect(doc["metadata"], dict, "metadata")
    _check_nesting(metadata, limits.max_attr_depth, "metadata")
    arrays: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})
    if version[0] >= 2:
        arrays = _read_tensors(doc, count, values, grads)
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
        arrays=arrays[0],
        grad_arrays=arrays[1],
    )
    graph.check()
    return graph, version


def _read_tensors(
    doc: dict[str, Any], count: int, values: npt.NDArray[Any], grads: npt.NDArray[Any] | None
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Version 2.0's arrays: every entry of the tensor table checked against the data section
    (which the file holds already, so nothing is allocated until all pass), then each array a
    read-only view into it."""
    data = doc["data"]
    if not isinstance(data, np.ndarray):  # read by fastload: the payload's own buffer, else bytes
        data = _expect(data, bytes, "data")
    size = len(data)
    entries = _expect(doc["tensors"], list, "tensors")
    checked = [_read_tensor_entry(entry, i, count, size) for i, entry in enumerate(entries)]
    not_nan = _first_not_nan(checked, values, grads)
    previous: tuple[int, int] = (-1, 1)
    for i, (node, which, _, shape, _, _) in enumerate(checked):
        if (node, which) <= previous:
            what = "twice" if (node, which) == previous else "out of order (entries are sorted by node, a value first)"
            raise FormatError(f"tensors[{i}]: the {WHICH[which]} of node {node} is listed {what}")
        previous = (node, which)
        if i == not_nan:
            column, key = (values, "values") if which == 0 else (grads, "grads")
            assert column is not None
            raise FormatError(
                f"tensors[{i}]: node {node} holds a {'value' if which == 0 else 'gradient'} array, so its entry in "
                f"the {key} column must be nan, not {float(column[node])!r}"
            )
        if which == 1 and i and checked[i - 1][:2] == (node, 0) and checked[i - 1][3] != shape:
            raise FormatError(
                f"tensors[{i}]: node {node}'s gradient has shape {_shape_text(shape)}, "
                f"but its value has shape {_shape_text(checked[i - 1][3])}"
            )
    spans = sorted((offset, offset + nbytes, i) for i, (*_, offset, nbytes) in enumerate(checked) if nbytes)
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            one, two = sorted((first, second))
            raise FormatError(f"tensors[{one}] and tensors[{two}] overlap in the data section (at byte {start})")
    # Views of a read-only buffer are read-only: no flag to set per array.
    buffer = np.frombuffer(data, dtype=np.uint8)
    buffer.flags.writeable = False
    arrays: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})
    for node, which, dtype, shape, offset, _ in checked:
        array = np.ndarray(shape, dtype, buffer, offset)
        if not dtype.isnative:  # a big-endian machine: the one case that copies
            array = array.astype(dtype.newbyteorder("="))
            array.flags.writeable = False
        arrays[which][node] = array
    return arrays


def _first_not_nan(
    checked: list[tuple[int, int, np.dtype[Any], tuple[int, ...], int, int]],
    values: npt.NDArray[Any],
    grads: npt.NDArray[Any] | None,
) -> int | None:
    """The index of the first entry whose node's column entry is not nan (rule 8), or None: one
    vectorized look at the columns instead of one per entry."""
    if not checked:
        return None
    nodes = np.fromiter((entry[0] for entry in checked), dtype=np.int64, count=len(checked))
    is_grad = np.fromiter((entry[1] for entry in checked), dtype=bool, count=len(checked))
    entries = values[nodes]
    if grads is not None:
        entries = np.where(is_grad, grads[nodes], entries)
    else:
        entries = np.where(is_grad, np.nan, entries)
    bad = ~np.isnan(entries)
    return int(bad.argmax()) if bad.any() else None


def _read_tensor_entry(
    entry: Any, i: int, count: int, size: int
) -> tuple[int, int, np.dtype[Any], tuple[int, ...], int, int]:
    """One tensor table entry (``tensors[i]``), checked on its own: ``(node, which, dtype, shape,
    offset, nbytes)``. The checks of a well-formed entry are inlined (a table has thousands)."""
    where = f"tensors[{i}]"
    if type(entry) is not list or len(entry) != 6:
        raise FormatError(f"{where} must be an array [node, which, dtype, shape, offset, nbytes]")
    node, which_name, dtype_name, raw_shape, offset, nbytes = entry
    if type(node) is not int:
        _expect(node, int, f"{where}[0]")
    if not 0 <= node < count:
        raise FormatError(f"{where} refers to node {node}, which does not exist (the graph has {count} nodes)")
    if which_name == "value":
        which = 0
    elif which_name == "grad":
        which = 1
    else:
        raise FormatError(f'{where}[1] must be "value" or "grad", not {_shown(which_name)}')
    dtype = TENSOR_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise FormatError(f'{where}[2] must be a dtype "F64", "F32" or "I64", not {_shown(dtype_name)}')
    if type(raw_shape) is not list:
        _expect(raw_shape, list, f"{where}[3]")
    if len(raw_shape) > MAX_DIMENSIONS:
        raise FormatError(f"{where}: the shape has {len(raw_shape)} dimensions, more than {MAX_DIMENSIONS}")
    items = 1
    for k, dimension in enumerate(raw_shape):
        if type(dimension) is not int or dimension < 0:
            raise FormatError(f"{where}[3][{k}] must be a non-negative integer (a dimension), not {_shown(dimension)}")
        items *= dimension or 1  # as numpy counts: an empty array may not have a huge other dimension either
    shape = tuple(raw_shape)
    if items * dtype.itemsize > MAX_ARRAY_BYTES:
        raise FormatError(f"{where}: the shape {_shape_text(shape)} is too large (more than 2**63 - 1 bytes)")
    needed = dtype.itemsize * (0 if 0 in shape else items)
    if needed > size:
        raise FormatError(
            f"{where}: an {dtype_name} array of shape {_shape_text(shape)} takes {needed:,} bytes, "
            f"more than the data section's {size:,}"
        )
    if type(offset) is not int:
        _expect(offset, int, f"{where}[4]")
    if type(nbytes) is not int:
        _expect(nbytes, int, f"{where}[5]")
    if nbytes != needed:
        raise FormatError(
            f"{where}: nbytes is {nbytes}, but an {dtype_name} array of shape {_shape_text(shape)} takes {needed}"
        )
    if offset < 0:
        raise FormatError(f"{where}: the offset {offset} is negative")
    if offset % ALIGNMENT:
        raise FormatError(f"{where}: the offset {offset} is not a multiple of {ALIGNMENT}")
    if offset + nbytes > size:
        raise FormatError(
            f"{where}: bytes {offset:,} to {offset + nbytes:,} lie outside the data section's {size:,} bytes"
        )
    return node, which, dtype, shape, offset, nbytes


def _shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return shorten(f"[{', '.join(map(str, shape))}]", 80)


def _shown(value: Any) -> str:
    """A value from the file, in a message: a string's repr (escaped, shortened), else its kind."""
    if isinstance(value, str):
        return shorten(repr(value), 40)
    if type(value) is int:
        return shorten(str(value), 40)
    return _describe(value)


#: A graph source: a path, or an open binary stream (``sys.stdin.buffer``) read to its end.
GraphSource = str | os.PathLike[str] | BinaryIO
#: How many bytes one read from a pipe, a device or a stream asks for.
_CHUNK = 1 << 20
#: How many bytes are read first to tell msgpack from JSON (more only after leading whitespace).
_HEAD = 1 << 12
_MAP_HEADERS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
_BOM = b"\xef\xbb\xbf"
_NOT_JSON_SPACE = re.compile(rb"[^ \t\n\r]")


def load(source: GraphSource, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = False) -> Graph:
    """Read and validate the graph at ``source``: a path, or a binary stream read to its end.

    The file may be a msgpack graph file or its JSON form (:mod:`graphsvc.jsonio`), told apart by
    content: msgpack starts with a map, JSON with ``{``. Raises :class:`GraphFileError` when the
    file cannot be read, :class:`FormatError` (a subclass) when it is not a valid graph; every
    message starts with the file's name.

    ``mmap=True`` maps a msgpack file at a path instead of reading it: a version 2.0 file in the
    canonical layout (FORMAT.md §15.3) then gives arrays that are read-only views into the mapping,
    so loading costs neither the read nor the memory of the arrays until their pages are touched.
    Every check is the same, made before any view exists; the same file gives the same graph or
    the same error as without ``mmap``. A stream, a pipe, the JSON form, an empty file and a file
    in another layout are read as without it (the arrays then own their memory).

    The mapping lives as long as any array viewing it. Replacing the file (``save`` renames a new
    file over it) leaves the arrays as they were; **writing into the file or truncating it while
    it is mapped is not safe**: written bytes show through the arrays (which bypasses every check)
    and reading a page a truncation removed kills the process with ``SIGBUS``. Use it on files no
    one rewrites in place, which is what :func:`save` guarantees for its own files.
    """
    return load_versioned(source, limits, mmap=mmap)[0]


def load_versioned(
    source: GraphSource, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = False
) -> tuple[Graph, tuple[int, int]]:
    """Like :func:`load`, and also return the version the file declares ``(major, minor)``: the
    msgpack format's, or for the JSON form the JSON document's."""
    if isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        read: Callable[[], tuple[Graph, tuple[int, int]]] = lambda: _load_path(label, limits, mmap)  # noqa: E731
    else:
        label = _stream_label(source)
        read = lambda: _load_stream(source.read, limits)  # noqa: E731
    try:
        return read()
    except GraphFileError as exc:  # FormatError is one
        raise type(exc)(one_line(f"{label}: {exc}")) from None


def _stream_label(stream: BinaryIO) -> str:
    name = getattr(stream, "name", None)
    if name in ("<stdin>", 0):
        return "standard input"
    return name if isinstance(name, str) else "the stream"


def _load_path(path: str, limits: Limits, mapped: bool = False) -> tuple[Graph, tuple[int, int]]:
    try:
        # Non-blocking, so that opening a FIFO with no writer returns (and can be waited for).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise GraphFileError("no such file") from None
    except IsADirectoryError:
        raise GraphFileError("is a folder, not a graph file") from None
    except OSError as exc:
        raise GraphFileError(f"cannot read: {exc.strerror or exc}") from None
    try:
        with open(fd, "rb", buffering=0) as file:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise GraphFileError("is a folder, not a graph file")
            if stat.S_ISREG(mode):
                return _load_regular(file, limits, mapped)
            if stat.S_ISFIFO(mode):
                _wait_for_data(fd, limits.max_fifo_wait_seconds)
            os.set_blocking(fd, True)
            return _load_stream(file.read, limits)
    except IsADirectoryError:
        raise GraphFileError("is a folder, not a graph file") from None
    except OSError as exc:
        raise GraphFileError(f"cannot read: {exc.strerror or exc}") from None


def _wait_for_data(fd: int, seconds: float) -> None:
    """Wait up to ``seconds`` for a FIFO's first byte (or its writer closing it)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(max(int(seconds * 1000), 0)):
        raise FormatError(f"a FIFO with nothing writing to it (no data within {seconds:g} seconds)")


def _too_large(limit: int, field: str = "max_file_bytes") -> str:
    return f"it holds more than {limit:,} bytes, the limit (Limits.{field})"


def _load_regular(file: IO[bytes], limits: Limits, mapped: bool = False) -> tuple[Graph, tuple[int, int]]:
    fd = file.fileno()
    size = os.fstat(fd).st_size
    if size > limits.max_file_bytes:
        raise FormatError(_too_large(limits.max_file_bytes))

    def everything() -> bytearray:
        """The whole file, in one buffer of its size (read in chunks; a file that grew is cut)."""
        data = bytearray(size)
        view = memoryview(data)
        done = 0
        while done < size:
            got = os.preadv(fd, [view[done : done + _CHUNK]], done)
            if got <= 0:  # the file got shorter since its size was read
                break
            done += got
        view.release()
        del data[done:]
        return data

    try:
        head = os.pread(fd, min(size, _HEAD), 0)
        checked = len(head)
        try:
            kind = _kind(head, at_end=checked == size)
        except FormatError:  # neither form: the msgpack reader says what is wrong, as loads() does
            kind = "msgpack"
        if kind == "msgpack":
            mapping = _map(fd) if mapped and size else None
            if mapping is not None:
                return _read(fastload.BytesSource(mapping), lambda: mapping, limits)
            return _read(fastload.FileSource(fd), everything, limits)
        data = everything()
        if kind is None:  # only whitespace in the first chunk
            try:
                _kind(data, at_end=True, checked=checked)
            except FormatError:
                return _read_msgpack(data, limits)
        return _read_json(data, limits)
    except MemoryError:
        raise FormatError(_no_memory(size)) from None


def _map(fd: int) -> _mmap.mmap | None:
    """The whole file, mapped read-only (its length when mapped: a file that changed size since it
    was measured is mapped as it is now); None when it cannot be mapped (it is then read)."""
    try:
        return _mmap.mmap(fd, 0, access=_mmap.ACCESS_READ)
    except (OSError, ValueError):  # a file that became empty, a filesystem that cannot map
        return None


def _load_stream(read: Callable[[int], bytes], limits: Limits) -> tuple[Graph, tuple[int, int]]:
    """Read a pipe, a device or a stream to its end in chunks, refusing it as soon as it passes
    ``max_stream_bytes`` (or ``max_file_bytes``, when smaller) or its first bytes show it is neither
    form."""
    data = bytearray()
    kind: str | None = None
    field = "max_stream_bytes" if limits.max_stream_bytes < limits.max_file_bytes else "max_file_bytes"
    limit = getattr(limits, field)
    try:
        while True:
            # a small first read: most refusals need only the first bytes
            chunk = read(min(_CHUNK, max(len(data), 1 << 12), limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                raise FormatError(_too_large(limit, field))
            if kind is None:
                kind = _kind(data, at_end=False, checked=len(data) - len(chunk))
        if _kind(data, at_end=True) == "msgpack":
            return _read_msgpack(data, limits)
        return _read_json(data, limits)
    except MemoryError:
        raise FormatError(_no_memory(len(data))) from None


def _kind(head: bytes | bytearray, at_end: bool, checked: int = 0) -> str | None:
    """ "msgpack" or "json" from a file's first bytes (None: more are needed); FormatError when it is
    neither. A msgpack graph starts with a map header; JSON with ``{`` after an optional UTF-8 BOM
    and whitespace: ``{`` (0x7b) is a msgpack positive fixint, never a graph document.
    ``head[:checked]`` is known to be a BOM and whitespace (so a long run is scanned once)."""
    if not head:
        if at_end:
            raise FormatError("the file is truncated: it is empty")
        return None
    if head[0] in _MAP_HEADERS:
        return "msgpack"
    if not at_end and len(head) < len(_BOM) and _BOM.startswith(head):
        return None
    start = max(checked, len(_BOM) if head.startswith(_BOM) else 0)
    found = _NOT_JSON_SPACE.search(head, start)
    if found is None:
        if not at_end:
            return None
        raise FormatError("not a graphsvc file: it holds only whitespace")
    if head[found.start()] == ord("{"):
        return "json"
    raise FormatError(f"not a graphsvc file: it starts with {bytes(head[:8])!r}, not a msgpack map or a JSON object")


def _read_json(data: bytes | bytearray, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    from graphsvc import jsonio

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FormatError(f"the JSON text is not valid UTF-8 (at byte {exc.start})") from None
    graph, version = jsonio.loads_versioned(text)
    del text
    if graph.num_nodes > limits.max_nodes:
        raise FormatError(f"the graph has {graph.num_nodes} nodes, over the limit {limits.max_nodes}")
    if len(graph.parent_indices) > limits.max_edges:
        raise FormatError(f"the graph has {len(graph.parent_indices)} edges, over the limit {limits.max_edges}")
    for node in sorted(graph.attrs):
        _check_nesting(graph.attrs[node], limits.max_attr_depth, f"attributes of node {node}")
    _check_nesting(graph.metadata, limits.max_attr_depth, "metadata")
    return graph, version
