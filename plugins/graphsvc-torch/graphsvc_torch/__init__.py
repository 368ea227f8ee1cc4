"""graphsvc-torch: graphsvc ops that call PyTorch, for the nodes of a captured PyTorch step that
graphsvc has no builtin op for.

- The op family ``aten.``: a node tagged with an ATen operator's name (``aten.embedding.default``,
  ``aten.mkldnn_rnn_layer.default``: ``str(func)`` of the ``OpOverload``), its call in its
  attributes as :mod:`graphsvc.torch.calls` writes them (``args``, ``kwargs``, ``output``), is
  replayed by calling ``torch.ops.aten.NAME.OVERLOAD`` on its inputs; its VJP is PyTorch's
  autograd of that same call.
- :func:`function_op`: the op of a custom ``torch.autograd.Function``, tagged by its qualified name
  (``module.QualName``, the tag a capture records), for a plugin author to register.

Loading the plugin does not import PyTorch (every graphsvc command loads plugins). The family's
resolver checks a tag when a graph first uses it (``validate``, a replay): a name that is not
``aten.NAME.OVERLOAD`` is refused at once; where PyTorch cannot be imported, the tag is refused
with ``pip install torch==2.13.0`` (exit code 4, as for any op that is not here); otherwise PyTorch
is imported there, once, and a tag that names no operator of this PyTorch is refused by name, as
is one a node cannot be (:func:`_refused`: an operator that takes no tensor, such as ``from_file``
or ``_print``, writes into an ``out=`` argument, returns no tensor or returns uninitialized memory),
so a graph file can only make a replay compute tensors from its own arrays.

How a node runs (forward): each input array becomes a C-contiguous tensor sharing its memory where
the array is C-contiguous (``torch.from_numpy``, dtype kept; a strided view is copied, see
:func:`_tensor`; an operator that writes into its arguments gets copies), the call is decoded
(:func:`graphsvc.torch.calls.decode_call`), refused when an output would be above graphsvc's limit
on one array (the same call on PyTorch's ``meta`` device gives its shapes first:
:meth:`_Call._refuse_large`) and made without autograd, output ``output`` is picked from an operator
that returns several, and the tensor comes back as a numpy array sharing its memory (copied only to
make it contiguous, or off another device). The VJP makes the same call with autograd on, the
floating-point inputs that need a gradient requiring one, and returns ``torch.autograd.grad(out,
inputs, g, allow_unused=True)``: ``None`` for an input that gets no gradient (an integer index),
zeros for a floating one the output does not depend on. A replay that goes on to a backward pass
makes the call once, with autograd on (``forward_with_residuals``), and the VJP uses the graph
PyTorch kept, as PyTorch's own backward does.
"""

from __future__ import annotations

import re
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op, OpError, OpFamily

__version__ = "0.1.0"
__all__ = ["PREFIX", "TORCH_INSTALL", "aten_op", "function_op"]

#: The tags this plugin's family serves.
PREFIX = "aten."
#: What to run where PyTorch is missing.
TORCH_INSTALL = "pip install torch==2.13.0"
_ATEN_TAG = re.compile(r"aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")


# -- the family: PyTorch's operators ---------------------------------------------------------------
def aten_op(tag: str) -> Op:
    """The op of the ATen operator ``tag`` (``aten.NAME.OVERLOAD``): the family's resolver.
    Raises :class:`~graphsvc.errors.OpError` with the reason for a tag it cannot serve."""
    match = _ATEN_TAG.match(tag)
    if match is None:
        raise OpError(f"{tag!r} is not the name of a PyTorch operator, aten.NAME.OVERLOAD (aten.embedding.default)")
    try:
        import torch
    except ImportError:
        raise OpError(f"replaying {tag} needs PyTorch, which cannot be imported here: {TORCH_INSTALL}") from None
    name, overload = match.groups()
    try:
        packet = getattr(torch.ops.aten, name)
    except Exception:  # AttributeError: no such operator
        raise OpError(f"PyTorch {torch.__version__} has no operator aten.{name}") from None
    if overload not in packet.overloads():
        known = ", ".join(sorted(packet.overloads()))
        raise OpError(f"PyTorch {torch.__version__}'s aten.{name} has no overload {overload!r} (it has: {known})")
    function = getattr(packet, overload)
    schema = function._schema
    refused = _refused(schema)
    if refused:
        raise OpError(f"{tag} is not replayed: {refused}")
    tags = set(function.tags)
    call = _Call(
        tag,
        function,
        mutable=bool(schema.is_mutable),
        sized=True,
        dynamic=torch.Tag.dynamic_output_shape in tags,
        random=torch.Tag.nondeterministic_seeded in tags,
    )
    return Op(
        tag,
        1,
        forward=call.forward,
        vjp=call.vjp,
        forward_with_residuals=call.forward_with_residuals,
        variadic=True,
        doc=f"PyTorch's {schema}, replayed by PyTorch (graphsvc-torch; its VJP by autograd).",
    )


def _refused(schema: Any) -> str | None:
    """Why an operator is not replayed, or None: a node computes tensors from tensors, and a graph
    file is data, so an operator that takes no tensor (a factory, ``from_file`` reading a file,
    ``_print`` writing to the terminal), writes into an ``out=`` argument, returns no tensor or
    returns uninitialized memory (``empty_like``, ``new_empty``, ``resize`` growing a tensor: the
    process's old bytes) is not
    called for a node (a capture records none of them: a factory's value is a const, ``out=`` calls
    are refused)."""
    arguments = list(schema.arguments)
    name = schema.name.removeprefix("aten::")
    if name.startswith(("empty", "new_empty", "_empty")):
        return "it returns uninitialized memory (a capture records an empty tensor's value as a const)"
    if name.startswith(("resize", "_resize")):
        return "it returns uninitialized memory where it grows a tensor"
    if any(a.is_out for a in arguments):
        return "it writes into an out= argument (a node's op returns its result)"
    if not any(_is_tensor_type(a.type) for a in arguments):
        return "it takes no tensor (a factory's value is a const in a captured graph)"
    if not any(_is_tensor_type(r.type) for r in schema.returns):
        return "it returns no tensor"
    return None


def _is_tensor_type(kind: Any) -> bool:
    """Whether a schema type is a tensor, an optional one or a list of either (``Tensor``,
    ``Optional[Tensor]``, ``List[Tensor]``, ``List[Optional[Tensor]]``)."""
    return "Tensor" in str(kind)


@hookimpl
def graphsvc_register_op_families(register: Callable[[OpFamily], None]) -> None:
    register(
        OpFamily(
            PREFIX,
            aten_op,
            doc=f"PyTorch's operators (aten.NAME.OVERLOAD), replayed by PyTorch ({TORCH_INSTALL}).",
        )
    )


# -- custom autograd Functions -----------------------------------------------------------------------
def function_op(function: type, name: str | None = None, *, doc: str | None = None) -> Op:
    """The op of the custom ``torch.autograd.Function`` ``function``: its forward is
    ``function.apply`` on the node's inputs as tensors, its VJP PyTorch's autograd through it (so
    through the Function's own ``backward``). Tagged ``name``, by default the Function's qualified
    name ``module.QualName``, the tag a capture records for it. A node may give ``args`` (and
    ``kwargs``) as :mod:`graphsvc.torch.calls` writes them, for a Function that takes more than
    tensors, and ``output`` for one that returns several. Register it in your plugin's hook::

        @hookimpl
        def graphsvc_register_ops(register):
            register(function_op(Multiply))
    """
    apply = getattr(function, "apply", None)
    if not isinstance(function, type) or not callable(apply):
        raise TypeError(f"function_op() takes a torch.autograd.Function subclass, not {function!r}")
    tag = name if name is not None else f"{function.__module__}.{function.__qualname__}"
    call = _Call(tag, apply, mutable=False)
    return Op(
        tag,
        1,
        forward=call.forward,
        vjp=call.vjp,
        forward_with_residuals=call.forward_with_residuals,
        variadic=True,
        doc=doc if doc is not None else f"The torch.autograd.Function {tag}, replayed by PyTorch (graphsvc-torch).",
    )


# -- one call of a PyTorch function, forward and backward --------------------------------------------
class _Call:
    """Calls ``function`` (an ATen ``OpOverload`` or a Function's ``apply``) on a node's inputs."""

    def __init__(
        self,
        tag: str,
        function: Callable[..., Any],
        *,
        mutable: bool,
        sized: bool = False,
        dynamic: bool = False,
        random: bool = False,
    ) -> None:
        self.tag = tag
        self.function = function
        self.mutable = mutable  # it writes into arguments: give it copies
        self.sized = sized  # an ATen operator: its outputs' sizes are known before it runs (_refuse_large)
        self.dynamic = dynamic  # its outputs' sizes depend on its inputs' values (nonzero, bincount)
        self.random = random  # it draws random numbers: two calls differ, none is shared
        # the last call made for a backward pass, for the nodes of its other outputs (_shared)
        self._last: tuple[tuple[Any, ...], list[weakref.ref[Any]], weakref.ref[_Made]] | None = None

    def __repr__(self) -> str:
        return f"<graphsvc_torch call of {self.tag}>"

    def _run(self, tensors: Sequence[Any], args: Any, kwargs: Any, output: Any) -> Any:
        return _pick(self.tag, self._call(tensors, args, kwargs), output)

    def _call(self, tensors: Sequence[Any], args: Any, kwargs: Any) -> Any:
        """The call's whole result (every output of one that returns several)."""
        if self.sized:
            self._refuse_large(tensors, args, kwargs)
        positional, keywords = _arguments(tensors, args, kwargs)
        return self.function(*positional, **keywords)

    def _refuse_large(self, tensors: Sequence[Any], args: Any, kwargs: Any) -> None:
        """Refuse the call before it runs when an output would be above graphsvc's limit on one
        array (``GRAPHSVC_MAX_ARRAY_BYTES``): the same call on PyTorch's ``meta`` device, which
        works out shapes and dtypes without memory or arithmetic (a node's ``repeat`` of a small
        input by ``[100000, 100000]`` would otherwise allocate 160 GB before graphsvc sees the
        result). An operator without a meta kernel, or whose output's size depends on its values
        (``nonzero``), runs unchecked: graphsvc checks what it returns."""
        from graphsvc.replay.arrays import array_limit, too_large

        torch = _torch(self.tag)
        limit = array_limit()
        meta = [torch.empty_like(t, device="meta") for t in tensors]
        try:
            positional, keywords = _arguments(meta, args, kwargs)  # the call _call makes, on meta tensors
            on_meta = torch.device("meta")  # a device argument too: nothing runs on the CPU here
            positional = [on_meta if isinstance(a, torch.device) else a for a in positional]
            keywords = {k: on_meta if isinstance(v, torch.device) else v for k, v in keywords.items()}
            result = self.function(*positional, **keywords)
        except Exception:  # no meta kernel, a size known only from values, or a bad call (it fails next)
            if self.dynamic:
                self._refuse_by_values(torch, tensors, limit)
            return
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        for t in [u for o in outputs for u in (o if isinstance(o, (tuple, list)) else [o])]:  # a list among them
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > limit:
                dtype = str(t.dtype).removeprefix("torch.")
                raise ValueError(f"{self.tag} {too_large('asks for', t.shape, dtype, t.element_size(), limit)}")

    def _refuse_by_values(self, torch: Any, tensors: Sequence[Any], limit: int) -> None:
        """Refuse a call whose outputs' sizes depend on its inputs' values (``dynamic_output_shape``)
        when its integer inputs could ask for more than ``limit`` bytes: their magnitudes summed
        bound what such an operator makes from them (``bincount``'s largest value, ``repeat_interleave``'s
        repeats); a mask or a float input gives at most its own size."""
        from graphsvc.replay.arrays import ARRAY_LIMIT_ENV, byte_size

        total = 0
        for t in tensors:
            if not t.dtype.is_floating_point and t.dtype != torch.bool and t.numel():
                total += int(t.detach().abs().sum(dtype=torch.float64).item())
        if total * 8 > limit:
            raise ValueError(
                f"{self.tag} may ask for {total:,} elements ({byte_size(total * 8)}, its integer inputs' values), "
                f"more than the limit of {byte_size(limit)} on one array ({ARRAY_LIMIT_ENV})"
            )

    def forward(self, *inputs: np.ndarray, args: Any = None, kwargs: Any = None, output: Any = None) -> np.ndarray:
        torch = _torch(self.tag)
        # no autograd to turn off: tensors made from arrays do not require a gradient
        tensors = [_tensor(torch, x, copy=self.mutable) for x in inputs]
        return _array(torch, self._run(tensors, args, kwargs, output))

    def _recorded(
        self, torch: Any, inputs: Sequence[np.ndarray], wanted: Sequence[bool], args: Any, kwargs: Any
    ) -> tuple[list[Any], Any]:
        """The call made with autograd on, the ``wanted`` inputs requiring a gradient: the input
        tensors (autograd's leaves) and the whole result."""
        leaves = [_tensor(torch, x, copy=False) for x in inputs]
        leaves = [t.detach().requires_grad_(True) if w else t for t, w in zip(leaves, wanted, strict=True)]
        # an operator that writes into its arguments gets copies (autograd refuses in-place
        # changes of a leaf that requires grad, and the inputs are graphsvc's own)
        tensors = [t.clone() if self.mutable else t for t in leaves]
        with torch.enable_grad():
            return leaves, self._call(tensors, args, kwargs)

    def forward_with_residuals(
        self, *inputs: np.ndarray, args: Any = None, kwargs: Any = None, output: Any = None
    ) -> tuple[np.ndarray, tuple[list[Any], Any, _Made]]:
        """:meth:`forward` for a replay that goes on to a backward pass: the call made once, with
        autograd on (every floating-point input requiring a gradient), its graph kept for the VJP.
        The nodes of an operator's several outputs (an LSTM layer's sequence and last states) share
        one call: a node whose call, inputs (the same read-only arrays, as a replay gives them) and
        arguments are those of a call whose outputs other nodes still hold, and whose output no node
        has picked yet, picks it from that call (never a random operator's: two calls differ)."""
        torch = _torch(self.tag)
        key = None if self.random else self._key(inputs, args, kwargs)
        made = None if key is None else self._shared(key, inputs)
        if made is not None and (not isinstance(output, int) or output in made.taken):  # another call
            made = None
        if made is None:
            made = _Made(*self._recorded(torch, inputs, [_floating(x) for x in inputs], args, kwargs))
            if key is not None and isinstance(made.result, (tuple, list)):
                self._last = (key, [weakref.ref(x) for x in inputs], weakref.ref(made))
        result = _pick(self.tag, made.result, output)
        made.taken.add(output)
        return _array(torch, result), (made.leaves, result, made)

    @staticmethod
    def _key(inputs: Sequence[np.ndarray], args: Any, kwargs: Any) -> tuple[Any, ...] | None:
        """What makes two calls the same call: the same input arrays, read-only (nothing changed
        them in between), and the same arguments; None when an input may change."""
        if not all(type(x) is np.ndarray and not x.flags.writeable for x in inputs):
            return None
        return (tuple(map(id, inputs)), repr(args), repr(kwargs))

    def _shared(self, key: tuple[Any, ...], inputs: Sequence[np.ndarray]) -> _Made | None:
        """The last call's result when ``key`` is its key, its inputs are still those arrays (an id
        is reused only once its array is gone) and a node still holds its result."""
        if self._last is None or self._last[0] != key:
            return None
        _, refs, made = self._last
        if not all(ref() is x for ref, x in zip(refs, inputs, strict=True)):
            return None
        return made()

    def vjp(
        self,
        g: np.ndarray,
        out: np.ndarray,
        *inputs: np.ndarray,
        args: Any = None,
        kwargs: Any = None,
        output: Any = None,
        needs_input_grad: Sequence[bool] | None = None,
        residuals: tuple[list[Any], Any, _Made] | None = None,
    ) -> list[np.ndarray | None]:
        torch = _torch(self.tag)
        needs = needs_input_grad if needs_input_grad is not None else (True,) * len(inputs)
        wanted = [bool(need) and _floating(x) for x, need in zip(inputs, needs, strict=True)]
        if not any(wanted):
            return [None] * len(inputs)
        shared = False  # another output's node may go back through the same autograd graph
        if residuals is None:  # not computed by forward_with_residuals in this replay: make the call again
            leaves, whole = self._recorded(torch, inputs, wanted, args, kwargs)
            result = _pick(self.tag, whole, output)
        else:
            leaves, result, made = residuals
            shared = isinstance(made.result, (tuple, list))
        sources = [t for t, w in zip(leaves, wanted, strict=True) if w]
        if isinstance(result, torch.Tensor) and result.requires_grad:
            seed = _tensor(torch, g, copy=False).to(result.dtype)
            grads = list(
                torch.autograd.grad(result, sources, grad_outputs=seed, allow_unused=True, retain_graph=shared)
            )
        else:  # an output that does not depend on any input differentiably (an index, a mask)
            grads = [None] * len(sources)
        found = iter(grads)
        cotangents: list[np.ndarray | None] = []
        for x, want in zip(inputs, wanted, strict=True):
            if not want:
                cotangents.append(None)
                continue
            grad = next(found)
            cotangents.append(np.zeros_like(np.asarray(x)) if grad is None else _array(torch, grad))
        return cotangents


def _arguments(tensors: Sequence[Any], args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """A node's call: the positional and keyword arguments its attributes describe (the tensors
    alone where it has none)."""
    if args is None and not kwargs:
        return list(tensors), {}
    return _decode_call()({"args": args or [], "kwargs": kwargs or {}}, tensors)


class _Made:
    """One call made for a backward pass: autograd's leaves and the whole result. The nodes of its
    outputs hold it in their residuals; :class:`_Call` keeps a weak reference, so it goes when they
    do."""

    __slots__ = ("__weakref__", "leaves", "result", "taken")

    def __init__(self, leaves: list[Any], result: Any) -> None:
        self.leaves = leaves
        self.result = result
        self.taken: set[Any] = set()  # the outputs nodes have picked: a second pick is another call


def _floating(x: Any) -> bool:
    return bool(np.asarray(x).dtype.kind == "f")


def _torch(tag: str) -> Any:
    """PyTorch, imported; an error naming ``tag`` and what to install where it is missing."""
    try:
        import torch
    except ImportError as exc:
        raise ModuleNotFoundError(f"replaying {tag} needs PyTorch ({exc}): {TORCH_INSTALL}") from None
    return torch


def _tensor(torch: Any, x: Any, *, copy: bool) -> Any:
    """A C-contiguous tensor of ``x``'s dtype, sharing its memory where ``x`` is C-contiguous
    (``copy``: a writable copy of its own). A graph's arrays carry no memory layout (a capture records
    ``clone`` and ``contiguous`` as the value they copy; a replayed transpose is a strided view), and
    some operators read their input as if it were contiguous whatever its strides
    (``mkldnn_rnn_layer``: a transposed input gives another sequence): each operator gets its inputs
    in the layout every operator accepts."""
    array = np.asarray(x, order="C")  # the array itself where it is C-contiguous; a copy otherwise
    if copy:
        return torch.from_numpy(np.array(array))
    global _warned
    if _warned or array.flags.writeable:
        return torch.from_numpy(array)
    # PyTorch warns once per process that a read-only array (graphsvc's inputs are) is not
    # writable; nothing writes into it here, so that once is silenced
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    _warned = True
    return tensor


_warned = False  # PyTorch's one warning about a read-only array has been given (and silenced)
_decoder: Callable[..., tuple[list[Any], dict[str, Any]]] | None = None


def _decode_call() -> Callable[..., tuple[list[Any], dict[str, Any]]]:
    """:func:`graphsvc.torch.calls.decode_call`, imported on first use."""
    global _decoder
    if _decoder is None:
        from graphsvc.torch.calls import decode_call

        _decoder = decode_call
    return _decoder


def _pick(tag: str, result: Any, output: Any) -> Any:
    """The output the node holds: ``result`` itself, or its ``output``-th element for a call that
    returns several (``output`` must then be given)."""
    if isinstance(result, (tuple, list)):
        if output is None:
            raise ValueError(f"{tag} returns {len(result)} outputs: the node must say which it holds (output)")
        if isinstance(output, bool) or not isinstance(output, int) or not 0 <= output < len(result):
            last = len(result) - 1
            raise ValueError(f"{tag} returns {len(result)} outputs, so output must be 0 to {last}, not {output!r}")
        return result[output]
    if output not in (None, 0) or isinstance(output, bool):
        raise ValueError(f"{tag} returns one output, so output must be 0 or left out, not {output!r}")
    return result


def _array(torch: Any, result: Any) -> np.ndarray:
    """A tensor as a contiguous numpy array sharing its memory where it can (on the CPU, not
    conjugated or negated lazily); anything else as an array."""
    if not isinstance(result, torch.Tensor):
        return np.asarray(result)
    tensor = result.detach() if result.requires_grad else result
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.numpy()
