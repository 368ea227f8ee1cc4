"""graphsvc's replay of a tensor graph without its engine: the same op calls in a plain loop.

:func:`op_calls_alone` makes what ``bench_tensors.py`` times as "op calls alone": how long
graphsvc's replay would take if its engine (the dispatch loop, its checks, its per-pass planning)
cost nothing. Not a way to replay graphs: it checks nothing an op returns, and it is planned for one
output and one set of leaf values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsvc import topo
from graphsvc.graph import Graph
from graphsvc.ops import NEEDS_INPUT_GRAD, RESIDUALS, Op
from graphsvc.replay import arrays as tensors
from graphsvc.replay import memory

__all__ = ["op_calls_alone"]

Pass = Callable[[], tuple[Any, dict[str, Any]]]


def op_calls_alone(graph: Graph, ops: Sequence[Op | None], output: int, params: Sequence[str]) -> Pass:
    """The op calls of graphsvc's replay of ``graph`` (the same functions, inputs, attributes and
    residuals, in the same order, with graphsvc's memory reuse) in a plain loop worked out before
    timing: no engine (no checks of what an op returns, no read-only flags, no per-pass planning).
    What graphsvc's replay would cost if its engine cost nothing; its distance to the hand-written
    numpy is the graph's own: more, smaller steps than the hand-written code."""
    calls = tensors._calls(graph, ops)
    values = tensors.forward(graph, ops)
    requires = tensors.requires_grad(graph, calls, values)
    leaves = [value if call is None else None for value, call in zip(values, calls, strict=True)]
    reached = topo.ancestors(graph, output)
    forward_plan = []
    for node, call in enumerate(calls):
        if call is not None:
            op, parents, attrs = call
            with_residuals = op.forward_with_residuals is not None and bool(reached[node])  # as tensors.replay
            function = op.forward_with_residuals if with_residuals else op.forward
            forward_plan.append((node, function, parents, attrs, with_residuals))
    backward_plan = []
    for node in np.flatnonzero(reached)[::-1].tolist():
        call = calls[node]
        if call is None or not requires[node]:
            continue
        op, parents, attrs = call
        vjp = op.tensor_vjp
        needs = tuple(requires[p] for p in parents)
        keywords = {**attrs, NEEDS_INPUT_GRAD: needs} if vjp.takes_needs else dict(attrs)
        backward_plan.append((node, vjp.function, parents, keywords, vjp.takes_residuals, needs))
    wanted = [graph.node_id(name) for name in params]

    def step() -> tuple[Any, dict[str, Any]]:
        values, residuals = list(leaves), {}
        with np.errstate(all="ignore"), memory.reuse():
            for node, function, parents, attrs, with_residuals in forward_plan:
                if with_residuals:
                    values[node], residuals[node] = function(*[values[p] for p in parents], **attrs)
                else:
                    values[node] = function(*[values[p] for p in parents], **attrs)
            grads: list[Any] = [None] * len(values)
            grads[output] = np.ones_like(values[output])
            summed: set[int] = set()
            for node, function, parents, attrs, takes_residuals, needs in backward_plan:
                g = grads[node]
                if g is None:
                    continue
                if takes_residuals:
                    attrs = {**attrs, RESIDUALS: residuals.pop(node, None)}
                cotangents = function(g, values[node], *[values[p] for p in parents], **attrs)
                for parent, cotangent, need in zip(parents, cotangents, needs, strict=True):
                    if cotangent is not None and need:  # summed as graphsvc sums: the third on, in place
                        previous = grads[parent]
                        if previous is None:
                            grads[parent] = cotangent
                        elif parent in summed:
                            np.add(previous, cotangent, out=previous)
                        else:
                            grads[parent] = np.asarray(previous + cotangent)
                            summed.add(parent)
        return values[output], {name: grads[node] for name, node in zip(params, wanted, strict=True)}

    return step
