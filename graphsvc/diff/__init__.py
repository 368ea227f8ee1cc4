"""diff(): where two graphs stop agreeing, in structure and in numbers.

Nodes of A and B are aligned by name first (a name both graphs hold), then by structure: from the
outputs (paired in order) and from every pair already aligned, parents are paired position by
position where their op tags agree. The walk keeps a stack of pairs (no recursion over depth) and
runs in C (``align_walk`` in ``csrc/topo.c``) where the extensions are built, else in Python
(:func:`_walk`, its reference: the same pairs).
Two graphs of the same shape, op for op and edge for edge, are aligned node for node without a
walk (one vectorized comparison).

The first divergence of values is the earliest op node (in topological order) whose value
differs: the op nodes it reads agree, the inputs (leaves, consts) it reads may not; a leaf when only
leaves differ. The first divergence of gradients is the last node whose gradient differs: walking
backward from the output, the first whose consumers' gradients all agree.

Numbers are compared as ``numpy.isclose`` does (``|a - b| <= atol + rtol * |b|``), with defaults
that fit the dtypes compared (:func:`tolerances`); inf equals inf of the same sign; nan equals nan
only with ``nan_equal``. A dtype that differs (float32 against float64) is listed, but does not make
the graphs differ: their numbers, within the tolerances, do.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsvc.errors import UsageError
from graphsvc.graph import LEAF_TAGS, Graph
from graphsvc.native import Engine, compiled_checks

#: Default (rtol, atol) by the dtype compared; int64 is compared exactly.
DEFAULT_TOLERANCES = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-6), "int64": (0.0, 0.0)}


def tolerances(dtype_a: str, dtype_b: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """The (rtol, atol) for numbers of these dtypes: the given ones, or else the looser defaults."""
    default_a = DEFAULT_TOLERANCES.get(dtype_a, DEFAULT_TOLERANCES["float64"])
    default_b = DEFAULT_TOLERANCES.get(dtype_b, DEFAULT_TOLERANCES["float64"])
    return (
        max(default_a[0], default_b[0]) if rtol is None else rtol,
        max(default_a[1], default_b[1]) if atol is None else atol,
    )


def close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, nan_equal: bool) -> np.ndarray:
    """Elementwise: do ``a`` and ``b`` agree (see the module docstring)?"""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        result = (a == b) | (np.isfinite(b) & (np.abs(a - b) <= atol + rtol * np.abs(b)))
    if nan_equal:
        result |= np.isnan(a) & np.isnan(b)
    return result


@dataclass
class Difference:
    """One difference between aligned nodes: ``kind`` is ``op``, ``attrs``, ``parents``, ``dtype``,
    ``shape`` (structure) or ``value``, ``grad`` (numbers); ``a`` and ``b`` what each graph holds
    (numbers, or for arrays a summary: shape, dtype, max_abs_diff, first_index; for ``attrs`` the
    keys that differ, a key one side lacks absent from its side; the attributes of a pair whose ops
    differ are not compared: the ``op`` difference says it)."""

    kind: str
    node: int
    node_b: int
    name: str | None
    op: str
    a: Any
    b: Any

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "node": self.node,
            "node_b": self.node_b,
            "op": self.op,
            "a": self.a,
            "b": self.b,
        }


@dataclass
class Unaligned:
    """A node the alignment could not pair: ``why`` is ``only in A``, ``only in B`` or ``op differs``
    (then ``other`` is the node of the other graph in its place)."""

    graph: str
    node: int
    name: str | None
    op: str
    why: str
    other: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "node": self.node,
            "name": self.name,
            "op": self.op,
            "why": self.why,
            "other": self.other,
        }


@dataclass
class GraphDiff:
    """What :func:`diff` found. ``matched[a]`` is the node of B aligned with node ``a`` of A (or -1)."""

    matched: np.ndarray
    structural: list[Difference] = field(default_factory=list)
    numeric: list[Difference] = field(default_factory=list)
    unaligned: list[Unaligned] = field(default_factory=list)
    first_value: Difference | None = None
    first_grad: Difference | None = None
    nodes_a: int = 0
    nodes_b: int = 0

    @property
    def equal(self) -> bool:
        """True when the graphs agree within the tolerances (a dtype that differs aside)."""
        return not self.numeric and not self.unaligned and all(d.kind == "dtype" for d in self.structural)

    def to_json(self, limit: int | None = None) -> dict[str, Any]:
        def first(items: list[Any]) -> list[Any]:
            return [item.to_json() for item in (items if limit is None else items[:limit])]

        def node(d: Difference | None) -> dict[str, Any] | None:
            return None if d is None else {"name": d.name, "node": d.node, "op": d.op, "a": d.a, "b": d.b}

        return {
            "equal": self.equal,
            "nodes": {"a": self.nodes_a, "b": self.nodes_b, "aligned": int((self.matched >= 0).sum())},
            "first_divergence": {"values": node(self.first_value), "grads": node(self.first_grad)},
            "structural": first(self.structural),
            "numeric": first(self.numeric),
            "unaligned": first(self.unaligned),
            "counts": {
                "structural": len(self.structural),
                "numeric": len(self.numeric),
                "unaligned": len(self.unaligned),
            },
        }


def _tags(graph: Graph) -> np.ndarray:
    return np.asarray(graph.op_table, dtype=object)[graph.op_codes]


def _same_shape(a: Graph, b: Graph) -> bool:
    """True when A and B are the same graph but for numbers, attributes and names that agree."""
    if a.num_nodes != b.num_nodes or a.num_edges != b.num_edges:
        return False
    if not (np.array_equal(a.parent_offsets, b.parent_offsets) and np.array_equal(a.parent_indices, b.parent_indices)):
        return False
    if a.op_table == b.op_table:
        if not np.array_equal(a.op_codes, b.op_codes):
            return False
    elif not np.array_equal(_tags(a), _tags(b)):
        return False
    by_name_b = {name: node for node, name in b.names.items()}
    return all(by_name_b.get(name, node) == node for node, name in a.names.items())


def _tag_numbers(a: Graph, b: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Each node's op tag as a number both graphs share (int32): equal numbers, equal tags."""
    number: dict[str, int] = {}
    for tag in (*a.op_table, *b.op_table):
        number.setdefault(tag, len(number))
    table_a = np.array([number[tag] for tag in a.op_table], dtype=np.int32)
    table_b = np.array([number[tag] for tag in b.op_table], dtype=np.int32)
    return table_a[a.op_codes], table_b[b.op_codes]


def _walk(
    a: tuple[np.ndarray, np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray, np.ndarray],
    matched: np.ndarray,
    used: np.ndarray,
    differs: np.ndarray,
    stack: np.ndarray,
    count: int,
) -> None:
    """The structural walk (the reference of the C kernel ``align_walk`` in ``csrc/topo.c``):
    from every pair on ``stack`` (``count`` pairs, the last pushed first), parents of A and B are
    paired position by position where their tags agree and neither is paired yet; ``differs[pa]``
    keeps the first node of B seen in pa's place with another tag, cleared once pa is paired; such
    a pair is walked on too (an edited op's inputs still pair by position).
    ``a`` and ``b`` are each graph's (offsets, parents, tags); the arrays are updated in place."""
    offsets_a, parents_a, tags_a = (column.tolist() for column in a)
    offsets_b, parents_b, tags_b = (column.tolist() for column in b)
    pairs = [(int(stack[2 * k]), int(stack[2 * k + 1])) for k in range(count)]
    while pairs:
        node, other = pairs.pop()
        in_a = parents_a[offsets_a[node] : offsets_a[node + 1]]
        in_b = parents_b[offsets_b[other] : offsets_b[other + 1]]
        for pa, pb in zip(in_a, in_b, strict=False):
            if matched[pa] >= 0 or used[pb]:
                continue
            if tags_a[pa] == tags_b[pb]:
                matched[pa] = pb
                used[pb] = True
                differs[pa] = -1
                pairs.append((pa, pb))
            elif differs[pa] < 0:
                differs[pa] = pb
                pairs.append((pa, pb))  # walked on: their inputs pair by position, as an edit keeps them


def align(a: Graph, b: Graph, engine: Engine | None = None) -> tuple[np.ndarray, list[Unaligned]]:
    """Pair the nodes of A with those of B: ``matched[a]`` (-1 for none) and what stayed apart.
    The structural walk runs in C (``engine``: by default the compiled kernels where they are
    built, whatever the graphs' size) or in its pure-Python reference :func:`_walk`."""
    if _same_shape(a, b):
        return np.arange(a.num_nodes, dtype=np.int64), []
    return _align_walked(a, b, engine)


def _align_walked(a: Graph, b: Graph, engine: Engine | None) -> tuple[np.ndarray, list[Unaligned]]:
    """:func:`align` for two graphs that are not the same but for numbers."""
    tags_a, tags_b = _tag_numbers(a, b)
    matched = np.full(a.num_nodes, -1, dtype=np.int64)
    used = np.zeros(b.num_nodes, dtype=bool)
    differs = np.full(a.num_nodes, -1, dtype=np.int64)
    stack = np.empty(4 * a.num_nodes, dtype=np.int64)  # a node of A is pushed once paired, once differing
    count = 0
    by_name_b: dict[str, int] = {}
    for node, name in b.names.items():
        by_name_b.setdefault(name, node)
    for node, name in a.names.items():
        other = by_name_b.get(name)
        if other is not None and not used[other]:
            matched[node] = other
            used[other] = True
            stack[2 * count : 2 * count + 2] = node, other
            count += 1
    for node, other in zip(a.outputs, b.outputs, strict=False):
        if matched[node] < 0 and not used[other]:
            if tags_a[node] == tags_b[other]:
                matched[node] = other
                used[other] = True
                stack[2 * count : 2 * count + 2] = node, other
                count += 1
            else:
                differs[node] = other
    columns_a = (a.parent_offsets, a.parent_indices, tags_a)
    columns_b = (b.parent_offsets, b.parent_indices, tags_b)
    compiled = (engine or compiled_checks()).kernels
    if compiled is not None:
        compiled.align_walk(columns_a, columns_b, matched, used, differs, stack, count)
    else:
        _walk(columns_a, columns_b, matched, used, differs, stack, count)
    unaligned: list[Unaligned] = []
    only_a = np.flatnonzero(matched < 0)
    others = differs[only_a]
    in_place = (others >= 0) & ~used[np.maximum(others, 0)]
    for node, other, differ in zip(only_a.tolist(), others.tolist(), in_place.tolist(), strict=True):
        if differ:
            unaligned.append(Unaligned("A", node, a.name(node), a.op(node), "op differs", other))
        else:
            unaligned.append(Unaligned("A", node, a.name(node), a.op(node), "only in A"))
    for node in np.flatnonzero(~used).tolist():
        unaligned.append(Unaligned("B", node, b.name(node), b.op(node), "only in B"))
    return matched, unaligned


def _summary(array: np.ndarray) -> dict[str, Any]:
    return {"shape": list(array.shape), "dtype": str(array.dtype)}


def _compare_arrays(
    x: np.ndarray, y: np.ndarray, rtol: float | None, atol: float | None, nan_equal: bool
) -> tuple[bool, Any, Any]:
    """(agree, what A holds, what B holds) for two arrays of one shape."""
    r, t = tolerances(str(x.dtype), str(y.dtype), rtol, atol)
    ok = close(x, y, r, t, nan_equal)
    if bool(ok.all()):
        return True, None, None
    bad = np.flatnonzero(~ok.reshape(-1))
    first_index = [int(i) for i in np.unravel_index(int(bad[0]), x.shape)]
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.abs(x.astype(np.float64) - y.astype(np.float64)).reshape(-1)[bad]
    max_abs_diff = float(np.nanmax(gap)) if not np.isnan(gap).all() else float("nan")
    common = {"max_abs_diff": max_abs_diff, "first_index": first_index}
    return False, {**_summary(x), **common}, {**_summary(y), **common}


def _numbers(
    kind: str,
    a: Graph,
    b: Graph,
    ia: np.ndarray,
    ib: np.ndarray,
    column_a: np.ndarray | None,
    column_b: np.ndarray | None,
    arrays_a: dict[int, np.ndarray],
    arrays_b: dict[int, np.ndarray],
    rtol: float | None,
    atol: float | None,
    nan_equal: bool,
    structural: list[Difference],
) -> list[Difference]:
    """The aligned pairs (ia[k], ib[k]) whose numbers of this kind differ."""
    found: list[Difference] = []
    tensor = np.zeros(len(ia), dtype=bool)
    if arrays_a or arrays_b:
        in_a = np.zeros(a.num_nodes, dtype=bool)
        in_a[np.fromiter(arrays_a, dtype=np.int64, count=len(arrays_a))] = True
        in_b = np.zeros(b.num_nodes, dtype=bool)
        in_b[np.fromiter(arrays_b, dtype=np.int64, count=len(arrays_b))] = True
        tensor = in_a[ia] | in_b[ib]
    if column_a is not None and column_b is not None:
        r, t = tolerances("float64", "float64", rtol, atol)
        sa, sb = ia[~tensor], ib[~tensor]
        x, y = column_a[sa], column_b[sb]
        bad = np.flatnonzero(~close(x, y, r, t, nan_equal))
        for k in bad.tolist():
            node, other = int(sa[k]), int(sb[k])
            found.append(Difference(kind, node, other, a.name(node), a.op(node), float(x[k]), float(y[k])))
    for node, other in zip(ia[tensor].tolist(), ib[tensor].tolist(), strict=True):
        x = arrays_a.get(node)
        y = arrays_b.get(other)
        if x is None and column_a is not None:
            x = np.asarray(column_a[node])
        if y is None and column_b is not None:
            y = np.asarray(column_b[other])
        if x is None or y is None:
            continue
        if kind == "value" and x.dtype != y.dtype:
            structural.append(Difference("dtype", node, other, a.name(node), a.op(node), str(x.dtype), str(y.dtype)))
        if x.shape != y.shape:
            if kind == "value":
                structural.append(
                    Difference("shape", node, other, a.name(node), a.op(node), list(x.shape), list(y.shape))
                )
            continue
        agree, shown_a, shown_b = _compare_arrays(x, y, rtol, atol, nan_equal)
        if not agree:
            found.append(Difference(kind, node, other, a.name(node), a.op(node), shown_a, shown_b))
    found.sort(key=lambda d: d.node)
    return found


def _parents_differ(a: Graph, b: Graph, ia: np.ndarray, ib: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """The positions k of the aligned pairs (ia[k], ib[k]) whose parent lists differ through the
    alignment (another count, or a parent of A not aligned with B's parent in its place): one
    gather over the edges, no loop over nodes."""
    counts_a = np.diff(a.parent_offsets)[ia]
    counts_b = np.diff(b.parent_offsets)[ib]
    same = counts_a == counts_b
    positions = np.flatnonzero(same)
    counts = counts_a[positions]
    pair = np.repeat(np.arange(len(positions)), counts)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    parents_a = a.parent_indices[a.parent_offsets[ia[positions]][pair] + within]
    parents_b = b.parent_indices[b.parent_offsets[ib[positions]][pair] + within]
    differ = positions[np.unique(pair[matched[parents_a] != parents_b])]
    return np.union1d(differ, np.flatnonzero(~same))


def diff(
    a: Graph, b: Graph, rtol: float | None = None, atol: float | None = None, nan_equal: bool = False
) -> GraphDiff:
    """Compare graph A with graph B (see the module docstring): a :class:`GraphDiff`."""
    for what, tolerance in (("rtol", rtol), ("atol", atol)):
        if tolerance is not None and not (tolerance >= 0 and np.isfinite(tolerance)):
            raise UsageError(f"--{what} must be a finite number >= 0, not {tolerance!r}")
    identity = _same_shape(a, b)  # then the alignment is node for node and every parent list agrees
    unaligned: list[Unaligned] = []
    if identity:
        matched = np.arange(a.num_nodes, dtype=np.int64)
    else:
        matched, unaligned = _align_walked(a, b, None)
    ia = np.flatnonzero(matched >= 0)
    ib = matched[ia]
    structural: list[Difference] = []
    # op tags, parents (through the alignment) and attributes of the aligned pairs
    tags_a, tags_b = np.asarray(a.op_table, dtype=object), np.asarray(b.op_table, dtype=object)
    suspects = set(np.flatnonzero(tags_a[a.op_codes[ia]] != tags_b[b.op_codes[ib]]).tolist())
    if not identity:
        suspects.update(_parents_differ(a, b, ia, ib, matched).tolist())
    for k in sorted(suspects):
        node, other = int(ia[k]), int(ib[k])
        if a.op(node) != b.op(other):
            structural.append(Difference("op", node, other, a.name(node), a.op(node), a.op(node), b.op(other)))
        parents_a = [int(matched[p]) for p in a.parents(node)]
        if parents_a != b.parents(other):
            structural.append(
                Difference("parents", node, other, a.name(node), a.op(node), a.parents(node), b.parents(other))
            )
    if not identity or a.attrs or b.attrs:
        # the aligned nodes with attributes on either side (a mask over A, no loop over nodes)
        has = np.zeros(a.num_nodes, dtype=bool)
        has[np.fromiter(a.attrs, dtype=np.int64, count=len(a.attrs))] = True
        in_b = np.zeros(b.num_nodes, dtype=bool)
        in_b[np.fromiter(b.attrs, dtype=np.int64, count=len(b.attrs))] = True
        has[ia] |= in_b[ib]
        has[matched < 0] = False
        for node in np.flatnonzero(has).tolist():
            other = int(matched[node])
            attrs_a, attrs_b = a.attrs.get(node, {}), b.attrs.get(other, {})
            if attrs_a != attrs_b and a.op(node) == b.op(other):  # two ops' attributes: the op line says it
                keys = sorted(
                    k
                    for k in attrs_a.keys() | attrs_b.keys()
                    if k not in attrs_a or k not in attrs_b or attrs_a[k] != attrs_b[k]
                )
                structural.append(
                    Difference(
                        "attrs",
                        node,
                        other,
                        a.name(node),
                        a.op(node),
                        {k: attrs_a[k] for k in keys if k in attrs_a},  # a key one side lacks: absent
                        {k: attrs_b[k] for k in keys if k in attrs_b},
                    )
                )
    values = _numbers("value", a, b, ia, ib, a.values, b.values, a.arrays, b.arrays, rtol, atol, nan_equal, structural)
    grads = _numbers(
        "grad", a, b, ia, ib, a.grads, b.grads, a.grad_arrays, b.grad_arrays, rtol, atol, nan_equal, structural
    )
    structural.sort(key=lambda d: d.node)
    numeric = sorted(values + grads, key=lambda d: (d.node, d.kind != "value"))
    # Parents have smaller ids than their children: the first op node whose value differs has
    # parents computed by ops that agree (it may read inputs that differ: there the runs part); a
    # leaf when only inputs differ. Walking backward, the last gradient that differs has consumers
    # whose gradients agree.
    computed = [d for d in values if d.op not in LEAF_TAGS]
    return GraphDiff(
        matched=matched,
        structural=structural,
        numeric=numeric,
        unaligned=unaligned,
        first_value=computed[0] if computed else values[0] if values else None,
        first_grad=grads[-1] if grads else None,
        nodes_a=a.num_nodes,
        nodes_b=b.num_nodes,
    )


class _CallableModule(types.ModuleType):
    """``graphsvc.diff`` is both this room and the function: importing the room binds the name
    ``diff`` on the package to the module, so the module, called, is :func:`diff`."""

    def __call__(
        self, a: Graph, b: Graph, rtol: float | None = None, atol: float | None = None, nan_equal: bool = False
    ) -> GraphDiff:
        return diff(a, b, rtol=rtol, atol=atol, nan_equal=nan_equal)


sys.modules[__name__].__class__ = _CallableModule
