"""The graph model: a computation graph stored as columns, and a small builder.

A graph has nodes ``0..N-1``. Node ``i`` has an op tag (``op_table[op_codes[i]]``), an ordered
list of parents (``parent_indices[parent_offsets[i]:parent_offsets[i + 1]]``, repeats allowed),
a value, an optional gradient, an optional name and optional attributes.

A value is a float64 scalar, held in the ``values`` column (``grads`` for gradients), or, for a
*tensor node*, an array: any shape (0-d included) of one of :data:`TENSOR_DTYPES`, held in the
``arrays`` map (``grad_arrays`` for gradients), with ``nan`` in the node's column entries. A graph
with any tensor node is a *tensor graph* (format 2.0); a graph of float64 scalars keeps today's
columns, speed and format 1.0.

Node ids are in topological order: every parent id is smaller than its child's id (the rule ONNX
uses). A cycle therefore cannot be stored; the builder and the JSON converter are where graphs
enter graphsvc, and they enforce the rule.

This module holds no I/O, no msgpack and no pluggy.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from graphsvc.errors import GraphStructureError, UsageError
from graphsvc.native import Engine, engine_for
from graphsvc.text import counted, shown_number

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt

#: Tag of an input node (a value a user may set: a weight, an ``x``).
LEAF = "leaf"
#: Tag of a constant (a number that appeared in an expression, such as the ``2`` in ``2 * a``).
CONST = "const"
#: The tags of nodes without parents.
LEAF_TAGS = frozenset({LEAF, CONST})

OP_CODE_DTYPE = np.dtype("<u2")
OFFSET_DTYPE = np.dtype("<i8")
INDEX_DTYPE = np.dtype("<i4")
FLOAT_DTYPE = np.dtype("<f8")
#: The dtypes a tensor node's value or gradient may have: float64, float32, and int64 for index
#: inputs (class labels, token ids), whose nodes get no gradient.
TENSOR_DTYPES = (np.dtype("float64"), np.dtype("float32"), np.dtype("int64"))
#: The most dimensions a tensor node's array may have (format 2.0 holds no more).
MAX_DIMENSIONS = 32
#: The most distinct op tags one graph can use (op codes are uint16).
MAX_OPS = 1 << 16
#: The most nodes one graph can hold (parent indices are int32).
MAX_NODES = (1 << 31) - 1

NodeRef = int | str
#: The op tags graphsvc's own ops register (:data:`graphsvc.ops.builtin.BUILTIN_OPS`, which a test
#: keeps this equal to): written here so that ``inspect`` need not load the op table.
BUILTIN_TAGS = frozenset(
    "abs add amax broadcast_to concatenate const cos div exp leaf log log_softmax matmul max mean min mul neg "
    "nll_loss pow relu reshape sigmoid sin softmax sqrt sub sum take tanh transpose "
    "addmm layer_norm batch_norm scaled_dot_product_attention stack slice where mse_loss clamp".split()
)
#: :meth:`Graph.ops_by_plugin`'s key for builtin tags a file attributes to no plugin.
BUILTIN_KEY = "graphsvc (builtin)"
#: What a caller wants a node for, which an unknown name's message lists (:meth:`Graph.unknown_name`).
NodeKind = Literal["leaves", "outputs"]
#: A node id written as text: ASCII digits, optionally after one minus sign.
_ID_TEXT = re.compile(r"-?[0-9]+")


class OpSource(NamedTuple):
    """Where an op tag comes from: the plugin distribution and its version, when known. (A
    NamedTuple, not a frozen dataclass: every command that reads a file imports this module.)"""

    plugin: str | None = None
    version: str | None = None


@dataclass(eq=False)
class Graph:
    """A computation graph as columns. See the module docstring for the layout.

    Arrays of a loaded or built graph are read-only; use :meth:`copy` before changing one in place.
    """

    op_table: list[str]
    op_codes: npt.NDArray[np.uint16]
    parent_offsets: npt.NDArray[np.int64]
    parent_indices: npt.NDArray[np.int32]
    values: npt.NDArray[np.float64]
    grads: npt.NDArray[np.float64] | None = None
    names: dict[int, str] = field(default_factory=dict)
    attrs: dict[int, dict[str, Any]] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    op_sources: dict[str, OpSource] = field(default_factory=dict)
    #: Values of the tensor nodes (see the module docstring): node -> array.
    arrays: dict[int, np.ndarray] = field(default_factory=dict)
    #: Gradients of the tensor nodes: node -> array of its value's shape.
    grad_arrays: dict[int, np.ndarray] = field(default_factory=dict)
    #: :meth:`_named`'s index of :attr:`names` (name -> node).
    _by_name: dict[str, int] | None = field(default=None, init=False, repr=False)

    # -- sizes and per-node access -------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.op_codes)

    @property
    def num_edges(self) -> int:
        return len(self.parent_indices)

    def op(self, node: int) -> str:
        return self.op_table[int(self.op_codes[node])]

    def parents(self, node: int) -> list[int]:
        start, stop = self.parent_offsets[node], self.parent_offsets[node + 1]
        return [int(p) for p in self.parent_indices[start:stop]]

    def name(self, node: int) -> str | None:
        return self.names.get(node)

    def label(self, node: int) -> str:
        """The node's name, or ``#id`` when it has none."""
        name = self.names.get(node)
        return name if name is not None else f"#{node}"

    def node_id(self, ref: NodeRef, among: NodeKind | None = None) -> int:
        """Resolve a node id or a name (a string of digits is an id when no node has that name).

        An unknown name is a :class:`UsageError` that suggests the close names (:meth:`unknown_name`);
        ``among`` says what the caller wants (``"leaves"``: a node to set, ``"outputs"``: a node to
        differentiate), which the message then lists."""
        if isinstance(ref, str):
            named = self._named(ref)
            if named is not None:
                return named
            if not _ID_TEXT.fullmatch(ref):
                raise UsageError(self.unknown_name(ref, among))
            ref = int(ref)
        elif isinstance(ref, bool) or not isinstance(ref, (int, np.integer)):
            raise TypeError(f"a node is given by its id (an int) or its name (a str), not {type(ref).__name__}")
        if not 0 <= ref < self.num_nodes:
            raise UsageError(f"no node with id {ref} (the graph has {counted(self.num_nodes, 'node')})")
        return int(ref)

    def unknown_name(self, name: str, among: NodeKind | None = None) -> str:
        """The message for a node name no node has: ``no node named 'A'; did you mean 'a'?``, with
        the nodes ``among`` names listed, ``(the leaves: a, b, c)`` or ``(the outputs: L)``. Close
        names are those :func:`difflib.get_close_matches` finds, letter case aside, among the
        leaves that can be set (``among="leaves"``) or else every name (the first
        :data:`SUGGESTION_POOL` of them: a suggestion costs microseconds a name)."""
        from graphsvc.text import listed, shorten

        pool: list[int] | None = None
        if among == "leaves":
            codes = [code for code, tag in enumerate(self.op_table) if tag in LEAF_TAGS]
            pool = np.flatnonzero(np.isin(self.op_codes, codes)).tolist()
        elif among == "outputs":
            pool = list(self.outputs)
        candidates = self.names.values() if pool is None or among == "outputs" else (self.names.get(n) for n in pool)
        message = f"no node named {shorten(repr(name), NAME_CHARS)}"
        close = close_names(name, itertools.islice(candidates, SUGGESTION_POOL))
        if close:
            message += f"; did you mean {' or '.join(listed([c], quoted=True) for c in close)}?"
        if pool is not None:
            shown = listed(map(self.label, pool[:10]), total=len(pool)) or "none"
            message += f" (the {among}: {shown})"
        return message

    def _named(self, name: str) -> int | None:
        """The node called ``name``, or None. A name found costs one dict access: an index of the
        names is made on first use and each answer is checked against :attr:`names` (which a
        caller may change); an answer that no longer holds, or a name not in the index that a scan
        (as every lookup was before) finds after all, makes the index again. A name no node has (an
        id written as text, a typo) costs that one scan and keeps the index."""
        node = None if self._by_name is None else self._by_name.get(name)
        if node is not None and self.names.get(node) == name:
            return node
        if node is None and self._by_name is not None:
            found = next((node for node, named in self.names.items() if named == name), None)
            if found is None:
                return None
        index: dict[str, int] = {}
        try:
            for node, named in self.names.items():
                index.setdefault(named, node)  # the first, as a scan finds it
        except TypeError:  # an unhashable name (a graph not checked yet, whose names break the rules)
            self._by_name = None
            return next((node for node, named in self.names.items() if named == name), None)
        self._by_name = index
        return index.get(name)

    def check_settable(self, node: int) -> None:
        """Raise :class:`UsageError` unless ``node`` is a leaf (or a const): the only nodes a
        replay's overrides may set."""
        if self.op(node) not in LEAF_TAGS:
            raise UsageError(f"node {self.label(node)} is a {self.op(node)} node, not a leaf: only leaves can be set")

    @property
    def is_tensor_graph(self) -> bool:
        """True when some node holds an array (or a scalar that is not float64): format 2.0."""
        return bool(self.arrays) or bool(self.grad_arrays)

    @property
    def has_grads(self) -> bool:
        """True when the graph holds gradients: the ``grads`` column, or a tensor node's gradient."""
        return self.grads is not None or bool(self.grad_arrays)

    @property
    def has_computed_values(self) -> bool:
        """True when some node computed by an op (not a leaf or a const) stores a value: an array,
        or a number in the ``values`` column (nan there means none). What ``forward --check`` has
        to compare a replay with."""
        computed = ~_leaf_mask(self, _leaf_codes(self))[self.op_codes]
        if computed[np.fromiter(self.arrays, dtype=np.int64, count=len(self.arrays))].any():
            return True
        return bool(np.any(~np.isnan(self.values[computed])))

    def tensor_summary(self) -> dict[str, Any]:
        """What the tensor nodes' arrays hold: ``{"nodes": how many nodes hold an array, "dtypes":
        {dtype: nodes} sorted by dtype name, "value_bytes": the arrays' bytes, "grad_bytes": the
        gradient arrays' bytes}`` (all zero and empty for a graph of scalars)."""
        dtypes: dict[str, int] = {}
        for array in self.arrays.values():
            dtypes[str(array.dtype)] = dtypes.get(str(array.dtype), 0) + 1
        return {
            "nodes": len(self.arrays),
            "dtypes": dict(sorted(dtypes.items())),
            "value_bytes": sum(a.nbytes for a in self.arrays.values()),
            "grad_bytes": sum(a.nbytes for a in self.grad_arrays.values()),
        }

    def value(self, ref: NodeRef) -> float | np.ndarray:
        """The value of a node, given by its id or its name: a float for a scalar node, an array
        for a tensor node."""
        node = self.node_id(ref)
        array = self.arrays.get(node)
        return float(self.values[node]) if array is None else array

    def grad(self, ref: NodeRef) -> float | np.ndarray:
        """The gradient of a node, given by its id or its name (a float or an array, as
        :meth:`value`); :class:`UsageError` when the graph holds no gradients
        (``graphsvc.backward(graph)`` returns a graph that does)."""
        node = self.node_id(ref)
        array = self.grad_arrays.get(node)
        if array is not None:
            return array
        if self.grads is None:
            if self.grad_arrays:  # a captured step: PyTorch computed none for this node
                raise UsageError(
                    f"node {self.label(node)} has no gradient stored "
                    f"(the graph stores those of {counted(len(self.grad_arrays), 'other node')})"
                )
            raise UsageError(
                f"the graph holds no gradients, so node {self.label(node)} has none: "
                "replay it with graphsvc.backward(graph) first"
            )
        return float(self.grads[node])

    # -- derived columns ---------------------------------------------------------------------
    def parent_counts(self) -> npt.NDArray[np.int64]:
        return np.diff(self.parent_offsets)

    def child_counts(self) -> npt.NDArray[np.int64]:
        """How many parent slots point at each node (``x*x`` counts twice for ``x``)."""
        return np.bincount(self.parent_indices, minlength=self.num_nodes).astype(np.int64)

    def child_ids(self) -> npt.NDArray[np.int64]:
        """For each edge (parent slot), the id of the node that owns it."""
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.parent_counts())

    def sinks(self) -> npt.NDArray[np.int64]:
        """Nodes that are nobody's parent, in increasing id order."""
        return np.flatnonzero(self.child_counts() == 0)

    def leaves(self) -> npt.NDArray[np.int64]:
        """Nodes without parents, in increasing id order."""
        return np.flatnonzero(self.parent_counts() == 0)

    def ops_by_plugin(self) -> dict[str, list[str]]:
        """The op tags grouped by the plugin the file records for them, ``"plugin version"`` (``?``
        for an unknown version); a tag the file records none for is ``"graphsvc (builtin)"`` when
        graphsvc's own ops have it (:data:`BUILTIN_TAGS`), else ``"unknown"``. Sorted by that key,
        each list sorted."""
        plugins: dict[str, list[str]] = {}
        for tag in self.op_table:
            source = self.op_sources.get(tag)
            if source is None or source.plugin is None:
                key = BUILTIN_KEY if tag in BUILTIN_TAGS else "unknown"
            else:
                key = f"{source.plugin} {source.version or '?'}"
            plugins.setdefault(key, []).append(tag)
        return {key: sorted(tags) for key, tags in sorted(plugins.items())}

    def __repr__(self) -> str:
        """One line, however large the graph: sizes, the commonest ops, the outputs, what it holds."""
        n = self.num_nodes
        counts = np.bincount(self.op_codes, minlength=len(self.op_table)) if n else np.zeros(0, dtype=np.int64)
        tags = {op: int(counts[code]) for code, op in enumerate(self.op_table) if code < len(counts)}
        kinds = [counted(tags.get(LEAF, 0), "leaf", plural="leaves", thousands=True)]
        if tags.get(CONST):
            kinds.append(counted(tags[CONST], "const", thousands=True))
        ops = sorted(((c, op) for op, c in tags.items() if op not in LEAF_TAGS and c), key=lambda t: (-t[0], t[1]))
        shown = " ".join(f"{op}×{c:,}" for c, op in ops[:5]) + (f" +{len(ops) - 5} more" if len(ops) > 5 else "")
        parts = [
            f"{counted(n, 'node', thousands=True)} ({', '.join(kinds)})",
            counted(self.num_edges, "edge", thousands=True),
        ]
        if shown:
            parts.append(f"ops {shown}")
        if self.outputs:
            labels = ", ".join(repr(self.label(o)) if self.name(o) else self.label(o) for o in self.outputs[:3])
            parts.append(f"output {labels}" + (f" +{len(self.outputs) - 3} more" if len(self.outputs) > 3 else ""))
        if self.is_tensor_graph:
            dtypes = sorted({str(a.dtype) for a in self.arrays.values()})
            largest = max(self.arrays.values(), key=lambda a: a.size, default=None)
            holds = f"tensors {'/'.join(dtypes)}" + ("" if largest is None else f" (largest {list(largest.shape)})")
        else:
            holds = "float64 scalars"
        parts.append(holds + (", grads" if self.has_grads else ""))
        return f"<Graph: {', '.join(parts)}>"

    def op_histogram(self) -> dict[str, int]:
        counts = np.bincount(self.op_codes, minlength=len(self.op_table))
        return {tag: int(c) for tag, c in zip(self.op_table, counts, strict=False) if c}

    def copy(self, *, arrays: bool = True) -> Graph:
        """A deep copy with writable arrays (``arrays=False``: without the tensor nodes' arrays,
        for a caller that replaces them)."""
        return Graph(
            op_table=list(self.op_table),
            op_codes=self.op_codes.copy(),
            parent_offsets=self.parent_offsets.copy(),
            parent_indices=self.parent_indices.copy(),
            values=self.values.copy(),
            grads=None if self.grads is None else self.grads.copy(),
            names=dict(self.names),
            attrs=copy_maps(self.attrs),
            outputs=list(self.outputs),
            metadata=data_copy(self.metadata),
            op_sources=dict(self.op_sources),
            arrays={k: v.copy() for k, v in self.arrays.items()} if arrays else {},
            grad_arrays={k: v.copy() for k, v in self.grad_arrays.items()} if arrays else {},
        )

    # -- validation ------------------------------------------------------------------------
    def check(self, engine: Engine | None = None, *, arrays_checked: bool = False) -> None:
        """Check every structural rule, vectorized; raise :class:`GraphStructureError` on the first broken one.

        ``engine``: the compiled check or the reference; by default the one
        :func:`graphsvc.native.engine_for` picks for the graph's size. ``arrays_checked``: the
        caller made :attr:`arrays` and :attr:`grad_arrays` itself and held them to their rules
        already (a file's tensor table, in :mod:`graphsvc.format.document`), so they are not looked at again."""
        n = self.num_nodes
        e = self.num_edges
        if n > MAX_NODES:
            raise GraphStructureError(f"too many nodes: {n} (at most {MAX_NODES})")
        if len(self.op_table) != len(set(self.op_table)):
            dup = _first_duplicate(self.op_table)
            raise GraphStructureError(f"op table lists {dup!r} twice")
        if len(self.op_table) > MAX_OPS:
            raise GraphStructureError(f"too many ops: {len(self.op_table)} (at most {MAX_OPS})")
        for tag in self.op_table:
            if not isinstance(tag, str) or not tag:
                raise GraphStructureError(f"op tag {tag!r} is not a non-empty string")
        for column, length in (("values", n), ("parent_offsets", n + 1)):
            got = len(getattr(self, column))
            if got != length:
                raise GraphStructureError(
                    f"column {column} has {counted(got, 'entry', plural='entries')}, expected {length}"
                )
        if self.grads is not None and len(self.grads) != n:
            raise GraphStructureError(
                f"column grads has {counted(len(self.grads), 'entry', plural='entries')}, expected {n}"
            )
        leaf_codes = _leaf_codes(self)
        compiled = (engine or engine_for(n)).kernels
        if compiled is None or not compiled.structure_ok(
            self.parent_offsets, self.parent_indices, self.op_codes, len(self.op_table), _leaf_mask(self, leaf_codes)
        ):
            self._check_columns(n, e, leaf_codes)  # names the first broken rule
        self._check_sparse(n)
        if not arrays_checked:
            self._check_arrays(n)

    def _check_columns(self, n: int, e: int, leaf_codes: list[int]) -> None:
        """The column rules, vectorized, each failure named; the compiled ``structure_ok`` is the
        fast path for large graphs that pass."""
        offsets = self.parent_offsets
        if offsets[0] != 0:
            raise GraphStructureError(f"parent_offsets must start at 0, not {int(offsets[0])}")
        if offsets[-1] != e:
            raise GraphStructureError(f"parent_offsets ends at {int(offsets[-1])} but there are {e} parent indices")
        # compare neighbours, not their difference: a hostile file's offsets can differ by more
        # than int64 holds, and the wrapped difference would look positive
        bad = np.flatnonzero(offsets[1:] < offsets[:-1])
        if len(bad):
            raise GraphStructureError(f"parent_offsets decreases at node {int(bad[0])}")
        counts = np.diff(offsets)  # safe now: every offset lies in 0..e
        if n and int(self.op_codes.max()) >= len(self.op_table):
            node = int(np.argmax(self.op_codes >= len(self.op_table)))
            raise GraphStructureError(
                f"node {node} has op code {int(self.op_codes[node])}, but the op table has "
                f"{counted(len(self.op_table), 'entry', plural='entries')}"
            )
        if e:
            if int(self.parent_indices.min()) < 0:
                slot = int(np.argmax(self.parent_indices < 0))
                child = int(np.searchsorted(offsets, slot, side="right") - 1)
                raise GraphStructureError(f"node {child} has a negative parent index {int(self.parent_indices[slot])}")
            if int(self.parent_indices.max()) >= n:
                slot = int(np.argmax(self.parent_indices >= n))
                child = int(np.searchsorted(offsets, slot, side="right") - 1)
                raise GraphStructureError(
                    f"node {child} has parent {int(self.parent_indices[slot])}, which does not exist "
                    f"(the graph has {counted(n, 'node')})"
                )
            _check_parents_precede(self.parent_indices, offsets, counts)
        if leaf_codes:
            with_parents = _leaf_mask(self, leaf_codes)[self.op_codes] & (counts > 0)  # op codes < len(op_table) here
            if with_parents.any():
                node = int(np.argmax(with_parents))
                raise GraphStructureError(f"node {node} is a {self.op(node)} but has parents")

    def _check_sparse(self, n: int) -> None:
        seen: dict[str, int] = {}
        for node, name in () if _names_ok(self.names, n) else self.names.items():
            if not 0 <= node < n:
                raise GraphStructureError(f"name {name!r} is given to node {node}, which does not exist")
            if not isinstance(name, str) or not name:
                raise GraphStructureError(f"node {node} has a name that is not a non-empty string")
            if name in seen:
                raise GraphStructureError(f"name {name!r} is used by nodes {seen[name]} and {node}")
            seen[name] = node
        for node, attrs in () if _attrs_ok(self.attrs, n) else self.attrs.items():
            if not 0 <= node < n:
                raise GraphStructureError(f"attributes are given to node {node}, which does not exist")
            if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
                raise GraphStructureError(f"attributes of node {node} must be a map with string keys")
        for out in self.outputs:
            if not 0 <= out < n:
                raise GraphStructureError(f"output {out} does not exist (the graph has {counted(n, 'node')})")

    def _check_arrays(self, n: int) -> None:
        for what, arrays in (("value", self.arrays), ("gradient", self.grad_arrays)):
            if _arrays_ok(arrays, n):
                continue  # every rule below holds: checked a column at a time
            for node, array in arrays.items():
                if not 0 <= node < n:
                    raise GraphStructureError(f"a {what} array is given to node {node}, which does not exist")
                if not isinstance(array, np.ndarray) or array.dtype not in TENSOR_DTYPES:
                    kind = f"array of {array.dtype}" if isinstance(array, np.ndarray) else type(array).__name__
                    raise GraphStructureError(
                        f"node {node}: a {what} must be an array of float64, float32 or int64, not {kind}"
                    )
                if array.ndim > MAX_DIMENSIONS:
                    raise GraphStructureError(
                        f"node {node}: a {what} array has {counted(array.ndim, 'dimension')}, "
                        f"more than {MAX_DIMENSIONS}"
                    )
        arrays = self.arrays
        for node, grad in self.grad_arrays.items():
            value = arrays.get(node)
            if value is not None and grad.dtype != value.dtype:  # as PyTorch: a gradient has its tensor's dtype
                raise GraphStructureError(
                    f"node {node}'s gradient array has dtype {grad.dtype}, but its value array has dtype {value.dtype}"
                )
            if value is not None and grad.shape != value.shape:
                raise GraphStructureError(
                    f"node {node}'s gradient array has shape {list(grad.shape)}, "
                    f"but its value array has shape {list(value.shape)}"
                )


#: :data:`TENSOR_DTYPES` as a set, for one look-up per array.
_TENSOR_DTYPE_SET = frozenset(TENSOR_DTYPES)
_DTYPE_OF, _NDIM_OF = operator.attrgetter("dtype"), operator.attrgetter("ndim")


def expect_graph(function: str, graph: object) -> None:
    """The TypeError of a public ``function`` given something other than a :class:`Graph` (a path
    or bytes: with how to load it first)."""
    if isinstance(graph, Graph):
        return
    given = type(graph).__name__
    if isinstance(graph, (str, os.PathLike)):
        raise TypeError(f"{function}() takes a Graph, not {given}: load the file first, graphsvc.load(path)")
    if isinstance(graph, (bytes, bytearray, memoryview)):
        raise TypeError(f"{function}() takes a Graph, not {given}: decode it first, graphsvc.loads(data)")
    raise TypeError(f"{function}() takes a Graph, not {given}")


def _names_ok(names: dict[int, str], n: int) -> bool:
    """Do the names keep every rule :meth:`Graph._check_sparse` holds them to (node ids in range,
    non-empty strings, none twice)? When not, its loop names the first broken one."""
    if not names:
        return True
    if set(map(type, names)) != {int} or min(names) < 0 or max(names) >= n:
        return False
    texts = names.values()
    return set(map(type, texts)) == {str} and all(texts) and len(set(texts)) == len(names)


def _attrs_ok(attrs: dict[int, dict[str, Any]], n: int) -> bool:
    """Do the attributes keep every rule :meth:`Graph._check_sparse` holds them to (node ids in
    range, each a map with string keys)? When not, its loop names the first broken one."""
    if not attrs:
        return True
    if set(map(type, attrs)) != {int} or min(attrs) < 0 or max(attrs) >= n:
        return False
    maps = attrs.values()
    return set(map(type, maps)) == {dict} and set(map(type, itertools.chain.from_iterable(maps))) <= {str}


def _arrays_ok(arrays: dict[int, np.ndarray], n: int) -> bool:
    """Do the arrays of one map keep every rule :meth:`Graph._check_arrays` holds them to (node ids
    in range, an ndarray of a tensor dtype, at most :data:`MAX_DIMENSIONS` dimensions)? When not, the
    caller's loop names the first broken one."""
    if not arrays:
        return True
    if set(map(type, arrays)) != {int} or min(arrays) < 0 or max(arrays) >= n:
        return False
    items = arrays.values()
    if set(map(type, items)) != {np.ndarray}:
        return False
    dtypes_ok = set(map(_DTYPE_OF, items)) <= _TENSOR_DTYPE_SET
    return dtypes_ok and max(map(_NDIM_OF, items)) <= MAX_DIMENSIONS


def _leaf_codes(graph: Graph) -> list[int]:
    """The op codes of the leaf tags (``leaf``, ``const``) in the graph's op table."""
    return [code for code, tag in enumerate(graph.op_table) if tag in LEAF_TAGS]


def _leaf_mask(graph: Graph, leaf_codes: list[int]) -> npt.NDArray[np.bool_]:
    mask = np.zeros(max(len(graph.op_table), 1), dtype=np.bool_)
    mask[leaf_codes] = True
    return mask


def _check_parents_precede(
    parents: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> None:
    """Every parent id must be smaller than its child's id; name the first node that breaks it."""
    has_parents = np.flatnonzero(counts > 0)
    largest = np.maximum.reduceat(parents, offsets[:-1][has_parents])
    bad = np.flatnonzero(largest >= has_parents)
    if not len(bad):
        return
    child = int(has_parents[bad[0]])
    parent = int(largest[bad[0]])
    if parent == child:
        raise GraphStructureError(f"node {child} lists itself as a parent (a self-loop)")
    raise GraphStructureError(
        f"node {child} has parent {parent}, which does not come before it: "
        "node ids must be in topological order (every parent id smaller than its child's)"
    )


def _first_duplicate(items: Iterable[Any]) -> Any:
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def graph_from_buffers(
    op_table: list[str],
    op_codes: Any,
    offsets: Any,
    parents: Any,
    values: Any,
    grads: Any = None,
    **fields: Any,
) -> Graph:
    """A graph over the byte buffers a C walk fills (graphsvc.native._cwalk), without copying them: op
    codes (uint16), parent offsets (int64), parent ids (int32), values and grads (float64; grads
    ``None`` for none). ``fields`` are the other :class:`Graph` fields. Not checked."""
    return Graph(
        op_table=op_table,
        op_codes=np.frombuffer(op_codes, dtype=OP_CODE_DTYPE),
        parent_offsets=np.frombuffer(offsets, dtype=OFFSET_DTYPE),
        parent_indices=np.frombuffer(parents, dtype=INDEX_DTYPE),
        values=np.frombuffer(values, dtype=FLOAT_DTYPE),
        grads=None if grads is None else np.frombuffer(grads, dtype=FLOAT_DTYPE),
        **fields,
    )


def graph_from_lists(
    tags: Sequence[str], parent_counts: Iterable[int], parents: Iterable[int], values: Iterable[float], **fields: Any
) -> Graph:
    """A graph from per-node lists, as tracers and importers collect them: each node's op tag, its
    number of parents, all parent ids in node order, and the values. ``fields`` are the other
    :class:`Graph` fields (grads, names, attrs, outputs, metadata, op_sources, arrays,
    grad_arrays). Every graph built from Python lists is assembled here (GraphBuilder, the JSON
    reader, Value's tracing); only the op table's size is checked."""
    op_table = list(dict.fromkeys(tags))
    if len(op_table) > MAX_OPS:  # op codes are uint16
        raise GraphStructureError(f"too many ops: {len(op_table)} (at most {MAX_OPS})")
    code_of = {tag: code for code, tag in enumerate(op_table)}
    counts = np.fromiter(parent_counts, dtype=OFFSET_DTYPE, count=len(tags))
    offsets = np.zeros(len(tags) + 1, dtype=OFFSET_DTYPE)
    np.cumsum(counts, out=offsets[1:])
    return Graph(
        op_table=op_table,
        op_codes=np.fromiter(map(code_of.__getitem__, tags), dtype=OP_CODE_DTYPE, count=len(tags)),
        parent_offsets=offsets,
        parent_indices=np.fromiter(parents, dtype=INDEX_DTYPE, count=int(offsets[-1])),
        values=np.fromiter(values, dtype=FLOAT_DTYPE, count=len(tags)),
        **fields,
    )


class GraphBuilder:
    """Build a graph by hand, node by node, as seed 000 does with ``Node('t3', [one, t2])``.

    >>> b = GraphBuilder()
    >>> a, c = b.leaf(2.0, name="a"), b.const(3.0)
    >>> y = b.add("mul", [a, c], name="y", value=6.0)
    >>> graph = b.build(outputs=[y])

    Parents are node ids or names of nodes added earlier, so the ids come out in topological
    order and a cycle cannot be built.
    """

    def __init__(self) -> None:
        self._tags: list[str] = []
        self._counts: list[int] = []
        self._parents: list[int] = []
        self._values: list[float] = []
        self._grads: list[float] = []
        self._has_grads = False
        self._names: dict[int, str] = {}
        self._by_name: dict[str, int] = {}
        self._attrs: dict[int, dict[str, Any]] = {}
        self._arrays: dict[int, np.ndarray] = {}
        self._grad_arrays: dict[int, np.ndarray] = {}
        self.op_sources: dict[str, OpSource] = {}

    def __len__(self) -> int:
        return len(self._tags)

    def leaf(
        self, value: float | np.ndarray = 0.0, name: str | None = None, grad: float | np.ndarray | None = None
    ) -> int:
        """Add an input node: a float, or an array (a tensor node; it is copied)."""
        return self.add(LEAF, [], value=value, name=name, grad=grad)

    def const(self, value: float | np.ndarray, name: str | None = None) -> int:
        """Add a constant: a float or an array."""
        return self.add(CONST, [], value=value, name=name)

    def add(
        self,
        op: str,
        parents: Sequence[NodeRef] = (),
        *,
        value: float | np.ndarray = math.nan,
        name: str | None = None,
        attrs: Mapping[str, Any] | None = None,
        grad: float | np.ndarray | None = None,
    ) -> int:
        """Add a node and return its id. A value left out is ``nan`` (no stored value) until a
        forward replay. A value or gradient given as a numpy array (or a numpy scalar other than
        float64) makes the node a tensor node holding a copy of it; a float keeps it a scalar node."""
        if not isinstance(op, str) or not op:
            raise GraphStructureError(f"op tag {op!r} is not a non-empty string")
        node = len(self._tags)
        ids = [self._resolve(p, node) for p in parents]
        if op in LEAF_TAGS and ids:
            raise GraphStructureError(f"a {op} node cannot have parents")
        if name is not None:
            if not isinstance(name, str) or not name:
                raise GraphStructureError(f"name {name!r} is not a non-empty string")
            if name in self._by_name:
                raise GraphStructureError(f"name {name!r} is already used by node {self._by_name[name]}")
            self._names[node] = name
            self._by_name[name] = node
        self._tags.append(op)
        self._parents.extend(ids)
        self._counts.append(len(ids))
        if isinstance(value, (np.ndarray, np.generic)) and _is_tensor(value):
            self._arrays[node] = _tensor(node, "value", value)
            value = math.nan
        if isinstance(grad, (np.ndarray, np.generic)) and _is_tensor(grad):
            self._grad_arrays[node] = _tensor(node, "gradient", grad)
            grad = None
        self._values.append(value if type(value) is float else _number(node, "value", value))
        if grad is not None:
            self._has_grads = True
        self._grads.append(math.nan if grad is None else _number(node, "gradient", grad))
        if attrs:
            self._attrs[node] = {key: data_copy(item) for key, item in attrs.items()}
        return node

    def _resolve(self, ref: NodeRef, node: int) -> int:
        if isinstance(ref, str):
            if ref not in self._by_name:
                close = close_names(ref, itertools.islice(self._by_name, SUGGESTION_POOL), most=1)
                guess = f"; did you mean {close[0]!r}?" if close else ""
                raise GraphStructureError(f"node {node}: no earlier node is named {ref!r}{guess}")
            return self._by_name[ref]
        if not isinstance(ref, (int, np.integer)) or isinstance(ref, bool):
            raise GraphStructureError(f"node {node}: parent {ref!r} is not a node id or name")
        if ref == node:
            raise GraphStructureError(f"node {node} lists itself as a parent (a self-loop)")
        if not 0 <= ref < node:
            raise GraphStructureError(
                f"node {node}: parent {ref} does not exist yet (parents must be added before their children)"
            )
        return int(ref)

    def build(self, outputs: Sequence[NodeRef] | None = None, metadata: Mapping[str, Any] | None = None) -> Graph:
        """Finish the graph. Outputs default to the nodes that are nobody's parent."""
        graph = graph_from_lists(
            self._tags,
            self._counts,
            self._parents,
            self._values,
            grads=np.array(self._grads, dtype=FLOAT_DTYPE) if self._has_grads else None,
            names=dict(self._names),
            attrs=copy_maps(self._attrs),
            metadata=data_copy(dict(metadata or {})),
            op_sources=dict(self.op_sources),
            arrays=dict(self._arrays),
            grad_arrays=dict(self._grad_arrays),
        )
        if outputs is None:
            graph.outputs = [int(s) for s in graph.sinks()]
        else:
            graph.outputs = [graph.node_id(o) for o in outputs]
        graph.check()
        return graph


#: The containers an attribute or the metadata may hold, copied with what they hold.
_CONTAINERS = (dict, list)
#: What :func:`data_copy` copies: the containers, and arrays (a value in Python only; a file has none).
_COPIED = (dict, list, np.ndarray)
#: Types of what :func:`data_copy` shares: a list holding only these is copied as it is, not walked.
_FLAT = frozenset((int, float, str, bool, bytes, type(None)))


def data_copy(value: Any) -> Any:
    """``value`` (an attribute's, or the metadata) with every dict, list and array in it copied, so
    that what the caller changes in place later does not reach the copy, nor the copy's changes the
    original; numbers, strings, bytes and tuples (with what they hold) are shared. Iterative (any
    nesting); a dict or list met twice, or holding itself, is copied once (as ``copy.deepcopy`` does)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if not isinstance(value, _CONTAINERS):
        return value
    if type(value) is list and _FLAT.issuperset(map(type, value)):  # a shape, axes: no walk
        return value.copy()
    copies = {id(value): value.copy()}
    pending = [value]
    while pending:
        original = pending.pop()
        copied = copies[id(original)]
        for key, item in original.items() if isinstance(original, dict) else enumerate(original):
            if isinstance(item, np.ndarray):
                copied[key] = item.copy()
            elif isinstance(item, _CONTAINERS):
                if id(item) not in copies:
                    copies[id(item)] = item.copy()
                    pending.append(item)
                copied[key] = copies[id(item)]
    return copies[id(value)]


def copy_maps(maps: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each node's attributes copied by :func:`data_copy`. Maps of numbers and strings (a million
    ``pow`` exponents) are copied a map at a time, as ``dict()``; only the maps that hold a list, a
    dict or an array are walked (:func:`copy_nested`)."""
    return copy_nested({node: dict(values) for node, values in maps.items()})


def copy_nested(maps: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``maps``, each node's own dict already (a map at a time copy, such as the C walk's), with
    every list, dict and array among their values replaced by its :func:`data_copy`: in place, returned."""
    kinds = set(map(type, itertools.chain.from_iterable(map(dict.values, maps.values()))))
    if any(issubclass(kind, _COPIED) for kind in kinds):
        for values in maps.values():
            for key, item in values.items():
                if isinstance(item, _COPIED):
                    values[key] = data_copy(item)  # a value replaced, no key added: the loop goes on
    return maps


#: The longest a name asked for is shown in :meth:`Graph.unknown_name`'s message.
NAME_CHARS = 100
#: How many names :meth:`Graph.unknown_name` compares with the one asked for.
SUGGESTION_POOL = 100_000


def close_names(name: str, names: Iterable[object], most: int = 3) -> list[str]:
    """Up to ``most`` of ``names`` that ``name`` likely misspells: those equal to it but for letter
    case, else the closest by :func:`difflib.get_close_matches` (compared case-folded); difflib is
    imported here, on the error path only."""
    by_fold: dict[str, str] = {}
    for candidate in names:
        if isinstance(candidate, str):
            by_fold.setdefault(candidate.casefold(), candidate)
    folded = name.casefold()
    if folded in by_fold:
        return [by_fold[folded]]
    import difflib

    return [by_fold[match] for match in difflib.get_close_matches(folded, list(by_fold), n=most)]


def _number(node: int, what: str, number: object) -> float:
    """A scalar node's value or gradient as a float: a real number (a float, an int, a numpy float
    or integer); a bool, a string or any other object is a TypeError, a number past float64's
    range a GraphStructureError (Python refuses to round it to inf)."""
    if isinstance(number, bool) or not isinstance(number, Real):
        raise TypeError(
            f"node {node}: a {what} must be a number (a float or an int) or a numpy array, not {type(number).__name__}"
        )
    try:
        return float(number)
    except OverflowError:
        shown = shown_number(number)
        raise GraphStructureError(f"node {node}: a {what} of {shown} is out of float64's range") from None


def _is_tensor(value: object) -> bool:
    return isinstance(value, np.ndarray) or (isinstance(value, np.generic) and value.dtype != FLOAT_DTYPE)


def native_copy(array: np.ndarray | np.generic) -> np.ndarray:
    """A C-ordered, native-endian copy of ``array`` (big-endian data, a Fortran-ordered or strided
    view): how a graph keeps an array it is given."""
    result = np.array(array, order="C")
    return result.astype(result.dtype.newbyteorder("="), copy=False)


def _tensor(node: int, what: str, array: np.ndarray | np.generic) -> np.ndarray:
    """A C-ordered, native-endian, read-only copy of a tensor node's value or gradient (the graph's
    own, :func:`sealed`: a replay's result may share it); other dtypes refused."""
    result = native_copy(array)
    if result.dtype not in TENSOR_DTYPES:
        raise GraphStructureError(
            f"node {node}: a {what} must be an array of float64, float32 or int64, not {result.dtype}"
        )
    return sealed(result)


def sealed(array: np.ndarray) -> np.ndarray:
    """``array``, which the caller just made (it and the arrays it views: no one else holds them),
    as a graph keeps it: read-only down to the memory's owner, and seen through a view (numpy lets
    an array that owns its memory, or views a writable one, be made writable again; not a view of a
    read-only one), as a loaded graph holds views of its file's bytes."""
    base: object = array
    while isinstance(base, np.ndarray):
        base.setflags(write=False)
        base = base.base
    return array.view()
