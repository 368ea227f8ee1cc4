"""Numba-compiled versions of graphsvc's graph sweeps (its C kernels are in ``csrc/``), kept to
measure the C ones against (benchmarks/bench_kernels.py, bench_replay_kernels.py); needs ``pip install numba``.

Arguments are the graph's columns: ``offsets`` (int64, N + 1) and ``parents`` (int32, E). The replay
sweeps and the elementwise loops take the arguments of graphsvc.native.replay_kernels, ``params`` (each
node's parameter, pow's exponent, or None) included, and raise its ValueErrors for the faults the
sweeps meet (a node or op code out of range, a primitive with a parameter but no params); every
primitive computes the same bits as csrc/opmath.h, being generated from the same table
(graphsvc/ops/opmath.py): ``python benchmarks/numba_kernels.py`` rewrites that part after a change to it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from graphsvc.ops import opmath
from graphsvc.ops.opmath import PRIMITIVES

#: The kernels, by name (the same names, arguments and results as the compiled kernels of
#: graphsvc.native.topo_kernels and graphsvc.native.replay_kernels).
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


@njit(cache=True, nogil=True)
def first_arity_mismatch(codes, offsets, arity):  # type: ignore[no-untyped-def]
    """Twin of the vectorized check in ``replay.resolve_ops``: the first node whose parent count is
    not ``arity[its op code]`` (entries below 0 are not checked), or -1."""
    for node in range(len(codes)):
        expected = arity[codes[node]]
        if expected >= 0 and offsets[node + 1] - offsets[node] != expected:
            return node
    return -1


# -- primitive ops ----------------------------------------------------------------------------------
# The primitives of graphsvc.ops.opmath.PRIMITIVES (code: position + 1; 0: not a primitive), every one
# the C kernels know: their math is generated below from graphsvc/ops/opmath.py's table, as csrc/opmath.h
# is, out of the words of its rule language. Each word as its C spelling (opmath.WORDS[...].c)
# computes it: IEEE results (error_model="numpy": 1/0 is inf, never an exception), libm's exp, log,
# pow, sin, cos and tanh. Unary primitives ignore ``y``; ``p`` is a node's parameter (pow's exponent).
@njit(inline="always", error_model="numpy")
def _div(a, b):  # type: ignore[no-untyped-def]
    return a / b


@njit(inline="always", error_model="numpy")
def _sqrt(a):  # type: ignore[no-untyped-def]
    return math.sqrt(a)


@njit(inline="always")
def _maximum(a, b):  # type: ignore[no-untyped-def]
    return a if (a > b or a != a) else b


@njit(inline="always")
def _minimum(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b or a != a) else b


@njit(inline="always")
def _fabs(a):  # type: ignore[no-untyped-def]
    return abs(a)


@njit(inline="always")
def _sign(a):  # type: ignore[no-untyped-def]
    return 1.0 if a > 0.0 else (-1.0 if a < 0.0 else (0.0 if a == 0.0 else a))


@njit(inline="always")
def _gt(a, b):  # type: ignore[no-untyped-def]
    return 1.0 if a > b else 0.0


@njit(inline="always")
def _lt(a, b):  # type: ignore[no-untyped-def]
    return 1.0 if a < b else 0.0


@njit(inline="always")
def _eq(a, b):  # type: ignore[no-untyped-def]
    return 1.0 if a == b else 0.0


@njit(inline="always", error_model="numpy")
def _exp(a):  # type: ignore[no-untyped-def]
    return math.exp(a)


@njit(inline="always", error_model="numpy")
def _log(a):  # type: ignore[no-untyped-def]
    return math.log(a)


@njit(inline="always", error_model="numpy")
def _pow(a, b):  # type: ignore[no-untyped-def]
    return a * a if b == 2.0 else math.pow(a, b)


@njit(inline="always", error_model="numpy")
def _sin(a):  # type: ignore[no-untyped-def]
    return math.sin(a)


@njit(inline="always", error_model="numpy")
def _cos(a):  # type: ignore[no-untyped-def]
    return math.cos(a)


@njit(inline="always", error_model="numpy")
def _tanh(a):  # type: ignore[no-untyped-def]
    return math.tanh(a)


#: The words above, by their name in the rule language (graphsvc.ops.opmath.WORDS has the same names).
WORDS = (
    "div",
    "sqrt",
    "maximum",
    "minimum",
    "fabs",
    "sign",
    "gt",
    "lt",
    "eq",
    "exp",
    "log",
    "pow",
    "sin",
    "cos",
    "tanh",
)

BEGIN_GENERATED = "# -- generated from graphsvc/ops/opmath.py by `python benchmarks/numba_kernels.py`: do not edit --"
END_GENERATED = "# -- end of the generated code --"


# -- generated from graphsvc/ops/opmath.py by `python benchmarks/numba_kernels.py`: do not edit --
@njit(inline="always", error_model="numpy")
def _primitive(kind, x, y, p):  # type: ignore[no-untyped-def]
    """What primitive ``kind`` computes of ``x`` and ``y`` (``p``: its parameter); nan for no primitive."""
    if kind == 1:  # add: x + y
        return x + y
    if kind == 2:  # sub: x - y
        return x - y
    if kind == 3:  # mul: x * y
        return x * y
    if kind == 4:  # div: div(x, y)
        return _div(x, y)
    if kind == 5:  # neg: -x
        return -x
    if kind == 6:  # pow: pow(x, exponent)
        return _pow(x, p)
    if kind == 7:  # exp: exp(x)
        return _exp(x)
    if kind == 8:  # log: log(x)
        return _log(x)
    if kind == 9:  # sqrt: sqrt(x)
        return _sqrt(x)
    if kind == 10:  # sin: sin(x)
        return _sin(x)
    if kind == 11:  # cos: cos(x)
        return _cos(x)
    if kind == 12:  # tanh: tanh(x)
        return _tanh(x)
    if kind == 13:  # relu: maximum(x, 0)
        return _maximum(x, 0.0)
    if kind == 14:  # sigmoid: div(1, 1 + exp(-x))
        return _div(1.0, 1.0 + _exp(-x))
    if kind == 15:  # abs: fabs(x)
        return _fabs(x)
    if kind == 16:  # max: maximum(x, y)
        return _maximum(x, y)
    if kind == 17:  # min: minimum(x, y)
        return _minimum(x, y)
    return math.nan


@njit(inline="always", error_model="numpy")
def _partials(kind, x, y, out, p):  # type: ignore[no-untyped-def]
    """(d out/d x, d out/d y) of primitive ``kind``; dy is 0 for a unary one."""
    if kind == 1:  # add: 1, 1
        return 1.0, 1.0
    if kind == 2:  # sub: 1, -1
        return 1.0, -1.0
    if kind == 3:  # mul: y, x
        return y, x
    if kind == 4:  # div: div(1, y), div(-out, y)
        return _div(1.0, y), _div(-out, y)
    if kind == 5:  # neg: -1
        return -1.0, 0.0
    if kind == 6:  # pow: exponent * pow(x, exponent - 1)
        return p * _pow(x, p - 1.0), 0.0
    if kind == 7:  # exp: out
        return out, 0.0
    if kind == 8:  # log: div(1, x)
        return _div(1.0, x), 0.0
    if kind == 9:  # sqrt: div(0.5, out)
        return _div(0.5, out), 0.0
    if kind == 10:  # sin: cos(x)
        return _cos(x), 0.0
    if kind == 11:  # cos: -sin(x)
        return -_sin(x), 0.0
    if kind == 12:  # tanh: 1 - out * out
        return 1.0 - (out * out), 0.0
    if kind == 13:  # relu: gt(out, 0)
        return _gt(out, 0.0), 0.0
    if kind == 14:  # sigmoid: out * (1 - out)
        return out * (1.0 - out), 0.0
    if kind == 15:  # abs: sign(x)
        return _sign(x), 0.0
    if kind == 16:  # max: gt(x, y) + 0.5 * eq(x, y), gt(y, x) + 0.5 * eq(x, y)
        return _gt(x, y) + (0.5 * _eq(x, y)), _gt(y, x) + (0.5 * _eq(x, y))
    if kind == 17:  # min: lt(x, y) + 0.5 * eq(x, y), lt(y, x) + 0.5 * eq(x, y)
        return _lt(x, y) + (0.5 * _eq(x, y)), _lt(y, x) + (0.5 * _eq(x, y))
    return math.nan, math.nan


@njit(inline="always")
def _takes_param(kind):  # type: ignore[no-untyped-def]
    """Whether the nodes of primitive ``kind`` carry a parameter (an attribute: the exponent of pow)."""
    return kind == 6


# -- end of the generated code --


@njit(inline="always")
def _param(kind, params, node):  # type: ignore[no-untyped-def]
    """(found, node ``node``'s parameter): 0 for a primitive that takes none; not found for one
    that takes one when no params were given (``params`` empty)."""
    if not _takes_param(kind):
        return True, 0.0
    if not len(params):
        return False, 0.0
    return True, params[node]


@njit(inline="always")
def _inputs(node, offsets, parents, values):  # type: ignore[no-untyped-def]
    """The first slot of ``node`` and its inputs (``y`` repeats ``x`` for a unary node)."""
    slot = offsets[node]
    x = values[parents[slot]]
    y = values[parents[slot + 1]] if offsets[node + 1] - slot > 1 else x
    return slot, x, y


#: What the sweeps report (as csrc/replay.c raises it: see _check): nothing wrong, a node id out of
#: range, an op code beyond the table, a primitive with a parameter but no params.
OK, BAD_NODE, BAD_CODE, NO_PARAMS = 0, 1, 2, 3


@njit(cache=True, nogil=True, error_model="numpy")
def _forward_all_primitives(codes, table, offsets, parents, values, params):  # type: ignore[no-untyped-def]
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
        if codes[node] >= len(table):
            return BAD_CODE, node
        kind = table[codes[node]]
        found, p = _param(kind, params, node)
        if not found:
            return NO_PARAMS, node
        x = values[parents[slot]]
        y = values[parents[slot + 1]] if stop - slot > 1 else x
        values[node] = _primitive(kind, x, y, p)
    return OK, -1


@njit(cache=True, nogil=True, error_model="numpy")
def _forward_primitives(nodes, kinds, offsets, parents, values, start, params):  # type: ignore[no-untyped-def]
    n = len(values)
    for k in range(max(start, 0), len(nodes)):
        node = nodes[k]
        if node < 0 or node >= n:
            return BAD_NODE, node, k
        kind = kinds[node]
        if kind == 0:
            return OK, -1, k
        found, p = _param(kind, params, node)
        if not found:
            return NO_PARAMS, node, k
        _, x, y = _inputs(node, offsets, parents, values)
        values[node] = _primitive(kind, x, y, p)
    return OK, -1, len(nodes)


@njit(cache=True, nogil=True, error_model="numpy")
def _primitive_derivatives(nodes, kinds, offsets, parents, values, local, params):  # type: ignore[no-untyped-def]
    n = len(values)
    for k in range(len(nodes)):
        node = nodes[k]
        if node < 0 or node >= n:
            return BAD_NODE, node
        kind = kinds[node]
        if kind == 0:
            continue
        found, p = _param(kind, params, node)
        if not found:
            return NO_PARAMS, node
        slot, x, y = _inputs(node, offsets, parents, values)
        dx, dy = _partials(kind, x, y, values[node], p)
        local[slot] = dx
        if offsets[node + 1] - slot > 1:
            local[slot + 1] = dy
    return OK, -1


@njit(cache=True, nogil=True, error_model="numpy")
def _backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads, params):  # type: ignore[no-untyped-def]
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
        if codes[node] >= len(table):
            return BAD_CODE, node
        kind = table[codes[node]]
        found, p = _param(kind, params, node)
        if not found:
            return NO_PARAMS, node
        first = parents[slot]
        second = parents[slot + 1] if stop - slot > 1 else first
        dx, dy = _partials(kind, both[2 * first], both[2 * second], both[2 * node], p)
        grad = both[2 * node + 1]
        reached[first] = True
        both[2 * first + 1] += grad * dx
        if stop - slot > 1:
            reached[second] = True
            both[2 * second + 1] += grad * dy
    for node in range(len(grads)):
        grads[node] = both[2 * node + 1] if node <= output else 0.0
    return OK, -1


@njit(cache=True, nogil=True, error_model="numpy")
def _elementwise(code, x, y, p, out):  # type: ignore[no-untyped-def]
    for i in range(len(x)):
        out[i] = _primitive(code, x[i], y[i], p)


@njit(cache=True, nogil=True, error_model="numpy")
def _elementwise_partials(code, x, y, out, p, dx, dy):  # type: ignore[no-untyped-def]
    for i in range(len(x)):
        dx[i], dy[i] = _partials(code, x[i], y[i], out[i], p)


# -- the replay sweeps as graphsvc.native.replay_kernels gives them: the same arguments, results and errors -
#: ``params`` when none are given: an empty array, so each kernel is compiled once (for arrays).
_NO_PARAMS = np.empty(0, dtype=np.float64)


def _params(params: np.ndarray | None, n: int) -> np.ndarray:
    """The ``params`` argument checked as csrc/replay.c checks it: None, or one float64 per node."""
    if params is None:
        return _NO_PARAMS
    if len(params) != n:
        raise ValueError(f"params: {len(params)} items, expected one per node ({n})")
    return params


def _check(
    fault: int, node: int, n: int, codes: np.ndarray | None, table: np.ndarray | None, kinds: np.ndarray | None
) -> None:
    """Raise what csrc/replay.c raises for a sweep's ``fault`` at ``node`` (nothing for OK)."""
    if fault == BAD_NODE:
        raise ValueError(f"nodes: {node} is not a node of this graph of {n}")
    if fault == BAD_CODE:
        assert codes is not None and table is not None
        raise ValueError(f"codes: node {node} has op code {int(codes[node])}, beyond the table of {len(table)}")
    if fault == NO_PARAMS:
        kind = int(kinds[node]) if kinds is not None else int(table[codes[node]])  # type: ignore[index]
        raise ValueError(f"params: node {node} is a primitive with a parameter (code {kind}), but no params were given")


def _check_output(output: int, n: int) -> None:
    if not 0 <= output < n:
        raise ValueError(f"output {output} is not a node of this graph of {n}")


def forward_all_primitives(codes, table, offsets, parents, values, params=None):  # type: ignore[no-untyped-def]
    """``forward_primitives`` over every node in id order, for graphs whose every op is a primitive:
    ``table`` maps an op code to its primitive (0 for the leaf tags, whose nodes have no parents)."""
    fault, node = _forward_all_primitives(codes, table, offsets, parents, values, _params(params, len(codes)))
    _check(fault, node, len(codes), codes, table, None)


def forward_primitives(nodes, kinds, offsets, parents, values, start, params=None):  # type: ignore[no-untyped-def]
    """Compute ``values`` of ``nodes[start:]`` in order; stop at the first node that is not a
    primitive and return its position (``len(nodes)`` when all were done)."""
    n = len(values)
    fault, node, position = _forward_primitives(nodes, kinds, offsets, parents, values, start, _params(params, n))
    _check(fault, node, n, None, None, kinds)
    return position


def primitive_derivatives(nodes, kinds, offsets, parents, values, local, params=None):  # type: ignore[no-untyped-def]
    """Fill ``local`` (one entry per parent slot) for ``nodes`` that are primitives."""
    n = len(values)
    fault, node = _primitive_derivatives(nodes, kinds, offsets, parents, values, local, _params(params, n))
    _check(fault, node, n, None, None, kinds)


def backward_primitives(offsets, parents, codes, table, values, output, both, reached, grads, params=None):  # type: ignore[no-untyped-def]
    """``backward_sweep`` fused with ``ancestors`` and ``primitive_derivatives``, for graphs whose
    every op is a primitive (``table`` as in ``forward_all_primitives``): one pass down from
    ``output``; a node is swept once a child that depends on it has been (ids decrease, so all its
    children come first). Same numbers, same order; the result goes to ``grads``. Each node's value
    and gradient sit side by side (``both[2 * node]``, ``both[2 * node + 1]``; ``2 * (output + 1)``
    entries), so a parent costs one cache line, not two. ``reached``: ``output + 1`` booleans.
    (Scratch arrays come from the caller: numpy asks the kernel for huge pages, which spares the
    random accesses most of their TLB misses.)"""
    n = len(codes)
    _check_output(output, n)
    args = (offsets, parents, codes, table, values, output, both, reached, grads, _params(params, n))
    fault, node = _backward_primitives(*args)
    _check(fault, node, n, codes, table, None)


def _check_code(code: int) -> None:
    if not 1 <= code <= len(PRIMITIVES):
        raise ValueError(f"code {code} is not a primitive (1 to {len(PRIMITIVES)})")


def elementwise(code: int, x: np.ndarray, y: np.ndarray, param: float = 0.0) -> np.ndarray:
    """Primitive ``code``'s forward of ``x`` and ``y`` (float64 arrays of one length; a unary
    primitive ignores ``y``), element by element; ``param`` is its parameter."""
    _check_code(code)
    out = np.empty_like(x)
    _elementwise(code, x, y, float(param), out)
    return out


def elementwise_partials(
    code: int, x: np.ndarray, y: np.ndarray, out: np.ndarray, param: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Primitive ``code``'s partial derivatives (d out/d x, d out/d y) element by element."""
    _check_code(code)
    dx, dy = np.empty_like(x), np.empty_like(x)
    _elementwise_partials(code, x, y, out, float(param), dx, dy)
    return dx, dy


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


# -- the generated math -----------------------------------------------------------------------------
def _python(tree: Any, rule: opmath.Rule) -> str:
    """An expression of the rule language as Python source calling the words above (``_div(x, y)``),
    parenthesized as graphsvc.ops.opmath writes it for C, less the parentheses around the whole
    expression and around each argument of a call."""

    def call(word: str, args: list[str]) -> str:
        return f"_{word}({', '.join(map(_bare, args))})"

    return _bare(opmath._emit(tree, call, lambda name: "p" if name in rule.attrs else name))


def _bare(text: str) -> str:
    """``text`` without the parentheses that enclose all of it (``(a + b)``, not ``(a) + (b)``)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for char in text[:-1]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text  # the first parenthesis closes before the end
    return text[1:-1]


def generated() -> str:
    """The generated block of this file (between BEGIN_GENERATED and END_GENERATED): ``_primitive``,
    ``_partials`` and ``_takes_param`` of every op of graphsvc.ops.opmath.RULES, by its code."""
    forward, partials = [], []
    for name, rule in opmath.RULES.items():
        code = opmath.CODES[name]
        out = _python(opmath._parse(name, rule, rule.forward, partial=False), rule)
        forward += [f"    if kind == {code}:  # {name}: {rule.forward}", f"        return {out}"]
        d = [_python(opmath._parse(name, rule, source, partial=True), rule) for source in rule.partials]
        partials += [
            f"    if kind == {code}:  # {name}: {', '.join(rule.partials)}",
            f"        return {d[0]}, {d[1] if rule.arity == 2 else '0.0'}",
        ]
    with_param = " or ".join(f"kind == {opmath.CODES[n]}" for n, r in opmath.RULES.items() if r.attrs) or "False"
    lines = [
        BEGIN_GENERATED,
        '@njit(inline="always", error_model="numpy")',
        "def _primitive(kind, x, y, p):  # type: ignore[no-untyped-def]",
        '    """What primitive ``kind`` computes of ``x`` and ``y`` (``p``: its parameter); nan for no primitive."""',
        *forward,
        "    return math.nan",
        "",
        "",
        '@njit(inline="always", error_model="numpy")',
        "def _partials(kind, x, y, out, p):  # type: ignore[no-untyped-def]",
        '    """(d out/d x, d out/d y) of primitive ``kind``; dy is 0 for a unary one."""',
        *partials,
        "    return math.nan, math.nan",
        "",
        "",
        '@njit(inline="always")',
        "def _takes_param(kind):  # type: ignore[no-untyped-def]",
        '    """Whether the nodes of primitive ``kind`` carry a parameter (an attribute: the exponent of pow)."""',
        f"    return {with_param}",
        "",
        "",
        END_GENERATED,
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python benchmarks/numba_kernels.py``: rewrite the generated block of this file from the table."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Rewrite the generated math of benchmarks/numba_kernels.py from graphsvc/ops/opmath.py's table "
        "(after a change to the table, as python -m graphsvc.ops.opmath rewrites csrc/opmath.h)."
    )
    parser.parse_args(argv)
    path = Path(__file__)
    text = path.read_text()
    start = text.index(f"\n{BEGIN_GENERATED}\n") + 1  # the line itself, not the constant's quoted text
    end = text.index(f"\n{END_GENERATED}\n", start) + 1 + len(END_GENERATED)
    path.write_text(text[:start] + generated() + text[end:])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
