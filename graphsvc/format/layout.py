"""The one description of a graphsvc file's layout: the writer (:mod:`graphsvc.format.codec`) emits it, the
fast reader (:mod:`graphsvc.format.fastload`) walks it, the document checks (:mod:`graphsvc.format.document`)
hold a decoded file to it. Nothing here reads or writes a file.

The layout is ``schemas/FORMAT.md``: the top-level keys in order (§1, §15.1), the ``nodes`` map and
its columns (§4), version 2.0's tensor table and aligned data section (§15), and the canonical
encoding (§8): the smallest msgpack header of every kind, except version 2.0's ``pad`` (always bin8)
and ``data`` (always bin32, so that the pad can be worked out before the data's size is written).
The msgpack type bytes are named here once, as :class:`Family` tables; no other module spells one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from graphsvc.graph import FLOAT_DTYPE, INDEX_DTYPE, MAX_NODES, OFFSET_DTYPE, OP_CODE_DTYPE

FORMAT_NAME = "graphsvc"
#: The version written for a graph of float64 scalars. A reader refuses a newer major and reads a
#: newer minor.
VERSION = (1, 0)
#: The version written for a tensor graph.
TENSOR_VERSION = (2, 0)
#: The major versions graphsvc reads.
READ_MAJORS = (1, 2)

# -- the document ---------------------------------------------------------------------------------
#: The document's keys (§1), each named once; the tuples below give their order.
FORMAT_KEY, VERSION_KEY, OPS_KEY, NODES_KEY = "format", "version", "ops", "nodes"
NAMES_KEY, ATTRS_KEY, OUTPUTS_KEY, METADATA_KEY = "names", "attrs", "outputs", "metadata"
#: Version 2.0's keys (§15.1): the tensor table, the padding before the data section, the data section.
TENSORS_KEY, PAD_KEY, DATA_KEY = "tensors", "pad", "data"
#: Version 1.0's keys, in the order it writes them; every one is required.
KEYS = (FORMAT_KEY, VERSION_KEY, OPS_KEY, NODES_KEY, NAMES_KEY, ATTRS_KEY, OUTPUTS_KEY, METADATA_KEY)
#: The keys version 2.0 writes right after ``nodes``, in this order; ``pad`` is optional (readers
#: ignore it).
TENSOR_KEYS = (TENSORS_KEY, PAD_KEY, DATA_KEY)
_AFTER_NODES = KEYS.index(NODES_KEY) + 1
#: Version 2.0's keys, in the order it writes them: 1.0's, with the tensor keys right after ``nodes``.
KEYS_2 = (*KEYS[:_AFTER_NODES], *TENSOR_KEYS, *KEYS[_AFTER_NODES:])
#: The keys version 2.0 requires.
REQUIRED_KEYS_2 = (*KEYS, TENSORS_KEY, DATA_KEY)
#: An op table entry's keys (§3): its tag, the plugin that provides it and that plugin's version.
OP_TAG_KEY, OP_PLUGIN_KEY, OP_VERSION_KEY = "tag", "plugin", "version"
#: An op table entry's keys, in order.
OP_FIELDS = (OP_TAG_KEY, OP_PLUGIN_KEY, OP_VERSION_KEY)

# -- nodes: the count, then the columns -----------------------------------------------------------
#: ``nodes``' first key: the number of nodes (a uint).
COUNT = "count"
#: The columns' names (§4), each named once.
OP_CODES_COLUMN, PARENT_OFFSETS_COLUMN, PARENT_INDICES_COLUMN = "op_codes", "parent_offsets", "parent_indices"
VALUES_COLUMN, GRADS_COLUMN = "values", "grads"
#: The columns every file has, in the order files list them, after ``count``.
COLUMNS = (OP_CODES_COLUMN, PARENT_OFFSETS_COLUMN, PARENT_INDICES_COLUMN, VALUES_COLUMN)
#: The column that may follow them (or be nil).
OPTIONAL_COLUMN = GRADS_COLUMN
#: Column name -> the dtype version 1 requires (little-endian, numpy notation).
COLUMN_DTYPES: dict[str, np.dtype[Any]] = {
    OP_CODES_COLUMN: OP_CODE_DTYPE,
    PARENT_OFFSETS_COLUMN: OFFSET_DTYPE,
    PARENT_INDICES_COLUMN: INDEX_DTYPE,
    VALUES_COLUMN: FLOAT_DTYPE,
    GRADS_COLUMN: FLOAT_DTYPE,
}
#: A column map's keys (§4): the dtype's name (str), the item count (uint), the payload (bin).
COLUMN_DTYPE_KEY, COLUMN_LENGTH_KEY, COLUMN_DATA_KEY = "dtype", "length", "data"
#: A column map's keys, in order.
COLUMN_FIELDS = (COLUMN_DTYPE_KEY, COLUMN_LENGTH_KEY, COLUMN_DATA_KEY)

# -- version 2.0's arrays -------------------------------------------------------------------------
#: A stored array's dtype, by its name in the tensor table (safetensors' names): little-endian.
TENSOR_DTYPES: dict[str, np.dtype[Any]] = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "I64": np.dtype("<i8")}
#: ``(dtype.kind, dtype.itemsize)`` -> the dtype's name in the tensor table.
DTYPE_NAMES = {(dtype.kind, dtype.itemsize): name for name, dtype in TENSOR_DTYPES.items()}
#: A tensor table entry's ``which`` (§15.2): a node's value, or its gradient.
WHICH_VALUE, WHICH_GRAD = "value", "grad"
#: The ``which`` names by their code: 0 for a value, 1 for a gradient.
WHICH = (WHICH_VALUE, WHICH_GRAD)
#: Every payload starts at a multiple of this many bytes, counted from the data section's start,
#: which itself starts at a multiple of it in the file.
ALIGNMENT = 64
#: The largest number of bytes one array may take (what numpy can index).
MAX_ARRAY_BYTES = (1 << 63) - 1
#: The nan a canonical 2.0 file holds in the columns where a node holds an array.
CANONICAL_NAN_BITS = 0x7FF8000000000000


def aligned(position: int) -> int:
    """The first multiple of :data:`ALIGNMENT` at or after ``position``."""
    return -(-position // ALIGNMENT) * ALIGNMENT


# -- msgpack's type bytes ---------------------------------------------------------------------------
class Family(NamedTuple):
    """The type bytes of one msgpack kind: a fix form (``fix``: its first type byte, the number in
    the low bits under ``fix_mask``) and sized forms (``sized``: type byte -> the width in bytes of
    the big-endian number after it, narrowest first). The number is a str's or bin's byte count, an
    array's or map's entry count, or an unsigned int's value."""

    name: str
    fix: int | None
    fix_mask: int
    sized: dict[int, int]

    def number(self, first: int) -> int | None:
        """The number a fix-form type byte holds; None for a sized form's byte or another kind's."""
        if self.fix is not None and self.fix <= first <= self.fix | self.fix_mask:
            return first & self.fix_mask
        return None

    def header(self, number: int) -> bytes:
        """The smallest header for ``number`` (what msgpack writes, §8)."""
        if self.fix is not None and number <= self.fix_mask:
            return bytes([self.fix | number])
        for first, width in self.sized.items():
            if number < 1 << (8 * width):
                return bytes([first]) + number.to_bytes(width, "big")
        raise OverflowError(f"{number} does not fit a msgpack {self.name}")

    def sized_header(self, first: int, number: int) -> bytes:
        """The header of the sized form ``first`` for ``number`` (a canonical exception to §8)."""
        return bytes([first]) + number.to_bytes(self.sized[first], "big")


UINT = Family("uint", 0x00, 0x7F, {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8})
INT = Family("int", None, 0, {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8})
NEGATIVE_FIXINT = 0xE0
FLOAT32, FLOAT64 = 0xCA, 0xCB
NIL, FALSE, TRUE = 0xC0, 0xC2, 0xC3
STR = Family("str", 0xA0, 0x1F, {0xD9: 1, 0xDA: 2, 0xDB: 4})
BIN = Family("bin", None, 0, {0xC4: 1, 0xC5: 2, 0xC6: 4})
ARRAY = Family("array", 0x90, 0x0F, {0xDC: 2, 0xDD: 4})
MAP = Family("map", 0x80, 0x0F, {0xDE: 2, 0xDF: 4})
#: bin's one- and four-byte-size forms: version 2.0's ``pad`` and ``data`` always take these (§8).
BIN8, BIN32 = 0xC4, 0xC6
#: The first bytes of a map (a document starts with one).
MAP_FIRST_BYTES = frozenset(range(0x80, 0x90)) | frozenset(MAP.sized)
#: The struct format of each sized form's number, by its type byte.
NUMBER_FORMATS = {
    first: {1: ">B", 2: ">H", 4: ">I", 8: ">Q"}[width]
    for family in (UINT, STR, BIN, ARRAY, MAP)
    for first, width in family.sized.items()
}


#: What each field of a column map is written as: the dtype's name, the item count, the payload.
COLUMN_FIELD_TYPES = dict(zip(COLUMN_FIELDS, (STR, UINT, BIN), strict=True))


def key(name: str) -> bytes:
    """A key of the layout as msgpack writes it (a fixstr: every key is shorter than 32 bytes)."""
    encoded = name.encode()
    return STR.header(len(encoded)) + encoded


#: The bytes between the tensor table and the data payload other than the padding: the ``pad`` key,
#: its bin8 header, the ``data`` key and its bin32 header (see :func:`pad_and_data_header`).
PAD_OVERHEAD = len(key(PAD_KEY)) + 1 + BIN.sized[BIN8] + len(key(DATA_KEY)) + 1 + BIN.sized[BIN32]


def pad_and_data_header(written: int, data_size: int) -> bytes:
    """``pad`` and ``data``'s header, given that ``written`` bytes come before them: the pad makes
    the data payload start at a multiple of :data:`ALIGNMENT` in the file. ``pad`` is a bin8 (at
    most ``ALIGNMENT - 1`` zero bytes) and ``data`` a bin32, whatever their sizes: with the headers'
    widths fixed, the pad's length follows from ``written`` alone."""
    pad = (-(written + PAD_OVERHEAD)) % ALIGNMENT
    return key(PAD_KEY) + BIN.sized_header(BIN8, pad) + bytes(pad) + key(DATA_KEY) + BIN.sized_header(BIN32, data_size)


def column_head(name: str) -> bytes:
    """The bytes of a canonical column map (§4, §8) from its map header up to its ``length``'s value:
    the same for every file, as its dtype is the one the layout requires."""
    dtype = COLUMN_DTYPES[name].str.encode()
    return (
        MAP.header(len(COLUMN_FIELDS)) + key(COLUMN_DTYPE_KEY) + STR.header(len(dtype)) + dtype + key(COLUMN_LENGTH_KEY)
    )


def bin_header(length: int) -> bytes:
    """The msgpack bin header for ``length`` bytes (what ``packb(bytes)`` writes before them)."""
    return BIN.header(length)


def map_header(entries: int) -> bytes:
    """The msgpack map header for ``entries`` entries (what ``packb(dict)`` writes before them)."""
    return MAP.header(entries)


# -- reading limits -------------------------------------------------------------------------------
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
