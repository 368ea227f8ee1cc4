"""Forward and backward replay of a :class:`~graphsvc.graph.Graph` with an op registry.

This module never names a concrete op: every op comes from the registry.

* Forward recomputes every non-leaf value from the leaves. Nodes are grouped by level (a node's
  level is one more than its highest parent's) and, within a level, by op and attributes, so each
  group is one call of the op's elementwise function over an array.
* Backward computes the local derivative of every edge, again one call per (op, attributes) group
  over all the nodes that need it, then sweeps the output's ancestors in decreasing id order
  (a reverse topological order, since parents have smaller ids), adding
  ``grad[child] * local[edge]`` to each parent. Every replay starts from zero gradients, so the
  seeds' zero-gradient trap cannot happen here.

Which code runs the sweeps (the compiled kernels or the pure-Python references; numpy groups or
node by node) is one :class:`graphsvc.native.Engine`, chosen at the top of each replay from the
graph's size (or given by the caller) and passed down. Comparing replayed numbers with stored ones
is :mod:`graphsvc.replay.compare`' job, not this module's.

Every builtin elementwise op is a compiled primitive (``pow`` with its ``exponent`` as a per-node
parameter): its math is written once, in :mod:`graphsvc.ops.opmath`, from which the compiled kernels,
the numpy functions of :mod:`graphsvc.ops.builtin` and :class:`graphsvc.value.Value` are derived.

What is promised bit for bit: a graph's replay does not depend on the path its nodes take. Grouped
nodes and nodes replayed one at a time (narrow levels) make the same call, an op's function on
float64 arrays (one-element arrays node by node). The correctly rounded ops (``+ - * /``, ``neg``,
``sqrt``, ``abs``, ``relu``, ``max``, ``min``, and the sweeps' unfused multiply-adds) give one answer
on every CPU numpy dispatches to, compiled or not. The others (``exp``, ``log``, ``pow``, ``sin``,
``cos``, ``tanh``, ``sigmoid``) call libm: where the C extension is built, the builtin ops run them
for float64 arrays through its elementwise loop, the code the compiled sweeps run, so every path
gives the same bits on one machine, and :class:`~graphsvc.value.Value` (libm through ``math``) gives
them too. What is not promised: those ops' last bits from one machine (libm) to another, or with the
extension off (``GRAPHSVC_NATIVE=0``: numpy's loops) against with it on; and nan's sign and payload.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Mapping
from itertools import compress, repeat
from numbers import Real
from typing import Any, NamedTuple, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from graphsvc.errors import MissingOpsError, OpError, ReplayError, UsageError
from graphsvc.graph import LEAF_TAGS, Graph
from graphsvc.native import Engine, engine_for
from graphsvc.ops import Op, OpRegistry, evaluate, evaluate_node, local_derivatives
from graphsvc.ops.opmath import PRIMITIVE_ATTRS, PRIMITIVES, compiled_primitives
from graphsvc.pluginhost import running_plugin_code
from graphsvc.replay.step import Step, SweptSteps
from graphsvc.text import ITEM_CHARS, counted, escape, listed, shorten
from graphsvc.topo import ancestors, levels

FloatArray = npt.NDArray[np.float64]
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _runs_plugin_code(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``function`` inside :func:`graphsvc.pluginhost.running_plugin_code`: once per replay, not
    per op call (an op's prints go to stderr; a KeyboardInterrupt it raises is its failure)."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with running_plugin_code():
            return function(*args, **kwargs)

    return wrapper


class _Group(NamedTuple):
    """Nodes sharing one op and one set of attributes."""

    op: Op
    attrs: Mapping[str, Any]
    nodes: npt.NDArray[np.int64]


def resolve_ops(graph: Graph, registry: OpRegistry, engine: Engine | None = None) -> list[Op | None]:
    """The op of each op code (``None`` for the leaf tags), checked before any work.

    Raises :class:`OpError` naming every op the registry lacks, with the plugin and version the
    file records for it, or the first node whose parent count does not match its op's arity
    (found by ``engine``, by default the one :func:`graphsvc.native.engine_for` picks).
    """
    missing = [tag for tag in graph.op_table if tag not in LEAF_TAGS and tag not in registry]
    if missing:
        raise _missing_ops(graph, registry, missing)
    ops: list[Op | None] = [None if tag in LEAF_TAGS else registry.get(tag) for tag in graph.op_table]
    # One pass over the nodes: each node's expected parent count by its op code (leaves: their
    # count, which Graph.check already holds at 0).
    arity_of_code = np.array([-1 if op is None or op.variadic else op.arity for op in ops], dtype=np.int64)
    compiled = (engine or engine_for(graph.num_nodes)).kernels
    if compiled is not None:
        node = int(compiled.first_arity_mismatch(graph.op_codes, graph.parent_offsets, arity_of_code))
    else:
        arity = arity_of_code[graph.op_codes]
        wrong = np.flatnonzero((arity >= 0) & (arity != graph.parent_counts()))
        node = int(wrong[0]) if len(wrong) else -1
    variadic = [op if op is not None and op.variadic else None for op in ops]
    if any(op is not None for op in variadic):  # at least `arity` inputs, at most `max_arity` if given
        unlimited = np.iinfo(np.int64).max
        least = np.array([0 if op is None else op.arity for op in variadic], dtype=np.int64)
        most = np.array(
            [unlimited if op is None or op.max_arity is None else op.max_arity for op in variadic], dtype=np.int64
        )
        counts, codes = graph.parent_counts(), graph.op_codes
        outside = np.flatnonzero((counts < least[codes]) | (counts > most[codes]))
        if len(outside) and (node < 0 or outside[0] < node):
            node = int(outside[0])
    if node >= 0:
        count = int(graph.parent_counts()[node])
        op = ops[int(graph.op_codes[node])]
        assert op is not None
        raise OpError(
            f"node {graph.label(node)}: op {op.name} {op.arity_problem(count)} but the node has "
            f"{counted(count, 'parent')}"
        )
    _check_attributes(graph, ops)
    return ops


def _missing_ops(graph: Graph, registry: OpRegistry, missing: list[str]) -> MissingOpsError:
    """The error naming the ops of ``graph`` that ``registry`` lacks, each with the plugin and
    version the file records for it. An op the file records no plugin for, whose name is close to a
    registered one, is most likely misspelt: it gets that name instead of the install hint, e.g.
    ``log_sofmax (plugin unknown; did you mean 'log_softmax'?)``. A tag an op family's plugin
    refused gets that plugin's reason; tags graphsvc knows the plugin of (``aten.``: PyTorch's
    operators, :data:`graphsvc.ops.KNOWN_FAMILIES`) that no family serves are said last, with what
    replaying them needs."""
    # listed() would cut "tag (from plugin version)" as one item: each part is cut on its own
    from graphsvc.ops import known_family

    needing: dict[str, list[str]] = {}  # what replaying them needs -> the tags (what they are: its first)
    others = []
    for tag in missing:
        said = known_family(tag) if registry.family_of(tag) is None else None
        if said is not None:
            needing.setdefault(said[1], [said[0]]).append(tag)
        else:
            others.append(tag)
    described = []
    explained = 0  # the tags given a likely spelling or a family's reason: no plugin to install for them
    misspelt = False
    for tag in others[:_LISTED]:
        source = graph.op_sources.get(tag)
        reason = registry.unknown_reason(tag)
        if reason is not None:  # an op family's plugin refused it
            explained += 1
            described.append(f"{_item(tag)} ({shorten(escape(reason), _REASON_CHARS)})")
            continue
        if source is not None and source.plugin:  # a plugin registered it when the file was saved
            version = f" {_item(source.version)}" if source.version else ""
            described.append(f"{_item(tag)} (from {_item(source.plugin)}{version})")
            continue
        close = registry.closest(tag)
        if close is None:
            described.append(f"{_item(tag)} (plugin unknown)")
        else:
            explained += 1
            misspelt = True
            described.append(f"{_item(tag)} (plugin unknown; did you mean {close!r}?)")
    parts = []
    hinted = False
    if others:
        several = len(others) > 1
        count, more = "", ""
        if len(others) > _LISTED:
            count, more = f"{len(others):,} ", f" and {len(others) - _LISTED:,} more"
        rest = len(others) - explained
        if not explained:
            hint = f"; install the plugin that provides {'them' if several else 'it'}"
        elif rest:
            hint = f"; install the plugin that provides {'the others' if rest > 1 else 'the other'}"
        else:
            hint = ""
        hinted = bool(rest)
        parts.append(
            f"the graph uses {count}{'ops' if several else 'an op'} not registered here: "
            f"{', '.join(described)}{more}{hint}"
        )
    for needs, (what, *tags) in needing.items():
        names = listed(tags, shown=_LISTED, quoted=True)
        if len(tags) == 1:
            parts.append(f"op {names} is {what}: replaying it needs {needs}")
        else:
            article = what.split(" ", 1)[1]
            parts.append(f"ops {names} are {article}s: replaying them needs {needs}")
    return MissingOpsError("; ".join(parts), install_hint=hinted, misspelt=misspelt)


def _check_attributes(graph: Graph, ops: list[Op | None]) -> None:
    """Raise :class:`OpError` for the first node whose attributes its op does not take, or that
    lacks one its op needs (:attr:`graphsvc.ops.Op.attributes`, read once per op). The nodes of one
    op are checked together, in C loops over their attribute dicts (the union of their names, how
    many give each name the op needs); only a graph found wrong is walked node by node, to name the
    first wrong node."""
    attributes = [None if op is None else op.attributes for op in ops]
    needing = [code for code, taken in enumerate(attributes) if taken is not None and taken.required]
    if not graph.attrs and not needing:
        return
    codes = graph.op_codes[np.fromiter(graph.attrs, dtype=np.int64, count=len(graph.attrs))]
    given = list(graph.attrs.values())
    if len(given) > 1 and codes.min() != codes.max():  # grouped by op code
        order = np.argsort(codes, kind="stable")
        given, codes = list(operator.itemgetter(*order.tolist())(given)), codes[order]
    with_attrs = np.bincount(codes, minlength=len(ops))
    ends = np.cumsum(with_attrs).tolist()
    nodes_of_code = np.bincount(graph.op_codes, minlength=len(ops)).tolist() if needing else []
    wrong: list[int] = []
    for code in sorted({*np.flatnonzero(with_attrs).tolist(), *needing}):
        taken = attributes[code]
        if taken is None:  # a leaf's: kept with the node, given to no function
            continue
        group = given[ends[code - 1] if code else 0 : ends[code]]
        names, required = taken
        if names is not None and not names.issuperset(frozenset().union(*group)):
            wrong.append(code)
        elif any(sum(map(operator.contains, group, repeat(name))) < nodes_of_code[code] for name in required):
            wrong.append(code)
    problems = {}  # the first wrong node of each op found wrong, and what is wrong with it
    for code in wrong:
        op = ops[code]
        assert op is not None
        for node in np.flatnonzero(graph.op_codes == code).tolist():
            problem = op.attributes.problem(op, graph.attrs.get(node, _NO_ATTRS))
            if problem is not None:
                problems[node] = problem
                break
    if problems:
        first = min(problems)
        raise OpError(f"node {graph.label(first)}: {problems[first]}")


#: How many names a message lists before it says "and N more".
_LISTED = 10
#: Longest reason an op family's plugin gives for a tag that a message quotes.
_REASON_CHARS = 300


def _item(text: str) -> str:
    """A name from the file as :func:`graphsvc.text.listed` shows one: escaped, cut."""
    return shorten(escape(text), ITEM_CHARS)


def _engine_and_ops(
    graph: Graph, registry: OpRegistry, engine: Engine | None, ops: list[Op | None] | None
) -> tuple[Engine, list[Op | None]]:
    """A pass's engine and ops: the caller's, or chosen for the graph's size and resolved here."""
    engine = engine or engine_for(graph.num_nodes)
    return engine, resolve_ops(graph, registry, engine) if ops is None else ops


def _primitive_table(ops: list[Op | None]) -> npt.NDArray[np.int8]:
    """Per op code, the code of its op's compiled primitive; 0 for the leaf tags and ops without a kernel."""
    return np.array(
        [0 if op is None or op.kernel is None else PRIMITIVES.index(op.kernel) + 1 for op in ops], dtype=np.int8
    )


class PrimitivePlan(NamedTuple):
    """What the compiled primitives need beyond the op codes: each node's parameter (``pow``'s
    ``exponent``; ``None`` when no node has one) and the computed nodes of primitive ops whose
    attributes are not their primitive's own (such a node goes through its op's functions)."""

    params: FloatArray | None
    excluded: npt.NDArray[np.int64]


def _primitive_kernels(engine: Engine) -> Any:
    """``engine``'s compiled kernels where they may run the primitives, else None: None for the
    references, and where the replay extension was built from another op table
    (:func:`graphsvc.ops.opmath.compiled_primitives`; then only the sweeps that know no op run compiled)."""
    return engine.kernels if engine.kernels is not None and compiled_primitives() else None


def _primitive_params(graph: Graph, table: npt.NDArray[np.int8]) -> PrimitivePlan:
    """The parameters of the nodes carrying attributes: a primitive takes its own attributes (at
    most one, a real number), nothing else. Read a primitive at a time, each step a C loop over
    its nodes' maps (a million ``pow`` nodes: ~0.2 s, half what a loop over the nodes took)."""
    attrs = graph.attrs
    if not attrs:
        return PrimitivePlan(None, np.zeros(0, dtype=np.int64))
    # which nodes with attributes are computed nodes of a primitive: one numpy pass, not one per node
    nodes = np.fromiter(attrs, dtype=np.int64, count=len(attrs))
    codes = table[graph.op_codes[nodes]]
    primitive = (codes != 0) & (graph.parent_counts()[nodes] > 0)
    maps = list(compress(attrs.values(), primitive.tolist()))
    nodes, codes = nodes[primitive], codes[primitive]
    taken = np.zeros(len(nodes), dtype=np.bool_)  # the nodes whose map is their primitive's one number
    given: list[npt.NDArray[np.int64]] = []
    numbers: list[Any] = []
    for code in np.flatnonzero(np.bincount(codes)).tolist() if len(codes) else ():
        names = PRIMITIVE_ATTRS[PRIMITIVES[code - 1]]
        if len(names) != 1:
            continue  # a primitive without a parameter: any attribute sends its node to the op's functions
        of_code = codes == code
        members = np.flatnonzero(of_code)
        group = maps if len(members) == len(maps) else list(compress(maps, of_code.tolist()))
        try:
            values = list(map(dict.get, group, repeat(names[0])))
        except TypeError:  # a map that is not a dict (a graph not checked yet)
            values = list(map(operator.methodcaller("get", names[0]), group))
        ok = np.ones(len(group), dtype=np.bool_)
        # numbers of plain types (so every map has the name) and as many names as maps: one name each
        if not set(map(type, values)) <= _PLAIN_NUMBERS or sum(map(len, group)) != len(group):
            ok = np.fromiter(map(len, group), dtype=np.int64, count=len(group)) == 1
            ok &= np.fromiter(map(_is_parameter, values), dtype=np.bool_, count=len(values))
        taken[members[ok]] = True
        given.append(nodes[members[ok]])
        numbers.extend(values if ok.all() else compress(values, ok.tolist()))
    params: FloatArray | None = None
    if numbers:
        params = np.zeros(graph.num_nodes, dtype=np.float64)
        params[np.concatenate(given)] = numbers
    return PrimitivePlan(params, nodes[~taken])


#: The types of a parameter read without an isinstance check (~1 us a node): a decoded file's numbers.
_PLAIN_NUMBERS = frozenset({float, int})


def _is_parameter(value: object) -> bool:
    """Is ``value`` a primitive's parameter: a real number, not a bool?"""
    return type(value) in _PLAIN_NUMBERS or (isinstance(value, Real) and not isinstance(value, bool))


def primitive_plan(graph: Graph, ops: list[Op | None]) -> PrimitivePlan:
    """What the compiled kernels need of ``graph`` beyond its op codes (each primitive node's
    parameter, the nodes that go through their op's functions): worked out once per replay by a
    caller that runs both passes, and handed to :func:`forward` and :func:`backward` as ``plan``
    (a few C loops over the nodes with attributes: ~0.2 s for a million ``pow`` nodes)."""
    return _primitive_params(graph, _primitive_table(ops))


def _all_primitives(
    graph: Graph, ops: list[Op | None], table: npt.NDArray[np.int8], params: PrimitivePlan | None = None
) -> bool:
    """True when every op of the graph is a compiled primitive and every computed node's attributes
    are its primitive's own (``params``, from :func:`_primitive_params`), so one compiled sweep over
    the op codes replays it."""
    if any(op is not None and code == 0 for op, code in zip(ops, table.tolist(), strict=True)):
        return False
    return not len((params or _primitive_params(graph, table)).excluded)


def _primitive_kinds(graph: Graph, ops: list[Op | None], params: PrimitivePlan | None = None) -> npt.NDArray[np.int8]:
    """Per node, the code of its op's compiled primitive; 0 for leaves, ops without a kernel, and
    nodes carrying attributes that are not their primitive's own."""
    table = _primitive_table(ops)
    kinds = table[graph.op_codes]
    kinds[(params or _primitive_params(graph, table)).excluded] = 0
    return kinds


def _attrs_key(attrs: Mapping[str, Any] | None) -> str:
    return "" if not attrs else repr(sorted(attrs.items()))


def _groups(graph: Graph, ops: list[Op | None], nodes: npt.NDArray[np.int64]) -> list[_Group]:
    """Split ``nodes`` (non-leaf ids, in the order given) into (op, attributes) groups."""
    codes = graph.op_codes[nodes]
    groups: list[_Group] = []
    for code in np.flatnonzero(np.bincount(codes)):  # the codes present, ascending (np.unique loads numpy.ma)
        op = ops[int(code)]
        if op is None:
            continue
        members = nodes[codes == code]
        if not graph.attrs:
            groups.append(_Group(op, {}, members))
            continue
        by_attrs: dict[str, list[int]] = {}
        attrs_of: dict[str, Mapping[str, Any]] = {}
        for node in members.tolist():
            attrs = graph.attrs.get(node, {})
            key = _attrs_key(attrs)
            by_attrs.setdefault(key, []).append(node)
            attrs_of[key] = attrs
        for key, ids in by_attrs.items():
            groups.append(_Group(op, attrs_of[key], np.array(ids, dtype=np.int64)))
    return groups


def _parent_columns(graph: Graph, nodes: npt.NDArray[np.int64], arity: int) -> list[npt.NDArray[np.int64]]:
    """For each input position k, the parent id in slot k of every node."""
    starts = graph.parent_offsets[nodes]
    return [graph.parent_indices[starts + k].astype(np.int64) for k in range(arity)]


def _gather(values: FloatArray, nodes: npt.NDArray[np.int64]) -> FloatArray:
    """``values[nodes]``, read-only: an op gets read-only inputs on every path (node by node they
    are views of the values being replayed), so one that writes into them fails the same way on each."""
    gathered = values[nodes]
    gathered.flags.writeable = False
    return gathered


def _locate_failure(graph: Graph, group: _Group, run: Any, error: Exception) -> ReplayError:
    """Find the first node of a failed group call and name it in the error.

    The error's cause is the op's own exception, so ``--debug`` shows the plugin's frame.
    """
    for node in group.nodes.tolist():
        try:
            run(np.array([node], dtype=np.int64))
        except Exception as exc:
            located = ReplayError(f"node {graph.label(node)}: {exc}")
            located.__cause__ = exc.__cause__
            return located
    failure = ReplayError(f"op {group.op.name}: {error}")
    failure.__cause__ = error.__cause__
    return failure


@_runs_plugin_code
def forward(
    graph: Graph,
    registry: OpRegistry,
    overrides: Mapping[int, float] | None = None,
    engine: Engine | None = None,
    *,
    ops: list[Op | None] | None = None,
    plan: PrimitivePlan | None = None,
) -> FloatArray:
    """Recompute every non-leaf value from the leaves; ``overrides`` replaces leaf values first.

    ``engine`` (as for :func:`backward`): the compiled kernels or the references, and where node by
    node gives way to numpy groups; by default :func:`graphsvc.native.engine_for` picks it from
    the graph's size. Every engine gives the same bits (the tests compare them with the reference).
    ``ops``: :func:`resolve_ops` of this graph and ``registry``, when the caller has it already (a
    forward pass that a backward pass follows resolves them once); by default they are resolved here.
    ``plan``: :func:`primitive_plan` of the same, likewise."""
    engine, ops = _engine_and_ops(graph, registry, engine, ops)
    values = np.array(graph.values, dtype=np.float64)
    for node, value in (overrides or {}).items():
        graph.check_settable(node)
        values[node] = value
    kernels = _primitive_kernels(engine)
    kinds, params = None, None
    if kernels is not None:
        table = _primitive_table(ops)
        plan = _primitive_params(graph, table) if plan is None else plan
        params = plan.params
        if _all_primitives(graph, ops, table, plan):
            # Every op is a compiled primitive: one sweep in id order (a topological order).
            offsets, parents = graph.parent_offsets, graph.parent_indices
            kernels.forward_all_primitives(graph.op_codes, table, offsets, parents, values, params)
            return values
        kinds = _primitive_kinds(graph, ops, plan)
    computed = np.flatnonzero(graph.parent_counts() > 0)
    if not len(computed):
        return values
    level = levels(graph, engine)[computed]
    order = np.argsort(level, kind="stable")  # by level, then by id
    nodes, level = computed[order], level[order]
    cuts = np.flatnonzero(np.diff(level)) + 1
    bounds = np.concatenate(([0], cuts, [len(nodes)])).tolist()
    narrow: _NarrowReplay | None = None
    start = 0  # first node of the pending stretch of narrow levels
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        if hi - lo < engine.narrow_level:
            continue
        if start < lo:
            narrow = narrow or _NarrowReplay(graph, ops, engine, kinds, params)
            narrow.run(nodes[start:lo], values)
        for group in _groups(graph, ops, nodes[lo:hi]):
            _forward_group(graph, group, values)
        start = hi
    if start < len(nodes):
        narrow = narrow or _NarrowReplay(graph, ops, engine, kinds, params)
        narrow.run(nodes[start:], values)
    return values


class _NarrowReplay:
    """Node-by-node forward replay, for stretches of levels too narrow for numpy to pay off.

    With ``kinds`` (the compiled engine, when its primitives are this op table's), runs of compiled
    primitives go through the compiled sweep (with ``params``, their parameters) and only the other
    nodes are Python calls.
    """

    def __init__(
        self,
        graph: Graph,
        ops: list[Op | None],
        engine: Engine,
        kinds: npt.NDArray[np.int8] | None = None,
        params: FloatArray | None = None,
    ) -> None:
        self.graph = graph
        self.ops = ops
        self.compiled = engine.kernels
        self.kinds = kinds
        self.params = params
        self.codes = graph.op_codes.tolist()
        self.offsets = graph.parent_offsets.tolist()
        self.parents = graph.parent_indices.tolist()
        self.readonly: FloatArray = np.empty(0)  # run() sets it: a read-only view of the values

    def run(self, nodes: npt.NDArray[np.int64], values: FloatArray) -> None:
        compiled = self.compiled
        self.readonly = values.view()
        self.readonly.flags.writeable = False
        with np.errstate(all="ignore"):
            if self.kinds is None or compiled is None:
                for node in nodes.tolist():
                    self._one(node, values)
                return
            graph, position, count = self.graph, 0, len(nodes)
            while position < count:
                position = compiled.forward_primitives(
                    nodes, self.kinds, graph.parent_offsets, graph.parent_indices, values, position, self.params
                )
                if position < count:
                    self._one(int(nodes[position]), values)
                    position += 1

    def _one(self, node: int, values: FloatArray) -> None:
        """Compute one node with its op's function (inside the caller's ``np.errstate``).

        The op gets one-element arrays, the call it gets for a group of nodes, so a node computed
        here has the bits it would have in a group (numpy scalars would take other code paths:
        ``x ** 3.0`` on a numpy scalar is libm's ``pow``, on an array numpy's own loop). The
        arrays are read-only views of ``values``: an op cannot change its parents' values.
        """
        op = self.ops[self.codes[node]]
        assert op is not None
        offsets, readonly = self.offsets, self.readonly
        inputs = [readonly[p : p + 1] for p in self.parents[offsets[node] : offsets[node + 1]]]
        try:
            values[node] = evaluate_node(op, inputs, self.graph.attrs.get(node, _NO_ATTRS))
        except ReplayError as exc:
            raise ReplayError(f"node {self.graph.label(node)}: {exc}") from exc.__cause__


_NO_ATTRS: Mapping[str, Any] = {}


def _forward_group(graph: Graph, group: _Group, values: FloatArray) -> None:
    def run(nodes: npt.NDArray[np.int64]) -> FloatArray:
        inputs = [_gather(values, col) for col in _parent_columns(graph, nodes, group.op.arity)]
        return evaluate(group.op, inputs, group.attrs)

    try:
        values[group.nodes] = run(group.nodes)
    except Exception as exc:
        failure = _locate_failure(graph, group, run, exc)
        raise failure from failure.__cause__


@_runs_plugin_code
def edge_derivatives(
    graph: Graph,
    registry: OpRegistry,
    values: FloatArray,
    nodes: npt.NDArray[np.int64] | None = None,
    engine: Engine | None = None,
    *,
    ops: list[Op | None] | None = None,
) -> FloatArray:
    """The local derivative d(child)/d(parent) of every parent slot of ``nodes`` (default: all).

    Slots of other nodes are left at 0. ``engine`` and ``ops`` are as for :func:`forward`.
    """
    engine, ops = _engine_and_ops(graph, registry, engine, ops)
    return _edge_derivatives(graph, ops, values, nodes, engine)


def _edge_derivatives(
    graph: Graph,
    ops: list[Op | None],
    values: FloatArray,
    nodes: npt.NDArray[np.int64] | None,
    engine: Engine,
    plan: PrimitivePlan | None = None,
) -> FloatArray:
    """As :func:`edge_derivatives`; ``plan`` is the caller's :func:`_primitive_params`, if it has them."""
    local = np.zeros(graph.num_edges, dtype=np.float64)
    if nodes is None:
        nodes = np.arange(graph.num_nodes, dtype=np.int64)
    nodes = nodes[graph.parent_counts()[nodes] > 0]
    kernels = _primitive_kernels(engine)
    if kernels is not None:
        plan = plan or _primitive_params(graph, _primitive_table(ops))
        kinds = _primitive_kinds(graph, ops, plan)
        offsets, parents = graph.parent_offsets, graph.parent_indices
        kernels.primitive_derivatives(nodes, kinds, offsets, parents, values, local, plan.params)
        nodes = nodes[kinds[nodes] == 0]
    for group in _groups(graph, ops, nodes):
        starts = graph.parent_offsets[group.nodes]

        def run(ids: npt.NDArray[np.int64], group: _Group = group) -> list[FloatArray]:
            inputs = [_gather(values, col) for col in _parent_columns(graph, ids, group.op.arity)]
            return local_derivatives(group.op, inputs, _gather(values, ids), group.attrs)

        try:
            partials = run(group.nodes)
        except Exception as exc:
            failure = _locate_failure(graph, group, run, exc)
            raise failure from failure.__cause__
        for k, partial in enumerate(partials):
            local[starts + k] = partial
    return local


@_runs_plugin_code
def backward(
    graph: Graph,
    registry: OpRegistry,
    output: int,
    values: FloatArray | None = None,
    engine: Engine | None = None,
    *,
    ops: list[Op | None] | None = None,
    plan: PrimitivePlan | None = None,
) -> FloatArray:
    """The gradient of ``output`` with respect to every node (0 for nodes it does not depend on).

    ``engine``, ``ops`` and ``plan`` are as for :func:`forward`; the compiled engine gives the
    reference's bits."""
    values = graph.values if values is None else values
    engine, ops = _engine_and_ops(graph, registry, engine, ops)
    kernels = _primitive_kernels(engine)
    if kernels is not None:
        table = _primitive_table(ops)
        plan = _primitive_params(graph, table) if plan is None else plan
        if _all_primitives(graph, ops, table, plan):  # every op compiled: one fused pass
            grads = np.empty(graph.num_nodes, dtype=np.float64)
            both, reached = _backward_scratch(output)
            codes, offsets, parents = graph.op_codes, graph.parent_offsets, graph.parent_indices
            kernels.backward_primitives(
                offsets, parents, codes, table, values, output, both, reached, grads, plan.params
            )
            return grads
    nodes = np.flatnonzero(ancestors(graph, output, engine))
    local = _edge_derivatives(graph, ops, values, nodes, engine, plan)
    if engine.kernels is not None:  # knows no op: runs whatever table the extension was built from
        return engine.kernels.backward_sweep(
            graph.parent_offsets, graph.parent_indices, local, nodes, output, graph.num_nodes
        )
    return reference_sweep(graph, output, local, nodes)


#: Per thread, the fused backward's scratch, reused by the next backward of a graph no larger.
_scratch = threading.local()


def _backward_scratch(output: int) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """``both`` (``2 * (output + 1)`` floats) and ``reached`` (``output + 1`` booleans) for
    ``backward_primitives``. Kept per thread (17 bytes per node of the largest graph it replayed)
    and reused: fresh pages of tens of megabytes cost more than the sweep itself, above all right
    after other work has freed memory (the kernel then compacts memory to find huge pages)."""
    both, reached = getattr(_scratch, "both", None), getattr(_scratch, "reached", None)
    if both is None or reached is None or len(reached) < output + 1:
        both, reached = np.empty(2 * (output + 1), dtype=np.float64), np.empty(output + 1, dtype=np.bool_)
        _scratch.both, _scratch.reached = both, reached
    return both[: 2 * (output + 1)], reached[: output + 1]


def reference_sweep(
    graph: Graph,
    output: int,
    local: FloatArray,
    nodes: npt.NDArray[np.int64],
    steps: list[Step] | None = None,
) -> FloatArray:
    """The straightforward backward sweep: ``nodes`` (the output's ancestors) in decreasing id
    order, each adding ``grad * local`` to its parents, one slot at a time. When ``steps`` is a
    list, each node's step is appended to it."""
    grads = [0.0] * graph.num_nodes
    grads[output] = 1.0
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    local_list = local.tolist()
    for node in reversed(nodes.tolist()):
        grad = grads[node]
        for slot in range(offsets[node], offsets[node + 1]):
            grads[parents[slot]] += grad * local_list[slot]
        if steps is not None:
            span = range(offsets[node], offsets[node + 1])
            steps.append(Step(node, grad, [(parents[s], local_list[s], grad * local_list[s]) for s in span]))
    return np.array(grads, dtype=np.float64)


@_runs_plugin_code
def backward_steps(
    graph: Graph,
    registry: OpRegistry,
    output: int,
    values: FloatArray | None = None,
    engine: Engine | None = None,
    *,
    ops: list[Op | None] | None = None,
    plan: PrimitivePlan | None = None,
) -> tuple[FloatArray, SweptSteps]:
    """Like :func:`backward`, and also the steps, in the order the sweep takes them (the reference
    sweep, whatever ``engine`` computes the local derivatives), each made when read
    (:class:`~graphsvc.replay.step.SweptSteps`)."""
    values = graph.values if values is None else values
    engine, ops = _engine_and_ops(graph, registry, engine, ops)
    nodes = np.flatnonzero(ancestors(graph, output, engine))
    local = _edge_derivatives(graph, ops, values, nodes, engine, plan)
    grads = reference_sweep(graph, output, local, nodes)
    return grads, SweptSteps(nodes[::-1], grads, local, graph.parent_offsets, graph.parent_indices)


def default_output(graph: Graph, choose: str = "output=") -> int:
    """The graph's single output (listed once or more); with several (or none), the caller must
    choose, and the error says how (``choose``: the Python API's ``output=``; the CLI passes its
    ``--output``)."""
    outputs = list(dict.fromkeys(graph.outputs))
    if len(outputs) == 1:
        return outputs[0]
    if not outputs:
        raise UsageError(f"the graph lists no outputs: choose one with {choose}")
    shown = listed((graph.label(o) for o in outputs[:_LISTED]), total=len(outputs), shown=_LISTED)
    many = counted(len(outputs), "output", thousands=True)
    raise UsageError(f"the graph has {many} ({shown}): choose one with {choose}")
