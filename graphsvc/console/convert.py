"""What ``graphsvc convert`` writes: a graph in the msgpack format or its readable JSON form, to a
file (atomically) or to standard output, and which form and file it chooses when not told.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphsvc.console import printing
from graphsvc.errors import UsageError

if TYPE_CHECKING:
    from graphsvc.graph import Graph

__all__ = ["FORMS", "OTHER", "form_of", "input_form", "target_of", "write"]

#: The form each file extension stands for, when convert's --to is not given.
FORMS = {".json": "json", ".msgpack": "msgpack", ".mpk": "msgpack", ".msgpk": "msgpack"}
#: The form convert writes when neither --to nor OUT's extension says: the one FILE is not in.
OTHER = {"json": "msgpack", "msgpack": "json"}


def form_of(out: Path | None, file: Path | None = None) -> str:
    """The form to write when ``--to`` is not given: the one ``out``'s extension stands for; with
    no ``out``, or ``-`` (standard output), the other form than ``file``'s (:func:`input_form`).
    A UsageError when ``out`` names a file without a known extension, or ``file``'s form cannot be
    told without consuming it (a FIFO)."""
    if out is not None and not printing.is_stdio(out):
        form = FORMS.get(out.suffix.lower())
        if form is None:
            raise UsageError(
                f"say which form to write: --to json or --to msgpack ({out} has no .json or .msgpack extension)"
            )
        return form
    source = None if file is None else input_form(file)
    if source is None:
        where = (
            "" if file is None else f" ({'standard input' if printing.is_stdio(file) else file} cannot be peeked at)"
        )
        raise UsageError(f"say which form to write: --to json or --to msgpack{where}")
    return OTHER[source]


def input_form(file: Path) -> str | None:
    """``"msgpack"`` or ``"json"``, from ``file``'s first byte as loading tells them apart (a msgpack
    map header; anything else is read as JSON), without consuming it: standard input is peeked at.
    ``"json"`` when there is no byte to read (a missing or empty file: loading it says what is
    wrong); None when the byte cannot be read without being lost (a FIFO, a device)."""
    import os
    import stat

    from graphsvc.format.layout import MAP_FIRST_BYTES

    try:
        if printing.is_stdio(file):
            head = _peek(sys.stdin.buffer)
            if head is None:
                return None
        elif not stat.S_ISREG(os.stat(file).st_mode):
            return None
        else:
            with open(file, "rb") as stream:
                head = stream.read(1)
    except (OSError, ValueError):
        return "json"
    return "msgpack" if head and head[0] in MAP_FIRST_BYTES else "json"


def _peek(stream: object) -> bytes | None:
    """The first byte ``stream`` would give, left in it (b"" at its end); None when it can do neither."""
    peek = getattr(stream, "peek", None)
    if callable(peek):
        return bytes(peek(1)[:1])
    seekable = getattr(stream, "seekable", None)
    if callable(seekable) and seekable():
        where = stream.tell()  # type: ignore[attr-defined]
        head = bytes(stream.read(1))  # type: ignore[attr-defined]
        stream.seek(where)  # type: ignore[attr-defined]
        return head
    return None


def target_of(file: Path, form: str, out: Path | None) -> Path:
    """Where to write ``file`` in ``form``: ``out``, else standard output for JSON and ``file``
    with ``.msgpack`` for msgpack. Refused (UsageError): overwriting the input, msgpack (binary) on
    a terminal, and msgpack with no file name to derive from (standard input)."""
    if out is not None:
        target = out
    elif form == "json":
        target = Path("-")
    elif printing.is_stdio(file):
        raise UsageError("reading standard input: say where to write with --out (- for standard output)")
    else:
        target = file.with_suffix(".msgpack")
    if not printing.is_stdio(target) and not printing.is_stdio(file) and target.resolve() == file.resolve():
        raise UsageError(f"refusing to overwrite the input {file}; give --out")
    if form == "msgpack" and printing.is_stdio(target) and sys.stdout.isatty():
        raise UsageError("msgpack is binary: not written to a terminal; give --out or redirect standard output")
    return target


def write(graph: Graph, form: str, target: Path, quiet: bool = False) -> None:
    """``graph`` in ``form`` (``json`` or ``msgpack``) to ``target`` (``-``: standard output), under
    a progress bar (none with ``quiet``); a file is written atomically and said on stderr."""
    from graphsvc import format as fmt
    from graphsvc.console.terminal import progress
    from graphsvc.format import jsonio

    if form == "msgpack" and not printing.is_stdio(target):
        with progress(f"writing {target}", quiet=quiet):
            fmt.save(graph, target)
        printing.wrote(target, graph.num_nodes)
        return
    if form == "msgpack":  # to standard output: msgpack's encoder gives views of the columns
        with progress(f"converting to {form}", quiet=quiet):
            printing.write_bytes(fmt.dumps(graph))
        return
    # JSON is written a chunk of nodes at a time (jsonio.chunks), never whole in memory; every check
    # that could refuse the graph is made before its first chunk, so a refused graph writes nothing
    with progress(f"converting to {form}", quiet=quiet):
        if printing.is_stdio(target):
            for chunk in jsonio.chunks(graph):
                printing.write_bytes(chunk)
            return
        from graphsvc.format.atomic import atomic_writer

        with atomic_writer(target, "wb") as stream:
            for chunk in jsonio.chunks(graph):
                stream.write(chunk)
    printing.wrote(target, graph.num_nodes)
