"""Three tensor models (an MLP, a CNN, a transformer block) as graphsvc graphs, built with GraphBuilder and builtin ops.

Each builder returns a :class:`TensorModel`: the graph (its loss node is named ``loss``), the
parameter arrays by name (the graph's ``leaf`` nodes, named the same) and the data (``x``, a const
node; ``labels``). The same names and arrays feed the hand-written numpy and the PyTorch versions in
:mod:`benchmarks.numpy_models`.

- :func:`mlp`: 784-512-512-10, relu, batch 128.
- :func:`cnn`: conv2d(1->8, 3x3, padding 1, with bias), relu, max_pool2d(2); conv2d(8->16, 3x3,
  padding 1, with bias), relu, max_pool2d(2); reshape; linear to 10; batch 32 of 28x28 images.
  conv2d (its bias an input, one node, as PyTorch's ``F.conv2d(x, w, b)``) and max_pool2d come
  from the plugin distribution plugins/graphsvc-conv.
- :func:`transformer`: one pre-norm block, d_model 128, 4 heads, sequence 64, batch 8: layer norm
  (written with mean, sub, pow 2, add eps, pow -0.5, mul, add), softmax attention with q, k, v and
  output projections (no biases), residual, layer norm, MLP 128-512-128 with relu, residual; then
  the mean over the sequence and a linear head to 10 classes.

Every model ends in the same cross-entropy, as PyTorch's graph of ``F.cross_entropy`` has it:
log_softmax over the classes, then nll_loss with the labels (an int64 const), mean over the rows.
A linear layer is ``x @ w + b`` with ``w`` of shape (in, out). Constants (the attention
scale, layer norm's eps) are 0-d arrays of the model's dtype, so float32 stays float32 (a 0-d
float64 array would promote every result to float64 under numpy's rules).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphsvc.graph import Graph, GraphBuilder

__all__ = [
    "LAYER_NORM_EPS",
    "MODELS",
    "SMALL_OP_MODELS",
    "TensorModel",
    "attention_stack",
    "cnn",
    "deep_mlp",
    "mlp",
    "transformer",
]

#: Layer norm's eps (PyTorch's default).
LAYER_NORM_EPS = 1e-5


@dataclass
class TensorModel:
    """A model's graph, its parameters by name (leaves of the graph) and its data."""

    name: str
    graph: Graph
    params: dict[str, np.ndarray]
    data: dict[str, np.ndarray]  # "x" (the input), "labels" (int64 classes)
    config: dict[str, Any]


class _Builder:
    """GraphBuilder with the layers the models share."""

    def __init__(self, dtype: np.dtype) -> None:
        self.b = GraphBuilder()
        self.dtype = dtype

    def op(self, op: str, *parents: int, name: str | None = None, **attrs: Any) -> int:
        return self.b.add(op, list(parents), attrs=attrs or None, name=name)

    def scalar(self, value: float, name: str) -> int:
        return self.b.const(np.array(value, dtype=self.dtype), name=name)

    def linear(self, x: int, w: int, bias: int) -> int:
        return self.op("add", self.op("matmul", x, w), bias)

    def layer_norm(self, x: int, gamma: int, beta: int, eps: int) -> int:
        mu = self.op("mean", x, axis=-1, keepdims=True)
        centered = self.op("sub", x, mu)
        var = self.op("mean", self.op("pow", centered, exponent=2.0), axis=-1, keepdims=True)
        inv_std = self.op("pow", self.op("add", var, eps), exponent=-0.5)
        return self.op("add", self.op("mul", self.op("mul", centered, inv_std), gamma), beta)

    def cross_entropy(self, logits: int, labels: np.ndarray) -> int:
        logp = self.op("log_softmax", logits, axis=-1)
        return self.op("nll_loss", logp, self.b.const(labels.astype(np.int64), name="labels"), name="loss")


def _weights(rng: np.random.Generator, dtype: np.dtype, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Normal weights scaled by 1/sqrt(fan-in) (the product of all but the first axis of a conv weight,
    the first axis of a matrix); biases small, layer norm's gamma near 1 and beta near 0."""
    params = {}
    for name, shape in shapes.items():
        if name.startswith("gamma"):
            array = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.startswith(("b", "beta")):
            array = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            array = rng.standard_normal(shape) / np.sqrt(fan_in)
        params[name] = array.astype(dtype)
    return params


def mlp(
    dtype: Any = np.float32, seed: int = 0, *, batch: int = 128, sizes: tuple[int, ...] = (784, 512, 512, 10)
) -> TensorModel:
    """An MLP with relu between the layers and a cross-entropy loss."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), start=1):
        shapes[f"w{i}"], shapes[f"b{i}"] = (fan_in, fan_out), (fan_out,)
    params = _weights(rng, dtype, shapes)
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    labels = rng.integers(0, sizes[-1], batch)
    g = _Builder(dtype)
    h = g.b.const(x, name="x")
    ids = {name: g.b.leaf(array, name=name) for name, array in params.items()}
    layers = len(sizes) - 1
    for i in range(1, layers + 1):
        h = g.linear(h, ids[f"w{i}"], ids[f"b{i}"])
        if i < layers:
            h = g.op("relu", h)
    g.cross_entropy(h, labels)
    config = {"batch": batch, "sizes": list(sizes)}
    return TensorModel("mlp", g.b.build(outputs=["loss"]), params, {"x": x, "labels": labels}, config)


def cnn(
    dtype: Any = np.float32,
    seed: int = 0,
    *,
    batch: int = 32,
    image: int = 28,
    channels: tuple[int, int] = (8, 16),
    classes: int = 10,
) -> TensorModel:
    """Two conv2d(3x3, padding 1, with bias), relu, max_pool2d(2) stages, then a linear layer;
    ``image`` must be divisible by 4."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    c1, c2 = channels
    flat = c2 * (image // 4) ** 2
    shapes: dict[str, tuple[int, ...]] = {
        "conv1": (c1, 1, 3, 3),
        "b1": (c1,),
        "conv2": (c2, c1, 3, 3),
        "b2": (c2,),
        "w3": (flat, classes),
        "b3": (classes,),
    }
    params = _weights(rng, dtype, shapes)
    x = rng.standard_normal((batch, 1, image, image)).astype(dtype)
    labels = rng.integers(0, classes, batch)
    g = _Builder(dtype)
    h = g.b.const(x, name="x")
    ids = {name: g.b.leaf(array, name=name) for name, array in params.items()}
    for conv, bias in (("conv1", "b1"), ("conv2", "b2")):
        h = g.op("conv2d", h, ids[conv], ids[bias], stride=1, padding=1)
        h = g.op("max_pool2d", g.op("relu", h), kernel_size=2, stride=2)
    h = g.op("reshape", h, shape=[batch, flat])
    g.cross_entropy(g.linear(h, ids["w3"], ids["b3"]), labels)
    config = {"batch": batch, "image": image, "channels": list(channels), "classes": classes}
    return TensorModel("cnn", g.b.build(outputs=["loss"]), params, {"x": x, "labels": labels}, config)


def transformer(
    dtype: Any = np.float32,
    seed: int = 0,
    *,
    batch: int = 8,
    seq: int = 64,
    d_model: int = 128,
    heads: int = 4,
    hidden: int = 512,
    classes: int = 10,
) -> TensorModel:
    """One pre-norm transformer block, mean over the sequence, a linear head (see the module docstring)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    d, head = d_model, d_model // heads
    shapes: dict[str, tuple[int, ...]] = {
        "gamma1": (d,),
        "beta1": (d,),
        "wq": (d, d),
        "wk": (d, d),
        "wv": (d, d),
        "wo": (d, d),
        "gamma2": (d,),
        "beta2": (d,),
        "w1": (d, hidden),
        "b1": (hidden,),
        "w2": (hidden, d),
        "b2": (d,),
        "wh": (d, classes),
        "bh": (classes,),
    }
    params = _weights(rng, dtype, shapes)
    x = rng.standard_normal((batch, seq, d)).astype(dtype)
    labels = rng.integers(0, classes, batch)
    g = _Builder(dtype)
    x_id = g.b.const(x, name="x")
    ids = {name: g.b.leaf(array, name=name) for name, array in params.items()}
    eps = g.scalar(LAYER_NORM_EPS, "eps")
    scale = g.scalar(1.0 / np.sqrt(head), "scale")

    def split_heads(t: int, axes: list[int]) -> int:
        return g.op("transpose", g.op("reshape", t, shape=[batch, seq, heads, head]), axes=axes)

    h = g.layer_norm(x_id, ids["gamma1"], ids["beta1"], eps)
    q = split_heads(g.op("matmul", h, ids["wq"]), [0, 2, 1, 3])  # (B, H, T, dh)
    k_t = split_heads(g.op("matmul", h, ids["wk"]), [0, 2, 3, 1])  # (B, H, dh, T)
    v = split_heads(g.op("matmul", h, ids["wv"]), [0, 2, 1, 3])
    scores = g.op("mul", g.op("matmul", q, k_t), scale)
    context = g.op("matmul", g.op("softmax", scores, axis=-1), v)  # (B, H, T, dh)
    merged = g.op("reshape", g.op("transpose", context, axes=[0, 2, 1, 3]), shape=[batch, seq, d])
    x1 = g.op("add", x_id, g.op("matmul", merged, ids["wo"]))
    h2 = g.layer_norm(x1, ids["gamma2"], ids["beta2"], eps)
    mlp_out = g.linear(g.op("relu", g.linear(h2, ids["w1"], ids["b1"])), ids["w2"], ids["b2"])
    x2 = g.op("add", x1, mlp_out)
    pooled = g.op("mean", x2, axis=1)
    g.cross_entropy(g.linear(pooled, ids["wh"], ids["bh"]), labels)
    config = {"batch": batch, "seq": seq, "d_model": d, "heads": heads, "hidden": hidden, "classes": classes}
    return TensorModel("transformer", g.b.build(outputs=["loss"]), params, {"x": x, "labels": labels}, config)


#: The builders by model name, with the issue's sizes as defaults.
MODELS: dict[str, Callable[..., TensorModel]] = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


# -- graphs of many small ops: what the engine's cost per node decides ------------------------------
def deep_mlp(
    dtype: Any = np.float32, seed: int = 0, *, batch: int = 32, width: int = 16, layers: int = 64
) -> TensorModel:
    """``layers`` linear layers of ``width`` (``matmul``, then ``add`` of a bias broadcast over the
    batch), relu and tanh alternating after each; the loss is ``mean(sum(h, axis=1))``. Three op nodes
    a layer, on arrays of ``batch`` x ``width`` numbers: the arithmetic is small, so the time is the
    cost per node of whoever runs it."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(1, layers + 1):
        shapes[f"w{i}"], shapes[f"b{i}"] = (width, width), (width,)
    params = _weights(rng, dtype, shapes)
    x = rng.standard_normal((batch, width)).astype(dtype)
    g = _Builder(dtype)
    h = g.b.const(x, name="x")
    ids = {name: g.b.leaf(array, name=name) for name, array in params.items()}
    for i in range(1, layers + 1):
        h = g.op("relu" if i % 2 else "tanh", g.linear(h, ids[f"w{i}"], ids[f"b{i}"]))
    g.op("mean", g.op("sum", h, axis=1), name="loss")
    config = {"batch": batch, "width": width, "layers": layers}
    return TensorModel("deep_mlp", g.b.build(outputs=["loss"]), params, {"x": x}, config)


def attention_stack(
    dtype: Any = np.float32,
    seed: int = 0,
    *,
    batch: int = 2,
    seq: int = 8,
    d_model: int = 16,
    heads: int = 2,
    hidden: int = 32,
    layers: int = 8,
) -> TensorModel:
    """``layers`` transformer-like blocks of small ops, as a captured encoder layer has them: q, k and
    v projections (``matmul``), each split into heads (``reshape``, ``transpose``), scores
    (``matmul``, ``mul`` by a 0-d scale), ``softmax``, the weighted values (``matmul``), the heads
    merged (``transpose``, ``reshape``), an output projection and a residual ``add``, then an MLP
    (``matmul``, ``add`` of a bias, ``relu``, ``matmul``, ``add``) and a residual ``add``: 23 op nodes
    a block. The loss is the ``mean`` of the last block's output."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    d, head = d_model, d_model // heads
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(1, layers + 1):
        for name in ("wq", "wk", "wv", "wo"):
            shapes[f"{name}{i}"] = (d, d)
        shapes[f"w1_{i}"], shapes[f"b1_{i}"] = (d, hidden), (hidden,)
        shapes[f"w2_{i}"], shapes[f"b2_{i}"] = (hidden, d), (d,)
    # weights at half the usual scale: the residual stream then grows little over the blocks, and the
    # softmaxes stay far from saturation, so float32's gradients stay within 1e-4 of float64's
    params = {name: (0.5 * array).astype(dtype) for name, array in _weights(rng, dtype, shapes).items()}
    x = rng.standard_normal((batch, seq, d)).astype(dtype)
    g = _Builder(dtype)
    h = g.b.const(x, name="x")
    ids = {name: g.b.leaf(array, name=name) for name, array in params.items()}
    scale = g.scalar(1.0 / np.sqrt(head), "scale")

    def split_heads(t: int, axes: list[int]) -> int:
        return g.op("transpose", g.op("reshape", t, shape=[batch, seq, heads, head]), axes=axes)

    for i in range(1, layers + 1):
        q = split_heads(g.op("matmul", h, ids[f"wq{i}"]), [0, 2, 1, 3])  # (B, H, T, dh)
        k_t = split_heads(g.op("matmul", h, ids[f"wk{i}"]), [0, 2, 3, 1])  # (B, H, dh, T)
        v = split_heads(g.op("matmul", h, ids[f"wv{i}"]), [0, 2, 1, 3])
        scores = g.op("mul", g.op("matmul", q, k_t), scale)
        context = g.op("matmul", g.op("softmax", scores, axis=-1), v)
        merged = g.op("reshape", g.op("transpose", context, axes=[0, 2, 1, 3]), shape=[batch, seq, d])
        h = g.op("add", h, g.op("matmul", merged, ids[f"wo{i}"]))
        hidden_out = g.op("relu", g.linear(h, ids[f"w1_{i}"], ids[f"b1_{i}"]))
        h = g.op("add", h, g.linear(hidden_out, ids[f"w2_{i}"], ids[f"b2_{i}"]))
    g.op("mean", h, name="loss")
    config = {"batch": batch, "seq": seq, "d_model": d, "heads": heads, "hidden": hidden, "layers": layers}
    return TensorModel("attention_stack", g.b.build(outputs=["loss"]), params, {"x": x}, config)


#: The graphs of many small ops by name (:func:`deep_mlp`, :func:`attention_stack`), for
#: ``bench_per_node.py``.
SMALL_OP_MODELS: dict[str, Callable[..., TensorModel]] = {"deep_mlp": deep_mlp, "attention_stack": attention_stack}
