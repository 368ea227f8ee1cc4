"""graphsvc.torch.calls: a call's arguments written into attributes and read back."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from graphsvc.torch.calls import UnencodableArgument, decode_call, encode_call
from tests.conftest import needs_torch


class Tensor:
    """Stands for a tensor: encode_call is told what a tensor is."""

    def __init__(self, name: str) -> None:
        self.name = name


def is_tensor(value: object) -> bool:
    return isinstance(value, Tensor)


def test_tensors_become_numbered_inputs_in_order() -> None:
    a, b = Tensor("a"), Tensor("b")
    attrs, tensors = encode_call([a, [b, a], 2, None, 1.5, "mean", True], {"dim": [0, -1]}, is_tensor)
    assert attrs == {
        "args": [{"input": 0}, [{"input": 1}, {"input": 2}], 2, None, 1.5, "mean", True],
        "kwargs": {"dim": [0, -1]},
    }
    assert tensors == [a, b, a]
    args, kwargs = decode_call(attrs, ["A", "B", "A2"])
    assert args == ["A", ["B", "A2"], 2, None, 1.5, "mean", True]
    assert kwargs == {"dim": [0, -1]}


def test_no_kwargs_key_without_keywords() -> None:
    assert encode_call([1], {}, is_tensor) == ({"args": [1]}, [])


def test_an_object_a_file_cannot_hold_is_refused_by_name() -> None:
    with pytest.raises(UnencodableArgument, match=r"^argument 'generator' is a builtins.object, which a graph file"):
        encode_call([], {"generator": object()}, is_tensor)
    with pytest.raises(UnencodableArgument, match=r"^argument 1\[0\] is a builtins.complex"):
        encode_call([1, [2j]], {}, is_tensor)


def test_importing_the_package_and_the_codec_does_not_import_torch() -> None:
    code = "import sys, graphsvc.torch, graphsvc.torch.calls; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"


def test_torch_objects_round_trip() -> None:
    torch = needs_torch()
    attrs, _ = encode_call(
        [torch.float32], {"device": torch.device("cpu"), "memory_format": torch.contiguous_format}, is_tensor
    )
    assert attrs == {
        "args": [{"dtype": "float32"}],
        "kwargs": {"device": {"device": "cpu"}, "memory_format": {"memory_format": "contiguous_format"}},
    }
    args, kwargs = decode_call(attrs, [])
    assert args == [torch.float32]
    assert kwargs == {"device": torch.device("cpu"), "memory_format": torch.contiguous_format}
    with pytest.raises(UnencodableArgument, match=r"^\{'dtype': 'nope'\} names no torch.dtype$"):
        decode_call({"args": [{"dtype": "nope"}]}, [])


def test_encoding_and_decoding_hold_no_tensor_after_they_return() -> None:
    """No reference cycle keeps a call's tensors until Python's cycle collector runs."""
    gc.disable()
    try:
        a, b = Tensor("a"), Tensor("b")
        refs = [weakref.ref(a), weakref.ref(b)]
        attrs, tensors = encode_call([a, [b, 1]], {"x": [a]}, is_tensor)
        assert decode_call(attrs, tensors) == ([a, [b, 1]], {"x": [a]})
        del a, b, tensors
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
