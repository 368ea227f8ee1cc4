"""Ordering algorithms over a :class:`~graphsvc.graph.Graph`: pure and iterative, never recursive.

Two reverse topological orders from the seeds, both O(V + E) with an explicit stack:

* ``dfs``: micrograd's ``build_topo``, a depth-first post-order that visits parents in their
  stored order, then reversed.
* ``kahn``: the child-count algorithm of HIPS autograd / autodidact (seed 000): a node is emitted
  once every child that points at it has been emitted.

Either runs from one output (its ancestors only) or over the whole graph. The whole graph starts
from every sink (a node that is nobody's parent) in increasing id order, as if one virtual end node
had all sinks as parents; so the highest-id sink comes first.

Plus :func:`levels`, :func:`topological_sort` for graphs whose ids are not yet in order (the JSON
converter) with a cycle error that names the nodes on the cycle.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from graphsvc.errors import GraphStructureError, UsageError
from graphsvc.graph import Graph, NodeRef, expect_graph
from graphsvc.native import Engine, engine_for
from graphsvc.text import ITEM_CHARS, escape, shorten

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt

Algorithm = Literal["dfs", "kahn"]
ALGORITHMS: tuple[Algorithm, ...] = ("dfs", "kahn")

K = TypeVar("K", bound=Hashable)


def reverse_topological_order(
    graph: Graph, output: NodeRef | None = None, algorithm: Algorithm = "dfs", engine: Engine | None = None
) -> npt.NDArray[np.int64]:
    """Node ids, each before all of its parents: those ``output`` (a node id or name) depends on,
    or with ``output=None`` the whole graph.

    ``engine`` (as for every sweep here): the compiled kernels or the references; by default the
    one :func:`graphsvc.native.engine_for` picks for the graph's size."""
    expect_graph("reverse_topological_order", graph)
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")
    start_array = graph.sinks() if output is None else np.array([graph.node_id(output, "outputs")], dtype=np.int64)
    compiled = (engine or engine_for(graph.num_nodes)).kernels
    if compiled is not None:
        # scratch arrays from numpy, which asks for huge pages: fewer TLB misses on random access
        n, offsets, parents = graph.num_nodes, graph.parent_offsets, graph.parent_indices
        pairs, seen = np.empty(2 * n, dtype=np.int32), np.empty(n, dtype=np.bool_)
        if algorithm == "dfs":
            return compiled.dfs_postorder(start_array, offsets, parents, pairs, seen)[::-1]
        return compiled.child_count_order(start_array, offsets, parents, pairs, np.empty(n, dtype=np.int64), seen)
    starts = start_array.tolist()
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    if algorithm == "dfs":
        order = _dfs_postorder(starts, offsets, parents, graph.num_nodes)
        order.reverse()
    else:
        order = _child_count_order(starts, offsets, parents, graph.num_nodes)
    return np.array(order, dtype=np.int64)


def _dfs_postorder(starts: Sequence[int], offsets: list[int], parents: list[int], n: int) -> list[int]:
    """Post-order of a depth-first search from each start, parents in stored order."""
    visited = bytearray(n)
    order: list[int] = []
    for start in starts:
        if visited[start]:
            continue
        visited[start] = 1
        stack = [start]
        cursor = [offsets[start]]  # next parent slot to look at, per stack entry
        while stack:
            node = stack[-1]
            slot = cursor[-1]
            if slot < offsets[node + 1]:
                cursor[-1] = slot + 1
                parent = parents[slot]
                if not visited[parent]:
                    visited[parent] = 1
                    stack.append(parent)
                    cursor.append(offsets[parent])
            else:
                stack.pop()
                cursor.pop()
                order.append(node)
    return order


def _child_count_order(starts: Sequence[int], offsets: list[int], parents: list[int], n: int) -> list[int]:
    """Autodidact's toposort: emit a node once all of its children (within reach) are emitted."""
    # Count, for every node reachable from the starts, the parent slots that point at it.
    counts = [0] * n
    seen = bytearray(n)
    stack = []
    for start in starts:
        if not seen[start]:
            seen[start] = 1
            stack.append(start)
    while stack:
        node = stack.pop()
        for slot in range(offsets[node], offsets[node + 1]):
            parent = parents[slot]
            counts[parent] += 1
            if not seen[parent]:
                seen[parent] = 1
                stack.append(parent)
    order: list[int] = []
    childless = [s for s in _unique(starts) if counts[s] == 0]
    while childless:
        node = childless.pop()
        order.append(node)
        for slot in range(offsets[node], offsets[node + 1]):
            parent = parents[slot]
            if counts[parent] == 1:
                childless.append(parent)
            else:
                counts[parent] -= 1
    return order


def _unique(items: Sequence[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def levels(graph: Graph, engine: Engine | None = None) -> npt.NDArray[np.int64]:
    """Each node's level: 0 for a node without parents, else one more than its highest parent."""
    compiled = (engine or engine_for(graph.num_nodes)).kernels
    if compiled is not None:
        return compiled.levels(graph.parent_offsets, graph.parent_indices, graph.num_nodes)
    level = [0] * graph.num_nodes
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    for node in range(graph.num_nodes):
        start, stop = offsets[node], offsets[node + 1]
        if start != stop:
            level[node] = 1 + max(level[p] for p in parents[start:stop])
    return np.array(level, dtype=np.int64)


def ancestors(graph: Graph, output: int, engine: Engine | None = None) -> npt.NDArray[np.bool_]:
    """Mask of ``output`` and every node it depends on."""
    compiled = (engine or engine_for(graph.num_nodes)).kernels
    if compiled is not None:
        return compiled.ancestors(graph.parent_offsets, graph.parent_indices, output, graph.num_nodes)
    mask = bytearray(graph.num_nodes)
    mask[output] = 1
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    for node in range(output, -1, -1):  # parents have smaller ids: one sweep down suffices
        if mask[node]:
            for slot in range(offsets[node], offsets[node + 1]):
                mask[parents[slot]] = 1
    return np.frombuffer(bytes(mask), dtype=np.uint8).astype(bool)


def depth(graph: Graph) -> int:
    """The number of edges on the longest path from a leaf to a sink."""
    return int(levels(graph).max()) if graph.num_nodes else 0


def topological_sort(parents_of: Mapping[K, Sequence[K]], describe: Mapping[K, str] | None = None) -> list[K]:
    """Order arbitrary keys so that parents come first; ties go to the key listed first.

    Used where graphs enter graphsvc with ids that are not yet in order. A cycle raises
    :class:`GraphStructureError` naming the nodes on one cycle.
    """
    keys = list(parents_of)
    position = {key: i for i, key in enumerate(keys)}
    pending = [0] * len(keys)
    children: list[list[int]] = [[] for _ in keys]
    for i, key in enumerate(keys):
        for parent in parents_of[key]:
            if parent not in position:
                raise GraphStructureError(f"node {_show(key, describe)} has parent {parent!r}, which does not exist")
            pending[i] += 1
            children[position[parent]].append(i)
    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for child in children[i]:
            pending[child] -= 1
            if pending[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(keys):
        cycle = _find_cycle(keys, parents_of, pending, position)
        raise GraphStructureError(f"the graph has a cycle: {_cycle_path([_show(k, describe) for k in cycle])}")
    return [keys[i] for i in order]


#: How many nodes of a long cycle its error shows before the count of the rest.
CYCLE_SHOWN = 10


def _cycle_path(loop: list[str]) -> str:
    """``a -> b -> c -> a``, each node escaped and cut (:func:`graphsvc.text.listed`'s rules); a long
    cycle shows its first :data:`CYCLE_SHOWN` nodes, the count of the others, and the way back."""
    shown = [shorten(escape(item), ITEM_CHARS) for item in loop[:CYCLE_SHOWN]]
    rest = len(loop) - 1 - CYCLE_SHOWN  # the last entry repeats the first
    if rest > 0:
        shown += [f"({rest:,} more)", shown[0]]
    elif len(loop) > CYCLE_SHOWN:
        shown.append(shown[0])
    return " -> ".join(shown)


def _find_cycle(
    keys: list[K], parents_of: Mapping[K, Sequence[K]], pending: list[int], position: dict[K, int]
) -> list[K]:
    """Walk parent links among the nodes left over by Kahn's algorithm until one repeats."""
    node = next(i for i, count in enumerate(pending) if count > 0)
    walked: dict[int, int] = {}
    path: list[int] = []
    while node not in walked:
        walked[node] = len(path)
        path.append(node)
        node = next(position[p] for p in parents_of[keys[node]] if pending[position[p]] > 0)
    # Follow parent links: the cycle runs child -> parent; show it parent -> child, as data flows.
    loop = [*path[walked[node] :], node]
    loop.reverse()
    return [keys[i] for i in loop]


def _show(key: object, describe: Mapping[K, str] | None) -> str:
    if describe is not None and key in describe:
        return describe[key]  # type: ignore[index]
    return str(key)
