"""The graphsvc msgpack wire format, versions 1.0 and 2.0: the public verbs.

``dumps``/``dump``/``save`` write, ``loads``/``load`` read. The byte-level spec is
``schemas/FORMAT.md``; the JSON Schemas of the decoded document are ``schemas/graphsvc-v1.schema.json``
and ``schemas/graphsvc-v2.schema.json``. A graph of float64 scalars is written as 1.0; a tensor
graph (:attr:`Graph.is_tensor_graph`) as 2.0: the same document plus a tensor table and one data
section whose payloads are aligned, so that loading views them where they were read, without a copy
(or, with ``load(path, mmap=True)``, where the file is mapped, without reading them at all).

A file is data, never code: no msgpack ext types, no pickle, nothing is imported or evaluated.
Every size the file declares is checked against the bytes actually present before anything is
allocated, and every structural rule is checked before the graph is returned.

This module gets the bytes (a path, a FIFO, a stream, a mapping; msgpack or the JSON form) and
hands them on: :mod:`graphsvc.format.layout` describes the file, :mod:`graphsvc.format.codec` turns bytes into
documents and back (:mod:`graphsvc.format.fastload` its fast path), :mod:`graphsvc.format.document` turns
documents into graphs and back with every check, :mod:`graphsvc.format.diagnose` words what is wrong.
"""

from __future__ import annotations

import errno
import mmap as _mmap
import os
import re
import select
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, BinaryIO

from graphsvc.collector import gc_paused
from graphsvc.errors import FormatError, GraphFileError
from graphsvc.format import codec, document, fastload, keys
from graphsvc.format.document import MAPPED_CHANGED, check_mapped, check_text, check_writable, mappings
from graphsvc.format.layout import (
    ALIGNMENT,
    CANONICAL_NAN_BITS,
    COLUMN_DTYPES,
    DEFAULT_LIMITS,
    FORMAT_NAME,
    KEYS_2,
    MAP_FIRST_BYTES,
    MAX_ARRAY_BYTES,
    READ_MAJORS,
    TENSOR_DTYPES,
    TENSOR_VERSION,
    VERSION,
    WHICH,
    Limits,
)
from graphsvc.graph import Graph, expect_graph
from graphsvc.text import counted, one_line

__all__ = [
    "ALIGNMENT",
    "CANONICAL_NAN_BITS",
    "COLUMN_DTYPES",
    "DEFAULT_LIMITS",
    "FORMAT_NAME",
    "KEYS_2",
    "MAX_ARRAY_BYTES",
    "READ_MAJORS",
    "TENSOR_DTYPES",
    "TENSOR_VERSION",
    "VERSION",
    "WHICH",
    "FormatError",
    "GraphFileError",
    "GraphSource",
    "Limits",
    "check_mapped",
    "dump",
    "dumps",
    "load",
    "load_regular",
    "load_versioned",
    "loads",
    "save",
]


# -- writing ------------------------------------------------------------------------------------
def dumps(graph: Graph) -> bytes:
    """Encode a graph. The same graph always gives the same bytes."""
    expect_graph("dumps", graph)
    check_mapped(graph)
    with gc_paused():  # a list per node with attributes: see graphsvc.collector
        stored = check_writable(graph)
        with _encoding():
            return b"".join(codec.encode(graph, stored))


def dump(graph: Graph, stream: IO[bytes]) -> None:
    """Write a graph to an open binary stream."""
    expect_graph("dump", graph)
    check_mapped(graph)
    with gc_paused():
        _write(graph, stream, check_writable(graph))


def _write(graph: Graph, stream: IO[bytes], stored: list[document.Stored] | None) -> None:
    with _encoding():
        for chunk in codec.encode(graph, stored):
            stream.write(chunk)


@contextmanager
def _encoding() -> Iterator[None]:
    """Encoding the graph in this block: a value msgpack cannot take is a FormatError."""
    try:
        yield
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"cannot encode the graph: {exc}") from exc


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write a graph to ``path`` atomically (see :mod:`graphsvc.format.atomic`): a reader sees the old
    file or the new one, never a part. Raises :class:`graphsvc.errors.OutputError` (a
    :class:`GraphFileError`) when ``path`` cannot be written."""
    from graphsvc.format.atomic import (  # here, not at the top: reading needs none of hashlib/secrets
        atomic_writer,
        reserve,
    )

    expect_graph("save", graph)
    check_mapped(graph)
    with gc_paused():  # a list per node with attributes (a million: 3.3 s of collections): see graphsvc.collector
        stored = check_writable(graph)
        with atomic_writer(path) as stream:
            with _encoding():
                chunks = list(codec.encode(graph, stored))  # views of the columns and arrays: nothing is copied
            reserve(stream, sum(map(len, chunks)))
            try:
                _write_all(stream.fileno(), chunks)
            except OSError as exc:
                # EFAULT: the kernel could not read the bytes to write, the pages of a mapped file cut short
                if exc.errno == errno.EFAULT and mappings(graph):
                    check_mapped(graph)
                    raise GraphFileError(MAPPED_CHANGED) from None
                raise


#: The most buffers one ``writev`` takes (POSIX's IOV_MAX on Linux).
_IOV_MAX = 1024


def _write_all(fd: int, chunks: list[bytes | memoryview]) -> None:
    """Write every chunk, in order, with ``os.writev`` (no copy into a buffer; short writes resumed)."""
    pending = [chunk for chunk in chunks if len(chunk)]
    first = 0
    while first < len(pending):
        batch = pending[first : first + _IOV_MAX]
        done = os.writev(fd, batch)
        for chunk in batch:
            if done < len(chunk):
                break
            done -= len(chunk)
            first += 1
        if done:
            pending[first] = memoryview(pending[first])[done:]


# -- reading ------------------------------------------------------------------------------------
def loads(data: bytes, limits: Limits = DEFAULT_LIMITS, *, strict: bool = False) -> Graph:
    """Decode and validate a graph. Any problem raises :class:`FormatError`, never another error.

    A key the reader does not know (FORMAT.md §2) is ignored with an
    :class:`~graphsvc.errors.UnknownKeyWarning` naming it and the known key closest to it;
    ``strict=True`` refuses the document instead (:class:`FormatError`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("loads() takes bytes")
    data = bytes(data)
    try:
        with keys.collecting() as unknown:
            graph = _read_msgpack(data, limits)[0]
    except MemoryError:
        raise FormatError(_no_memory(len(data))) from None
    if unknown:
        if strict:
            raise keys.refusal(unknown)
        keys.warn(unknown, stacklevel=2)  # the warning points at loads' caller
    return graph


def _no_memory(size: int) -> str:
    return f"not enough memory to load a graph of {counted(size, 'byte', thousands=True)}"


def _read_msgpack(data: bytes | bytearray, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    return _read(fastload.BytesSource(data), lambda: data, limits)


def _read(
    source: fastload.Source, everything: Callable[[], fastload.Buffer], limits: Limits
) -> tuple[Graph, tuple[int, int]]:
    """Read the columns straight into arrays when :func:`fastload.scan` finds them; anything else
    (or any problem) the general way, which gets ``everything`` and words the error."""
    with gc_paused():  # a map per node's attributes: see graphsvc.collector
        if source.size > _HEAD:
            # what the first bytes rule out is refused before the rest is read (a 3 GB file of
            # zeros; the fast path too would step over a huge array), every source alike, so that
            # a file gives one error however it is read; a 64 KiB decode, at most, otherwise
            codec.check_head(source.read(0, _HEAD), source.size, limits)
        try:
            doc = codec.decode_fast(source, limits)
        except (fastload.NotCanonical, FormatError):
            doc = None  # decoded below, once the traceback (and any column read so far) is let go
        if doc is None:
            data = everything()
            doc = codec.decode(data, limits)
            del data  # the decoded columns hold their own copy; free the file's bytes before validating
        graph, version = document.validate(doc, limits)
        keys.found(keys.in_msgpack(doc, version[0]))
        return graph, version


#: A graph source: a path, or an open binary stream (``sys.stdin.buffer``) read to its end.
GraphSource = str | os.PathLike[str] | BinaryIO
#: How many bytes one read from a pipe, a device or a stream asks for.
_CHUNK = 1 << 20
#: How many bytes are read first: enough to tell msgpack from JSON (more only after leading
#: whitespace), and the window the msgpack reader walks first (most files' header, tensor table and
#: small columns: read once).
_HEAD = 1 << 16
_BOM = b"\xef\xbb\xbf"
_NOT_JSON_SPACE = re.compile(rb"[^ \t\n\r]")


def load(source: GraphSource, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = False, strict: bool = False) -> Graph:
    """Read and validate the graph at ``source``: a path, or a binary stream read to its end.

    The file may be a msgpack graph file or its JSON form (:mod:`graphsvc.format.jsonio`), told apart by
    content: msgpack starts with a map, JSON with ``{``. Raises :class:`GraphFileError` when the
    file cannot be read, :class:`FormatError` (a subclass) when it is not a valid graph; every
    message starts with the file's name.

    A key the reader does not know (FORMAT.md §2: a newer minor version's, or a misspelt one) is
    ignored with an :class:`~graphsvc.errors.UnknownKeyWarning` per key (``FILE: nodes[3]: unknown
    key 'parnets' (did you mean 'parents'?); ignored``; a key unknown in many nodes is one warning,
    and past five keys one more counts the rest); ``strict=True`` refuses the file instead, with a
    :class:`FormatError` naming the first.

    ``mmap=True`` maps a msgpack file at a path instead of reading it: a version 2.0 file in the
    canonical layout (FORMAT.md §15.3) then gives arrays that are read-only views into the mapping,
    so loading costs neither the read nor the memory of the arrays until their pages are touched.
    Every check is the same, made before any view exists; the same file gives the same graph or
    the same error as without ``mmap``. A stream, a pipe, the JSON form, an empty file and a file
    in another layout are read as without it (the arrays then own their memory).

    Without ``mmap``, a payload of 16 MiB or more whose pages are in the page cache is read in two
    halves at once, the second by a helper thread the process keeps from then on (a copy from the
    page cache is bound by one core; on Python 3.12 and later, a later ``os.fork()`` warns that the
    process has threads).

    The mapping lives as long as any array viewing it. Replacing the file (``save`` renames a new
    file over it) leaves the arrays as they were; **writing into the file or truncating it while
    it is mapped is not safe**: written bytes show through the arrays (which bypasses every check)
    and reading a page a truncation removed kills the process with ``SIGBUS``. :func:`save`,
    :func:`dumps`, :func:`dump` and the replays check first (:func:`check_mapped`) and refuse a graph
    whose file is now shorter than its mapping (:class:`GraphFileError`); a truncation during one of
    them can still kill the process. Use it on files no one rewrites in place, which is what
    :func:`save` guarantees for its own files.
    """
    return load_versioned(source, limits, mmap=mmap, strict=strict, _stacklevel=2)[0]


def load_versioned(
    source: GraphSource,
    limits: Limits = DEFAULT_LIMITS,
    *,
    mmap: bool = False,
    strict: bool = False,
    _stacklevel: int = 1,
) -> tuple[Graph, tuple[int, int]]:
    """Like :func:`load`, and also return the version the file declares ``(major, minor)``: the
    msgpack format's, or for the JSON form the JSON document's."""
    if isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        read: Callable[[], tuple[Graph, tuple[int, int]]] = lambda: _load_path(label, limits, mmap)  # noqa: E731
    elif not callable(getattr(source, "read", None)):
        raise TypeError(f"load() takes a path or a binary stream, not {type(source).__name__}")
    else:
        label = _stream_label(source)
        read = lambda: _load_stream(source.read, limits)  # noqa: E731
    try:
        with keys.collecting() as unknown:
            result = read()
        if unknown and strict:
            raise keys.refusal(unknown)
    except GraphFileError as exc:  # FormatError is one
        raise type(exc)(one_line(f"{label}: {exc}")) from None
    if unknown:
        keys.warn(unknown, label, stacklevel=1 + _stacklevel)
    return result


def _stream_label(stream: BinaryIO) -> str:
    name = getattr(stream, "name", None)
    if name in ("<stdin>", 0):
        return "standard input"
    return name if isinstance(name, str) else "the stream"


def load_regular(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Like :func:`load` of a path, but only when what the path opens is a regular file: anything
    else (a FIFO, a device) is a :class:`GraphFileError` at once, never read or waited for (shell
    completion reads graphs this way). The open descriptor decides, so a FIFO swapped in for the
    file cannot slip through."""
    label = os.fspath(path)
    try:
        return _load_path(label, limits, regular_only=True)[0]
    except GraphFileError as exc:
        raise type(exc)(one_line(f"{label}: {exc}")) from None


def _load_path(
    path: str, limits: Limits, mapped: bool = False, regular_only: bool = False
) -> tuple[Graph, tuple[int, int]]:
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
            if regular_only:
                raise GraphFileError("not a regular file")
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
        raise FormatError(f"a FIFO with nothing writing to it (no data within {counted(seconds, 'second')})")


def _too_large(limit: int, field: str = "max_file_bytes") -> str:
    return f"it holds more than {counted(limit, 'byte', thousands=True)}, the limit (Limits.{field})"


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
            return _read(fastload.FileSource(fd, head, size), everything, limits)
        if kind == "json" and size > checked:
            _check_json_head(head)
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
    checked_head = False
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
            if not checked_head and len(data) > _HEAD and kind is not None:
                # what the first bytes rule out is refused before the rest is read
                checked_head = True
                if kind == "msgpack":
                    codec.check_head(data[:_HEAD], limit, limits, size_known=False)
                else:
                    _check_json_head(data[:_HEAD])
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
    if head[0] in MAP_FIRST_BYTES:
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


def _check_json_head(head: bytes | bytearray) -> None:
    """Raise what :func:`_read_json` of the whole file would, when its first bytes ``head`` show it
    already (invalid UTF-8, a syntax error: see :func:`jsonio.check_head`), before the rest is read."""
    from graphsvc.format import jsonio

    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if exc.end < len(head):  # not a character cut off at the end
            raise FormatError(f"the JSON text is not valid UTF-8 (at byte {exc.start})") from None
        text = head[: exc.start].decode("utf-8-sig")
    jsonio.check_head(text)


def _read_json(data: bytes | bytearray, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    from graphsvc.format import jsonio

    with gc_paused():  # a map per node's attributes: see graphsvc.collector
        found = jsonio.read_columns(data)  # straight from the bytes, where the document allows it
    if found is not None:
        graph, version = found
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FormatError(f"the JSON text is not valid UTF-8 (at byte {exc.start})") from None
        with gc_paused():
            graph, version = jsonio.read_objects(text)
        del text
    if graph.num_nodes > limits.max_nodes:
        raise FormatError(f"the graph has {counted(graph.num_nodes, 'node')}, over the limit {limits.max_nodes}")
    if len(graph.parent_indices) > limits.max_edges:
        raise FormatError(
            f"the graph has {counted(len(graph.parent_indices), 'edge')}, over the limit {limits.max_edges}"
        )
    check_text(graph, limits)  # msgpack's decoder checks its strings as it reads them
    return graph, version
