"""The models of :mod:`benchmarks.tensor_models` written by hand: numpy, and PyTorch.

The numpy versions are the floor for a numpy engine: the forward pass keeps what the
backward pass needs, and the backward pass is each layer's vector-Jacobian product written out
(no engine, no graph), as one would write it for a single model. They compute the gradients of the
parameters only (not of the input ``x``, which nothing needs), and fold log_softmax and the label
pick into the usual ``(softmax - onehot) / n``.

The PyTorch versions are the same computations with torch's functions (``F.layer_norm``,
``F.conv2d``, ``F.max_pool2d``, ``F.cross_entropy``); torch is imported only when one is called.

Each function takes ``(params, data, config)`` as a :class:`~benchmarks.tensor_models.TensorModel`
holds them: numpy versions return ``(loss, {name: gradient})``, PyTorch versions the loss tensor
(call ``.backward()`` on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from benchmarks.tensor_models import LAYER_NORM_EPS

__all__ = ["NUMPY", "TORCH", "numpy_cnn", "numpy_mlp", "numpy_transformer", "torch_loss"]

Arrays = dict[str, np.ndarray]
Result = tuple[float, Arrays]


# -- shared layers ----------------------------------------------------------------------------------
def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    rows = np.arange(n)
    loss = -logp[rows, labels].mean()
    grad = np.exp(logp)
    grad[rows, labels] -= 1
    grad /= n
    return float(loss), grad


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    centered = x - x.mean(axis=-1, keepdims=True)
    inv_std = ((centered**2).mean(axis=-1, keepdims=True) + x.dtype.type(LAYER_NORM_EPS)) ** -0.5
    normed = centered * inv_std
    return normed * gamma + beta, (normed, inv_std, gamma)


def _layer_norm_vjp(g: np.ndarray, saved: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of x, gamma and beta."""
    normed, inv_std, gamma = saved
    rows = tuple(range(g.ndim - 1))
    g_normed = g * gamma
    gx = inv_std * (
        g_normed - g_normed.mean(axis=-1, keepdims=True) - normed * (g_normed * normed).mean(axis=-1, keepdims=True)
    )
    return gx, (g * normed).sum(axis=rows), g.sum(axis=rows)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


# -- MLP ------------------------------------------------------------------------------------------
def numpy_mlp(params: Arrays, data: Arrays, config: dict[str, Any]) -> Result:
    layers = len(config["sizes"]) - 1
    inputs = [data["x"]]  # what each layer's matmul saw
    h = data["x"]
    for i in range(1, layers + 1):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < layers:
            h = np.maximum(h, 0)
            inputs.append(h)
    loss, g = _cross_entropy(h, data["labels"])
    grads = {}
    for i in range(layers, 0, -1):
        grads[f"w{i}"] = inputs[i - 1].T @ g
        grads[f"b{i}"] = g.sum(axis=0)
        if i > 1:
            g = (g @ params[f"w{i}"].T) * (inputs[i - 1] > 0)
    return loss, grads


# -- CNN ------------------------------------------------------------------------------------------
def _im2col(x: np.ndarray) -> np.ndarray:
    """(N, C*9, H*W): the 3x3 windows of x padded by 1, one column per output pixel, rows in the
    weight's (C, kH, kW) order."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2, w + 2), dtype=x.dtype)  # np.pad takes five times as long
    padded[:, :, 1:-1, 1:-1] = x
    windows = sliding_window_view(padded, (3, 3), axis=(2, 3))
    return np.ascontiguousarray(windows.transpose(0, 1, 4, 5, 2, 3)).reshape(n, c * 9, h * w)


def _conv3x3(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """conv2d(x, weight, bias, padding=1), and the im2col columns the VJP needs."""
    n, _, h, w = x.shape
    columns = _im2col(x)
    out = weight.reshape(weight.shape[0], -1) @ columns  # (O, K) @ (N, K, P): (N, O, P)
    out += bias[:, None]  # in place, as the plugin adds it
    return out.reshape(n, -1, h, w), columns


def _conv3x3_vjp(
    g: np.ndarray, columns: np.ndarray, x_shape: tuple[int, ...], weight: np.ndarray, need_x: bool
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Gradients of x (if ``need_x``), weight and bias."""
    n, c, h, w = x_shape
    o = weight.shape[0]
    g3 = g.reshape(n, o, h * w)
    grad_w = (g3 @ columns.transpose(0, 2, 1)).sum(axis=0).reshape(weight.shape)
    grad_b = g3.sum(axis=(0, 2))
    if not need_x:
        return None, grad_w, grad_b
    column_grads = (weight.reshape(o, -1).T @ g3).reshape(n, c, 3, 3, h, w)
    padded = np.zeros((n, c, h + 2, w + 2), dtype=g.dtype)
    for a in range(3):
        for b in range(3):
            padded[:, :, a : a + h, b : b + w] += column_grads[:, :, a, b]
    return padded[:, :, 1:-1, 1:-1], grad_w, grad_b


def _pool2x2(x: np.ndarray) -> np.ndarray:
    """max_pool2d(2): the larger of the four strided views (numpy reduces small inner axes slowly)."""
    return np.maximum(
        np.maximum(x[:, :, ::2, ::2], x[:, :, ::2, 1::2]), np.maximum(x[:, :, 1::2, ::2], x[:, :, 1::2, 1::2])
    )


def _pool2x2_vjp(g: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Each window's gradient to its first maximum in row-major order (as PyTorch picks it): g's
    bits and'ed with an all-ones mask where taken, written into each quarter of the gradient (the
    conv plugin's way; np.where's branch per element costs three times as much), from ``g + 0.0``
    as the plugin (PyTorch adds g to zeros: a -0.0 in g gives +0.0)."""
    g = g + 0.0
    grad = np.empty_like(x)  # the four quarters tile it
    bits = np.dtype(f"u{g.dtype.itemsize}")
    taken = x[:, :, ::2, ::2] == out
    for a, b in ((0, 0), (0, 1), (1, 0), (1, 1)):
        if (a, b) == (0, 0):
            hit = taken
        else:
            hit = x[:, :, a::2, b::2] == out
            np.greater(hit, taken, out=hit)  # a maximum, and its window's first
            if (a, b) != (1, 1):
                taken |= hit
        mask = hit.astype(bits)
        np.negative(mask, out=mask)  # 1 -> all ones
        np.bitwise_and(g.view(bits), mask, out=grad[:, :, a::2, b::2].view(bits))
    return grad


def numpy_cnn(params: Arrays, data: Arrays, config: dict[str, Any]) -> Result:
    x = data["x"]
    z1, cols1 = _conv3x3(x, params["conv1"], params["b1"])
    a1 = np.maximum(z1, 0)
    p1 = _pool2x2(a1)
    z2, cols2 = _conv3x3(p1, params["conv2"], params["b2"])
    a2 = np.maximum(z2, 0)
    p2 = _pool2x2(a2)
    flat = p2.reshape(x.shape[0], -1)
    loss, g = _cross_entropy(flat @ params["w3"] + params["b3"], data["labels"])
    grads = {"w3": flat.T @ g, "b3": g.sum(axis=0)}
    g = (g @ params["w3"].T).reshape(p2.shape)
    g = _pool2x2_vjp(g, a2, p2) * (a2 > 0)
    g_p1, grads["conv2"], grads["b2"] = _conv3x3_vjp(g, cols2, p1.shape, params["conv2"], need_x=True)
    assert g_p1 is not None
    g = _pool2x2_vjp(g_p1, a1, p1) * (a1 > 0)
    _, grads["conv1"], grads["b1"] = _conv3x3_vjp(g, cols1, x.shape, params["conv1"], need_x=False)
    return loss, grads


# -- transformer block ----------------------------------------------------------------------------
def numpy_transformer(params: Arrays, data: Arrays, config: dict[str, Any]) -> Result:
    p, x = params, data["x"]
    batch, seq, d = x.shape
    heads = config["heads"]
    head = d // heads
    scale = x.dtype.type(1.0 / np.sqrt(head))

    def split(t: np.ndarray) -> np.ndarray:  # (B, T, D) -> (B, H, T, dh)
        return t.reshape(batch, seq, heads, head).transpose(0, 2, 1, 3)

    def merge(t: np.ndarray) -> np.ndarray:  # (B, H, T, dh) -> (B, T, D)
        return t.transpose(0, 2, 1, 3).reshape(batch, seq, d)

    # forward
    h, ln1 = _layer_norm(x, p["gamma1"], p["beta1"])
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    attn = scores / scores.sum(axis=-1, keepdims=True)
    merged = merge(attn @ v)
    x1 = x + merged @ p["wo"]
    h2, ln2 = _layer_norm(x1, p["gamma2"], p["beta2"])
    z = h2 @ p["w1"] + p["b1"]
    r = np.maximum(z, 0)
    x2 = x1 + (r @ p["w2"] + p["b2"])
    pooled = x2.mean(axis=1)
    loss, g = _cross_entropy(pooled @ p["wh"] + p["bh"], data["labels"])
    # backward
    grads = {"wh": pooled.T @ g, "bh": g.sum(axis=0)}
    g_x2 = np.broadcast_to((g @ p["wh"].T)[:, None, :] / x.dtype.type(seq), x2.shape)
    g_r = g_x2 @ p["w2"].T
    grads["w2"], grads["b2"] = _rows(r).T @ _rows(g_x2), g_x2.sum(axis=(0, 1))
    g_z = g_r * (z > 0)
    grads["w1"], grads["b1"] = _rows(h2).T @ _rows(g_z), g_z.sum(axis=(0, 1))
    g_x1_ln, grads["gamma2"], grads["beta2"] = _layer_norm_vjp(g_z @ p["w1"].T, ln2)
    g_x1 = g_x2 + g_x1_ln
    grads["wo"] = _rows(merged).T @ _rows(g_x1)
    g_context = split(g_x1 @ p["wo"].T)
    grads_v = attn.transpose(0, 1, 3, 2) @ g_context
    g_attn = g_context @ v.transpose(0, 1, 3, 2)
    g_scores = attn * (g_attn - (g_attn * attn).sum(axis=-1, keepdims=True)) * scale
    g_q, g_k = g_scores @ k, g_scores.transpose(0, 1, 3, 2) @ q
    rows_h = _rows(h).T
    g_h = np.zeros_like(h)
    for name, grad in (("wq", g_q), ("wk", g_k), ("wv", grads_v)):
        merged_grad = merge(grad)
        grads[name] = rows_h @ _rows(merged_grad)
        g_h += merged_grad @ p[name].T
    _, grads["gamma1"], grads["beta1"] = _layer_norm_vjp(g_h, ln1)
    return loss, grads


#: The hand-written numpy versions by model name.
NUMPY: dict[str, Callable[[Arrays, Arrays, dict[str, Any]], Result]] = {
    "mlp": numpy_mlp,
    "cnn": numpy_cnn,
    "transformer": numpy_transformer,
}


# -- PyTorch --------------------------------------------------------------------------------------
def torch_loss(model: str, params: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    """The loss of ``model`` computed with torch on tensors ``params`` (requires_grad) and ``data``."""
    return TORCH[model](params, data, config)


def _torch_mlp(p: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch.nn.functional as F

    layers = len(config["sizes"]) - 1
    h = data["x"]
    for i in range(1, layers + 1):
        h = h @ p[f"w{i}"] + p[f"b{i}"]
        if i < layers:
            h = F.relu(h)
    return F.cross_entropy(h, data["labels"])


def _torch_cnn(p: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch.nn.functional as F

    h = data["x"]
    for conv, bias in (("conv1", "b1"), ("conv2", "b2")):
        h = F.max_pool2d(F.relu(F.conv2d(h, p[conv], p[bias], padding=1)), 2)
    return F.cross_entropy(h.reshape(h.shape[0], -1) @ p["w3"] + p["b3"], data["labels"])


def _torch_transformer(p: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F

    x = data["x"]
    batch, seq, d = x.shape
    heads = config["heads"]
    head = d // heads

    def split(t: Any) -> Any:
        return t.reshape(batch, seq, heads, head).transpose(1, 2)

    h = F.layer_norm(x, (d,), p["gamma1"], p["beta1"], eps=LAYER_NORM_EPS)
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    attn = torch.softmax((q @ k.transpose(-1, -2)) * (1.0 / np.sqrt(head)), dim=-1)
    x1 = x + (attn @ v).transpose(1, 2).reshape(batch, seq, d) @ p["wo"]
    h2 = F.layer_norm(x1, (d,), p["gamma2"], p["beta2"], eps=LAYER_NORM_EPS)
    x2 = x1 + (F.relu(h2 @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
    return F.cross_entropy(x2.mean(dim=1) @ p["wh"] + p["bh"], data["labels"])


def _torch_deep_mlp(p: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch

    h = data["x"]
    for i in range(1, config["layers"] + 1):
        h = h @ p[f"w{i}"] + p[f"b{i}"]
        h = torch.relu(h) if i % 2 else torch.tanh(h)
    return h.sum(dim=1).mean()


def _torch_attention_stack(p: dict[str, Any], data: dict[str, Any], config: dict[str, Any]) -> Any:
    import torch

    h = data["x"]
    batch, seq, d = h.shape
    heads = config["heads"]
    head = d // heads
    scale = torch.tensor(1.0 / np.sqrt(head), dtype=h.dtype)  # a 0-d tensor of the model's dtype, as the graph's const

    def split(t: Any, dims: tuple[int, ...]) -> Any:
        return t.reshape(batch, seq, heads, head).permute(*dims)

    for i in range(1, config["layers"] + 1):
        q = split(h @ p[f"wq{i}"], (0, 2, 1, 3))
        k_t = split(h @ p[f"wk{i}"], (0, 2, 3, 1))
        v = split(h @ p[f"wv{i}"], (0, 2, 1, 3))
        context = torch.softmax((q @ k_t) * scale, dim=-1) @ v
        h = h + context.permute(0, 2, 1, 3).reshape(batch, seq, d) @ p[f"wo{i}"]
        h = h + (torch.relu(h @ p[f"w1_{i}"] + p[f"b1_{i}"]) @ p[f"w2_{i}"] + p[f"b2_{i}"])
    return h.mean()


#: The PyTorch versions by model name (also those of the graphs of small ops, which have no numpy version).
TORCH: dict[str, Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], Any]] = {
    "mlp": _torch_mlp,
    "cnn": _torch_cnn,
    "transformer": _torch_transformer,
    "deep_mlp": _torch_deep_mlp,
    "attention_stack": _torch_attention_stack,
}
