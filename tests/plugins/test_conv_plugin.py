"""The third example plugin, plugins/graphsvc-conv: conv2d and max_pool2d on hand-worked examples,
against finite differences (graphsvc.testing.check_vjp), against PyTorch's gradients, with float32
kept, read-only inputs left alone, bad shapes and attributes refused in one line, and inside a
replayed tensor graph."""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsvc
from cli import app
from graphsvc.errors import OpError, ReplayError
from graphsvc.graph import GraphBuilder
from graphsvc.ops import Op
from graphsvc.pluginhost import load_registry
from graphsvc.testing import check_vjp
from tests.conftest import needs_torch

graphsvc_conv = pytest.importorskip("graphsvc_conv", reason="pip install ./plugins/graphsvc-conv")

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

CONV2D, MAX_POOL2D = graphsvc_conv.OPS

# x = 1..9 in a 3x3 image, w = [[1, 2], [3, 4]]
X = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
W = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)


def read_only(array: np.ndarray) -> np.ndarray:
    array = np.array(array)
    array.flags.writeable = False
    return array


def conv(x: np.ndarray, w: np.ndarray, **attrs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward, then the VJP of ``g`` (default: ones), on read-only inputs."""
    g = attrs.pop("g", None)
    out = graphsvc_conv.conv2d(read_only(x), read_only(w), **attrs)
    gx, gw = graphsvc_conv.conv2d_vjp(read_only(np.ones_like(out) if g is None else g), out, x, w, **attrs)
    return out, gx, gw


def biased_conv(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, g: np.ndarray | None = None, **attrs: Any
) -> tuple[np.ndarray, ...]:
    """:func:`conv` with a bias, the third input: the output and three cotangents."""
    out = graphsvc_conv.conv2d(read_only(x), read_only(w), read_only(bias), **attrs)
    g = read_only(np.ones_like(out) if g is None else g)
    return (out, *graphsvc_conv.conv2d_vjp(g, out, read_only(x), read_only(w), read_only(bias), **attrs))


# -- worked by hand ------------------------------------------------------------------------------------
def test_conv2d_by_hand() -> None:
    # out[i, j] = 1*x[i, j] + 2*x[i, j+1] + 3*x[i+1, j] + 4*x[i+1, j+1]; g = [[1, 0], [0, 1]]
    out, gx, gw = conv(X, W, g=np.array([[[[1.0, 0.0], [0.0, 1.0]]]]))
    assert out.tolist() == [[[[37.0, 47.0], [67.0, 77.0]]]]
    # g's two ones each spread the kernel over the window they came from: at (0, 0) and at (1, 1)
    assert gx.tolist() == [[[[1.0, 2.0, 0.0], [3.0, 5.0, 2.0], [0.0, 3.0, 4.0]]]]
    # gw[a, b] = x[a, b] + x[a+1, b+1]
    assert gw.tolist() == [[[[6.0, 8.0], [12.0, 14.0]]]]


def test_conv2d_with_stride_and_padding_by_hand() -> None:
    # padded to 5x5 with zeros, 2x2 windows every 2 rows and columns: [[0,0],[0,1]], [[0,0],[2,3]],
    # [[0,4],[0,7]], [[5,6],[8,9]]
    out, gx, gw = conv(X, W, stride=2, padding=1)
    assert out.tolist() == [[[[4.0, 18.0], [36.0, 77.0]]]]
    # the windows do not overlap: x[p, q] sits at kernel offset ((p+1) % 2, (q+1) % 2)
    assert gx.tolist() == [[[[4.0, 3.0, 4.0], [2.0, 1.0, 2.0], [4.0, 3.0, 4.0]]]]
    # gw[a, b] sums what each offset saw: 5; 4 + 6; 2 + 8; 1 + 3 + 7 + 9
    assert gw.tolist() == [[[[5.0, 10.0], [10.0, 20.0]]]]


def test_conv2d_stride_and_padding_may_differ_per_axis() -> None:
    out, _, _ = conv(X, W, stride=[1, 2], padding=[0, 1])
    # rows 0-1 and 1-2; padded columns 0-1 and 2-3 of [0, x, 0]
    assert out.tolist() == [[[[2 * 1 + 4 * 4, 1 * 2 + 2 * 3 + 3 * 5 + 4 * 6], [2 * 4 + 4 * 7, 5 + 12 + 24 + 36]]]]


def test_conv2d_with_a_bias_by_hand() -> None:
    # two 1x1 kernels, 2 and -1, over a 2x2 image; the bias adds 0.5 to channel 0, 10 to channel 1
    x = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    w, bias = np.array([2.0, -1.0]).reshape(2, 1, 1, 1), np.array([0.5, 10.0])
    g = np.array([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]]]).reshape(1, 2, 2, 2)
    out, gx, gw, gb = biased_conv(x, w, bias, g)
    assert out.tolist() == [[[[2.5, 4.5], [6.5, 8.5]], [[9.0, 8.0], [7.0, 6.0]]]]
    assert gx.tolist() == [[[[2 * 1 - 1, 2 * 2 - 1], [2 * 3 - 1, 2 * 4 - 1]]]]  # 2 * g0 - g1
    assert gw.tolist() == [[[[1 + 4 + 9 + 16]]], [[[1 + 2 + 3 + 4]]]]  # sum(g_o * x)
    assert gb.tolist() == [1 + 2 + 3 + 4, 4.0]  # sum(g_o)


def test_the_bias_is_added_to_the_output_of_conv2d_without_one() -> None:
    rng = np.random.default_rng(12)
    x, w, bias = rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 2)), rng.standard_normal(4)
    for attrs in ({}, {"stride": 2, "padding": [1, 0]}):
        plain = graphsvc_conv.conv2d(x, w, **attrs)
        assert graphsvc_conv.conv2d(x, w, bias, **attrs).tobytes() == (plain + bias[:, None, None]).tobytes()
        assert graphsvc_conv.conv2d(x, w, None, **attrs).tobytes() == plain.tobytes()  # PyTorch's bias=None


def test_the_bias_costs_no_second_array_of_the_outputs_size() -> None:
    import tracemalloc

    rng = np.random.default_rng(13)
    x, w, bias = rng.standard_normal((16, 3, 32, 32)), rng.standard_normal((8, 3, 3, 3)), rng.standard_normal(8)

    def peak(*inputs: np.ndarray) -> int:
        graphsvc_conv.conv2d(*inputs, padding=1)  # the scratch columns are made once
        tracemalloc.start()
        try:
            graphsvc_conv.conv2d(*inputs, padding=1)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    out_bytes = 16 * 8 * 32 * 32 * 8  # 1 MiB
    without, with_bias = peak(x, w), peak(x, w, bias)
    assert out_bytes <= without < 2 * out_bytes  # what is traced: the output
    assert with_bias - without < out_bytes // 4  # numpy's broadcasting buffer (64 KiB), not a second output


def test_max_pool2d_by_hand_routes_each_window_to_its_first_maximum() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 3.0], [1.0, 1.0, 1.0]]).reshape(1, 1, 3, 3)
    out = graphsvc_conv.max_pool2d(read_only(x), 2, 1)
    assert out.tolist() == [[[[3.0, 3.0], [2.0, 3.0]]]]
    g = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    (gx,) = graphsvc_conv.max_pool2d_vjp(g, out, x, 2, 1)
    # windows (0,0) and (0,1) both take x[0, 1] (the second window's tie of three: its first), (1,0)
    # takes x[1, 0], (1,1) takes x[1, 2]
    assert gx.tolist() == [[[[0.0, 3.0, 0.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]]]]


def test_max_pool2d_stride_defaults_to_the_kernel_size() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 3.0], [1.0, 1.0, 1.0]]).reshape(1, 1, 3, 3)
    out = graphsvc_conv.max_pool2d(x, kernel_size=2)
    assert out.tolist() == [[[[3.0]]]]
    (gx,) = graphsvc_conv.max_pool2d_vjp(np.full((1, 1, 1, 1), 5.0), out, x, kernel_size=2)
    assert gx.tolist() == [[[[0.0, 5.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]]


def test_max_pool2d_of_an_empty_batch_has_an_empty_gradient() -> None:
    x = np.zeros((0, 2, 4, 4))  # no images: PyTorch pools and differentiates it too
    out = graphsvc_conv.max_pool2d(read_only(x), 2)
    assert out.shape == (0, 2, 2, 2)
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(np.ones(out.shape)), out, x, 2)
    assert gx.shape == x.shape


@pytest.mark.parametrize("stride", [2, 1], ids=["windows apart", "windows overlapping"])
def test_max_pool2d_sends_a_windows_gradient_to_its_last_nan_as_pytorch_does(stride: int) -> None:
    x = np.array([[1.0, np.nan, 5.0], [np.nan, 2.0, 0.0], [4.0, 3.0, 9.0]]).reshape(1, 1, 3, 3)
    out = graphsvc_conv.max_pool2d(read_only(x), 2, stride)
    g = np.full(out.shape, np.inf)  # not even an inf reaches an element that is not its window's pick
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(g), out, x, 2, stride)
    if stride == 2:  # one window: x[1, 0], its last nan in row-major order
        assert gx.tolist() == [[[[0.0, 0.0, 0.0], [np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]]]]
    else:  # (0,0) and (1,0) pick x[1, 0], (0,1) its only nan x[0, 1], (1,1) its maximum x[2, 2]
        assert np.isnan(out[0, 0]).tolist() == [[True, True], [True, False]]
        assert gx.tolist() == [[[[0.0, np.inf, 0.0], [np.inf, 0.0, 0.0], [0.0, 0.0, np.inf]]]]
    torch = needs_torch()
    tx = torch.tensor(x, requires_grad=True)
    pooled = torch.nn.functional.max_pool2d(tx, 2, stride)
    pooled.backward(torch.ones_like(pooled))
    (ones,) = graphsvc_conv.max_pool2d_vjp(read_only(np.ones(out.shape)), out, x, 2, stride)
    assert ones.tolist() == tx.grad.numpy().tolist()  # type: ignore[union-attr]


def test_the_slices_of_a_large_kernel_are_let_go_after_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large kernel stepped offset by offset (a large image's: here forced, as a tiny image goes
    window by window) has one slice pair per kernel offset: kept per shape, 64 such nodes held about
    1.2 GB for the life of the process after a 300x300 window. Only a small kernel's are kept."""
    monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size: False)
    x = read_only(np.zeros((1, 1, 1, 1)))
    graphsvc_conv.max_pool2d(x, [40, 40], [1, 1], [20, 20])  # anything made once, outside the count
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for stride in range(2, 10):  # 1,600 offsets each, each call a new shape
            graphsvc_conv.max_pool2d(x, [40, 40], [stride, stride], [20, 20])
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 100_000, kept
    small = [graphsvc_conv._offsets((2, 2), (2, 2), (3, 3)) for _ in range(2)]
    assert small[0] is small[1]  # a small kernel's are kept


def test_max_pool2d_padding_is_never_the_maximum() -> None:
    x = np.full((1, 1, 2, 2), -np.inf)  # as low as the padding: each window's first real element wins
    out = graphsvc_conv.max_pool2d(x, 3, 1, 1)
    assert out.tolist() == [[[[-np.inf, -np.inf], [-np.inf, -np.inf]]]]
    (gx,) = graphsvc_conv.max_pool2d_vjp(np.array([[[[1.0, 2.0], [3.0, 4.0]]]]), out, x, 3, 1, 1)
    assert gx.tolist() == [[[[10.0, 0.0], [0.0, 0.0]]]]


def pooled_by_loops(
    x: np.ndarray, g: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """max_pool2d and its VJP, window by window, element by element, as PyTorch's CPU kernel: the
    window's first real element, then each that is larger, or nan; its g added to the pick's
    gradient, which starts at +0.0 (so a -0.0 in g gives +0.0)."""
    n, c, h, w = x.shape
    out = np.empty(g.shape, x.dtype)
    grad = np.zeros(x.shape, x.dtype)
    for b, ch, i, j in itertools.product(range(n), range(c), range(g.shape[2]), range(g.shape[3])):
        cells = [
            (p, q)
            for p in range(i * stride[0] - padding[0], i * stride[0] - padding[0] + kernel[0])
            for q in range(j * stride[1] - padding[1], j * stride[1] - padding[1] + kernel[1])
            if 0 <= p < h and 0 <= q < w
        ]
        pick = cells[0]
        for cell in cells:
            if x[b, ch][cell] > x[b, ch][pick] or np.isnan(x[b, ch][cell]):
                pick = cell
        out[b, ch, i, j] = x[b, ch][pick]
        grad[b, ch][pick] += g[b, ch, i, j]
    return out, grad


@pytest.mark.parametrize(
    ("kernel", "stride", "padding"),
    [((2, 2), (2, 2), (0, 0)), ((2, 2), (3, 2), (0, 1)), ((3, 3), (2, 2), (1, 1)), ((2, 3), (1, 2), (1, 1))],
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("nan", [False, True], ids=["no nan", "nan"])
@pytest.mark.parametrize("by_window", [False, True], ids=["offset by offset", "window by window"])
def test_max_pool2d_and_its_vjp_match_a_loop_over_windows_to_the_bit(
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dtype: Any,
    nan: bool,
    by_window: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ways of stepping (kernel offset by offset, or window by window where the kernel has
    more offsets than the output has windows) give the loop's bits."""
    monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size: by_window)
    rng = np.random.default_rng(17)
    # ties, signed zeros, infinities (nans) in x; in g, signed zeros and infinities that must reach
    # the picks alone, and small integers, whose sums do not depend on their order
    values = [0.0, -0.0, 1.0, 1.0, -1.0, -np.inf, np.inf] + [np.nan] * nan
    x = rng.choice(np.array(values), size=(2, 3, 7, 8)).astype(dtype)
    x[0, 0] = -np.inf  # windows of -inf alone (padded, their first real element)
    attrs = {"kernel_size": list(kernel), "stride": list(stride), "padding": list(padding)}
    out = graphsvc_conv.max_pool2d(read_only(x), **attrs)
    g = rng.choice(np.array([0.0, -0.0, 1.0, -2.0, 3.0, np.inf, -np.inf]), size=out.shape).astype(dtype)
    with np.errstate(invalid="ignore"):  # inf + -inf, where overlapping windows pick one element
        (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(g), out, read_only(x), **attrs)
        expected_out, expected_gx = pooled_by_loops(x, g, kernel, stride, padding)
    assert np.array_equal(out, expected_out, equal_nan=True)  # as values: which of -0.0 and 0.0 is not pinned
    assert gx.dtype == dtype and gx.tobytes() == expected_gx.tobytes()


@pytest.mark.parametrize(("stride", "padding"), [(2, 0), (2, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("by_window", [False, True], ids=["offset by offset", "window by window"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_negative_zero_in_g_gives_a_positive_zero_gradient(
    stride: int, padding: int, by_window: bool, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch adds each window's g to a gradient of zeros, and 0.0 + -0.0 is +0.0: windows apart
    (whose picks are set, not added to) give +0.0 too, as overlapping ones (added) do."""
    monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size: by_window)
    x = read_only(np.array([[1.0, 3.0, 0.0, 4.0], [2.0, 0.0, 3.0, 5.0], [6.0, 1.0, 2.0, 0.0]]).reshape(1, 1, 3, 4))
    out = graphsvc_conv.max_pool2d(x.astype(dtype), 2, stride, padding)
    (gx,) = graphsvc_conv.max_pool2d_vjp(
        read_only(np.full(out.shape, -0.0, dtype)), out, x.astype(dtype), 2, stride, padding
    )
    assert gx.dtype == dtype and gx.shape == x.shape
    assert np.signbit(gx).tolist() == np.zeros(x.shape, bool).tolist()


@pytest.mark.parametrize(
    ("kernel", "stride", "padding"), [(2, 2, 0), (2, 2, 1), (3, 3, 1), ([2, 3], [3, 3], [1, 0]), (2, 1, 0), (3, 2, 1)]
)
@pytest.mark.parametrize("by_window", [False, True], ids=["offset by offset", "window by window"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool2d_vjp_gives_pytorchs_bits_where_g_holds_negative_zeros(
    kernel: Any, stride: Any, padding: Any, by_window: bool, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows apart and overlapping, padded or not, either way of stepping: PyTorch's bits, its
    +0.0 where g holds -0.0 (g's other values are small integers, whose sums do not depend on the
    order the windows' picks are added in)."""
    torch = torch_or_skip()
    monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size: by_window)
    rng = np.random.default_rng(29)
    x = rng.choice(np.array([0.0, -0.0, 1.0, 2.0, -1.0]), size=(2, 3, 7, 8)).astype(dtype)  # ties
    out = graphsvc_conv.max_pool2d(read_only(x), kernel, stride, padding)
    g = rng.choice(np.array([0.0, -0.0, -0.0, 1.0, -2.0]), size=out.shape).astype(dtype)
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(g), out, read_only(x), kernel, stride, padding)
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, kernel, stride, padding).backward(torch.tensor(g))
    expected = tx.grad.numpy()  # type: ignore[union-attr]
    assert np.signbit(g[g == 0]).any() and not np.signbit(expected[expected == 0]).any()
    assert gx.dtype == dtype and gx.tobytes() == expected.tobytes()


def test_a_large_window_over_a_small_image_steps_window_by_window() -> None:
    """A 300x300 window over a 1x1 image (padding 150): four windows, each holding the one real
    element, which gets all four gradients; stepping by kernel offset made 90,000 steps a call."""
    x = read_only(np.full((1, 1, 1, 1), -3.0))
    assert graphsvc_conv._by_window((300, 300), (2, 2)) and not graphsvc_conv._by_window((2, 2), (14, 14))
    out = graphsvc_conv.max_pool2d(x, [300, 300], [1, 1], [150, 150])
    assert out.tolist() == [[[[-3.0, -3.0], [-3.0, -3.0]]]]
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(np.array([[[[1.0, 2.0], [4.0, 8.0]]]])), out, x, 300, 1, 150)
    assert gx.tolist() == [[[[15.0]]]]
    w = read_only(np.ones((2, 1, 300, 300)))
    conv_out = graphsvc_conv.conv2d(x, w, stride=1, padding=150)  # the window covers x at (150-i, 150-j)
    assert conv_out.shape == (1, 2, 2, 2) and (conv_out == -3.0).all()
    grad_x, grad_w = graphsvc_conv.conv2d_vjp(read_only(np.ones(conv_out.shape)), conv_out, x, w, stride=1, padding=150)
    assert grad_x.tolist() == [[[[8.0]]]] and grad_w.sum() == -24.0


def test_a_large_window_over_many_small_images_neither_pads_nor_copies_them() -> None:
    """Window by window, max_pool2d and its VJP look at each window's real part only: 8x8 images
    of one pixel under a 300x300 window (padding 150) made a padded input of 46 MB, copied again
    per window by the VJP (64x64 images: 12 s and 42 s, gigabytes); now a few kilobytes."""
    x = read_only(np.arange(64.0).reshape(8, 8, 1, 1))
    tracemalloc.start()
    try:
        out = read_only(graphsvc_conv.max_pool2d(x, 300, 1, 150))
        (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(np.ones(out.shape)), out, x, 300, 1, 150)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (out == x).all() and (gx == 4.0).all() and peak < 1 << 20


@pytest.mark.parametrize("shape", [(0, 3, 1, 1), (2, 0, 1, 1)], ids=["no images", "no channels"])
def test_a_large_window_over_an_empty_batch(shape: tuple[int, ...]) -> None:
    """Window by window, an empty batch (or no channels) gives an empty gradient, as offset by
    offset (its reshape to (n, c, -1) of an empty window raised a ValueError)."""
    x = read_only(np.zeros(shape))
    out = read_only(graphsvc_conv.max_pool2d(x, 3, 1, 1))
    assert graphsvc_conv._by_window((3, 3), out.shape[2:]) and out.shape == shape
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(np.ones(out.shape)), out, x, 3, 1, 1)
    assert gx.shape == shape and gx.dtype == x.dtype


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), [
    ((2, 3, 6, 5), (4, 3, 3, 2), 1, 0),
    ((2, 3, 6, 5), (4, 3, 3, 2), 2, 1),
    ((1, 2, 4, 6), (2, 2, 4, 2), [1, 3], [0, 1]),
    ((1, 1, 3, 3), (1, 1, 5, 5), 1, 2),
    ((2, 2, 2, 3), (3, 2, 3, 3), [2, 1], [4, 3]),  # windows in the padding alone
])  # fmt: skip
def test_conv2d_gives_the_same_bits_window_by_window(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: Any, padding: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conv2d and its VJP through im2col columns, or window by window from each window's part of x
    (where the output has fewer windows than the kernel has offsets): on small integers, whose sums
    do not depend on their order, the same bits."""
    rng = np.random.default_rng(23)
    x, w = rng.integers(-3, 4, x_shape).astype(float), rng.integers(-3, 4, w_shape).astype(float)
    b = rng.integers(-3, 4, w_shape[:1]).astype(float)
    results = []
    for by_window in (False, True):
        monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size, by=by_window: by)
        out = graphsvc_conv.conv2d(read_only(x), read_only(w), read_only(b), stride=stride, padding=padding)
        g = read_only(rng.integers(-3, 4, out.shape).astype(float)) if not results else results[0][1]
        grads = graphsvc_conv.conv2d_vjp(
            g, out, read_only(x), read_only(w), read_only(b), stride=stride, padding=padding
        )
        results.append((out, g, *grads))
    for offset_way, window_way in zip(results[0], results[1], strict=True):
        assert offset_way.tobytes() == window_way.tobytes()
    assert all(np.abs(grad).sum() > 0 for grad in results[0][2:])


@pytest.mark.parametrize("by_window", [False, True], ids=["by offset", "by window"])
def test_conv2d_of_no_output_channels_is_empty_either_way(by_window: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight of no output channels (0, C, kH, kW) gives PyTorch's empty output (N, 0, H', W')
    and zero cotangents through im2col too (its reshape of the weight to (0, -1) raised numpy's
    ValueError), as window by window."""
    monkeypatch.setattr(graphsvc_conv, "_by_window", lambda kernel, out_size: by_window)
    x, w, b = read_only(np.ones((2, 3, 5, 5))), read_only(np.ones((0, 3, 3, 3))), read_only(np.ones(0))
    out = graphsvc_conv.conv2d(x, w, b, padding=1)
    assert (out.shape, out.dtype) == ((2, 0, 5, 5), np.float64)
    gx, gw, gb = graphsvc_conv.conv2d_vjp(read_only(np.ones(out.shape)), out, x, w, b, padding=1)
    assert (gx.shape, gw.shape, gb.shape) == (x.shape, w.shape, (0,))
    assert not gx.any()


def large_kernel_over_small_images() -> tuple[np.ndarray, ...]:
    """32 one-pixel images of 8 channels, a 300x300 kernel (padded by 150), a bias, a cotangent:
    im2col's columns would be ~2 GB."""
    rng = np.random.default_rng(29)
    x, w, b = rng.standard_normal((32, 8, 1, 1)), rng.standard_normal((4, 8, 300, 300)), rng.standard_normal(4)
    return x, w, b, rng.standard_normal((32, 4, 2, 2))


def test_a_large_conv2d_kernel_over_small_images_keeps_no_columns() -> None:
    x, w, b, g = large_kernel_over_small_images()
    tracemalloc.start()
    try:
        out = graphsvc_conv.conv2d(read_only(x), read_only(w), read_only(b), stride=1, padding=150)
        graphsvc_conv.conv2d_vjp(read_only(g), out, read_only(x), read_only(w), read_only(b), padding=150)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == g.shape
    assert peak < 4 * w.nbytes  # the weight's gradient and a few of its windows' parts, no columns


def test_a_large_conv2d_kernel_over_small_images_matches_pytorch() -> None:
    torch = needs_torch()
    x, w, b, g = large_kernel_over_small_images()
    out = graphsvc_conv.conv2d(read_only(x), read_only(w), read_only(b), stride=1, padding=150)
    grads = graphsvc_conv.conv2d_vjp(read_only(g), out, read_only(x), read_only(w), read_only(b), padding=150)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    expected = torch.nn.functional.conv2d(tx, tw, tb, padding=150)
    expected.backward(torch.tensor(g))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-10, atol=1e-10)
    for got, want in zip(grads, (tx.grad, tw.grad, tb.grad), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)


# -- finite differences ----------------------------------------------------------------------------
CONV_CASES = [
    # x shape, weight shape, stride, padding
    ((2, 3, 6, 5), (4, 3, 3, 2), 1, 0),
    ((2, 3, 6, 5), (4, 3, 3, 2), 2, 1),
    ((1, 2, 7, 7), (3, 2, 3, 3), [2, 1], [1, 2]),
    ((3, 1, 5, 4), (2, 1, 1, 1), 3, 0),
    ((1, 2, 4, 6), (2, 2, 4, 2), [1, 3], [0, 1]),
]
POOL_CASES = [
    # x shape, kernel_size, stride, padding
    ((2, 3, 6, 5), 2, None, 0),
    ((2, 2, 7, 6), 3, 2, 1),
    ((1, 2, 5, 5), [2, 3], [1, 2], [1, 1]),
    ((1, 1, 4, 4), 2, 1, 0),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_conv2d_vjp_matches_finite_differences(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: Any, padding: Any
) -> None:
    rng = np.random.default_rng(sum(x_shape))
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    result = check_vjp(CONV2D, x, w, attrs={"stride": stride, "padding": padding})
    assert result.ok, result.message
    assert (result.points, result.skipped) == (x.size + w.size, 0)


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_conv2d_vjp_with_a_bias_matches_finite_differences(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: Any, padding: Any
) -> None:
    rng = np.random.default_rng(sum(w_shape))
    x, w, bias = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[:1])
    result = check_vjp(CONV2D, x, w, bias, attrs={"stride": stride, "padding": padding})
    assert result.ok, result.message
    assert (result.points, result.skipped) == (x.size + w.size + bias.size, 0)


@pytest.mark.parametrize(("x_shape", "kernel_size", "stride", "padding"), POOL_CASES)
def test_max_pool2d_vjp_matches_finite_differences(
    x_shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any
) -> None:
    x = np.random.default_rng(sum(x_shape)).standard_normal(x_shape)  # no ties: a kink of max
    attrs = {"kernel_size": kernel_size, "padding": padding} | ({} if stride is None else {"stride": stride})
    result = check_vjp(MAX_POOL2D, x, attrs=attrs)
    assert result.ok, result.message
    assert result.points == x.size


def test_a_wrong_weight_gradient_is_caught_at_its_worst_element() -> None:
    def doubled_corner(g: np.ndarray, out: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gx, gw = graphsvc_conv.conv2d_vjp(g, out, x, w)
        gw = gw.copy()
        gw[0, 0, 1, 1] *= 2
        return gx, gw

    wrong = Op("conv2d", 2, forward=graphsvc_conv.conv2d, vjp=doubled_corner, plugin="graphsvc-conv")
    result = check_vjp(wrong, X, W)
    # g is check_vjp's random cotangent (seed 0); the true value is 5*g00 + 6*g01 + 8*g10 + 9*g11
    g = np.random.default_rng(0).standard_normal((1, 1, 2, 2))
    true = float(np.sum(g * np.array([[[[5.0, 6.0], [8.0, 9.0]]]])))
    assert result.message == (
        f"op 'conv2d' (graphsvc-conv): d/d(input 1) at [0, 0, 1, 1] of float64[1,1,2,2]: "
        f"vjp gives {2 * true:.6g}, finite differences give {true:.6g}"
    )


# -- dtypes and read-only inputs -------------------------------------------------------------------
def test_float32_stays_float32() -> None:
    x, w = X.astype(np.float32), W.astype(np.float32)
    out, gx, gw = conv(x, w, stride=2, padding=1)
    assert (out.dtype, gx.dtype, gw.dtype) == (np.float32,) * 3
    assert out.tolist() == [[[[4.0, 18.0], [36.0, 77.0]]]]
    pooled = graphsvc_conv.max_pool2d(x, 2, 1, 1)
    (gp,) = graphsvc_conv.max_pool2d_vjp(np.ones(pooled.shape, np.float32), pooled, x, 2, 1, 1)
    assert (pooled.dtype, gp.dtype) == (np.float32, np.float32)


def test_inputs_are_left_as_they_were() -> None:
    x, w = read_only(X), read_only(W)
    conv(x, w, stride=2, padding=1)
    out = graphsvc_conv.max_pool2d(x, 2, 1, 1)
    graphsvc_conv.max_pool2d_vjp(read_only(np.ones(out.shape)), read_only(out), x, 2, 1, 1)
    assert (x.tolist(), w.tolist()) == (X.tolist(), W.tolist())


@pytest.mark.parametrize("with_bias", [False, True], ids=["x, weight", "x, weight, bias"])
def test_conv2d_computes_only_the_cotangents_asked_for(with_bias: bool) -> None:
    rng = np.random.default_rng(14)
    inputs = [rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 2))]
    inputs += [rng.standard_normal(4)] if with_bias else []
    attrs = {"stride": [2, 1], "padding": 1}
    out = graphsvc_conv.conv2d(*inputs, **attrs)
    g = read_only(rng.standard_normal(out.shape))
    every = graphsvc_conv.conv2d_vjp(g, out, *inputs, **attrs)
    assert [c.shape for c in every] == [x.shape for x in inputs]
    for needs in itertools.product([False, True], repeat=len(inputs)):
        some = graphsvc_conv.conv2d_vjp(g, out, *inputs, **attrs, needs_input_grad=needs)
        assert [c is not None for c in some] == list(needs)
        for mine, full in zip(some, every, strict=True):
            assert mine is None or mine.tobytes() == full.tobytes(), needs


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: graphsvc_conv.conv2d(X[0], W), "x must have 4 dimensions, got shape (1, 3, 3)"),
        (
            lambda: graphsvc_conv.conv2d(X, np.ones((1, 2, 2, 2))),
            "conv2d: x of shape (1, 1, 3, 3) has 1 channels, weight of shape (1, 2, 2, 2) expects 2",
        ),
        (
            lambda: graphsvc_conv.conv2d(X, W.astype(np.float32)),
            "conv2d: x is float64 and weight float32; give both the same dtype",
        ),
        (lambda: graphsvc_conv.conv2d(X.astype(np.int64), W), "x must hold floats, not int64"),
        (
            lambda: graphsvc_conv.conv2d(X, W, np.ones((1, 1))),
            "conv2d: bias of shape (1, 1) should be (1,), one value per output channel of weight of shape (1, 1, 2, 2)",
        ),
        (
            lambda: graphsvc_conv.conv2d(X, W, np.ones(1, np.float32)),
            "conv2d: x is float64 and bias float32; give both the same dtype",
        ),
        (
            lambda: graphsvc_conv.conv2d(X, W, np.ones(1), np.ones(1)),
            "conv2d takes 2 or 3 inputs (x, weight and an optional bias), not 4",
        ),
        (
            lambda: graphsvc_conv.conv2d(X, W, 2),
            "conv2d: bias must be an array or None, not int (stride and padding are keywords)",
        ),
        (
            lambda: graphsvc_conv.conv2d_vjp(np.ones((1, 1, 2, 2)), None, X, W, np.ones(2)),
            "conv2d: bias of shape (2,) should be (1,), one value per output channel of weight of shape (1, 1, 2, 2)",
        ),
        (lambda: graphsvc_conv.conv2d(X, W, stride=0), "stride must be an integer >= 1 or a pair of them, not 0"),
        (
            lambda: graphsvc_conv.conv2d(X, W, padding=[1, 2, 3]),
            "padding must be an integer >= 0 or a pair of them, not [1, 2, 3]",
        ),
        (lambda: graphsvc_conv.conv2d(X, W, stride=True), "stride must be an integer >= 1 or a pair of them, not True"),
        (
            lambda: graphsvc_conv.conv2d(X, np.ones((1, 1, 4, 1))),
            "conv2d: the kernel (4x1) is larger than the padded input (3x3)",
        ),
        (
            lambda: graphsvc_conv.max_pool2d(X, 2, padding=2),
            "max_pool2d: padding (2, 2) must be at most half of kernel_size (2, 2)",
        ),
        (lambda: graphsvc_conv.max_pool2d(X, 1.5), "kernel_size must be an integer >= 1 or a pair of them, not 1.5"),
    ],
)
def test_bad_shapes_and_attributes_are_one_line_value_errors(call: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()
    assert str(caught.value) == message


# -- in a graph ------------------------------------------------------------------------------------
def cnn_graph(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> graphsvc.Graph:
    """loss = sum(max_pool2d(relu(conv2d(x, w, stride 1, padding 1) + bias), 2))."""
    b = GraphBuilder()
    conv_node = b.add("conv2d", [b.leaf(x, name="x"), b.leaf(w, name="w")], attrs={"stride": 1, "padding": 1})
    biased = b.add("add", [conv_node, b.leaf(bias, name="bias")])
    pooled = b.add("max_pool2d", [b.add("relu", [biased])], attrs={"kernel_size": [2, 2]})
    b.add("sum", [pooled], name="loss")
    return b.build()


def test_a_replayed_graph_reports_a_bad_shape_naming_the_op_and_plugin() -> None:
    registry, problems = load_registry(["graphsvc_conv"])
    assert problems == []
    graph = cnn_graph(np.ones((1, 2, 4, 4)), np.ones((3, 1, 3, 3)), np.zeros((1, 3, 1, 1)))
    with pytest.raises(ReplayError) as caught:
        graphsvc.forward(graph, registry=registry)
    assert "op 'conv2d' (graphsvc_conv 0.1.0)" in str(caught.value)
    assert "ValueError: conv2d: x of shape (1, 2, 4, 4) has 2 channels, weight of shape (3, 1, 3, 3) expects 1" in str(
        caught.value
    )
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            [np.zeros((1, 3, 1, 1))],
            "conv2d: bias of shape (1, 3, 1, 1) should be (3,), one value per output channel of weight of shape "
            "(3, 2, 3, 3)",
        ),
        ([np.zeros(3, np.float32)], "conv2d: x is float64 and bias float32; give both the same dtype"),
    ],
    ids=["bias shape", "bias dtype"],
)
def test_a_replayed_graph_refuses_a_bad_bias_in_one_line(extra: list[np.ndarray], message: str) -> None:
    registry, _ = load_registry(["graphsvc_conv"])
    b = GraphBuilder()
    inputs = [b.leaf(np.ones((1, 2, 4, 4)), name="x"), b.leaf(np.ones((3, 2, 3, 3)), name="w")]
    inputs += [b.leaf(array) for array in extra]
    b.add("sum", [b.add("conv2d", inputs, attrs={"padding": 1}, name="conv")], name="loss")
    graph = b.build()
    source = registry.get("conv2d").source
    for replay, function in ((graphsvc.forward, "forward"), (graphsvc.backward, "forward_with_residuals")):
        with pytest.raises(ReplayError) as caught:
            replay(graph, registry=registry)
        assert str(caught.value) == f"node conv: op 'conv2d' ({source}): {function} raised ValueError: {message}"


def test_a_conv2d_node_with_a_fourth_input_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """conv2d declares max_arity=3 (x, weight, bias): a fourth input is the graph's error (exit 4),
    found when the ops are resolved, not conv2d's own refusal as it runs."""
    assert CONV2D.max_arity == 3
    b = GraphBuilder()
    inputs = [b.leaf(np.ones((1, 2, 4, 4)), name="x"), b.leaf(np.ones((3, 2, 3, 3)), name="w")]
    inputs += [b.leaf(np.zeros(3)), b.leaf(np.zeros(3))]
    b.add("sum", [b.add("conv2d", inputs, attrs={"padding": 1}, name="conv")], name="loss")
    graphsvc.save(b.build(), tmp_path / "g.msgpack")
    result = CliRunner().invoke(app, ["--plugin", "graphsvc_conv", "backward", str(tmp_path / "g.msgpack")])
    assert result.exit_code == 4
    assert result.stderr == "Error: node conv: op conv2d takes at most 3 inputs but the node has 4 parents\n"


def test_a_bias_given_as_an_attribute_is_refused_before_anything_runs() -> None:
    """The bias is an input: a node that gives it as an attribute is refused before anything runs."""
    registry, _ = load_registry(["graphsvc_conv"])
    b = GraphBuilder()
    inputs = [b.leaf(np.ones((1, 2, 4, 4)), name="x"), b.leaf(np.ones((3, 2, 3, 3)), name="w")]
    b.add("sum", [b.add("conv2d", inputs, attrs={"bias": [1.0, 2.0, 3.0]}, name="conv")], name="loss")
    with pytest.raises(OpError) as caught:
        graphsvc.forward(b.build(), registry=registry)
    source = registry.get("conv2d").source
    assert str(caught.value) == f"node conv: op 'conv2d' ({source}) has no attribute 'bias' (it takes: padding, stride)"


@pytest.mark.usefixtures("installed_plugins")
def test_the_installed_plugin_registers_both_ops_under_its_distribution() -> None:
    registry, _ = load_registry()
    assert [(op.name, op.source) for op in registry if op.plugin == "graphsvc-conv"] == [
        ("conv2d", "graphsvc-conv 0.1.0"),
        ("max_pool2d", "graphsvc-conv 0.1.0"),
    ]


# -- PyTorch -------------------------------------------------------------------------------------
def torch_or_skip() -> Any:
    return needs_torch()


@pytest.mark.parametrize(("stride", "padding"), list(itertools.product([1, 2, [2, 1]], [0, 1, [1, 2]])))
@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_conv2d_matches_pytorch(stride: Any, padding: Any, dtype: Any, rtol: float) -> None:
    torch = torch_or_skip()
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((3, 2, 7, 8)).astype(dtype), rng.standard_normal((4, 2, 3, 2)).astype(dtype)
    g = rng.standard_normal(graphsvc_conv.conv2d(x, w, stride=stride, padding=padding).shape).astype(dtype)
    out, gx, gw = conv(x, w, stride=stride, padding=padding, g=g)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    expected = torch.nn.functional.conv2d(
        tx, tw, stride=tuple(np.broadcast_to(stride, 2).tolist()), padding=tuple(np.broadcast_to(padding, 2).tolist())
    )
    expected.backward(torch.tensor(g))
    atol = rtol * 10
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(("stride", "padding"), [(1, 0), (1, 1), (2, 1), ([2, 1], [1, 2]), ([1, 3], 0)])
@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_conv2d_with_a_bias_matches_pytorch(stride: Any, padding: Any, dtype: Any, rtol: float) -> None:
    torch = torch_or_skip()
    rng = np.random.default_rng(15)
    x, w = rng.standard_normal((3, 2, 7, 8)).astype(dtype), rng.standard_normal((4, 2, 3, 2)).astype(dtype)
    bias = rng.standard_normal(4).astype(dtype)
    g = rng.standard_normal(graphsvc_conv.conv2d(x, w, stride=stride, padding=padding).shape).astype(dtype)
    got = biased_conv(x, w, bias, g, stride=stride, padding=padding)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
    pairs = (tuple(np.broadcast_to(value, 2).tolist()) for value in (stride, padding))  # as torch takes them
    expected = torch.nn.functional.conv2d(tx, tw, tb, *pairs)
    expected.backward(torch.tensor(g))
    atol = rtol * 10
    for mine, theirs in zip(got, (expected, tx.grad, tw.grad, tb.grad), strict=True):
        assert mine.dtype == dtype
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("kernel_size", "stride", "padding"), [(2, None, 0), (3, 1, 1), (3, 2, 1), ([2, 3], [1, 2], 1)]
)
def test_max_pool2d_matches_pytorch_with_ties(kernel_size: Any, stride: Any, padding: Any) -> None:
    torch = torch_or_skip()
    x = np.round(np.random.default_rng(3).standard_normal((2, 3, 7, 8)), 1)  # one decimal: many ties
    g = np.random.default_rng(4).standard_normal(graphsvc_conv.max_pool2d(x, kernel_size, stride, padding).shape)
    out = graphsvc_conv.max_pool2d(read_only(x), kernel_size, stride, padding)
    (gx,) = graphsvc_conv.max_pool2d_vjp(read_only(g), out, read_only(x), kernel_size, stride, padding)
    tx = torch.tensor(x, requires_grad=True)
    expected = torch.nn.functional.max_pool2d(tx, kernel_size, stride if stride is not None else None, padding)
    expected.backward(torch.tensor(g))
    assert np.array_equal(out, expected.detach().numpy())
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_a_small_cnn_graph_replays_to_pytorchs_gradients(dtype: Any, rtol: float) -> None:
    torch = torch_or_skip()
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 1, 6, 6)).astype(dtype), rng.standard_normal((3, 1, 3, 3)).astype(dtype)
    bias = rng.standard_normal((1, 3, 1, 1)).astype(dtype)
    registry, _ = load_registry(["graphsvc_conv"])
    replayed = graphsvc.backward(cnn_graph(x, w, bias), registry=registry)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
    loss = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(tx, tw, padding=1) + tb), 2).sum()
    loss.backward()
    np.testing.assert_allclose(replayed.value("loss"), loss.item(), rtol=rtol)
    for name, tensor in (("x", tx), ("w", tw), ("bias", tb)):
        grad = replayed.grad(name)
        assert isinstance(grad, np.ndarray) and grad.dtype == dtype
        np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_a_graph_with_a_biased_conv2d_replays_to_pytorchs_gradients(dtype: Any, rtol: float) -> None:
    """loss = sum(max_pool2d(relu(conv2d(x, w, bias, stride 1, padding 1)), 2)): one node for conv
    and bias, as in PyTorch's graph; a const bias (data) gets no gradient, and the others theirs."""
    torch = torch_or_skip()
    rng = np.random.default_rng(16)
    x, w = rng.standard_normal((2, 1, 6, 6)).astype(dtype), rng.standard_normal((3, 1, 3, 3)).astype(dtype)
    bias = rng.standard_normal(3).astype(dtype)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
    loss = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(tx, tw, tb, padding=1)), 2).sum()
    loss.backward()
    registry, _ = load_registry(["graphsvc_conv"])
    for bias_is_data in (False, True):
        b = GraphBuilder()
        bias_node = b.const(bias, name="bias") if bias_is_data else b.leaf(bias, name="bias")
        conv_node = b.add("conv2d", [b.leaf(x, name="x"), b.leaf(w, name="w"), bias_node], attrs={"padding": 1})
        b.add("sum", [b.add("max_pool2d", [b.add("relu", [conv_node])], attrs={"kernel_size": 2})], name="loss")
        replayed = graphsvc.backward(b.build(), registry=registry)
        np.testing.assert_allclose(replayed.value("loss"), loss.item(), rtol=rtol)
        for name, tensor in (("x", tx), ("w", tw), ("bias", tb)):
            grad = replayed.grad(name)
            if name == "bias" and bias_is_data:
                assert not isinstance(grad, np.ndarray) and np.isnan(grad)  # how a graph shows "none"
                continue
            assert isinstance(grad, np.ndarray) and grad.dtype == dtype
            np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=rtol, atol=rtol)


def test_both_vjps_hold_for_fortran_ordered_inputs() -> None:
    rng = np.random.default_rng(3)
    for op in (CONV2D, MAX_POOL2D):
        assert op.samples is not None
        for inputs, attrs in op.samples(rng):
            result = check_vjp(op, *(np.asfortranarray(x) for x in inputs), attrs=attrs)
            assert result.ok, result.message


def test_conv2d_keeps_its_columns_for_the_vjp_and_gives_the_same_bits_without_them() -> None:
    """graphsvc.backward passes conv2d's VJP the im2col columns its forward made; a backward from
    values computed elsewhere (no residuals) makes them again, to the same bits."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay

    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 2, 7, 6)), rng.standard_normal((3, 2, 3, 2))
    bias = rng.standard_normal((1, 3, 1, 1))
    registry, _ = load_registry(["graphsvc_conv"])
    graph = cnn_graph(x, w, bias)
    ops = replay.resolve_ops(graph, registry)
    kept: dict[int, Any] = {}
    values = tensors.forward(graph, ops, residuals=kept)
    (conv_node,) = kept  # the one conv2d node
    assert kept[conv_node].shape == (2, 2 * 3 * 2, 7 * 7)  # (N, C*kH*kW, H'*W'): 7x6 padded by 1, a 3x2 kernel
    with_columns = tensors.backward(graph, ops, graph.node_id("loss"), values, residuals=kept)
    without = tensors.backward(graph, ops, graph.node_id("loss"), values)
    for node, grad in enumerate(with_columns):
        other = without[node]
        assert (grad is None) == (other is None)
        if grad is not None and other is not None:
            assert grad.tobytes() == other.tobytes(), graph.label(node)


def test_a_replay_keeps_no_residuals_for_a_node_the_backward_pass_does_not_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two conv2d branches, the loss depending on one: the other's im2col columns are never kept
    (it is computed by plain forward), and every value and gradient has the bits of a replay that
    kept the residuals of both."""
    from graphsvc.replay import arrays as tensors
    from graphsvc.replay import columns as replay
    from graphsvc.replay import run as api
    from graphsvc.topo import ancestors

    rng = np.random.default_rng(9)
    x, w, v = rng.standard_normal((2, 2, 6, 5)), rng.standard_normal((3, 2, 3, 2)), rng.standard_normal((4, 2, 2, 2))
    b = GraphBuilder()
    leaf = b.leaf(x, name="x")
    used = b.add("conv2d", [leaf, b.leaf(w, name="w")], attrs={"stride": 1, "padding": 1}, name="used")
    b.add("conv2d", [leaf, b.leaf(v, name="v")], attrs={"stride": 2, "padding": 0}, name="unused")
    b.add("sum", [b.add("relu", [used])], name="loss")
    graph = b.build()
    registry, _ = load_registry(["graphsvc_conv"])
    ops = replay.resolve_ops(graph, registry)
    loss = graph.node_id("loss")

    everything: dict[int, Any] = {}
    values_all = tensors.forward(graph, ops, residuals=everything)
    assert sorted(map(graph.label, everything)) == ["unused", "used"]  # with no output known: both
    grads_all = tensors.backward(graph, ops, loss, values_all, residuals=everything)

    kept: dict[int, Any] = {}
    tensors.forward(graph, ops, residuals=kept, keep=ancestors(graph, loss))
    assert list(kept) == [graph.node_id("used")] and kept[graph.node_id("used")].shape == (2, 2 * 3 * 2, 6 * 6)

    seen: list[list[str]] = []  # what the backward sweep of graphsvc.backward is handed
    backward = tensors._backward

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(sorted(map(graph.label, args[5])))  # its residuals
        return backward(*args, **kwargs)

    monkeypatch.setattr(tensors, "_backward", spy)
    run = api.replay_values(graph, registry, {}, loss)
    assert seen == [["used"]]
    for node in range(graph.num_nodes):
        assert run.values[node].tobytes() == values_all[node].tobytes(), graph.label(node)
        mine, theirs = run.grads[node], grads_all[node]
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert mine.tobytes() == theirs.tobytes(), graph.label(node)
    assert not run.grads[graph.node_id("v")].any()  # the unused branch's weight: zeros, as before


@pytest.mark.parametrize(
    ("op", "attrs", "asked"),
    [
        ("conv2d", {"padding": 2**18}, "1x1x524290x524290 float64 array (2.0 TiB)"),
        (
            "max_pool2d",
            {"kernel_size": 2**19, "padding": 2**18, "stride": 1},
            "1x1x524290x524290 float64 array (2.0 TiB)",
        ),
    ],
)
def test_padding_that_asks_for_terabytes_is_refused_before_the_op_runs(
    op: str, attrs: dict[str, Any], asked: str
) -> None:
    # The checkout's plugin, not an installed copy that may predate out_shape.
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "plugins" / "graphsvc-conv" / "graphsvc_conv" / "__init__.py"
    spec = importlib.util.spec_from_file_location("graphsvc_conv_checkout", path)
    assert spec is not None and spec.loader is not None
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    registry, _ = load_registry(disable_third_party=True)
    conv.graphsvc_register_ops(lambda o: registry.register(o, plugin="graphsvc_conv"))
    b = GraphBuilder()
    x, w = b.leaf(np.ones((1, 1, 2, 2)), name="x"), b.leaf(np.ones((1, 1, 1, 1)), name="w")
    b.add("sum", [b.add(op, [x, w] if op == "conv2d" else [x], attrs=attrs, name="big")])
    with pytest.raises(ReplayError) as caught:
        graphsvc.forward(b.build(), registry=registry)
    assert str(caught.value) == (
        f"node big ({op}): asks for a {asked}, more than the limit of 4.0 GiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)"
    )
    assert conv.conv2d_shape((1, 3, 8, 8), (4, 3, 3, 3)) == (36, 27)  # the columns, larger than (1, 4, 6, 6)
    assert conv.conv2d_shape((1, 3, 2, 2), (4, 3, 3, 3)) is None  # conv2d says why
