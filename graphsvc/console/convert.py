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

__all__ = ["FORMS", "form_of", "target_of", "write"]

#: The form each file extension stands for, when convert's --to is not given.
FORMS = {".json": "json", ".msgpack": "msgpack", ".mpk": "msgpack", ".msgpk": "msgpack"}


def form_of(out: Path | None) -> str:
    """The form ``--out`` stands for by its extension; a UsageError when it says none."""
    form = None if out is None else FORMS.get(out.suffix.lower())
    if form is None:
        where = "" if out is None else f" ({out} has no .json or .msgpack extension)"
        raise UsageError(f"say which form to write: --to json or --to msgpack{where}")
    return form


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
    with progress(f"converting to {form}", quiet=quiet):
        data = jsonio.dumps(graph).encode() if form == "json" else fmt.dumps(graph)
    if printing.is_stdio(target):
        printing.write_bytes(data)
        return
    from graphsvc.format.atomic import atomic_writer

    with atomic_writer(target, "wb") as stream:
        stream.write(data)
    printing.wrote(target, graph.num_nodes)
