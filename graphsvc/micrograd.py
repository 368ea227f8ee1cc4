"""Import a micrograd graph: :func:`from_micrograd`.

pickle cannot save a micrograd graph (each node holds a ``_backward`` closure); this turns one into
a :class:`~graphsvc.graph.Graph` that :func:`graphsvc.save` can write. micrograd itself is never
imported: any object with micrograd's ``data``, ``grad``, ``_prev`` and ``_op`` attributes works.

micrograd keeps a node's parents in a ``set``, which loses two things:

* repeats: ``a * a`` has ``_prev == {a}``. A ``+`` or ``*`` node with one parent is ``[a, a]``.
* order: for two distinct parents, set order changes from run to run. Both ops are commutative,
  so the parents are put in the order of a *canonical key* computed bottom-up from the op, the
  data and the parents' keys (Python's hash of floats and ints is the same in every process).
  The node ids then come from a depth-first post-order over those ordered parents, so the same
  graph imports to the same file in every run. Two distinct parents with equal keys are the same
  expression of the same numbers; they are ordered by a second key, computed the same way from the
  gradients and the names given. Only parents that agree in all of that are left to the set.

A node whose parents lead back to itself (a ``_prev`` changed into a cycle) is refused.

The walk runs in C (``csrc/walk.c``, the module ``graphsvc.native._cwalk``) where that extension is
in use (built, and not turned off by ``GRAPHSVC_NATIVE=0``); :func:`_from_micrograd_reference` below
is the same walk in Python, which runs where it is not, and which the tests compare the C walk
with: the same graph, bit for bit, and the same errors.

Tags: ``+`` -> ``add``, ``*`` -> ``mul``, ``**k`` -> ``pow`` with attribute ``exponent = float(k)``,
``ReLU`` -> ``relu``, ``tanh`` and ``exp`` (from the lecture's version of micrograd) -> ``tanh``
and ``exp``, and ``''`` (a node no op made) -> ``leaf``: micrograd does not tell a weight from a
number written in an expression, so every such node becomes a leaf that ``--set`` can change.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from graphsvc import _version
from graphsvc.errors import GraphStructureError
from graphsvc.graph import (
    FLOAT_DTYPE,
    LEAF,
    Graph,
    OpSource,
    graph_from_buffers,
    graph_from_lists,
)
from graphsvc.text import counted
from graphsvc.value import native_walk

__all__ = ["from_micrograd"]

# micrograd tag -> (graphsvc tag, arity, a small int that stands for the op in canonical keys)
_TAGS: dict[str, tuple[str, int, int]] = {
    "": (LEAF, 0, 0),
    "+": ("add", 2, 1),
    "*": ("mul", 2, 2),
    "ReLU": ("relu", 1, 3),
    "tanh": ("tanh", 1, 4),
    "exp": ("exp", 1, 5),
}
_POW_CODE = 6
# Stands in for nan in keys: hash(nan) depends on the object, not the value.
_NAN_KEY = -1.2345678901234567e308


def _translate(node: Any) -> tuple[str, int, int, float | None]:
    """(graphsvc tag, arity, key code, exponent or None) of a micrograd node."""
    tag = node._op
    known = _TAGS.get(tag)
    if known is not None:
        return (*known, None)
    if isinstance(tag, str) and tag.startswith("**"):
        try:
            exponent = float(tag[2:])
        except ValueError:
            pass
        else:
            return "pow", 1, _POW_CODE, exponent
    raise GraphStructureError(
        f"micrograd node {node!r} has op {tag!r}, which graphsvc cannot import "
        "(known: '+', '*', '**k', 'ReLU', 'tanh', 'exp' and '' for leaves)"
    )


def _prev(node: Any) -> Any:
    try:
        return node._prev
    except AttributeError:
        raise GraphStructureError(
            f"{type(node).__name__} {node!r} is not a micrograd Value (it has no _prev)"
        ) from None


def from_micrograd(*roots: Any, names: Mapping[Any, str] | None = None) -> Graph:
    """The graph of one or more micrograd outputs, with their data and gradients.

    The roots become the graph's outputs. ``names`` maps micrograd nodes to names
    (``{a: "a", loss: "loss"}``), which the CLI shows and ``--set`` accepts. Runs in linear time
    without recursion.
    """
    if not roots:
        raise GraphStructureError("from_micrograd() needs at least one micrograd Value")
    from graphsvc.console.terminal import progress

    with progress("importing from micrograd"):  # on stderr, on a terminal, after a second
        return _from_micrograd(roots, names, native_walk())


def _from_micrograd(roots: Sequence[Any], names: Mapping[Any, str] | None, native: ModuleType | None) -> Graph:
    """The graph of ``roots``, walked by ``native`` (``graphsvc.native._cwalk``) or, when it is None, by
    :func:`_from_micrograd_reference`."""
    if native is None:
        return _from_micrograd_reference(roots, names)
    named = list(names or {})
    name_keys = [_name_key(name) for name in (names or {}).values()]
    op_table, op_codes, offsets, parents, values, grads, attrs, root_ids, named_ids = native.micrograd(
        tuple(roots), _translate, _prev, GraphStructureError, named, name_keys
    )
    source = OpSource("graphsvc", _version.__version__)
    graph = graph_from_buffers(
        op_table,
        op_codes,
        offsets,
        parents,
        values,
        grads,
        attrs=attrs,
        outputs=list(dict.fromkeys(root_ids)),
        metadata={"imported_from": "micrograd"},
        op_sources=dict.fromkeys(op_table, source),
    )
    for (node, name), new in zip((names or {}).items(), named_ids, strict=True):
        if new < 0:
            raise GraphStructureError(f"names: {node!r} (named {name!r}) is not in the graph")
        graph.names[new] = name
    graph.check()
    return graph


def _name_key(name: object) -> int:
    """A name's part of the second key: crc32, not hash() (str hashes change from process to process)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) + 1 if isinstance(name, str) else 0


def _from_micrograd_reference(roots: Sequence[Any], names: Mapping[Any, str] | None) -> Graph:
    # Pass 1: every node once, parents before children, in whatever order the sets give. When a
    # node's parents are all done, its parents are put in canonical order and its key computed.
    nodes: list[Any] = []  # also keeps every node alive, so id() stays unique
    state: dict[int, int] = {}  # id(node) -> -1 while its parents are visited, then its index
    keys: list[int] = []
    ties: list[int] = []  # the second key: gradients and names, for parents whose keys are equal
    name_of = {id(node): name for node, name in (names or {}).items()}
    ops: list[tuple[str, float | None]] = []
    ordered_parents: list[list[int]] = []
    stack = list(reversed(roots))
    pop, push, extend, state_of = stack.pop, stack.append, stack.extend, state.get
    while stack:
        node = pop()
        seen = state_of(id(node))
        if seen is None:  # first visit: come back to it after its parents
            state[id(node)] = -1
            push(node)
            extend(_prev(node))
            continue
        if seen != -1:
            continue
        # Its parents are done (in a DAG nothing reaches a node again while its parents are visited).
        state[id(node)] = len(nodes)
        nodes.append(node)
        tag, arity, code, exponent = _translate(node)
        parents = [state[id(p)] for p in node._prev]
        if -1 in parents or state[id(node)] in parents:  # an ancestor still being visited, or itself
            raise GraphStructureError(
                f"micrograd node {node!r} is its own ancestor: a graph with a cycle cannot be imported"
            )
        if arity == 2 and len(parents) == 1:  # a + a, a * a: the set kept one
            parents.append(parents[0])
        elif arity == 2 and len(parents) == 2:
            first, second = parents
            if (keys[second], ties[second]) < (keys[first], ties[first]):
                parents.reverse()
        if len(parents) != arity:
            raise GraphStructureError(
                f"micrograd node {node!r} with op {node._op!r} has {counted(len(parents), 'parent')}, expected {arity}"
            )
        data = float(node.data)
        # No None in a key: before Python 3.12, hash(None) depends on None's address.
        head = (code, 0.0 if exponent is None else exponent, data if data == data else _NAN_KEY)
        keys.append(hash(head + tuple([keys[p] for p in parents])))
        grad = float(node.grad)
        tie_head = (grad if grad == grad else _NAN_KEY, _name_key(name_of.get(id(node))))
        ties.append(hash(tie_head + tuple([ties[p] for p in parents])))
        ops.append((tag, exponent))
        ordered_parents.append(parents)
    # Pass 2: ids from a depth-first post-order over the ordered parents, roots in the order given.
    new_id = [-1] * len(nodes)  # -1 not seen, -2 parents being visited, then the id
    order: list[int] = []
    walk = [state[id(root)] for root in reversed(roots)]
    while walk:
        i = walk.pop()
        seen = new_id[i]
        if seen == -1:
            new_id[i] = -2
            walk.append(i)
            walk.extend(reversed(ordered_parents[i]))
        elif seen == -2:
            new_id[i] = len(order)
            order.append(i)
    graph = _columns(nodes, order, new_id, ops, ordered_parents, [new_id[state[id(r)]] for r in roots])
    for node, name in (names or {}).items():
        if id(node) not in state:
            raise GraphStructureError(f"names: {node!r} (named {name!r}) is not in the graph")
        graph.names[new_id[state[id(node)]]] = name
    graph.check()
    return graph


def _columns(
    nodes: list[Any],
    order: list[int],
    new_id: list[int],
    ops: list[tuple[str, float | None]],
    ordered_parents: list[list[int]],
    outputs: Sequence[int],
) -> Graph:
    tags = [ops[i][0] for i in order]
    source = OpSource("graphsvc", _version.__version__)
    return graph_from_lists(
        tags,
        (len(ordered_parents[i]) for i in order),
        (new_id[p] for i in order for p in ordered_parents[i]),
        (float(nodes[i].data) for i in order),
        grads=np.array([float(nodes[i].grad) for i in order], dtype=FLOAT_DTYPE),
        attrs={new: {"exponent": ops[i][1]} for new, i in enumerate(order) if ops[i][1] is not None},
        outputs=list(dict.fromkeys(outputs)),
        metadata={"imported_from": "micrograd"},
        op_sources=dict.fromkeys(tags, source),
    )
