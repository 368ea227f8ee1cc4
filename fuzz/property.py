"""The property both the atheris harness (fuzz_loads.py) and the hypothesis tests check.

``graphsvc.format.loads`` either returns a graph or raises a one-line ``FormatError``, never another
exception, and never one that the safety net of graphsvc/format/document.py caught; it decides
exactly as the general reader does (msgpack decoding the whole document), whether the fast reader
(which reads the columns of a document in any key order straight into arrays) took the bytes or not:
the same graph, or the same error; and a graph that loads survives what the CLI does with it: encode
and reload to the same bytes, both orderings, depth, forward and backward replay with the builtin
ops, where only a ``GraphsvcError`` may escape. A strict read (``strict=True``) gives the same graph,
or a one-line ``FormatError`` about an unknown key where the other read warned about one. It holds
for both versions: for a 2.0 file (a tensor graph) the fast reader also reads the data section on
its own and the general reader takes it from the decoded document, and they must agree on every
array (``dumps`` writes the arrays' bytes) or on the error.
"""

from __future__ import annotations

import warnings
from typing import Any

from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphsvcError, UnknownKeyWarning
from graphsvc.format import codec, document
from graphsvc.graph import Graph
from graphsvc.ops import OpRegistry
from graphsvc.replay import columns as replay
from graphsvc.topo import depth, reverse_topological_order


def check_input(data: bytes, registry: OpRegistry) -> None:
    """Raise AssertionError when ``data`` breaks the property."""
    general = general_outcome(data)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", UnknownKeyWarning)
            graph = fmt.loads(data)
    except FormatError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"not a one-line error: {message!r}"
        # document.py's safety net turns a bug into "invalid document: ..."; reaching it is a failure
        assert not message.startswith("invalid document: "), f"the safety net caught a bug: {message}"
        assert general == message, f"the general reader says {general!r}, loads() says {message!r}"
        return
    encoded = fmt.dumps(graph)
    assert general == encoded, "the general reader decodes another graph than loads()"
    try:
        assert fmt.dumps(fmt.loads(data, strict=True)) == encoded, "a strict read decodes another graph"
        assert not warned, "a strict read took a file the other read warned about"
    except FormatError as exc:
        message = str(exc)
        assert warned and "\n" not in message and message.endswith("a strict read refuses unknown keys"), message
    assert fmt.dumps(fmt.loads(encoded)) == encoded, "a loaded graph does not round-trip to the same bytes"
    for algorithm in ("dfs", "kahn"):
        reverse_topological_order(graph, None, algorithm)
    depth(graph)
    try:
        values = replay.forward(graph, registry)
        for output in graph.outputs[:1]:
            replay.backward(graph, registry, output, values)
    except GraphsvcError:
        pass


def general_outcome(data: bytes) -> bytes | str:
    """What the general reader makes of ``data``: the graph's canonical bytes, or the error's text."""
    try:
        doc = codec.decode(data, fmt.DEFAULT_LIMITS)
        return fmt.dumps(document.validate(doc, fmt.DEFAULT_LIMITS)[0])
    except FormatError as exc:
        return str(exc)


def described(graph: Graph) -> tuple[Any, ...]:
    """Everything a graph holds, types and bits included (1 and 1.0 differ, so do nan's bits)."""
    columns = tuple(
        None if column is None else (column.dtype.str, column.tobytes())
        for column in (graph.op_codes, graph.parent_offsets, graph.parent_indices, graph.values, graph.grads)
    )
    arrays = tuple(
        (node, a.dtype.str, a.shape, a.tobytes())
        for table in (graph.arrays, graph.grad_arrays)
        for node, a in table.items()
    )
    texts = repr((graph.op_table, graph.names, graph.attrs, graph.outputs, graph.metadata, graph.op_sources))
    return columns, arrays, texts
