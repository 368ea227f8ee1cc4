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
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from graphsvc.errors import UsageError
from graphsvc.graph import Graph, NodeRef, expect_graph
from graphsvc.native import Engine, engine_for
from graphsvc.ops import OpRegistry, expect_registry
from graphsvc.text import counted, escape, shorten, shown_number

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt

    from graphsvc.replay.compare import Comparison, NonFinite
    from graphsvc.replay.step import Step

__all__ = [
    "ReplayRun",
    "backward",
    "check_replayable",
    "comparisons",
    "forward",
    "nonfinite_findings",
    "output_node",
    "replay_values",
    "replayed_graph",
    "replayed_tensor_graph",
    "resolve_set",
    "set_from_text",
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
    return replay_values(graph, registry, resolve_set(graph, assignments), engine=engine).replayed()


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
    expect_graph("backward", graph)
    assignments = _assignments(set)
    registry = _registry(registry)
    start = output_node(graph, output)
    return replay_values(graph, registry, resolve_set(graph, assignments), start, engine=engine).replayed()


def output_node(graph: Graph, output: NodeRef | None, choose: str = "output=") -> int:
    """The id of ``output`` (a node id or name), or by default the graph's single output; with
    several outputs or none, a :class:`~graphsvc.errors.UsageError` that says how to choose one
    (``choose``: the Python API's ``output=``; the CLI passes its ``--output``)."""
    from graphsvc.replay.columns import default_output

    return default_output(graph, choose) if output is None else graph.node_id(output, "outputs")


class ReplayRun(NamedTuple):
    """What one replay found (:func:`replay_values`), whichever engine ran it: the numbers, the
    backward pass step by step, where nan or inf first appeared and how far the numbers are from
    those the file stores. The CLI's ``forward`` and ``backward`` print it (the console room's
    report); :meth:`replayed` is the graph holding it. (A NamedTuple, not
    a dataclass: cheap for the CLI to build.)

    The engine is a strategy (:func:`tensor_replay_needed`): a graph of scalars is replayed a float64
    column at a time (:mod:`graphsvc.replay.columns`), a graph that holds arrays, or uses an op given
    only by a VJP, one array per node (:mod:`graphsvc.replay.arrays`). Either way the steps are
    :class:`~graphsvc.replay.step.Step`, the findings :class:`~graphsvc.replay.compare.NonFinite` and
    the checks :class:`~graphsvc.replay.compare.Comparison`; only the container of the numbers
    differs, which :attr:`arrays` says, for what lists or saves them.
    """

    #: The graph replayed, as given: the checks compare with the numbers it stores.
    graph: Graph
    #: The ops it was replayed with: :meth:`replayed` records the plugin of each.
    registry: OpRegistry
    #: The node the backward pass started from; None without one.
    output: int | None
    #: The values: a float64 column (one number a node), or one array a node (:attr:`arrays`).
    values: Any
    #: The gradients, as the values; ``None`` without a backward pass.
    grads: Any
    #: The backward pass step by step, in the sweep's order, when asked for; else None.
    steps: Sequence[Step] | None
    #: Where nan or inf first appears: ``{"values": finding or None}``, with ``"grads"`` too when
    #: there are gradients; empty unless asked for (``find_nonfinite``).
    nonfinite: Mapping[str, NonFinite | None]
    #: How far the numbers are from those ``graph`` stores, values then gradients (when both sides
    #: have some), when asked for (``check``); else empty.
    comparisons: tuple[Comparison, ...]
    #: True: the numbers are one array per node (``None`` where a node has none); False: float64 columns.
    arrays: bool

    @property
    def ok(self) -> bool:
        """Every check within tolerance (True when there was none)."""
        return all(c.ok for c in self.comparisons)

    def replayed(self) -> Graph:
        """A copy of :attr:`graph` holding these numbers, each op attributed to the plugin that
        replayed it: :func:`replayed_graph`, or :func:`replayed_tensor_graph` for arrays."""
        if self.arrays:
            return replayed_tensor_graph(self.graph, self.registry, self.values, self.grads)
        return replayed_graph(self.graph, self.registry, self.values, self.grads)


def nonfinite_findings(arrays: bool, values: Any, grads: Any) -> dict[str, NonFinite | None]:
    """Where nan or inf first appears in ``values`` (and ``grads``; ``arrays``: one array per node,
    else float64 columns), as :attr:`ReplayRun.nonfinite` holds it: the column search
    (:func:`graphsvc.replay.compare.first_nonfinite`) or the array one
    (:func:`graphsvc.replay.arrays.first_nonfinite`, which also says where in the array)."""
    first: Callable[..., NonFinite | None]
    if arrays:  # imported only for arrays: a graph of scalars never loads the tensor engine
        from graphsvc.replay.arrays import first_nonfinite as first
    else:
        from graphsvc.replay.compare import first_nonfinite as first
    found = {"values": first("values", values)}
    if grads is not None:
        found["grads"] = first("grads", grads, backward=True)
    return found


def comparisons(
    arrays: bool, graph: Graph, values: Any, grads: Any, rtol: float | None = None, atol: float | None = None
) -> tuple[Comparison, ...]:
    """How far ``values`` (and ``grads``; ``arrays`` as for :func:`nonfinite_findings`) are from those
    ``graph`` stores, as :attr:`ReplayRun.comparisons` holds it: the values, then the
    gradients when there are some on both sides (:func:`graphsvc.replay.compare.compare`, or
    :func:`graphsvc.replay.arrays.compare` for arrays, element by element). ``rtol``, ``atol``:
    ``None`` for the default of each dtype compared (:data:`graphsvc.replay.compare.DEFAULT_TOLERANCES`)."""
    if arrays:
        from graphsvc.replay import arrays as tensors

        if grads is None:
            return (tensors.compare("values", graph, values, rtol, atol),)
        return tensors.compare("values", graph, values, rtol, atol), tensors.compare("grads", graph, grads, rtol, atol)
    from graphsvc.replay import compare as checks

    found = checks.compare("values", values, graph.values, rtol, atol)
    if grads is None or graph.grads is None:  # a file without gradients has none to compare
        return (found,)
    return found, checks.compare("grads", grads, graph.grads, rtol, atol)


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
    find_nonfinite: bool = False,
    check: tuple[float | None, float | None] | None = None,
    engine: Engine | None = None,
) -> ReplayRun:
    """Replay forward, then (``output`` given) backward from ``output``: the one replay, for
    :func:`forward`, :func:`backward` and the CLI. ``overrides`` are node ids (:func:`resolve_set`);
    ``steps`` records the backward pass; ``find_nonfinite`` looks for the first nan or inf;
    ``check``, ``(rtol, atol)``, compares the numbers with those ``graph`` stores (``None`` for
    either: the default of each dtype compared, :data:`graphsvc.replay.compare.DEFAULT_TOLERANCES`;
    each :class:`~graphsvc.replay.compare.Comparison` says which it used).

    The engine is the one the graph needs (:func:`tensor_replay_needed`); the :class:`ReplayRun`
    returned is the same type either way. A graph whose mapped file (``load(mmap=True)``) was
    truncated is refused first (:func:`graphsvc.format.check_mapped`)."""
    from graphsvc.format import check_mapped
    from graphsvc.replay import columns as replay

    check_mapped(graph)

    engine = engine or engine_for(graph.num_nodes)  # one engine for every sweep of this replay
    step_list: Any = [] if steps else None  # a list, or SweptSteps from the column sweep
    tensor = tensor_replay_needed(graph, registry, overrides)
    ops = replay.resolve_ops(graph, registry, engine)  # once, for the forward and the backward pass
    values: Any
    grads: Any
    if tensor:
        from graphsvc.replay import arrays as tensors

        values, grads = tensors.replay(graph, ops, output, overrides, step_list, engine)
    else:
        plan = None if engine.kernels is None else replay.primitive_plan(graph, ops)  # once, likewise
        values = replay.forward(graph, registry, overrides, engine, ops=ops, plan=plan)
        grads = None
        if output is not None and steps:
            grads, step_list = replay.backward_steps(graph, registry, output, values, engine, ops=ops, plan=plan)
        elif output is not None:
            grads = replay.backward(graph, registry, output, values, engine, ops=ops, plan=plan)
    return ReplayRun(
        graph=graph,
        registry=registry,
        output=output,
        values=values,
        grads=grads,
        steps=step_list,
        nonfinite=nonfinite_findings(tensor, values, grads) if find_nonfinite else {},
        comparisons=() if check is None else comparisons(tensor, graph, values, grads, *check),
        arrays=tensor,
    )


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


def check_replayable(graph: Graph, registry: OpRegistry | None = None, label: str | None = None) -> None:
    """Check what a replay checks before it runs (:func:`graphsvc.replay.columns.resolve_ops`): every
    op the graph uses is registered (a misspelt one is given the registered name it is most like),
    each node has a number of parents its op takes, and the attributes its op takes and needs.
    Raises the replay's :class:`~graphsvc.errors.OpError` (exit 4), its message after ``"LABEL: a
    valid graph file, but it cannot be replayed here: "`` (``label``: the file's name; without it,
    ``"a valid graph, but ..."``). ``registry``: by default the one :func:`forward` uses."""
    from graphsvc.errors import MissingOpsError, OpError
    from graphsvc.replay import columns as replay

    expect_graph("check_replayable", graph)
    try:
        replay.resolve_ops(graph, _registry(registry))
    except OpError as exc:
        what = "a valid graph" if label is None else f"{label}: a valid graph file"
        message = f"{what}, but it cannot be replayed here: {exc}"
        if isinstance(exc, MissingOpsError):
            raise MissingOpsError(message, install_hint=exc.install_hint, misspelt=exc.misspelt) from None
        raise type(exc)(message) from None


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
    from graphsvc.graph import MAX_DIMENSIONS, TENSOR_DTYPES, native_copy, sealed

    result: dict[int, Any] = {}
    for ref, number in assignments:
        if isinstance(number, np.ndarray):
            # as a graph keeps an array (big-endian data is fine), sealed: the replay's result shares it
            value: Any = sealed(native_copy(number))
            if value.dtype not in TENSOR_DTYPES:
                raise TypeError(f"set[{ref!r}] must be an array of float64, float32 or int64, not {number.dtype}")
        elif isinstance(number, bool) or not isinstance(number, Real):
            raise TypeError(f"set[{ref!r}] must be a number or an array, not {type(number).__name__}")
        node = graph.node_id(ref, "leaves")
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


def set_from_text(assignments: Iterable[str], option: str = "--set") -> list[tuple[str, float | int | np.ndarray]]:
    """``NAME=VALUE`` texts (the CLI's ``--set``, named ``option`` in errors) as the (node, value)
    pairs :func:`resolve_set` takes: a number, or an array read from a ``.npy`` file. A whole number
    is kept an int (exact, for an int64 leaf; resolve_set makes it a float elsewhere), except 0 (-0
    keeps its sign) and one past int64's range (a float). ``inf``, ``-inf`` and ``nan`` are those
    floats; a number written otherwise that is past float64's range (``1e400``, an integer of 400
    digits) is refused, as :class:`~graphsvc.graph.GraphBuilder` and the JSON form refuse it, not
    made inf. Anything else is a :class:`~graphsvc.errors.UsageError`."""
    pairs: list[tuple[str, float | int | np.ndarray]] = []
    for text in assignments:
        ref, sep, number = text.partition("=")
        if not sep or not ref:
            raise UsageError(f"{option} expects NAME=VALUE, not {text!r}")
        if number.endswith(".npy"):
            pairs.append((ref, read_npy(ref, number, option)))
            continue
        value: float | int
        try:
            value = int(number)
            if not -(2**63) <= value < 2**63 or value == 0:
                value = float(number)
        except ValueError:
            try:
                value = float(number)
            except ValueError:
                raise UsageError(f"{option} {ref}: {number!r} is not a number or a .npy file") from None
        if isinstance(value, float) and math.isinf(value) and number.strip().lstrip("+-").lower() not in _INFINITY:
            raise UsageError(
                f"{option} {escape(ref)}: {shorten(number.strip(), 40)} is out of float64's range "
                "(write inf or -inf for an infinity)"
            )
        pairs.append((ref, value))
    return pairs


#: How Python's float() spells an infinity (any letter case, after an optional sign).
_INFINITY = ("inf", "infinity")

#: What every ``.npy`` file starts with (numpy's format, any version).
_NPY_MAGIC = b"\x93NUMPY"


def _check_npy_size(file: Any, where: str) -> None:
    """Refuse a .npy file whose header (versions 1.0 and 2.0) declares more data than the file
    holds, from the header and the file's size: numpy would read all of it first."""
    import os

    from numpy.lib import format as npy

    file.seek(0)
    version = npy.read_magic(file)
    if version not in ((1, 0), (2, 0)):
        return  # 3.0: numpy's own reading decides
    shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(file)
    declared = math.prod(shape) * dtype.itemsize
    held = os.fstat(file.fileno()).st_size - file.tell()
    if declared > held:
        raise UsageError(f"{where} is truncated: its header declares {declared} bytes of data, it holds {held}")


def read_npy(ref: str, path: str, option: str = "--set") -> np.ndarray:
    """An array from a ``.npy`` file (never pickled objects), its own shape (0-d stays 0-d), for
    ``option`` ``ref``=``path``; :func:`resolve_set` copies it as a tensor leaf takes it (C order,
    native byte order). A file that is not a regular file, cannot be read or does not hold float64,
    float32 or int64 numbers is a :class:`~graphsvc.errors.UsageError`."""
    from graphsvc.files import NotRegularFile, open_regular
    from graphsvc.graph import TENSOR_DTYPES
    from graphsvc.text import one_line

    where = f"{option} {escape(ref)}: {escape(path)}"
    try:
        # what was opened decides, not a look at the path first (a FIFO swapped in would wait for ever)
        with open_regular(path) as file:
            # a .npy file starts so: anything else (a zip archive, a pickle, zeros) is refused from
            # its first bytes, unread (np.load would take it for an .npz archive or a pickle)
            if file.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise ValueError("not a .npy file")
            _check_npy_size(file, where)
            file.seek(0)
            array = np.load(file, allow_pickle=False)
    except NotRegularFile:
        raise UsageError(f"{where} is not a regular file") from None
    except OSError as exc:
        raise UsageError(f"{where} cannot be read: {one_line(exc.strerror or str(exc))}") from None
    except (ValueError, EOFError, MemoryError):  # numpy's own words suggest pickle: not repeated
        raise UsageError(f"{where} is not a .npy file of numbers (without pickled objects)") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{where} is not a .npy file of numbers (without pickled objects)")
    dtype = array.dtype.newbyteorder("=")  # big-endian float64 is fine: resolve_set makes it native
    if dtype not in TENSOR_DTYPES:
        raise UsageError(f"{where} holds {dtype}; float64, float32 or int64 arrays only")
    return array


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
