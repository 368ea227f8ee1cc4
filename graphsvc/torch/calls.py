"""How a captured call of a PyTorch operator is written into a node's attributes, and read back.

A node whose op graphsvc has no builtin for keeps PyTorch's name as its tag
(``aten.mkldnn_rnn_layer.default``: ``str(torch.ops.aten.mkldnn_rnn_layer.default)``) and the call's
arguments as attributes, so the ``graphsvc-torch`` plugin can call the same operator again:

``args``
    the positional arguments, in order; each tensor argument is replaced by ``{"input": k}``, the
    node's k-th parent (a list of tensors becomes a list of such markers).
``kwargs``
    the keyword arguments, the same way (left out when there are none).
``output``
    for an operator that returns several tensors, which of them the node holds (left out for one).

Other arguments are kept as they are when they are data (``None``, bool, int, float, str, and lists
of them); PyTorch's own objects become one-key maps: ``{"dtype": "float32"}``,
``{"device": "cpu"}``, ``{"layout": "strided"}``, ``{"memory_format": "contiguous_format"}``.
Anything else cannot be written and is refused (:class:`UnencodableArgument`) by name.

This module imports no torch: :func:`encode_call` is given the test for a tensor, and
:func:`decode_call` imports torch only when an argument names one of its objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["INPUT", "TORCH_OBJECTS", "UnencodableArgument", "decode_call", "encode_call"]

#: The key of a marker that stands for a tensor argument: ``{"input": k}``.
INPUT = "input"
#: The keys of the markers that stand for PyTorch's own objects, and the torch attribute
#: prefix that names their class (``torch.float32`` is a ``torch.dtype``).
TORCH_OBJECTS = ("dtype", "device", "layout", "memory_format")
_DATA = (bool, int, float, str)


class UnencodableArgument(ValueError):
    """An argument of a call that cannot be written into a graph file (a generator, a Python object)."""


def encode_call(
    args: Sequence[Any], kwargs: Mapping[str, Any], is_tensor: Callable[[Any], bool]
) -> tuple[dict[str, Any], list[Any]]:
    """The attributes (``args``, and ``kwargs`` when there are any) that describe a call, and the
    tensors it was given in the order their markers number them (the node's parents)."""
    tensors: list[Any] = []
    attrs: dict[str, Any] = {"args": [_encode(a, f"argument {i}", tensors, is_tensor) for i, a in enumerate(args)]}
    if kwargs:
        attrs["kwargs"] = {
            key: _encode(value, f"argument {key!r}", tensors, is_tensor) for key, value in kwargs.items()
        }
    return attrs, tensors


def _encode(value: Any, where: str, tensors: list[Any], is_tensor: Callable[[Any], bool]) -> Any:
    """One argument as :func:`encode_call` writes it, its tensors appended to ``tensors`` (a
    function of the module, not a closure that calls itself: such a closure is a reference cycle,
    which would hold the call's tensors until Python's cycle collector runs)."""
    if is_tensor(value):
        tensors.append(value)
        return {INPUT: len(tensors) - 1}
    if value is None or isinstance(value, _DATA):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(item, f"{where}[{i}]", tensors, is_tensor) for i, item in enumerate(value)]
    kind = type(value).__name__
    if type(value).__module__ == "torch" and kind in TORCH_OBJECTS:
        return {kind: str(value).removeprefix("torch.")}
    raise UnencodableArgument(f"{where} is a {type(value).__module__}.{kind}, which a graph file cannot hold")


def decode_call(attrs: Mapping[str, Any], inputs: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments :func:`encode_call` described, with ``inputs`` (the
    node's parents, as tensors) where its markers stand."""
    args = [_decode(a, inputs) for a in attrs.get("args", [])]
    kwargs = {key: _decode(value, inputs) for key, value in attrs.get("kwargs", {}).items()}
    return args, kwargs


def _decode(value: Any, inputs: Sequence[Any]) -> Any:
    if isinstance(value, list):
        return [_decode(item, inputs) for item in value]
    if isinstance(value, dict) and len(value) == 1:
        ((key, item),) = value.items()
        if key == INPUT:
            return inputs[item]
        if key in TORCH_OBJECTS:
            return _torch_object(key, item)
    return value


def _torch_object(kind: str, text: str) -> Any:
    import torch

    if kind == "device":
        return torch.device(text)
    found = getattr(torch, text, None)
    if type(found).__name__ != kind:
        raise UnencodableArgument(f"{{{kind!r}: {text!r}}} names no torch.{kind}")
    return found
