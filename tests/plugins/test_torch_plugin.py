"""The fourth example plugin, plugins/graphsvc-torch: the op family ``aten.`` replays PyTorch's operators
through PyTorch, forward and VJP equal to PyTorch's own (an LSTM layer's mkldnn_rnn_layer recorded as a
capture records it, its input a strided view too, an embedding with padding_idx, a multi-output
operator's second output, a call with a dtype and a device); function_op makes the op of a custom
autograd.Function (seed 002's); a tensor replay of a saved graph passes --check; loading the plugin
imports no torch; the refusals, word for word."""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsvc
from cli import app
from graphsvc.errors import MissingOpsError, ReplayError, UnknownOpError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.ops import Op, OpRegistry
from graphsvc.pluginhost import load_registry
from graphsvc.testing import check_vjp
from graphsvc.torch.calls import encode_call
from tests.conftest import REQUIRE_TORCH, ROOT, needs_torch

try:
    import graphsvc_torch
except ImportError:
    PLUGIN_MISSING = "needs the graphsvc-torch plugin: pip install ./plugins/graphsvc-torch"
    if os.environ.get(REQUIRE_TORCH) == "1":  # CI installs it with PyTorch
        pytest.fail(f"{PLUGIN_MISSING}; {REQUIRE_TORCH}=1 makes that a failure, not a skip", pytrace=False)
    pytest.skip(PLUGIN_MISSING, allow_module_level=True)

pytestmark = pytest.mark.usefixtures("installed_plugins")
runner = CliRunner()
SOURCE = "graphsvc-torch 0.1.0"


def registry() -> OpRegistry:
    found, problems = load_registry()
    assert problems == []
    return found


def read_only(array: np.ndarray) -> np.ndarray:
    array = np.array(array)
    array.flags.writeable = False
    return array


def record(torch: Any, run: Any) -> list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]]:
    """The ATen calls ``run()`` makes outside autograd's backward, as a capture sees them: (the
    operator, its args, its kwargs, what it returned)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if torch._C._current_autograd_node() is None:
                calls.append((func, args, kwargs, out))
            return out

    with Recorder():
        run()
    return calls


def as_node(torch: Any, func: Any, args: Any, kwargs: Any) -> tuple[Op, dict[str, Any], list[np.ndarray]]:
    """The op, attributes and input arrays of a node recording the call, as a capture writes it."""
    attrs, tensors = encode_call(args, kwargs, lambda value: isinstance(value, torch.Tensor))
    inputs = [read_only(t.detach().numpy()) for t in tensors]
    return registry().get(str(func)), attrs, inputs


# -- the family, without PyTorch ---------------------------------------------------------------------
def test_loading_the_plugin_and_listing_its_family_import_no_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        from graphsvc.pluginhost import load_registry
        registry, problems = load_registry()
        families = [(f.name, f.source, f.doc) for f in registry.families()]
        print(problems, families, "torch" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout == (
        f"[] [('aten.*', '{SOURCE}', \"PyTorch's operators (aten.NAME.OVERLOAD), replayed by PyTorch "
        '(pip install torch==2.13.0).")] False\n'
    )


@pytest.mark.parametrize("command", [["order"], ["inspect"], ["render", "-o", "-"], ["ops"]])
def test_commands_that_replay_nothing_import_no_torch_with_the_plugin_loaded(
    tmp_path: Path, command: list[str]
) -> None:
    b = GraphBuilder()
    x = b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("aten.mkldnn_rnn_layer.default", [x], name="y", attrs={"args": [{"input": 0}], "output": 0})
    path = tmp_path / "step.msgpack"
    graphsvc.save(b.build(), path)
    argv = ["graphsvc", command[0], *([] if command == ["ops"] else [str(path)]), *command[1:]]
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}\\n'))\n"
        f"sys.argv = {argv!r}\n"
        "from graphsvc.__main__ import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "torch imported: False"
    assert "aten." in result.stdout


def test_a_tag_that_is_not_an_operator_s_name_is_refused_without_torch() -> None:
    with pytest.raises(UnknownOpError) as caught:
        registry().get("aten.relu")
    assert str(caught.value) == (
        f"unknown op 'aten.relu': {SOURCE}: 'aten.relu' is not the name of a PyTorch operator, aten.NAME.OVERLOAD "
        "(aten.embedding.default)"
    )


def test_without_pytorch_a_tag_is_refused_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as where it is not installed
    b = GraphBuilder()
    x = b.leaf(np.ones(3), name="x")
    b.add("aten.relu.default", [x], name="y", attrs={"args": [{"input": 0}]})
    graphsvc.save(b.build(), tmp_path / "g.msgpack")
    result = runner.invoke(app, ["validate", str(tmp_path / "g.msgpack")])
    assert (result.exit_code, result.stderr) == (
        4,
        f"Error: {tmp_path / 'g.msgpack'}: a valid graph file, but it cannot be replayed here: the graph uses an op "
        f"not registered here: aten.relu.default ({SOURCE}: replaying aten.relu.default needs PyTorch, which cannot "
        "be imported here: pip install torch==2.13.0)\n",
    )


# -- the family, with PyTorch ------------------------------------------------------------------------
def test_a_tag_that_names_no_operator_is_refused_when_it_is_resolved() -> None:
    torch = needs_torch()
    found = registry()
    with pytest.raises(MissingOpsError) as caught:
        b = GraphBuilder()
        b.add("aten.nope.default", [b.leaf(np.ones(2), name="x")], name="y", attrs={"args": [{"input": 0}]})
        graphsvc.forward(b.build(), registry=found)
    assert str(caught.value) == (
        f"the graph uses an op not registered here: aten.nope.default ({SOURCE}: PyTorch {torch.__version__} has "
        "no operator aten.nope)"
    )
    assert caught.value.exit_code == 4
    with pytest.raises(UnknownOpError) as unknown:
        found.get("aten.embedding.nope")
    assert str(unknown.value) == (
        f"unknown op 'aten.embedding.nope': {SOURCE}: PyTorch {torch.__version__}'s aten.embedding has no "
        "overload 'nope' (it has: default, out)"
    )


def test_operators_a_node_cannot_be_are_refused_so_a_file_cannot_read_files_or_print(tmp_path: Path) -> None:
    needs_torch()
    found = registry()
    no_tensor = "it takes no tensor (a factory's value is a const in a captured graph)"
    uninitialized = "it returns uninitialized memory (a capture records an empty tensor's value as a const)"
    refused = {
        "aten.from_file.default": no_tensor,
        "aten._print.default": no_tensor,
        "aten.zeros.default": no_tensor,
        "aten.relu.out": "it writes into an out= argument (a node's op returns its result)",
        "aten._assert_async.default": "it returns no tensor",
        "aten._local_scalar_dense.default": "it returns no tensor",
        "aten.empty_like.default": uninitialized,
        "aten.new_empty.default": uninitialized,
        "aten.resize.default": "it returns uninitialized memory where it grows a tensor",
        "aten.resize_.default": "it returns uninitialized memory where it grows a tensor",
        "aten.resize_as_.default": "it returns uninitialized memory where it grows a tensor",
    }
    for tag, why in refused.items():
        with pytest.raises(UnknownOpError) as caught:
            found.get(tag)
        assert str(caught.value) == f"unknown op {tag!r}: {SOURCE}: {tag} is not replayed: {why}"
    # a file whose node would read another file: refused before anything runs (exit 4)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = tmp_path / "hostile.json"
    path.write_text(
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"name": "x", "op": "leaf", "value": 1.0}, '
        '{"name": "y", "op": "aten.from_file.default", "parents": ["x"], '
        f'"attrs": {{"args": [{json.dumps(str(secret))}, false, 4]}}}}]}}'
    )
    result = CliRunner().invoke(app, ["forward", str(path)])
    assert (result.exit_code, result.stdout) == (4, "")
    assert result.stderr == (
        "Error: the graph uses an op not registered here: aten.from_file.default "
        f"({SOURCE}: aten.from_file.default is not replayed: it takes no tensor (a factory's value is a const in a "
        "captured graph))\n"
    )


def test_an_operator_whose_output_would_be_above_the_array_limit_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs_torch()
    found = registry()

    def repeated(times: list[int]) -> Graph:
        b = GraphBuilder()
        x = b.leaf(np.arange(12, dtype=np.float32).reshape(4, 3), name="x")
        big = b.add("aten.repeat.default", [x], name="big", attrs={"args": [{"input": 0}, times]})
        b.add("sum", [big], name="loss")
        return b.build()

    with pytest.raises(ReplayError) as caught:  # 160 GB: refused from its shape, nothing allocated
        graphsvc.forward(repeated([100000, 100000]), registry=found)
    assert str(caught.value) == (
        f"node big: op 'aten.repeat.default' ({SOURCE}): forward raised ValueError: aten.repeat.default asks for "
        "a 400000x300000 float32 array (447.0 GiB), more than the limit of 4.0 GiB on one array "
        "(GRAPHSVC_MAX_ARRAY_BYTES)"
    )
    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "1KiB")
    assert np.array_equal(
        graphsvc.forward(repeated([6, 3]), registry=found).value("big"),
        np.tile(np.arange(12, dtype=np.float32).reshape(4, 3), (6, 3)),
    )  # 864 bytes: within 1 KiB
    with pytest.raises(ReplayError) as caught:  # the call a backward makes, with autograd, too
        graphsvc.backward(repeated([8, 3]), registry=found)
    assert str(caught.value).endswith(
        "forward_with_residuals raised ValueError: aten.repeat.default asks for a 32x9 float32 array (1.1 KiB), "
        "more than the limit of 1.0 KiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)"
    )


def test_the_size_check_sees_calls_without_arguments_devices_and_sizes_that_depend_on_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs_torch()
    found = registry()
    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "1MiB")

    def refused(tag: str, inputs: list[np.ndarray], attrs: dict[str, Any] | None) -> str:
        b = GraphBuilder()
        leaves = [b.leaf(x, name=f"x{i}") for i, x in enumerate(inputs)]
        b.add(tag, leaves, name="big", attrs=attrs)
        with pytest.raises(ReplayError) as caught:
            graphsvc.forward(b.build(), registry=found)
        return str(caught.value).partition("raised ValueError: ")[2]

    ones = np.ones(20000, dtype=np.float32)
    # a node without args: the dry run is the call the node makes, f(*inputs)
    assert refused("aten.outer.default", [ones, ones], None) == (
        "aten.outer.default asks for a 20000x20000 float32 array (1.5 GiB), more than the limit of 1.0 MiB on one "
        "array (GRAPHSVC_MAX_ARRAY_BYTES)"
    )
    # a device argument: the dry run stays on the meta device (new_ones would fill 1.1 GiB on the CPU)
    call = {"args": [{"input": 0}, [300_000_000]], "kwargs": {"device": {"device": "cpu"}}}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    assert refused("aten.new_ones.default", [ones], call).startswith(
        "aten.new_ones.default asks for a 300000000 float32 array (1.1 GiB)"
    )
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024  # not the 1.1 GiB
    # a size that depends on values: bounded by the integer inputs' magnitudes
    assert refused("aten.bincount.default", [np.array([300_000_000])], None) == (
        "aten.bincount.default may ask for 300,000,000 elements (2.2 GiB, its integer inputs' values), more than "
        "the limit of 1.0 MiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)"
    )
    b = GraphBuilder()
    b.add("aten.bincount.default", [b.leaf(np.array([1, 3, 3]), name="x")], name="counts")
    assert graphsvc.forward(b.build(), registry=found).value("counts").tolist() == [0, 1, 0, 2]


def test_two_calls_of_a_random_multi_output_operator_are_two_draws_in_a_backward_replay_too() -> None:
    torch = needs_torch()
    found = registry()
    b = GraphBuilder()
    x = b.leaf(np.linspace(1.0, 2.0, 64).reshape(8, 8), name="x")
    call = {"args": [{"input": 0}, 0.5, True], "output": 0}
    one = b.add("aten.native_dropout.default", [x], name="one", attrs=call)
    two = b.add("aten.native_dropout.default", [x], name="two", attrs=call)
    b.add("sum", [b.add("mul", [one, two], name="both")], name="loss")
    graph = b.build()
    for replay in (graphsvc.forward, graphsvc.backward):
        torch.manual_seed(0)
        result = replay(graph, registry=found)
        kept = [result.value(name) != 0 for name in ("one", "two")]
        assert not np.array_equal(*kept), replay.__name__  # two masks, not one shared
        assert 16 < kept[0].sum() < 48 and 16 < kept[1].sum() < 48


def lstm_layer(torch: Any) -> tuple[Any, Any, Any, Any, tuple[Op, dict[str, Any], list[np.ndarray]]]:
    """A seeded batch-first nn.LSTM(4, 5), its input, and its one mkldnn_rnn_layer call: the
    operator, what it returned, and the node recording it (:func:`as_node`)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 5, batch_first=True)
    x = torch.randn(2, 3, 4)
    (call,) = [c for c in record(torch, lambda: lstm(x)) if str(c[0]) == "aten.mkldnn_rnn_layer.default"]
    func, args, kwargs, outputs = call
    return lstm, x, func, outputs, as_node(torch, func, args, kwargs)


def test_an_lstm_layer_s_mkldnn_rnn_layer_is_pytorch_s() -> None:
    torch = needs_torch()
    lstm, x, _, outputs, (op, attrs, inputs) = lstm_layer(torch)
    assert op.source == SOURCE and len(inputs) == 7  # x, four weights, h0, c0
    for output in range(3):  # the sequence, the last hidden and cell states: the same float32 bits
        value = op.forward(*inputs, **attrs, output=output)  # type: ignore[misc]
        assert value.dtype == np.float32 and value.flags.c_contiguous
        assert np.array_equal(value, outputs[output].detach().numpy())
    # the VJP of the sequence against autograd through the nn.LSTM module itself
    out = op.forward(*inputs, **attrs, output=0)  # type: ignore[misc]
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    cotangents = op.vjp(read_only(g), out, *inputs, **attrs, output=0)  # type: ignore[misc]
    xt = x.clone().requires_grad_()
    y, _ = lstm(xt)  # batch first: the layer's sequence, transposed
    params = [lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0]
    expected = torch.autograd.grad(y, [xt, *params], torch.from_numpy(g).transpose(0, 1))
    assert [None if c is None else c.dtype for c in cotangents] == [np.float32] * 7
    np.testing.assert_allclose(cotangents[0], expected[0].transpose(0, 1).numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(cotangents[1:5], expected[1:], strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    assert abs(cotangents[1]).max() > 0.1  # not zeros
    # the input as a replay of a batch-first model gives it: a transpose, a strided view (the capture
    # records the contiguous copy PyTorch made as the same value: a graph's arrays have no layout)
    strided = np.ascontiguousarray(inputs[0].transpose(1, 0, 2)).transpose(1, 0, 2)
    strided.flags.writeable = False
    assert not strided.flags.c_contiguous and np.array_equal(strided, inputs[0])
    value, residuals = op.forward_with_residuals(strided, *inputs[1:], **attrs, output=0)  # type: ignore[misc]
    assert np.array_equal(value, outputs[0].detach().numpy())
    assert np.array_equal(op.forward(strided, *inputs[1:], **attrs, output=0), value)  # type: ignore[misc]
    again = op.vjp(read_only(g), value, strided, *inputs[1:], **attrs, output=0, residuals=residuals)  # type: ignore[misc]
    for got, want in zip(again, cotangents, strict=True):
        assert np.array_equal(got, want)


def test_the_nodes_of_an_lstm_layer_s_three_outputs_share_one_call_for_a_backward_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = needs_torch()
    lstm, x, func, outputs, (op, attrs, inputs) = lstm_layer(torch)
    runner = op.forward_with_residuals.__self__  # type: ignore[union-attr]
    calls = []

    def counted(*a: Any, **k: Any) -> Any:
        if a[0].device.type != "meta":  # not the size check's call on the meta device
            calls.append(a[0])
        return func(*a, **k)

    monkeypatch.setattr(runner, "function", counted)
    rng = np.random.default_rng(2)
    seeds = [read_only(rng.standard_normal(o.shape).astype(np.float32)) for o in outputs[:3]]
    made = [op.forward_with_residuals(*inputs, **attrs, output=k) for k in range(3)]  # type: ignore[misc]
    assert len(calls) == 1  # one call for the three nodes
    assert all(np.array_equal(made[k][0], outputs[k].detach().numpy()) for k in range(3))
    shared = [
        op.vjp(seeds[k], made[k][0], *inputs, **attrs, output=k, residuals=made[k][1])  # type: ignore[misc]
        for k in range(3)
    ]
    alone = [op.vjp(seeds[k], made[k][0], *inputs, **attrs, output=k) for k in range(3)]  # type: ignore[misc]
    assert len(calls) == 4  # a VJP without residuals makes its own call
    for got, want in zip(shared, alone, strict=True):
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)
    # the gradient of the three outputs together, by autograd through the module: their sum
    xt = x.clone().requires_grad_()
    y, (h, c) = lstm(xt)
    seeds_t = [torch.from_numpy(seeds[0]).transpose(0, 1), *(torch.from_numpy(g).reshape(h.shape) for g in seeds[1:])]
    total = torch.autograd.grad([y, h, c], [xt], seeds_t)[0]
    summed = sum(cotangents[0] for cotangents in shared)
    np.testing.assert_allclose(summed, total.transpose(0, 1).numpy(), rtol=1e-5, atol=1e-6)
    # inputs that may change between two calls (writable arrays) are not taken for the same call
    writable = [np.array(a) for a in inputs]
    for k in range(2):
        op.forward_with_residuals(*writable, **attrs, output=k)  # type: ignore[misc]
    assert len(calls) == 6
    op.forward_with_residuals(*inputs, **attrs, output=0)  # type: ignore[misc]
    assert len(calls) == 7  # an output a node picked already: another node's own call
    del made, shared  # the nodes let the call go: the next one is made anew
    gc.collect()
    op.forward_with_residuals(*inputs, **attrs, output=1)  # type: ignore[misc]
    assert len(calls) == 8


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_embedding_with_padding_idx_is_pytorch_s(dtype: type) -> None:
    torch = needs_torch()
    weight = np.random.default_rng(2).standard_normal((5, 3)).astype(dtype)
    ids = np.array([[4, 0, 2], [2, 2, 1]])
    op = registry().get("aten.embedding.default")
    attrs = {"args": [{"input": 0}, {"input": 1}, 2]}  # padding_idx 2
    out = op.forward(read_only(weight), read_only(ids), **attrs)  # type: ignore[misc]
    assert out.dtype == dtype and np.array_equal(out, weight[ids])
    g = np.arange(18.0, dtype=dtype).reshape(2, 3, 3)
    gw, gids = op.vjp(read_only(g), out, read_only(weight), read_only(ids), **attrs)  # type: ignore[misc]
    assert gids is None  # an index gets no gradient
    # by hand: row r collects g where ids == r; row 2, the padding, gets none
    assert gw.dtype == dtype
    assert gw.tolist() == [[3.0, 4.0, 5.0], [15.0, 16.0, 17.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 2.0]]
    wt = torch.from_numpy(weight).requires_grad_()
    torch.nn.functional.embedding(torch.from_numpy(ids), wt, padding_idx=2).backward(torch.from_numpy(g))
    assert np.array_equal(gw, wt.grad.numpy())


def test_the_second_output_of_a_multi_output_operator() -> None:
    needs_torch()
    x = np.array([[1.0, 2.0, 6.0], [4.0, -5.0, 7.0]])
    found = registry()
    var_mean = found.get("aten.var_mean.correction")
    attrs = {"args": [{"input": 0}, [1]], "kwargs": {"correction": 1, "keepdim": False}}
    mean = var_mean.forward(read_only(x), **attrs, output=1)  # type: ignore[misc]
    assert mean.tolist() == [3.0, 2.0]
    variance = var_mean.forward(read_only(x), **attrs, output=0)  # type: ignore[misc]
    assert variance.tolist() == [7.0, 39.0]  # ((1-3)^2 + (2-3)^2 + (6-3)^2) / 2; ((4-2)^2 + 49 + 25) / 2
    (gx,) = var_mean.vjp(read_only(np.array([3.0, -6.0])), mean, read_only(x), **attrs, output=1)  # type: ignore[misc]
    assert gx.tolist() == [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]  # d mean_i / d x_ij = 1/3
    # max.dim's second output, the indices: int64, and no gradient flows through it
    max_dim = found.get("aten.max.dim")
    attrs = {"args": [{"input": 0}, 1]}
    indices = max_dim.forward(read_only(x), **attrs, output=1)  # type: ignore[misc]
    assert indices.dtype == np.int64 and indices.tolist() == [2, 2]
    (gx,) = max_dim.vjp(read_only(np.zeros(2)), indices, read_only(x), **attrs, output=1)  # type: ignore[misc]
    assert gx.tolist() == [[0.0] * 3] * 2
    with pytest.raises(ValueError) as caught:
        max_dim.forward(read_only(x), **attrs)  # type: ignore[misc]
    assert str(caught.value) == "aten.max.dim returns 2 outputs: the node must say which it holds (output)"
    with pytest.raises(ValueError) as caught:
        max_dim.forward(read_only(x), **attrs, output=2)  # type: ignore[misc]
    assert str(caught.value) == "aten.max.dim returns 2 outputs, so output must be 0 to 1, not 2"


def test_a_call_with_a_dtype_and_a_device() -> None:
    torch = needs_torch()
    x = np.array([[1.5, -2.25], [0.1, 3.0]], dtype=np.float32)
    op = registry().get("aten._to_copy.default")
    attrs = {"args": [{"input": 0}], "kwargs": {"dtype": {"dtype": "float64"}, "device": {"device": "cpu"}}}
    out = op.forward(read_only(x), **attrs)  # type: ignore[misc]
    assert out.dtype == np.float64 and out.tolist() == x.astype(np.float64).tolist()
    (gx,) = op.vjp(read_only(np.array([[1.0, 2.0], [3.0, 4.0]])), out, read_only(x), **attrs)  # type: ignore[misc]
    assert gx.dtype == np.float32 and gx.tolist() == [[1.0, 2.0], [3.0, 4.0]]  # the cast back
    # a sum in float64 of a float32 input, as PyTorch sums it
    summed = registry().get("aten.sum.dim_IntList")
    attrs = {"args": [{"input": 0}, [1], False], "kwargs": {"dtype": {"dtype": "float64"}}}
    out = summed.forward(read_only(x), **attrs)  # type: ignore[misc]
    expected = torch.sum(torch.from_numpy(x), [1], False, dtype=torch.float64).numpy()
    assert out.dtype == np.float64 and np.array_equal(out, expected)


def test_an_operator_that_writes_into_its_argument_leaves_the_input_alone() -> None:
    needs_torch()
    x = read_only(np.array([-1.0, 2.0, -3.0]))
    op = registry().get("aten.relu_.default")
    out = op.forward(x, args=[{"input": 0}])  # type: ignore[misc]
    assert out.tolist() == [0.0, 2.0, 0.0] and x.tolist() == [-1.0, 2.0, -3.0]
    (gx,) = op.vjp(read_only(np.ones(3)), out, x, args=[{"input": 0}])  # type: ignore[misc]
    assert gx.tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("tag", "attrs", "inputs"),
    [
        ("aten.gelu.default", {"args": [{"input": 0}], "kwargs": {"approximate": "tanh"}}, [(3, 4)]),
        ("aten.mm.default", {"args": [{"input": 0}, {"input": 1}]}, [(2, 3), (3, 4)]),
        ("aten.var_mean.correction", {"args": [{"input": 0}, [1]], "kwargs": {"correction": 1}, "output": 0}, [(3, 5)]),
    ],
)
def test_the_vjp_against_finite_differences_with_and_without_the_forward_s_graph(
    tag: str, attrs: dict[str, Any], inputs: list[tuple[int, ...]]
) -> None:
    needs_torch()
    rng = np.random.default_rng(4)
    op = registry().get(tag)
    arrays = [rng.standard_normal(shape) for shape in inputs]
    # check_vjp: finite differences, forward_with_residuals' output equal to forward's, the
    # cotangents given the residuals equal to those given None
    result = check_vjp(op, *arrays, attrs=attrs)
    assert result.ok, result.message
    assert result.points == sum(a.size for a in arrays)


# -- a replay of a saved graph -----------------------------------------------------------------------
def test_backward_check_passes_on_a_graph_with_pytorch_operators(tmp_path: Path) -> None:
    torch = needs_torch()
    rng = np.random.default_rng(3)
    w = torch.from_numpy(rng.standard_normal((6, 4))).requires_grad_()
    ids = torch.tensor([[1, 5, 0], [5, 2, 1]])
    rows = torch.nn.functional.embedding(ids, w, padding_idx=0)
    rows.retain_grad()
    h = torch.ops.aten.gelu.default(rows, approximate="tanh")
    h.retain_grad()
    squared = h * h
    squared.retain_grad()
    loss = squared.sum()
    loss.backward()

    def arr(t: Any) -> np.ndarray:
        return t.detach().numpy()

    def build(w_grad: np.ndarray) -> Any:
        b = GraphBuilder()
        nw = b.leaf(arr(w), name="w", grad=w_grad)
        nids = b.leaf(ids.numpy(), name="ids")
        nrows = b.add(
            "aten.embedding.default",
            [nw, nids],
            name="rows",
            attrs={"args": [{"input": 0}, {"input": 1}, 0]},
            value=arr(rows),
            grad=arr(rows.grad),
        )
        call = {"args": [{"input": 0}], "kwargs": {"approximate": "tanh"}}
        nh = b.add("aten.gelu.default", [nrows], name="h", attrs=call, value=arr(h), grad=arr(h.grad))
        nsq = b.add("mul", [nh, nh], name="squared", value=arr(squared), grad=arr(squared.grad))
        b.add("sum", [nsq], name="loss", value=arr(loss), grad=np.array(1.0))
        return b.build()

    path = tmp_path / "step.msgpack"
    graphsvc.save(build(arr(w.grad)), path)
    result = runner.invoke(app, ["backward", str(path), "--check", "--rtol", "1e-12"])
    assert result.exit_code == 0, result.output
    checks = [line for line in result.stdout.splitlines() if line.startswith("check ")]
    assert [line[: line.index("): ") + 1] for line in checks] == [
        "check values (float64: rtol 1e-12, atol 1e-12; int64: rtol 1e-12, atol 0)",
        "check grads (float64: rtol 1e-12, atol 1e-12)",
    ]
    assert all(line.endswith(": ok") for line in checks), checks
    assert "2\trows\taten.embedding.default\t0,1\t" in result.stdout
    # a stored gradient PyTorch did not give: the check finds it
    graphsvc.save(build(arr(w.grad) * (1 + 1e-9)), tmp_path / "tampered.msgpack")
    result = runner.invoke(app, ["backward", str(tmp_path / "tampered.msgpack"), "--check", "--rtol", "1e-12"])
    assert result.exit_code == 1, result.output
    # and without the plugin, the same file says what to install
    result = runner.invoke(app, ["--disable-plugins", "backward", str(path), "--check"])
    assert (result.exit_code, result.stderr) == (
        4,
        "Error: ops 'aten.embedding.default', 'aten.gelu.default' are PyTorch operators: replaying them needs the "
        "graphsvc-torch plugin and PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0); and run without "
        "--disable-plugins (it keeps out every plugin, --plugin ones too)\n",
    )


# -- custom autograd Functions -----------------------------------------------------------------------
def seed002_function(torch: Any) -> type:
    """Seed 002's Multiply, a torch.autograd.Function: z = x * y, its backward swapping the multipliers."""

    class Multiply(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, y: Any) -> Any:
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx: Any, grad_z: Any) -> Any:
            x, y = ctx.saved_tensors
            return y * grad_z, x * grad_z

    return Multiply


def test_function_op_replays_seed_002_through_its_function() -> None:
    torch = needs_torch()
    multiply = seed002_function(torch)
    op = graphsvc_torch.function_op(multiply)
    assert op.name == f"{__name__}.seed002_function.<locals>.Multiply"
    assert op.kind == "vjp"
    found = registry()
    found.register(op, plugin="seed002")
    # f(x) = sqrt(x^2 + exp(x^2)) + cos(x^2 + exp(x^2)), with x^2 = Multiply(x, x)
    b = GraphBuilder()
    x = b.leaf(np.array([0.5, -1.25]), name="x")
    a = b.add(op.name, [x, x], name="a")
    c = b.add("add", [a, b.add("exp", [a], name="b")], name="c")
    f = b.add("add", [b.add("sqrt", [c], name="d"), b.add("cos", [c], name="e")], name="f")
    b.add("sum", [f], name="L")
    result = graphsvc.backward(b.build(), registry=found)
    xs = np.array([0.5, -1.25])
    cs = xs**2 + np.exp(xs**2)
    by_hand = (0.5 / np.sqrt(cs) - np.sin(cs)) * (2 * xs + 2 * xs * np.exp(xs**2))
    np.testing.assert_allclose(result.grad("x"), by_hand, rtol=1e-12)
    xt = torch.tensor(xs, requires_grad=True)
    at = multiply.apply(xt, xt)
    ct = at + torch.exp(at)
    (torch.sqrt(ct) + torch.cos(ct)).sum().backward()
    np.testing.assert_allclose(result.grad("x"), xt.grad.numpy(), rtol=1e-12)
    assert result.value("a").tolist() == [0.25, 1.5625]


def test_function_op_refuses_what_is_not_a_function() -> None:
    with pytest.raises(TypeError) as caught:
        graphsvc_torch.function_op(len)  # type: ignore[arg-type]
    assert str(caught.value) == "function_op() takes a torch.autograd.Function subclass, not <built-in function len>"
