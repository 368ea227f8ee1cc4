"""The fast way into a graph file: its columns read straight into their own buffers.

graphsvc writes every file in one canonical layout (``schemas/FORMAT.md`` §8): the same keys in the
same order, each column a map of ``dtype``, ``length`` and ``data``. :func:`scan` walks that layout
byte by byte, without msgpack, and finds each column's payload; :func:`read_column` then reads the
payload from the file into a fresh, aligned buffer (one copy, no intermediate ``bytes``). Everything
that is not a column payload (the format, version and op table before the columns; names,
attributes, outputs and metadata after them) is handed back as byte ranges, for ``format.py`` to
decode with msgpack and all its checks.

The walk accepts only what graphsvc itself writes and says :class:`NotCanonical` at the first byte
that differs. The caller then reads the file the general way, which accepts any valid key order and
words every error, so this module never decides what a bad file's error message says.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

#: How many bytes one small read for headers takes.
_WINDOW = 1 << 16
#: The most msgpack items :func:`_skip_object` walks in Python before leaving a value to msgpack.
_SKIP_BUDGET = 100_000


class NotCanonical(Exception):
    """The bytes are not in graphsvc's canonical layout (or the file changed while being read)."""


class Source(Protocol):
    """Bytes to read by position: an open file or a bytes object."""

    size: int

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes from ``offset`` (fewer at the end)."""
        ...

    def read_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        """Fill ``out`` with the bytes from ``offset``, or raise :class:`NotCanonical`."""
        ...


class FileSource:
    """An open file, read with ``pread`` so nothing depends on a file position."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size

    def read(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    def read_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        view = out.data.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:  # the file got shorter since its size was read
                raise NotCanonical
            done += got


class BytesSource:
    """Bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.size = len(data)

    def read(self, offset: int, count: int) -> bytes:
        return self._data[offset : offset + count]

    def read_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        out[:] = np.frombuffer(self._data, dtype=np.uint8, count=len(out), offset=offset)


@dataclass(frozen=True)
class ColumnSpan:
    """One column as the file declares it; the payload is ``size`` bytes at ``offset``."""

    key: str
    dtype: str
    length: int
    offset: int
    size: int


@dataclass(frozen=True)
class Layout:
    """Where the parts of a canonical file are.

    ``head`` spans the values of ``format``, ``version`` and ``ops`` with their keys (the
    document's first three entries); ``tail`` spans the last four entries, ``names`` to
    ``metadata``, up to the end of the file.
    """

    head: tuple[int, int]
    count: int
    columns: tuple[ColumnSpan, ...]
    tail: tuple[int, int]


def _fixstr(text: str) -> bytes:
    data = text.encode("ascii")
    return bytes([0xA0 | len(data)]) + data


_HEAD_KEYS = tuple(_fixstr(key) for key in ("format", "version", "ops"))
_NODES = _fixstr("nodes")
_COUNT = _fixstr("count")
_COLUMN_KEYS = (_fixstr("dtype"), _fixstr("length"), _fixstr("data"))
#: Map headers the canonical layout uses: the document (8 entries), a column (3).
_DOCUMENT_MAP = b"\x88"
_COLUMN_MAP = b"\x83"
_UINT = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}
_BIN = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}


class _Cursor:
    """Reads the bytes of a source in order through a small window."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self.pos = 0
        self._base = 0
        self._window = b""

    def take(self, count: int) -> bytes:
        start = self.pos - self._base
        if start < 0 or start + count > len(self._window):
            self._window = self._source.read(self.pos, max(count, _WINDOW))
            self._base = self.pos
            start = 0
            if len(self._window) < count:
                raise NotCanonical
        self.pos += count
        return self._window[start : start + count]

    def skip(self, count: int) -> None:
        if self.pos + count > self._source.size:
            raise NotCanonical
        self.pos += count

    def expect(self, data: bytes) -> None:
        if self.take(len(data)) != data:
            raise NotCanonical

    def unsigned(self) -> int:
        first = self.take(1)[0]
        if first <= 0x7F:
            return first
        fmt = _UINT.get(first)
        if fmt is None:
            raise NotCanonical
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value


def _skip_object(cursor: _Cursor) -> None:
    """Step over one msgpack value, iteratively; very long or unusual values are not canonical."""
    pending = 1
    budget = _SKIP_BUDGET
    while pending:
        pending -= 1
        budget -= 1
        if budget < 0:
            raise NotCanonical
        first = cursor.take(1)[0]
        if first <= 0x7F or first >= 0xE0 or first in (0xC0, 0xC2, 0xC3):
            continue  # fixint, nil, false, true
        if first <= 0x8F:
            pending += 2 * (first & 0x0F)
        elif first <= 0x9F:
            pending += first & 0x0F
        elif first <= 0xBF:
            cursor.skip(first & 0x1F)
        elif first in (0xCA, 0xCB):  # float 32 / 64
            cursor.skip(4 if first == 0xCA else 8)
        elif 0xCC <= first <= 0xD3:  # uint / int 8 .. 64
            cursor.skip(1 << ((first - 0xCC) % 4))
        elif first in (0xC4, 0xC5, 0xC6, 0xD9, 0xDA, 0xDB):  # bin, str 8 .. 32
            width = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}[first]
            cursor.skip(int.from_bytes(cursor.take(width), "big"))
        elif first in (0xDC, 0xDD):  # array 16 / 32
            pending += int.from_bytes(cursor.take(2 if first == 0xDC else 4), "big")
        elif first in (0xDE, 0xDF):  # map 16 / 32
            pending += 2 * int.from_bytes(cursor.take(2 if first == 0xDE else 4), "big")
        else:  # ext types and the reserved byte: never in a graphsvc file
            raise NotCanonical


def scan(source: Source, column_keys: tuple[str, ...], optional_last: str) -> Layout:
    """Walk a canonical file and say where its parts are; raise :class:`NotCanonical` otherwise.

    ``column_keys`` are the columns every file has, in order; ``optional_last`` may follow them.
    """
    cursor = _Cursor(source)
    cursor.expect(_DOCUMENT_MAP)
    head_start = cursor.pos
    for head_key in _HEAD_KEYS:
        cursor.expect(head_key)
        _skip_object(cursor)
    head_end = cursor.pos
    cursor.expect(_NODES)
    entries = cursor.take(1)[0]
    keys = (*column_keys, optional_last) if entries == 0x81 + len(column_keys) + 1 else column_keys
    if entries != 0x81 + len(keys):  # count and the columns, in a fixmap
        raise NotCanonical
    cursor.expect(_COUNT)
    count = cursor.unsigned()
    columns = []
    for key in keys:
        cursor.expect(_fixstr(key))
        cursor.expect(_COLUMN_MAP)
        cursor.expect(_COLUMN_KEYS[0])
        dtype_header = cursor.take(1)[0]
        if not 0xA0 <= dtype_header <= 0xBF:
            raise NotCanonical
        try:
            dtype = cursor.take(dtype_header & 0x1F).decode("ascii")
        except UnicodeDecodeError:
            raise NotCanonical from None
        cursor.expect(_COLUMN_KEYS[1])
        length = cursor.unsigned()
        cursor.expect(_COLUMN_KEYS[2])
        fmt = _BIN.get(cursor.take(1)[0])
        if fmt is None:
            raise NotCanonical
        size = struct.unpack(fmt, cursor.take(struct.calcsize(fmt)))[0]
        columns.append(ColumnSpan(key, dtype, length, cursor.pos, size))
        cursor.skip(size)
    return Layout((head_start, head_end), count, tuple(columns), (cursor.pos, source.size))


def read_column(source: Source, span: ColumnSpan) -> npt.NDArray[np.uint8]:
    """The column's payload bytes, in a buffer of their own."""
    out = np.empty(span.size, dtype=np.uint8)  # numpy asks the kernel for huge pages when it is large
    source.read_into(span.offset, out)
    return out
