"""graphsvc.torch.capturing: one PyTorch step captured, saved, loaded and replayed by ``graphsvc
backward --check``; the gradients in the file are PyTorch's."""

from __future__ import annotations

import gc
import importlib.util
import math
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc import pluginhost
from graphsvc.graph import Graph
from graphsvc.pluginhost import load_registry
from tests.conftest import REQUIRE_TORCH, needs_torch, run_cli, skip_unless_required

torch = needs_torch(module_level=True)
nn = torch.nn
F = torch.nn.functional

from graphsvc.torch.capturing import CaptureError, capture  # noqa: E402  (after the skip: it needs torch)

#: --check's tolerance for each dtype: float64's given, rtol 1e-10 (tighter than its default, 1e-9,
#: which leaves room for another machine's libm); float32's default, rtol 1e-4.
TOLERANCE = {torch.float64: ("--rtol", "1e-10", "--atol", "1e-12"), torch.float32: ()}
#: The tolerance the check lines say they used for the dtype's numbers.
STATED = {torch.float64: "float64: rtol 1e-10, atol 1e-12", torch.float32: "float32: rtol 1e-4, atol 1e-6"}


def listing(graph: Graph) -> list[str]:
    """Each node as ``name op parents attrs``."""
    rows = []
    for node in range(graph.num_nodes):
        parents = ",".join(graph.label(p) for p in graph.parents(node))
        attrs = graph.attrs.get(node)
        rows.append(f"{graph.label(node)} {graph.op(node)} {parents}" + (f" {attrs}" if attrs else ""))
    return rows


def same_bits(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def saved(graph: Graph, tmp_path: Path) -> Path:
    """The graph saved (``graphsvc.save``) and loaded back (``graphsvc.load``) with the same nodes,
    attributes, metadata and numbers, each bit (the file holds PyTorch's values and gradients): its path."""
    path = tmp_path / "step.msgpack"
    graphsvc.save(graph, path)
    loaded = graphsvc.load(path)
    assert loaded.num_nodes == graph.num_nodes
    for node in range(graph.num_nodes):
        assert (loaded.label(node), loaded.op(node), loaded.parents(node)) == (
            graph.label(node),
            graph.op(node),
            graph.parents(node),
        )
    assert (loaded.attrs, loaded.outputs, loaded.metadata) == (graph.attrs, graph.outputs, graph.metadata)
    for stored, read in ((graph.arrays, loaded.arrays), (graph.grad_arrays, loaded.grad_arrays)):
        assert stored.keys() == read.keys()
        assert all(same_bits(stored[node], read[node]) for node in stored)
    assert same_bits(graph.values, loaded.values)
    assert graph.grads is None or same_bits(graph.grads, loaded.grads)
    return path


def replayed(graph: Graph, tmp_path: Path, dtype: Any, *extra: str, env: dict[str, str] | None = None) -> str:
    """``graphsvc --disable-plugins backward FILE --check`` (graphsvc's builtin ops only) on the graph
    saved (:func:`saved`), checked by :func:`assert_checked`: what it printed."""
    path = saved(graph, tmp_path)
    return assert_checked(run_cli("backward", str(path), "--check", *TOLERANCE[dtype], *extra, env=env), dtype)


def assert_parameter_grads(graph: Graph, model: Any) -> None:
    """Every parameter's gradient in the graph is p.grad, to the bit."""
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        stored = graph.grad(name)
        assert stored.dtype == p.grad.numpy().dtype, name
        assert np.array_equal(stored, p.grad.numpy()), name


def mlp_step(dtype: Any) -> tuple[Any, Graph, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)).to(dtype)
    x, y = torch.randn(5, 4, dtype=dtype), torch.tensor([0, 2, 1, 1, 0])
    with capture(model) as run:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    return model, run.graph(), loss


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_mlp_with_inplace_relu_replays_to_pytorchs_values_and_gradients(dtype: Any, tmp_path: Path) -> None:
    model, graph, loss = mlp_step(dtype)
    registry, _ = load_registry()
    if "addmm" in registry:  # nn.Linear is t and addmm: graphsvc's fused addmm
        linear = ["{0}.addmm addmm {0}.bias,{1},{0}.t"]
    else:  # or a matmul and an add
        linear = ["{0}.addmm.mm matmul {1},{0}.t", "{0}.addmm add {0}.bias,{0}.addmm.mm"]
    assert listing(graph) == [
        "0.weight leaf ",
        "0.t transpose 0.weight",
        "0.bias leaf ",
        "input0 const ",
        *(row.format("0", "input0") for row in linear),
        "1.relu relu 0.addmm",
        "2.weight leaf ",
        "2.t transpose 2.weight",
        "2.bias leaf ",
        *(row.format("2", "1.relu") for row in linear),
        "log_softmax log_softmax 2.addmm {'axis': 1}",
        "input1 const ",
        "nll_loss_forward nll_loss log_softmax,input1 {'reduction': 'mean', 'ignore_index': -100}",
    ]
    assert graph.outputs == [graph.num_nodes - 1]
    assert graph.value("nll_loss_forward") == loss.item()
    assert graph.value("input1").dtype == np.int64
    assert graph.metadata == {
        "captured": {"torch": torch.__version__, "model": "Sequential", "parameters": 67, "modules": ["0", "1", "2"]}
    }
    assert_parameter_grads(graph, model)
    # the in-place ReLU: the linear layer's output keeps its value before the ReLU
    assert graph.value("0.addmm").min() < 0 <= graph.value("1.relu").min()
    replayed(graph, tmp_path, dtype)


def test_tensors_that_require_no_gradient_are_consts_and_a_replay_computes_none_for_them() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    model[0].weight.requires_grad_(False)  # a frozen layer's weight
    x = torch.randn(2, 3, dtype=torch.float64)
    z = torch.randn(2, 1, dtype=torch.float64, requires_grad=True)  # an input whose gradient is wanted
    with capture(model) as run:
        loss = (model(x) * z).sum()
        loss.backward()
    graph = run.graph()
    ops = {graph.label(node): graph.op(node) for node in range(graph.num_nodes)}
    assert [name for name, op in ops.items() if op in ("leaf", "const")] == [
        "0.weight",
        "0.bias",
        "input0",
        "2.weight",
        "2.bias",
        "input1",
    ]
    assert {name: ops[name] for name in ("0.weight", "input0", "0.bias", "input1")} == {
        "0.weight": "const",
        "input0": "const",
        "0.bias": "leaf",
        "input1": "leaf",
    }
    assert np.array_equal(graph.grad("input1"), z.grad.numpy())
    replay = graphsvc.backward(graph)
    assert math.isnan(replay.grad("0.weight")) and math.isnan(replay.grad("input0"))
    np.testing.assert_allclose(replay.grad("0.bias"), model[0].bias.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(replay.grad("input1"), z.grad.numpy(), rtol=1e-12)


def replayed_with_plugins(graph: Graph, tmp_path: Path, dtype: Any, *plugins: str) -> tuple[int, str, str]:
    """``graphsvc [--plugin P]... backward FILE --check`` with the installed plugins loaded, on the
    graph saved (:func:`saved`)."""
    from typer.testing import CliRunner

    from cli import app

    path = saved(graph, tmp_path)
    flags = [flag for plugin in plugins for flag in ("--plugin", plugin)]
    result = CliRunner().invoke(app, [*flags, "backward", str(path), "--check", *TOLERANCE[dtype]])
    return result.exit_code, result.stdout, result.stderr


def assert_checked(result: tuple[int, str, str], dtype: Any) -> str:
    """A ``backward --check`` that exited 0 and says every stored value and gradient was reproduced
    within the dtype's tolerance (:data:`TOLERANCE`), naming it: what it printed."""
    code, out, err = result
    assert (code, err) == (0, ""), out + err
    values, grads = [line for line in out.splitlines() if line.startswith("check ")]
    assert values.startswith(f"check values ({STATED[dtype]}") and values.endswith(": ok"), values
    assert grads.startswith(f"check grads ({STATED[dtype]}): ") and grads.endswith(": ok"), grads
    return out


def replayed_without_pytorch(graph: Graph, tmp_path: Path, dtype: Any) -> tuple[int, str, str]:
    """:func:`replayed_with_plugins` where PyTorch cannot be imported, as where it is not installed:
    the installed plugins load (graphsvc-torch's ops need PyTorch only to run)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "torch", None)
        return replayed_with_plugins(graph, tmp_path, dtype)


def needs_torch_plugin() -> None:
    """Skip a replay of PyTorch's operators where the graphsvc-torch plugin is not installed, except
    under ``GRAPHSVC_REQUIRE_TORCH=1`` (CI installs it with PyTorch), where that fails it."""
    if importlib.util.find_spec("graphsvc_torch") is None:
        skip_unless_required("needs the graphsvc-torch plugin: pip install ./plugins/graphsvc-torch", REQUIRE_TORCH)


def needs_ops(*ops: str) -> None:
    """Skip a replay whose ops this graphsvc's registry does not have yet."""
    registry, _ = load_registry()
    missing = [op for op in ops if op not in registry]
    if missing:
        pytest.skip(f"needs graphsvc ops {', '.join(missing)}")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(64, 3)

    def forward(self, x: Any) -> Any:
        return self.fc(self.drop(self.pool(F.relu(self.bn(self.conv(x))))).flatten(1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_cnn_with_batch_norm_max_pool_and_dropout(dtype: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = SmallCNN().to(dtype)
    x, y = torch.randn(2, 1, 8, 8, dtype=dtype), torch.tensor([0, 2])
    mean_before = model.bn.running_mean.clone()
    with capture(model) as run:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    graph = run.graph()
    ops = {graph.label(n): graph.op(n) for n in range(graph.num_nodes)}
    assert ops["conv.convolution"] == "conv2d"
    assert graph.attrs[graph.node_id("conv.convolution")] == {"stride": [1, 1], "padding": [1, 1]}
    assert ops["pool.max_pool2d_with_indices"] == "max_pool2d"
    assert ops["drop.div"] == "const"  # the dropout mask, as PyTorch drew it: 0 or 1 / (1 - p)
    assert sorted(np.unique(graph.value("drop.div")).tolist()) == [0.0, 2.0]
    assert ops["drop.mul"] == "mul"
    assert not torch.equal(model.bn.running_mean, mean_before)  # the step updated them; the graph needs none
    assert "bn.num_batches_tracked" not in ops  # its add_ feeds nothing the loss depends on
    assert graph.value(graph.outputs[0]) == loss.item()
    assert_parameter_grads(graph, model)
    needs_ops("conv2d", "max_pool2d", "batch_norm")  # graphsvc-conv's conv2d and max_pool2d
    assert ops["bn.native_batch_norm"] == "batch_norm"
    assert not [op for op in ops.values() if op.startswith("aten.")]
    assert_checked(replayed_without_pytorch(graph, tmp_path, dtype), dtype)  # no graphsvc-torch op needed


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_transformer_encoder_layer(dtype: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True).to(dtype)
    x = torch.randn(2, 5, 16, dtype=dtype)
    with capture(model) as run:
        loss = model(x).pow(2).mean()
        loss.backward()
    graph = run.graph()
    names = [graph.label(n) for n in range(graph.num_nodes)]
    assert names[:3] == ["input0", "self_attn.transpose", "self_attn.in_proj_weight"]
    assert graph.op(graph.node_id("self_attn.bmm" if "self_attn.bmm" in names else "self_attn.mm")) == "matmul"
    assert graph.op(graph.node_id("self_attn.transpose1")) == "transpose"
    assert graph.attrs[graph.node_id("self_attn.transpose1")] == {"axes": [3, 1, 2, 0, 4]}
    assert graph.op(graph.node_id("self_attn.select")) == "take"
    assert graph.metadata["captured"]["parameters"] == sum(p.numel() for p in model.parameters()) == 2224
    assert_parameter_grads(graph, model)
    needs_ops("layer_norm", "scaled_dot_product_attention", "addmm")
    assert graph.op(graph.node_id("norm1.native_layer_norm")) == "layer_norm"
    assert graph.op(graph.node_id("self_attn.scaled_dot_product_flash_attention_for_cpu")) == (
        "scaled_dot_product_attention"
    )
    replayed(graph, tmp_path, dtype)  # graphsvc's builtin ops only


class LanguageModel(nn.Module):
    def __init__(self, rnn: type) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.rnn = rnn(6, 8, batch_first=True)
        self.head = nn.Linear(8, 10)

    def forward(self, tokens: Any) -> Any:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU])
def test_embedding_and_rnn_language_models_in_float64(rnn: type, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LanguageModel(rnn).double()
    tokens, targets = torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (2, 5))
    with capture(model) as run:
        loss = F.cross_entropy(model(tokens).reshape(-1, 10), targets.reshape(-1))
        loss.backward()
    graph = run.graph()
    assert graph.op(graph.node_id("embed.embedding")) == "take"
    assert graph.parents(graph.node_id("embed.embedding")) == [graph.node_id("embed.weight"), graph.node_id("input0")]
    assert graph.value("input0").dtype == np.int64
    assert graph.op(graph.node_id("rnn.sigmoid")) == "sigmoid"  # sigmoid_ on a chunk of the gates
    assert not [n for n in range(graph.num_nodes) if graph.op(n).startswith("aten.")]
    assert graph.value(graph.outputs[0]) == loss.item()
    assert_parameter_grads(graph, model)
    replayed(graph, tmp_path, torch.float64)  # graphsvc's builtin ops only


def float32_language_model_step(rnn: type) -> tuple[Any, Graph, Any]:
    torch.manual_seed(0)
    model = LanguageModel(rnn)
    tokens, targets = torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (2, 5))
    with capture(model) as run:
        loss = F.cross_entropy(model(tokens).reshape(-1, 10), targets.reshape(-1))
        loss.backward()
    return model, run.graph(), loss


def test_a_float32_lstm_keeps_pytorchs_fused_rnn_layer_as_an_aten_op_replayed_by_the_plugin(tmp_path: Path) -> None:
    model, graph, loss = float32_language_model_step(nn.LSTM)
    node = graph.node_id("rnn.mkldnn_rnn_layer")
    assert [graph.op(n) for n in range(graph.num_nodes) if graph.op(n).startswith("aten.")] == [
        "aten.mkldnn_rnn_layer.default"
    ]
    assert graph.attrs[node]["output"] == 0
    assert graph.attrs[node]["args"][:7] == [{"input": k} for k in range(7)]
    assert [graph.label(p) for p in graph.parents(node)] == [
        "rnn.transpose",  # the batch-first input, transposed: a strided view when replayed
        "rnn.weight_ih_l0",
        "rnn.weight_hh_l0",
        "rnn.bias_ih_l0",
        "rnn.bias_hh_l0",
        "rnn.select",  # h0 and c0
        "rnn.select1",
    ]
    assert graph.value(graph.outputs[0]) == loss.item()
    assert_parameter_grads(graph, model)
    needs_torch_plugin()
    assert_checked(replayed_with_plugins(graph, tmp_path, torch.float32), torch.float32)
    # without graphsvc-torch, or without PyTorch: what to install, exit code 4
    install = "pip install ./plugins/graphsvc-torch torch==2.13.0"
    needs = "op 'aten.mkldnn_rnn_layer.default' is a PyTorch operator: replaying it needs the graphsvc-torch plugin"
    code, _, err = run_cli("backward", str(tmp_path / "step.msgpack"), "--check")
    assert (code, err) == (
        4,
        f"Error: {needs} and PyTorch ({install}); and run without --disable-plugins (it keeps out every plugin, "
        "--plugin ones too)\n",
    )
    with pytest.MonkeyPatch.context() as patch:  # installed nowhere: no entry point
        patch.setattr(pluginhost, "_entry_points", lambda: [])
        code, _, err = replayed_with_plugins(graph, tmp_path, torch.float32)
    assert (code, err) == (4, f"Error: {needs} and PyTorch ({install})\n")
    code, _, err = replayed_without_pytorch(graph, tmp_path, torch.float32)
    assert (code, err) == (
        4,
        "Error: the graph uses an op not registered here: aten.mkldnn_rnn_layer.default (graphsvc-torch 0.1.0: "
        "replaying aten.mkldnn_rnn_layer.default needs PyTorch, which cannot be imported here: "
        "pip install torch==2.13.0)\n",
    )


def test_a_float32_two_layer_bidirectional_lstm_s_states_are_outputs_of_its_fused_layers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(2, 3, 3)
    with capture(model) as run:
        out, (h, c) = model(x)
        loss = out.sum() + (h * h).sum() + c.pow(3).sum()
        loss.backward()
    graph = run.graph()
    layers = [n for n in range(graph.num_nodes) if graph.op(n) == "aten.mkldnn_rnn_layer.default"]
    # each layer and direction: its sequence, last hidden and last cell state, three nodes of one call
    assert [graph.attrs[n]["output"] for n in layers] == [0, 1, 2] * 4
    assert [graph.attrs[n]["args"][7] for n in layers] == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3
    reverse = graph.node_id("mkldnn_rnn_layer4")
    assert [graph.label(p) for p in graph.parents(reverse)[:2]] == ["transpose", "weight_ih_l0_reverse"]
    assert [graph.label(p) for p in graph.parents(graph.node_id("stack"))] == [
        "mkldnn_rnn_layer1",  # h: each layer's and direction's output 1
        "mkldnn_rnn_layer5",
        "mkldnn_rnn_layer9",
        "mkldnn_rnn_layer13",
    ]
    assert graph.value(graph.outputs[0]) == loss.item()
    assert_parameter_grads(graph, model)
    needs_torch_plugin()
    assert_checked(replayed_with_plugins(graph, tmp_path, torch.float32), torch.float32)


def test_a_float32_gru_is_graphsvcs_builtin_ops(tmp_path: Path) -> None:
    model, graph, loss = float32_language_model_step(nn.GRU)
    ops = {graph.op(n) for n in range(graph.num_nodes)}
    assert not [op for op in ops if op.startswith("aten.")]  # PyTorch's GRU has no fused layer on the CPU
    assert {"sigmoid", "tanh", "addmm"} <= ops
    assert graph.value(graph.outputs[0]) == loss.item()
    assert_parameter_grads(graph, model)
    replayed(graph, tmp_path, torch.float32)  # graphsvc's builtin ops only


class Seed002(torch.autograd.Function):
    """Seed 002's f(x) = sqrt(x^2 + exp(x^2)) + cos(x^2 + exp(x^2)) with its hand-written backward."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        c = x * x + torch.exp(x * x)
        ctx.save_for_backward(x, c)
        return torch.sqrt(c) + torch.cos(c)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, c = ctx.saved_tensors
        dc = 2 * x + 2 * x * torch.exp(x * x)
        return grad * (0.5 / torch.sqrt(c) - torch.sin(c)) * dc


SEED002_TAG = f"{Seed002.__module__}.{Seed002.__qualname__}"

#: A plugin that registers the captured Function's op (its tag is the Function's qualified name).
SEED002_PLUGIN = """
import numpy as np

from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op


def derivatives(x, out):
    c = x * x + np.exp(x * x)
    return ((0.5 / np.sqrt(c) - np.sin(c)) * (2 * x + 2 * x * np.exp(x * x)),)


@hookimpl
def graphsvc_register_ops(register):
    register(Op(TAG, 1, forward=lambda x: np.sqrt(x * x + np.exp(x * x)) + np.cos(x * x + np.exp(x * x)),
                derivatives=derivatives, doc="seed 002"))
"""


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_custom_autograd_function_is_one_node_replayed_by_a_plugin(dtype: Any, tmp_path: Path) -> None:
    x = torch.tensor([0.5, -1.0, 1.5], dtype=dtype, requires_grad=True)
    with capture() as run:
        loss = Seed002.apply(x).sum()
        loss.backward()
    graph = run.graph()
    assert listing(graph) == ["input0 leaf ", f"Seed002 {SEED002_TAG} input0", "sum sum Seed002"]
    # the gradient by hand: f'(x) = (1 / (2 sqrt(c)) - sin(c)) * (2x + 2x e^(x^2)), c = x^2 + e^(x^2)
    a = np.array([0.5, -1.0, 1.5])
    c = a * a + np.exp(a * a)
    expected = (0.5 / np.sqrt(c) - np.sin(c)) * (2 * a + 2 * a * np.exp(a * a))
    assert graph.grad("input0").dtype == x.grad.numpy().dtype
    np.testing.assert_allclose(graph.grad("input0"), expected, rtol=1e-14 if dtype is torch.float64 else 1e-6)
    assert np.array_equal(graph.grad("input0"), x.grad.numpy())
    plugin = tmp_path / "seed002_op.py"
    plugin.write_text(f"TAG = {SEED002_TAG!r}\n" + SEED002_PLUGIN)
    assert_checked(replayed_with_plugins(graph, tmp_path, dtype, str(plugin)), dtype)
    code, _, err = replayed_with_plugins(graph, tmp_path, dtype)
    assert (code, err) == (
        4,
        f"Error: the graph uses an op not registered here: {SEED002_TAG} (plugin unknown); "
        "install the plugin that provides it or pass --plugin\n",
    )


def test_the_first_op_that_overflowed_is_named_by_the_nan_report(tmp_path: Path) -> None:
    class Exp(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.exp()

    model = nn.Sequential(nn.Linear(3, 4), Exp(), nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.fill_(60.0)
    with capture(model) as run:
        model(torch.ones(2, 3)).sum().backward()
    graph = run.graph()
    path = tmp_path / "overflow.msgpack"
    graphsvc.save(graph, path)
    node = graph.node_id("1.exp")
    assert sum(not np.isfinite(array).all() for array in graph.arrays.values()) == 3  # exp, the linear layer, sum
    bad = 3 if "addmm" in load_registry()[0] else 4  # and the matmul of a linear layer written as matmul + add
    for command in ("forward", "backward"):
        code, out, _ = run_cli(command, str(path))
        assert code == 0
        line = f"nonfinite values: first at 1.exp[0,0] (node {node}, exp) = inf; {bad} of {graph.num_nodes} nodes"
        assert line in out.splitlines()


def test_a_non_scalar_output_seeded_with_a_gradient_becomes_a_weighted_sum(tmp_path: Path) -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64, requires_grad=True)
    seed = torch.tensor([[1.0, -1.0], [0.5, 2.0]], dtype=torch.float64)
    with capture() as run:
        y = x * x
        y.backward(seed)
    graph = run.graph()
    assert listing(graph) == [
        "input0 leaf ",
        "mul mul input0,input0",
        "backward.seed const ",
        "backward.mul mul mul,backward.seed",
        "backward.sum sum backward.mul",
    ]
    assert graph.value("backward.sum") == 1 - 4 + 4.5 + 32
    assert np.array_equal(graph.grad("input0"), 2 * x.detach().numpy() * seed.numpy())
    assert np.array_equal(graph.grad("mul"), seed.numpy())
    replayed(graph, tmp_path, torch.float64)


def test_a_step_without_backward_keeps_every_node_and_no_gradients() -> None:
    model = nn.Linear(2, 1).double()
    with capture(model) as run:
        out = model(torch.ones(3, 2, dtype=torch.float64))
    graph = run.graph()
    assert graph.grad_arrays == {}
    assert np.array_equal(graph.value(graph.outputs[-1]), out.detach().numpy())
    fused = "addmm" in load_registry()[0]
    linear = ["addmm addmm bias,ones,t"] if fused else ["addmm.mm matmul ones,t", "addmm add bias,addmm.mm"]
    assert listing(graph) == ["ones const ", "weight leaf ", "t transpose weight", "bias leaf ", *linear]
    assert graph.outputs == [graph.num_nodes - 1]


def test_a_value_changed_in_place_later_is_recorded_as_it_was_used() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor([2.0, 3.0], dtype=torch.float64))

        def forward(self, x: Any) -> Any:
            y = x + self.scale
            self.scale.add_(10.0)  # like batch norm's running statistics: changed after it was read
            return y

    model = Scaled()
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    with capture(model) as run:
        model(x).sum().backward()
    graph = run.graph()
    assert graph.value("scale").tolist() == [2.0, 3.0]
    assert model.scale.tolist() == [12.0, 13.0]
    assert graph.grad("input0").tolist() == [1.0, 1.0]
    assert graph.value("add").tolist() == [3.0, 4.0]


def test_an_in_place_op_on_a_view_is_refused_naming_the_op() -> None:
    h = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(CaptureError, match=r"^capture cannot record aten\.mul_\.Tensor on a view of another tensor"):
        with capture():
            g = h * 1.0
            g[:, 0].mul_(2)


def test_dtypes_a_file_cannot_hold_are_refused_naming_the_op() -> None:
    x = torch.ones(2, dtype=torch.float16)
    with pytest.raises(CaptureError, match=r"^capture cannot record aten\.add\.Tensor: its tensor is float16, which"):
        with capture():
            x + x


def test_a_capture_is_used_once_and_its_graph_after_the_block() -> None:
    run = capture()
    with run:
        with pytest.raises(CaptureError, match=r"^run.graph\(\) is ready when the `with capture\(...\)` block has"):
            run.graph()
    with pytest.raises(CaptureError, match=r"^a capture records one step: start a new capture\(\) for the next one$"):
        run.__enter__()
    failed = capture()
    with pytest.raises(ZeroDivisionError), failed:
        1 / 0  # noqa: B018
    with pytest.raises(CaptureError, match=r"^nothing was captured: the step raised ZeroDivisionError$"):
        failed.graph()


def test_two_backward_passes_are_refused() -> None:
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(CaptureError, match=r"^a capture records one step with one backward; this one ran 2$"):
        with capture():
            (x * 2).sum().backward()
            (x * 3).sum().backward()


def test_the_capture_leaves_pytorch_as_it_found_it() -> None:
    backward, apply = torch.autograd.backward, torch.autograd.Function.__dict__["apply"]
    with capture():
        assert torch.autograd.backward is not backward
    assert torch.autograd.backward is backward
    assert torch.autograd.Function.__dict__["apply"] is apply
    x = torch.ones(2, requires_grad=True)
    (x * 2).sum().backward()  # no hooks left behind: the gradient is PyTorch's alone
    assert x.grad.tolist() == [2.0, 2.0]


def pytorch_state() -> tuple[Any, ...]:
    """What a capture changes while it runs: backward, Function.apply, the global module hooks, the
    captures running (and nn.Module.__call__, which it leaves alone)."""
    from graphsvc.torch import capturing

    module = torch.nn.modules.module
    hooks = (module._global_forward_pre_hooks, module._global_forward_hooks, module._global_forward_hooks_always_called)
    return (
        torch.autograd.backward,
        torch.autograd.Function.__dict__["apply"],
        torch.nn.Module.__dict__["__call__"],
        *(dict(h) for h in hooks),
        list(capturing._ACTIVE),
    )


class Refused(Exception):
    pass


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise Refused("refused")


class RefusingList(list[Any]):
    def append(self, item: Any) -> None:
        raise Refused("refused")


@pytest.mark.parametrize("where", ["forward hook", "captures list", "mode class", "mode enter"])
def test_a_capture_that_fails_to_start_leaves_pytorch_as_it_found_it(where: str, monkeypatch: Any) -> None:
    from graphsvc.torch import capturing

    before = pytorch_state()
    with monkeypatch.context() as patched:
        if where == "forward hook":  # the second of the module hooks: the first is in place by then
            patched.setattr(torch.nn.modules.module, "register_module_forward_hook", refuse)
        elif where == "captures list":  # the module hooks, backward and apply are in place by then
            patched.setattr(capturing, "_ACTIVE", RefusingList())
        elif where == "mode class":  # backward, apply and the list of captures are patched by then
            patched.setattr(capturing, "_mode_class", refuse)
        else:
            patched.setattr(capturing._mode_class(), "__enter__", refuse)
        run = capture()
        with pytest.raises(Refused), run:
            pass
    assert pytorch_state() == before
    with pytest.raises(CaptureError, match=r"^a capture records one step: start a new capture\(\) for the next one$"):
        run.__enter__()
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    with capture() as again:
        (x * 2.0).sum().backward()
    assert again.graph().grad("input0").tolist() == [2.0, 2.0]
    assert pytorch_state() == before


def test_the_graph_keeps_the_steps_numbers_after_an_optimizer_changes_the_models() -> None:
    model, graph, _ = mlp_step(torch.float64)
    weight, grad = model[0].weight.detach().clone(), model[0].weight.grad.clone()
    torch.optim.SGD(model.parameters(), lr=0.5).step()  # parameters changed in place
    model.zero_grad(set_to_none=False)  # gradients zeroed in place
    assert not torch.equal(model[0].weight, weight)
    assert np.array_equal(graph.value("0.weight"), weight.numpy())
    assert np.array_equal(graph.grad("0.weight"), grad.numpy())
    assert not graph.value("0.weight").flags.writeable
    # the weight and its transpose (and their gradients) are one copy of the step's memory, seen two ways
    assert np.array_equal(graph.value("0.t"), weight.numpy().T)
    assert np.array_equal(graph.grad("0.t"), grad.numpy().T)
    assert np.shares_memory(graph.value("0.t"), graph.value("0.weight"))
    assert np.shares_memory(graph.grad("0.t"), graph.grad("0.weight"))
    assert not np.shares_memory(graph.value("0.weight"), graph.grad("0.weight"))


def test_a_result_the_steps_code_still_holds_is_copied_and_one_nobody_holds_is_not() -> None:
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        kept = x * 2.0
        (kept.exp() * 1.0).sum().backward()
    graph = run.graph()
    with torch.no_grad():
        kept.add_(100.0)  # the caller's tensor changed after the capture: the graph keeps the step's numbers
    assert graph.value("mul").tolist() == [2.0, 2.0, 2.0]
    exp = graph.value("exp")  # held by no one but the graph: its memory, not a copy of it
    assert exp.tolist() == [math.exp(2.0)] * 3
    assert not exp.flags.writeable


def test_every_captures_backward_runs_outside_the_dispatch_mode_and_a_finished_capture_is_not_kept() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    modes: list[Any] = []
    finished: list[weakref.ref[Any]] = []
    for _ in range(3):
        with capture() as run:
            y = x * 2.0
            y.register_hook(lambda g: modes.append(_get_current_dispatch_mode()))
            (y * y).sum().backward()
            inside = _get_current_dispatch_mode()
        assert run.graph().grad("mul").tolist() == [4.0, 4.0, 4.0]
        assert inside is run._mode  # the mode is back for what the block does after the backward
        finished.append(weakref.ref(run))
        del run, inside
    assert modes == [None, None, None]
    gc.collect()
    assert [ref() for ref in finished] == [None, None, None]


def test_memory_the_steps_code_reaches_through_numpy_is_copied() -> None:
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        h = (x * 2.0).exp()
        numbers = h.detach().numpy()  # h's memory, held through a tensor the graph does not keep
        (h * 1.0).sum().backward()
        del h
    graph = run.graph()
    numbers += 100.0
    assert graph.value("exp").tolist() == [math.exp(2.0)] * 3
    assert not np.shares_memory(graph.value("exp"), numbers)


def test_a_view_the_steps_code_holds_makes_the_graph_copy_all_of_its_memory() -> None:
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        held = (x * 2.0).view(2, 2)  # the caller keeps a view; the product's own tensor is the capture's alone
        (held.view(4).exp() * 1.0).sum().backward()  # another view of the same memory, the capture's alone
    graph = run.graph()
    with torch.no_grad():
        held.add_(100.0)  # changes the product's memory through the view
    assert graph.value("mul").tolist() == [2.0] * 4
    assert graph.value("view").tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert graph.value("view1").tolist() == [2.0] * 4


def test_memory_only_the_capture_holds_is_kept_as_it_is_views_and_unkept_aliases_included() -> None:
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        h = (x * 2.0).exp()
        where = h.data_ptr()
        h.detach().sum()  # recorded, not part of the loss: its alias of h's memory is dropped
        (h.view(2, 2)[0] * 3.0).sum().backward()
        del h
    graph = run.graph()
    assert graph.value("exp").ctypes.data == where  # not a copy
    assert graph.value("exp").tolist() == [math.exp(2.0)] * 4
    assert graph.value("select").ctypes.data == where
    assert graph.grad("exp").tolist() == [3.0, 3.0, 0.0, 0.0]


def test_mse_loss_and_clamp_map_to_graphsvcs_ops_where_it_has_them(tmp_path: Path) -> None:
    x = torch.tensor([[0.5, -2.0], [3.0, 1.0]], dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[1.0, 0.0], [2.0, 1.5]], dtype=torch.float64)
    with capture() as run:
        F.mse_loss(x.clamp(-1.0, 2.5), target, reduction="sum").backward()
    graph = run.graph()
    registry, _ = load_registry()
    fused = "mse_loss" in registry and "clamp" in registry
    assert graph.op(graph.node_id("clamp")) == ("clamp" if fused else "aten.clamp.default")
    assert graph.attrs[graph.node_id("clamp")] == (
        {"min": -1.0, "max": 2.5} if fused else {"args": [{"input": 0}, -1.0, 2.5]}
    )
    loss = graph.node_id("mse_loss")
    assert graph.op(loss) == ("mse_loss" if fused else "aten.mse_loss.default")
    assert graph.value(loss) == (0.5 - 1) ** 2 + 1 + (2.5 - 2) ** 2 + (1 - 1.5) ** 2
    assert graph.grad("input0").tolist() == [[-1.0, 0.0], [0.0, -1.0]]  # 2 (x - t), 0 where clamped
    if fused:
        replayed(graph, tmp_path, torch.float64)


def test_the_ops_a_capture_maps_to_are_the_default_registrys_when_it_starts() -> None:
    from graphsvc.ops import OpRegistry

    clamp = load_registry()[0].get("clamp")
    x = torch.tensor([0.5, -2.0], dtype=torch.float64, requires_grad=True)

    def clamp_op() -> str:
        with capture() as run:
            x.clamp(-1.0, 2.5).sum().backward()
        graph = run.graph()
        return graph.op(graph.node_id("clamp"))

    registry = OpRegistry()
    try:
        graphsvc.use_registry(registry)
        assert clamp_op() == "aten.clamp.default"
        registry.register(clamp)  # the same registry, grown
        assert clamp_op() == "clamp"
        graphsvc.use_registry(OpRegistry())  # another registry
        assert clamp_op() == "aten.clamp.default"
    finally:
        graphsvc.use_registry(None)


def test_a_backward_on_another_thread_is_not_the_captured_steps() -> None:
    import threading

    other = torch.ones(2, dtype=torch.float64, requires_grad=True)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        thread = threading.Thread(target=lambda: (other * 3.0).sum().backward())
        thread.start()
        thread.join()
        (x * 2.0).sum().backward()
    assert other.grad is not None and other.grad.tolist() == [3.0, 3.0]
    graph = run.graph()
    assert [graph.op(n) for n in range(graph.num_nodes)] == ["leaf", "const", "mul", "sum"]
    assert graph.grad("input0").tolist() == [2.0, 2.0, 2.0]


def test_a_module_called_on_another_thread_is_not_in_the_steps_module_paths() -> None:
    import threading

    torch.manual_seed(0)
    model, elsewhere = nn.Sequential(nn.Linear(3, 2)), nn.Tanh()
    x = torch.ones(4, 3, dtype=torch.float32)
    with capture(model) as run:
        hidden = model[0](x)
        thread = threading.Thread(target=lambda: elsewhere(torch.ones(2)))
        thread.start()
        thread.join()
        hidden.relu().sum().backward()
    graph = run.graph()
    assert graph.metadata["captured"]["modules"] == ["0"]
    labels = [graph.label(n) for n in range(graph.num_nodes)]
    assert labels == ["0.weight", "0.t", "0.bias", "input0", "0.addmm", "relu", "sum"]


def test_a_capture_inside_another_is_refused_and_the_outer_one_still_records() -> None:
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        with pytest.raises(CaptureError) as refused, capture():
            pass
        (x * 2.0).sum().backward()
    assert str(refused.value) == "another capture is running (on this thread or another): capture one step at a time"
    assert run.graph().grad("input0").tolist() == [2.0, 2.0, 2.0]


def test_a_backward_after_a_capture_without_one_keeps_nothing_in_it() -> None:
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with capture() as run:
        y = (x * 2.0).exp()
    y.sum().backward()
    assert run._grads == {} and run._sink.grads == {} and not run._sink.open
    assert run.graph().value("exp").tolist() == [math.exp(2.0)] * 3


def test_a_graphs_copies_reuse_the_memory_an_earlier_graph_gave_back() -> None:
    from graphsvc.replay import memory
    from tests.conftest import require_native
    from tests.replay.test_memory import get_handler_name

    require_native("memory")
    memory.release()
    torch.manual_seed(0)
    model = nn.Linear(200, 100)  # a weight of 80,000 bytes: a block the cache keeps (64 KiB and more)
    x = torch.randn(4, 200)

    def step() -> Graph:
        model.zero_grad()
        with capture(model) as run:
            model(x).sum().backward()
        return run.graph()

    graph = step()
    weight = graph.value("weight")
    assert get_handler_name(weight.base if weight.base is not None else weight) == "graphsvc_reuse"
    assert np.array_equal(weight, model.weight.detach().numpy())  # a copy: the model's own is not kept
    del graph, weight
    before = memory.stats()
    again = step()
    assert memory.stats()["hits"] - before["hits"] >= 2  # the weight's copy and its gradient's
    assert np.array_equal(again.grad("weight"), model.weight.grad.numpy())
    memory.release()


@pytest.mark.parametrize("foreach", [False, True])
def test_gradient_clipping_and_an_optimizer_step_inside_the_block_change_nothing_in_the_graph(foreach: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    x = torch.randn(5, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, foreach=foreach)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with capture(model) as run:
        model(x).pow(2).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        nn.utils.clip_grad_norm_(model.parameters(), 1e-3, foreach=foreach)  # _foreach_mul_ when foreach
        optimizer.step()  # _foreach_add_ when foreach
    graph = run.graph()
    for name in before:
        assert np.array_equal(graph.value(name), before[name].numpy()), name
        assert np.array_equal(graph.grad(name), grads[name].numpy()), name
        assert not np.array_equal(graph.value(name), model.get_parameter(name).detach().numpy()), name


def test_a_failed_capture_keeps_none_of_the_steps_tensors() -> None:
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    for failure in ("raise", "two backwards"):
        run = capture(model)
        with pytest.raises((RuntimeError, CaptureError)):
            with run:
                h = model(x)
                alive = weakref.ref(h)
                if failure == "raise":
                    raise RuntimeError("the step failed")
                h.sum().backward(retain_graph=True)
                h.sum().backward()
        del h
        gc.collect()
        assert alive() is None, failure  # the capture, still held, keeps no activation
        with pytest.raises(CaptureError, match="nothing was captured"):
            run.graph()


def test_the_module_tree_is_the_modules_the_step_ran_whatever_the_ops_are_named() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            return self.linear(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.relu = Block()  # a module named as the op that runs at the top: relu
            self.out = nn.Linear(3, 1)

        def forward(self, x: Any) -> Any:
            return self.out(torch.relu(self.relu(x)))

    from graphsvc.console.views import module_tree

    model = Net()
    with capture(model) as run:
        model(torch.randn(2, 3)).sum().backward()
    graph = run.graph()
    assert "relu" in graph.names.values()  # the top-level op's node
    assert graph.metadata["captured"]["modules"] == ["relu", "relu.linear", "out"]
    # a module whose weights the step used without running it (attention's out_proj) is one too
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    with capture(layer) as run:
        layer(torch.randn(1, 3, 8)).sum().backward()
    tree = {m["module"]: m["parameters"] for m in module_tree(run.graph())}
    assert tree["self_attn.out_proj"] == 8 * 8 + 8 and tree["self_attn"] == 4 * 8 * 8 + 4 * 8
    assert [(m["module"], m["parameters"]) for m in module_tree(graph)] == [
        ("relu", 12),
        ("relu.linear", 12),
        ("out", 4),
    ]


def test_what_an_op_makes_under_no_grad_is_a_const_and_a_replay_differentiates_as_pytorch() -> None:
    torch.manual_seed(0)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 3, dtype=torch.float64)
    with capture() as run:
        with torch.no_grad():
            scale = w.abs().sum()  # a constant to PyTorch's backward
        loss = (x @ (w / scale)).pow(2).sum()
        loss.backward()
    graph = run.graph()
    ops = {graph.label(n): graph.op(n) for n in range(graph.num_nodes)}
    assert ops["sum"] == "const" and graph.parents(graph.node_id("sum")) == []
    assert "abs" not in ops  # only the no_grad result is kept, as a value
    assert graph.value("sum") == scale.item()
    replayed = graphsvc.backward(graph)
    np.testing.assert_allclose(replayed.grad("input0"), w.grad.numpy(), rtol=1e-12)
    assert np.array_equal(graph.grad("input0"), w.grad.numpy())
    # without a backward there is no gradient to hold: the ops stay
    with capture() as run:
        with torch.no_grad():
            w.abs().sum()
    assert [run.graph().op(n) for n in range(run.graph().num_nodes)] == ["leaf", "abs", "sum"]


def test_two_threads_starting_captures_at_once_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from graphsvc.torch import capturing

    mode_class = capturing._mode_class
    first_inside, go_on = threading.Event(), threading.Event()

    def slow_mode_class() -> Any:  # the first capture stops half way through starting
        if threading.current_thread().name == "first":
            first_inside.set()
            assert go_on.wait(10)
        return mode_class()

    monkeypatch.setattr(capturing, "_mode_class", slow_mode_class)
    first = capture()
    results: dict[str, Any] = {}

    second_done = threading.Event()

    def start_first() -> None:
        results["first"] = first.__enter__()
        assert second_done.wait(10)
        first.__exit__(None, None, None)  # the dispatch mode is this thread's: it ends here

    def start_second() -> None:
        try:
            capture().__enter__()
            results["second"] = "entered"
        except CaptureError as exc:
            results["second"] = str(exc)
        second_done.set()

    a = threading.Thread(target=start_first, name="first")
    a.start()
    assert first_inside.wait(10)
    b = threading.Thread(target=start_second, name="second")
    b.start()
    b.join(0.2)  # it waits for the first to finish starting
    go_on.set()
    b.join(10)
    a.join(10)
    assert results == {
        "first": first,
        "second": "another capture is running (on this thread or another): capture one step at a time",
    }


def test_a_compiled_module_in_the_block_records_the_same_step_and_dynamo_never_runs_the_captures_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.compile of a model inside the block (or before it) runs eagerly under the capture's
    dispatch mode, and the capture's handler and all it calls run with Dynamo's frame callback off
    (Dynamo would otherwise try to compile them: the mode is off its stack while its handler runs)."""
    from graphsvc.torch import capturing

    def step(model: Any, x: Any) -> Graph:
        model.zero_grad(set_to_none=True)
        with capture(linear) as run:
            model(x).pow(2).mean().backward()
        return run.graph()

    torch.manual_seed(0)
    linear, x = nn.Linear(4, 3), torch.randn(5, 4)
    expected = step(linear, x)
    callbacks: list[Any] = []
    dispatch = capturing.Capture.dispatch

    def watched(self: Any, func: Any, args: Any, kwargs: Any) -> Any:
        callbacks.append(torch._C._dynamo.eval_frame.get_eval_frame_callback())
        return dispatch(self, func, args, kwargs)

    monkeypatch.setattr(capturing.Capture, "dispatch", watched)
    with pytest.warns(UserWarning, match="global hooks on modules"):  # PyTorch's, of the capture's module hooks
        got = step(torch.compile(linear), x)
    assert callbacks and all(c is None for c in callbacks)
    assert listing(got) == listing(expected)
    for node, grad in expected.grad_arrays.items():
        assert same_bits(got.grad_arrays[node], grad)


def test_a_capture_does_not_import_dynamo() -> None:
    """A first capture in a process costs no import of torch._dynamo (a second or more)."""
    code = (
        "import sys, torch\n"
        "from graphsvc.torch import capture\n"
        "m = torch.nn.Linear(3, 2)\n"
        "with capture(m) as run:\n"
        "    m(torch.randn(4, 3)).sum().backward()\n"
        "print(run.graph().num_nodes, 'torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "False"]  # weight, bias, input, t, addmm, sum


def test_a_models_names_are_named_parameters_buffers_and_modules_own() -> None:
    """The one walk of the modules that names a model's tensors gives what named_parameters(),
    named_buffers() and named_modules() give: tied weights, a shared module, a bias of None and
    buffers included; a class that names its own way is asked."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 4)
            self.shared = nn.Linear(4, 4, bias=False)
            self.blocks = nn.Sequential(self.shared, nn.BatchNorm1d(4), self.shared)
            self.head = nn.Linear(4, 5)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("scale", torch.ones(()))

    class Renamed(Tied):
        def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
            for name, p in super().named_parameters(*args, **kwargs):
                yield f"renamed.{name}", p

    for model in (Tied(), Renamed(), nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)):
        run = capture(model)
        with run:
            pass
        expected: dict[int, str] = {}
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            expected.setdefault(id(t), name)
        assert run._leaf_names == expected
        assert list(run._leaf_names.values()) == list(expected.values())
        assert run._paths == {id(m): name for name, m in reversed(list(model.named_modules()))}
        assert ("renamed.embed.weight" in run._leaf_names.values()) == isinstance(model, Renamed)


def test_a_pytorch_without_dynamos_code_mark_gets_its_default_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch._C has no set_code_exec_strategy, the mode's handler is wrapped as PyTorch wraps
    every TorchDispatchMode's (torch._dynamo.disable), and a capture records as before."""
    from graphsvc.torch import capturing

    monkeypatch.delattr(torch._C._dynamo.eval_frame, "set_code_exec_strategy")
    capturing._mode_class.cache_clear()
    try:
        mode = capturing._mode_class()
        assert mode._should_skip_dynamo() is True
        assert mode.__dict__["__torch_dispatch__"].__name__ == "handler"  # functools.wraps'd by PyTorch
        assert mode.__dict__["__torch_dispatch__"].__code__.co_name != "handler"
        x = torch.ones(3, dtype=torch.float64, requires_grad=True)
        with capture() as run:
            (x * 2.0).sum().backward()
        assert run.graph().grad("input0").tolist() == [2.0, 2.0, 2.0]
    finally:
        capturing._mode_class.cache_clear()


def test_a_lazy_module_is_captured_and_its_parameters_counted_once_they_have_shapes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU(), nn.Linear(3, 1))
    x = torch.randn(5, 4)
    with capture(model) as run:
        model(x).sum().backward()
    graph = run.graph()
    assert graph.metadata["captured"]["parameters"] == 4 * 3 + 3 + 3 + 1
    assert np.array_equal(graph.grad("0.weight"), model[0].weight.grad.numpy())


def test_a_model_that_names_or_counts_its_parameters_its_own_way_is_asked() -> None:
    class Trainable(nn.Module):  # parameters() gives the trainable ones only
        def __init__(self) -> None:
            super().__init__()
            self.frozen, self.head = nn.Linear(4, 4), nn.Linear(4, 2)
            self.frozen.requires_grad_(False)

        def forward(self, x: Any) -> Any:
            return self.head(self.frozen(x))

        def parameters(self, recurse: bool = True) -> Any:
            return (p for p in super().parameters(recurse) if p.requires_grad)

    model = Trainable()
    with capture(model) as run:
        model(torch.ones(2, 4)).sum().backward()
    assert run.graph().metadata["captured"]["parameters"] == 4 * 2 + 2

    patched = nn.Sequential(nn.Linear(3, 2))
    named = patched.named_parameters
    patched.named_parameters = lambda *a, **k: ((f"patched.{n}", p) for n, p in named(*a, **k))  # type: ignore[method-assign]
    x = torch.ones(1, 3)
    with capture(patched) as run:
        patched(x).sum().backward()
    graph = run.graph()
    assert [graph.label(n) for n in range(graph.num_nodes)][:3] == ["patched.0.weight", "0.t", "patched.0.bias"]


def test_the_leaves_hooks_go_when_the_capture_ends_and_a_class_with_its_own_register_hook_is_asked() -> None:
    asked: list[str] = []

    class Hooked(nn.Parameter):
        def register_hook(self, hook: Any) -> Any:
            asked.append("register_hook")
            return super().register_hook(hook)

    model = nn.Linear(3, 2)
    model.weight = Hooked(model.weight.detach().clone())
    user_hook = model.bias.register_hook(lambda g: None)
    with capture(model) as run:
        model(torch.ones(1, 3)).sum().backward()
    assert asked == ["register_hook"]
    assert list(model.bias._backward_hooks) == [user_hook.id]  # the user's own stays
    assert not model.weight._backward_hooks  # the subclass's handle, removed
    assert run.graph().grad("weight").tolist() == [[1.0, 1.0, 1.0]] * 2


def test_a_number_that_does_not_fit_the_tensors_dtype_is_refused_naming_the_op() -> None:
    x = torch.ones(2, dtype=torch.int8)
    with pytest.raises(CaptureError) as caught, capture():
        x + 300
    assert str(caught.value) == "capture cannot record aten.add.Tensor: its number 300 does not fit int8"


def test_a_model_whose_naming_fails_leaves_no_capture_running() -> None:
    class Broken(nn.Linear):
        def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
            raise Refused("refused")

    before = pytorch_state()
    run = capture(Broken(2, 2))
    with pytest.raises(Refused), run:
        pass
    assert pytorch_state() == before
    with pytest.raises(CaptureError, match=r"^nothing was captured$"):
        run.graph()


@pytest.mark.parametrize("alias", ["clone", "view_as", "detach", "contiguous"])
def test_an_alias_made_under_no_grad_carries_no_gradient_in_a_replay(alias: str) -> None:
    """PyTorch's backward does not reach w through a clone (or view, or contiguous copy) made under
    torch.no_grad(); a replay of the captured step does not either."""
    w = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    with capture() as run:
        with torch.no_grad():
            if alias == "clone":
                c = w.clone()
            elif alias == "view_as":
                c = w.view_as(w)
            elif alias == "contiguous":
                c = w.contiguous()
            else:
                c = w.detach()
        (w * c).sum().backward()
    # c, not 2w (a contiguous tensor's contiguous() is the tensor itself: 2w)
    expected = [2.0, -4.0, 6.0] if alias == "contiguous" else [1.0, -2.0, 3.0]
    assert w.grad is not None and w.grad.tolist() == expected
    graph = run.graph()
    replayed = graphsvc.backward(graph)
    assert replayed.grad("input0").tolist() == expected
    assert np.array_equal(graph.grad("input0"), w.grad.numpy())
    # without a backward, the same step keeps its structure: the alias stays an op on w
    with capture() as run:
        with torch.no_grad():
            c = w.clone()
        w * c
    assert [run.graph().op(n) for n in range(run.graph().num_nodes)] == ["leaf", "reshape", "mul"]


def test_a_leaf_changed_in_place_under_no_grad_is_a_new_leaf_with_pytorchs_gradient() -> None:
    """A weight normalized by hand before it is used: PyTorch's gradient is that of the changed
    tensor (x), not through the change (2x); the graph's new leaf holds the new value and it."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1, bias=False, dtype=torch.float64)
    x = torch.tensor([[4.0, 5.0, 6.0]], dtype=torch.float64)
    before = model.weight.detach().clone()
    with capture(model) as run:
        with torch.no_grad():
            model.weight.div_(model.weight.norm())
        model(x).sum().backward()
    graph = run.graph()
    assert [graph.label(n) for n in range(graph.num_nodes)] == ["weight", "t", "input0", "mm", "sum"]
    assert graph.op(graph.node_id("weight")) == "leaf"
    assert np.array_equal(graph.value("weight"), model.weight.detach().numpy())
    assert not np.array_equal(graph.value("weight"), before.numpy())
    assert np.array_equal(graph.grad("weight"), model.weight.grad.numpy())
    assert model.weight.grad.tolist() == [[4.0, 5.0, 6.0]]
    replayed = graphsvc.backward(graph)
    assert replayed.grad("weight").tolist() == [[4.0, 5.0, 6.0]]
    # used before the change too: the value before is a leaf of its own, named so
    w = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    with capture() as run:
        first = w * 3.0
        with torch.no_grad():
            w.mul_(2.0)
        (first + w).sum().backward()
    graph = run.graph()
    assert graph.label(0) == "input0.before" and graph.value("input0.before").tolist() == [1.0, 2.0]
    assert graph.value("input0").tolist() == [2.0, 4.0]


def test_a_custom_function_applied_under_no_grad_is_a_const_and_a_replay_needs_no_plugin() -> None:
    w = torch.tensor([0.5, -1.0, 1.5], dtype=torch.float64, requires_grad=True)
    with capture() as run:
        with torch.no_grad():
            c = Seed002.apply(w)
        (w * c).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, c)  # c, not c + w f'(w)
    graph = run.graph()
    assert graph.op(graph.node_id("Seed002")) == "const" and graph.parents(graph.node_id("Seed002")) == []
    replayed = graphsvc.backward(graph)  # builtin ops only: the Function's node is its value
    assert np.array_equal(replayed.grad("input0"), w.grad.numpy())


def test_a_tensor_filled_in_place_with_random_numbers_is_a_const_holding_the_draw() -> None:
    """uniform_ on a tensor that requires grad: PyTorch's backward sends nothing through the draw
    (w.grad is the numbers drawn); the graph holds them, so a replay reproduces the step exactly."""
    torch.manual_seed(0)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    with capture() as run:
        h = w * 1.0
        h.uniform_()
        (h * w).sum().backward()
    graph = run.graph()
    assert graph.op(graph.node_id("uniform")) == "const"
    assert np.array_equal(graph.value("uniform"), h.detach().numpy())
    assert w.grad is not None and torch.equal(w.grad, h.detach())
    assert np.array_equal(graphsvc.backward(graph).grad("input0"), w.grad.numpy())
