"""How the command line writes what it shows: one JSON document, a streamed node listing, lines,
an aligned table on a terminal or tab-separated text in a pipe.

Everything is written to standard output through ``typer.echo`` (or, for the megabytes of a
listing, straight to ``sys.stdout``; bytes through :func:`write_bytes`); notes and warnings go to
standard error. json is imported only by the functions that write JSON: a text listing never needs it.

Every write to standard output is whole or an error. Python's own ``sys.stdout`` is not: its buffer
takes a short write (a full disk, ``ulimit -f``) as done and drops the rest, so a command would exit
0 with a cut file. :func:`check_stdout` gives the command line a ``sys.stdout`` that writes until
every byte is out; the first write the system refuses raises :class:`OSError` (EFBIG, ENOSPC...),
which the CLI says as ``cannot write standard output`` and exit code 5. Python ignores SIGXFSZ at
start-up, and :func:`check_stdout` makes sure of it (a program embedding graphsvc's CLI may have
restored it): past ``ulimit -f`` a write fails with EFBIG instead of killing the process.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import typer

__all__ = [
    "NODE_COLUMNS",
    "check_stdout",
    "echo_chunks",
    "echo_lines",
    "echo_listing",
    "is_stdio",
    "json_text",
    "jsonable",
    "print_json",
    "print_json_listing",
    "print_rows",
    "print_table",
    "shown",
    "stdout_stream",
    "wants_table",
    "write_bytes",
    "wrote",
]

#: Table columns (header, justification) of a node line, as graphsvc.console.listing.rows gives them.
NODE_COLUMNS = (("id", "right"), ("name", "left"), ("op", "left"), ("parents", "left"))


def json_text(document: Any) -> str:
    """``document`` as one line of JSON: compact, nan and inf refused (see
    graphsvc.format.jsonio.json_float), lone surrogates escaped (graphsvc.text.json_escaped)."""
    import json  # here, not at the top: --help and the text listings never need it

    from graphsvc.text import json_escaped

    return json_escaped(json.dumps(document, indent=None, separators=(",", ":"), ensure_ascii=False, allow_nan=False))


def print_json(document: Any) -> None:
    typer.echo(json_text(document))


def jsonable(value: Any) -> Any:
    """Metadata as JSON can show it: nan and inf as strings, bin data as ``{"$bin": hex}``."""
    if isinstance(value, float):
        from graphsvc.format.jsonio import json_float  # here: metadata without floats needs neither it nor json

        return json_float(value)
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:  # a numpy scalar (numpy unimported)
        return jsonable(value.item())
    return value


def echo_chunks(chunks: Iterable[str]) -> None:
    """Write listing chunks as they are: typer.echo would scan each (megabytes) for terminal colour
    codes to strip, and a listing holds none (text from the file is escaped)."""
    stream = sys.stdout
    for chunk in chunks:
        stream.write(chunk)
    stream.flush()


def echo_listing(chunks: Iterable[str], nodes: int, quiet: bool) -> None:
    """A node listing, chunk by chunk, under a progress bar (printing millions of nodes to a file
    or a pipe takes seconds; none with ``quiet``)."""
    from graphsvc.console.terminal import progress
    from graphsvc.text import counted

    with progress(f"printing {counted(nodes, 'node', thousands=True)}", quiet=quiet):
        echo_chunks(chunks)


def print_json_listing(
    head: dict[str, Any], nodes: Iterable[str], count: int, tail: dict[str, Any], quiet: bool
) -> None:
    """``{**head, "nodes": [...], **tail}`` as :func:`print_json` prints it, the ``count`` nodes
    streamed (graphsvc.console.listing.json_objects: chunks after the first start with their comma)
    rather than held as one document."""
    opening = json_text(head)[:-1] + ("," if head else "") + '"nodes":['
    closing = "]" + ("," + json_text(tail)[1:] if tail else "}")
    echo_chunks([opening])
    echo_listing(nodes, count, quiet)
    typer.echo(closing)


def echo_lines(lines: list[str]) -> None:
    """One line each; nothing at all for none (an empty graph prints no blank line)."""
    if lines:
        typer.echo("\n".join(lines))


def wants_table(rows: int) -> bool:
    """Print an aligned table (stdout is a terminal) rather than plain tab-separated text (piped)?"""
    from graphsvc.console.terminal import wants_table as on_terminal

    return on_terminal(rows)


def print_table(columns: Iterable[tuple[str, str]], rows: Sequence[Sequence[str]], show_header: bool = True) -> None:
    from graphsvc.console.terminal import print_table as draw

    draw(list(columns), rows, show_header)


#: Lines :func:`print_rows` joins into one write when it writes plain lines.
ROWS_PER_WRITE = 4096


def print_rows(columns: Iterable[tuple[str, str]], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` as an aligned table under ``columns`` on a terminal, else one tab-separated line each."""
    if wants_table(len(rows)):
        print_table(columns, rows)
    else:  # a few thousand lines a write: one echo (and flush) a line took 20 µs, 20 s for a million
        for start in range(0, len(rows), ROWS_PER_WRITE):
            typer.echo("\n".join("\t".join(row) for row in rows[start : start + ROWS_PER_WRITE]))


class _WholeWrites(io.RawIOBase):
    """File descriptor ``fd`` as a raw stream whose ``write`` writes every byte (resuming short
    writes) or raises :class:`OSError`: never a short count a buffer above it could ignore.

    After a write failed, the rest is discarded: the command is failing with that error, and the
    bytes left in the buffer would only fail again when Python flushes it at exit."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._failed = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._failed:
            return len(view)
        done = 0
        try:
            while done < len(view):
                wrote = os.write(self._fd, view[done:])
                if wrote <= 0:  # POSIX allows it for no reason it gives: never loop on it
                    raise OSError(0, "the system wrote nothing")
                done += wrote
        except OSError:
            self._failed = True
            raise
        return done


def check_stdout() -> None:
    """Make ``sys.stdout`` (when it is file descriptor 1) write every byte or raise; see the module
    docstring, and ignore SIGXFSZ. The console command calls it before anything is printed."""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        with contextlib.suppress(ValueError):  # not the main thread: left as it is
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    stream = sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a test's capture, a closed stdout: left as it is
        return
    if fd != 1 or not isinstance(stream, io.TextIOWrapper):
        return
    stream.flush()
    sys.stdout = stdout_stream(fd, stream)


def stdout_stream(fd: int, like: Any) -> io.TextIOWrapper:
    """A text stream over file descriptor ``fd`` that writes every byte or raises (with ``like``'s
    encoding, errors and line buffering): standard output as :func:`check_stdout` makes it, and as
    :func:`graphsvc.pluginhost.keep_stdout_from_plugins` moves it to a private descriptor."""
    return io.TextIOWrapper(
        io.BufferedWriter(_WholeWrites(fd)),
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
        line_buffering=bool(getattr(like, "line_buffering", False)),
    )


def write_bytes(data: bytes) -> None:
    """``data`` to standard output, every byte or an :class:`OSError`; flushed."""
    stream = sys.stdout
    stream.flush()
    buffer = stream.buffer
    wrote = buffer.write(data)
    if wrote is not None and wrote < len(data):  # a stdout check_stdout did not replace
        raise OSError(0, f"only {wrote} of {len(data)} bytes were written")
    buffer.flush()


def is_stdio(path: Path | None) -> bool:
    """Is ``path`` ``-``: standard input or output?"""
    return path is not None and str(path) == "-"


def shown(path: Path) -> str:
    """A file as messages name it (``standard input`` for ``-``), not yet escaped."""
    return "standard input" if is_stdio(path) else str(path)


def wrote(path: Path, nodes: int) -> None:
    """What every command that writes a file says, on stderr: ``wrote OUT (N nodes)``."""
    from graphsvc.text import counted, one_line

    typer.echo(one_line(f"wrote {shown(path)} ({counted(nodes, 'node', thousands=True)})"), err=True)
