"""The numba-compiled graph sweeps graphsvc used before its C kernels (``csrc/``), kept to measure
the C ones against (benchmarks/bench_kernels.py, bench_replay_kernels.py); needs ``pip install numba``.

Arguments are the graph's columns: ``offsets`` (int64, N + 1) and ``parents`` (int32, E).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from graphsvc.kernels import PRIMITIVES

#: The kernels, by name (the same names, arguments and results as graphsvc.kernels.KERNELS).
KERNELS = (
    "inline_parents",
    "dfs_postorder",
    "child_count_order",
    "levels",
    "ancestors",
    "backward_sweep",
    "first_arity_mismatch",
    "forward_all_primitives",
    "forward_primitives",
    "primitive_derivatives",
    "backward_primitives",
    "structure_ok",
)

#: How many nodes ahead of the one they compute the replay sweeps ask for the numbers its parents
#: hold. With random parents most of those numbers are far apart in memory; asking early lets the
#: loads of many nodes overlap instead of waiting for each in turn (2x faster at 10M nodes).
AHEAD = 32


def _prefetcher(write: int):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(array, index)``: LLVM's prefetch hint for ``array[index]``. A hint only: it
    never changes a result and never faults, whatever the address."""

    @intrinsic
    def prefetch(typingctx, array, index):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            array_type = signature.args[0]
            view = context.make_array(array_type)(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, array_type, view, [args[1]], wraparound=False)
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]), "llvm.prefetch.p0i8"
            )
            # (address, 0 read / 1 write, locality 3 = keep in every cache level, 1 = data cache)
            builder.call(hint, [builder.bitcast(pointer, byte_pointer), i32(write), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    return prefetch


_prefetch_read = _prefetcher(0)
_prefetch_write = _prefetcher(1)


#: In ``inline_parents``: the node has more than two parents (read them from the CSR columns).
MANY = -2


@njit(cache=True, nogil=True)
def inline_parents(offsets, parents, pairs):  # type: ignore[no-untyped-def]
    """Each node's parents side by side, ``pairs[2 * node]`` and ``pairs[2 * node + 1]`` (-1 where
    it has fewer than two; ``MANY`` in the first when it has more). A search that jumps from node to
    node then reads one cache line per node, not one in ``offsets`` and one in ``parents``."""
    for node in range(len(offsets) - 1):
        start = offsets[node]
        count = offsets[node + 1] - start
        pairs[2 * node] = MANY if count > 2 else (parents[start] if count > 0 else -1)
        pairs[2 * node + 1] = parents[start + 1] if count == 2 else -1


@njit(cache=True, nogil=True)
def dfs_postorder(starts, offsets, parents, pairs, visited):  # type: ignore[no-untyped-def]
    """Twin of ``topo._dfs_postorder`` (``cursor`` counts the parents already looked at). Scratch
    from the caller (numpy gives it huge pages): ``pairs``, 2 N int32; ``visited``, N booleans."""
    n = len(visited)
    inline_parents(offsets, parents, pairs)
    visited[:] = False
    order = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    cursor = np.empty(n, dtype=np.int64)
    count = 0
    for start in starts:
        if visited[start]:
            continue
        visited[start] = True
        top = 0
        stack[0] = start
        cursor[0] = 0
        while top >= 0:
            node = stack[top]
            k = cursor[top]
            first = pairs[2 * node]
            if first == MANY:
                slot = offsets[node] + k
                parent = parents[slot] if slot < offsets[node + 1] else -1
            elif k == 0:
                parent = first
                second = pairs[2 * node + 1]
                if second >= 0:  # needed once the first parent's search is done: ask now
                    _prefetch_read(visited, second)
                    _prefetch_read(pairs, 2 * second)
            else:
                parent = pairs[2 * node + 1] if k == 1 else -1
            if parent >= 0:
                cursor[top] = k + 1
                if not visited[parent]:
                    visited[parent] = True
                    top += 1
                    stack[top] = parent
                    cursor[top] = 0
            else:
                top -= 1
                order[count] = node
                count += 1
    return order[:count]


@njit(cache=True, nogil=True)
def child_count_order(starts, offsets, parents, pairs, counts, reached):  # type: ignore[no-untyped-def]
    """Twin of ``topo._child_count_order`` (``starts`` already free of repeats). Scratch from the
    caller: ``pairs`` (2 N int32, see ``inline_parents``), ``counts`` (N int64), ``reached`` (N booleans).

    The counts do not depend on the order they are made in, so they come from one sweep down the
    ids (parents have smaller ids than their children: a node is reached before it is swept), which
    can ask for the counters it will update ahead of time; the reference walks a stack instead."""
    n = len(reached)
    inline_parents(offsets, parents, pairs)
    counts[:] = 0
    reached[:] = False
    highest = -1
    for start in starts:
        reached[start] = True
        highest = max(highest, start)
    for node in range(highest, -1, -1):
        ahead = node - AHEAD
        if ahead >= 0 and pairs[2 * ahead] >= 0:
            _prefetch_write(counts, pairs[2 * ahead])
            _prefetch_write(reached, pairs[2 * ahead])
            if pairs[2 * ahead + 1] >= 0:
                _prefetch_write(counts, pairs[2 * ahead + 1])
                _prefetch_write(reached, pairs[2 * ahead + 1])
        if not reached[node]:
            continue
        first = pairs[2 * node]
        if first == MANY:
            for slot in range(offsets[node], offsets[node + 1]):
                counts[parents[slot]] += 1
                reached[parents[slot]] = True
        elif first >= 0:
            counts[first] += 1
            reached[first] = True
            second = pairs[2 * node + 1]
            if second >= 0:
                counts[second] += 1
                reached[second] = True
    order = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    count = 0
    top = 0
    for start in starts:
        if counts[start] == 0:
            stack[top] = start
            top += 1
    while top > 0:
        top -= 1
        node = stack[top]
        order[count] = node
        count += 1
        # (inline helpers for "the k-th parent" measured 2x slower here than spelling it out)
        first = pairs[2 * node]
        many = first == MANY
        if many:
            stop = offsets[node + 1] - offsets[node]
        else:
            stop = 0 if first < 0 else (1 if pairs[2 * node + 1] < 0 else 2)
        for k in range(stop):
            parent = parents[offsets[node] + k] if many else (first if k == 0 else pairs[2 * node + 1])
            if counts[parent] == 1:
                stack[top] = parent
                top += 1
                _prefetch_read(pairs, 2 * parent)  # popped soon
            else:
                counts[parent] -= 1
    return order[:count]


@njit(cache=True, nogil=True)
def levels(offsets, parents, n):  # type: ignore[no-untyped-def]
    """Twin of ``topo.levels``."""
    level = np.zeros(n, dtype=np.int64)
    for node in range(n):
        highest = -1
        for slot in range(offsets[node], offsets[node + 1]):
            if level[parents[slot]] > highest:
                highest = level[parents[slot]]
        level[node] = highest + 1
    return level


@njit(cache=True, nogil=True)
def ancestors(offsets, parents, output, n):  # type: ignore[no-untyped-def]
    """Twin of ``topo.ancestors``."""
    mask = np.zeros(n, dtype=np.bool_)
    mask[output] = True
    for node in range(output, -1, -1):
        if mask[node]:
            for slot in range(offsets[node], offsets[node + 1]):
                mask[parents[slot]] = True
    return mask


@njit(cache=True, nogil=True)
def backward_sweep(offsets, parents, local, nodes, output, n):  # type: ignore[no-untyped-def]
    """Twin of ``replay.reference_sweep``: ``nodes`` in decreasing id order, slot by slot."""
    grads = np.zeros(n, dtype=np.float64)
    grads[output] = 1.0
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        grad = grads[node]
        for slot in range(offsets[node], offsets[node + 1]):
            grads[parents[slot]] += grad * local[slot]
    return grads


# -- primitive ops ----------------------------------------------------------------------------------
# The codes of graphsvc.kernels.PRIMITIVES (0: not a primitive), looked up by name: these kernels
# predate the transcendental primitives and know only the arithmetic ones. Unary ones ignore ``y``.
ADD, SUB, MUL, DIV, NEG, RELU, ABS, MAX, MIN = (
    PRIMITIVES.index(name) + 1 for name in ("add", "sub", "mul", "div", "neg", "relu", "abs", "max", "min")
)


@njit(inline="always", error_model="numpy")
def _primitive(kind, x, y):  # type: ignore[no-untyped-def]
    if kind == ADD:
        return x + y
    if kind == SUB:
        return x - y
    if kind == MUL:
        return x * y
    if kind == DIV:
        return x / y
    if kind == NEG:
        return -x
    if kind == RELU:
        return x if (x > 0.0 or x != x) else 0.0
    if kind == ABS:
        return abs(x)
    if kind == MAX:
        return x if (x > y or x != x) else y
    return x if (x < y or x != x) else y  # MIN


@njit(inline="always", error_model="numpy")
def _partials(kind, x, y, out):  # type: ignore[no-untyped-def]
    """(d out/d x, d out/d y) of a primitive."""
    if kind == ADD:
        return 1.0, 1.0
    if kind == SUB:
        return 1.0, -1.0
    if kind == MUL:
        return y, x
    if kind == DIV:
        return 1.0 / y, -out / y
    if kind == NEG:
        return -1.0, 0.0
    if kind == RELU:
        return (1.0 if out > 0.0 else 0.0), 0.0
    if kind == ABS:
        return (1.0 if x > 0.0 else (-1.0 if x < 0.0 else (0.0 if x == 0.0 else x))), 0.0
    tie = 0.5 if x == y else 0.0
    if kind == MAX:
        return (1.0 if x > y else 0.0) + tie, (1.0 if y > x else 0.0) + tie
    return (1.0 if x < y else 0.0) + tie, (1.0 if y < x else 0.0) + tie  # MIN


@njit(inline="always")
def _inputs(node, offsets, parents, values):  # type: ignore[no-untyped-def]
    """The first slot of ``node`` and its inputs (``y`` repeats ``x`` for a unary node)."""
    slot = offsets[node]
    x = values[parents[slot]]
    y = values[parents[slot + 1]] if offsets[node + 1] - slot > 1 else x
    return slot, x, y


@njit(cache=True, nogil=True)
def first_arity_mismatch(codes, offsets, arity):  # type: ignore[no-untyped-def]
    """Twin of the vectorized check in ``replay.resolve_ops``: the first node whose parent count is
    not ``arity[its op code]`` (entries below 0 are not checked), or -1."""
    for node in range(len(codes)):
        expected = arity[codes[node]]
        if expected >= 0 and offsets[node + 1] - offsets[node] != expected:
            return node
    return -1


@njit(cache=True, nogil=True, error_model="numpy")
def forward_all_primitives(codes, table, offsets, parents, values):  # type: ignore[no-untyped-def]
    """``forward_primitives`` over every node in id order, for graphs whose every op is a primitive:
    ``table`` maps an op code to its primitive (0 for the leaf tags, whose nodes have no parents)."""
    n = len(codes)
    for node in range(n):
        ahead = node + AHEAD
        if ahead < n:
            start = offsets[ahead]
            if offsets[ahead + 1] > start:
                _prefetch_read(values, parents[start])
                if offsets[ahead + 1] > start + 1:
                    _prefetch_read(values, parents[start + 1])
        slot = offsets[node]
        stop = offsets[node + 1]
        if stop == slot:
            continue
        x = values[parents[slot]]
        y = values[parents[slot + 1]] if stop - slot > 1 else x
        values[node] = _primitive(table[codes[node]], x, y)


@njit(cache=True, nogil=True, error_model="numpy")
def forward_primitives(nodes, kinds, offsets, parents, values, start):  # type: ignore[no-untyped-def]
    """Compute ``values`` of ``nodes[start:]`` in order; stop at the first node that is not a
    primitive and return its position (``len(nodes)`` when all were done)."""
    for k in range(start, len(nodes)):
        node = nodes[k]
        if kinds[node] == 0:
            return k
        _, x, y = _inputs(node, offsets, parents, values)
        values[node] = _primitive(kinds[node], x, y)
    return len(nodes)


@njit(cache=True, nogil=True, error_model="numpy")
def primitive_derivatives(nodes, kinds, offsets, parents, values, local):  # type: ignore[no-untyped-def]
    """Fill ``local`` (one entry per parent slot) for ``nodes`` that are primitives."""
    for k in range(len(nodes)):
        node = nodes[k]
        if kinds[node] == 0:
            continue
        slot, x, y = _inputs(node, offsets, parents, values)
        dx, dy = _partials(kinds[node], x, y, values[node])
        local[slot] = dx
        if offsets[node + 1] - slot > 1:
            local[slot + 1] = dy


@njit(cache=True, nogil=True, error_model="numpy")
def backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads):  # type: ignore[no-untyped-def]
    """``backward_sweep`` fused with ``ancestors`` and ``primitive_derivatives``, for graphs whose
    every op is a primitive (``table`` as in ``forward_all_primitives``): one pass down from
    ``output``; a node is swept once a child that depends on it has been (ids decrease, so all its
    children come first). Same numbers, same order; the result goes to ``grads``. Each node's value
    and gradient sit side by side (``both[2 * node]``, ``both[2 * node + 1]``; ``2 * (output + 1)``
    entries), so a parent costs one cache line, not two. ``reached``: ``output + 1`` booleans.
    (Scratch arrays come from the caller: numpy asks the kernel for huge pages, which spares the
    random accesses most of their TLB misses.)"""
    for node in range(output + 1):
        both[2 * node] = values[node]
        both[2 * node + 1] = 0.0
        reached[node] = False
    both[2 * output + 1] = 1.0
    reached[output] = True
    for node in range(output, -1, -1):
        ahead = node - AHEAD
        if ahead >= 0:
            start = offsets[ahead]
            if offsets[ahead + 1] > start:
                _prefetch_write(both, 2 * parents[start])
                _prefetch_write(reached, parents[start])
                if offsets[ahead + 1] > start + 1:
                    _prefetch_write(both, 2 * parents[start + 1])
                    _prefetch_write(reached, parents[start + 1])
        slot = offsets[node]
        stop = offsets[node + 1]
        if not reached[node] or stop == slot:
            continue
        first = parents[slot]
        second = parents[slot + 1] if stop - slot > 1 else first
        x = both[2 * first]
        dx, dy = _partials(table[codes[node]], x, both[2 * second], both[2 * node])
        grad = both[2 * node + 1]
        reached[first] = True
        both[2 * first + 1] += grad * dx
        if stop - slot > 1:
            reached[second] = True
            both[2 * second + 1] += grad * dy
    for node in range(len(grads)):
        grads[node] = both[2 * node + 1] if node <= output else 0.0


@njit(cache=True, nogil=True)
def structure_ok(offsets, parents, op_codes, num_ops, is_leaf_code):  # type: ignore[no-untyped-def]
    """True when the columns keep every rule ``Graph.check`` vectorizes (offsets start at 0, never
    decrease and end at the edge count; op codes in range; leaves without parents; every parent
    id at least 0 and smaller than its child's). Reads nothing out of bounds on hostile input."""
    n = len(op_codes)
    e = len(parents)
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[n] != e:
        return False
    for node in range(n):
        start = offsets[node]
        stop = offsets[node + 1]
        if stop < start or stop > e:
            return False
        code = op_codes[node]
        if code >= num_ops:
            return False
        if is_leaf_code[code] and stop > start:
            return False
        for slot in range(start, stop):
            parent = parents[slot]
            if parent < 0 or parent >= node:
                return False
    return True
