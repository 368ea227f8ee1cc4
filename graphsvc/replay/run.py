"""Replay from Python in one call, without handling a registry: :func:`forward` and :func:`backward`.

>>> import graphsvc
>>> graph = graphsvc.backward(graphsvc.load("examples/seed004.msgpack"))  # doctest: +SKIP
>>> graph.grad("a"), graph.grad("b"), graph.grad("c")  # doctest: +SKIP
(22.0, 17.0, 5.0)

Both return a new :class:`~graphsvc.graph.Graph` holding the replayed numbers and leave the one
given untouched. The ops come from the registry :class:`~graphsvc.value.Value` uses (builtins and
installed plugins, loaded once; a plugin that fails to load is a one-line ``RuntimeWarning``;
:func:`graphsvc.use_registry` replaces it), or from ``registry=``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Real
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from graphsvc.errors import UsageError
from graphsvc.graph import Graph, NodeRef, expect_graph
from graphsvc.native import Engine, engine_for
from graphsvc.ops import OpRegistry, expect_registry
from graphsvc.text import counted, shown_number

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt

    from graphsvc.replay.arrays import TensorComparison, TensorNonFinite
    from graphsvc.replay.compare import Comparison, NonFinite

__all__ = [
    "ReplayRun",
    "backward",
    "forward",
    "replay_values",
    "replayed_graph",
    "replayed_tensor_graph",
    "resolve_set",
]


def forward(
    graph: Graph,
    set: Mapping[NodeRef, float | np.ndarray] | None = None,
    *,
    registry: OpRegistry | None = None,
    engine: Engine | None = None,
) -> Graph:
    """``graph`` with every value recomputed from its leaves; ``graph`` itself is not changed.

    ``set`` gives leaves new values first, ``{"a": 3.0}`` or ``{0: 3.0}`` (a node id or a name,
    as ``graphsvc forward --set``); setting a node that is not a leaf, or an unknown one, raises
    :class:`~graphsvc.errors.UsageError`. The result holds no gradients (stored ones would belong
    to the old values); its op table records the plugin of each op the replay used.

    ``engine`` (:class:`graphsvc.native.Engine`) runs the sweeps: by default the compiled kernels
    for graphs of 1,000 nodes or more, the pure-Python references below (``kernels.REFERENCE``
    forces them); the numbers are the same either way. Tensor graphs replay one op call per node.
    """
    expect_graph("forward", graph)
    assignments = _assignments(set)
    registry = _registry(registry)
    run = replay_values(graph, registry, resolve_set(graph, assignments), engine=engine)
    return run.replayed(graph, registry)


def backward(
    graph: Graph,
    output: NodeRef | None = None,
    set: Mapping[NodeRef, float | np.ndarray] | None = None,
    *,
    registry: OpRegistry | None = None,
    engine: Engine | None = None,
) -> Graph:
    """``graph`` replayed forward, then backward from ``output`` seeded with 1, from zero gradients.

    ``output`` is a node id or name; by default the graph's single output. ``set`` is as for
    :func:`forward`. Returns a new graph whose ``grads`` hold d(output)/d(node) for every node (0
    for nodes the output does not depend on): ``graphsvc.backward(graph).grad("a")``. In a tensor
    graph, gradients go where PyTorch's ``requires_grad`` sends them
    (:func:`graphsvc.replay.arrays.requires_grad`): a ``const`` array, what is computed from consts
    alone and int64 nodes get none (``grad()`` is nan). ``engine`` is as for :func:`forward`.
    """
    from graphsvc.replay.columns import default_output

    expect_graph("backward", graph)
    assignments = _assignments(set)
    registry = _registry(registry)
    start = default_output(graph, "output=") if output is None else graph.node_id(output)
    run = replay_values(graph, registry, resolve_set(graph, assignments), start, engine=engine)
    return run.replayed(graph, registry)


class ReplayRun(NamedTuple):
    """What :func:`replay_values` computed, in the form of the engine that ran.

    Its methods are what a caller does with the numbers, each on the right engine's helpers:
    :meth:`replayed` (a graph holding them), :meth:`nonfinite` (where nan or inf first appears)
    and :meth:`compare` (against the numbers a file stores). A graph of scalars never imports the
    tensor engine through them. (A NamedTuple, not a dataclass: cheap for the CLI to build.)
    """

    #: True: graphsvc.replay.arrays ran (one array per node, ``None`` where a node has none); False:
    #: the column engine (float64 columns).
    tensor: bool
    values: Any
    #: ``None`` without a backward pass.
    grads: Any
    #: The backward pass step by step (``replay.Step`` or ``tensors.Step``), when asked for.
    steps: list[Any] | None

    def replayed(self, graph: Graph, registry: OpRegistry) -> Graph:
        """A copy of ``graph`` (the graph that was replayed) holding these numbers, each op attributed
        to the plugin that replayed it: :func:`replayed_graph` or :func:`replayed_tensor_graph`,
        whichever fits the engine that ran."""
        if self.tensor:
            return replayed_tensor_graph(graph, registry, self.values, self.grads)
        return replayed_graph(graph, registry, self.values, self.grads)

    def nonfinite(self) -> dict[str, NonFinite | TensorNonFinite | None]:
        """Where nan or inf first appears: ``{"values": finding or None}``, with ``"grads"`` too
        when there are gradients (:func:`graphsvc.replay.compare.first_nonfinite`, or
        :func:`graphsvc.replay.arrays.first_nonfinite`, which also says where in the array)."""
        first: Callable[..., NonFinite | TensorNonFinite | None]
        if self.tensor:  # imported only for arrays: a graph of scalars never loads the tensor engine
            from graphsvc.replay.arrays import first_nonfinite as first
        else:
            from graphsvc.replay.compare import first_nonfinite as first
        found = {"values": first("values", self.values)}
        if self.grads is not None:
            found["grads"] = first("grads", self.grads, backward=True)
        return found

    def compare(self, graph: Graph, rtol: float, atol: float) -> list[Comparison | TensorComparison]:
        """How far these numbers are from those ``graph`` stores (``--check``): the values, then the
        gradients when there are some on both sides (:func:`graphsvc.replay.compare.compare`, or
        :func:`graphsvc.replay.arrays.compare` for arrays)."""
        results: list[Comparison | TensorComparison]
        if self.tensor:
            from graphsvc.replay import arrays as tensors

            results = [tensors.compare("values", graph, self.values, rtol, atol)]
            if self.grads is not None:
                results.append(tensors.compare("grads", graph, self.grads, rtol, atol))
            return results
        from graphsvc.replay import compare as checks

        results = [checks.compare("values", self.values, graph.values, rtol, atol)]
        if self.grads is not None and graph.grads is not None:  # a file without gradients has none to compare
            results.append(checks.compare("grads", self.grads, graph.grads, rtol, atol))
        return results


def tensor_replay_needed(graph: Graph, registry: OpRegistry, overrides: Mapping[int, Any] | None = None) -> bool:
    """Whether ``graph`` must be replayed by :mod:`graphsvc.replay.arrays`: it holds a tensor node,
    ``overrides`` set a leaf to an array, or one of its ops is given only by a VJP (or takes any
    number of inputs), which the scalar column engine cannot run. Decided on the op table, with no
    pass over the nodes, and without importing the tensor engine (a graph of scalars never does)."""
    if graph.is_tensor_graph or any(isinstance(v, np.ndarray) for v in (overrides or {}).values()):
        return True
    ops = (registry.get(tag) for tag in graph.op_table if tag in registry)
    return any(op.arity > 0 and (op.derivatives is None or op.variadic) for op in ops)


def replay_values(
    graph: Graph,
    registry: OpRegistry,
    overrides: Mapping[int, Any],
    output: int | None = None,
    *,
    steps: bool = False,
    engine: Engine | None = None,
) -> ReplayRun:
    """Replay forward, then (``output`` given) backward from ``output``, on the engine the graph
    needs (:func:`tensor_replay_needed`): the one place that chooses, for :func:`forward`,
    :func:`backward` and the CLI, which also wants the raw numbers and the steps; the
    :class:`ReplayRun` returned carries the choice to what is done with them next. ``overrides``
    are node ids (:func:`resolve_set`); ``steps`` records the backward pass."""
    from graphsvc.replay import columns as replay

    engine = engine or engine_for(graph.num_nodes)  # one engine for every sweep of this replay
    step_list: list[Any] | None = [] if steps else None
    tensor = tensor_replay_needed(graph, registry, overrides)
    ops = replay.resolve_ops(graph, registry, engine)  # once, for the forward and the backward pass
    if tensor:
        from graphsvc.replay import arrays as tensors

        arrays, gradients = tensors.replay(graph, ops, output, overrides, step_list, engine)
        return ReplayRun(True, arrays, gradients, step_list)
    plan = None if engine.kernels is None else replay.primitive_plan(graph, ops)  # once, likewise
    values = replay.forward(graph, registry, overrides, engine, ops=ops, plan=plan)
    grads = None
    if output is not None and steps:
        grads, step_list = replay.backward_steps(graph, registry, output, values, engine, ops=ops, plan=plan)
    elif output is not None:
        grads = replay.backward(graph, registry, output, values, engine, ops=ops, plan=plan)
    return ReplayRun(False, values, grads, step_list)


def replayed_graph(
    graph: Graph,
    registry: OpRegistry,
    values: npt.NDArray[np.float64],
    grads: npt.NDArray[np.float64] | None = None,
) -> Graph:
    """A copy of ``graph`` holding replayed ``values`` and ``grads`` (``None``: no gradients).

    Each op tag the file does not attribute to a plugin gets the plugin and version of the op
    ``registry`` replayed it with, so a saved result says where its ops came from; sources the file
    records are kept.
    """
    result = graph.copy()
    result.values = values
    result.grads = grads
    registry.record_sources(result)
    return result


def replayed_tensor_graph(
    graph: Graph,
    registry: OpRegistry,
    values: list[np.ndarray | None],
    grads: list[np.ndarray | None] | None = None,
) -> Graph:
    """:func:`replayed_graph` for a tensor replay (:func:`graphsvc.replay.arrays.forward` and
    :func:`~graphsvc.replay.arrays.backward`: one array per node, ``None`` where a node has none).

    A copy of ``graph`` holding them as :func:`graphsvc.replay.arrays.store` lays them out; each op tag
    the file does not attribute to a plugin gets the plugin and version of the op ``registry``
    replayed it with, sources the file records are kept.
    """
    from graphsvc.replay import arrays as tensors

    result = tensors.store(graph, values, grads)
    registry.record_sources(result)
    return result


def _assignments(set: Mapping[NodeRef, float | np.ndarray] | None) -> Iterable[tuple[NodeRef, Any]]:
    """``set`` of :func:`forward` and :func:`backward` as (node, value) pairs; anything but a
    mapping (or None) is a TypeError."""
    if set is None:
        return ()
    if not isinstance(set, Mapping):
        raise TypeError(
            f"set must be a mapping of node (id or name) to a number or an array, such as {{'a': 3.0}}, "
            f"not {type(set).__name__}"
        )
    return set.items()


def _registry(registry: OpRegistry | None) -> OpRegistry:
    expect_registry(registry)
    if registry is not None:  # not `registry or ...`: an empty registry is falsy
        return registry
    from graphsvc.pluginhost import default_registry

    return default_registry()


def resolve_set(
    graph: Graph, assignments: Iterable[tuple[NodeRef, float | np.ndarray]], option: str = "set"
) -> dict[int, Any]:
    """``set`` (of :func:`forward` and :func:`backward`) as node ids: floats, or arrays for tensor
    leaves; anything else is a TypeError, an unknown node or a node given twice (by one reference
    twice, or by its id and its name) a :class:`~graphsvc.errors.UsageError` whose words name
    ``option`` (the CLI passes ``--set``, whose NAME=VALUE pairs may repeat a node). Whether each
    node is a leaf is checked by the replay.

    A number becomes a float, except for a leaf the file holds as an int64 array (indices, class
    labels): there it stays an integer, a 0-d int64 array, and one that is not a whole number in
    int64's range is a :class:`~graphsvc.errors.UsageError`."""
    from graphsvc.graph import MAX_DIMENSIONS, TENSOR_DTYPES, native_copy
    from graphsvc.text import escape

    result: dict[int, Any] = {}
    for ref, number in assignments:
        if isinstance(number, np.ndarray):
            value: Any = native_copy(number)  # as a graph keeps an array: big-endian data is fine
            if value.dtype not in TENSOR_DTYPES:
                raise TypeError(f"set[{ref!r}] must be an array of float64, float32 or int64, not {number.dtype}")
        elif isinstance(number, bool) or not isinstance(number, Real):
            raise TypeError(f"set[{ref!r}] must be a number or an array, not {type(number).__name__}")
        node = graph.node_id(ref)
        if isinstance(number, np.ndarray) and number.ndim > MAX_DIMENSIONS:  # as a graph holds an array
            raise UsageError(
                f"{option} {escape(graph.label(node))}: an array of {counted(number.ndim, 'dimension')}, "
                f"more than {MAX_DIMENSIONS}"
            )
        if not isinstance(number, np.ndarray):
            held = graph.arrays.get(node)
            where = f"{option} {escape(graph.label(node))}"
            if held is not None and held.dtype == np.int64:
                value = _integer(number, where)
            else:
                value = _float(number, where)
        if node in result:
            raise UsageError(f"{option} gives node {escape(graph.label(node))} two values")
        result[node] = value
    return result


def _float(number: Real, where: str) -> float:
    """``number`` as a float; :class:`UsageError` (its words begin with ``where``) when it is past
    float64's range (an integer of hundreds of digits, a Fraction), which Python refuses to round to inf."""
    try:
        return float(number)
    except OverflowError:
        raise UsageError(f"{where}: {shown_number(number)} is out of float64's range") from None


def _integer(number: Real, where: str) -> np.ndarray:
    """``number`` as a 0-d int64 array, for a leaf that holds int64; :class:`UsageError` (its
    words begin with ``where``) when it is not a whole number that int64 holds."""

    def beyond() -> UsageError:
        return UsageError(f"{where}: {shown_number(number)} is out of int64's range, and the leaf holds int64")

    if isinstance(number, (int, np.integer)):
        integer = int(number)
    else:
        try:
            value = float(number)
        except OverflowError:  # a Fraction past float's range
            raise beyond() from None
        if math.isinf(value):  # past float's range too (the CLI's integer literal beyond it)
            raise beyond()
        if not value.is_integer():
            raise UsageError(f"{where}: {value!r} is not a whole number, and the leaf holds int64")
        integer = int(value)
    if not -(2**63) <= integer < 2**63:
        raise beyond()
    return np.asarray(integer, dtype=np.int64)
