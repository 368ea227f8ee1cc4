"""Pictures that show themselves in a notebook: :class:`Drawing`, behind ``graphsvc.draw``.

A drawing holds the picture ``graphsvc render`` draws (the same DOT text, the same node cap, the
same escaping: :mod:`graphsvc.console.render`) and shows as SVG in Jupyter (``_repr_svg_``).

The SVG comes from Graphviz's ``dot``, run when the picture is first shown. Where ``dot`` is
missing, the drawing says so in its text form (what a notebook shows when there is no SVG) rather
than failing the cell; :meth:`Drawing.save` and :attr:`Drawing.svg` raise the same
:class:`~graphsvc.errors.RenderError` as ``graphsvc render``.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphsvc.errors import RenderError, UsageError
from graphsvc.graph import Graph
from graphsvc.text import counted


class Drawing:
    """A picture of (part of) a graph: :attr:`dot` is its DOT text, :attr:`svg` the SVG ``dot``
    draws from it; Jupyter shows it through :meth:`_repr_svg_`."""

    def __init__(self, graph: Graph, nodes: list[int], dot: str) -> None:
        self.graph = graph
        #: The ids of the nodes drawn, in increasing order.
        self.nodes = nodes
        #: The DOT text (Graphviz's input).
        self.dot = dot
        self._svg: str | None = None

    @property
    def svg(self) -> str:
        """The SVG text, drawn by Graphviz ``dot`` the first time it is asked for."""
        if self._svg is None:
            from graphsvc.console.render import draw as run_dot

            self._svg = run_dot(self.dot, "svg").decode("utf-8")
        return self._svg

    def _repr_svg_(self) -> str | None:
        """What Jupyter shows: the SVG, or None (then the text form) where Graphviz cannot draw it."""
        try:
            return self.svg
        except RenderError:
            return None

    def __repr__(self) -> str:
        drawn = f"<Drawing of {counted(len(self.nodes), 'node', thousands=True)}"
        if self._svg is None:
            try:
                _ = self.svg
            except RenderError as error:
                return f"{drawn}: no picture, {error}>"
        return drawn + ">"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the picture to ``path`` (``.svg``, ``.png``, ``.pdf`` or ``.dot``, by its suffix),
        atomically, as ``graphsvc render`` does; return the path."""
        from graphsvc.console.render import FORMATS
        from graphsvc.console.render import draw as run_dot
        from graphsvc.format.atomic import atomic_writer

        path = Path(path)
        kind = path.suffix.lower().lstrip(".")
        if kind not in FORMATS:
            raise UsageError(f"cannot tell the format of {path}: the file name must end in .svg, .png, .pdf or .dot")
        if kind == "svg":
            data = self.svg.encode("utf-8")
        elif kind == "dot":
            data = self.dot.encode("utf-8")
        else:
            data = run_dot(self.dot, kind)
        with atomic_writer(path, "wb") as stream:
            stream.write(data)
        return path


def drawing(graph: Graph, around: int | str | None = None, depth: int | None = None) -> Drawing:
    """A :class:`Drawing` of ``graph``, or of the nodes at most ``depth`` edges (default 2) from
    ``around`` (a node id or name): the nodes ``graphsvc render`` would draw, and its DOT text.

    Raises :class:`~graphsvc.errors.TooLargeToDraw` for more nodes than one picture can show (then
    draw a neighbourhood, or look at the whole graph with ``graphsvc view``), and
    :class:`UsageError` for ``depth`` without ``around``."""
    from graphsvc.console.render import select, to_dot

    if depth is not None and around is None:
        raise UsageError("depth= goes with around=: it limits the picture to the nodes near that one")
    nodes = select(graph, around, 2 if depth is None else depth)
    center = None if around is None else graph.node_id(around)
    return Drawing(graph, nodes, to_dot(graph, nodes, highlight=center))
