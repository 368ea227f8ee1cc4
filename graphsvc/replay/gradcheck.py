"""A graph's analytic gradient against finite differences: :func:`gradcheck` (``graphsvc gradcheck FILE``).

``backward --check`` compares a replay with the gradients a file stores, so an op whose derivative
is wrong passes it when the file was built with that op. This checks the gradient that
graphsvc's backward replay gives, with respect to the graph's leaves, against central finite
differences of forward replays, as ``torch.autograd.gradcheck`` does for a function:

- a copy of the graph is replayed in float64 (float32 leaves and consts are cast first);
- a non-scalar output ``y`` is reduced to ``sum(y * r)`` for a fixed random array ``r`` (of the seed);
- with at most :data:`ELEMENT_LIMIT` leaf elements, each element is perturbed in turn (two
  forward replays each); with more, :data:`DIRECTIONS` random unit directions over all the
  chosen leaves are (two forward replays each), and when one fails, a direction restricted to
  each leaf says which leaves fail;
- int64 leaves and consts are not perturbed;
- when a check fails, the op whose derivative is wrong is found by bisection over the op nodes the
  output depends on, in topological order from the output: node ``k`` *passes* when the gradient
  of the output with respect to ``k``'s value (``k`` cut from its inputs and made a leaf) agrees
  with finite differences, which holds for every node from the output down to the wrong op and
  fails below it along the path the gradient takes; O(log n) checks of the whole graph find the
  last node that passes. That node's own VJP, at its replayed inputs, is then checked against
  finite differences of its forward; where the graph's branches break the order (the candidate's
  own check passes), each op node is checked alone, walking from the output. The culprit is named
  with its op and plugin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphsvc.errors import UsageError
from graphsvc.graph import CONST, LEAF, Graph, GraphBuilder, NodeRef, expect_graph
from graphsvc.ops import OpRegistry
from graphsvc.text import escape

__all__ = ["DIRECTIONS", "ELEMENT_LIMIT", "Culprit", "GraphGradcheck", "LeafCheck", "gradcheck"]

#: Up to this many leaf elements (over the leaves checked), every element is perturbed in turn.
ELEMENT_LIMIT = 64
#: Beyond it, this many random unit directions are.
DIRECTIONS = 3


@dataclass
class LeafCheck:
    """One leaf's check: ``passed``, the largest errors found, and the first disagreement."""

    node: int
    name: str
    elements: int
    passed: bool
    max_abs_error: float
    max_rel_error: float
    #: The first disagreement: the element (or None for a direction), analytic and numeric.
    failure: tuple[int | None, float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "node": self.node,
            "name": self.name,
            "elements": self.elements,
            "passed": self.passed,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error if math.isfinite(self.max_rel_error) else None,
        }
        if self.failure is not None:
            element, analytic, numeric = self.failure
            found["failure"] = {"element": element, "analytic": analytic, "numeric": numeric}
        return found


@dataclass
class Culprit:
    """The op node, nearest the output, whose own VJP disagrees with finite differences of its forward."""

    node: int
    name: str
    op: str
    plugin: str
    #: The input whose gradient is wrong, and the analytic and numeric numbers there.
    input: int
    analytic: float
    numeric: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "name": self.name,
            "op": self.op,
            "plugin": self.plugin,
            "input": self.input,
            "analytic": self.analytic,
            "numeric": self.numeric,
        }


@dataclass
class GraphGradcheck:
    """What :func:`gradcheck` found."""

    output: int
    output_name: str
    #: ``"elements"``: each leaf element perturbed; ``"directions"``: random unit directions.
    method: str
    replays: int
    eps: float
    rtol: float
    atol: float
    seed: int
    #: The graph held float32 numbers, cast to float64 for the check.
    cast_float32: bool
    #: The output is not a scalar: its projection on a fixed random array (of ``seed``) was checked.
    projected: bool
    leaves: list[LeafCheck] = field(default_factory=list)
    #: int64 leaves, not perturbed.
    skipped: list[str] = field(default_factory=list)
    culprit: Culprit | None = None

    @property
    def passed(self) -> bool:
        return all(leaf.passed for leaf in self.leaves)

    @property
    def failed(self) -> list[str]:
        return [leaf.name for leaf in self.leaves if not leaf.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "output": {"node": self.output, "name": self.output_name},
            "method": self.method,
            "replays": self.replays,
            "eps": self.eps,
            "rtol": self.rtol,
            "atol": self.atol,
            "seed": self.seed,
            "float64": True,
            "cast_float32": self.cast_float32,
            "projected": self.projected,
            "failed": self.failed,
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "skipped": self.skipped,
            "culprit": None if self.culprit is None else self.culprit.to_dict(),
        }


def gradcheck(
    graph: Graph,
    output: NodeRef | None = None,
    set: Mapping[NodeRef, float | np.ndarray] | None = None,
    leaves: Sequence[NodeRef] | None = None,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-3,
    atol: float = 1e-5,
    seed: int = 0,
    registry: OpRegistry | None = None,
) -> GraphGradcheck:
    """Check ``graph``'s analytic gradient of ``output`` (a node id or name; by default the single
    output) with respect to ``leaves`` (ids or names; by default every float leaf) against central
    finite differences (step ``eps``), after ``set`` gives leaves new values (as
    :func:`graphsvc.forward`). An element passes when ``|analytic - numeric| <= atol + rtol *
    |numeric|``. ``seed`` chooses the random directions. ``graph`` is not changed."""
    from graphsvc.replay.run import _assignments, _registry, output_node, resolve_set

    expect_graph("gradcheck", graph)
    for label, number in (("eps", eps), ("rtol", rtol), ("atol", atol)):
        if not (isinstance(number, (int, float)) and math.isfinite(number) and number >= 0):
            raise UsageError(f"{label} must be a finite number, 0 or more, not {number!r}")
    if eps == 0:
        raise UsageError("eps must be more than 0")
    registry = _registry(registry)
    start = output_node(graph, output, "output=")
    overrides = resolve_set(graph, _assignments(set))
    copy, cast = _float64_copy(graph)
    point = _leaf_values(copy, overrides)
    chosen, skipped = _chosen_leaves(copy, point, leaves)
    checked, projected = _projected(copy, registry, start, point, seed)
    checker = _Checker(checked, registry, projected, point, eps, rtol, atol, np.random.default_rng(seed))
    result = GraphGradcheck(
        output=start,
        output_name=graph.label(start),
        method="elements" if sum(point[n].size for n in chosen) <= ELEMENT_LIMIT else "directions",
        replays=0,
        eps=eps,
        rtol=rtol,
        atol=atol,
        seed=seed,
        cast_float32=cast,
        projected=projected != start,
        skipped=skipped,
    )
    result.leaves = checker.check(chosen, result.method == "elements")
    if not result.passed:
        result.culprit = _culprit(checked, registry, projected, checker.values, eps, rtol, atol, seed)
    result.replays = checker.replays
    return result


def _projected(
    graph: Graph, registry: OpRegistry, output: int, point: Mapping[int, np.ndarray], seed: int
) -> tuple[Graph, int]:
    """``graph`` and ``output`` when the output is a scalar; else ``graph`` with three nodes more,
    ``sum(mul(output, r))`` for a const ``r`` drawn from ``seed``, and the last of them."""
    from graphsvc.graph import graph_from_buffers
    from graphsvc.replay.run import replay_values

    value = np.asarray(replay_values(graph, registry, _overrides(graph, point)).values[output])
    if value.size == 1 and value.ndim == 0:
        return graph, output
    r = np.random.default_rng(seed).standard_normal(value.shape)
    n = graph.num_nodes
    table = list(graph.op_table)
    codes = []
    for tag in (CONST, "mul", "sum"):
        if tag not in table:
            table.append(tag)
        codes.append(table.index(tag))
    offsets = graph.parent_offsets
    end = int(offsets[-1])
    result = graph_from_buffers(
        table,
        np.concatenate([graph.op_codes, np.array(codes, dtype=graph.op_codes.dtype)]).tobytes(),
        np.concatenate([offsets, np.array([end, end + 2, end + 3], dtype=offsets.dtype)]).tobytes(),
        np.concatenate(
            [graph.parent_indices, np.array([output, n, n + 1], dtype=graph.parent_indices.dtype)]
        ).tobytes(),
        np.concatenate([graph.values, np.full(3, math.nan)]).tobytes(),
        names=dict(graph.names),
        attrs=dict(graph.attrs),
        outputs=[n + 2],
        op_sources=dict(graph.op_sources),
        arrays={**graph.arrays, n: r, n + 1: np.zeros(value.shape), n + 2: np.zeros(())},
    )
    return result, n + 2


def _overrides(graph: Graph, point: Mapping[int, np.ndarray]) -> dict[int, Any]:
    """``point`` as a replay's overrides: a float for a scalar leaf, an array for a tensor one."""
    return {n: (float(v) if v.ndim == 0 and n not in graph.arrays else v) for n, v in point.items()}


def _float64_copy(graph: Graph) -> tuple[Graph, bool]:
    """A copy of ``graph`` whose float32 arrays are float64, and whether there were any."""
    copy = graph.copy()
    cast = False
    for node, array in list(copy.arrays.items()):
        if array.dtype == np.float32:
            copy.arrays[node] = array.astype(np.float64)
            cast = True
    return copy, cast


def _leaf_values(graph: Graph, overrides: Mapping[int, Any]) -> dict[int, np.ndarray]:
    """Every leaf's value as an array (a float one as float64), ``overrides`` first."""
    point: dict[int, np.ndarray] = {}
    for node in graph.leaves().tolist():
        if graph.op(node) != LEAF:
            continue
        graph.check_settable(node)
        value = np.asarray(overrides.get(node, graph.value(node)))
        point[node] = value if value.dtype == np.int64 else value.astype(np.float64)
    return point


def _chosen_leaves(
    graph: Graph, point: Mapping[int, np.ndarray], leaves: Sequence[NodeRef] | None
) -> tuple[list[int], list[str]]:
    """The float leaves to check (``leaves``, or all), and the int64 ones left unperturbed."""
    if leaves is None:
        wanted = list(point)
    else:
        wanted = []
        for ref in leaves:
            node = graph.node_id(ref, "leaves")
            if node not in point:
                raise UsageError(f"--leaves {escape(graph.label(node))}: not a leaf ({escape(graph.op(node))})")
            if node not in wanted:
                wanted.append(node)
    skipped = [graph.label(n) for n in wanted if point[n].dtype == np.int64]
    chosen = [n for n in wanted if point[n].dtype != np.int64]
    if not chosen:
        raise UsageError("no float leaf to check: the gradient is with respect to float leaves")
    return chosen, skipped


class _Checker:
    """Replays of one graph at points near ``point``: the analytic gradient and finite differences."""

    def __init__(
        self,
        graph: Graph,
        registry: OpRegistry,
        output: int,
        point: dict[int, np.ndarray],
        eps: float,
        rtol: float,
        atol: float,
        rng: np.random.Generator,
    ) -> None:
        from graphsvc.replay.run import replay_values

        self.graph, self.registry, self.output, self.point = graph, registry, output, point
        self.eps, self.rtol, self.atol, self.rng = eps, rtol, atol, rng
        run = replay_values(graph, registry, self._overrides(point), output)
        self.values = run.values
        self.replays = 1
        self.grads = {n: np.asarray(run.grads[n], dtype=np.float64) for n in point}

    def _overrides(self, point: Mapping[int, np.ndarray]) -> dict[int, Any]:
        return _overrides(self.graph, point)

    def f(self, shift: Mapping[int, np.ndarray]) -> float:
        """The output with the leaves at ``point + shift``."""
        from graphsvc.replay.run import replay_values

        moved = dict(self.point)
        for node, delta in shift.items():
            moved[node] = self.point[node] + delta
        self.replays += 1
        value = replay_values(self.graph, self.registry, self._overrides(moved)).values[self.output]
        return float(np.sum(np.asarray(value, dtype=np.float64)))

    def numeric(self, direction: Mapping[int, np.ndarray]) -> float:
        plus = self.f({n: self.eps * d for n, d in direction.items()})
        minus = self.f({n: -self.eps * d for n, d in direction.items()})
        return (plus - minus) / (2 * self.eps)

    def analytic(self, direction: Mapping[int, np.ndarray]) -> float:
        return float(sum(np.sum(self.grads[n] * d) for n, d in direction.items()))

    def agree(self, analytic: float, numeric: float) -> bool:
        return bool(abs(analytic - numeric) <= self.atol + self.rtol * abs(numeric))

    def check(self, chosen: list[int], each_element: bool) -> list[LeafCheck]:
        if each_element:
            return [self._elements(node) for node in chosen]
        combined = []
        for _ in range(DIRECTIONS):
            direction = {n: self.rng.standard_normal(self.point[n].shape) for n in chosen}
            norm = math.sqrt(sum(float(np.sum(d * d)) for d in direction.values())) or 1.0
            combined.append({n: d / norm for n, d in direction.items()})
        pairs = [(self.analytic(d), self.numeric(d)) for d in combined]
        if all(self.agree(a, n) for a, n in pairs):
            abs_error, rel_error = _errors(pairs)
            return [self._leaf(node, abs_error, rel_error, None) for node in chosen]
        return [self._one_direction(node) for node in chosen]  # which leaves: one direction each

    def _leaf(self, node: int, abs_error: float, rel_error: float, failure: Any) -> LeafCheck:
        size = int(self.point[node].size)
        return LeafCheck(node, self.graph.label(node), size, failure is None, abs_error, rel_error, failure)

    def _elements(self, node: int) -> LeafCheck:
        shape = self.point[node].shape
        pairs, failure = [], None
        for element in range(self.point[node].size):
            unit = np.zeros(shape)
            unit.flat[element] = 1.0
            analytic, numeric = self.analytic({node: unit}), self.numeric({node: unit})
            pairs.append((analytic, numeric))
            if failure is None and not self.agree(analytic, numeric):
                failure = (element, analytic, numeric)
        return self._leaf(node, *_errors(pairs), failure)

    def _one_direction(self, node: int) -> LeafCheck:
        d = self.rng.standard_normal(self.point[node].shape)
        d = d / (math.sqrt(float(np.sum(d * d))) or 1.0)
        analytic, numeric = self.analytic({node: d}), self.numeric({node: d})
        failure = None if self.agree(analytic, numeric) else (None, analytic, numeric)
        return self._leaf(node, *_errors([(analytic, numeric)]), failure)


def _errors(pairs: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The largest absolute and relative (to the numeric number; inf where it is 0) errors."""
    abs_error = rel_error = 0.0
    for analytic, numeric in pairs:
        error = abs(analytic - numeric)
        abs_error = max(abs_error, error)
        if error:
            rel_error = max(rel_error, error / abs(numeric) if numeric else math.inf)
    return abs_error, rel_error


def _ancestors(graph: Graph, output: int) -> list[int]:
    """The op nodes ``output`` depends on (itself included), nearest the output first; no recursion."""
    seen = {output}
    stack = [output]
    while stack:
        for parent in graph.parents(stack.pop()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return sorted((n for n in seen if graph.op(n) not in (LEAF, CONST)), reverse=True)


def _culprit(
    graph: Graph, registry: OpRegistry, output: int, values: Any, eps: float, rtol: float, atol: float, seed: int
) -> Culprit | None:
    """The first op node from ``output`` whose own VJP, at its replayed inputs ``values``, disagrees
    with finite differences of its forward: each is checked as a graph of its own, its float inputs
    leaves (int64 ones consts)."""
    ancestors = _ancestors(graph, output)
    candidate = _bisect(graph, registry, output, ancestors, values, eps, rtol, atol, seed)
    if candidate is not None:
        found = _op_check(graph, registry, candidate, values, eps, rtol, atol, seed)
        if found is not None:
            return found
    for node in ancestors:
        found = _op_check(graph, registry, node, values, eps, rtol, atol, seed)
        if found is not None:
            return found
    return None


def _bisect(
    graph: Graph,
    registry: OpRegistry,
    output: int,
    ancestors: list[int],
    values: Any,
    eps: float,
    rtol: float,
    atol: float,
    seed: int,
) -> int | None:
    """The last of ``ancestors`` (nearest the output first) whose cut passes (see the module
    docstring), by bisection: the output's own cut passes, the leaves' check failed."""
    if len(ancestors) < 3:
        return ancestors[0] if ancestors else None
    lo, hi = 0, len(ancestors)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _cut_passes(graph, registry, output, ancestors[mid], values, eps, rtol, atol, seed):
            lo = mid
        else:
            hi = mid
    return ancestors[lo]


def _cut_passes(
    graph: Graph,
    registry: OpRegistry,
    output: int,
    node: int,
    values: Any,
    eps: float,
    rtol: float,
    atol: float,
    seed: int,
) -> bool:
    """Whether the output's gradient with respect to ``node``'s value, ``node`` made a leaf holding
    its replayed value, agrees with finite differences (one random direction)."""
    from graphsvc.graph import LEAF_TAGS, graph_from_buffers

    value = np.asarray(values[node])
    if value.dtype == np.int64:
        return True
    table = list(graph.op_table)
    if LEAF not in table:
        table.append(LEAF)
    codes = graph.op_codes.copy()
    codes[node] = table.index(LEAF)
    offsets = graph.parent_offsets
    count = int(offsets[node + 1] - offsets[node])
    parents = np.concatenate([graph.parent_indices[: offsets[node]], graph.parent_indices[offsets[node + 1] :]])
    new_offsets = offsets.copy()
    new_offsets[node + 1 :] -= count
    arrays = dict(graph.arrays)
    column = graph.values.copy()
    if node in graph.arrays or value.ndim:
        arrays[node] = value.astype(np.float64)
        column[node] = math.nan
    else:
        column[node] = float(value)
    cut = graph_from_buffers(
        table,
        codes.tobytes(),
        new_offsets.tobytes(),
        parents.tobytes(),
        column.tobytes(),
        names=dict(graph.names),
        attrs={n: a for n, a in graph.attrs.items() if n != node},
        outputs=[output],
        op_sources=dict(graph.op_sources),
        arrays=arrays,
    )
    assert cut.op(node) in LEAF_TAGS
    point = {node: value.astype(np.float64)}
    checker = _Checker(cut, registry, output, point, eps, rtol, atol, np.random.default_rng(seed))
    return checker.check([node], False)[0].passed


def _op_check(
    graph: Graph, registry: OpRegistry, node: int, values: Any, eps: float, rtol: float, atol: float, seed: int
) -> Culprit | None:
    """``node``'s own VJP at its replayed inputs against finite differences of its forward, as a
    graph of its own (float inputs leaves, int64 ones consts): the culprit, or None where it agrees."""
    builder = GraphBuilder()
    inputs: dict[int, int] = {}
    parents = []
    for position, parent in enumerate(graph.parents(node)):
        value = values[parent]
        if np.asarray(value).dtype == np.int64:
            parents.append(builder.const(value))
        else:
            parents.append(builder.leaf(value))
            inputs[parents[-1]] = position
    if not inputs:
        return None
    top = builder.add(graph.op(node), parents, value=values[node], attrs=graph.attrs.get(node))
    alone = builder.build([top])
    point = _leaf_values(alone, {})
    alone, last = _projected(alone, registry, top, point, seed)
    checker = _Checker(alone, registry, last, point, eps, rtol, atol, np.random.default_rng(seed))
    each = sum(point[n].size for n in inputs) <= ELEMENT_LIMIT
    for leaf in checker.check(list(inputs), each):
        if not leaf.passed and leaf.failure is not None:
            op = registry.get(graph.op(node))
            _, analytic, numeric = leaf.failure
            return Culprit(node, graph.label(node), op.name, op.source, inputs[leaf.node], analytic, numeric)
    return None
