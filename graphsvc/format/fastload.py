"""The fast way into a graph file: its columns read straight into their own buffers.

graphsvc writes every file in one canonical layout (``schemas/FORMAT.md`` §8), and other writers
mostly differ from it only in key order or header widths. :func:`scan` walks the document's top
level and its ``nodes`` map byte by byte, without msgpack, in any key order and with any header
widths, and finds each column's payload; :func:`read_column` then reads the payload from the file
into a fresh, aligned buffer (one copy, no intermediate ``bytes``), and :func:`read_data` reads
version 2.0's data section the same way, or views it where the source is already in memory (a
mapped file: ``format.load(..., mmap=True)``). The layout it walks (key names and order, the msgpack
type bytes of each field) is :mod:`graphsvc.format.layout`'s, the one the writer (:mod:`graphsvc.format.codec`)
uses. Everything that is not in ``nodes`` (format, version, ops, names, attributes, outputs,
metadata, and any key a newer minor version adds) is handed back as byte ranges, for
:mod:`graphsvc.format.codec` to decode with msgpack and all its checks. The walk is made in C
(``csrc/table.c``) over the bytes already in memory where that extension is built; the Python walk
(:func:`_walk`) is its reference, and walks whatever the C walk leaves (headers past those bytes,
anything unusual).

The walk accepts only documents whose ``nodes`` map holds nothing but ``count`` and the known
columns, each column a map of exactly ``dtype``, ``length`` and ``data``, and says
:class:`NotCanonical` at the first byte that differs. The caller then reads the file the general
way, which accepts any valid document and words every error, so this module never decides what a
bad file's error message says.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from graphsvc.format.layout import (
    ARRAY,
    BIN,
    COLUMN_DATA_KEY,
    COLUMN_DTYPE_KEY,
    COLUMN_DTYPES,
    COLUMN_FIELD_TYPES,
    COLUMN_FIELDS,
    COLUMN_LENGTH_KEY,
    COUNT,
    DATA_KEY,
    FALSE,
    FLOAT32,
    FLOAT64,
    INT,
    MAP,
    NEGATIVE_FIXINT,
    NIL,
    NODES_KEY,
    NUMBER_FORMATS,
    STR,
    TENSOR_KEYS,
    TENSORS_KEY,
    TRUE,
    UINT,
    Family,
    column_head,
)
from graphsvc.format.layout import key as key_bytes
from graphsvc.native import compiled_table

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
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

    @property
    def head(self) -> Buffer:
        """The first bytes, already in memory (a file's first read; all of a bytes object's)."""
        ...

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes from ``offset`` (fewer at the end)."""
        ...


class FileSource:
    """An open file, read with ``pread`` so nothing depends on a file position. ``head``, the file's
    first bytes when the caller has read them already, answers every read that lies within it (a
    canonical file's header, tensor table and columns mostly do: one read instead of one each)."""

    def __init__(self, fd: int, head: bytes = b"", size: int | None = None) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size if size is None else size
        self.head = head

    def read(self, offset: int, count: int) -> bytes:
        if offset + count <= len(self.head) or len(self.head) >= self.size:  # within it, or it is the whole file
            return self.head[offset : offset + count]
        return os.pread(self._fd, count, offset)

    def read_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        """Fill ``out`` with the file's bytes from ``offset``, or raise :class:`NotCanonical`."""
        view = out.data.cast("B")
        half = len(view) // 2
        if (
            len(view) < SPLIT_BYTES
            or not _SECOND_CORE
            or not _cached(self._fd, offset + half)  # from the disk, one sequential reader reads ahead best
            or not _helper.begin(self._fd, view[half:], offset + half)
        ):
            _read_all(self._fd, view, offset)
            return
        try:
            _read_all(self._fd, view[:half], offset)
        finally:
            _helper.wait()  # done with the buffer before anything else happens to it


def _read_all(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` with the file's bytes from ``offset``; :class:`NotCanonical` if the file ends first."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:  # the file got shorter since its size was read
            raise NotCanonical
        done += got


#: From this many bytes on, a payload is read in two halves at once, the second by a helper thread:
#: a copy from the page cache is bound by one core's memory copy (two halves at once took 55-70% of
#: the time of one read of 9 MB here, alone; next to other work, waking the helper cost about what
#: it saved below ~16 MB). The thread is kept: starting one per read costs ~0.15 ms.
SPLIT_BYTES = 16 << 20
_SECOND_CORE = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) > 1


def _cached(fd: int, offset: int) -> bool:
    """Is the file's page at ``offset`` in the page cache (would a read of it not wait for the disk)?
    False where the system cannot tell."""
    try:
        return os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT) == 1
    except (OSError, AttributeError):  # EAGAIN: on disk; no RWF_NOWAIT here, or not for this file
        return False


class _Helper:
    """A thread that reads the second half of a large payload while the caller reads the first,
    started on first use (again in a forked child, which has only the thread that forked). One read
    at a time: a thread that finds it busy, or cannot start it, reads its payload whole."""

    def __init__(self) -> None:
        self._forked()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A fresh state: at import, and in a forked child (where a parent's read may have held it)."""
        self._busy = threading.Lock()
        self._go = threading.Lock()  # released: a job is set
        self._done = threading.Lock()  # released: the job is over
        self._pid = -1
        self._job: tuple[int, memoryview, int] | None = None
        self._failure: BaseException | None = None

    def begin(self, fd: int, view: memoryview, offset: int) -> bool:
        """Start reading ``view``'s bytes from ``offset`` if the helper is free (then the caller must
        :meth:`wait`); False when it is busy or its thread cannot start."""
        if not self._busy.acquire(blocking=False):
            return False
        try:
            if self._pid != os.getpid():
                go, done = threading.Lock(), threading.Lock()
                go.acquire()
                done.acquire()
                threading.Thread(target=self._run, args=(go, done), name="graphsvc-read", daemon=True).start()
                self._go, self._done, self._pid = go, done, os.getpid()
            self._job, self._failure = (fd, view, offset), None
        except BaseException as exc:
            self._busy.release()
            if isinstance(exc, RuntimeError):  # can't start new thread: read whole
                return False
            raise
        # Outside the try: once the job is handed over, only wait() may free the helper (else a
        # next job's wait could take this one's end for its own).
        self._go.release()
        return True

    def wait(self) -> None:
        """Wait for the read (a Ctrl-C meanwhile is raised once it is over: the helper must not be
        handed out mid-read); raise what it raised; free the helper."""
        interrupted: BaseException | None = None
        while True:
            try:
                self._done.acquire()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        failure, self._failure = self._failure, None
        self._busy.release()
        if interrupted is not None:
            raise interrupted
        if failure is not None:
            raise failure

    def _run(self, go: threading.Lock, done: threading.Lock) -> None:
        while True:
            go.acquire()
            job, self._job = self._job, None
            try:
                if job is None:
                    raise RuntimeError("the read helper was woken without a read to do")
                _read_all(*job)
            except BaseException as exc:  # raised in the reader, by wait(); the helper goes on
                self._failure = exc
            del job  # not the buffer's last reference past this read
            done.release()


_helper = _Helper()


#: Bytes in memory: an object, or a file mapped read-only (``format.load(..., mmap=True)``).
Buffer = bytes | bytearray | mmap.mmap


class BytesSource:
    """Bytes already in memory, or a mapped file (whose views then map it too)."""

    def __init__(self, data: Buffer) -> None:
        self._data = data
        self.size = len(data)
        self.head = data  # every byte is in memory

    def read(self, offset: int, count: int) -> bytes:
        return bytes(self._data[offset : offset + count])

    def view(self, offset: int, count: int) -> npt.NDArray[np.uint8]:
        """``count`` bytes from ``offset``, read-only, without a copy."""
        if offset + count > self.size:
            raise NotCanonical
        out = np.frombuffer(self._data, dtype=np.uint8, count=count, offset=offset)
        out.flags.writeable = False
        return out


class ColumnSpan(NamedTuple):
    """One column as the file declares it; the payload is ``size`` bytes at ``offset``."""

    key: str
    dtype: str
    length: int
    offset: int
    size: int


class Layout(NamedTuple):
    """Where the parts of a graph file are.

    ``rest`` spans the document's entries other than ``nodes``, ``pad`` and ``data`` (their keys
    and values, in file order): those before ``nodes``, the ``tensors`` table of version 2.0 right
    after it, and those after ``data`` (or ``nodes``), up to the end of the file; ``rest_entries``
    says how many entries they hold; ``node_count`` is ``nodes.count``. ``columns`` are in file
    order. ``data`` is version 2.0's data section, ``(offset, size)`` of its payload, when it
    follows ``nodes`` as in the canonical layout.
    """

    rest: tuple[tuple[int, int], ...]
    rest_entries: int
    node_count: int
    columns: tuple[ColumnSpan, ...]
    data: tuple[int, int] | None = None


def _fix_bytes(family: Family) -> range:
    """The type bytes of ``family``'s fix form."""
    return range(family.fix, (family.fix | family.fix_mask) + 1) if family.fix is not None else range(0)


#: The type bytes of a str, every form.
_STRING_BYTES = frozenset((*_fix_bytes(STR), *STR.sized))


class _Cursor:
    """Reads the bytes of a source in order through a small window, within a budget of items."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self.pos = 0
        self._base = 0
        self._window = source.head
        self.budget = _SKIP_BUDGET

    def take(self, count: int) -> bytes | bytearray:  # a slice of the window: a bytearray of a bytearray head
        if self.pos + count > self._source.size:  # before reading: a declared size may be huge
            raise NotCanonical
        start = self.pos - self._base
        if start < 0 or start + count > len(self._window):
            self._window = self._source.read(self.pos, max(count, _WINDOW))
            self._base = self.pos
            start = 0
            if len(self._window) < count:
                raise NotCanonical
        self.pos += count
        return self._window[start : start + count]

    def peek(self) -> int:
        index = self.pos - self._base
        if 0 <= index < len(self._window) and self.pos < self._source.size:  # most bytes: in the window
            return self._window[index]
        first = self.take(1)[0]
        self.pos -= 1
        return first

    def skip(self, count: int) -> None:
        if self.pos + count > self._source.size:
            raise NotCanonical
        self.pos += count

    def number(self, family: Family) -> int:
        """A header of ``family`` (any width), read: its number (a size, a count, a uint's value)."""
        first = self.peek()
        self.pos += 1
        fix = family.fix
        if fix is not None and fix <= first <= fix | family.fix_mask:  # Family.number, inlined
            return first & family.fix_mask
        width = family.sized.get(first)
        if width is None:
            raise NotCanonical
        value: int = struct.unpack(NUMBER_FORMATS[first], self.take(width))[0]
        return value

    def unsigned(self) -> int:
        return self.number(UINT)

    def map_header(self) -> int:
        return self.number(MAP)

    def is_string(self) -> bool:
        """Is the next value a str?"""
        first = self.peek()
        return first in _STRING_BYTES

    def string(self, max_length: int) -> str:
        """A str of at most ``max_length`` bytes of valid UTF-8."""
        length = self.number(STR)
        if length > max_length:
            raise NotCanonical
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise NotCanonical from None

    def bin_header(self) -> int:
        return self.number(BIN)


#: The width of the value after each type byte of a fixed-width scalar.
_SCALAR_WIDTHS = {FLOAT32: 4, FLOAT64: 8, **UINT.sized, **INT.sized}
#: Each type byte of the kinds :func:`_skip_object` steps over by their size or count.
_SIZED = {first: family for family in (STR, BIN) for first in (*family.sized, *_fix_bytes(family))}
_CONTAINERS = {first: family for family in (ARRAY, MAP) for first in (*family.sized, *_fix_bytes(family))}


def _skip_object(cursor: _Cursor) -> None:
    """Step over one msgpack value, iteratively; very long or unusual values are not canonical."""
    pending = 1
    while pending:
        pending -= 1
        cursor.budget -= 1
        if cursor.budget < 0:
            raise NotCanonical
        first = cursor.peek()
        if UINT.number(first) is not None or first >= NEGATIVE_FIXINT or first in (NIL, FALSE, TRUE):
            cursor.skip(1)
        elif first in _SCALAR_WIDTHS:  # float, uint and int 8 .. 64: a value of a fixed width
            cursor.skip(1 + _SCALAR_WIDTHS[first])
        elif first in _SIZED:  # str and bin: a size, then that many bytes
            cursor.skip(cursor.number(_SIZED[first]))
        elif first in _CONTAINERS:  # array and map: a count, then that many items (two per map entry)
            family = _CONTAINERS[first]
            pending += cursor.number(family) * (2 if family is MAP else 1)
        else:  # ext types and the reserved byte: never in a graphsvc file
            raise NotCanonical


#: Where the msgpack value at an offset of a source ends (:mod:`graphsvc.format.codec` gives msgpack's own
#: ``Unpacker.skip``, so that this module need not import msgpack); raises :class:`NotCanonical`.
ValueEnd = Callable[[Source, int], int]


def scan(
    source: Source,
    column_keys: tuple[str, ...],
    optional: str,
    max_string_length: int,
    value_end: ValueEnd | None = None,
) -> Layout:
    """Find the parts of a graph document; raise :class:`NotCanonical` when the walk cannot.

    ``column_keys`` are the columns every file has; ``optional`` may be there too, or be nil.
    Keys and dtypes longer than ``max_string_length`` bytes are left to the general reader, which
    words that limit's error. ``value_end``, when given, steps over the values outside ``nodes``
    (version 2.0's tensor table has a msgpack item every byte or two: walked here in Python, it
    would cost more than the rest of the load).
    """
    window = source.head
    if _ctable is not None and window:
        found = _native_scan(window, source.size, column_keys, optional, max_string_length)
        if found is not None:
            return found
    return _walk(source, column_keys, optional, max_string_length, value_end)


def _native_scan(
    window: Buffer, size: int, column_keys: tuple[str, ...], optional: str, max_string_length: int
) -> Layout | None:
    """:func:`_walk`'s C twin (``csrc/table.c``) over the bytes in memory, or None where it needs to
    look past them or meets anything unusual (then :func:`_walk` decides)."""
    assert _ctable is not None
    found = _ctable.scan(
        window, size, _NATIVE_KEYS, (*column_keys, optional), len(column_keys), _NATIVE_FIELDS,
        max_string_length, _SKIP_BUDGET,
    )  # fmt: skip
    if found is None:
        return None
    rest, rest_entries, count, columns, data = found
    return Layout(rest, rest_entries, count, tuple(ColumnSpan(*column) for column in columns), data)


#: ``graphsvc.native._ctable``, whose ``scan`` is :func:`_walk`'s C twin, or None where it is not in use
#: (:func:`graphsvc.native.compiled_table`).
_ctable = compiled_table()
#: The keys the C walk looks for, as msgpack holds them: nodes, count, tensors, pad, data; a
#: column's fields.
_NATIVE_KEYS = tuple(name.encode() for name in (NODES_KEY, COUNT, *TENSOR_KEYS))
_NATIVE_FIELDS = tuple(name.encode() for name in COLUMN_FIELDS)


def _walk(
    source: Source,
    column_keys: tuple[str, ...],
    optional: str,
    max_string_length: int,
    value_end: ValueEnd | None = None,
) -> Layout:
    """:func:`scan`, byte by byte in Python: the reference, and the walk of whatever the C twin
    leaves (headers past the bytes in memory, anything unusual)."""
    cursor = _Cursor(source)
    entries = cursor.map_header()
    before = cursor.pos
    for index in range(entries):
        start = cursor.pos
        if cursor.is_string():
            if cursor.string(max_string_length) == NODES_KEY:
                nodes_at = start
                remaining = entries - index - 1
                break
        else:
            _skip_object(cursor)  # a key that is not a string: for msgpack to refuse
        _skip_value(cursor, source, value_end)
    else:
        raise NotCanonical  # no nodes: the general reader says so
    count, columns = _scan_nodes(cursor, (*column_keys, optional), optional, max_string_length)
    if {span.key for span in columns} < set(column_keys):
        raise NotCanonical
    rest = [(before, nodes_at)]
    rest_entries = entries - 1
    data: tuple[int, int] | None = None
    # Version 2.0 (FORMAT.md §15): tensors, pad and data follow nodes; the table is decoded with the
    # rest, the pad skipped, the data payload read on its own. Anything else stops the walk.
    for key in TENSOR_KEYS[:remaining]:
        start = cursor.pos
        if not _next_key_is(cursor, key, max_string_length):
            cursor.pos = start
            break
        if key == TENSORS_KEY:
            _skip_value(cursor, source, value_end)
            rest.append((start, cursor.pos))
            continue
        size = cursor.bin_header()  # a pad or data that is not bin data: the general reader says so
        if key == DATA_KEY:
            data = (cursor.pos, size)
        cursor.skip(size)
        rest_entries -= 1
    rest.append((cursor.pos, source.size))
    return Layout(tuple(rest), rest_entries, count, tuple(columns), data)


class SourceStream:
    """A source read in order from ``offset``, as a binary stream (``read(count)``). A read may return
    fewer bytes than asked, as a raw stream's may: the first returns at most ``first`` bytes, each
    next one at most twice as many as the one before (most values skipped are a few bytes long)."""

    def __init__(self, source: Source, offset: int, first: int = 1 << 12) -> None:
        self._source = source
        self._pos = offset
        self._next = first

    def read(self, count: int) -> bytes:
        chunk = self._source.read(self._pos, min(count, self._next))
        self._next *= 2
        self._pos += len(chunk)
        return chunk


def _skip_value(cursor: _Cursor, source: Source, value_end: ValueEnd | None) -> None:
    if value_end is None:
        _skip_object(cursor)
    else:
        cursor.pos = value_end(source, cursor.pos)


def _next_key_is(cursor: _Cursor, key: str, max_string_length: int) -> bool:
    """Is the next entry's key ``key``? The cursor is left after the key when it is."""
    return cursor.is_string() and cursor.string(max_string_length) == key


def _scan_nodes(
    cursor: _Cursor, known: tuple[str, ...], optional: str, max_string_length: int
) -> tuple[int, list[ColumnSpan]]:
    count: int | None = None
    columns: list[ColumnSpan] = []
    seen: set[str] = set()
    for _ in range(cursor.map_header()):
        key = cursor.string(max_string_length)
        if key in seen:
            raise NotCanonical
        seen.add(key)
        if key == COUNT:
            count = cursor.unsigned()
        elif key == optional and cursor.peek() == NIL:  # no such column
            cursor.skip(1)
        elif key in known:
            columns.append(_canonical_column(cursor, key) or _scan_column(cursor, key, max_string_length))
        else:  # a key of a newer minor version: for msgpack to check
            raise NotCanonical
    if count is None:
        raise NotCanonical
    return count, columns


#: Each column's bytes from its map header to its length's value, and the ``data`` key, as graphsvc
#: writes them: matched whole, a canonical column takes a few reads instead of one per item.
_COLUMN_HEADS = {name: column_head(name) for name in COLUMN_DTYPES}
_COLUMN_DATA_KEY = key_bytes(COLUMN_DATA_KEY)


def _canonical_column(cursor: _Cursor, name: str) -> ColumnSpan | None:
    """The column at the cursor when its bytes are exactly as graphsvc writes them, else None with the
    cursor where it was (for :func:`_scan_column`, which reads any order and header widths)."""
    start = cursor.pos
    head = _COLUMN_HEADS[name]
    if cursor.take(len(head)) == head:
        length = cursor.unsigned()
        if cursor.take(len(_COLUMN_DATA_KEY)) == _COLUMN_DATA_KEY:
            size = cursor.bin_header()
            payload = cursor.pos
            cursor.skip(size)
            return ColumnSpan(name, COLUMN_DTYPES[name].str, length, payload, size)
    cursor.pos = start
    return None


def _scan_column(cursor: _Cursor, key: str, max_string_length: int) -> ColumnSpan:
    if cursor.map_header() != len(COLUMN_FIELDS):
        raise NotCanonical
    found: dict[str, str | int] = {}
    payload = (0, 0)
    for _ in COLUMN_FIELDS:
        field = cursor.string(max_string_length)
        family = COLUMN_FIELD_TYPES.get(field)
        if family is None or field in found:
            raise NotCanonical
        if family is STR:
            found[field] = cursor.string(max_string_length)
        elif family is BIN:  # the payload: where it starts and its size; stepped over
            size = cursor.number(BIN)
            payload = (cursor.pos, size)
            found[field] = size
            cursor.skip(size)
        else:
            found[field] = cursor.number(family)
    dtype, length = found[COLUMN_DTYPE_KEY], found[COLUMN_LENGTH_KEY]
    assert isinstance(dtype, str) and isinstance(length, int)
    return ColumnSpan(key, dtype, length, *payload)


def read_data(source: Source, offset: int, size: int) -> npt.NDArray[np.uint8]:
    """Version 2.0's data section: the bytes read once, into a buffer the arrays then view (a view
    of the bytes themselves when they are already in memory)."""
    if isinstance(source, BytesSource):
        view = source.view(offset, size)
        if view.ctypes.data % 8 == 0:  # a canonical file's payloads, 64-aligned in it, stay aligned in memory
            return view
    return read_column(source, ColumnSpan(DATA_KEY, "|u1", size, offset, size))


def read_column(source: Source, span: ColumnSpan) -> npt.NDArray[np.uint8]:
    """The column's payload bytes, in a buffer of their own."""
    head = source.head
    if span.offset + span.size <= len(head):  # in memory already (most columns): one call, one copy
        return np.array(memoryview(head)[span.offset : span.offset + span.size])
    assert isinstance(source, FileSource)  # a BytesSource's head is all of it; scan's spans lie within the source
    out = np.empty(span.size, dtype=np.uint8)  # numpy asks the kernel for huge pages when it is large
    source.read_into(span.offset, out)
    return out
