"""The op contract and the op registry.

An op is a forward function with its derivative, given in one of two forms.

*Elementwise* ops give their local derivatives, the way micrograd writes them side by side::

    Op("mul", 2, forward=lambda x, y: x * y, derivatives=lambda x, y, out: (y, x))

Any op may instead give a *vector-Jacobian product*, the contract of autograd's ``defvjp``, JAX's
``custom_vjp`` and PyTorch's ``autograd.Function.backward``::

    Op("matmul", 2, forward=np.matmul, vjp=lambda g, out, x, y: (g @ y.T, x.T @ g))

- ``vjp(g, out, *inputs, **attrs)`` returns one cotangent per input: the gradient of the loss with
  respect to that input, given ``g``, its gradient with respect to the output (same shape as
  ``out``). ``None`` marks an input that gets no gradient (an int64 index input). On tensor nodes
  graphsvc calls ``vjp`` when an op has one; an elementwise op's ``derivatives`` are turned into
  a VJP (``g * partial``, broadcast dimensions summed back: :func:`unbroadcast`; :func:`elementwise_vjp`).
  An op with only a ``vjp`` works on tensor graphs (a graph of scalars that uses it is replayed as
  one, node by node, with 0-d arrays). A ``vjp`` that declares a parameter ``needs_input_grad`` is
  given a tuple of bools, one per input (PyTorch's ``ctx.needs_input_grad``): an input whose entry
  is False gets no gradient (data: a ``const`` array, what is computed from consts alone), and its
  cotangent may be ``None``; a ``vjp`` without it computes every cotangent and graphsvc drops those
  nobody needs.
- ``forward_with_residuals(*inputs, **attrs) -> (output, residuals)``, optional, for a ``vjp`` that
  declares a parameter ``residuals``: a replay that goes on to a backward pass computes the node
  with it and passes what it kept to the ``vjp`` (JAX's residuals, PyTorch's
  ``ctx.save_for_backward``); a backward from stored values passes ``residuals=None``. Arrays
  among the residuals are made read-only: they must be the op's own, not a buffer it reuses.
- ``variadic=True``: a node may have ``arity`` or more inputs (``concatenate``), and at most
  ``max_arity`` when that is given (an optional input: conv2d's bias, ``max_arity=3``); a replay
  refuses a node with another number before anything runs.
- ``samples(rng)``, optional, returns ``[(inputs, attrs), ...]``: points where ``graphsvc
  gradcheck`` checks an op given by its ``vjp`` (an elementwise op is checked at scalar points
  without them). Without samples such an op is listed as not checked.

- ``forward(*inputs, **attrs)`` returns the output.
- ``derivatives(*inputs, out, **attrs)`` returns a tuple (or list) with one partial derivative
  ``d out / d input_i`` per input. It receives the output too, so ``tanh`` can use ``1 - out**2`` and
  ``exp`` can use ``out``.
- Attributes stored with a node (``{"exponent": 2.0}`` on a ``pow`` node) are passed as keyword
  arguments to both functions. Which ones an op takes is read from ``forward``'s signature
  (:attr:`Op.attributes`): a replay refuses a node giving others, or lacking one without a default.
- A *vectorized* op (the default) receives float64 numpy arrays holding every node of that op at once
  (one-element arrays along a deep chain, where nodes are replayed one at a time) and may return an
  array or a scalar (a scalar is broadcast: ``add`` returns ``(1.0, 1.0)``). During replay the input
  arrays are read-only: return a new array, do not write into them.
  An op with ``vectorized=False`` receives Python floats and returns floats; the engine calls it
  once per element.
- nan and inf are values, not errors: numpy warnings are silenced while an op runs. An exception
  (any ``BaseException``: ``sys.exit``, a ``KeyboardInterrupt`` the op raises itself, ``MemoryError``),
  an output of the wrong shape, or an output that is not a number (``None``, a string, an object
  array, an integer beyond float64's range) is a :class:`~graphsvc.errors.ReplayError` naming the op
  and its plugin. Only the user's own Ctrl-C stops a replay as an interrupt (see
  :func:`interrupts_told_apart`).
- ``forward`` must accept ``arity`` positional arguments (a variadic op's ``max_arity``, when
  given) and ``derivatives`` ``arity + 1``; an op whose functions cannot is refused when it is
  registered (functions without an inspectable signature, and ``*args``, are taken on trust).
- Arity 0 is for the leaf tags (``leaf``, ``const``): their values come from the file, so they
  have no functions.

The registry owns the table of ops: registering a name twice is an :class:`~graphsvc.errors.OpError`
naming both plugins, and nothing is ever overridden. Plugins do not touch the registry directly;
they call the ``register`` callback of the ``graphsvc_register_ops`` hook (see
:mod:`graphsvc.hookspecs` and :mod:`graphsvc.pluginhost`).

An *op family* (:class:`OpFamily`) serves an open set of tags that share a prefix (``aten.``: every
PyTorch operator): the registry asks its ``resolve(tag)`` for an op the first time a graph uses
such a tag, after the ops registered by name, and keeps the answer. A resolver that raises, or
returns anything but a well-formed op of that name, leaves the tag unknown, with the reason
(:meth:`OpRegistry.unknown_reason`).
"""

from __future__ import annotations

import _signal
import dataclasses
import inspect
import math
import numbers
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import FrameType
from typing import Any, NamedTuple

import numpy as np

from graphsvc.errors import OpError, ReplayError, UnknownOpError
from graphsvc.text import counted, listed, shorten

__all__ = [
    "Attributes",
    "Op",
    "OpFamily",
    "OpRegistry",
    "UserInterrupt",
    "attribute_parameters",
    "check_family_declaration",
    "check_op_declaration",
    "describe_source",
    "elementwise_vjp",
    "evaluate",
    "evaluate_node",
    "interrupts_told_apart",
    "local_derivatives",
    "per_element",
    "raise_unreadable",
    "required_attributes",
    "unbroadcast",
]

#: Longest part of a plugin's exception text that goes into a message.
EXCEPTION_CHARS = 200
#: The plugin graphsvc's own ops (:mod:`graphsvc.ops.builtin`) are registered as.
BUILTIN_PLUGIN = "graphsvc"


@dataclass(frozen=True)
class Op:
    """One op: its tag, arity, forward function and local derivatives. See the module docstring."""

    #: The tag nodes of this op carry in graph files.
    name: str
    #: How many inputs (parents) a node of this op has; 0 for the leaf tags.
    arity: int
    #: ``forward(*inputs, **attrs) -> output``; None for the leaf tags.
    forward: Callable[..., Any] | None
    #: ``derivatives(*inputs, out, **attrs) -> (d out/d input_0, ...)`` for an elementwise op;
    #: None for the leaf tags and for ops given by their ``vjp``.
    derivatives: Callable[..., Sequence[Any]] | None = None
    #: The version of this op's definition, recorded in files next to the plugin's version.
    version: str = "1"
    #: False: the functions accept only Python floats, and the engine calls them per element.
    vectorized: bool = True
    #: One line for ``graphsvc ops``, then anything a user should know (domain, ties, attributes).
    doc: str = ""
    #: Optional: the name of a compiled primitive (:data:`graphsvc.ops.opmath.PRIMITIVES`) that
    #: computes exactly what ``forward`` and ``derivatives`` compute, so large graphs replay these
    #: nodes in compiled code. Only for ops that match a primitive bit for bit.
    kernel: str | None = None
    #: ``vjp(g, out, *inputs, **attrs) -> (cotangent of input_0, ...)``, ``None`` for an input that
    #: gets no gradient; optional for an elementwise op (derived from ``derivatives``).
    vjp: Callable[..., Sequence[Any]] | None = None
    #: True: a node may have ``arity`` or more inputs (``concatenate``); its functions then take
    #: as many positional inputs as the node has.
    variadic: bool = False
    #: The most inputs a node of a variadic op may have (an optional input: conv2d's bias makes
    #: 3); ``None``: no limit. Keyword-only, so the fields after it keep their positions.
    max_arity: int | None = dataclasses.field(default=None, kw_only=True)
    #: ``samples(rng) -> [(inputs, attrs), ...]``: where gradcheck checks a vjp op (optional).
    samples: Callable[[np.random.Generator], Sequence[tuple[Sequence[Any], Mapping[str, Any]]]] | None = None
    #: ``forward_with_residuals(*inputs, **attrs) -> (output, residuals)`` (optional, for a vjp op):
    #: called instead of ``forward`` by a replay that goes on to a backward pass, which keeps
    #: ``residuals`` (whatever the VJP wants again: im2col columns, a mask) and passes them to the
    #: ``vjp`` as its keyword ``residuals`` (``None`` when this replay did not compute the node).
    forward_with_residuals: Callable[..., tuple[Any, Any]] | None = None
    #: ``out_shape(*input_shapes, **attrs) -> shape | None`` (optional): the shape of the array
    #: ``forward`` will return (or of a larger one it makes on the way: im2col's columns), worked
    #: out from its inputs' shapes and the node's attributes without computing it
    #: (``broadcast_to``: its ``shape``), or ``None`` when it cannot tell. A
    #: tensor replay calls it before ``forward`` and refuses a node that asks for more than its
    #: limit on one array (:func:`graphsvc.replay.arrays.array_limit`), before any memory is taken.
    out_shape: Callable[..., Sequence[int] | None] | None = dataclasses.field(default=None, kw_only=True)
    #: The distribution (or module) that registered the op; filled in by the registry.
    plugin: str | None = None
    #: That distribution's version, when known; filled in by the registry.
    plugin_version: str | None = None

    @property
    def source(self) -> str:
        """Who registered the op, for messages: ``"graphsvc 0.1.0"``, ``"myplugin"``."""
        return describe_source(self.plugin, self.plugin_version)

    @property
    def builtin(self) -> bool:
        """One of graphsvc's own ops (:mod:`graphsvc.ops.builtin`)."""
        return self.plugin == BUILTIN_PLUGIN

    def message_name(self, function: str) -> str:
        """How messages name the op's ``function`` that ran: a builtin op's ``forward_with_residuals``
        is its ``forward`` (its users do not choose between the two; a plugin's author wrote both)."""
        return "forward" if function == "forward_with_residuals" and self.builtin else function

    def arity_problem(self, count: int) -> str | None:
        """Why a node of this op cannot have ``count`` inputs, as messages say it (``"takes at most 3
        inputs"``, ``"takes at least 1 input"``, ``"takes 2 inputs"``), or ``None`` if it can."""
        if not self.variadic:
            return None if count == self.arity else f"takes {counted(self.arity, 'input')}"
        if count < self.arity:
            return f"takes at least {counted(self.arity, 'input')}"
        if self.max_arity is not None and count > self.max_arity:
            return f"takes at most {counted(self.max_arity, 'input')}"
        return None

    @property
    def kind(self) -> str:
        """How the op computes, as ``graphsvc ops`` lists it: ``"leaf tag"`` (no inputs), ``"vjp"``
        (given by its vector-Jacobian product), ``"vectorized"`` (an elementwise op on arrays) or
        ``"per element"`` (an elementwise op called on Python floats)."""
        if self.arity == 0:
            return "leaf tag"
        if self.vjp is not None:
            return "vjp"
        return "vectorized" if self.vectorized else "per element"

    @cached_property
    def attributes(self) -> Attributes:
        """The attributes a node of this op may and must give, read from its ``forward``'s signature
        on first use and kept with the op (a replay checks every node's against them)."""
        return Attributes.of(self)

    def __getstate__(self) -> dict[str, Any]:
        """The fields, without what :attr:`tensor_vjp` cached (a closure for a derived VJP)."""
        state = dict(self.__dict__)
        state.pop("tensor_vjp", None)
        return state

    @cached_property
    def tensor_vjp(self) -> VJP:
        """What the tensor replay calls for this op's gradient: its ``vjp``, or one derived from its
        ``derivatives`` (:func:`elementwise_vjp`), with the keywords it declares;
        worked out on first use and kept with the op (reading a signature costs more than many a
        VJP)."""
        if self.vjp is not None:
            return VJP.of(self.vjp)
        return VJP.of(elementwise_vjp(self))


class Attributes(NamedTuple):
    """The attributes an op takes: the keyword parameters of its ``forward`` after its inputs."""

    #: Their names; ``None`` when it takes any (``**kwargs``, or a signature that cannot be read).
    names: frozenset[str] | None
    #: Those without a default, in the signature's order: every node of the op gives them.
    required: tuple[str, ...]

    @classmethod
    def of(cls, op: Op) -> Attributes:
        """Read from ``op.forward``'s signature (:func:`attribute_parameters`)."""
        read = attribute_parameters(op)
        if read is None:
            return cls(None, ())
        keywords, takes_any = read
        return cls(None if takes_any else frozenset(p.name for p in keywords), required_attributes(op, keywords))

    def problem(self, op: Op, attrs: Mapping[str, Any]) -> str | None:
        """What is wrong with a node's ``attrs`` for ``op``, the op's attributes: ``op 'nll_loss'
        (graphsvc 0.1.0) has no attribute 'weight' (it takes: ignore_index, reduction)``, or
        ``None``. Names from a file are quoted by ``repr`` (which escapes what cannot be printed)."""
        names = self.names
        unknown = [] if names is None else [name for name in attrs if name not in names]
        if unknown:
            takes = f"it takes: {', '.join(sorted(names))}" if names else "it takes none"
            return f"op {op.name!r} ({op.source}) has no {_attribute_names(unknown)} ({takes})"
        missing = [name for name in self.required if name not in attrs]
        if missing:
            gives = f"the node gives: {listed(sorted(attrs), quoted=True)}" if attrs else "the node gives none"
            return f"op {op.name!r} ({op.source}) needs {_attribute_names(missing)} ({gives})"
        return None


def attribute_parameters(op: Op) -> tuple[tuple[inspect.Parameter, ...], bool] | None:
    """The parameters of ``op.forward`` that are attributes, in the signature's order (with their
    defaults, as ``graphsvc ops NAME`` shows them): those that can be given by keyword, less the
    first ``arity`` positional ones, or ``max_arity`` (its inputs); and whether it takes any others
    too (``**kwargs``). ``None`` when there is no signature to read (a leaf tag has no forward;
    builtins without a signature, odd callables)."""
    try:
        parameters = list(inspect.signature(op.forward).parameters.values())  # type: ignore[arg-type]
    except Exception:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    inputs = 0
    most = op.arity if op.max_arity is None else op.max_arity
    while inputs < min(most, len(parameters)) and parameters[inputs].kind in positional:
        inputs += 1
    keywords = tuple(
        p
        for p in parameters[inputs:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    return keywords, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def required_attributes(op: Op, keywords: Sequence[inspect.Parameter]) -> tuple[str, ...]:
    """Those of ``keywords`` (:func:`attribute_parameters`) every node of ``op`` gives: without a
    default (a variadic op's further positional ones are never required, more inputs may fill them)."""
    return tuple(
        p.name
        for p in keywords
        if p.default is inspect.Parameter.empty
        and not (op.variadic and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def _attribute_names(names: list[str]) -> str:
    """``attribute 'weight'`` or ``attributes 'a', 'b'`` (names from a file: quoted as ``repr``
    writes them, which escapes what cannot be printed)."""
    return f"attribute{'s' if len(names) > 1 else ''} {listed(sorted(names), quoted=True)}"


#: The keyword by which a VJP is told which inputs need a cotangent (PyTorch's
#: ``ctx.needs_input_grad``): passed to a ``vjp`` that declares a parameter of this name.
NEEDS_INPUT_GRAD = "needs_input_grad"
#: The keyword by which a VJP gets what its op's ``forward_with_residuals`` kept for the node
#: (JAX's residuals, PyTorch's ``ctx.saved_tensors``): passed to a ``vjp`` that declares it.
RESIDUALS = "residuals"


class VJP(NamedTuple):
    """An op's VJP as the tensor replay calls it."""

    #: ``vjp(g, out, *inputs, **attrs)``: the op's own, or derived from its ``derivatives``.
    function: Callable[..., Sequence[Any]]
    #: It declares :data:`NEEDS_INPUT_GRAD`: it is told which inputs need a cotangent.
    takes_needs: bool
    #: It declares :data:`RESIDUALS`: it gets what ``forward_with_residuals`` kept for the node.
    takes_residuals: bool

    @classmethod
    def of(cls, function: Callable[..., Sequence[Any]]) -> VJP:
        """``function`` and the keywords its signature declares (neither, if it has none to read)."""
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            return cls(function, False, False)
        return cls(function, NEEDS_INPUT_GRAD in parameters, RESIDUALS in parameters)


@dataclass(frozen=True)
class OpFamily:
    """An open set of op tags sharing a prefix, whose ops a plugin makes when a graph asks for them.

    ``resolve(tag)`` is called the first time a graph uses a tag that starts with ``prefix`` and no
    op is registered by that name; it returns the :class:`Op` of that name, or ``None`` for a tag it
    does not know. To refuse a tag with a reason, it raises :class:`~graphsvc.errors.OpError` with
    that reason (any other exception is reported as the plugin's fault). The answer is kept for the
    registry's lifetime."""

    #: The start of every tag of the family: ``"aten."``.
    prefix: str
    #: ``resolve(tag) -> Op | None``.
    resolve: Callable[[str], Any]
    #: One line for ``graphsvc ops``: what the family's ops are.
    doc: str = ""
    #: The distribution (or module) that registered the family; filled in by the registry.
    plugin: str | None = None
    #: That distribution's version, when known; filled in by the registry.
    plugin_version: str | None = None

    @property
    def source(self) -> str:
        """Who registered the family, for messages: ``"graphsvc-torch 0.1.0"``."""
        return describe_source(self.plugin, self.plugin_version)

    @property
    def name(self) -> str:
        """How listings name the family: its prefix and ``*`` (``aten.*``)."""
        return f"{self.prefix}*"


def check_family_declaration(family: object) -> OpFamily:
    """Return ``family`` if it is a well-formed :class:`OpFamily`, else raise :class:`OpError` saying what is wrong."""
    if not isinstance(family, OpFamily):
        raise OpError(f"register() expects a graphsvc.ops.OpFamily, not {type(family).__name__}")
    if not isinstance(family.prefix, str) or not family.prefix:
        raise OpError(f"an op family's prefix must be a non-empty string, not {family.prefix!r}")
    if not callable(family.resolve):
        raise OpError(f"op family {family.name!r}: resolve must be a function, not {family.resolve!r}")
    if not isinstance(family.doc, str):
        raise OpError(f"op family {family.name!r}: doc must be a string, not {family.doc!r}")
    return family


#: Tag prefixes graphsvc knows the plugin of, for a graph that uses such a tag where no plugin
#: serves it: what the tags are, and what replaying them needs (the error says so).
KNOWN_FAMILIES: dict[str, tuple[str, str]] = {
    "aten.": (
        "a PyTorch operator",
        "the graphsvc-torch plugin and PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0)",
    ),
}


def known_family(tag: object) -> tuple[str, str] | None:
    """What :data:`KNOWN_FAMILIES` says of ``tag`` (what it is, what replaying it needs), or None."""
    if not isinstance(tag, str):
        return None
    return next((said for prefix, said in KNOWN_FAMILIES.items() if tag.startswith(prefix)), None)


def describe_source(plugin: str | None, version: str | None) -> str:
    """``"name version"``, ``"name"`` or ``"an unnamed plugin"``."""
    if plugin is None:
        return "an unnamed plugin"
    return plugin if version is None else f"{plugin} {version}"


def check_op_declaration(op: object) -> Op:
    """Return ``op`` if it is a well-formed :class:`Op`, else raise :class:`OpError` saying what is wrong."""
    if not isinstance(op, Op):
        raise OpError(f"register() expects a graphsvc.ops.Op, not {type(op).__name__}")
    if not isinstance(op.name, str) or not op.name:
        raise OpError(f"an op's name must be a non-empty string, not {op.name!r}")
    if not isinstance(op.arity, int) or isinstance(op.arity, bool) or op.arity < 0:
        raise OpError(f"op {op.name!r}: arity must be a non-negative integer, not {op.arity!r}")
    if op.arity == 0:
        if op.forward is not None or op.derivatives is not None or op.vjp is not None or op.variadic:
            raise OpError(
                f"op {op.name!r}: arity 0 is for leaf tags, whose values come from the file, "
                "so forward, derivatives and vjp must be None"
            )
    else:
        if not callable(op.forward):
            raise OpError(f"op {op.name!r}: forward must be a function, not {op.forward!r}")
        if op.derivatives is None and op.vjp is None:
            raise OpError(f"op {op.name!r}: give derivatives (an elementwise op) or vjp")
        for field in ("derivatives", "vjp"):
            if getattr(op, field) is not None and not callable(getattr(op, field)):
                raise OpError(f"op {op.name!r}: {field} must be a function, not {getattr(op, field)!r}")
    if op.out_shape is not None and not callable(op.out_shape):
        raise OpError(f"op {op.name!r}: out_shape must be a function, not {op.out_shape!r}")
    if op.samples is not None and not callable(op.samples):
        raise OpError(f"op {op.name!r}: samples must be a function, not {op.samples!r}")
    if op.forward_with_residuals is not None:
        if not callable(op.forward_with_residuals):
            raise OpError(
                f"op {op.name!r}: forward_with_residuals must be a function, not {op.forward_with_residuals!r}"
            )
        if op.vjp is None or not op.tensor_vjp.takes_residuals:
            raise OpError(
                f"op {op.name!r}: forward_with_residuals is given, but no vjp that takes `residuals` to receive them"
            )
    if not isinstance(op.variadic, bool):
        raise OpError(f"op {op.name!r}: variadic must be True or False, not {op.variadic!r}")
    if op.variadic and op.derivatives is not None:
        raise OpError(f"op {op.name!r}: a variadic op gives vjp, not derivatives")
    if op.max_arity is not None:
        if not isinstance(op.max_arity, int) or isinstance(op.max_arity, bool):
            raise OpError(f"op {op.name!r}: max_arity must be an integer or None, not {op.max_arity!r}")
        if not op.variadic:
            raise OpError(f"op {op.name!r}: max_arity is given, but the op is not variadic (give variadic=True)")
        if op.max_arity <= op.arity:
            raise OpError(f"op {op.name!r}: max_arity must be more than arity {op.arity}, not {op.max_arity}")
    if not op.vectorized and op.vjp is not None:
        raise OpError(f"op {op.name!r}: an op with a vjp works on arrays, so it must be vectorized")
    if not isinstance(op.version, str) or not op.version:
        raise OpError(f"op {op.name!r}: version must be a non-empty string, not {op.version!r}")
    if not isinstance(op.vectorized, bool):
        raise OpError(f"op {op.name!r}: vectorized must be True or False, not {op.vectorized!r}")
    if not isinstance(op.doc, str):
        raise OpError(f"op {op.name!r}: doc must be a string, not {op.doc!r}")
    if op.kernel is not None:
        from graphsvc.ops.opmath import PRIMITIVE_ARITY

        if op.derivatives is None:
            raise OpError(f"op {op.name!r}: a kernel stands for an elementwise op, which gives derivatives")
        if not isinstance(op.kernel, str) or PRIMITIVE_ARITY.get(op.kernel) != op.arity:
            known = ", ".join(PRIMITIVE_ARITY)
            raise OpError(f"op {op.name!r}: kernel {op.kernel!r} is not a primitive of arity {op.arity} ({known})")
    if op.arity > 0:
        most = op.arity if op.max_arity is None else op.max_arity  # a variadic op's most, when known
        _check_positionals(op, "forward", op.forward, most, "its inputs")
        if op.derivatives is not None:
            _check_positionals(op, "derivatives", op.derivatives, op.arity + 1, "its inputs and out")
        if op.vjp is not None:
            _check_positionals(op, "vjp", op.vjp, most + 2, "g, out and its inputs")
    return op


def _check_positionals(op: Op, field: str, function: Any, count: int, what: str) -> None:
    """Refuse a function that cannot take ``count`` positional arguments (``*args`` and functions
    without an inspectable signature, such as some builtins, are taken on trust)."""
    try:
        signature = inspect.signature(function)
    except Exception:  # builtins without a signature (TypeError, ValueError), odd callables
        return
    try:
        signature.bind_partial(*range(count))
    except TypeError:
        source = f" ({op.source})" if op.plugin is not None else ""
        maximum = f", max_arity {op.max_arity}" if op.max_arity is not None else ""
        raise OpError(
            f"op {op.name!r}{source}: {field}{shorten(str(signature), 80)} cannot take {what} as "
            f"{counted(count, 'positional argument')} (arity {op.arity}{maximum})"
        ) from None


class OpRegistry:
    """The table of ops, keyed by name, and the op families (:class:`OpFamily`) that make ops for
    tags no op is registered by. Registering a name or a family's prefix twice is an error; nothing
    is overridden."""

    def __init__(self) -> None:
        self._ops: dict[str, Op] = {}
        self._families: dict[str, OpFamily] = {}
        self._resolved: dict[str, Op | None] = {}  # what the families answered, tag by tag
        self._unresolved: dict[str, str] = {}  # why a family's tag has no op

    def register(self, op: Op, *, plugin: str | None = None, plugin_version: str | None = None) -> None:
        """Add ``op``, recording the plugin that registered it (when given, it replaces ``op.plugin``).

        Raises :class:`OpError` for a malformed op or a name that is already registered; the
        message names both plugins, and the registry is left unchanged.
        """
        if plugin is not None and isinstance(op, Op):
            op = dataclasses.replace(op, plugin=plugin, plugin_version=plugin_version)
        check_op_declaration(op)
        existing = self._ops.get(op.name)
        if existing is not None:
            raise OpError(duplicate_message(existing, op))
        self._ops[op.name] = op
        self._resolved.pop(op.name, None)
        self._unresolved.pop(op.name, None)

    def register_family(
        self, family: OpFamily, *, plugin: str | None = None, plugin_version: str | None = None
    ) -> None:
        """Add an op family, recording the plugin that registered it (as :meth:`register` does).

        Raises :class:`OpError` for a malformed family or a prefix another family has; the message
        names both plugins, and the registry is left unchanged."""
        if plugin is not None and isinstance(family, OpFamily):
            family = dataclasses.replace(family, plugin=plugin, plugin_version=plugin_version)
        check_family_declaration(family)
        existing = self._families.get(family.prefix)
        if existing is not None:
            raise OpError(duplicate_family_message(existing, family))
        self._families[family.prefix] = family
        self._resolved.clear()
        self._unresolved.clear()

    def registered(self, name: object) -> Op | None:
        """The op registered by the name ``name``, or None; no family is asked (a plugin's load
        must not run another plugin's resolver)."""
        try:
            return self._ops.get(name)  # type: ignore[call-overload]
        except TypeError:  # an unhashable name
            return None

    def family(self, prefix: str) -> OpFamily | None:
        """The family registered with the prefix ``prefix``, or None."""
        return self._families.get(prefix)

    def families(self) -> list[OpFamily]:
        """The op families, by prefix."""
        return [self._families[prefix] for prefix in sorted(self._families)]

    def family_of(self, name: object) -> OpFamily | None:
        """The family whose prefix starts ``name`` (the longest such prefix), or None."""
        if not isinstance(name, str) or not self._families:
            return None
        found = [family for prefix, family in self._families.items() if name.startswith(prefix)]
        return max(found, key=lambda family: len(family.prefix)) if found else None

    def _lookup(self, name: object) -> Op | None:
        """The op called ``name``: registered by that name, or made by its family (asked once)."""
        try:
            return self._ops[name]  # type: ignore[index]
        except (KeyError, TypeError):
            pass
        if not self._families or not isinstance(name, str):
            return None
        try:
            return self._resolved[name]
        except KeyError:
            pass
        family = self.family_of(name)
        op = None if family is None else self._resolve(family, name)
        self._resolved[name] = op
        return op

    def _resolve(self, family: OpFamily, name: str) -> Op | None:
        """``family.resolve(name)``, contained: a resolver that raises or returns anything but a
        well-formed op called ``name`` leaves the tag unknown, its reason kept."""
        with interrupts_told_apart():
            try:
                op = family.resolve(name)
            except BaseException as exc:  # a plugin's code: sys.exit and its own KeyboardInterrupt included
                if is_user_interrupt(exc):
                    raise
                if isinstance(exc, OpError):  # the plugin's refusal, in its words
                    reason = shorten(str(exc), EXCEPTION_CHARS)
                else:
                    reason = f"its resolver raised {describe_exception(exc)}"
                self._unresolved[name] = f"{family.source}: {reason}"
                return None
        if op is None:
            self._unresolved[name] = f"{family.source} knows no op of that name"
            return None
        if not isinstance(op, Op):
            returned = type(op).__name__
            self._unresolved[name] = f"{family.source}: its resolver returned {returned}, not a graphsvc.ops.Op"
            return None
        try:
            check_op_declaration(op)
            if op.name != name:
                raise OpError(f"its resolver returned op {op.name!r} for this tag")
        except OpError as exc:
            self._unresolved[name] = f"{family.source}: malformed op: {shorten(str(exc), EXCEPTION_CHARS)}"
            return None
        return dataclasses.replace(op, plugin=family.plugin, plugin_version=family.plugin_version)

    def unknown_reason(self, name: object) -> str | None:
        """Why ``name`` has no op here, when there is more to say than that no plugin registers it:
        what its family's plugin said (``"graphsvc-torch 0.1.0: PyTorch has no operator ..."``), or
        for a tag graphsvc knows the plugin of (:data:`KNOWN_FAMILIES`) and no family serves, what
        it is and what replaying it needs. None for an op that is here."""
        if self._lookup(name) is not None:
            return None
        if isinstance(name, str) and name in self._unresolved:
            return self._unresolved[name]
        said = known_family(name) if self.family_of(name) is None else None
        if said is not None:
            what, needs = said
            return f"{what}: replaying it needs {needs}"
        return None

    def get(self, name: str) -> Op:
        """The op called ``name``; :class:`OpError` naming it when no plugin registered it."""
        op = self._lookup(name)
        if op is not None:
            return op
        reason = self.unknown_reason(name)
        if reason is not None and name not in self._unresolved:
            raise UnknownOpError(f"op {name!r} is {reason}")
        if reason is not None:
            raise UnknownOpError(f"unknown op {name!r}: {reason}")
        close = self.closest(name)
        guess = f"; did you mean {close!r}?" if close is not None else ""
        raise UnknownOpError(f"unknown op {name!r}: no loaded plugin registers it{guess} (see `graphsvc ops`)")

    def closest(self, name: object) -> str | None:
        """The registered name most like ``name`` (:func:`difflib.get_close_matches`), if one is
        close enough to be a likely misspelling of it; ``None`` otherwise."""
        if not isinstance(name, str):
            return None
        import difflib

        known = [*self._ops, *(tag for tag, op in self._resolved.items() if op is not None)]
        close = difflib.get_close_matches(name, known, n=1)
        return close[0] if close else None

    def record_sources(self, graph: Any) -> None:
        """Give each op tag of ``graph`` that names no plugin the plugin and version this registry
        replays it with (tags it does not know keep none: a file then says "unknown")."""
        from graphsvc.graph import OpSource

        for tag in graph.op_table:
            if tag in self and not (graph.op_sources.get(tag) or OpSource()).plugin:
                op = self.get(tag)
                graph.op_sources[tag] = OpSource(op.plugin, op.plugin_version)

    def __contains__(self, name: object) -> bool:
        return self._lookup(name) is not None

    def __iter__(self) -> Iterator[Op]:
        """The ops registered by name, by name (not those the families made)."""
        return iter([self._ops[name] for name in sorted(self._ops)])

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        families = f" and {counted(len(self._families), 'op family', plural='op families')}" if self._families else ""
        return f"<OpRegistry of {counted(len(self._ops), 'op')}{families}>"


def duplicate_family_message(first: OpFamily, second: OpFamily) -> str:
    """The error for a second family of ``first.prefix``: it names both plugins."""
    if (first.plugin, first.plugin_version) == (second.plugin, second.plugin_version):
        return f"op family {first.name!r} is registered twice by {first.source} (the first one is kept)"
    return f"op family {first.name!r} is registered by both {first.source} and {second.source} (the first one is kept)"


def duplicate_message(first: Op, second: Op) -> str:
    """The error for a second registration of ``first.name``: it names both plugins."""
    if (first.plugin, first.plugin_version) == (second.plugin, second.plugin_version):
        return f"op {first.name!r} is registered twice by {first.source} (the first one is kept)"
    return f"op {first.name!r} is registered by both {first.source} and {second.source} (the first one is kept)"


# -- telling the user's Ctrl-C from a KeyboardInterrupt that plugin code raises ------------------
class UserInterrupt(KeyboardInterrupt):
    """The user's Ctrl-C (SIGINT) while :func:`interrupts_told_apart` was active: it stops the tool,
    where a ``KeyboardInterrupt`` that plugin code raises itself is that plugin's failure."""


def _raise_user_interrupt(signum: int, frame: FrameType | None) -> None:
    raise UserInterrupt


class interrupts_told_apart:  # a context manager, named as the function it was
    """While plugin code runs, make SIGINT raise :class:`UserInterrupt`.

    A ``KeyboardInterrupt`` raised synchronously by a plugin (at import, in its hook, in an op) is
    then a plugin failure like any other exception, while the user's Ctrl-C still stops the tool.
    It acts only in the main thread (the only one Python delivers signals to) and only when SIGINT
    has Python's default handler; nested uses cost a lookup. Without it (another handler installed),
    a plain ``KeyboardInterrupt`` is taken to be the user's, never swallowed.

    Every tensor replay enters it twice, so it calls ``_signal``'s functions: ``signal.signal`` and
    ``signal.getsignal`` are the same calls wrapped in enum conversions that cost ~4 us each.
    """

    __slots__ = ("_installed",)

    def __init__(self) -> None:
        self._installed: bool | None = None  # None: not entered

    def __enter__(self) -> None:
        if self._installed is not None:
            raise RuntimeError("interrupts_told_apart() is entered once; make a new one for each with-block")
        self._installed = (
            threading.current_thread() is threading.main_thread()
            and _signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if self._installed:
            _signal.signal(signal.SIGINT, _raise_user_interrupt)

    def __exit__(self, *exc_info: object) -> None:
        if self._installed:
            _signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = None


def is_user_interrupt(exc: BaseException) -> bool:
    """Did ``exc``, raised while plugin code ran, come from the user's Ctrl-C? Everything else
    (``SystemExit``, ``GeneratorExit``, a ``KeyboardInterrupt`` the plugin raised, any exception) is
    the plugin's failure."""
    if isinstance(exc, UserInterrupt):
        return True
    if not isinstance(exc, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        return False
    handler = signal.getsignal(signal.SIGINT)
    if handler == signal.SIG_IGN:  # Ctrl-C cannot arrive (nohup, a background job): the plugin raised it
        return False
    return handler is not _raise_user_interrupt  # nobody told them apart


def describe_exception(exc: BaseException) -> str:
    """``"ValueError: text"`` for a message, the text cut to :data:`EXCEPTION_CHARS`."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be printed)"
    name = type(exc).__name__
    return f"{name}: {shorten(text, EXCEPTION_CHARS)}" if text else name


# -- calling an op over many nodes at once -------------------------------------------------------
def evaluate(op: Op, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """Run ``op.forward`` on ``m`` nodes at once.

    ``inputs`` holds ``op.arity`` float64 arrays of the same length ``m``; the result is a float64
    array of length ``m``. It may be read-only or share memory with an input (a scalar result is
    broadcast), so do not change it in place. Raises :class:`ReplayError` naming the op and its plugin.
    """
    m = _length(op, inputs)
    with np.errstate(all="ignore"), interrupts_told_apart():
        if op.vectorized:
            result = _call(op, "forward", inputs, attrs)
            return _as_column(op, "forward", result, m)
        column = np.empty(m, dtype=np.float64)
        forward = op.forward
        assert forward is not None
        for i, args in enumerate(zip(*(x.tolist() for x in inputs), strict=True)):
            column[i] = _as_float(op, "forward", _call_one(op, "forward", forward, args, attrs))
        return column


def evaluate_node(op: Op, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> float:
    """:func:`evaluate` for one node: ``inputs`` are one-element float64 arrays; returns its value.

    A vectorized op gets the same call as for a group of nodes (one-element arrays, never numpy
    scalars: numpy computes ``x ** 3.0`` with libm's ``pow`` for a scalar but with its own SIMD loop
    for an array on some CPUs, and the two can differ in the last bit), so a node replayed on its
    own gets the bits it gets in a group. Only the fast path's checks are inline. The caller holds
    ``np.errstate(all="ignore")`` and :func:`interrupts_told_apart` (replay does, once per replay).
    """
    forward = op.forward
    assert forward is not None
    vectorized = op.vectorized
    try:  # _call_one, inlined: this runs once per node along a deep chain
        result = forward(*inputs, **attrs) if vectorized else forward(*[float(x[0]) for x in inputs], **attrs)
    except BaseException as exc:
        if is_user_interrupt(exc):
            raise
        raise _call_failure(op, "forward", exc) from exc
    if not vectorized:
        return _as_float(op, "forward", result)
    if type(result) is np.ndarray and result.dtype == _FLOAT64 and result.shape == (1,):
        return result[0]
    return _as_column(op, "forward", result, 1)[0]


def local_derivatives(
    op: Op, inputs: Sequence[np.ndarray], out: np.ndarray, attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """Run ``op.derivatives`` on ``m`` nodes at once: ``op.arity`` float64 arrays of length ``m``.

    Entry ``i`` holds ``d out / d input_i`` for every node. The same rules as :func:`evaluate` apply.
    """
    m = _length(op, inputs)
    with np.errstate(all="ignore"), interrupts_told_apart():
        if op.vectorized:
            result = _call(op, "derivatives", [*inputs, out], attrs)
            return [_as_column(op, "derivatives", d, m) for d in _partials(op, result)]
        columns = [np.empty(m, dtype=np.float64) for _ in range(op.arity)]
        derivatives = op.derivatives
        assert derivatives is not None
        for i, args in enumerate(zip(*(x.tolist() for x in inputs), out.tolist(), strict=True)):
            partials = _partials(op, _call_one(op, "derivatives", derivatives, args, attrs))
            for column, d in zip(columns, partials, strict=True):
                column[i] = _as_float(op, "derivatives", d)
        return columns


_FLOAT64 = np.dtype(np.float64)
#: numpy kinds that are real numbers: bool, signed and unsigned integers, floats.
_REAL_KINDS = frozenset("biuf")


def _length(op: Op, inputs: Sequence[np.ndarray]) -> int:
    if op.arity == 0 or op.forward is None:
        raise ReplayError(f"op {op.name!r} ({op.source}) is a leaf tag: it has no forward or derivatives")
    if op.derivatives is None:
        raise ReplayError(f"op {op.name!r} ({op.source}) gives a vjp, not elementwise derivatives")
    if len(inputs) != op.arity:
        raise ReplayError(f"op {op.name!r} ({op.source}) takes {counted(op.arity, 'input')}, got {len(inputs)}")
    return len(inputs[0])


def _call(op: Op, what: str, args: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    function = op.forward if what == "forward" else op.derivatives
    assert function is not None
    return _call_one(op, what, function, args, attrs)


def _call_one(op: Op, what: str, function: Callable[..., Any], args: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    try:
        return function(*args, **attrs)
    except BaseException as exc:  # sys.exit and a KeyboardInterrupt of the plugin's own are its failures too
        if is_user_interrupt(exc):
            raise
        raise _call_failure(op, what, exc) from exc


def _call_failure(op: Op, what: str, exc: BaseException) -> ReplayError:
    return ReplayError(f"op {op.name!r} ({op.source}): {op.message_name(what)} raised {describe_exception(exc)}")


def _partials(op: Op, result: Any) -> Sequence[Any]:
    # A bare array is refused: for a unary op it would be read as one partial per node.
    if not isinstance(result, (tuple, list)):
        raise ReplayError(
            f"op {op.name!r} ({op.source}): derivatives returned {type(result).__name__}, "
            f"expected a tuple of {op.arity} partial derivatives"
        )
    if len(result) != op.arity:
        raise ReplayError(
            f"op {op.name!r} ({op.source}): derivatives returned {len(result)} partial derivatives, expected {op.arity}"
        )
    return result


def _as_column(op: Op, what: str, result: Any, m: int) -> np.ndarray:
    if type(result) is np.ndarray and result.dtype == _FLOAT64:
        array = result
    else:
        # numpy would parse a string ("1.5") and call float() on objects if asked for float64
        # directly; only arrays (and scalars) of real numbers are results.
        try:
            array = np.asarray(result)
        except BaseException as exc:
            raise_unreadable(op, what, result, exc)
            array = np.empty(0, dtype=object)  # not numbers: said below
        try:
            if array.dtype.kind not in _REAL_KINDS:
                raise TypeError(array.dtype)
            array = array.astype(np.float64, copy=False)
        except Exception:  # ragged lists, objects numpy cannot convert, complex, strings
            if isinstance(result, int) and not isinstance(result, bool):
                raise ReplayError(
                    f"op {op.name!r} ({op.source}): {what} returned an integer out of float64's range"
                ) from None
            kind = f"ndarray of {result.dtype}" if isinstance(result, np.ndarray) else type(result).__name__
            raise ReplayError(f"op {op.name!r} ({op.source}): {what} returned {kind}, not real numbers") from None
    if array.shape == (m,):
        return array
    if array.ndim == 0 or array.shape == (1,):
        return np.broadcast_to(array.reshape(()), (m,))
    raise ReplayError(
        f"op {op.name!r} ({op.source}): {what} returned an array of shape {array.shape}, expected ({m},) or a scalar"
    )


def raise_unreadable(op: Op, what: str, result: Any, exc: BaseException) -> None:
    """What ``np.asarray(result)`` raising ``exc`` is: the user's Ctrl-C, raised again; a
    ReplayError naming the op and the exception for an array-like whose ``__array__`` (or buffer,
    or ``__array_interface__``) raised, or for any ``BaseException`` that is not an ``Exception``
    (``SystemExit``); else (a ragged list) nothing: the caller says the result is not numbers."""
    if is_user_interrupt(exc):
        raise exc
    array_like = any(hasattr(type(result), name) for name in _ARRAY_PROTOCOLS)
    if array_like or not isinstance(exc, Exception):
        raise ReplayError(
            f"op {op.name!r} ({op.source}): {op.message_name(what)} returned {type(result).__name__}, "
            f"which raised {describe_exception(exc)} when read as an array"
        ) from exc


_ARRAY_PROTOCOLS = ("__array__", "__array_interface__", "__array_struct__", "__buffer__", "__dlpack__")


def _as_float(op: Op, what: str, value: Any) -> float:
    if type(value) is float:
        return value
    real = isinstance(value, (numbers.Real, np.bool_)) or (
        isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in _REAL_KINDS
    )
    if real:
        try:
            return float(value)
        except OverflowError:
            raise ReplayError(
                f"op {op.name!r} ({op.source}): {what} returned a number out of float64's range"
            ) from None
        except Exception:  # a numbers.Real whose __float__ fails
            pass
    raise ReplayError(
        f"op {op.name!r} ({op.source}): {what} returned {type(value).__name__}, not a float "
        "(a per-element op returns Python floats)"
    )


def expect_registry(registry: object) -> None:
    """The TypeError of a public function given a ``registry`` that is neither None nor an
    :class:`OpRegistry` (a tuple: :func:`graphsvc.load_registry`'s pair, not unpacked)."""
    if registry is None or isinstance(registry, OpRegistry):
        return
    hint = (
        ": graphsvc.load_registry() returns a pair, registry, problems = graphsvc.load_registry()"
        if isinstance(registry, tuple)
        else ""
    )
    raise TypeError(f"registry must be an OpRegistry, not {type(registry).__name__}{hint}")


# -- the VJPs derived from an op's derivatives, and broadcasting undone -----------------------------------
def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the dimensions that broadcasting added to or stretched in an input of ``shape``
    (autograd's ``unbroadcast``): the gradient of that input."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = _leading_sum(g, extra)
    stretched = tuple(axis for axis, size in enumerate(shape) if size == 1 and g.shape[axis] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g


def _leading_sum(g: np.ndarray, axes: int) -> np.ndarray:
    """``g`` summed over its first ``axes`` axes. A C-contiguous float array goes through BLAS, as a
    row of ones times the matrix of its rows (a bias's gradient: for 512x512 float32, 22 us against
    52 for ``sum(axis=0)``, which adds the rows one after the other too)."""
    if g.dtype.kind != "f" or not g.flags.c_contiguous or g.size == 0:
        return g.sum(axis=tuple(range(axes)))
    rows = math.prod(g.shape[:axes])
    return np.matmul(np.ones(rows, dtype=g.dtype), g.reshape(rows, g.size // rows)).reshape(g.shape[axes:])


def elementwise_vjp(op: Op) -> Callable[..., Sequence[Any]]:
    """The VJP of an elementwise op from its local derivatives: ``g * d out/d input_i``, summed
    back to each input's shape."""
    derivatives = op.derivatives
    assert derivatives is not None
    over_arrays = None if op.vectorized else per_element(op, "derivatives")
    from graphsvc.ops import opmath  # the op table: imported by the first op whose VJP is derived

    # An op whose kernel is a primitive with constant derivatives (add, sub, neg) computes what that
    # primitive computes: its partials are those numbers, and need no call per node.
    constants = opmath.constant_partials(op.kernel) if op.kernel in opmath.RULES and op.vectorized else None

    def vjp(
        g: np.ndarray,
        out: np.ndarray,
        *inputs: np.ndarray,
        needs_input_grad: Sequence[bool] | None = None,
        **attrs: Any,
    ) -> list[np.ndarray | None]:
        partials: Any
        if constants is not None and not attrs and len(inputs) == len(constants):
            partials = constants
        elif over_arrays is None:  # a failure is a ReplayError naming the op, as in the column engine
            partials = _call_one(op, "derivatives", derivatives, [*inputs, out], attrs)
        else:
            partials = over_arrays(*inputs, out, **attrs)
        if not isinstance(partials, (tuple, list)) or len(partials) != len(inputs):
            count = len(partials) if isinstance(partials, (tuple, list)) else type(partials).__name__
            raise ReplayError(
                f"op {op.name!r} ({op.source}): derivatives returned {count}, "
                f"expected a tuple of {len(inputs)} partial derivatives"
            )
        wanted = needs_input_grad or (True,) * len(inputs)
        cotangents: list[np.ndarray | None] = []
        for i, d in enumerate(partials):
            if not wanted[i]:
                cotangents.append(None)
                continue
            if type(d) is float and d == 1:  # add's, sub's first: g itself (_times says so, without a call)
                product = g
            else:
                product = _times(g, d) if isinstance(d, (int, float, np.ndarray)) else _times(g, _partial(op, i, d))
                if product.shape != g.shape:  # a partial that broadcasts g to more: not d out/d input
                    raise ReplayError(
                        f"op {op.name!r} ({op.source}): derivatives returned a partial of shape {list(np.shape(d))} "
                        f"for input {i}, where the output's shape is {list(g.shape)}"
                    )
            shape = inputs[i].shape
            cotangents.append(product if product.shape == shape else unbroadcast(product, shape))
        return cotangents

    return vjp


def _partial(op: Op, position: int, partial: Any) -> np.ndarray:
    """A partial derivative that is not a number or an array, as one (a numpy scalar, a list);
    ``None``, a string or an array-like that cannot be read is a ReplayError naming the op."""
    if partial is not None and not isinstance(partial, str):
        try:
            array = np.asarray(partial)
        except BaseException as exc:
            raise_unreadable(op, "derivatives", partial, exc)
        else:
            if array.dtype.kind in _REAL_KINDS:
                return array
    raise ReplayError(
        f"op {op.name!r} ({op.source}): derivatives returned {type(partial).__name__} for input {position}, "
        "not real numbers"
    )


def _times(g: np.ndarray, partial: Any) -> np.ndarray:
    """``g * partial`` in ``g``'s dtype: a partial of 1.0 (``add``) or a float64 array (``max``'s
    tie rule) must not turn a float32 gradient into float64."""
    if isinstance(partial, (int, float)):
        if partial == 1:
            return g
        if partial == -1:
            return -g
        return g * partial
    if partial.dtype == g.dtype or partial.dtype == bool:  # the product is in g's dtype already
        return np.multiply(g, partial)
    return np.multiply(g, partial, dtype=g.dtype)


def per_element(op: Op, what: str) -> Callable[..., Any]:
    """A per-element op's ``forward`` (``what="forward"``) or ``derivatives`` over arrays that
    broadcast: the elements go through :func:`graphsvc.ops.evaluate` / ``local_derivatives`` (the
    column engine's per-element loop and its checks of what the op returns), the results come back
    in the inputs' shape and float dtype (float32 stays float32; integers give float64)."""

    def over_arrays(*args: np.ndarray, **attrs: Any) -> Any:
        floats = [a.dtype for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
        dtype = np.result_type(*floats) if floats else np.dtype(np.float64)
        arrays = np.broadcast_arrays(*args)
        shape = arrays[0].shape
        columns = [np.array(a, dtype=np.float64).reshape(-1) for a in arrays]
        if what == "forward":
            return evaluate(op, columns, attrs).reshape(shape).astype(dtype)
        partials = local_derivatives(op, columns[:-1], columns[-1], attrs)
        return tuple(np.asarray(d).reshape(shape).astype(dtype) for d in partials)

    return over_arrays
