"""Replay of tensor graphs: nodes that hold arrays, one op call per node, backward by VJPs.

A graph is replayed here when it holds a tensor node or uses an op given only by its ``vjp`` (see
:func:`graphsvc.replay.run.tensor_replay_needed`); graphs of float64 scalars keep the column engine of
:mod:`graphsvc.replay.columns`.
Scalar nodes take part as 0-d float64 arrays, under numpy's promotion rules: a float32 array times
a float64 scalar node is float64 (a constant given as ``np.float32(2.0)`` keeps float32). Every
node is one call of its op on whole arrays, so Python's cost per node is small next to the
arithmetic of a layer.

Backward follows autograd and PyTorch: the output (a scalar: the loss) is seeded with 1, the
output's ancestors are visited in decreasing id order (a reverse topological order), and each node
maps its gradient to its inputs' with the op's VJP. An elementwise op's ``derivatives`` become a
VJP through :func:`graphsvc.ops.elementwise_vjp`, which sums broadcast dimensions back with
:func:`graphsvc.ops.unbroadcast`. Every replay starts from zero gradients. Gradients go where
PyTorch's ``requires_grad`` sends them (:func:`requires_grad`): to ``leaf`` nodes, scalar consts
and what is computed from them; a ``const`` array is data and gets none, nor does what is computed
from consts alone, nor an int64 node (indices). A VJP that declares ``needs_input_grad`` is told
which of its inputs need one. Every value and gradient a replay keeps is read-only.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np

from graphsvc.errors import ReplayError, UsageError
from graphsvc.graph import FLOAT_DTYPE, LEAF, MAX_DIMENSIONS, TENSOR_DTYPES, Graph, sealed
from graphsvc.native import Engine
from graphsvc.ops import (
    NEEDS_INPUT_GRAD,
    RESIDUALS,
    VJP,
    Op,
    describe_exception,
    interrupts_told_apart,
    is_user_interrupt,
    per_element,
    raise_unreadable,
)
from graphsvc.replay import memory
from graphsvc.replay.compare import Comparison, Element, NonFinite, Tolerance, differences, finite, tolerance, used
from graphsvc.replay.step import Step
from graphsvc.text import counted
from graphsvc.topo import ancestors

__all__ = [
    "ARRAY_LIMIT_ENV",
    "DEFAULT_ARRAY_LIMIT",
    "Replayed",
    "array_limit",
    "backward",
    "byte_size",
    "compare",
    "cotangent_for",
    "cotangents_error",
    "describe",
    "first_nonfinite",
    "forward",
    "missing_cotangent",
    "replay",
    "requires_grad",
    "store",
    "tensor_result",
    "too_large",
    "vjp_of",
]

#: The values (or gradients) of a replayed tensor graph: one array per node (0-d for scalars),
#: ``None`` where a node has none (an int64 node's gradient, a node the replay did not reach).
Replayed = list[np.ndarray | None]

_NO_ATTRS: Mapping[str, Any] = {}
#: :data:`TENSOR_DTYPES` as a set: one hashed look-up, where ``in`` the tuple compares up to three dtypes.
_TENSOR_DTYPE_SET = frozenset(TENSOR_DTYPES)
_INDEX_DTYPE = np.dtype(np.int64)

#: The environment variable that sets the most bytes one array of a tensor replay may hold.
ARRAY_LIMIT_ENV = "GRAPHSVC_MAX_ARRAY_BYTES"
#: That limit when the variable is not set: 4 GiB.
DEFAULT_ARRAY_LIMIT = 4 * 2**30
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
}


def array_limit() -> int:
    """The most bytes one array of a tensor replay may hold: ``GRAPHSVC_MAX_ARRAY_BYTES`` (a number of
    bytes, or one with a unit: ``512MiB``, ``16GiB``, ``1TiB``; K, M, G and T are those too), else
    :data:`DEFAULT_ARRAY_LIMIT`. A node whose op declares a larger output (:attr:`Op.out_shape
    <graphsvc.ops.Op.out_shape>`, an elementwise op's inputs broadcast together) is refused before it
    runs; one that returns a larger array, right after. Read at the start of each replay."""
    text = os.environ.get(ARRAY_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_ARRAY_LIMIT
    number = text.rstrip("BbKkMmGgTtIi ")
    unit = text[len(number) :].strip().lower()
    try:
        limit = int(number) * _UNITS[unit]
    except (ValueError, KeyError):
        limit = 0
    if limit <= 0:
        raise UsageError(
            f"{ARRAY_LIMIT_ENV} must be a positive number of bytes, with a unit or without "
            f"(4294967296, 512MiB, 16GiB), not {text[:40]!r}"
        )
    return limit


def byte_size(count: int) -> str:
    """``8.0 TiB``: a number of bytes as messages show it."""
    size, unit = float(count), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024:
            break
        size, unit = size / 1024, name
    return f"{count} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


def too_large(verb: str, shape: Sequence[int], dtype: str, itemsize: int, limit: int) -> str:
    """``asks for a 1048576x1048576 float64 array (8.0 TiB), more than the limit of 4.0 GiB on one
    array (GRAPHSVC_MAX_ARRAY_BYTES)``: why an array of ``shape`` is refused (``verb``: asks for,
    returned), for the engine's errors and a plugin's own check."""
    dims = "x".join(str(n) for n in shape) if shape else "0-d"
    return (
        f"{verb} a {dims} {dtype} array ({byte_size(math.prod(shape) * itemsize)}), more than the limit of "
        f"{byte_size(limit)} on one array ({ARRAY_LIMIT_ENV})"
    )


def _too_large(
    graph: Graph, node: int, op: Op, verb: str, shape: Sequence[int], dtype: np.dtype, limit: int
) -> ReplayError:
    """The error for a node whose op asks for (``verb``) or made an array above ``limit`` bytes."""
    return ReplayError(
        f"node {graph.label(node)} ({op.name}): {too_large(verb, shape, str(dtype), dtype.itemsize, limit)}"
    )


def _check_size(graph: Graph, node: int, op: Op, inputs: list[Any], attrs: Mapping[str, Any], limit: int) -> None:
    """Refuse ``node`` before it runs when its op declares (:attr:`Op.out_shape`) an output above
    ``limit`` bytes."""
    declare = op.out_shape
    assert declare is not None
    try:
        shape = declare(*[x.shape for x in inputs], **attrs)
    except BaseException as exc:
        _failed(graph, node, op, "out_shape", exc)
    if shape is None:
        return
    try:
        shape = tuple(map(int, shape))
    except Exception:
        shape = (-1,)
    if shape and min(shape) < 0:
        raise ReplayError(
            f"node {graph.label(node)}: op {op.name!r} ({op.source}): out_shape returned {shape!r}"[:200]
            + ", not a shape (a sequence of non-negative integers) or None"
        )
    if math.prod(shape) * _WIDEST > limit:
        _check_bytes(graph, node, op, inputs, shape, limit)


#: The most bytes an element of a tensor takes (float64, int64): a shape with at most ``limit / 8``
#: elements fits any dtype, and its dtype need not be looked at.
_WIDEST = 8


def _check_bytes(graph: Graph, node: int, op: Op, inputs: list[Any], shape: tuple[int, ...], limit: int) -> None:
    """Refuse ``node`` when an array of ``shape`` in its inputs' widest dtype is above ``limit`` bytes."""
    dtype = max((x.dtype for x in inputs), key=lambda d: d.itemsize, default=np.dtype(np.float64))
    if math.prod(shape) * dtype.itemsize > limit:
        raise _too_large(graph, node, op, "asks for", shape, dtype, limit)


#: Shapes that broadcast together, by the shapes: (the shape, its number of elements), or (None, 0)
#: for shapes that do not broadcast. Worked out once (``np.broadcast_shapes`` costs microseconds,
#: a look-up a tenth of one) for every elementwise node of every replay; cleared when it holds
#: :data:`_BROADCASTS_HELD`.
_BROADCASTS: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...] | None, int]] = {}
_BROADCASTS_HELD = 4096


def _broadcast_shape(shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...] | None, int]:
    """The shape ``shapes`` broadcast to and its number of elements; ``(None, 0)`` when they do not
    broadcast (the op's forward says so)."""
    found = _BROADCASTS.get(shapes)
    if found is None:
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError:
            found = (None, 0)
        else:
            found = (shape, math.prod(shape))
        if len(_BROADCASTS) >= _BROADCASTS_HELD:
            _BROADCASTS.clear()
        _BROADCASTS[shapes] = found
    return found


#: What replay needs of a node computed by an op: the op, its parents' ids and its attributes
#: (``None`` for a leaf or a const, whose value comes from the graph).
_Call = tuple[Op, list[int], Mapping[str, Any]]


def _initial_values(graph: Graph, calls: Sequence[_Call | None], overrides: Mapping[int, Any]) -> Replayed:
    """Each leaf's stored value as a read-only array, with ``overrides`` applied."""
    values: Replayed = [None] * graph.num_nodes
    column = graph.values
    for node, call in enumerate(calls):
        if call is None:
            array = graph.arrays.get(node)
            values[node] = _read_only(np.asarray(column[node]) if array is None else array)
    for node, value in overrides.items():
        graph.check_settable(node)
        values[node] = _read_only(np.asarray(value))
    return values


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` through a read-only view (itself when it is read-only already)."""
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array


def _frozen(array: np.ndarray) -> np.ndarray:
    """An array of the replay's own (a seed, zeros, a sum it made), made read-only in place."""
    array.setflags(write=False)
    return array


def _kept(array: np.ndarray) -> np.ndarray:
    """What an op or a VJP returned, to keep as a node's value or gradient: read-only, and memory
    no one else can write into. Called as ``_kept(x)`` where the caller's one local ``x`` is its
    only reference of the caller's. Kept as it is (made read-only in place) when nothing but its own
    chain of views refers to it and to each array it views (a fresh result, or a view of one:
    ``matmul(...).reshape(...)``), or when its memory is read-only all the way down (a view of an
    input: ``reshape``, ``broadcast_to``, an input returned as it is). Anything else is copied: a
    buffer the plugin keeps (a per-shape scratch array, a cache), or a view of one, which it could
    change later through a handle of its own; making our handle read-only would not stop that."""
    if not array.flags.writeable:  # read-only memory already (read_only_memory's commonest cases, inline):
        base = array.base  # a view of a kept array (reshape, transpose, an input as it is), or one kept
        if base is None or (type(base) is np.ndarray and base.base is None and not base.flags.writeable):
            return array
    refs = _PRIVATE_REFS
    item: Any = array
    while True:
        if sys.getrefcount(item) > refs:
            break
        base = item.base
        if base is None:  # private all the way down: read-only all the way down, so views of it
            item = array  # (a reshape of it, a later node's) are known to be read-only memory too
            while item is not None:
                item.setflags(write=False)
                item = item.base
            return array
        if not isinstance(base, np.ndarray):
            break
        item, refs = base, _BASE_REFS
    del item
    if read_only_memory(array):
        return array if not array.flags.writeable else _read_only(array)
    copy = np.array(array, order="K")  # its own memory, as numpy lays out a copy
    copy.setflags(write=False)
    return copy


def _probe(array: np.ndarray) -> tuple[int, int]:
    """The reference counts :func:`_kept`'s loop sees, on this Python: for an array only its caller's
    local holds, and for the array a view of it views when only that view refers to it."""
    item: Any = array
    first = sys.getrefcount(item)
    base = item.base
    item = base
    return first, sys.getrefcount(item)


def _calibrated() -> tuple[int, int]:
    view = np.empty(2)[:]
    return _probe(view)


_PRIVATE_REFS, _BASE_REFS = _calibrated()


def _calls(graph: Graph, ops: Sequence[Op | None]) -> list[_Call | None]:
    codes = graph.op_codes.tolist()
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    attrs = graph.attrs
    return [
        None
        if ops[code] is None
        else (ops[code], parents[offsets[node] : offsets[node + 1]], attrs.get(node, _NO_ATTRS))
        for node, code in enumerate(codes)
    ]


def forward(
    graph: Graph,
    ops: Sequence[Op | None],
    overrides: Mapping[int, Any] | None = None,
    residuals: dict[int, Any] | None = None,
    *,
    keep: Sequence[bool] | np.ndarray | None = None,
) -> Replayed:
    """Every node's value, recomputed in id order from the leaves (``overrides`` replace leaf
    values first). The caller resolved ``ops`` (:func:`graphsvc.replay.columns.resolve_ops`). Given a
    dict ``residuals`` (a backward pass follows), the nodes of an op with a
    ``forward_with_residuals`` are computed by it, and what it keeps goes into ``residuals`` by
    node, for :func:`backward`. ``keep`` (a mask by node id: the ancestors of the output the
    backward pass starts from, :func:`graphsvc.topo.ancestors`) limits that to the nodes it marks:
    the others are computed by ``forward``, and no memory is held for a VJP that will not run."""
    calls = _calls(graph, ops)
    with _replaying():
        return _forward(graph, calls, overrides or {}, residuals, keep)


def replay(
    graph: Graph,
    ops: Sequence[Op | None],
    output: int | None = None,
    overrides: Mapping[int, Any] | None = None,
    steps: list[Step] | None = None,
    engine: Engine | None = None,
) -> tuple[Replayed, Replayed | None]:
    """:func:`forward`, then, given ``output``, :func:`backward` from it (else no gradients): the
    one replay graphsvc.backward runs. The nodes' calls are worked out once for both passes, the
    residuals of the output's ancestors kept from one to the other, and the passes run inside one
    :func:`_replaying` (each costs tens of microseconds after a large matrix product). ``engine``:
    the caller's for the graph's sweeps (:func:`graphsvc.topo.ancestors`), else the one its size gets."""
    calls = _calls(graph, ops)
    keep = None if output is None else ancestors(graph, output, engine)
    residuals: dict[int, Any] | None = None if output is None else {}
    with _replaying():
        values = _forward(graph, calls, overrides or {}, residuals, keep)
        if output is None:
            return values, None
        return values, _backward(graph, calls, output, values, steps, residuals, keep)


@contextmanager
def _replaying() -> Iterator[None]:
    """Where a pass runs: numpy's floating-point warnings off (a nan is a result; the caller
    reports it), the user's Ctrl-C told apart from a plugin's KeyboardInterrupt, memory reused from
    pass to pass (:mod:`graphsvc.replay.memory`)."""
    with np.errstate(all="ignore"), interrupts_told_apart(), memory.reuse():
        yield


def _forward(
    graph: Graph,
    calls: list[_Call | None],
    overrides: Mapping[int, Any],
    residuals: dict[int, Any] | None,
    keep: Sequence[bool] | np.ndarray | None,
) -> Replayed:
    """:func:`forward`'s pass, inside :func:`_replaying`, on the nodes' ``calls`` (:func:`_calls`)."""
    values = _initial_values(graph, calls, overrides)
    limit = array_limit()
    kept = None if keep is None else np.asarray(keep, dtype=bool).tolist()
    wanted = residuals is not None
    keeping: dict[int, Any] = {} if residuals is None else residuals
    for node, call in enumerate(calls):
        if call is None:
            continue
        op, parents, attrs = call
        inputs = [values[p] for p in parents]
        if op.derivatives is not None:  # elementwise: its output has its inputs' broadcast shape
            if len(inputs) == 1:
                shape = inputs[0].shape  # type: ignore[union-attr]
            else:
                shape, count = _broadcast_shape(tuple([x.shape for x in inputs]))  # type: ignore[union-attr]
                if count * _WIDEST > limit:
                    assert shape is not None
                    _check_bytes(graph, node, op, inputs, shape, limit)
        else:
            shape = None
            if op.out_shape is not None:
                _check_size(graph, node, op, inputs, attrs, limit)
        producer = op.forward_with_residuals if wanted and (kept is None or kept[node]) else None
        try:  # the op's call inline: this loop is the engine's cost per node
            if producer is None:
                what = "forward"
                function = op.forward if op.vectorized else per_element(op, "forward")
                assert function is not None  # a computed node's op has one (not cast(): it costs 1 µs a call)
                result = function(*inputs, **attrs)
            else:
                what = "forward_with_residuals"
                result, keeping[node] = output_and_residuals(op, producer(*inputs, **attrs))
        except BaseException as exc:
            _failed(graph, node, op, what, exc)
        if type(result) is np.ndarray and result.dtype in _TENSOR_DTYPE_SET and result.ndim <= MAX_DIMENSIONS:
            value = result  # what _as_tensor checks first, inline
        else:
            value = _as_tensor(graph, node, op, what, result)
        result = None  # the value's one reference of ours is `value` (_kept counts them)
        if shape is not None and value.shape != shape:
            raise ReplayError(
                f"node {graph.label(node)}: op {op.name!r} ({op.source}): {op.message_name(what)} returned an "
                f"array of shape {list(value.shape)}, but an elementwise op returns its inputs' broadcast shape "
                f"{list(shape)}"
            )
        values[node] = value = _kept(value)
        if value.nbytes > limit:  # a view's too: a broadcast view of 8 TiB costs nothing until summed
            raise _too_large(graph, node, op, "returned", value.shape, value.dtype, limit)
    return values


def output_and_residuals(op: Op, pair: Any) -> tuple[Any, Any]:
    """What ``forward_with_residuals`` returned, checked to be ``(output, residuals)``. Every array
    among the residuals (the residuals themselves, or held in tuples, lists and dicts of them, however
    nested) is made read-only: a plugin that keeps a buffer it writes into again (a per-shape scratch
    buffer) fails at that write, instead of handing its VJP another node's numbers."""
    if not isinstance(pair, tuple) or len(pair) != 2:
        got = f"a tuple of {counted(len(pair), 'item')}" if isinstance(pair, tuple) else type(pair).__name__
        raise ReplayError(
            f"op {op.name!r} ({op.source}): forward_with_residuals returned {got}, expected a pair (output, residuals)"
        )
    pending, seen = [pair[1]], set()
    while pending:  # iterative, and each container once (one may hold itself)
        item = pending.pop()
        if isinstance(item, np.ndarray):
            item.flags.writeable = False
        elif isinstance(item, (tuple, list, dict)) and id(item) not in seen:
            seen.add(id(item))
            pending.extend(item.values() if isinstance(item, dict) else item)
    return pair


def backward(
    graph: Graph,
    ops: Sequence[Op | None],
    output: int,
    values: Replayed,
    steps: list[Step] | None = None,
    residuals: dict[int, Any] | None = None,
    *,
    reached: np.ndarray | None = None,
) -> Replayed:
    """d(output)/d(node) for every node that :func:`requires_grad` (zeros where the output does not
    depend on it), ``None`` for the others (int64 nodes, const arrays and what is computed from them
    alone), from the output seeded with 1. The output must hold a single number. When ``steps`` is
    a list, each node's :class:`Step` is appended to it, in the order of the sweep. A VJP that
    takes :data:`RESIDUALS` gets what :func:`forward` kept in ``residuals`` for its node, or None;
    each is let go once its VJP ran, and the dict is empty when the sweep is over. ``reached``: the
    output's ancestors (:func:`graphsvc.topo.ancestors`), when the caller has them already (the
    forward pass's ``keep``)."""
    calls = _calls(graph, ops)
    with _replaying():
        return _backward(graph, calls, output, values, steps, residuals, reached)


def _backward(
    graph: Graph,
    calls: list[_Call | None],
    output: int,
    values: Replayed,
    steps: list[Step] | None,
    residuals: dict[int, Any] | None,
    reached: np.ndarray | None,
) -> Replayed:
    """:func:`backward`'s sweep, inside :func:`_replaying`, on the nodes' ``calls`` (:func:`_calls`)."""
    out = values[output]
    assert out is not None
    if out.size != 1:
        raise UsageError(
            f"backward starts from a scalar (a loss), but node {graph.label(output)} holds {describe(out)}: "
            "reduce it first (sum, mean) or choose another output"
        )
    if out.dtype == _INDEX_DTYPE:
        raise UsageError(f"node {graph.label(output)} holds integers (int64): it has no gradient")
    requires = requires_grad(graph, calls, values)
    grads: Replayed = [None] * graph.num_nodes
    summed: set[int] = set()  # nodes whose gradient is a sum this sweep made (and may add to in place)
    if requires[output]:
        grads[output] = _frozen(np.ones_like(out))
    reached = ancestors(graph, output) if reached is None else reached
    recording = steps is not None
    for node in np.flatnonzero(reached)[::-1].tolist():
        call, g = calls[node], grads[node]
        if g is None:
            continue
        if node in summed:  # every consumer has added its part: the sum is final
            _frozen(g)
        if call is None:  # a leaf: where the gradient ends
            if steps is not None:
                steps.append(Step(node, g, []))
            continue
        op, parents, attrs = call
        vjp = op.tensor_vjp
        needs = tuple([requires[p] for p in parents])
        if vjp.takes_needs or vjp.takes_residuals:
            kept = None if residuals is None else residuals.pop(node, None)
            attrs = vjp_keywords(vjp, attrs, needs, kept)
        inputs = [values[p] for p in parents]
        try:  # inline, as in forward
            cotangents = vjp.function(g, values[node], *inputs, **attrs)
        except BaseException as exc:
            _failed(graph, node, op, "vjp", exc)
        # each cotangent into its parent's gradient (the loop inline: it is the engine's cost per edge)
        if not isinstance(cotangents, (tuple, list)) or len(cotangents) != len(parents):
            raise _at(graph, node, cotangents_error(op, "vjp", cotangents, len(parents)))
        cotangents = list(cotangents)  # a list of our own, the only reference of ours to each cotangent (_kept)
        sent: list[np.ndarray | None] | None = [] if recording else None
        for position, parent in enumerate(parents):
            if not needs[position]:
                if sent is not None:
                    sent.append(None)
                continue
            ct = cotangents[position]
            cotangents[position] = None  # `ct` is our one reference (_kept counts them)
            if ct is None:
                raise _at(graph, node, missing_cotangent(op, "vjp", position))
            x = inputs[position]
            if type(ct) is not np.ndarray or ct.shape != x.shape or ct.dtype != x.dtype:
                try:
                    ct = cotangent_for(op, "vjp", position, ct, x)
                except ReplayError as exc:
                    raise _at(graph, node, exc) from None
            ct = _kept(ct)
            previous = grads[parent]
            if previous is None:
                grads[parent] = ct
            elif parent in summed:
                np.add(previous, ct, out=previous)
            else:
                grads[parent] = np.asarray(previous + ct)  # 0-d + 0-d: a scalar
                summed.add(parent)
            if sent is not None:
                sent.append(ct)
        cotangents = None
        if steps is not None:
            assert sent is not None
            steps.append(Step(node, g, [(p, None, c) for p, c in zip(parents, sent, strict=True)]))
    if residuals is not None:  # those of nodes the sweep did not reach
        residuals.clear()
    for node, value in enumerate(values):
        if requires[node] and grads[node] is None:  # not reached: zero
            assert value is not None
            grads[node] = _frozen(np.zeros_like(value))
    return grads


def requires_grad(graph: Graph, calls: Sequence[_Call | None], values: Replayed) -> list[bool]:
    """Which nodes get a gradient, PyTorch's ``requires_grad``: ``leaf`` nodes, scalar ``const``
    nodes (a number in the columns, as micrograd's ``Value(2.0)``: every node of a graph of scalars
    gets one) and every node computed from one of these; not ``const`` arrays (data: inputs, masks,
    the ``eps`` of a layer norm), not what is computed from them alone, never int64 nodes."""
    requires = [False] * graph.num_nodes
    leaf = graph.op_table.index(LEAF) if LEAF in graph.op_table else -1
    codes = graph.op_codes.tolist()
    arrays = graph.arrays
    index = _INDEX_DTYPE
    for node, call in enumerate(calls):
        value = values[node]
        assert value is not None
        if call is not None:
            for parent in call[1]:  # a loop, not any([...]): most nodes have one or two parents
                if requires[parent]:
                    requires[node] = value.dtype != index
                    break
        elif codes[node] == leaf:
            requires[node] = value.dtype != index
        else:  # const (or a tag replay does not know): a number in the columns gets one
            requires[node] = node not in arrays and value.shape == () and value.dtype != index
    return requires


def vjp_keywords(
    vjp: VJP, attrs: Mapping[str, Any], needs: tuple[bool, ...] | None, residuals: Any
) -> Mapping[str, Any]:
    """A node's attributes plus what its VJP declares: ``needs_input_grad`` (when ``needs`` is
    given) and ``residuals``."""
    if vjp.takes_needs and needs is not None:
        attrs = {**attrs, NEEDS_INPUT_GRAD: needs}
    if vjp.takes_residuals:
        attrs = {**attrs, RESIDUALS: residuals}
    return attrs


def vjp_of(op: Op) -> VJP:
    """``op``'s VJP (derived from its ``derivatives`` when it gives none), whether it takes
    :data:`~graphsvc.ops.NEEDS_INPUT_GRAD` (it declares a parameter of that name; the derived VJPs
    do) and whether it takes :data:`~graphsvc.ops.RESIDUALS`: :attr:`graphsvc.ops.Op.tensor_vjp`."""
    return op.tensor_vjp


def _failed(graph: Graph, node: int, op: Op, what: str, exc: BaseException) -> NoReturn:
    """Raise what ``exc``, raised by ``op``'s ``what`` at ``node``, becomes: the user's Ctrl-C
    itself; else a ReplayError naming the node (the op's own checks, whose messages name the op
    already) or naming the op, its plugin and the exception."""
    if isinstance(exc, ReplayError):
        raise ReplayError(f"node {graph.label(node)}: {exc}") from exc.__cause__
    if is_user_interrupt(exc):
        raise exc
    raise ReplayError(
        f"node {graph.label(node)}: op {op.name!r} ({op.source}): {op.message_name(what)} raised "
        f"{describe_exception(exc)}"
    ) from exc


def _as_tensor(graph: Graph, node: int, op: Op, what: str, result: Any) -> np.ndarray:
    """:func:`tensor_result` at ``node``: its error names the node too."""
    if type(result) is np.ndarray and result.dtype in TENSOR_DTYPES and result.ndim <= MAX_DIMENSIONS:
        return result
    try:
        return tensor_result(op, what, result)
    except ReplayError as exc:
        raise _at(graph, node, exc) from None


def _at(graph: Graph, node: int, error: ReplayError) -> ReplayError:
    """``error``, raised by an op's result at ``node``, naming the node first."""
    return ReplayError(f"node {graph.label(node)}: {error}")


# An op's results, checked where a replay uses them and where graphsvc.testing checks an op: one
# wording for both (each a ReplayError naming the op; a replay adds the node).
def tensor_result(op: Op, what: str, result: Any) -> np.ndarray:
    """What ``op``'s ``what`` (``"forward"``, ``"vjp"``...) returned, as an array a graph holds: one
    of :data:`TENSOR_DTYPES`, of at most :data:`MAX_DIMENSIONS` dimensions (a replay's result is
    saved with ``--write``); anything else is a ReplayError naming the op."""
    try:
        array = np.asarray(result)
    except BaseException as exc:  # an array-like whose __array__ raises: the op's failure, said
        raise_unreadable(op, what, result, exc)
        array = None
    if array is not None and array.dtype in TENSOR_DTYPES:
        if array.ndim <= MAX_DIMENSIONS:
            return array
        raise ReplayError(
            f"op {op.name!r} ({op.source}): {op.message_name(what)} returned an array "
            f"of {counted(array.ndim, 'dimension')}, more than {MAX_DIMENSIONS}"
        )
    kind = f"an array of {result.dtype}" if isinstance(result, np.ndarray) else type(result).__name__
    raise ReplayError(
        f"op {op.name!r} ({op.source}): {op.message_name(what)} returned {kind}, "
        "not an array of float64, float32 or int64"
    )


def cotangents_error(op: Op, what: str, cotangents: Any, count: int) -> ReplayError:
    """The error for a ``vjp`` (``what``) that returned ``cotangents`` where it owes ``count``, one per input."""
    got = counted(len(cotangents), "cotangent") if isinstance(cotangents, (tuple, list)) else type(cotangents).__name__
    return ReplayError(f"op {op.name!r} ({op.source}): {what} returned {got}, expected one per input ({count})")


def missing_cotangent(op: Op, what: str, position: int) -> ReplayError:
    """The error for a ``vjp`` (``what``) that returned ``None`` for input ``position``, which needs a
    gradient (``None`` is only for an input whose ``needs_input_grad`` entry is False)."""
    return ReplayError(
        f"op {op.name!r} ({op.source}): {what} returned None for input {position}, which needs a gradient "
        "(None is only for an input whose needs_input_grad entry is False)"
    )


def cotangent_for(op: Op, what: str, position: int, cotangent: Any, x: np.ndarray) -> np.ndarray:
    """The cotangent a ``vjp`` (``what``) gave input ``position`` (``x``), as that input's gradient:
    an array of :func:`tensor_result`'s dtypes in ``x``'s shape, cast to ``x``'s dtype; anything
    else is a ReplayError naming the op."""
    ct = cotangent if type(cotangent) is np.ndarray else tensor_result(op, what, cotangent)
    if ct.shape != x.shape:
        raise ReplayError(
            f"op {op.name!r} ({op.source}): {what} returned a cotangent of shape {list(ct.shape)} for input "
            f"{position}, whose shape is {list(x.shape)}"
        )
    if ct.dtype != x.dtype:
        ct = tensor_result(op, what, ct).astype(x.dtype)
    return ct


#: Short names of the dtypes, as listings show them (``f32[128,10]``).
SHORT_DTYPE = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32", np.dtype(np.int64): "i64"}


def describe(array: np.ndarray) -> str:
    """``f32[128,10]``: an array's dtype and shape, as listings and messages show it."""
    return f"{SHORT_DTYPE.get(array.dtype) or array.dtype}[{','.join(map(str, array.shape))}]"


def store(graph: Graph, values: Replayed, grads: Replayed | None) -> Graph:
    """A copy of ``graph`` holding replayed ``values`` (and ``grads``): float64 0-d results go to
    the scalar columns, every other array to ``arrays`` / ``grad_arrays`` (read-only, and sealed: no
    holder can make one writable again), shared with the replay rather than copied (see :func:`_split`)."""
    result = graph.copy(arrays=False)
    result.values = np.full(graph.num_nodes, np.nan, dtype=FLOAT_DTYPE)
    result.arrays = {}
    with memory.reuse():  # the copies, in memory a previous result gave back (as the replay's arrays)
        _split(values, result.values, result.arrays, keep=graph.arrays)
        result.grad_arrays = {}
        if grads is None:
            result.grads = None
        else:
            result.grads = np.full(graph.num_nodes, np.nan, dtype=FLOAT_DTYPE)
            _split(grads, result.grads, result.grad_arrays, keep=graph.arrays)
    return result


def _split(
    arrays: Replayed, column: np.ndarray, tensors: dict[int, np.ndarray], keep: Mapping[int, np.ndarray]
) -> None:
    """Scalars into ``column``, the rest into ``tensors``, each a sealed view (numpy refuses to make
    it writable: it views a read-only array, :func:`graphsvc.graph.sealed`), sharing the memory it is
    given, whatever its layout (a transpose, a broadcast), with two exceptions, which are copied
    (in the order their axes have in memory, a transpose's copy one pass over it; sealed): an
    array whose memory someone could still change (it views a writable array: of the graph given,
    ``keep``, one a caller made with :meth:`Graph.copy`; a caller's array given to :func:`replay`
    as an override), and a view holding on to a much larger array (more than twice its own bytes;
    a loaded graph's views of its file's buffer fail that rule: its leaves, and their transposes).
    What a replay computes is read-only memory (:func:`_kept`), so it is never copied: an array that
    owns its memory gets one view, a view of one is kept as it is. A built graph's arrays are
    read-only views of read-only memory: a leaf's value is shared, not copied. Saving such a result
    writes each array's elements in C order, whatever its layout."""
    for node, array in enumerate(arrays):
        if array is None:
            continue
        if array.ndim == 0 and array.dtype == FLOAT_DTYPE and node not in keep:
            column[node] = array
            continue
        base = array.base
        if base is None:  # it owns its memory
            if not array.flags.writeable:  # read-only: a view of it is sealed
                tensors[node] = array.view()
                continue
        elif (
            type(base) is np.ndarray
            and base.base is None
            and not array.flags.writeable
            and not base.flags.writeable
            and base.nbytes <= 2 * array.nbytes
        ):  # a read-only view of a read-only owner (a replay's reshape, transpose): sealed as it is
            tensors[node] = array
            continue
        root = base if isinstance(base, np.ndarray) else array
        if read_only_memory(array) and (root is array or (root.base is None and root.nbytes <= 2 * array.nbytes)):
            tensors[node] = array.view()  # of read-only memory: sealed
        else:
            tensors[node] = sealed(np.array(array, order="K"))


def read_only_memory(array: np.ndarray) -> bool:
    """Whether nothing can write into ``array``'s memory: it is read-only, and so is every array it
    views, down to the memory's owner, an array or a ``bytes`` object. A buffer that only reads (a
    read-only memoryview, a file mapped for reading) says nothing of the memory behind it: a
    bytearray, a file another process rewrites. numpy lets an owner be made writable again; only
    its holder's deliberate act does."""
    base: object = array
    while True:
        if isinstance(base, np.ndarray):
            if base.flags.writeable:
                return False
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return base is None or type(base) is bytes


# -- replayed tensors against stored ones, the first nan or inf -----------------------------------
def stored(graph: Graph, node: int, gradients: bool = False) -> np.ndarray | None:
    """The value (or gradient) a file stores for ``node``; ``None`` when it stores none."""
    array = (graph.grad_arrays if gradients else graph.arrays).get(node)
    if array is not None:
        return array
    column = graph.grads if gradients else graph.values
    if column is None or np.isnan(column[node]):
        return None
    return np.asarray(column[node])


def compare(
    what: str, graph: Graph, replayed: Replayed, rtol: float | None = None, atol: float | None = None
) -> Comparison:
    """Compare replayed values (``what="values"``) or gradients with what ``graph`` stores, element
    by element with :func:`graphsvc.replay.compare.differences` (the column comparison's rule): a
    node mismatches when an element is beyond tolerance or the shapes differ; nodes with nothing
    stored (no array, nan in the column) are counted apart. Each node is held to the tolerance of
    its dtypes, replayed and stored (:func:`graphsvc.replay.compare.tolerance`: ``rtol`` and
    ``atol`` where given)."""
    worst_abs, worst_rel = 0.0, 0.0
    worst_abs_at: Element | None = None
    worst_rel_at: Element | None = None
    mismatches = unstored = 0
    tolerances: dict[tuple[np.dtype, np.dtype], tuple[str, Tolerance]] = {}
    for node, array in enumerate(replayed):
        expected = stored(graph, node, what == "grads")
        if array is None or expected is None:
            unstored += 1
            continue
        pair = (array.dtype, expected.dtype)
        found = tolerances.get(pair)
        if found is None:
            found = tolerances[pair] = tolerance(pair, rtol, atol)
        if array.shape != expected.shape:
            mismatches += 1
            worst_abs, worst_abs_at, worst_rel, worst_rel_at = math.inf, (node, ()), math.inf, (node, ())
            continue
        got, want = array.astype(np.float64), expected.astype(np.float64)
        diff, rel = differences(got, want, found[1].atol)
        if not np.all(np.isclose(got, want, rtol=found[1].rtol, atol=found[1].atol, equal_nan=True)):
            mismatches += 1
        if diff.size:
            at = int(np.argmax(diff))
            if worst_abs_at is None or diff.flat[at] > worst_abs:
                worst_abs, worst_abs_at = float(diff.flat[at]), (node, _index(at, diff.shape))
            at = int(np.argmax(rel))
            if worst_rel_at is None or rel.flat[at] > worst_rel:
                worst_rel, worst_rel_at = float(rel.flat[at]), (node, _index(at, rel.shape))
    return Comparison(
        what, worst_abs, worst_abs_at, worst_rel, worst_rel_at, mismatches, unstored, len(replayed),
        used(tolerances.values()),
    )  # fmt: skip


def first_nonfinite(what: str, replayed: Replayed, *, backward: bool = False) -> NonFinite | None:
    """Where nan or inf first appears in replayed values or gradients (see
    :class:`graphsvc.replay.compare.NonFinite`; its index into the node's array too), or None."""
    bad = [node for node, ok in enumerate(finite(replayed)) if not ok]
    if not bad:
        return None
    node = bad[-1] if backward else bad[0]
    array = replayed[node]
    assert array is not None
    at = int(np.argmax(~np.isfinite(array)))
    return NonFinite(what, node, float(array.flat[at]), len(bad), _index(at, array.shape))


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))
