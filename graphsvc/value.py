"""Build graphs in Python with :class:`Value`, a drop-in for micrograd's ``engine.Value``.

>>> a, b, c = Value(2.0, name="a"), Value(3.0, name="b"), Value(1.0, name="c")
>>> L = (a * b + c) * (a + b)
>>> L.backward()
>>> a.grad, b.grad, c.grad
(22.0, 17.0, 5.0)

A ``Value`` records what made it: an op tag of the registry (``"add"``, ``"sub"``, ``"pow"``...), its
parents in order (``a * a`` has two parents, both ``a``) and the op's attributes (``{"exponent":
2.0}``). Numbers in expressions become ``const`` nodes. The builtin operators compute ``.data`` with
plain Python floats, by the functions :func:`graphsvc.ops.opmath.python_forward` derives from the one
table of op math that the replay's numpy functions and compiled kernels come from too. They follow
IEEE rules as numpy does (``x / 0`` is inf, ``log(-1)`` is nan), so a replay of a saved graph
reproduces the same values: bit for bit where graphsvc's C extension is built (exp, log, tanh, sin,
cos and pow are libm's both in ``math`` here and in the compiled code a replay runs), and for the
correctly rounded ops (+ - * / sqrt abs relu max min) everywhere; without the extension, exp, log,
tanh, sin, cos, pow and sigmoid may differ from numpy's by an ulp or two. :meth:`Value.apply` runs
any registered op, plugin ops included.

:meth:`Value.backward` does not walk the graph recursively and keeps no per-op derivative code:
it traces the graph (:func:`trace`) and runs :func:`graphsvc.replay.columns.backward` with the op registry's
derivative table, the one used everywhere in graphsvc. There is no recursion limit, and a value
used several times gets the sum of its contributions. The walk that reads the values into columns,
and the one that adds the gradients back, run in C (``csrc/walk.c``) where that extension is in use
(:func:`native_walk`), else in Python (:func:`_postorder`, :func:`_graph`: the reference the tests
compare the C walk with).

**The zero-gradient trap.** Like micrograd and PyTorch, ``backward`` *adds* to ``.grad``: calling
it twice without resetting doubles every gradient. Call :func:`zero_grad` (or set ``.grad = 0``)
before each backward pass. One difference from micrograd: the output's own ``.grad`` accumulates
too (micrograd resets it to 1), so the rule has no exception.

The registry is :func:`graphsvc.pluginhost.default_registry`, the one
:func:`graphsvc.pluginhost.load_registry` returns (builtins plus installed plugins and
``GRAPHSVC_PLUGINS``), loaded on first use; :func:`use_registry` replaces it (both are re-exported here).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from numbers import Real
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from graphsvc.collector import gc_paused
from graphsvc.errors import OpError, UsageError
from graphsvc.ops.opmath import python_forward

if TYPE_CHECKING:
    from graphsvc.graph import Graph
    from graphsvc.ops import OpRegistry
    from graphsvc.pluginhost import default_registry, use_registry

__all__ = ["Value", "default_registry", "save", "trace", "use_registry", "zero_grad"]

# The leaf tags, spelled as graphsvc.graph spells them (that module imports numpy; this one must not).
_LEAF = "leaf"
_CONST = "const"
# Each builtin op's forward on Python floats, from graphsvc.ops.opmath's table.
_ADD, _SUB, _MUL, _DIV, _NEG = (python_forward(op) for op in ("add", "sub", "mul", "div", "neg"))
_POW, _EXP, _LOG, _SQRT, _SIN, _COS = (python_forward(op) for op in ("pow", "exp", "log", "sqrt", "sin", "cos"))
_TANH, _RELU, _SIGMOID, _ABS, _MAX, _MIN = (
    python_forward(op) for op in ("tanh", "relu", "sigmoid", "abs", "max", "min")
)


class Value:
    """A scalar in a computation graph: ``.data``, ``.grad`` and how it was made.

    ``Value(data, name=None)`` makes an input (a ``leaf``). Operators and methods make new values:
    ``+ - * /``, ``**`` with a number exponent, unary ``-``, the reflected forms (``2 * a``),
    ``relu tanh exp log sigmoid sin cos sqrt abs``, ``a.max(b)``, ``a.min(b)``, and
    ``apply(op_name, *others, **attrs)`` for any registered op. ``name`` travels into saved files
    and CLI output; it can be set later (``loss.name = "loss"``). ``label`` is another spelling of
    it, as in micrograd's lecture notebooks: ``Value(2.0, label="a")``, ``e.label = "e"``
    (an empty label is no name, micrograd's default).
    """

    __slots__ = ("_attrs", "_op", "_parents", "data", "grad", "name")

    data: float
    grad: float
    name: str | None
    _op: str
    _parents: tuple[Value, ...]
    _attrs: dict[str, Any] | None

    def __init__(
        self,
        data: float,
        name: str | None = None,
        _op: str = _LEAF,
        _parents: tuple[Value, ...] = (),
        _attrs: dict[str, Any] | None = None,
        *,
        label: str | None = None,
    ) -> None:
        if label is not None:
            name = _label_as_name(name, label)
        self.data = data if _parents else float(data)
        self.grad = 0.0
        self.name = name
        self._op = _op
        self._parents = _parents
        self._attrs = _attrs

    # -- what made this value ------------------------------------------------------------------
    @property
    def op(self) -> str:
        """The op tag: ``"leaf"``, ``"const"``, ``"add"``, ``"pow"``, a plugin op's name..."""
        return self._op

    @property
    def parents(self) -> tuple[Value, ...]:
        """The inputs, in order, repeats kept (``(a * a).parents == (a, a)``)."""
        return self._parents

    @property
    def attrs(self) -> dict[str, Any]:
        """The op's attributes (``{"exponent": 2.0}`` for ``a ** 2``); a copy."""
        return dict(self._attrs) if self._attrs else {}

    @property
    def label(self) -> str | None:
        """micrograd's lecture spelling of :attr:`name` (reads and sets the same thing)."""
        return self.name

    @label.setter
    def label(self, label: str | None) -> None:
        self.name = label or None

    @property
    def _prev(self) -> set[Value]:
        """micrograd's spelling of the parents, for tools written against it (order is lost)."""
        return set(self._parents)

    def __repr__(self) -> str:
        name = f"name={self.name!r}, " if self.name is not None else ""
        return f"Value({name}data={_brief(self.data)}, grad={_brief(self.grad)})"

    # -- arithmetic ----------------------------------------------------------------------------
    def __add__(self, other: Value | float) -> Value:
        if not isinstance(other, Value):
            if not _is_number(other):
                return NotImplemented
            other = Value(float(other), None, _CONST)
        return Value(_ADD(self.data, other.data), None, "add", (self, other))

    def __radd__(self, other: float) -> Value:
        if not _is_number(other):
            return NotImplemented
        constant = Value(float(other), None, _CONST)
        return Value(_ADD(constant.data, self.data), None, "add", (constant, self))

    def __sub__(self, other: Value | float) -> Value:
        if not isinstance(other, Value):
            if not _is_number(other):
                return NotImplemented
            other = Value(float(other), None, _CONST)
        return Value(_SUB(self.data, other.data), None, "sub", (self, other))

    def __rsub__(self, other: float) -> Value:
        if not _is_number(other):
            return NotImplemented
        constant = Value(float(other), None, _CONST)
        return Value(_SUB(constant.data, self.data), None, "sub", (constant, self))

    def __mul__(self, other: Value | float) -> Value:
        if not isinstance(other, Value):
            if not _is_number(other):
                return NotImplemented
            other = Value(float(other), None, _CONST)
        return Value(_MUL(self.data, other.data), None, "mul", (self, other))

    def __rmul__(self, other: float) -> Value:
        if not _is_number(other):
            return NotImplemented
        constant = Value(float(other), None, _CONST)
        return Value(_MUL(constant.data, self.data), None, "mul", (constant, self))

    def __truediv__(self, other: Value | float) -> Value:
        if not isinstance(other, Value):
            if not _is_number(other):
                return NotImplemented
            other = Value(float(other), None, _CONST)
        return Value(_DIV(self.data, other.data), None, "div", (self, other))

    def __rtruediv__(self, other: float) -> Value:
        if not _is_number(other):
            return NotImplemented
        constant = Value(float(other), None, _CONST)
        return Value(_DIV(constant.data, self.data), None, "div", (constant, self))

    def __neg__(self) -> Value:
        return Value(_NEG(self.data), None, "neg", (self,))

    def __pow__(self, exponent: float) -> Value:
        if isinstance(exponent, Value) or not isinstance(exponent, Real):
            raise TypeError(
                f"the exponent must be a number, not {type(exponent).__name__} "
                "(for a Value exponent write (b * a.log()).exp())"
            )
        k = float(exponent)
        return Value(_POW(self.data, k), None, "pow", (self,), {"exponent": k})

    # -- functions -----------------------------------------------------------------------------
    def relu(self) -> Value:
        return Value(_RELU(self.data), None, "relu", (self,))

    def tanh(self) -> Value:
        return Value(_TANH(self.data), None, "tanh", (self,))

    def exp(self) -> Value:
        return Value(_EXP(self.data), None, "exp", (self,))

    def log(self) -> Value:
        return Value(_LOG(self.data), None, "log", (self,))

    def sqrt(self) -> Value:
        return Value(_SQRT(self.data), None, "sqrt", (self,))

    def sigmoid(self) -> Value:
        return Value(_SIGMOID(self.data), None, "sigmoid", (self,))

    def sin(self) -> Value:
        return Value(_SIN(self.data), None, "sin", (self,))

    def cos(self) -> Value:
        return Value(_COS(self.data), None, "cos", (self,))

    def abs(self) -> Value:
        return Value(_ABS(self.data), None, "abs", (self,))

    def __abs__(self) -> Value:
        return self.abs()

    def max(self, other: Value | float) -> Value:
        """The larger of two values (the gradient goes to the larger; half each on a tie)."""
        if not isinstance(other, Value):
            other = _const(other)
        return Value(_MAX(self.data, other.data), None, "max", (self, other))

    def min(self, other: Value | float) -> Value:
        """The smaller of two values (the gradient goes to the smaller; half each on a tie)."""
        if not isinstance(other, Value):
            other = _const(other)
        return Value(_MIN(self.data, other.data), None, "min", (self, other))

    def apply(self, op_name: str, *others: Value | float, **attrs: Any) -> Value:
        """Apply a registered op (a plugin's included) with this value as its first input.

        ``x.apply("softplus")``, ``a.apply("hypot", b)``, ``x.apply("leaky_relu", alpha=0.1)``.
        Keyword arguments are the op's attributes and are saved with the node. An op the registry
        does not know, the wrong number of inputs, or an attribute the op does not take (or lacking
        one it needs) raises :class:`~graphsvc.errors.OpError` here.
        """
        import numpy as np

        from graphsvc.ops import evaluate
        from graphsvc.pluginhost import default_registry

        op = default_registry().get(op_name)
        parents = (self, *(o if isinstance(o, Value) else _const(o) for o in others))
        if op.arity == 0:
            raise OpError(f"op {op_name!r} is a leaf tag: make a leaf with Value(data) instead")
        problem = op.arity_problem(len(parents))  # a variadic op's count: at least arity, at most max_arity
        if problem is not None:
            raise OpError(
                f"op {op_name!r} ({op.source}) {problem}, got {len(parents)} (this value and {len(others)} more)"
            )
        problem = op.attributes.problem(op, attrs)
        if problem is not None:
            raise OpError(problem)
        result = evaluate(op, [np.array([p.data], dtype=np.float64) for p in parents], attrs)
        from graphsvc.graph import data_copy

        return Value(float(result[0]), None, op_name, parents, {k: data_copy(v) for k, v in attrs.items()} or None)

    # -- gradients -----------------------------------------------------------------------------
    def backward(self) -> None:
        """Add ``d self / d v`` to ``v.grad`` for every value ``v`` this one depends on, itself included.

        Gradients accumulate: see the module docstring on the zero-gradient trap.
        """
        from graphsvc.pluginhost import default_registry
        from graphsvc.replay.columns import backward

        registry = default_registry()
        native = native_walk()
        with gc_paused():
            nodes, graph = _traced([self], registry, extras=False, native=native)
            grads = backward(graph, registry, len(nodes) - 1)
            if native is not None:
                native.add_grads(nodes, grads)
            else:
                for node, grad in zip(nodes, grads.tolist(), strict=True):
                    node.grad += grad


def _label_as_name(name: str | None, label: str) -> str | None:
    """The name given as ``label=`` (``""``: none, micrograd's default); both spellings must agree."""
    if name is not None and name != label:
        raise TypeError(f"Value() got name={name!r} and label={label!r}: label is another spelling of name, give one")
    return label or name


def _is_number(obj: object) -> bool:
    return obj.__class__ is float or obj.__class__ is int or isinstance(obj, Real)


def _const(number: object) -> Value:
    """A ``const`` node for a number met in an expression (max, min, apply)."""
    if _is_number(number):
        return Value(float(number), None, _CONST)  # type: ignore[arg-type]
    raise TypeError(f"expected a Value or a number, not {type(number).__name__}")


# -- the registry -------------------------------------------------------------------------------
def __getattr__(name: str) -> Any:
    """:func:`default_registry` and :func:`use_registry`, :mod:`graphsvc.pluginhost`'s (where the
    default registry is kept), imported when first asked for: importing this module imports
    neither numpy nor the plugin host."""
    if name in ("default_registry", "use_registry"):
        from graphsvc import pluginhost

        return getattr(pluginhost, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- walking the graph ----------------------------------------------------------------------------
def native_walk() -> ModuleType | None:
    """The C walks (``graphsvc.native._cwalk``, from ``csrc/walk.c``), or None where that extension
    is not in use (not built, or ``GRAPHSVC_NATIVE=0``)."""
    from graphsvc.native import extension

    return extension("walk")


def _traced(
    outputs: Sequence[Value], registry: OpRegistry, *, extras: bool, native: ModuleType | None
) -> tuple[list[Value], Graph]:
    """The values reachable from ``outputs`` in :func:`_postorder`'s order and their graph (as
    :func:`_graph` makes it), walked by ``native`` (``graphsvc.native._cwalk``) or, when it is None, by
    the Python reference."""
    if native is None:
        nodes, index = _postorder(outputs)
        return nodes, _graph(nodes, index, outputs, registry, extras=extras)

    from graphsvc.graph import copy_nested, graph_from_buffers

    nodes, op_table, op_codes, offsets, parents, values, grads, attrs, names, output_ids = native.values(
        tuple(outputs), extras
    )
    graph = graph_from_buffers(
        op_table,
        op_codes,
        offsets,
        parents,
        values,
        grads if extras else None,
        attrs=copy_nested(attrs),  # the C walk copies each map, not the lists and maps in it (as _graph does)
        outputs=list(dict.fromkeys(output_ids)),
    )
    if extras:
        graph.names = names
        _sources_and_check(graph, registry)
    return nodes, graph


def _postorder(outputs: Sequence[Value]) -> tuple[list[Value], dict[Value, int]]:
    """Depth-first post-order from each output in turn, parents in stored order, without recursion.

    It is micrograd's ``build_topo`` made iterative (a stack of (value, iterator over its parents)):
    every value comes after its parents, and the order depends only on the graph, so tracing the
    same expression twice gives the same ids. Returns the order and each value's position in it.
    """
    index: dict[Value, int] = {}
    order: list[Value] = []
    append = order.append
    for output in outputs:
        if output in index:
            continue
        index[output] = -1  # on the stack
        stack = [(output, iter(output._parents))]
        push, pop = stack.append, stack.pop
        while stack:
            node, parents = stack[-1]
            for parent in parents:
                if parent not in index:
                    if not parent._parents:  # a leaf: done at once, no stack entry
                        index[parent] = len(order)
                        append(parent)
                        continue
                    index[parent] = -1
                    push((parent, iter(parent._parents)))
                    break
            else:  # every parent done (a DAG cannot reach a value on the stack again)
                pop()
                index[node] = len(order)
                append(node)
    return order, index


def _walk(roots: Iterable[Value]) -> Iterator[Value]:
    """Every value reachable from ``roots``, each once, in no particular order."""
    seen: set[Value] = set(roots)
    stack = list(seen)
    while stack:
        node = stack.pop()
        yield node
        for parent in node._parents:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)


def zero_grad(*values: Value) -> None:
    """Set ``.grad`` to 0 on every value the given values depend on, themselves included."""
    for value in values:
        if not isinstance(value, Value):
            raise TypeError(f"zero_grad() takes Values, not {type(value).__name__}")
    for node in _walk(values):
        node.grad = 0.0


def _graph(
    nodes: list[Value], index: dict[Value, int], outputs: Sequence[Value], registry: OpRegistry, *, extras: bool
) -> Graph:
    """The columns of ``nodes`` (a topological order, ``index`` its positions); ``extras`` adds
    grads, names and op sources, and checks the result."""
    import numpy as np

    from graphsvc.graph import FLOAT_DTYPE, copy_maps, graph_from_lists

    parents = list(map(attrgetter("_parents"), nodes))
    graph = graph_from_lists(
        list(map(attrgetter("_op"), nodes)),
        map(len, parents),
        map(index.__getitem__, chain.from_iterable(parents)),
        map(attrgetter("data"), nodes),
        attrs=copy_maps({i: attrs for i, attrs in enumerate(map(attrgetter("_attrs"), nodes)) if attrs}),
        outputs=list(dict.fromkeys(index[o] for o in outputs)),
    )
    if extras:
        graph.grads = np.array([node.grad for node in nodes], dtype=FLOAT_DTYPE)
        graph.names = {i: node.name for i, node in enumerate(nodes) if node.name is not None}
        _sources_and_check(graph, registry)
    return graph


def _sources_and_check(graph: Graph, registry: OpRegistry) -> None:
    """Record the plugin and version of each op ``registry`` knows, then check the graph."""
    registry.record_sources(graph)
    graph.check()


def trace(*outputs: Value, registry: OpRegistry | None = None) -> Graph:
    """The graph reachable from ``outputs``, with current values, gradients, names and attributes.

    Node ids follow a depth-first post-order from each output in turn (parents in stored order),
    so the same expression always gives the same graph. The outputs are the graph's outputs.
    Each op records the plugin and version that provide it (graphsvc's own for the builtin ops).
    """
    if not outputs:
        raise UsageError("trace() needs at least one Value")
    for output in outputs:
        if not isinstance(output, Value):
            raise TypeError(f"trace() takes Values, not {type(output).__name__}")
    if registry is None:  # not `registry or ...`: an empty registry is falsy
        from graphsvc.pluginhost import default_registry

        registry = default_registry()
    else:
        from graphsvc.ops import expect_registry

        expect_registry(registry)
    with gc_paused():
        return _traced(outputs, registry, extras=True, native=native_walk())[1]


def save(obj: Value | Sequence[Value] | Graph, path: str | os.PathLike[str]) -> None:
    """Write a :class:`Value` (or several, traced together) or a :class:`~graphsvc.graph.Graph` to ``path``."""
    from graphsvc import format
    from graphsvc.graph import Graph

    if isinstance(obj, Graph):
        graph = obj
    elif isinstance(obj, Value):
        graph = trace(obj)
    elif isinstance(obj, Sequence) and not isinstance(obj, str):
        graph = trace(*obj)
    else:
        raise TypeError(f"save() takes a Value, a sequence of Values or a Graph, not {type(obj).__name__}")
    format.save(graph, path)


def _brief(x: object) -> str:
    """A number as Python writes it; an array (a plugin op's result) by its shape and dtype, never
    its elements, so a repr stays one short line."""
    shape = getattr(x, "shape", None)
    if shape is not None and shape != ():
        return f"<array {list(shape)} {getattr(x, 'dtype', '')}>"
    return repr(x.item()) if shape == () and hasattr(x, "item") else repr(x)
