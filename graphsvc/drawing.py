"""``graphsvc.draw``: a picture of a graph for a notebook, as micrograd's ``draw_dot`` is.

``graphsvc.draw(loss)`` in a Jupyter cell shows ``loss``'s graph as SVG: each value with its name,
data and grad, each op a node of its own (:mod:`graphsvc.console.render` draws it, as ``graphsvc
render`` does). It takes a :class:`~graphsvc.graph.Graph`, a graphsvc :class:`~graphsvc.value.Value`
(the graph its expression built) or a micrograd ``Value``.
"""

from __future__ import annotations

from typing import Any

from graphsvc.console.notebook import Drawing, drawing
from graphsvc.errors import UsageError
from graphsvc.graph import Graph


def draw(what: Any, around: int | str | None = None, depth: int | None = None) -> Drawing:
    """A :class:`~graphsvc.console.notebook.Drawing` of ``what`` (a Graph, a graphsvc Value or a
    micrograd Value), or of the nodes at most ``depth`` edges (default 2) from ``around`` (a node id
    or name). Graphs of more than 2,000 nodes are drawn a neighbourhood at a time (``graphsvc view``
    shows a graph of any size)."""
    from graphsvc.value import Value, trace

    if isinstance(what, Graph):
        graph = what
    elif isinstance(what, Value):
        graph = trace(what)
    elif hasattr(what, "_prev") and hasattr(what, "data") and hasattr(what, "_op"):
        from graphsvc.micrograd import from_micrograd

        graph = from_micrograd(what)
    else:
        raise UsageError(f"draw() takes a Graph, a graphsvc Value or a micrograd Value, not {type(what).__name__}")
    return drawing(graph, around, depth)
