"""Node listings, as the CLI prints them: each node as a row of text cells or as a JSON object.

A listing is made a chunk of :data:`CHUNK` nodes at a time, from the columns, so printing a graph of
millions of nodes costs a few microseconds a node and a steady amount of memory, whatever its size.

The cells of a node are its id, its name (``-`` when it has none), its op tag, its parents joined by
commas (``-`` when it has none) and, for a replay, its value and gradient: the shortest text that
reads back to the same float (``repr``; ``nan``, ``inf``, ``-inf``). Names and op tags come from the
file, so their cells are escaped (:func:`graphsvc.text.escape`): a tab, a newline or a terminal
escape sequence in a name shows as ``\\t``, ``\\n``, ``\\x1b``, a backslash as two, and no name can
add a row or a column.

The JSON object has the keys ``id``, ``name``, ``op``, ``parents`` and, for a replay, ``value`` and
``grad`` (null without gradients), exactly as ``json.dumps(..., separators=(",", ":"),
ensure_ascii=False)`` writes them, with nan and the infinities as the strings ``"nan"``, ``"inf"``,
``"-inf"``, then every character that the text cells escape and JSON would leave as it is (DEL,
the C1 controls, bidi, zero-width and other format characters, U+2028...) written as its JSON
escape (:func:`graphsvc.text.json_escaped`: ``\\u202e``): the same document to a JSON reader, and
nothing in it that draws as nothing, reorders text or drives a terminal.

:func:`text` and :func:`json_objects` write each chunk with the C extension ``graphsvc.native._ctext``
where it was built (well under a microsecond a node); :func:`reference_text` and
:func:`reference_json_objects` are the pure-Python originals, which run without it, and the tests
hold the two to the same bytes. Names and op tags are escaped in Python either way, by the one rule
in :mod:`graphsvc.text`: text cells before the C writer joins them, JSON after it writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from graphsvc.native import extension
from graphsvc.text import escape, json_escaped, needs_escape

if TYPE_CHECKING:  # only in annotations: the CLI's start-up does not import numpy.typing or json
    import numpy.typing as npt

    from graphsvc.graph import Graph

#: How many nodes one chunk of a listing holds.
CHUNK = 1 << 16


#: ``graphsvc.native._ctext``, or None where it is not in use (not built, or ``GRAPHSVC_NATIVE=0``):
#: the references below run.
_ctext = extension("text")

#: Do :func:`text` and :func:`json_objects` run the C extension (else the pure-Python references)?
NATIVE = _ctext is not None


def chunks(nodes: npt.ArrayLike) -> Iterator[npt.NDArray[np.int64]]:
    """The node ids ``nodes`` in chunks of :data:`CHUNK`."""
    ids = np.asarray(nodes, dtype=np.int64)
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]


def parent_texts(graph: Graph, ids: npt.NDArray[np.int64]) -> list[str]:
    """Each node's parents as ``"3,1"`` (empty text for none), gathered for the chunk at once."""
    starts = graph.parent_offsets[ids]
    counts = (graph.parent_offsets[ids + 1] - starts).tolist()
    total = sum(counts)
    if not total:
        return [""] * len(counts)
    # the slots of every node's parents, one after another: start of its run + position in it
    run_starts = np.repeat(starts - np.cumsum(counts) + counts, counts)
    flat = list(map(str, graph.parent_indices[run_starts + np.arange(total)].tolist()))
    texts = []
    position = 0
    for count in counts:
        texts.append(",".join(flat[position : position + count]))
        position += count
    return texts


def node_names(graph: Graph, ids: list[int]) -> list[str | None]:
    """Each node's name, ``None`` where it has none."""
    names = graph.names
    return [names.get(node) for node in ids] if names else [None] * len(ids)


def _name_cells(graph: Graph, ids: list[int]) -> list[str]:
    """The chunk's name cells, escaped; one regex pass over the whole chunk finds the (rare) chunk
    that needs it, so plain names cost no per-name call."""
    if not graph.names:
        return ["-"] * len(ids)
    cells = [name or "-" for name in node_names(graph, ids)]
    return list(map(escape, cells)) if needs_escape(cells) else cells


def node_columns(graph: Graph, ids: npt.NDArray[np.int64], tags: list[str] | None = None) -> list[list[str]]:
    """The cells of a chunk of nodes, a column at a time: ids, names, op tags, parents (names and
    op tags escaped; ``tags``: each op code's escaped tag, when the caller has them already)."""
    if tags is None:
        tags = list(map(escape, graph.op_table))
    id_list = ids.tolist()
    return [
        list(map(str, id_list)),
        _name_cells(graph, id_list),
        [tags[code] for code in graph.op_codes[ids].tolist()],
        [text or "-" for text in parent_texts(graph, ids)],
    ]


def rows(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> Iterator[list[tuple[str, ...]]]:
    """The text cells of ``nodes``, in their order, a chunk of rows at a time (names and op tags escaped)."""
    tags = list(map(escape, graph.op_table))
    for ids in chunks(nodes):
        columns = node_columns(graph, ids, tags)
        if values is not None:
            columns.append(list(map(repr, values[ids].tolist())))
        if grads is not None:
            columns.append(list(map(repr, grads[ids].tolist())))
        yield list(zip(*columns, strict=True))


def all_rows(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> list[tuple[str, ...]]:
    """Every row of :func:`rows` in one list (for a table, which is only drawn for a few thousand)."""
    return [row for chunk in rows(graph, nodes, values, grads) for row in chunk]


def reference_text(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> Iterator[str]:
    """:func:`text` in pure Python: the cells of :func:`rows` joined by tabs and newlines."""
    for chunk in rows(graph, nodes, values, grads):
        yield "\n".join(map("\t".join, chunk)) + "\n"


def _columns(
    graph: Graph, values: npt.NDArray[np.float64] | None, grads: npt.NDArray[np.float64] | None
) -> tuple[npt.NDArray[np.generic] | None, ...]:
    """The columns as the C extension takes them: C-contiguous, in the machine's byte order, of
    their own dtypes (the arrays themselves when they are, as a graph's always are)."""
    return (
        np.ascontiguousarray(graph.op_codes, dtype=np.uint16),
        np.ascontiguousarray(graph.parent_offsets, dtype=np.int64),
        np.ascontiguousarray(graph.parent_indices, dtype=np.int32),
        None if values is None else np.ascontiguousarray(values, dtype=np.float64),
        None if grads is None else np.ascontiguousarray(grads, dtype=np.float64),
    )


def text(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> Iterator[str]:
    """Tab-separated lines, a chunk at a time; every chunk ends with a newline."""
    if _ctext is None:
        yield from reference_text(graph, nodes, values, grads)
        return
    columns = _columns(graph, values, grads)
    tags = list(map(escape, graph.op_table))
    for ids in chunks(nodes):
        names = _name_cells(graph, ids.tolist()) if graph.names else None  # None: every name is -
        yield _ctext.text_chunk(np.ascontiguousarray(ids), *columns[:3], names, tags, *columns[3:])


def _json_numbers(numbers: npt.NDArray[np.float64]) -> list[str]:
    """Floats as JSON text: ``repr`` (as ``json.dumps`` writes them); nan and the infinities as strings."""
    texts = list(map(repr, numbers.tolist()))
    for i in np.flatnonzero(~np.isfinite(numbers)).tolist():
        texts[i] = f'"{texts[i]}"'  # repr gives nan, inf, -inf
    return texts


def _json_names(graph: Graph, ids: list[int]) -> list[str]:
    import json

    if not graph.names:
        return ["null"] * len(ids)
    return [json.dumps(name, ensure_ascii=False) for name in node_names(graph, ids)]


def reference_json_objects(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> Iterator[str]:
    """:func:`json_objects` in pure Python, each object an f-string of ``json.dumps`` texts."""
    import json

    tags = [json.dumps(tag, ensure_ascii=False) for tag in graph.op_table]
    separator = ""
    for ids in chunks(nodes):
        id_list = ids.tolist()
        names = _json_names(graph, id_list)
        ops = [tags[code] for code in graph.op_codes[ids].tolist()]
        parents = parent_texts(graph, ids)
        if values is None:
            objects = [
                f'{{"id":{i},"name":{name},"op":{op},"parents":[{p}]}}'
                for i, name, op, p in zip(id_list, names, ops, parents, strict=True)
            ]
        else:
            numbers = _json_numbers(values[ids])
            gradients = ["null"] * len(id_list) if grads is None else _json_numbers(grads[ids])
            objects = [
                f'{{"id":{i},"name":{name},"op":{op},"parents":[{p}],"value":{v},"grad":{g}}}'
                for i, name, op, p, v, g in zip(id_list, names, ops, parents, numbers, gradients, strict=True)
            ]
        yield json_escaped(separator + ",".join(objects))  # unprintable characters as JSON escapes, as C's
        separator = ","


def json_objects(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> Iterator[str]:
    """The nodes as JSON objects joined by commas, a chunk at a time (chunks after the first
    start with the comma that separates them from the one before): the inside of a JSON array.

    With ``values`` (a replay) each object also has ``value`` and ``grad``."""
    if _ctext is None:
        yield from reference_json_objects(graph, nodes, values, grads)
        return
    columns = _columns(graph, values, grads)
    tags = list(graph.op_table)  # C writes names and tags as JSON strings
    for number, ids in enumerate(chunks(nodes)):
        names = node_names(graph, ids.tolist()) if graph.names else None  # None: every name is null
        chunk = _ctext.json_chunk(np.ascontiguousarray(ids), *columns[:3], names, tags, *columns[3:], number > 0)
        yield json_escaped(chunk)  # unprintable characters (U+202E, a lone surrogate) as JSON escapes
