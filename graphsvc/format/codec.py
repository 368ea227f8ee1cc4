"""Bytes <-> documents: the only modules that import msgpack are this one and :mod:`graphsvc.format.diagnose`.

:func:`encode` writes a graph's document in the canonical layout of :mod:`graphsvc.format.layout`, piece by
piece (column and array payloads as views, never copied into one buffer). :func:`decode` reads any
valid msgpack document with every safety check (no ext types, string keys only, no key twice, no
declared size larger than the file); :func:`decode_fast` reads a file in the canonical layout with
the columns and the data section straight into buffers of their own (:mod:`graphsvc.format.fastload`),
and everything else through :func:`decode`. What a document means is :mod:`graphsvc.format.document`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack

from graphsvc.errors import FormatError
from graphsvc.format import diagnose, document, fastload
from graphsvc.format.layout import (
    ALIGNMENT,
    ATTRS_KEY,
    COLUMN_DATA_KEY,
    COLUMN_DTYPE_KEY,
    COLUMN_DTYPES,
    COLUMN_FIELDS,
    COLUMN_LENGTH_KEY,
    COLUMNS,
    COUNT,
    DATA_KEY,
    FORMAT_KEY,
    FORMAT_NAME,
    KEYS,
    KEYS_2,
    METADATA_KEY,
    NAMES_KEY,
    NODES_KEY,
    OPS_KEY,
    OPTIONAL_COLUMN,
    OUTPUTS_KEY,
    PAD_KEY,
    TENSOR_VERSION,
    TENSORS_KEY,
    VERSION,
    VERSION_KEY,
    Limits,
    bin_header,
    key,
    map_header,
    pad_and_data_header,
)
from graphsvc.graph import Graph
from graphsvc.text import counted


# -- writing ------------------------------------------------------------------------------------------
def encode(graph: Graph, stored: list[document.Stored] | None = None) -> Iterator[bytes | memoryview]:
    """Yield the document's bytes in order; column and array payloads are yielded as views.

    The output is exactly ``msgpack.packb(document)`` of the document described in the spec,
    written piece by piece so a large graph is never copied into one buffer. ``stored``: the
    graph's :func:`document.stored_arrays`, when the caller has them already.
    """
    packer = msgpack.Packer(use_bin_type=True, use_single_float=False, strict_types=False, autoreset=True)
    pack = packer.pack
    if stored is None and graph.is_tensor_graph:
        stored = document.stored_arrays(graph)
    written = 0
    for chunk in _encode_head(graph, pack, stored is not None):
        written += len(chunk)
        yield chunk
    if stored is not None:
        yield from _encode_tensors(stored, pack, written)
    yield key(NAMES_KEY) + pack(document.names_entries(graph))
    yield key(ATTRS_KEY) + pack(document.attrs_entries(graph))
    yield key(OUTPUTS_KEY) + pack([int(o) for o in graph.outputs])
    yield key(METADATA_KEY) + pack(graph.metadata)


def _encode_head(graph: Graph, pack: Any, tensors: bool) -> Iterator[bytes | memoryview]:
    """The document's map header, ``format``, ``version``, ``ops`` and ``nodes``."""
    yield map_header(len(KEYS_2) if tensors else len(KEYS))
    yield key(FORMAT_KEY) + pack(FORMAT_NAME)
    yield key(VERSION_KEY) + pack(list(TENSOR_VERSION if tensors else VERSION))
    yield key(OPS_KEY) + pack(document.op_entries(graph))
    columns = document.columns(graph)
    yield key(NODES_KEY) + map_header(len(columns) + 1) + key(COUNT) + pack(graph.num_nodes)
    for name, array in columns:
        payload = array.view("u1").data
        yield (
            key(name)
            + map_header(len(COLUMN_FIELDS))
            + key(COLUMN_DTYPE_KEY)
            + pack(COLUMN_DTYPES[name].str)
            + key(COLUMN_LENGTH_KEY)
            + pack(len(array))
            + key(COLUMN_DATA_KEY)
            + _bin_header(len(payload))
        )
        yield payload


def _encode_tensors(stored: list[document.Stored], pack: Any, written: int) -> Iterator[bytes | memoryview]:
    """``tensors``, ``pad`` and ``data``, given that ``written`` bytes come before them. Each array's
    bytes are yielded as a view (a copy only of an array not already little-endian and C-ordered)."""
    table = key(TENSORS_KEY) + pack([item.entry() for item in stored])
    yield table + pad_and_data_header(written + len(table), document.data_length(stored))
    end = 0
    padding = bytes(ALIGNMENT)  # every gap is shorter than the alignment: one zero buffer serves them all
    for item in stored:
        if item.offset > end:
            yield padding[: item.offset - end]
        payload = document.little_endian_bytes(item.array)
        yield payload
        end = item.offset + len(payload)


def _bin_header(length: int) -> bytes:
    if length >= 1 << 32:
        raise FormatError(f"a column of {counted(length, 'byte')} is larger than msgpack allows (4 GiB)")
    return bin_header(length)


# -- reading ------------------------------------------------------------------------------------------
def _pairs_to_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A map's entries as a dict, refusing a key that is not a string and a key given twice. Called
    once per map (a node's attributes: a million times for a million nodes), so a map of one entry,
    the usual one, is made without the general checks (a million one-entry maps: 3.1 s -> 0.84 s,
    msgpack's decode without a hook 0.64 s)."""
    if len(pairs) == 1:
        key, value = pairs[0]
        if type(key) is not str:
            raise diagnose.NonStringKey
        return {key: value}
    result = dict(pairs)  # strict_map_key: every key is a str or bytes, so hashable
    for key in result:
        if type(key) is not str:  # strict_map_key lets bin keys through
            raise diagnose.NonStringKey
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise diagnose.DuplicateKey(key)
            seen.add(key)
    return result


def decode(data: fastload.Buffer, limits: Limits) -> Any:
    """The document ``data`` holds, decoded with every safety check; FormatError saying what is wrong."""
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
            **diagnose.bounds(size, limits),
        )
    except MemoryError:
        raise  # the caller says how large the file was
    except Exception as exc:
        raise diagnose.decode_error(exc, data, limits) from None


def check_head(head: fastload.Buffer, size: int, limits: Limits, size_known: bool = True) -> None:
    """Raise the FormatError that :func:`decode` of the whole file (``size`` bytes) would raise, when
    its first bytes ``head`` already show it: what msgpack refuses within them (the same check,
    the same hooks and bounds: decoding is one pass from the start) or a first value that ends
    before the file does. Nothing when the first bytes are a valid start of a document: the
    whole file decides. So a huge file whose first byte rules it out is refused without being read.

    ``size_known=False`` (a stream still being read): ``size`` is only the most it may hold, so
    a count larger than that, or a map that ends early, is left for the whole stream to word."""
    if not size:
        return
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=True,
        object_pairs_hook=_pairs_to_dict,
        max_buffer_size=max(len(head), 1),
        **diagnose.bounds(size, limits),
    )
    unpacker.feed(head)
    try:
        document = unpacker.unpack()
    except msgpack.OutOfData:
        return
    except MemoryError:
        return
    except Exception as exc:
        if not size_known and isinstance(exc, ValueError) and "exceeds max_" in str(exc):
            return
        raise diagnose.decode_error(exc, head, limits, size) from None
    end = unpacker.tell()
    if end < size and (size_known or not isinstance(document, dict)):
        raise diagnose.extra_data_error(document, head, size, end)


def decode_fast(source: fastload.Source, limits: Limits) -> dict[str, Any]:
    """The document, each column read into a buffer of its own (the file's bytes are copied once).

    Everything outside ``nodes`` is decoded by :func:`decode` with every check, as one map of its
    own. Raises :class:`fastload.NotCanonical` (or FormatError) for the general reader to take over.
    """
    layout = fastload.scan(source, COLUMNS, OPTIONAL_COLUMN, limits.max_string_length, value_end)
    rest = decode(
        map_header(layout.rest_entries) + b"".join(source.read(start, end - start) for start, end in layout.rest),
        limits,
    )
    if not isinstance(rest, dict) or not rest.keys().isdisjoint((NODES_KEY, PAD_KEY, DATA_KEY)):
        raise fastload.NotCanonical  # a key twice: the general reader words it
    nodes: dict[str, Any] = {COUNT: layout.node_count}
    for span in layout.columns:
        payload = fastload.read_column(source, span)
        nodes[span.key] = dict(zip(COLUMN_FIELDS, (span.dtype, span.length, payload), strict=True))
    if layout.data is not None:
        rest[DATA_KEY] = fastload.read_data(source, *layout.data)
    return {**rest, NODES_KEY: nodes}


#: The most bytes :func:`value_end` buffers: a longer tensor table is read the general way.
_SKIP_BUFFER = 64 << 20


def value_end(source: fastload.Source, offset: int) -> int:
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
