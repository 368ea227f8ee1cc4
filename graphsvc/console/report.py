"""The report of a replay (``graphsvc forward`` and ``backward``), as text or as one JSON object.

As text: the steps (``--steps``) and a blank line, the nodes in decreasing id order (a reverse
topological order), then where nan or inf first appeared and the ``--check`` lines. As ``--json``,
one object: ``output``, ``steps``, ``nodes``, ``nonfinite``, ``check``.

A :class:`graphsvc.replay.run.ReplayRun` holds its numbers as float64 columns or as one array per
node; :func:`cells` picks the writer of its nodes and steps for that container
(:class:`ColumnCells`: numbers right-aligned, each step's local derivatives; :class:`ArrayCells`:
summaries left-aligned, each step's norms). The findings and the checks read the same whichever
engine replayed; their ``--json`` keys follow the file: a graph that holds arrays says where in an
array (``index``, ``worst_abs_at``), a graph of scalars names nodes only (``worst_abs_node``), also
when an op given only by a VJP had the tensor engine replay it.

numpy, json and the tensor listings are imported by the functions that need them: a text report
of a graph of scalars imports neither json nor the tensor engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import typer

from graphsvc.console import printing

if TYPE_CHECKING:
    from pathlib import Path

    from graphsvc.graph import Graph
    from graphsvc.replay.compare import Comparison, Element, NonFinite
    from graphsvc.replay.run import ReplayRun
    from graphsvc.replay.step import Step

__all__ = [
    "ArrayCells",
    "ColumnCells",
    "cells",
    "check_item",
    "check_options",
    "check_stored",
    "comparison_line",
    "element",
    "nonfinite_item",
    "nonfinite_line",
    "print_report",
    "set_notes",
    "step_lines",
]


def check_options(
    check: bool, rtol: float | None, atol: float | None, as_json: bool, data: bool, write: Path | None = None
) -> None:
    """Refuse --rtol/--atol without --check or out of range, and --data without --json: options
    that would otherwise be taken and do nothing; and --write -, standard output (it holds the report)."""
    from graphsvc.errors import UsageError
    from graphsvc.replay.compare import tolerance_problem

    for option, value, what in (("--rtol", rtol, "relative"), ("--atol", atol, "absolute")):
        if value is None:
            continue
        if not check:
            raise UsageError(f"{option} goes with --check: it is the {what} tolerance of that comparison")
        problem = tolerance_problem(option, value)
        if problem is not None:
            raise UsageError(problem)
    if data and not as_json:
        raise UsageError("--data goes with --json: it adds every array's elements to the JSON")
    if write is not None and str(write) == "-":
        raise UsageError("--write -: standard output holds the listing; give a file name")


def check_stored(graph: Graph, backward: bool) -> None:
    """Refuse --check when ``graph`` stores nothing to compare with: no value of a computed node
    (forward), no gradients (``backward``)."""
    from graphsvc.errors import UsageError

    if not backward and not graph.has_computed_values:
        raise UsageError("--check: the file stores no value of a computed node to compare with")
    if backward and not graph.has_grads:
        raise UsageError("--check: the file stores no gradients to compare with")


def print_report(result: ReplayRun, as_json: bool, data: bool = False, quiet: bool = False) -> None:
    """Print what forward or backward found (``result``), as text or ``--json`` (``as_json``);
    ``data`` is --data, every array's elements in --json; ``quiet``: no progress bar. Whether the
    checks passed is ``result.ok``."""
    graph = result.graph
    writer = cells(result, data)
    if as_json:
        head: dict[str, Any] = {} if result.output is None else {"output": result.output}
        if result.steps is not None:
            head["steps"] = writer.step_items(result.steps)
        tail: dict[str, Any] = {"nonfinite": {what: nonfinite_item(graph, f) for what, f in result.nonfinite.items()}}
        if result.comparisons:
            tail["check"] = {c.what: check_item(graph, c) for c in result.comparisons}
        printing.print_json_listing(head, writer.json_objects(), graph.num_nodes, tail, quiet)
        return
    if result.steps:  # a chunk of steps at a time: their text is never all held at once
        steps = result.steps
        for start in range(0, len(steps), STEP_CHUNK):
            lines = step_lines(graph, steps[start : start + STEP_CHUNK], writer, start + 1)
            printing.echo_chunks(["\n".join(lines) + "\n"])
        typer.echo("")
    if printing.wants_table(graph.num_nodes):
        numbers = [("value", writer.align), *([("grad", writer.align)] if result.grads is not None else [])]
        printing.print_table([*printing.NODE_COLUMNS, *numbers], writer.rows())
    else:
        printing.echo_listing(writer.text(), graph.num_nodes, quiet)
    findings = [nonfinite_line(graph, found) for found in result.nonfinite.values() if found is not None]
    printing.echo_lines(findings + [comparison_line(graph, c) for c in result.comparisons])


def cells(result: ReplayRun, data: bool = False) -> ColumnCells | ArrayCells:
    """The writer of ``result``'s nodes and steps, for the container its numbers come in."""
    # The numbers' form (float64 columns or one array a node), not the engine, picks the writer. The
    # form follows the engine, though: a graph of scalars with an op given only by a VJP is replayed as
    # arrays, so its --steps show norms (``grad f64[] norm 2``) where other graphs of scalars show
    # local derivatives.
    return ArrayCells(result, data) if result.arrays else ColumnCells(result)


def element(graph: Graph, at: Element | None) -> str:
    """``name[2,3]``: a node and an index into its array (no index for a scalar); ``-`` for none."""
    from graphsvc.text import escape

    if at is None:
        return "-"
    node, index = at
    return escape(graph.label(node)) + (f"[{','.join(map(str, index))}]" if index else "")


def comparison_line(graph: Graph, c: Comparison) -> str:
    """A --check line: the tolerance used (each dtype's, :data:`graphsvc.replay.compare.DEFAULT_TOLERANCES`,
    unless given), how many nodes had nothing stored, the worst differences and where, the verdict."""
    from graphsvc.replay.compare import tolerance_text
    from graphsvc.text import counted

    verdict = "ok" if c.ok else f"{c.mismatches} beyond tolerance"
    noun = "gradient" if c.what == "grads" else "value"
    have = "has" if c.unstored == 1 else "have"
    missing = f"{c.unstored} of {counted(c.nodes, 'node')} {have} no {noun} to compare; " if c.unstored else ""
    within = f" ({tolerance_text(c.tolerances)})" if c.tolerances else ""
    return (
        f"check {c.what}{within}: {missing}worst abs diff {c.worst_abs!r} at {element(graph, c.worst_abs_at)}, "
        f"worst rel diff {c.worst_rel!r} at {element(graph, c.worst_rel_at)}: {verdict}"
    )


def check_item(graph: Graph, c: Comparison) -> dict[str, Any]:
    """A --check result in --json. A graph of scalars gives the worst nodes (``worst_abs_node``), a
    graph that holds arrays the worst elements, node and index (``worst_abs_at``)."""
    from graphsvc.format.jsonio import json_float

    item: dict[str, Any] = {
        "ok": c.ok,
        "mismatches": c.mismatches,
        "nodes": c.nodes,
        "unstored": c.unstored,
        "tolerance": {dtype: {"rtol": t.rtol, "atol": t.atol} for dtype, t in c.tolerances},
    }
    if not graph.is_tensor_graph:
        return item | {
            "worst_abs": json_float(c.worst_abs),
            "worst_abs_node": c.worst_abs_node,
            "worst_rel": json_float(c.worst_rel),
            "worst_rel_node": c.worst_rel_node,
        }

    def at(where: Element | None) -> list[Any] | None:
        return None if where is None else [where[0], list(where[1])]

    return item | {
        "worst_abs": json_float(c.worst_abs),
        "worst_abs_at": at(c.worst_abs_at),
        "worst_rel": json_float(c.worst_rel),
        "worst_rel_at": at(c.worst_rel_at),
    }


def nonfinite_item(graph: Graph, found: NonFinite | None) -> dict[str, Any] | None:
    """Where nan or inf first appeared, in --json (``index`` for a graph that holds arrays)."""
    from graphsvc.format.jsonio import json_float

    if found is None:
        return None
    node = found.node
    item: dict[str, Any] = {"node": node, "name": graph.names.get(node), "op": graph.op(node)}
    if graph.is_tensor_graph:
        item["index"] = list(found.index)
    return item | {"value": json_float(found.value), "count": found.count}


def nonfinite_line(graph: Graph, found: NonFinite) -> str:
    """Where nan or inf first appeared, as text: the node (and index into its array), its op, the
    number found there, and how many nodes hold one."""
    from graphsvc.text import counted, escape

    order = "first in the backward sweep" if found.what == "grads" else "first"
    where = element(graph, (found.node, found.index))
    return (
        f"nonfinite {found.what}: {order} at {where} (node {found.node}, {escape(graph.op(found.node))})"
        f" = {found.value!r}; {found.count} of {counted(graph.num_nodes, 'node')}"
    )


#: How many steps --steps writes at a time (their text, and for arrays their norms, worked out together).
STEP_CHUNK = 4096


def step_lines(graph: Graph, steps: Sequence[Step], writer: ColumnCells | ArrayCells, first: int = 1) -> list[str]:
    """--steps as text: each node of the backward pass with its gradient, then what it sends each
    parent; the steps numbered from ``first`` (a chunk of the pass)."""
    from graphsvc.collector import gc_paused
    from graphsvc.text import escape

    codes = graph.op_codes.tolist()  # a list: one index a step, not a numpy scalar
    tags = [escape(tag) for tag in graph.op_table]
    label = graph.label
    lines = []
    with gc_paused():  # lists and tuples a step, while the replay's arrays live: see graphsvc.collector
        for number, (step, (grad, parents)) in enumerate(zip(steps, writer.step_texts(steps), strict=True), first):
            node = step.node
            lines.append(f"step {number}: {escape(label(node))} ({tags[codes[node]]}) {grad}")
            lines += [f"  -> {escape(label(parent))}: {sent}" for parent, sent in parents]
    return lines


class ColumnCells:
    """The nodes of a replay held in float64 columns: values and gradients written by
    graphsvc.console.listing (in C where it is compiled), numbers right-aligned in a table; a step
    gives each parent's local derivative and what it adds."""

    align = "right"

    def __init__(self, result: ReplayRun) -> None:
        import numpy as np

        self.graph = result.graph
        self.values = result.values
        self.grads = result.grads
        self.nodes = np.arange(self.graph.num_nodes - 1, -1, -1)  # decreasing ids: a reverse topological order

    def text(self) -> Iterable[str]:
        from graphsvc.console import listing

        return listing.text(self.graph, self.nodes, self.values, self.grads)

    def rows(self) -> Sequence[Sequence[str]]:
        from graphsvc.console import listing

        return listing.all_rows(self.graph, self.nodes, self.values, self.grads)

    def json_objects(self) -> Iterable[str]:
        from graphsvc.console import listing

        return listing.json_objects(self.graph, self.nodes, self.values, self.grads)

    def step_texts(self, steps: Sequence[Step]) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each step's gradient and what it sends each parent, as --steps prints them."""
        return [
            (
                f"grad = {step.grad!r}",
                [(parent, f"local derivative {local!r}, adds {adds!r}") for parent, local, adds in step.contributions],
            )
            for step in steps
        ]

    def step_items(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        from graphsvc.format.jsonio import json_float

        return [
            {
                "node": step.node,
                "grad": json_float(step.grad),
                "contributions": [
                    {"parent": p, "local": json_float(d), "adds": json_float(c)} for p, d, c in step.contributions
                ],
            }
            for step in steps
        ]


class ArrayCells:
    """The nodes of a replay held one array per node: each array summarized
    (graphsvc.console.tensor_listing.summary: dtype, shape, mean, largest magnitude; min and max for
    integers), left-aligned in a table; in --json as tensor_listing.json_cell gives it (the same
    numbers), with every element when ``data``; a step gives the shape and norm of what it sends
    each parent. The numbers of a chunk of nodes are worked out together, not a call an array."""

    align = "left"

    def __init__(self, result: ReplayRun, data: bool = False) -> None:
        self.graph = result.graph
        self.values = result.values
        self.grads = result.grads
        self.data = data
        self.nodes = range(self.graph.num_nodes - 1, -1, -1)  # decreasing ids: a reverse topological order

    def text(self) -> Iterable[str]:
        from graphsvc.console import tensor_listing

        return tensor_listing.text(self.graph, self.nodes, self.values, self.grads)

    def rows(self) -> Sequence[Sequence[str]]:
        from graphsvc.console import tensor_listing

        chunks = tensor_listing.rows(self.graph, self.nodes, self.values, self.grads)
        return [row for chunk in chunks for row in chunk]

    def json_objects(self) -> Iterator[str]:
        from graphsvc.console import tensor_listing

        graph, values, grads = self.graph, self.values, self.grads
        if not self.data:
            yield from tensor_listing.json_objects(graph, self.nodes, values, grads)
            return
        separator = ""  # chunks after the first start with their comma (see printing.print_json_listing)
        for node in self.nodes:
            item = {
                "id": node,
                "name": graph.names.get(node),
                "op": graph.op(node),
                "parents": graph.parents(node),
                "value": tensor_listing.json_cell(values[node], self.data),
                "grad": None if grads is None else tensor_listing.json_cell(grads[node], self.data),
            }
            yield separator + printing.json_text(item)
            separator = ","

    @staticmethod
    def _step_norms(steps: Sequence[Step]) -> tuple[list[Any], list[float]]:
        """Every array of the steps (each step's gradient, then what each sends its parents, in
        order; None for no gradient) and their norms, worked out together."""
        from graphsvc.console.tensor_listing import norms

        arrays = [step.grad for step in steps] + [sent for step in steps for _, _, sent in step.contributions]
        return arrays, norms(arrays)

    def step_texts(self, steps: Sequence[Step]) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each step's gradient and what it sends each parent, as --steps prints them."""
        from graphsvc.console.tensor_listing import descriptions

        arrays, norms = self._step_norms(steps)
        shown = iter(
            [
                "no gradient" if array is None else f"{description} norm {norm:.6g}"
                for array, description, norm in zip(arrays, descriptions(arrays), norms, strict=True)
            ]
        )
        grads = [f"grad {next(shown)}" for _ in steps]
        return [
            (grad, [(parent, next(shown)) for parent, _, _ in step.contributions])
            for grad, step in zip(grads, steps, strict=True)
        ]

    def step_items(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        from graphsvc.collector import gc_paused

        with gc_paused():  # dicts a step: see graphsvc.collector
            return self._step_items(steps)

    def _step_items(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        from graphsvc.format.jsonio import json_float

        arrays, norms = self._step_norms(steps)
        numbers = iter([None if array is None else json_float(norm) for array, norm in zip(arrays, norms, strict=True)])
        grads = [
            {"dtype": str(step.grad.dtype), "shape": list(step.grad.shape), "norm": next(numbers)} for step in steps
        ]
        return [
            {
                "node": step.node,
                "grad": grad,
                "to": [{"parent": p, "norm": next(numbers)} for p, _, _ in step.contributions],
            }
            for grad, step in zip(grads, steps, strict=True)
        ]


def set_notes(graph: Graph, overrides: dict[int, Any]) -> list[str]:
    """A note (for standard error) for each ``--set`` that gives a tensor leaf another dtype or
    shape than the file's: allowed (a batch of another size), but a float64 array where float32 was
    turns the replay float64, a shape that does not fit fails later, at the first op that uses it,
    and an int64 array where floats were takes the gradients away (int64 nodes get none). An array
    for a leaf the file holds as a number is how a leaf becomes a tensor: no note, unless it is int64."""
    import numpy as np

    notes = []
    for node, value in overrides.items():
        old = graph.arrays.get(node)
        new = np.asarray(value)
        if old is None:
            if new.dtype != np.int64:
                continue
            old = np.asarray(graph.values[node])  # a number: float64
        if (old.dtype, old.shape) != (new.dtype, new.shape):
            from graphsvc.replay.arrays import describe
            from graphsvc.text import escape, one_line

            label = escape(graph.label(node))
            lost = ""
            if new.dtype == np.int64 and old.dtype != np.int64:
                lost = "; an int64 leaf gets no gradient, nor does what is computed from it alone"
            notes.append(one_line(f"Note: --set {label}: {describe(new)} replaces the file's {describe(old)}{lost}"))
    return notes
