"""What ``graphsvc view``'s page is shown: a graph's nodes grouped into layers, answered a view at a time.

The page never receives the whole graph. :class:`ViewModel` groups the nodes once, when the server
starts, and then answers four questions in JSON-ready dicts (the server only carries them):

- :meth:`ViewModel.meta`: what the graph is (sizes, ops, outputs, the diff with a second graph);
- :meth:`ViewModel.view`: the items visible with some groups open, and the edges between them;
- :meth:`ViewModel.node`: everything the detail panel shows of one node;
- :meth:`ViewModel.search`: nodes by name, op or ``#id``, with the groups to open to reach them.

**Groups.** A node's name is split on ``.``: ``layers.0.linear1.addmm`` sits in ``layers.0.linear1``,
inside ``layers.0``, inside ``layers`` (micrograd's ``w1.2.3`` in ``w1.2`` inside ``w1``), the name
scopes TensorBoard groups by. A group holding nothing but one subgroup is merged with it
(``encoder.layers``). An unnamed node joins the group of its first parent (an unnamed node without
parents: the top level). No group shows more than :data:`FANOUT` items: a larger one has its members,
in the order of their first node, split into *range groups* labelled by the node ids they cover
(``#0–4,095``), nested as deep as needed. Group 0 is the root.

The grouping is numpy over columns (pointer jumping, not a walk), and the nodes are kept sorted by
their groups' pre-order, so the nodes inside any group are one slice: a group's summary is a few
reductions over its slice, made when the group is shown. Nothing here recurses over the graph.

Numbers that are nan or inf are given as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no
such numbers). Text is given as it is: the page puts it in the page as text, never as markup.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphsvc.console.diffview import number_text
from graphsvc.errors import UsageError
from graphsvc.graph import LEAF_TAGS, Graph
from graphsvc.text import counted

if TYPE_CHECKING:
    import numpy.typing as npt

    from graphsvc.diff import GraphDiff

#: The most items one group shows; larger groups are split into range groups.
FANOUT = 64
#: The most items one view may show (the page's layout stays interactive up to about this many).
MAX_ITEMS = 3000
#: The most children :meth:`ViewModel.node` lists.
MAX_CHILDREN = 50
#: About the most characters of a value's elements the detail panel gets.
TEXT_CHARS = 200


def _number(x: float | None) -> float | str | None:
    """A float as JSON can hold it: nan and inf as strings."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _short(x: float) -> str:
    return f"{x:.4g}"


def _range_label(first: int, last: int) -> str:
    return f"#{first:,}–{last:,}"


class ViewModel:
    """A graph grouped for the page (see the module docstring); ``other``: a second run to diff with."""

    def __init__(self, graph: Graph, other: Graph | None = None, *, files: Sequence[str] = ()) -> None:
        self.graph = graph
        self.files = list(files)
        n = graph.num_nodes
        self._n = n
        offsets, parents = graph.parent_offsets, graph.parent_indices
        counts = np.diff(offsets)
        self._first_parent = np.full(n, -1, dtype=np.int64)
        has_parents = counts > 0
        self._first_parent[has_parents] = parents[offsets[:-1][has_parents]]
        self._child_of_edge = np.repeat(np.arange(n, dtype=np.int64), counts)
        self._build_groups()
        self._overlays()
        self._diff: GraphDiff | None = None
        self._node_diff: npt.NDArray[np.int8] | None = None
        if other is not None:
            self._diff_with(other)
        self._summaries()
        self._edge_index()

    # -- grouping --------------------------------------------------------------------------------
    def _build_groups(self) -> None:
        graph, n = self.graph, self._n
        # name groups: one per dotted prefix of a name
        paths: dict[str, int] = {"": 0}
        parent: list[int] = [-1]
        path_of: list[str] = [""]
        named = np.full(n, -1, dtype=np.int64)  # the name group of a named node
        scope = {node: name.rpartition(".")[0] for node, name in graph.names.items()}
        # a scope holding one name and no other scope, among more than FANOUT such siblings, is no
        # group: its node sits in the scope around it (a graph that names every node in a scope
        # of its own, `step7.add`, gets groups of nodes, not a million groups of one)
        sizes = Counter(scope.values())
        outer = {prefix.rpartition(".")[0] for prefix in sizes}
        ones = [prefix for prefix, size in sizes.items() if size == 1 and prefix and prefix not in outer]
        crowded = {up for up, count in Counter(p.rpartition(".")[0] for p in ones).items() if count > FANOUT}
        lone = {prefix for prefix in ones if prefix.rpartition(".")[0] in crowded}
        if lone:
            for node, prefix in scope.items():
                if prefix in lone:
                    scope[node] = prefix.rpartition(".")[0]
        for prefix in dict.fromkeys(scope.values()):  # each scope once, in the order first named
            if not prefix or prefix in paths:
                continue
            # the scope and those around it not seen yet, outermost first
            missing = [prefix]
            head = prefix
            while True:
                head, dot, _ = head.rpartition(".")
                if not dot or head in paths:
                    break
                missing.append(head)
            for path in reversed(missing):
                up = path.rpartition(".")[0]
                paths[path] = len(path_of)
                parent.append(paths[up] if up else 0)
                path_of.append(path)
        if scope:
            named[np.fromiter(scope.keys(), dtype=np.int64, count=len(scope))] = np.fromiter(
                (paths[prefix] for prefix in scope.values()), dtype=np.int64, count=len(scope)
            )
        # an unnamed node joins its first parent's group: pointer jumping to the nearest named
        # ancestor along first parents (or an unnamed node without parents: the root)
        rep = np.arange(n, dtype=np.int64)
        hop = (named < 0) & (self._first_parent >= 0)
        rep[hop] = self._first_parent[hop]
        while True:
            nxt = rep[rep]
            if np.array_equal(nxt, rep):
                break
            rep = nxt
        node_group = np.where(named[rep] >= 0, named[rep], 0)

        gparent = np.array(parent, dtype=np.int64)
        labels = [path.rpartition(".")[2] for path in path_of]
        gpaths = list(path_of)
        # merge a group that holds nothing but one subgroup with it (outermost first)
        direct_nodes = np.bincount(node_group, minlength=len(gparent))
        subgroups = np.bincount(gparent[1:], minlength=len(gparent))
        alive = np.ones(len(gparent), dtype=bool)
        for g in range(1, len(gparent)):  # ids were made outermost first
            p = int(gparent[g])
            if p > 0 and direct_nodes[p] == 0 and subgroups[p] == 1:
                # p holds only g: g takes p's place
                gparent[g] = gparent[p]
                labels[g] = f"{labels[p]}.{labels[g]}"
                alive[p] = False
        self._gparent = gparent
        self._glabel = labels
        self._gpath = gpaths
        self._node_group = node_group
        self._split_large(alive)

    def _split_large(self, alive: npt.NDArray[np.bool_]) -> None:
        """Range groups, so that no group shows more than FANOUT items."""
        n = self._n
        gparent = list(self._gparent.tolist())
        labels, paths = self._glabel, self._gpath  # grown by _new_range
        node_group = self._node_group
        groups = len(gparent)
        alive_list = alive.tolist()
        # the first and last node inside each group (all depths), for ordering and range labels
        first = np.full(groups, n, dtype=np.int64)
        last = np.full(groups, -1, dtype=np.int64)
        ids = np.arange(n, dtype=np.int64)
        np.minimum.at(first, node_group, ids)
        np.maximum.at(last, node_group, ids)
        depth = self._depths(gparent)
        for d in sorted(set(depth), reverse=True):
            if d == 0:
                continue
            sel = np.array([g for g in range(groups) if depth[g] == d and alive_list[g]], dtype=np.int64)
            if len(sel):
                ups = np.array([gparent[g] for g in sel], dtype=np.int64)
                np.minimum.at(first, ups, first[sel])
                np.maximum.at(last, ups, last[sel])
        firsts, lasts = first.tolist(), last.tolist()
        # members of each group: nodes (sorted ids) and subgroups
        order = np.argsort(node_group, kind="stable")
        bounds = np.searchsorted(node_group[order], np.arange(groups + 1))
        children: list[list[int]] = [[] for _ in range(groups)]
        for g in range(1, groups):
            if alive_list[g]:
                children[gparent[g]].append(g)
        new_node_group = node_group.copy()
        work = [g for g in range(groups) if alive_list[g]]
        # each entry: (group, member node ids (sorted array), member subgroups)
        stack: list[tuple[int, npt.NDArray[np.int64], list[int]]] = [
            (g, order[bounds[g] : bounds[g + 1]], children[g]) for g in work
        ]
        while stack:
            g, nodes, subs = stack.pop()
            m = len(nodes) + len(subs)
            if m <= FANOUT:
                continue
            if len(subs) <= FANOUT // 2:
                # named subgroups stay where they are; the nodes beside them go into ranges
                room = FANOUT - len(subs)
                size = FANOUT
                while -(-len(nodes) // size) > room:
                    size *= FANOUT
                for start in range(0, len(nodes), size):
                    block_nodes = nodes[start : start + size]
                    r = self._new_range(g, int(block_nodes[0]), int(block_nodes[-1]), gparent, firsts, lasts)
                    alive_list.append(True)
                    new_node_group[block_nodes] = r
                    stack.append((r, block_nodes, []))
                continue
            # members in the order of their first node: keys and kinds
            keys = np.concatenate([nodes, np.array([firsts[s] for s in subs], dtype=np.int64)])
            is_node = np.concatenate([np.ones(len(nodes), dtype=bool), np.zeros(len(subs), dtype=bool)])
            what = np.concatenate([nodes, np.array(subs, dtype=np.int64)])
            by = np.argsort(keys, kind="stable")
            keys, is_node, what = keys[by], is_node[by], what[by]
            size = FANOUT
            while -(-m // size) > FANOUT:
                size *= FANOUT
            for start in range(0, m, size):
                block = slice(start, min(start + size, m))
                block_nodes = what[block][is_node[block]]
                block_subs = what[block][~is_node[block]].tolist()
                covered_first = [firsts[s] for s in block_subs] + [int(x) for x in block_nodes[:1]]
                covered_last = [lasts[s] for s in block_subs] + [int(x) for x in block_nodes[-1:]]
                lo, hi = min(covered_first), max(covered_last)
                r = self._new_range(g, lo, hi, gparent, firsts, lasts)
                alive_list.append(True)
                new_node_group[block_nodes] = r
                for s in block_subs:
                    gparent[s] = r
                stack.append((r, block_nodes, block_subs))
        # keep the groups in use, renumbered in pre-order (root 0, each group before its members)
        total = len(gparent)
        kids: list[list[int]] = [[] for _ in range(total)]
        for g in range(1, total):
            if alive_list[g]:
                kids[gparent[g]].append(g)
        for k in kids:
            k.sort(key=lambda s: firsts[s])
        pre: list[int] = []
        todo = [0]
        while todo:
            g = todo.pop()
            pre.append(g)
            todo.extend(reversed(kids[g]))
        new_id = np.full(total, -1, dtype=np.int64)
        new_id[pre] = np.arange(len(pre))
        self._gparent = np.array([-1] + [int(new_id[gparent[g]]) for g in pre[1:]], dtype=np.int64)
        self._glabel = [labels[g] if g else "" for g in pre]
        self._gpath = [paths[g] for g in pre]
        self._gchildren = [[int(new_id[s]) for s in kids[g]] for g in pre]
        self._node_group = new_id[new_node_group]
        self._gdepth = np.array(self._depths(self._gparent.tolist()), dtype=np.int64)
        # nodes sorted by their group's pre-order: a group's nodes (all depths) are one slice
        sizes = np.array([0] * len(pre), dtype=np.int64)  # subtree sizes in groups
        sizes[:] = 1
        for g in range(len(pre) - 1, 0, -1):
            sizes[self._gparent[g]] += sizes[g]
        self._node_order = np.argsort(self._node_group, kind="stable")
        sorted_groups = self._node_group[self._node_order]
        ids = np.arange(len(pre), dtype=np.int64)
        self._slice_start = np.searchsorted(sorted_groups, ids, side="left")
        self._slice_end = np.searchsorted(sorted_groups, ids + sizes - 1, side="right")
        self._direct_nodes = np.bincount(self._node_group, minlength=len(pre))

    def _new_range(self, g: int, lo: int, hi: int, gparent: list[int], firsts: list[int], lasts: list[int]) -> int:
        """A new range group in ``g`` covering nodes ``lo`` to ``hi``; its id."""
        r = len(gparent)
        gparent.append(g)
        self._glabel.append(_range_label(lo, hi))
        self._gpath.append(f"{self._gpath[g]} {_range_label(lo, hi)}".strip())
        firsts.append(lo)
        lasts.append(hi)
        return r

    @staticmethod
    def _depths(gparent: Sequence[int]) -> list[int]:
        """Each group's depth (the root 0); a parent may come after its child in ``gparent``."""
        depth = [-1] * len(gparent)
        depth[0] = 0
        for g in range(len(gparent)):
            chain = []
            h = g
            while depth[h] < 0:
                chain.append(h)
                h = gparent[h]
            d = depth[h]
            for c in reversed(chain):
                d += 1
                depth[c] = d
        return depth

    # -- per-node numbers ------------------------------------------------------------------------
    def _overlays(self) -> None:
        from graphsvc.topo import reverse_topological_order

        graph, n = self.graph, self._n
        tensor = np.zeros(n, dtype=bool)
        tensor[list(graph.arrays)] = True
        # a stored value: a tensor node's array, a number in the column (where the graph stores
        # computed values at all: nan in the column of a graph that does not means none)
        self._has_value = ~tensor
        if not graph.has_computed_values:
            self._has_value &= np.isin(graph.op_codes, [c for c, op in enumerate(graph.op_table) if op in LEAF_TAGS])
        self._has_grad = ~tensor if graph.grads is not None else np.zeros(n, dtype=bool)
        with np.errstate(invalid="ignore"):
            self._abs_value, bad_value = self._column_numbers(graph.values, self._has_value)
            if graph.grads is not None:
                self._abs_grad, bad_grad = self._column_numbers(graph.grads, self._has_grad)
            else:
                self._abs_grad, bad_grad = np.full(n, np.nan), np.zeros(n, dtype=bool)
        for node, array in graph.arrays.items():
            self._has_value[node] = True
            self._abs_value[node], bad_value[node] = self._array_numbers(array)
        for node, array in graph.grad_arrays.items():
            self._has_grad[node] = True
            self._abs_grad[node], bad_grad[node] = self._array_numbers(array)
        self._bad_value = bad_value
        self._bad_grad = bad_grad
        # where a nan/inf first appears, as replay's report names it (graphsvc.replay.compare's
        # first_nonfinite, NonFinite): in the values the lowest id (the forward meets it first), in
        # the gradients the highest (the backward sweep runs in decreasing id order); each flagged
        first = np.full(n, False)
        bad_v = np.flatnonzero(bad_value)
        if len(bad_v):
            first[bad_v[0]] = True
        bad_g = np.flatnonzero(bad_grad)
        if len(bad_g):
            first[bad_g[-1]] = True
        self._first_bad = first
        order = reverse_topological_order(graph)
        self._step = np.full(n, -1, dtype=np.int64)
        self._step[order] = np.arange(len(order), dtype=np.int64)

    @staticmethod
    def _column_numbers(
        column: npt.NDArray[np.float64], stored: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Each stored entry's |value| (nan where it is not finite or not stored) and its nan/inf flag."""
        finite = np.isfinite(column)
        return np.where(finite & stored, np.abs(column), np.nan), ~finite & stored

    @staticmethod
    def _array_numbers(array: np.ndarray) -> tuple[float, bool]:
        """The largest finite |element| (nan when there is none) and whether any is nan or inf."""
        if array.dtype.kind != "f":
            return (float(np.abs(array).max()) if array.size else math.nan), False
        finite = np.isfinite(array)
        if finite.all():
            return (float(np.abs(array).max()) if array.size else math.nan), False
        kept = np.abs(array[finite])
        return (float(kept.max()) if kept.size else math.nan), True

    def _diff_with(self, other: Graph) -> None:
        from graphsvc.diff import diff

        found = diff(self.graph, other)
        self._diff = found
        status = np.zeros(self._n, dtype=np.int8)  # bits: 1 values, 2 grads, 4 structure, 8 unaligned
        for d in found.numeric:
            status[d.node] |= 1 if d.kind == "value" else 2
        for d in found.structural:
            status[d.node] |= 4
        for u in found.unaligned:
            if u.graph == "A":
                status[u.node] |= 8
        self._node_diff = status

    # -- answers ---------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        graph = self.graph
        hist = graph.op_histogram()
        ops = dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))[:20])
        overlays = ["value", "grad", "nonfinite", "step"]
        diff = None
        if self._diff is not None:
            overlays.append("diff")
            found = self._diff.to_json(limit=0)
            diff = {
                "first_divergence": found["first_divergence"],
                "differing": int(np.count_nonzero(self._node_diff)) if self._node_diff is not None else 0,
                "unaligned": found["counts"]["unaligned"],
            }
        return {
            "files": self.files,
            "nodes": self._n,
            "edges": int(graph.num_edges),
            "groups": len(self._gparent),
            "tensor": bool(graph.is_tensor_graph),
            "ops": ops,
            "outputs": [int(o) for o in graph.outputs],
            "overlays": overlays,
            "diff": diff,
            "max_items": MAX_ITEMS,
        }

    def _check_group(self, g: int) -> None:
        if not 0 <= g < len(self._gparent):
            raise UsageError(f"no group {g}: this graph has groups 0 to {len(self._gparent) - 1}")

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self._n:
            raise UsageError(f"no node {node}: this graph has nodes 0 to {self._n - 1}")

    def view(self, open_groups: Sequence[int]) -> dict[str, Any]:
        for g in open_groups:
            self._check_group(int(g))
        wanted = set(int(g) for g in open_groups) | {0}
        # a group is open when it and every group around it were asked to be
        is_open = np.zeros(len(self._gparent), dtype=bool)
        is_open[0] = True
        shown: list[int] = []  # open groups, parents first
        todo = [0]
        while todo:
            g = todo.pop()
            shown.append(g)
            for c in self._gchildren[g]:
                if c in wanted:
                    is_open[c] = True
                    todo.append(c)
        shown.sort()  # pre-order ids: parents first
        item_count = sum(len(self._gchildren[g]) + int(self._direct_nodes[g]) for g in shown)
        if item_count > MAX_ITEMS:
            raise UsageError(
                f"opening these groups would show {item_count:,} items; the page shows at most "
                f"{MAX_ITEMS:,}: close a group first"
            )
        items: list[dict[str, Any]] = []
        for g in shown:
            parent_key = None if g == 0 else self._parent_key(g)
            if g != 0:
                items.append(self._group_item(g, parent_key, True))
            key = None if g == 0 else f"g{g}"
            for c in self._gchildren[g]:
                if not is_open[c]:
                    items.append(self._group_item(c, key, False))
            for node in self._direct(g):
                items.append(self._node_item(int(node), key))
        return {"items": items, "edges": self._edges(is_open), "open": shown}

    def _parent_key(self, g: int) -> str | None:
        p = int(self._gparent[g])
        return None if p == 0 else f"g{p}"

    def _direct(self, g: int) -> npt.NDArray[np.int64]:
        """The nodes directly in group ``g``, in id order."""
        start = self._slice_start[g]
        return self._node_order[start : start + self._direct_nodes[g]]

    def _edge_index(self) -> None:
        """What every view's edges are made from: the graph's edges between two groups, merged per
        pair of innermost groups with a count, and each node's edges to its children (a CSR)."""
        n = self._n
        groups = len(self._gparent)
        parents, children = self.graph.parent_indices.astype(np.int64), self._child_of_edge
        pairs = self._node_group[parents] * groups + self._node_group[children]
        keys, counts = np.unique(pairs, return_counts=True)
        self._pair_src, self._pair_dst = np.divmod(keys, groups)
        self._pair_count = counts
        by_parent = np.argsort(parents, kind="stable")
        self._child_edges = children[by_parent]
        self._child_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(parents, minlength=n), out=self._child_offsets[1:])
        # each group's ancestor at each depth (itself where it is not that deep), for views
        depth_max = int(self._gdepth.max()) if groups else 0
        up = [np.arange(groups, dtype=np.int64)]
        for _ in range(depth_max):
            prev = up[-1]
            up.append(np.where(prev > 0, self._gparent[np.maximum(prev, 0)], 0))
        # ancestors[d][g]: g's ancestor at depth d (d <= depth(g)), else g
        gdepth = self._gdepth
        self._ancestors = []
        for d in range(depth_max + 1):
            steps = np.maximum(gdepth - d, 0)
            at = np.empty(groups, dtype=np.int64)
            for k in range(depth_max + 1):
                sel = steps == k
                at[sel] = up[k][sel]
            self._ancestors.append(at)

    def _edges(self, is_open: npt.NDArray[np.bool_]) -> list[dict[str, Any]]:
        """Each edge between the items shown, with how many graph edges it stands for: the edges
        between closed groups from the merged pairs, the edges of the nodes shown from the CSRs."""
        n = self._n
        groups = len(self._gparent)
        # the item standing for each group: its outermost ancestor (or itself) that is not open
        rep = np.full(groups, -1, dtype=np.int64)
        for at in self._ancestors[1:]:
            closed = (rep < 0) & ~is_open[at]
            rep[closed] = at[closed]
        total = n + groups
        # edges between two nodes in closed groups
        both_closed = (rep[self._pair_src] >= 0) & (rep[self._pair_dst] >= 0)
        src = n + rep[self._pair_src[both_closed]]
        dst = n + rep[self._pair_dst[both_closed]]
        weight = self._pair_count[both_closed]
        # edges of the nodes shown (nodes directly in open groups): into them, and out of them to nodes not shown
        shown = np.concatenate([self._direct(int(g)) for g in np.flatnonzero(is_open)])
        if len(shown):
            offsets, parents = self.graph.parent_offsets, self.graph.parent_indices
            into = np.concatenate([parents[offsets[v] : offsets[v + 1]] for v in shown]).astype(np.int64)
            into_dst = np.repeat(shown, (offsets[shown + 1] - offsets[shown]).astype(np.int64))
            out = np.concatenate(
                [self._child_edges[self._child_offsets[v] : self._child_offsets[v + 1]] for v in shown]
            )
            out_src = np.repeat(shown, self._child_offsets[shown + 1] - self._child_offsets[shown])
            hidden = rep[self._node_group[out]] >= 0  # a child shown is counted with its parents above
            node_src = np.concatenate([into, out_src[hidden]])
            node_dst = np.concatenate([into_dst, out[hidden]])
            item_src = np.where(rep[self._node_group[node_src]] >= 0, n + rep[self._node_group[node_src]], node_src)
            item_dst = np.where(rep[self._node_group[node_dst]] >= 0, n + rep[self._node_group[node_dst]], node_dst)
            src = np.concatenate([src, item_src])
            dst = np.concatenate([dst, item_dst])
            weight = np.concatenate([weight, np.ones(len(item_src), dtype=weight.dtype)])
        keep = src != dst
        keys, where = np.unique(src[keep] * total + dst[keep], return_inverse=True)
        counts = np.bincount(where.ravel(), weights=weight[keep], minlength=len(keys))
        result = []
        for key, count in zip(keys.tolist(), counts.tolist(), strict=True):
            s, t = divmod(key, total)
            result.append({"source": self._key(s), "target": self._key(t), "count": int(count)})
        return result

    def _key(self, item: int) -> str:
        return f"n{item}" if item < self._n else f"g{item - self._n}"

    def _summaries(self) -> None:
        """Each group's numbers over the nodes inside it (all depths), for every group at once: a
        group's nodes are one slice of ``_node_order``, so each is a reduction over slices."""
        order, starts, ends = self._node_order, self._slice_start, self._slice_end
        n, big = self._n, np.iinfo(np.int64).max
        empty = ends <= starts
        # each slice [start, end) reduced with reduceat over interleaved bounds (one sentinel at the end)
        bounds = np.stack([starts, ends], axis=1).ravel()

        def reduce(ufunc: np.ufunc, column: npt.NDArray[Any], fill: Any) -> npt.NDArray[Any]:
            values = np.append(column[order], fill)
            out = ufunc.reduceat(values, bounds)[::2]
            out[empty] = fill
            return out

        def count(flags: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
            prefix = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(flags[order], out=prefix[1:])
            return prefix[ends] - prefix[starts]

        with np.errstate(invalid="ignore"):
            self._g_value = reduce(np.fmax, self._abs_value, np.nan)
            self._g_grad = reduce(np.fmax, self._abs_grad, np.nan)
        bad = self._bad_value | self._bad_grad
        self._g_bad = count(bad)
        ids = np.arange(n, dtype=np.int64)
        self._g_first_bad = reduce(np.minimum, np.where(self._first_bad, ids, big), big)
        stepped = self._step >= 0
        self._g_step_lo = reduce(np.minimum, np.where(stepped, self._step, big), big)
        self._g_step_hi = reduce(np.maximum, np.where(stepped, self._step, -1), -1)
        self._g_diff = None if self._node_diff is None else count(self._node_diff != 0)
        self._g_ops: dict[int, dict[str, int]] = {}

    def _group_ops(self, g: int) -> dict[str, int]:
        """The five commonest ops inside group ``g`` (computed once per group)."""
        found = self._g_ops.get(g)
        if found is None:
            nodes = self._node_order[self._slice_start[g] : self._slice_end[g]]
            ops = np.bincount(self.graph.op_codes[nodes], minlength=len(self.graph.op_table))
            top = np.argsort(-ops, kind="stable")[:5]
            table = self.graph.op_table
            found = self._g_ops[g] = {table[int(c)]: int(ops[c]) for c in top if ops[c] > 0}
        return found

    def _group_item(self, g: int, parent: str | None, is_open: bool) -> dict[str, Any]:
        big = np.iinfo(np.int64).max
        value, grad = float(self._g_value[g]), float(self._g_grad[g])
        first_bad, lo, hi = int(self._g_first_bad[g]), int(self._g_step_lo[g]), int(self._g_step_hi[g])
        return {
            "key": f"g{g}",
            "kind": "group",
            "id": g,
            "parent": parent,
            "label": self._glabel[g],
            "path": self._gpath[g],
            "open": is_open,
            "nodes": int(self._slice_end[g] - self._slice_start[g]),
            "items": len(self._gchildren[g]) + int(self._direct_nodes[g]),
            "ops": self._group_ops(g),
            "max_abs_value": None if math.isnan(value) else value,
            "max_abs_grad": None if math.isnan(grad) else grad,
            "nonfinite": int(self._g_bad[g]),
            "first_nonfinite": None if first_bad == big else first_bad,
            "steps": [lo, hi] if hi >= 0 else None,
            "diff": None if self._g_diff is None else int(self._g_diff[g]),
        }

    @staticmethod
    def _max(column: npt.NDArray[np.float64]) -> float | None:
        if not len(column) or np.isnan(column).all():
            return None
        return float(np.nanmax(column))

    def _node_item(self, node: int, parent: str | None) -> dict[str, Any]:
        graph = self.graph
        dtype, shape = self._dtype_shape(node)
        name = graph.name(node)
        bad_v, bad_g = bool(self._bad_value[node]), bool(self._bad_grad[node])
        step = int(self._step[node])
        return {
            "key": f"n{node}",
            "kind": "node",
            "id": node,
            "parent": parent,
            "name": name,
            "label": name if name is not None else f"#{node}",
            "op": graph.op(node),
            "dtype": dtype,
            "shape": shape,
            "value": self._short_text(node, grad=False),
            "grad": self._short_text(node, grad=True),
            "max_abs_value": self._max(self._abs_value[node : node + 1]),
            "max_abs_grad": self._max(self._abs_grad[node : node + 1]),
            "nonfinite": "both" if bad_v and bad_g else "value" if bad_v else "grad" if bad_g else None,
            "first_nonfinite": bool(self._first_bad[node]),
            "step": step if step >= 0 else None,
            "diff": self._diff_status(node),
            "first_divergence": self._divergence(node),
        }

    def _dtype_shape(self, node: int) -> tuple[str, list[int]]:
        array = self.graph.arrays.get(node)
        if array is None:
            return "float64", []
        return str(array.dtype), [int(s) for s in array.shape]

    def _short_text(self, node: int, *, grad: bool) -> str | None:
        graph = self.graph
        array = (graph.grad_arrays if grad else graph.arrays).get(node)
        if array is None:
            if not (self._has_grad if grad else self._has_value)[node]:
                return None
            column = graph.grads if grad else graph.values
            assert column is not None
            return _short(float(column[node]))
        shape = "[" + ", ".join(str(s) for s in array.shape) + "]"
        if array.size == 0:
            return f"{shape} {array.dtype} empty"
        if array.ndim == 0:
            return _short(float(array))
        with np.errstate(all="ignore"):
            mean = float(np.mean(array, dtype=np.float64))
        return f"{shape} {array.dtype} mean {_short(mean)}"

    def _diff_status(self, node: int) -> str | None:
        if self._node_diff is None:
            return None
        bits = int(self._node_diff[node])
        if bits & 8:
            return "unaligned"
        if bits & 4:
            return "structure"
        if bits & 3 == 3:
            return "both"
        return "values" if bits & 1 else "grads" if bits & 2 else None

    def _divergence(self, node: int) -> str | None:
        found = self._diff
        if found is None:
            return None
        v = found.first_value is not None and found.first_value.node == node
        g = found.first_grad is not None and found.first_grad.node == node
        return "both" if v and g else "values" if v else "grads" if g else None

    def _groups_of(self, node: int) -> list[int]:
        chain = []
        g = int(self._node_group[node])
        while g >= 0:
            chain.append(g)
            g = int(self._gparent[g])
        return chain[::-1]

    def _stats(self, node: int, *, grad: bool) -> dict[str, Any] | None:
        graph = self.graph
        array = (graph.grad_arrays if grad else graph.arrays).get(node)
        if array is None:
            text = self._short_text(node, grad=grad)
            if text is None:
                return None
            x = float((graph.grads if grad else graph.values)[node])  # type: ignore[index]
            return {
                "text": repr(x),
                "min": _number(x),
                "max": _number(x),
                "mean": _number(x),
                "nan": int(math.isnan(x)),
                "inf": int(math.isinf(x)),
            }
        flat = array.reshape(-1)
        with np.errstate(all="ignore"):
            floats = flat.astype(np.float64)
            finite = floats[np.isfinite(floats)]
            parts: list[str] = []
            used = 0
            for x in flat[:64].tolist():
                part = repr(x)
                if used + len(part) > TEXT_CHARS:
                    break
                parts.append(part)
                used += len(part) + 2
            more = flat.size - len(parts)
            text = "[" + ", ".join(parts) + (f", … {counted(more, 'more')}" if more else "") + "]"
            return {
                "text": text,
                "min": _number(finite.min()) if finite.size else None,
                "max": _number(finite.max()) if finite.size else None,
                "mean": _number(finite.mean()) if finite.size else None,
                "nan": int(np.isnan(floats).sum()),
                "inf": int(np.isinf(floats).sum()),
            }

    def node(self, node: int) -> dict[str, Any]:
        self._check_node(node)
        graph = self.graph
        item = self._node_item(node, None)
        op = graph.op(node)
        source = graph.op_sources.get(op)
        children = np.flatnonzero(graph.parent_indices == node)
        child_ids = np.unique(self._child_of_edge[children])
        step = int(self._step[node])
        answer: dict[str, Any] = {
            "id": node,
            "name": item["name"],
            "label": item["label"],
            "op": op,
            "plugin": None if source is None else source.plugin,
            "dtype": item["dtype"],
            "shape": item["shape"],
            "attrs": {str(k): self._attr_text(v) for k, v in graph.attrs.get(node, {}).items()},
            "value": self._stats(node, grad=False),
            "grad": self._stats(node, grad=True),
            "parents": [self._ref(int(p)) for p in graph.parents(node)],
            "children": [self._ref(int(c)) for c in child_ids[:MAX_CHILDREN]],
            "more_children": max(0, len(child_ids) - MAX_CHILDREN),
            "groups": self._groups_of(node),
            "step": step if step >= 0 else None,
            "nonfinite": item["nonfinite"],
            "diff": None,
        }
        if self._diff is not None:
            answer["diff"] = self._node_diff_detail(node)
        return answer

    def _node_diff_detail(self, node: int) -> dict[str, Any]:
        found = self._diff
        assert found is not None
        b = int(found.matched[node])
        kinds = [d for d in found.structural + found.numeric if d.node == node]
        return {
            "status": self._diff_status(node),
            "node_b": b if b >= 0 else None,
            "differences": [{"kind": d.kind, "a": number_text(d.a), "b": number_text(d.b)} for d in kinds],
        }

    @staticmethod
    def _attr_text(value: Any) -> str:
        text = value if isinstance(value, str) else repr(value)
        return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"

    def _ref(self, node: int) -> dict[str, Any]:
        name = self.graph.name(node)
        return {"id": node, "label": name if name is not None else f"#{node}", "op": self.graph.op(node)}

    def search(self, query: str, limit: int = 50) -> dict[str, Any]:
        if limit < 1:
            raise UsageError(f"a search's limit must be at least 1, not {limit}")
        text = query.strip()
        if not text:
            return {"matches": [], "more": False}
        found: list[int] = []
        seen: set[int] = set()

        def take(nodes: Sequence[int]) -> bool:
            for node in nodes:
                if node not in seen:
                    seen.add(node)
                    found.append(node)
                    if len(found) > limit:
                        return True
            return False

        full = False
        if text.startswith("#") and text[1:].replace(",", "").isdigit():
            node = int(text[1:].replace(",", ""))
            if 0 <= node < self._n:
                full = take([node])
        lower = text.lower()
        if not full:
            table = self.graph.op_table
            codes = [c for c, op in enumerate(table) if op.lower() == lower]
            if codes:
                hits = np.flatnonzero(np.isin(self.graph.op_codes, codes))
                full = take(hits[: limit + 1].tolist())
        if not full:
            names = sorted((node for node, name in self.graph.names.items() if lower in name.lower()))
            full = take(names)
        if not full:
            table = self.graph.op_table
            codes = [c for c, op in enumerate(table) if lower in op.lower() and op.lower() != lower]
            if codes:
                hits = np.flatnonzero(np.isin(self.graph.op_codes, codes))
                full = take(hits[: limit + 1].tolist())
        matches = [{**self._ref(node), "groups": self._groups_of(node)} for node in found[:limit]]
        return {"matches": matches, "more": len(found) > limit}
