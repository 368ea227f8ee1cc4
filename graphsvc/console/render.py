"""Draw a graph: Graphviz DOT text, and SVG, PNG or PDF through the Graphviz ``dot`` program.

The picture is micrograd's ``draw_dot``, left to right: every value node is a record
``name | data VALUE | grad GRAD``, and every node computed by an op gets a small node of its own
holding the op's tag (and attributes), with an edge from each input to the op node and one from the
op node to the value it produces. Inputs of an op with two or more of them are numbered on their
edges, since graphsvc keeps parent order (``a - b`` is not ``b - a``). Numbers are shown with six
significant digits (``%.6g``); a graph without gradients shows ``grad -``, and one whose file holds
no computed value (it was never replayed) shows ``data -`` for each node computed by an op.

Output is deterministic: nodes in id order, edges in parent-slot order, no addresses.

Large graphs: one picture holds at most :data:`MAX_RENDER_NODES` value nodes and
:data:`MAX_RENDER_EDGES` edges between them (``dot`` needs minutes, and the picture is unreadable,
well before that), and ``dot`` runs for at most :data:`DOT_TIMEOUT` seconds. Above that, draw the
neighbourhood of one node with :func:`neighbourhood` (``--around NODE --depth K``): every node at
most K edges away, following edges either way. An op whose inputs are not all drawn shows ``+N``
for the hidden ones.

``dot`` runs as a child process in a process group of its own, and is killed (the whole group) on
every way out of :func:`draw`: an error, a timeout, Ctrl-C (KeyboardInterrupt) and SIGTERM (turned
into an exit while dot runs), so no ``dot`` is left running.

DOT text is written here, by hand; the ``graphviz`` Python package is imported only to run ``dot``
for the image formats.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from graphsvc.errors import RenderError, TooLargeToDraw, UsageError
from graphsvc.graph import LEAF_TAGS, Graph
from graphsvc.text import counted, escape, one_line

#: The most value nodes one picture may hold; above it, pick a part with :func:`neighbourhood`.
MAX_RENDER_NODES = 2000
#: The most edges (parent to child, both drawn) one picture may hold: ``dot``'s time grows far faster
#: with edges than with nodes. Measured with Graphviz 2.43 (one core, SVG): 1,000 nodes with 2,000
#: edges each to a nearby node took 18 s, 500 nodes with 2,000 edges 37 s, 2,000 nodes with 4,000
#: edges over 90 s; 200 nodes with 600 random edges took 11 s, with 1,000 over 60 s.
MAX_RENDER_EDGES = 2000
#: Seconds ``dot`` may run before it is stopped (a graph within both caps whose layout is still slow).
DOT_TIMEOUT = 120.0
#: Output formats, by file suffix: ``dot`` text, or an image that Graphviz draws.
FORMATS = ("svg", "png", "pdf", "dot")
#: Names longer than this are shortened in the picture.
MAX_LABEL_CHARS = 40

#: What to do when the ``dot`` program is missing, and when the Python package is (each message names
#: only what is missing).
DOT_HINT = (
    "install Graphviz: `apt-get install graphviz` (Debian, Ubuntu) or `brew install graphviz` (macOS); "
    "or write a .dot file, which needs neither"
)
PACKAGE_HINT = "install it: `pip install graphviz`; or write a .dot file, which needs neither"


def neighbourhood(graph: Graph, center: int, depth: int, limit: int | None = MAX_RENDER_NODES) -> list[int]:
    """Ids (increasing) of the nodes at most ``depth`` edges from ``center``, edges followed either way.

    A breadth-first search with an explicit frontier, never recursion. Raises :class:`UsageError`
    when ``depth`` is negative or the neighbourhood holds more than ``limit`` nodes (``None``: any).
    """
    if depth < 0:
        raise UsageError(f"depth must be 0 or more, not {depth}")
    center = graph.node_id(center)
    offsets = graph.parent_offsets
    parents = graph.parent_indices
    # Children as CSR, built once: child_offsets[p]..child_offsets[p+1] index the children of p.
    child_of_edge = graph.child_ids()
    by_parent = np.argsort(parents, kind="stable")
    children = child_of_edge[by_parent]
    child_offsets = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(parents, minlength=graph.num_nodes), out=child_offsets[1:])
    seen = {center}
    frontier = [center]
    for _ in range(depth):
        found: list[int] = []
        for node in frontier:
            near = parents[offsets[node] : offsets[node + 1]].tolist()
            near += children[child_offsets[node] : child_offsets[node + 1]].tolist()
            for other in near:
                if other not in seen:
                    seen.add(other)
                    found.append(other)
            if limit is not None and len(seen) > limit:
                raise TooLargeToDraw(
                    f"the neighbourhood of {graph.label(center)} within {counted(depth, 'edge')} holds more than "
                    f"{counted(limit, 'node')}, more than one picture can show",
                    graph.label(center),
                )
        if not found:
            break
        frontier = found
    return sorted(seen)


def select(
    graph: Graph, around: int | str | None = None, depth: int = 2, limit: int | None = MAX_RENDER_NODES
) -> list[int]:
    """The nodes to draw: the whole graph, or the neighbourhood of ``around``; refuse more than
    ``limit`` (``None``: no limit, for DOT text that no Graphviz has to lay out)."""
    if around is not None:
        nodes = neighbourhood(graph, graph.node_id(around), depth, limit)
    else:
        if limit is not None and graph.num_nodes > limit:
            raise TooLargeToDraw(
                f"the graph has {counted(graph.num_nodes, 'node')}, more than one picture can show ({limit})", None
            )
        nodes = list(range(graph.num_nodes))
    if limit is not None:
        edges = edges_between(graph, nodes)
        if edges > MAX_RENDER_EDGES:
            what = (
                f"the neighbourhood of {graph.label(graph.node_id(around))} within {counted(depth, 'edge')}"
                if around is not None
                else "the graph"
            )
            raise TooLargeToDraw(
                f"{what} has {counted(len(nodes), 'node', thousands=True)} and "
                f"{counted(edges, 'edge', thousands=True)}, more edges than one picture can show "
                f"({MAX_RENDER_EDGES:,}: Graphviz would take minutes)",
                None if around is None else graph.label(graph.node_id(around)),
            )
    return nodes


def edges_between(graph: Graph, nodes: Sequence[int]) -> int:
    """How many edges of ``graph`` join two of ``nodes``: the edges a picture of them draws."""
    if len(nodes) == graph.num_nodes:
        return graph.num_edges
    chosen = np.zeros(graph.num_nodes, dtype=bool)
    chosen[np.asarray(nodes, dtype=np.int64)] = True
    return int(np.count_nonzero(chosen[graph.parent_indices] & chosen[graph.child_ids()]))


def to_dot(graph: Graph, nodes: Sequence[int] | None = None, highlight: int | None = None) -> str:
    """DOT text for ``nodes`` (default: all) of ``graph``, drawn as micrograd's ``draw_dot`` does.

    ``highlight`` (a node id) is drawn bold, as the centre of a neighbourhood.
    """
    chosen = list(range(graph.num_nodes)) if nodes is None else sorted(set(nodes))
    drawn = set(chosen)
    values = graph.values.tolist()
    # A file that holds no computed value (never replayed: nan in the column means none) draws them
    # as `-`, as the listings say a value the file does not hold; a leaf's value is its own, nan too.
    computed_held = graph.has_computed_values
    grads = None if graph.grads is None else graph.grads.tolist()
    lines = [
        "digraph graphsvc {",
        "\tgraph [rankdir=LR]",
        '\tnode [fontname="Helvetica" fontsize=11]',
        '\tedge [fontname="Helvetica" fontsize=9]',
    ]
    edges: list[str] = []
    for node in chosen:
        grad = _cell(graph.grad_arrays.get(node), None if grads is None else grads[node])
        held = computed_held or graph.op(node) in LEAF_TAGS
        data = _cell(graph.arrays.get(node), values[node] if held else None)
        record = f"{{ {_record_text(graph.label(node))} | data {data} | grad {grad} }}"
        style = " style=bold penwidth=2" if node == highlight else ""
        lines.append(f'\tv{node} [label="{record}" shape=record{style}]')
        node_parents = graph.parents(node)
        if not node_parents:
            continue
        lines.append(f'\to{node} [label="{_quoted(_op_text(graph, node))}" shape=ellipse]')
        edges.append(f"\to{node} -> v{node}")
        numbered = len(node_parents) > 1
        hidden = 0
        for slot, parent in enumerate(node_parents):
            if parent not in drawn:
                hidden += 1
                continue
            edges.append(f'\tv{parent} -> o{node} [headlabel="{slot}"]' if numbered else f"\tv{parent} -> o{node}")
        if hidden:
            lines.append(f'\th{node} [label="+{hidden}" shape=plaintext]')
            edges.append(f"\th{node} -> o{node} [style=dashed]")
    lines.extend(edges)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(
    graph: Graph,
    path: str | os.PathLike[str],
    around: int | str | None = None,
    depth: int = 2,
    limit: int = MAX_RENDER_NODES,
) -> int:
    """Draw ``graph`` (or the neighbourhood of ``around``) to ``path``, atomically; return the nodes drawn.

    The format comes from the suffix: ``.svg``, ``.png``, ``.pdf`` (through Graphviz) or ``.dot``.
    Raises :class:`UsageError` for another suffix or too many nodes, :class:`RenderError` when
    Graphviz is missing or fails, :class:`~graphsvc.errors.OutputError` when ``path`` cannot be written (it names
    a device, FIFO, socket or directory, or its folder is missing); then nothing is written.
    """
    from graphsvc.format.atomic import atomic_writer

    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    if kind not in FORMATS:
        raise UsageError(f"cannot tell the format of {path}: the file name must end in .svg, .png, .pdf or .dot")
    nodes = select(graph, around, depth, None if kind == "dot" else limit)  # DOT text: dot never runs
    center = None if around is None else graph.node_id(around)
    text = to_dot(graph, nodes, highlight=center)
    # The writer checks the target (a regular file or none; never a device, FIFO or directory)
    # before Graphviz runs, and the file appears only once whole.
    with atomic_writer(path, "wb") as stream:
        stream.write(text.encode("utf-8") if kind == "dot" else draw(text, kind))
    return len(nodes)


def draw(dot_text: str, kind: str, timeout: float | None = None) -> bytes:
    """Run Graphviz ``dot`` on ``dot_text`` and return the image bytes (``kind``: svg, png or pdf).

    ``dot`` runs in a process group of its own and is killed, with anything it started, on every way
    out: an error, ``timeout`` seconds (default :data:`DOT_TIMEOUT`; a :class:`RenderError`),
    KeyboardInterrupt, and SIGTERM, which exits (code 143) once dot is gone."""
    try:
        import graphviz  # noqa: F401  (graphsvc's dependency for pictures; dot itself is run here)
    except ImportError:
        raise RenderError(f"drawing .{kind} needs the graphviz Python package; {PACKAGE_HINT}") from None
    import shutil

    program = shutil.which("dot")
    if program is None:
        raise RenderError(f"drawing .{kind} needs the Graphviz `dot` program, which is not on PATH; {DOT_HINT}")
    limit = DOT_TIMEOUT if timeout is None else timeout
    process: subprocess.Popen[bytes] | None = None
    with _terminate_as_exit():
        try:
            process = _start(program, kind)
            out, err = process.communicate(dot_text.encode("utf-8"), timeout=limit)
        except subprocess.TimeoutExpired:
            raise RenderError(
                f"Graphviz dot did not finish drawing .{kind} within {counted(limit, 'second')}; draw a part "
                "of the graph (the neighbourhood of one node), or write a .dot file and run dot yourself"
            ) from None
        finally:
            if process is not None:
                _kill(process)
    assert process is not None  # started, or _start raised
    if process.returncode != 0:
        detail = err.decode("utf-8", "replace").strip().splitlines()
        raise RenderError(f"Graphviz dot failed: {one_line(detail[-1]) if detail else f'exit {process.returncode}'}")
    return out


def _start(program: str, kind: str) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            [program, f"-T{kind}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: killed whole, and Ctrl-C is graphsvc's to handle
        )
    except OSError as exc:
        raise RenderError(f"cannot run Graphviz dot: {one_line(exc.strerror or str(exc))}") from None


def _kill(process: subprocess.Popen[bytes]) -> None:
    """End ``process`` and its process group if still running, and reap it (no zombie)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended in between
            pass
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    process.wait()


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While the block runs, SIGTERM raises SystemExit(143) instead of ending Python at once, so
    ``finally`` blocks (killing dot) run; only in the main thread, where handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- label text --------------------------------------------------------------------------------
def depth_of(around: str | None, depth: int | None) -> int:
    """``render --depth`` (default 2); a UsageError when it is given without ``--around`` or below 0."""
    if depth is not None and around is None:
        raise UsageError("--depth goes with --around NODE: it limits the picture to the nodes near that one")
    if depth is not None and depth < 0:
        raise UsageError(f"--depth must be 0 or more, not {depth}")
    return 2 if depth is None else depth


def picture(graph: Graph, out: Path, around: str | None, depth: int, quiet: bool = False) -> None:
    """``graphsvc render``'s output: the DOT text of :func:`select`'s nodes on standard output for
    ``out`` ``-`` (any size: dot is not run here), else :func:`render` to ``out`` under a progress
    bar (none with ``quiet``), said on stderr."""
    import typer

    from graphsvc.console import printing
    from graphsvc.console.terminal import progress

    if printing.is_stdio(out):  # the DOT text, for a pipe into dot or another tool
        nodes = select(graph, around, depth, None)
        typer.echo(to_dot(graph, nodes, None if around is None else graph.node_id(around)), nl=False)
        return
    with progress(f"drawing {out}", quiet=quiet):
        drawn = render(graph, out, around=around, depth=depth)
    printing.wrote(out, drawn)


def _number(x: float) -> str:
    return f"{x:.6g}"


def _cell(array: np.ndarray | None, number: float | None) -> str:
    """A value or gradient in a box: a tensor node's dtype and shape (``f32[128,10]``; a 0-d
    array's number after them), a scalar's number, ``-`` for none."""
    if array is not None:
        from graphsvc.replay.arrays import describe

        number_text = f" {_number(float(array))}" if array.ndim == 0 else ""
        return _record_text(describe(array) + number_text)
    return "-" if number is None else _number(number)


def _op_text(graph: Graph, node: int) -> str:
    attrs = graph.attrs.get(node)
    if not attrs:
        return graph.op(node)
    shown = ", ".join(f"{key}={_number(v) if isinstance(v, float) else v}" for key, v in sorted(attrs.items()))
    return f"{graph.op(node)} {_cut(shown)}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


def _shorten(text: str) -> str:
    """Text from the file as a label shows it: cut, then escaped as the listings escape it
    (:func:`graphsvc.text.escape`: ``\\u200b``, not a character that draws as nothing)."""
    return escape(_cut(text))


def _quoted(text: str) -> str:
    """Text inside a DOT double-quoted string."""
    return _shorten(text).replace("\\", "\\\\").replace('"', '\\"')


def _record_text(text: str) -> str:
    """Text inside one field of a record label: the record's own syntax characters escaped too."""
    out = []
    for ch in _shorten(text):
        if ch in '\\"{}|<> ':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)
