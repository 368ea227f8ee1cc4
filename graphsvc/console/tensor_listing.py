"""Listings of replayed tensor graphs, a chunk of nodes at a time: each array's summary, its
``--json`` cell and the norms of ``--steps``, for many arrays at once.

:func:`summary`, :func:`json_cell` and :func:`norm` look at one array; called once a node, numpy's
overhead a call made a listing of a million small arrays cost about 200 µs a node. Here the arrays
are grouped by dtype and shape (:class:`graphsvc.replay.compare.ArrayGroups`, which also finds the
nan and inf of a replay), a group's elements stacked into one matrix, an array a row, and each
statistic is one reduction along the rows; the numbers are then written as the one-array functions write them, so
the text is the same, byte for byte (tests/console/test_tensor_listing.py holds the two to it).

The same bits, not only the same text: a row's sum is numpy's pairwise sum of the same elements in
the same order as the array's own sum. Two kinds of array keep the one-array functions, where that
would not hold: one that is not C-contiguous (numpy sums it in its memory order), and one of more
than ``np.getbufsize()`` elements (numpy's float64 sum of a float32 array adds up buffers of that
many cast elements, a sum a buffer). Their own arithmetic outweighs a call's overhead anyway.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphsvc.collector import gc_paused
from graphsvc.console import listing
from graphsvc.format.jsonio import json_float
from graphsvc.graph import FLOAT_DTYPE, Graph
from graphsvc.replay.arrays import describe
from graphsvc.replay.compare import ArrayGroups
from graphsvc.text import escape, json_escaped

__all__ = [
    "descriptions",
    "json_cell",
    "json_cells",
    "json_objects",
    "node_cells",
    "norm",
    "norms",
    "rows",
    "summaries",
    "summary",
    "text",
]

Arrays = Sequence[np.ndarray | None]

_INDEX_DTYPE = np.dtype(np.int64)


def _means(matrix: np.ndarray) -> list[float]:
    """``np.mean(row, dtype=np.float64)`` of each row (the sum cast first: the same pairwise sum)."""
    return (np.add.reduce(matrix.astype(np.float64), axis=1) / matrix.shape[1]).tolist()


def _largest(matrix: np.ndarray) -> list[float]:
    """``np.max(np.abs(row))`` of each row, in the row's dtype (as :func:`summary` takes it)."""
    return np.abs(matrix).max(axis=1).tolist()


def summaries(arrays: Arrays, gradient: bool = False) -> list[str]:
    """:func:`summary` of each array (``-`` for ``None``, as a listing shows it)."""
    cells = ["-"] * len(arrays)
    groups = ArrayGroups(arrays)
    bound = "max|g|=" if gradient else "max|x|="
    with np.errstate(all="ignore"):
        for dtype, shape, batch, matrix in groups.stacked(arrays):
            texts: Sequence[str]
            if not shape and dtype == FLOAT_DTYPE:  # a float64 number: as the scalar listing writes it
                texts = list(map(repr, matrix[:, 0].tolist()))
            else:
                head = describe(matrix[0].reshape(shape))
                if not shape:  # one number, as numpy prints its scalar
                    texts = [f"{head} {x!s}" for x in matrix[:, 0]]
                elif dtype == _INDEX_DTYPE:
                    lows, highs = matrix.min(axis=1).tolist(), matrix.max(axis=1).tolist()
                    texts = [f"{head} min={lo} max={hi}" for lo, hi in zip(lows, highs, strict=True)]
                else:
                    means, largest = _means(matrix), _largest(matrix)
                    texts = [f"{head} mean={m:.6g} {bound}{x:.6g}" for m, x in zip(means, largest, strict=True)]
            for position, cell in zip(batch, texts, strict=True):
                cells[position] = cell
    for position in groups.alone:
        array = arrays[position]
        assert array is not None
        cells[position] = summary(array, gradient)
    return cells


def _json_numbers(numbers: list[float]) -> list[str]:
    """Floats as ``json.dumps`` writes :func:`graphsvc.format.jsonio.json_float` of them: ``repr``, nan
    and the infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    return [repr(x) if math.isfinite(x) else f'"{json_float(x)}"' for x in numbers]


def json_cells(arrays: Arrays) -> list[str]:
    """The JSON text of :func:`json_cell` of each array, without its elements
    (``null`` for ``None``), as ``json.dumps(..., separators=(",", ":"))`` writes it."""
    cells = ["null"] * len(arrays)
    groups = ArrayGroups(arrays)
    with np.errstate(all="ignore"):
        for dtype, shape, batch, matrix in groups.stacked(arrays):
            if not shape and dtype == FLOAT_DTYPE:
                texts = _json_numbers(matrix[:, 0].tolist())
            else:
                head = f'{{"dtype":"{dtype}","shape":[{",".join(map(str, shape))}],'
                if dtype == _INDEX_DTYPE:
                    lows, highs = matrix.min(axis=1).tolist(), matrix.max(axis=1).tolist()
                    texts = [f'{head}"min":{lo},"max":{hi}}}' for lo, hi in zip(lows, highs, strict=True)]
                else:
                    means, largest = _json_numbers(_means(matrix)), _json_numbers(_largest(matrix))
                    texts = [f'{head}"mean":{m},"max_abs":{x}}}' for m, x in zip(means, largest, strict=True)]
            for position, cell in zip(batch, texts, strict=True):
                cells[position] = cell
    for position in groups.alone:
        cells[position] = _json_text(json_cell(arrays[position], data=False))
    return cells


def _json_text(document: object) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def norms(arrays: Arrays) -> list[float]:
    """:func:`norm` of each array (nan for ``None``)."""
    result = [math.nan] * len(arrays)
    groups = ArrayGroups(arrays)
    with np.errstate(all="ignore"):
        for _, _, batch, matrix in groups.stacked(arrays):
            sums = np.add.reduce(np.square(matrix.astype(np.float64)), axis=1)
            for position, value in zip(batch, np.sqrt(sums).tolist(), strict=True):
                result[position] = value
    for position in groups.alone:
        array = arrays[position]
        assert array is not None
        result[position] = norm(array)
    return result


def descriptions(arrays: Arrays) -> list[str | None]:
    """:func:`graphsvc.replay.arrays.describe` of each array (``None`` for ``None``), once a dtype and shape."""
    seen: dict[tuple[np.dtype, tuple[int, ...]], str] = {}
    result: list[str | None] = []
    for array in arrays:
        if array is None:
            result.append(None)
            continue
        key = (array.dtype, array.shape)
        text = seen.get(key)
        if text is None:
            text = seen[key] = describe(array)
        result.append(text)
    return result


# -- one array at a time: what the batched functions above are held to -------------------------------
def summary(array: np.ndarray, gradient: bool = False) -> str:
    """One short cell for a listing: ``f32[128,10] mean=0.0123 max|x|=1.5`` (``max|g|`` for a
    gradient; ``min``/``max`` for integers); a 0-d array is its dtype and number (``f32[] 3.5``),
    a float64 one the ``repr`` of the float, as scalar nodes are listed."""
    if array.ndim == 0 and array.dtype == FLOAT_DTYPE:
        return repr(float(array))
    head = describe(array)
    if array.ndim == 0:  # one number: shown as numpy prints it (shortest for its dtype)
        return f"{head} {array[()]!s}"
    if array.size == 0:
        return head
    if array.dtype == _INDEX_DTYPE:
        return f"{head} min={int(array.min())} max={int(array.max())}"
    with np.errstate(all="ignore"):
        mean = float(np.mean(array, dtype=np.float64))
        largest = float(np.max(np.abs(array)))
    return f"{head} mean={mean:.6g} max|{'g' if gradient else 'x'}|={largest:.6g}"


def norm(array: np.ndarray) -> float:
    """The Euclidean norm of all elements, in float64."""
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.sum(np.square(array, dtype=np.float64))))


def node_cells(graph: Graph, node: int, values: Arrays, grads: Arrays | None) -> list[str]:
    """A listing row of a tensor graph: id, name, op, parents (as the scalar listing writes them),
    then the value's :func:`summary` and, with gradients, the gradient's (``-`` for none)."""
    parents = ",".join(map(str, graph.parents(node))) or "-"
    name = graph.names.get(node)
    cells = [str(node), "-" if name is None else escape(name), escape(graph.op(node)), parents]
    value = values[node]
    cells.append("-" if value is None else summary(value))
    if grads is not None:
        grad = grads[node]
        cells.append("-" if grad is None else summary(grad, gradient=True))
    return cells


def json_cell(array: np.ndarray | None, data: bool) -> Any:
    """A value or gradient in a ``--json`` listing, what :func:`summary` shows: a float for a float64
    scalar (nan and the infinities as strings), else ``{"dtype", "shape", "mean", "max_abs"}``
    (``"min"`` and ``"max"`` for integers; neither for an empty array) and, with ``data``,
    ``"data"`` as nested lists."""
    if array is None:
        return None
    if array.ndim == 0 and array.dtype == FLOAT_DTYPE:
        return json_float(float(array))
    cell: dict[str, Any] = {"dtype": str(array.dtype), "shape": list(array.shape)}
    if array.size and array.dtype == _INDEX_DTYPE:
        cell["min"], cell["max"] = int(array.min()), int(array.max())
    elif array.size:
        with np.errstate(all="ignore"):
            cell["mean"] = json_float(float(np.mean(array, dtype=np.float64)))
            cell["max_abs"] = json_float(float(np.max(np.abs(array))))
    if data:
        cell["data"] = _json_data(array)
    return cell


def _json_data(array: np.ndarray) -> Any:
    if array.dtype == _INDEX_DTYPE or array.size == 0:
        return array.tolist()
    flat = [json_float(x) for x in array.astype(np.float64).ravel().tolist()]
    if array.ndim == 0:
        return flat[0]
    nested: Any = flat
    for size in reversed(array.shape[1:]):
        nested = [nested[i : i + size] for i in range(0, len(nested), size)]
    return nested


# -- the listings: graphsvc.console.listing's node cells, then the arrays' --------------------------------
def rows(graph: Graph, nodes: Sequence[int], values: Arrays, grads: Arrays | None) -> Iterator[list[tuple[str, ...]]]:
    """The text cells of ``nodes``, a chunk at a time, as :func:`node_cells` gives
    them: id, name, op, parents, then the value's :func:`summary` and, with ``grads``, the gradient's."""
    tags = list(map(escape, graph.op_table))  # once, not a chunk at a time
    for ids in listing.chunks(nodes):
        with gc_paused():  # a tuple a row, while the replay's arrays live: see graphsvc.collector
            id_list = ids.tolist()
            columns = listing.node_columns(graph, ids, tags)
            columns.append(summaries([values[node] for node in id_list]))
            if grads is not None:
                columns.append(summaries([grads[node] for node in id_list], gradient=True))
            chunk = list(zip(*columns, strict=True))
        yield chunk


def text(graph: Graph, nodes: Sequence[int], values: Arrays, grads: Arrays | None) -> Iterator[str]:
    """The cells of :func:`rows` as tab-separated lines, a chunk at a time, each ending with a newline."""
    for chunk in rows(graph, nodes, values, grads):
        yield "\n".join(map("\t".join, chunk)) + "\n"


def json_objects(graph: Graph, nodes: Sequence[int], values: Arrays, grads: Arrays | None) -> Iterator[str]:
    """The nodes as JSON objects (``id``, ``name``, ``op``, ``parents``, ``value``, ``grad``: the
    cells of :func:`json_cells`) joined by commas, a chunk at a time; chunks after the first start
    with their comma. As ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` writes each
    object, lone surrogates escaped (:func:`graphsvc.text.json_escaped`)."""
    tags = [_json_text(tag) for tag in graph.op_table]
    separator = ""
    for ids in listing.chunks(nodes):
        with gc_paused():
            chunk = _json_chunk(graph, ids, tags, values, grads)
        yield separator + chunk
        separator = ","


def _json_chunk(graph: Graph, ids: np.ndarray, tags: list[str], values: Arrays, grads: Arrays | None) -> str:
    """The JSON objects of the nodes ``ids``, joined by commas (``tags``: each op code's, as JSON)."""
    id_list = ids.tolist()
    names = ["null" if name is None else _json_text(name) for name in listing.node_names(graph, id_list)]
    ops = [tags[code] for code in graph.op_codes[ids].tolist()]
    parents = listing.parent_texts(graph, ids)
    value_cells = json_cells([values[node] for node in id_list])
    grad_cells = ["null"] * len(id_list) if grads is None else json_cells([grads[node] for node in id_list])
    objects = [
        f'{{"id":{i},"name":{name},"op":{op},"parents":[{p}],"value":{v},"grad":{g}}}'
        for i, name, op, p, v, g in zip(id_list, names, ops, parents, value_cells, grad_cells, strict=True)
    ]
    return json_escaped(",".join(objects))
