"""Listings of replayed tensor graphs, a chunk of nodes at a time: each array's summary, its
``--json`` cell, the norms of ``--steps`` and which arrays hold a nan or an inf, for many arrays at once.

:func:`graphsvc.replay.arrays.summary`, :func:`~graphsvc.replay.arrays.json_cell` and
:func:`~graphsvc.replay.arrays.norm` look at one array; called once a node, numpy's overhead a call made a
listing of a million small arrays cost about 200 µs a node. Here the arrays are grouped by dtype and
shape, a group's elements stacked into one matrix, an array a row, and each statistic is one
reduction along the rows; the numbers are then written as the one-array functions write them, so
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

import numpy as np

from graphsvc.collector import gc_paused
from graphsvc.console import listing
from graphsvc.format.jsonio import json_float
from graphsvc.graph import FLOAT_DTYPE, TENSOR_DTYPES, Graph
from graphsvc.replay.arrays import describe, json_cell, norm, summary
from graphsvc.text import escape, json_escaped

__all__ = ["descriptions", "finite", "json_cells", "json_objects", "norms", "rows", "summaries", "text"]

Arrays = Sequence[np.ndarray | None]

_INDEX_DTYPE = np.dtype(np.int64)

#: Most elements stacked into one matrix: bounds the memory a listing holds besides the arrays.
BATCH_ELEMENTS = 1 << 20


class _Groups:
    """The positions in a list of arrays, those that can be stacked grouped by dtype and shape,
    the others (:attr:`alone`) apart; ``None`` in neither."""

    def __init__(self, arrays: Arrays) -> None:
        limit = np.getbufsize()
        self.alone: list[int] = []
        alone = self.alone
        # a dtype and shape's list, or ``alone`` itself for one that is never stacked: decided once
        by_kind: dict[tuple[np.dtype, tuple[int, ...]], list[int]] = {}
        for position, array in enumerate(arrays):
            if array is None:
                continue
            key = (array.dtype, array.shape)
            positions = by_kind.get(key)
            if positions is None:
                stackable = 0 < array.size <= limit and array.dtype in TENSOR_DTYPES
                positions = by_kind[key] = [] if stackable else alone
            if array.flags.c_contiguous:
                positions.append(position)
            else:
                alone.append(position)
        self.by_kind = {key: positions for key, positions in by_kind.items() if positions is not alone and positions}

    def stacked(self, arrays: Arrays) -> Iterator[tuple[np.dtype, tuple[int, ...], list[int], np.ndarray]]:
        """Each group a batch at a time: its dtype and shape, the batch's positions and its arrays
        as the rows of one matrix (a copy of their elements: read-only, C order)."""
        for (dtype, shape), positions in self.by_kind.items():
            size = math.prod(shape)
            step = max(1, BATCH_ELEMENTS // size)
            for start in range(0, len(positions), step):
                batch = positions[start : start + step]
                # a C-contiguous array's buffer is its elements in order; a group holds no None
                joined = b"".join([arrays[p] for p in batch])  # type: ignore[misc]
                yield dtype, shape, batch, np.frombuffer(joined, dtype=dtype).reshape(len(batch), size)


def _means(matrix: np.ndarray) -> list[float]:
    """``np.mean(row, dtype=np.float64)`` of each row (the sum cast first: the same pairwise sum)."""
    return (np.add.reduce(matrix.astype(np.float64), axis=1) / matrix.shape[1]).tolist()


def _largest(matrix: np.ndarray) -> list[float]:
    """``np.max(np.abs(row))`` of each row, in the row's dtype (as :func:`summary` takes it)."""
    return np.abs(matrix).max(axis=1).tolist()


def summaries(arrays: Arrays, gradient: bool = False) -> list[str]:
    """:func:`graphsvc.replay.arrays.summary` of each array (``-`` for ``None``, as a listing shows it)."""
    cells = ["-"] * len(arrays)
    groups = _Groups(arrays)
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
    """The JSON text of :func:`graphsvc.replay.arrays.json_cell` of each array, without its elements
    (``null`` for ``None``), as ``json.dumps(..., separators=(",", ":"))`` writes it."""
    cells = ["null"] * len(arrays)
    groups = _Groups(arrays)
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
    """:func:`graphsvc.replay.arrays.norm` of each array (nan for ``None``)."""
    result = [math.nan] * len(arrays)
    groups = _Groups(arrays)
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


def finite(arrays: Arrays) -> list[bool]:
    """Whether each array holds only finite numbers (``np.all(np.isfinite(array))``; ``True`` for
    ``None``, for an int64 array and for an empty one)."""
    result = [True] * len(arrays)
    groups = _Groups(arrays)
    for dtype, _, batch, matrix in groups.stacked(arrays):
        if dtype != _INDEX_DTYPE:
            for position, ok in zip(batch, np.isfinite(matrix).all(axis=1).tolist(), strict=True):
                result[position] = ok
    for position in groups.alone:
        array = arrays[position]
        assert array is not None
        result[position] = array.dtype == _INDEX_DTYPE or bool(np.all(np.isfinite(array)))
    return result


# -- the listings: graphsvc.console.listing's node cells, then the arrays' --------------------------------
def rows(graph: Graph, nodes: Sequence[int], values: Arrays, grads: Arrays | None) -> Iterator[list[tuple[str, ...]]]:
    """The text cells of ``nodes``, a chunk at a time, as :func:`graphsvc.replay.arrays.node_cells` gives
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
