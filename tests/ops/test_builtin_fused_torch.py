"""The fused builtin ops against PyTorch: each op's forward and VJP (``torch.autograd.grad`` with a
random cotangent) against the ATen op or ``torch.nn.functional``'s on the same numbers, float64 to
rtol 1e-12 and float32 to rtol 1e-5 (atol 1e-6), on random shapes, batched ones included."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from graphsvc.ops import Op
from graphsvc.ops import builtin as builtin_ops
from tests.conftest import needs_torch

torch = needs_torch(module_level=True)
F = torch.nn.functional

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
TOLERANCE = {np.float64: {"rtol": 1e-12, "atol": 1e-12}, np.float32: {"rtol": 1e-5, "atol": 1e-6}}


def compare(
    op: Op,
    inputs: Sequence[np.ndarray],
    attrs: dict[str, Any],
    reference: Callable[..., Any],
    *,
    differentiable: Sequence[bool] | None = None,
    seed: int = 0,
) -> None:
    """``op`` on ``inputs`` against ``reference`` (a function of torch tensors): the output, then the
    cotangents of the float inputs for one random cotangent of the output, with and without the
    residuals of ``forward_with_residuals``."""
    dtype = next(x.dtype for x in inputs if x.dtype.kind == "f")
    tolerance = TOLERANCE[dtype.type]
    wanted = differentiable or [x.dtype.kind == "f" for x in inputs]
    tensors = [torch.tensor(x, requires_grad=bool(want)) for x, want in zip(inputs, wanted, strict=True)]
    expected = reference(*tensors)
    assert op.forward is not None and op.vjp is not None
    frozen = [np.asarray(x) for x in inputs]
    for x in frozen:
        x.flags.writeable = False
    out = np.asarray(op.forward(*frozen, **attrs))
    assert out.dtype == dtype and out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out, expected.detach().numpy(), **tolerance)
    g = np.random.default_rng(seed).standard_normal(out.shape).astype(dtype)
    needed = [t for t, want in zip(tensors, wanted, strict=True) if want]
    grads = iter(torch.autograd.grad(expected, needed, torch.tensor(g)))
    ours = op.vjp(g, out, *frozen, **attrs)
    kept = None
    if op.forward_with_residuals is not None:
        _, kept = op.forward_with_residuals(*frozen, **attrs)
        ours_kept = op.vjp(g, out, *frozen, **attrs, residuals=kept)
        for a, b in zip(ours, ours_kept, strict=True):
            assert (a is None and b is None) or np.array_equal(a, b)
    for i, (mine, want) in enumerate(zip(ours, wanted, strict=True)):
        if not want:
            continue
        theirs = next(grads).numpy()
        assert mine is not None and mine.dtype == dtype and mine.shape == theirs.shape, i
        np.testing.assert_allclose(mine, theirs, **tolerance, err_msg=f"input {i}")


@pytest.fixture(scope="module")
def ops() -> dict[str, Op]:
    return {op.name: op for op in builtin_ops.BUILTIN_OPS}


def normal(rng: np.random.Generator, shape: Sequence[int], dtype: type) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_addmm_is_aten_addmm(ops: dict[str, Op], dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m, p = rng.integers(1, 7, 3)
    for bias_shape, attrs in (((p,), {}), ((n, p), {"beta": 0.5, "alpha": -1.5}), ((n, 1), {"alpha": 2.0}), ((), {})):
        inputs = [normal(rng, bias_shape, dtype), normal(rng, (n, m), dtype), normal(rng, (m, p), dtype)]
        compare(ops["addmm"], inputs, attrs, lambda b, x, y, attrs=attrs: torch.addmm(b, x, y, **attrs), seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_is_pytorchs_select_index_select_and_take(ops: dict[str, Op], dtype: type) -> None:
    """Its gradient, written where each index picks an element once and summed where one repeats
    (a negative index and its positive twin are one element)."""
    rng = np.random.default_rng(0)
    x = normal(rng, (3, 4, 5), dtype)
    picks = ((1, 0), (-1, 1), (2, -1), ([2, 0, 1], 0), ([[4, 0], [1, 3]], 2), ([1, 1, 2], 1), ([-1, 3, 0], 1))
    for index, axis in picks:
        indices = np.array(index, dtype=np.int64)

        def reference(t: Any, _: Any, indices: np.ndarray = indices, axis: int = axis) -> Any:
            if indices.ndim == 0:
                return torch.select(t, axis, int(indices))
            picked = torch.index_select(t, axis, torch.tensor(indices.reshape(-1) % t.shape[axis]))
            return picked.reshape(*t.shape[:axis], *indices.shape, *t.shape[axis + 1 :])

        compare(ops["take"], [x, indices], {"axis": axis}, reference)
    for flat in ([7, 0, 59], [5, 5, -55], [[1, 2], [3, 4]]):  # no axis: the flattened array
        indices = np.array(flat, dtype=np.int64)
        compare(ops["take"], [x, indices], {}, lambda t, _, i=indices: torch.take(t, torch.tensor(i % 60)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_layer_norm_is_aten_native_layer_norm(ops: dict[str, Op], dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # at least 3 elements an axis: in float32, a row of two close numbers has a large 1/std, which
    # magnifies rounding (PyTorch's float32 gradient is then as far from float64's as graphsvc's)
    shape = tuple(int(n) for n in rng.integers(3, 6, rng.integers(1, 4)))
    for k in range(1, len(shape) + 1):
        normalized = list(shape[len(shape) - k :])
        eps = float(rng.choice([1e-5, 1e-3]))
        inputs = [normal(rng, shape, dtype) * 3 + 1, normal(rng, normalized, dtype), normal(rng, normalized, dtype)]
        compare(
            ops["layer_norm"],
            inputs,
            {"normalized_shape": normalized, "eps": eps},
            lambda x, w, b: torch.ops.aten.native_layer_norm(x, normalized, w, b, eps)[0],  # noqa: B023
            seed=seed,
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_batch_norm_is_aten_native_batch_norm(ops: dict[str, Op], dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(2, 5)), int(rng.integers(1, 5)), *(int(n) for n in rng.integers(1, 5, seed % 3)))
    c = shape[1]
    x = normal(rng, shape, dtype) * 2 + 0.5
    weight, bias = normal(rng, (c,), dtype), normal(rng, (c,), dtype)
    mean, var = normal(rng, (c,), dtype), rng.uniform(0.5, 2.0, c).astype(dtype)
    for inputs, training in (
        ([x, weight, bias], True),
        ([x, weight, bias, mean, var], True),
        ([x, weight, bias, mean, var], False),
    ):
        stats = inputs[3:]

        def reference(x: Any, w: Any, b: Any, *running: Any) -> Any:
            given = [r.detach().clone() for r in running] or [None, None]
            return torch.ops.aten.native_batch_norm(x, w, b, *given, training, 0.1, 1e-5)[0]  # noqa: B023

        compare(
            ops["batch_norm"],
            inputs,
            {"training": training},
            reference,
            differentiable=[True, True, True] + [False] * len(stats),
            seed=seed,
        )


def attention_reference(mask: Any = None, **attrs: Any) -> Callable[..., Any]:
    """F.scaled_dot_product_attention with ``mask`` (a bool tensor) or the 4th input as its attn_mask."""

    def reference(q: Any, k: Any, v: Any, *given: Any) -> Any:
        attn_mask = mask if mask is not None else (given[0] if given else None)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **attrs)

    return reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_scaled_dot_product_attention_is_pytorchs(ops: dict[str, Op], dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = tuple(int(n) for n in rng.integers(1, 4, seed % 3))
    length, source, e, ev = (int(n) for n in rng.integers(1, 6, 4))
    q, k, v = (normal(rng, (*batch, n, d), dtype) for n, d in ((length, e), (source, e), (source, ev)))
    op = ops["scaled_dot_product_attention"]
    compare(op, [q, k, v], {}, attention_reference(), seed=seed)
    compare(op, [q, k, v], {"scale": 0.7}, attention_reference(scale=0.7), seed=seed)
    compare(op, [q, k, v], {"is_causal": True}, attention_reference(is_causal=True), seed=seed)
    keep = rng.random((length, source)) < 0.7
    keep[-1] = False  # a row that keeps no position: output 0 and no gradient, as PyTorch gives
    compare(op, [q, k, v, keep.astype(np.int64)], {}, attention_reference(torch.tensor(keep)), seed=seed)
    additive = normal(rng, (*batch[-1:], length, source), dtype)
    compare(op, [q, k, v, additive], {}, attention_reference(), seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_dot_product_attention_broadcast_and_in_a_captured_layout(ops: dict[str, Op], dtype: type) -> None:
    """k and v shared by the heads (batch axes of 1), a float mask broadcast over the batch; then q,
    k and v as a captured transformer layer hands them over (a transpose of (L, N, H, E): each head's
    rows 4096 bytes apart), a row masked out entirely, and a float mask for its gradient."""
    rng = np.random.default_rng(3)
    op = ops["scaled_dot_product_attention"]
    q, k, v = normal(rng, (2, 3, 4, 5), dtype), normal(rng, (2, 1, 6, 5), dtype), normal(rng, (1, 1, 6, 3), dtype)
    compare(op, [q, k, v], {}, attention_reference())
    compare(op, [q, k, v, normal(rng, (4, 6), dtype)], {"scale": 0.3}, attention_reference(scale=0.3))
    q, k, v = (normal(rng, (16, 2, 4, 8), dtype).transpose(1, 2, 0, 3) for _ in range(3))
    assert q.strides[2] == 2 * 4 * 8 * q.itemsize
    compare(op, [q, k, v], {}, attention_reference())
    additive = np.where(rng.random((16, 16)) < 0.8, 0.0, -np.inf).astype(dtype)
    additive[5] = -np.inf
    compare(op, [q, k, v, additive], {}, attention_reference(), differentiable=[True, True, True, False])


@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_dot_product_attention_is_the_flash_kernel_for_cpu(ops: dict[str, Op], dtype: type) -> None:
    """aten._scaled_dot_product_flash_attention_for_cpu, the kernel F.scaled_dot_product_attention
    runs on (N, H, L, E) inputs on the CPU, and what a captured step records."""
    rng = np.random.default_rng(7)
    q, k, v = (normal(rng, (2, 4, n, 8), dtype) for n in (5, 6, 6))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    op = ops["scaled_dot_product_attention"]
    compare(op, [q, k, v], {}, lambda q, k, v: flash(q, k, v)[0])
    compare(
        op, [q, k, v], {"is_causal": True, "scale": 0.5}, lambda q, k, v: flash(q, k, v, is_causal=True, scale=0.5)[0]
    )
    # the mask F.scaled_dot_product_attention hands the kernel for a bool one: 0 or -inf, a row all -inf
    additive = np.where(rng.random((5, 6)) < 0.7, 0.0, -np.inf).astype(dtype)
    additive[2] = -np.inf
    compare(
        op,
        [q, k, v, additive],
        {},
        lambda q, k, v, m: flash(q, k, v, attn_mask=m)[0],
        differentiable=[True, True, True, False],
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_stack_slice_where_mse_loss_and_clamp_are_pytorchs(ops: dict[str, Op], dtype: type) -> None:
    rng = np.random.default_rng(11)
    a, b, c = (normal(rng, (3, 4, 2), dtype) for _ in range(3))
    for axis in (0, 1, 3, -1, -4):
        compare(ops["stack"], [a, b, c], {"axis": axis}, lambda *xs: torch.stack(xs, dim=axis))  # noqa: B023
    x = normal(rng, (5, 7, 3), dtype)
    for axis, start, stop, step in ((0, 1, 4, 1), (1, -5, None, 2), (-2, None, 100, 3), (2, 0, 9223372036854775807, 2)):
        compare(
            ops["slice"],
            [x],
            {"axis": axis, "start": start, "stop": stop, "step": step},
            lambda t: torch.ops.aten.slice.Tensor(t, axis, start, stop, step),  # noqa: B023
        )
    condition = rng.random((5, 1, 3)) < 0.5
    y = normal(rng, (7, 1), dtype)
    compare(
        ops["where"],
        [condition.astype(np.int64), x, y],
        {},
        lambda cond, x, y: torch.where(cond != 0, x, y),
        differentiable=[False, True, True],
    )
    compare(
        ops["where"],
        [condition.astype(np.int64), x, np.array(-1e9, dtype=dtype)],
        {},
        lambda cond, x, fill: x.masked_fill(cond == 0, fill),
        differentiable=[False, True, False],
    )
    target = normal(rng, (7, 3), dtype)
    for reduction in ("mean", "sum", "none"):
        compare(
            ops["mse_loss"],
            [x, target],
            {"reduction": reduction},
            lambda x, t, reduction=reduction: F.mse_loss(x, t.expand_as(x), reduction=reduction),
        )
    x = np.linspace(-2, 2, 21).astype(dtype).reshape(3, 7)  # -1, 0.4 and 1 among them: the bounds are inclusive
    for attrs in ({"min": -1.0, "max": 1.0}, {"min": 0.4}, {"max": -1.0}, {"min": 1.0, "max": -1.0}):
        compare(ops["clamp"], [x], attrs, lambda t: torch.clamp(t, **attrs))  # noqa: B023


# -- one graph of them all, replayed, against the same step in PyTorch --------------------------------------
def block_graph(x: np.ndarray, params: dict[str, np.ndarray], keep: np.ndarray, target: np.ndarray) -> Any:
    """A pre-norm causal self-attention block, batch norm and a mean squared error, in the fused ops."""
    from graphsvc.graph import GraphBuilder

    b = GraphBuilder()
    batch, length, width = x.shape
    leaves = {name: b.leaf(value, name=name) for name, value in params.items()}
    xs = b.const(x, name="x")
    h = b.add("layer_norm", [xs, leaves["ln_w"], leaves["ln_b"]], attrs={"normalized_shape": [width]})
    rows = b.add("reshape", [h], attrs={"shape": [batch * length, width]})
    heads = {}
    for name in "qkv":
        projected = b.add("addmm", [leaves[f"b{name}"], rows, leaves[f"w{name}"]], name=name)
        heads[name] = b.add("reshape", [projected], attrs={"shape": [batch, length, width]})
    attended = b.add("scaled_dot_product_attention", [heads["q"], heads["k"], heads["v"]], attrs={"is_causal": True})
    residual = b.add("reshape", [b.add("add", [attended, xs])], attrs={"shape": [batch * length, width]})
    normed = b.add("batch_norm", [residual, leaves["bn_w"], leaves["bn_b"]])
    clamped = b.add("clamp", [normed], attrs={"min": -1.5, "max": 1.5})
    odd = b.add("slice", [clamped], attrs={"axis": 1, "start": 1, "stop": None, "step": 2})
    even = b.add("slice", [clamped], attrs={"axis": -1, "start": 0, "stop": 9223372036854775807, "step": 2})
    masked = b.add("where", [b.const(keep, name="keep"), odd, b.const(np.array(0.0, dtype=x.dtype))])
    stacked = b.add("stack", [masked, even], attrs={"axis": -1})
    b.add("mse_loss", [stacked, b.const(target, name="target")], name="loss")
    return b.build()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_block_of_fused_ops_replays_pytorchs_step(dtype: type) -> None:
    import graphsvc

    rng = np.random.default_rng(2)
    batch, length, width = 2, 4, 8
    x = normal(rng, (batch, length, width), dtype)
    shapes = {"ln_w": (width,), "ln_b": (width,), "bn_w": (width,), "bn_b": (width,)}
    shapes |= {f"w{name}": (width, width) for name in "qkv"} | {f"b{name}": (width,) for name in "qkv"}
    params = {name: normal(rng, shape, dtype) for name, shape in shapes.items()}
    keep = (rng.random((batch * length, width // 2)) < 0.7).astype(np.int64)
    target = normal(rng, (width // 2, 2), dtype)
    registry, _ = graphsvc.load_registry(disable_third_party=True)
    graph = graphsvc.backward(block_graph(x, params, keep, target), output="loss", registry=registry)

    t = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    tx = torch.tensor(x)
    h = F.layer_norm(tx, [width], t["ln_w"], t["ln_b"]).reshape(batch * length, width)
    q, k, v = (torch.addmm(t[f"b{n}"], h, t[f"w{n}"]).reshape(batch, length, width) for n in "qkv")
    residual = (F.scaled_dot_product_attention(q, k, v, is_causal=True) + tx).reshape(batch * length, width)
    clamped = torch.clamp(F.batch_norm(residual, None, None, t["bn_w"], t["bn_b"], training=True), -1.5, 1.5)
    masked = clamped[:, 1::2].masked_fill(torch.tensor(keep) == 0, 0.0)
    loss = F.mse_loss(
        torch.stack([masked, clamped[:, 0::2]], dim=-1), torch.tensor(target).expand(batch * length, -1, -1)
    )
    loss.backward()

    rtol = 1e-10 if dtype is np.float64 else 1e-4  # the tolerances graphsvc backward --check holds a captured step to
    assert np.asarray(graph.value("loss")).dtype == dtype
    np.testing.assert_allclose(graph.value("loss"), loss.item(), rtol=rtol)  # type: ignore[arg-type]
    for name, tensor in t.items():
        grad = graph.grad(name)
        assert isinstance(grad, np.ndarray) and grad.dtype == dtype, name
        np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=rtol, atol=rtol * 1e-2, err_msg=name)
