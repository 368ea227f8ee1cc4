"""The benchmark models (benchmarks/tensor_models.py), replayed by graphsvc.backward, give the
gradients PyTorch gives on the same computation and the same parameters, and those of the
hand-written numpy versions (benchmarks/numpy_models.py); small sizes, the float64 and float32
tolerances of :data:`RTOL`.

A gradient matches when every element is within ``rtol`` of the reference, relative to the largest
element of that parameter's gradient (``atol = rtol * max|reference|``): elements that sum to near
zero have no meaningful relative error of their own in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphsvc
from benchmarks.numpy_models import NUMPY, torch_loss
from benchmarks.tensor_models import MODELS, SMALL_OP_MODELS, TensorModel
from graphsvc.graph import GraphBuilder
from graphsvc.ops import OpRegistry
from graphsvc.pluginhost import load_registry
from tests.conftest import needs_torch

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

CONV_REASON = "pip install ./plugins/graphsvc-conv"
RTOL: dict[type, float] = {np.float64: 1e-10, np.float32: 1e-4}
#: Small versions of the three models (the benchmark uses the issue's sizes, the builders' defaults).
SMALL: dict[str, dict[str, Any]] = {
    "mlp": {"batch": 4, "sizes": (12, 16, 16, 5)},
    "cnn": {"batch": 4, "image": 8, "channels": (3, 4), "classes": 5},
    "transformer": {"batch": 2, "seq": 6, "d_model": 16, "heads": 4, "hidden": 24, "classes": 5},
}
CASES = [(name, dtype) for name in SMALL for dtype in RTOL]


def registry_for(name: str) -> OpRegistry:
    if name == "cnn":
        pytest.importorskip("graphsvc_conv", reason=CONV_REASON)
        registry, problems = load_registry(["graphsvc_conv"])
    else:
        registry, problems = load_registry(disable_third_party=True)
    assert not problems
    return registry


def small(name: str, dtype: type, seed: int = 3) -> TensorModel:
    return MODELS[name](dtype, seed, **SMALL[name])


def assert_close(got: Any, expected: np.ndarray, dtype: type, what: str) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == expected.shape, what
    rtol = RTOL[dtype]
    scale = float(np.abs(expected).max())
    assert scale > 0, what
    worst = float(np.abs(got - expected).max())
    assert worst <= rtol * scale, f"{what}: max |error| {worst:.3g} > {rtol:g} * {scale:.3g}"


@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{d.__name__}" for n, d in CASES])
def test_graphsvc_gradients_match_pytorch_and_the_hand_written_numpy(name: str, dtype: type) -> None:
    torch = needs_torch()
    registry = registry_for(name)
    model = small(name, dtype)
    replayed = graphsvc.backward(model.graph, output="loss", registry=registry)

    params = {key: torch.tensor(value, requires_grad=True) for key, value in model.params.items()}
    data = {key: torch.tensor(value) for key, value in model.data.items()}
    loss = torch_loss(name, params, data, model.config)
    loss.backward()
    numpy_loss, numpy_grads = NUMPY[name](model.params, model.data, model.config)

    rtol = RTOL[dtype]
    # a float64 loss is a scalar node (a float); a float32 one a 0-d float32 array
    assert np.result_type(replayed.value("loss")) == dtype
    assert float(replayed.value("loss")) == pytest.approx(loss.item(), rel=rtol)
    assert numpy_loss == pytest.approx(loss.item(), rel=rtol)
    assert set(numpy_grads) == set(model.params)
    for key, tensor in params.items():
        expected = tensor.grad.numpy()
        assert_close(replayed.grad(key), expected, dtype, f"{name} {key}: graphsvc against PyTorch")
        assert_close(numpy_grads[key], expected, dtype, f"{name} {key}: numpy against PyTorch")


@pytest.mark.parametrize("name", list(SMALL))
def test_graphsvc_gradients_match_the_hand_written_numpy_in_float64(name: str) -> None:
    """Without torch: graphsvc and the hand-written VJPs agree, and a gradient is not all zeros."""
    model = small(name, np.float64, seed=11)
    replayed = graphsvc.backward(model.graph, output="loss", registry=registry_for(name))
    numpy_loss, numpy_grads = NUMPY[name](model.params, model.data, model.config)
    assert float(replayed.value("loss")) == pytest.approx(numpy_loss, rel=1e-12)
    for key, expected in numpy_grads.items():
        assert_close(replayed.grad(key), expected, np.float64, f"{name} {key}")


#: Small versions of the graphs of many small ops (bench_per_node.py uses the builders' defaults).
SMALL_OPS: dict[str, dict[str, Any]] = {
    "deep_mlp": {"batch": 3, "width": 4, "layers": 6},
    "attention_stack": {"batch": 2, "seq": 3, "d_model": 4, "heads": 2, "hidden": 6, "layers": 2},
}
SMALL_OP_CASES = [(name, dtype) for name in SMALL_OPS for dtype in RTOL]


@pytest.mark.parametrize(("name", "dtype"), SMALL_OP_CASES, ids=[f"{n}-{d.__name__}" for n, d in SMALL_OP_CASES])
def test_the_graphs_of_small_ops_give_pytorchs_loss_and_gradients(name: str, dtype: type) -> None:
    torch = needs_torch()
    model = SMALL_OP_MODELS[name](dtype, 3, **SMALL_OPS[name])
    replayed = graphsvc.backward(model.graph, output="loss", registry=registry_for(name))
    params = {key: torch.tensor(value, requires_grad=True) for key, value in model.params.items()}
    loss = torch_loss(name, params, {key: torch.tensor(value) for key, value in model.data.items()}, model.config)
    loss.backward()
    assert loss.dtype == {np.float32: torch.float32, np.float64: torch.float64}[dtype]
    assert float(replayed.value("loss")) == pytest.approx(loss.item(), rel=RTOL[dtype])
    for key, tensor in params.items():
        assert_close(replayed.grad(key), tensor.grad.numpy(), dtype, f"{name} {key}: graphsvc against PyTorch")


def test_the_graphs_of_small_ops_have_the_benchmarks_nodes() -> None:
    """deep_mlp: 64 layers of matmul, add, relu or tanh, then sum and mean (194 op nodes); attention_stack: 8
    blocks of 23 op nodes, then mean (185). Nothing replayed."""
    deep = SMALL_OP_MODELS["deep_mlp"](np.float32, 0)
    tags = [deep.graph.op_table[code] for code in deep.graph.op_codes.tolist()]
    assert deep.params["w64"].shape == (16, 16) and deep.data["x"].shape == (32, 16)
    assert [tags.count(op) for op in ("matmul", "add", "relu", "tanh", "sum", "mean")] == [64, 64, 32, 32, 1, 1]
    stack = SMALL_OP_MODELS["attention_stack"](np.float64, 0)
    tags = [stack.graph.op_table[code] for code in stack.graph.op_codes.tolist()]
    counts = {op: tags.count(op) for op in set(tags) - {"leaf", "const"}}
    assert counts == {
        "matmul": 8 * 8,
        "reshape": 8 * 4,
        "transpose": 8 * 4,
        "mul": 8,
        "softmax": 8,
        "add": 8 * 4,
        "relu": 8,
        "mean": 1,
    }


def test_the_full_size_models_have_the_issues_shapes() -> None:
    """The benchmark's sizes, checked on the graphs' parameters and data (nothing replayed)."""
    mlp = MODELS["mlp"](np.float32, 0)
    assert {k: v.shape for k, v in mlp.params.items()} == {
        "w1": (784, 512),
        "b1": (512,),
        "w2": (512, 512),
        "b2": (512,),
        "w3": (512, 10),
        "b3": (10,),
    }
    assert mlp.data["x"].shape == (128, 784) and mlp.data["x"].dtype == np.float32
    cnn = MODELS["cnn"](np.float32, 0)
    assert cnn.data["x"].shape == (32, 1, 28, 28)
    assert [cnn.params[k].shape for k in ("conv1", "conv2", "w3")] == [(8, 1, 3, 3), (16, 8, 3, 3), (784, 10)]
    block = MODELS["transformer"](np.float64, 0)
    assert block.data["x"].shape == (8, 64, 128) and block.data["x"].dtype == np.float64
    assert block.params["w1"].shape == (128, 512) and block.params["wh"].shape == (128, 10)
    assert block.config["heads"] == 4
    ops = set(block.graph.op_table)
    assert {"softmax", "pow", "log_softmax", "nll_loss"} <= ops and "conv2d" not in ops
    assert {"conv2d", "max_pool2d"} <= set(cnn.graph.op_table)


def test_a_0d_float32_node_used_twice_gets_its_gradient() -> None:
    """y = s * s with s = sum(x) in float32: dy/ds = 2s = 12, dy/dx = 12 for every element."""
    b = GraphBuilder()
    x = b.leaf(np.array([1.0, 2.0, 3.0], dtype=np.float32), name="x")
    s = b.add("sum", [x], name="s")
    b.add("mul", [s, s], name="y")
    replayed = graphsvc.backward(b.build(), registry=registry_for("mlp"))
    assert float(replayed.value("y")) == 36.0
    grad_s, grad_x = replayed.grad("s"), replayed.grad("x")
    assert isinstance(grad_s, np.ndarray) and grad_s.dtype == np.float32 and float(grad_s) == 12.0
    assert isinstance(grad_x, np.ndarray) and grad_x.tolist() == [12.0, 12.0, 12.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_hand_written_pool_vjp_gives_the_plugins_bits_negative_zeros_included(dtype: type) -> None:
    """The numpy floor's max_pool2d(2) VJP does what the conv plugin does, to the bit: a -0.0 in g
    gives +0.0, as PyTorch's (which adds g to zeros), so the two stay a like-for-like comparison."""
    graphsvc_conv = pytest.importorskip("graphsvc_conv", reason=CONV_REASON)
    from benchmarks.numpy_models import _pool2x2, _pool2x2_vjp

    rng = np.random.default_rng(31)
    x = rng.choice(np.array([0.0, -0.0, 1.0, 2.0, -1.0]), size=(2, 3, 6, 8)).astype(dtype)  # ties
    out = _pool2x2(x)
    g = rng.choice(np.array([0.0, -0.0, -0.0, 1.0, -2.5]), size=out.shape).astype(dtype)
    (expected,) = graphsvc_conv.max_pool2d_vjp(g, out, x, 2)
    grad = _pool2x2_vjp(g, x, out)
    assert np.signbit(g[g == 0]).any() and not np.signbit(grad[grad == 0]).any()
    assert grad.dtype == dtype and grad.tobytes() == expected.tobytes()
