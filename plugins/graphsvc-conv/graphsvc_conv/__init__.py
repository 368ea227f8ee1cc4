"""Convolution and pooling for graphsvc: conv2d and max_pool2d, with PyTorch's semantics.

A worked example of a graphsvc plugin whose ops work on arrays and give a vector-Jacobian product
(see docs/plugins.md in graphsvc): ``vjp(g, out, *inputs, **attrs)`` returns one cotangent per input,
the gradient of the loss with respect to that input; conv2d's VJP also declares
``needs_input_grad``, so graphsvc tells it which cotangents to compute (an image that is data needs
none). Only the public plugin API is used
(``graphsvc.ops.Op``, ``graphsvc.hookspecs.hookimpl``).

Layouts are PyTorch's: ``x`` is (N, C, H, W), a conv2d weight (O, C, kH, kW), and an output row
``H' = (H + 2 * padding - kH) // stride + 1``. Both ops keep their input's dtype (float32 stays
float32) and never write into their inputs, which graphsvc passes read-only.

conv2d is im2col: the padded input's windows (a strided view, no copy) are laid out as columns once
and multiplied with the weight in one batched matmul, into whose product the bias (an optional third
input, as in PyTorch's ``conv2d(input, weight, bias)``) is added in place; its VJP puts the columns'
cotangents back with one strided addition per kernel offset (col2im). The weight's cotangent needs
the columns again: ``forward_with_residuals`` hands them to graphsvc, which passes them to the VJP
as ``residuals`` when the backward pass follows the forward (a backward from stored values makes
them again). Otherwise the columns live in a scratch buffer kept per thread and shape and reused
from call to call: a fresh buffer of that size comes from glibc's ``mmap`` each time, and its page
faults made the matmul reading it ten times slower. Where the output has fewer windows than the
kernel has offsets (a large kernel over a small image, whose columns would be the kernel's size
times each window), conv2d and its VJP go window by window instead, each window's part of x with
the matching part of the kernel, and keep no columns.

max_pool2d's VJP finds each window's pick by comparing it with its maximum, one kernel offset at a
time, and writes ``g`` there by masking g's bits (:func:`_where_into`); both max_pool2d and its VJP
step window by window instead when that takes fewer steps (:func:`_by_window`), with the same
picks. It keeps no residuals: the comparisons cost about what keeping each window's winning offset
from the forward would.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op

__version__ = "0.1.0"

Pair = tuple[int, int]


# -- attributes and shapes ------------------------------------------------------------------------
def _pair(name: str, value: Any, minimum: int) -> Pair:
    """An int or a pair of ints (a list, as attributes come from a file), each at least ``minimum``."""
    if type(value) is int and value >= minimum:  # the usual case, in a tenth of the time of the checks below
        return value, value
    items = tuple(value) if isinstance(value, list | tuple) else (value, value)
    if len(items) == 2 and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= minimum for v in items
    ):
        return int(items[0]), int(items[1])
    raise ValueError(f"{name} must be an integer >= {minimum} or a pair of them, not {value!r}")


def _image(name: str, array: np.ndarray) -> None:
    """Refuse anything but a 4-d float array."""
    if array.ndim != 4:
        raise ValueError(f"{name} must have 4 dimensions, got shape {array.shape}")
    if array.dtype.kind != "f":
        raise ValueError(f"{name} must hold floats, not {array.dtype}")


def _output_size(op: str, size: Pair, kernel: Pair, stride: Pair, padding: Pair) -> Pair:
    padded = (size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    if kernel[0] > padded[0] or kernel[1] > padded[1]:
        raise ValueError(
            f"{op}: the kernel ({kernel[0]}x{kernel[1]}) is larger than the padded input ({padded[0]}x{padded[1]})"
        )
    return (padded[0] - kernel[0]) // stride[0] + 1, (padded[1] - kernel[1]) // stride[1] + 1


def _largest_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return max(shapes, key=math.prod)


def conv2d_shape(
    x: tuple[int, ...], weight: tuple[int, ...], *bias: tuple[int, ...], stride: Any = 1, padding: Any = 0
) -> tuple[int, ...] | None:
    """graphsvc's ``out_shape``: the largest array conv2d makes for inputs of these shapes (its
    output, the padded input or the im2col columns), before it runs; None where conv2d refuses them."""
    if len(x) != 4 or len(weight) != 4:
        return None
    try:
        kernel, stride_, padding_ = weight[2:], _pair("stride", stride, 1), _pair("padding", padding, 0)
        oh, ow = _output_size("conv2d", x[2:], kernel, stride_, padding_)
    except ValueError:
        return None
    padded = (x[0], x[1], x[2] + 2 * padding_[0], x[3] + 2 * padding_[1])
    return _largest_shape((x[0], weight[0], oh, ow), padded, (x[0] * oh * ow, x[1] * kernel[0] * kernel[1]))


def max_pool2d_shape(
    x: tuple[int, ...], kernel_size: Any, stride: Any = None, padding: Any = 0
) -> tuple[int, ...] | None:
    """graphsvc's ``out_shape``: the largest array max_pool2d makes (its output or the padded input)."""
    if len(x) != 4:
        return None
    try:
        kernel = _pair("kernel_size", kernel_size, 1)
        stride_ = kernel if stride is None else _pair("stride", stride, 1)
        padding_ = _pair("padding", padding, 0)
        oh, ow = _output_size("max_pool2d", x[2:], kernel, stride_, padding_)
    except ValueError:
        return None
    return _largest_shape((*x[:2], oh, ow), (*x[:2], x[2] + 2 * padding_[0], x[3] + 2 * padding_[1]))


def _pad(x: np.ndarray, padding: Pair, value: float = 0.0) -> np.ndarray:
    """``x`` inside a border of ``value`` (np.pad's constant mode, in a fifth of its time)."""
    if padding == (0, 0):
        return x
    ph, pw = padding
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    return xp


def _windows(xp: np.ndarray, kernel: Pair, stride: Pair) -> np.ndarray:
    """A read-only view (N, C, H', W', kH, kW) of the padded input's windows."""
    return sliding_window_view(xp, kernel, axis=(2, 3))[:, :, :: stride[0], :: stride[1]]


def _unpad(xp: np.ndarray, padding: Pair) -> np.ndarray:
    ph, pw = padding
    return xp[:, :, ph : xp.shape[2] - ph, pw : xp.shape[3] - pw]


#: Kernels of at most this many offsets have their slices kept (:func:`_offsets`).
KEPT_OFFSETS = 64

Offsets = tuple[tuple[int, int, slice, slice], ...]


def _offsets(kernel: Pair, stride: Pair, out_size: Pair) -> Offsets:
    """Per kernel offset (a, b), in row-major order: the slices of the padded input it touches.
    Kept for a small kernel (the same few shapes come call after call); a large one's, a file's
    300x300 window holding 90,000 of them, are made each time and let go."""
    if kernel[0] * kernel[1] <= KEPT_OFFSETS:
        return _kept_offsets(kernel, stride, out_size)
    return _make_offsets(kernel, stride, out_size)


def _make_offsets(kernel: Pair, stride: Pair, out_size: Pair) -> Offsets:
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_size
    return tuple(
        (a, b, slice(a, a + sh * (oh - 1) + 1, sh), slice(b, b + sw * (ow - 1) + 1, sw))
        for a in range(kh)
        for b in range(kw)
    )


_kept_offsets = functools.lru_cache(maxsize=64)(_make_offsets)


def _by_window(kernel: Pair, out_size: Pair) -> bool:
    """Step window by window instead of kernel offset by kernel offset: fewer steps when the kernel
    has more offsets than the output has windows (a large window over a small image: a file's
    300x300 window over a 1x1 image made 90,000 steps a call)."""
    return out_size[0] * out_size[1] < kernel[0] * kernel[1]


def _window_parts(
    kernel: Pair, stride: Pair, padding: Pair, out_size: Pair, size: Pair
) -> list[tuple[int, int, slice, slice, slice, slice]]:
    """Per output position (i, j), in row-major order: the slices of the unpadded input its window
    covers and the matching slices of the kernel (both empty for a window that lies in the padding
    alone, which a conv2d padded by more than half its kernel has; a max_pool2d never does)."""
    (kh, kw), (sh, sw), (ph, pw), (h, w) = kernel, stride, padding, size
    parts = []
    for i, j in itertools.product(range(out_size[0]), range(out_size[1])):
        top, left = i * sh - ph, j * sw - pw
        r0, c0 = max(top, 0), max(left, 0)
        r1, c1 = max(min(top + kh, h), r0), max(min(left + kw, w), c0)
        parts.append((i, j, slice(r0, r1), slice(c0, c1), slice(r0 - top, r1 - top), slice(c0 - left, c1 - left)))
    return parts


# -- conv2d ----------------------------------------------------------------------------------------
def _conv_setup(
    x: np.ndarray, weight: np.ndarray, bias: tuple[np.ndarray, ...], stride: Any, padding: Any
) -> tuple[np.ndarray | None, Pair, Pair, Pair, Pair]:
    """The bias (None without one), kernel, stride, padding and output size; ``bias`` holds the
    inputs after x and weight: none, or the bias (or None, as PyTorch's ``bias=None``)."""
    if len(bias) > 1:
        raise ValueError(f"conv2d takes 2 or 3 inputs (x, weight and an optional bias), not {2 + len(bias)}")
    _image("x", x)
    _image("weight", weight)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"conv2d: x of shape {x.shape} has {x.shape[1]} channels, weight of shape {weight.shape} expects "
            f"{weight.shape[1]}"
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"conv2d: x is {x.dtype} and weight {weight.dtype}; give both the same dtype")
    b = bias[0] if bias else None
    if b is not None:
        if not isinstance(b, np.ndarray):
            raise ValueError(
                f"conv2d: bias must be an array or None, not {type(b).__name__} (stride and padding are keywords)"
            )
        if b.shape != weight.shape[:1]:
            raise ValueError(
                f"conv2d: bias of shape {b.shape} should be {weight.shape[:1]}, one value per output channel of "
                f"weight of shape {weight.shape}"
            )
        if b.dtype != x.dtype:
            raise ValueError(f"conv2d: x is {x.dtype} and bias {b.dtype}; give both the same dtype")
    kernel = (weight.shape[2], weight.shape[3])
    if 0 in kernel or 0 in x.shape[2:]:
        raise ValueError(f"conv2d: empty input or kernel (x {x.shape}, weight {weight.shape})")
    stride_, padding_ = _pair("stride", stride, 1), _pair("padding", padding, 0)
    return b, kernel, stride_, padding_, _output_size("conv2d", x.shape[2:], kernel, stride_, padding_)


_SCRATCH = threading.local()
#: How many scratch buffers a thread keeps (one per shape and dtype; the oldest goes first).
SCRATCH_BUFFERS = 8


def _scratch(purpose: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A buffer for this thread's intermediate results, reused by the next call with the same shape.
    Only for arrays that do not outlive the call (never an op's result)."""
    buffers: dict[tuple[Any, ...], np.ndarray] = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (purpose, shape, dtype)
    buffer = buffers.pop(key, None)
    if buffer is None:
        buffer = np.empty(shape, dtype)
        while len(buffers) >= SCRATCH_BUFFERS:
            del buffers[next(iter(buffers))]
    buffers[key] = buffer  # the most recently used last
    return buffer


def _columns(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair, keep: bool = False) -> np.ndarray:
    """im2col: (N, C*kH*kW, H'*W'), one column per output pixel, in the weight's (C, kH, kW) order;
    a scratch buffer, valid until the next call, or with ``keep`` an array of their own."""
    windows = _windows(_pad(x, padding), kernel, stride)
    n, c, oh, ow, kh, kw = windows.shape
    shape = (n, c, kh, kw, oh, ow)
    columns = np.empty(shape, x.dtype) if keep else _scratch("columns", shape, x.dtype)
    np.copyto(columns, windows.transpose(0, 1, 4, 5, 2, 3))
    return columns.reshape(n, c * kh * kw, oh * ow)


def _conv2d(
    x: np.ndarray, weight: np.ndarray, bias: tuple[np.ndarray, ...], stride: Any, padding: Any, keep: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    bias_, kernel, stride_, padding_, (oh, ow) = _conv_setup(x, weight, bias, stride, padding)
    if _by_window(kernel, (oh, ow)):  # few windows: each from its part of x, no columns
        out = np.zeros((x.shape[0], weight.shape[0], oh, ow), dtype=x.dtype)
        for i, j, rows, cols, krows, kcols in _window_parts(kernel, stride_, padding_, (oh, ow), x.shape[2:]):
            out[:, :, i, j] = np.tensordot(x[:, :, rows, cols], weight[:, :, krows, kcols], axes=([1, 2, 3], [1, 2, 3]))
        if bias_ is not None:
            out += bias_[:, None, None]
        return out, None
    columns = _columns(x, kernel, stride_, padding_, keep)
    # (O, K) @ (N, K, P): one batched matmul (K given, not -1: a weight of no output channels has size 0)
    out = weight.reshape(weight.shape[0], columns.shape[1]) @ columns
    if bias_ is not None:
        out += bias_[:, None]  # into the product: no second array of the output's size
    return out.reshape(x.shape[0], weight.shape[0], oh, ow), columns


def conv2d(x: np.ndarray, weight: np.ndarray, *bias: np.ndarray, stride: Any = 1, padding: Any = 0) -> np.ndarray:
    """PyTorch's ``conv2d``: (N, C, H, W) and (O, C, kH, kW) give (N, O, H', W'), plus the bias
    (O,) when there is a third input."""
    return _conv2d(x, weight, bias, stride, padding, keep=False)[0]


def conv2d_with_residuals(
    x: np.ndarray, weight: np.ndarray, *bias: np.ndarray, stride: Any = 1, padding: Any = 0
) -> tuple[np.ndarray, np.ndarray | None]:
    """conv2d, and its im2col columns, which the weight's cotangent needs again (graphsvc keeps them
    for :func:`conv2d_vjp` when a backward pass follows, as PyTorch's ``save_for_backward``)."""
    return _conv2d(x, weight, bias, stride, padding, keep=True)


def conv2d_vjp(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    weight: np.ndarray,
    *bias: np.ndarray,
    stride: Any = 1,
    padding: Any = 0,
    needs_input_grad: tuple[bool, ...] | None = None,
    residuals: np.ndarray | None = None,
) -> tuple[np.ndarray | None, ...]:
    """The cotangents of x, weight and the bias if there is one, given ``g`` of the output's shape;
    only those graphsvc says are needed (an image that is data gets none: its col2im is the larger
    half of the work; ``None`` means all). The weight's needs the im2col columns: ``residuals``,
    those :func:`conv2d_with_residuals` made, when graphsvc kept them, else made again."""
    bias_, kernel, stride_, padding_, (oh, ow) = _conv_setup(x, weight, bias, stride, padding)
    needs = (True,) * (2 + len(bias)) if needs_input_grad is None else needs_input_grad
    n, c, h, w = x.shape
    o = weight.shape[0]
    g3 = np.asarray(g, dtype=x.dtype).reshape(n, o, oh * ow)
    # a node with a bias: its cotangent, g summed over all but the channels
    grad_bias = (g3.sum(axis=(0, 2)) if bias_ is not None and needs[2] else None,) if bias else ()
    if _by_window(kernel, (oh, ow)):  # as the forward: each window from its part of x, no columns
        g4 = g3.reshape(n, o, oh, ow)
        grad_x = np.zeros(x.shape, dtype=x.dtype) if needs[0] else None
        grad_w = np.zeros(weight.shape, dtype=x.dtype) if needs[1] else None
        for i, j, rows, cols, krows, kcols in _window_parts(kernel, stride_, padding_, (oh, ow), (h, w)):
            if grad_w is not None:
                grad_w[:, :, krows, kcols] += np.tensordot(g4[:, :, i, j], x[:, :, rows, cols], axes=([0], [0]))
            if grad_x is not None:
                grad_x[:, :, rows, cols] += np.tensordot(g4[:, :, i, j], weight[:, :, krows, kcols], axes=([1], [0]))
        return grad_x, grad_w, *grad_bias
    grad_weight = None
    if needs[1]:
        columns = _columns(x, kernel, stride_, padding_) if residuals is None else residuals
        grad_weight = np.matmul(g3, columns.transpose(0, 2, 1)).sum(axis=0).reshape(weight.shape)
    if not needs[0]:
        return None, grad_weight, *grad_bias
    column_grads = _scratch("column_grads", (n, c * kernel[0] * kernel[1], oh * ow), x.dtype)
    np.matmul(weight.reshape(o, column_grads.shape[1]).T, g3, out=column_grads)
    column_grads = column_grads.reshape(n, c, kernel[0], kernel[1], oh, ow)
    grad_padded = np.zeros((n, c, h + 2 * padding_[0], w + 2 * padding_[1]), dtype=x.dtype)
    for a, b, rows, cols in _offsets(kernel, stride_, (oh, ow)):  # col2im
        grad_padded[:, :, rows, cols] += column_grads[:, :, a, b]
    return _unpad(grad_padded, padding_), grad_weight, *grad_bias


# -- max_pool2d ------------------------------------------------------------------------------------
def _pool_setup(x: np.ndarray, kernel_size: Any, stride: Any, padding: Any) -> tuple[Pair, Pair, Pair, Pair]:
    _image("x", x)
    kernel = _pair("kernel_size", kernel_size, 1)
    stride_ = kernel if stride is None else _pair("stride", stride, 1)
    padding_ = _pair("padding", padding, 0)
    if 2 * padding_[0] > kernel[0] or 2 * padding_[1] > kernel[1]:
        raise ValueError(f"max_pool2d: padding {padding_} must be at most half of kernel_size {kernel}")
    if 0 in x.shape[2:]:
        raise ValueError(f"max_pool2d: empty input of shape {x.shape}")
    return kernel, stride_, padding_, _output_size("max_pool2d", x.shape[2:], kernel, stride_, padding_)


def max_pool2d(x: np.ndarray, kernel_size: Any, stride: Any = None, padding: Any = 0) -> np.ndarray:
    """PyTorch's ``max_pool2d``: the largest value of each window; padding counts as -inf."""
    kernel, stride_, padding_, out_size = _pool_setup(x, kernel_size, stride, padding)
    if _by_window(kernel, out_size):  # over x itself: padding (-inf) never changes a maximum
        out = np.empty(x.shape[:2] + out_size, dtype=x.dtype)
        for i, j, rows, cols, _, _ in _window_parts(kernel, stride_, padding_, out_size, x.shape[2:]):
            np.max(x[:, :, rows, cols], axis=(2, 3), out=out[:, :, i, j])  # nan where any is nan, as _largest
        return out
    xp = _pad(x, padding_, -np.inf)
    return _largest([xp[:, :, rows, cols] for _, _, rows, cols in _offsets(kernel, stride_, out_size)])


def _largest(views: list[np.ndarray]) -> np.ndarray:
    """The elementwise maximum of ``views``, nan where any is nan: pairs first, then into the
    first pair's result, a pass fewer than copying one view and taking the maximum with each of
    the others."""
    if len(views) == 1:
        return views[0].copy()
    pairs = [np.maximum(views[i], views[i + 1]) for i in range(0, len(views) - 1, 2)]
    out = pairs[0]
    for other in pairs[1:] + views[len(pairs) * 2 :]:
        np.maximum(out, other, out=out)
    return out


def max_pool2d_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, kernel_size: Any, stride: Any = None, padding: Any = 0
) -> tuple[np.ndarray]:
    """Each window's ``g`` goes to its largest element, the first in row-major order on a tie, and
    a window holding nan gives it to its last nan: PyTorch's CPU kernel, which takes an element
    that is larger, or nan. Windows that do not overlap (stride at least the kernel) each write
    their own elements: set, not added to, with ``g + 0.0`` (PyTorch adds g to zeros, so a -0.0 in
    g gives +0.0; one addition over the output, smaller than x, instead of one per element)."""
    kernel, stride_, padding_, out_size = _pool_setup(x, kernel_size, stride, padding)
    g = np.asarray(g, dtype=x.dtype)
    apart = stride_[0] >= kernel[0] and stride_[1] >= kernel[1]
    if apart:
        g = g + 0.0  # -0.0 -> +0.0: PyTorch adds g to zeros
    if _by_window(kernel, out_size):
        return (_pool_vjp_by_window(g, out, x, kernel, stride_, padding_, out_size, apart),)
    xp = _pad(x, padding_, -np.inf)
    real = None if padding_ == (0, 0) else _pad(np.ones(x.shape, dtype=bool), padding_, False)
    # windows that tile the padded input: the first pass writes every element of the gradient
    tiled = stride_ == kernel and xp.shape[2:] == (out_size[0] * kernel[0], out_size[1] * kernel[1])
    grad_padded = np.empty(xp.shape, dtype=x.dtype) if tiled else np.zeros(xp.shape, dtype=x.dtype)
    offsets = _offsets(kernel, stride_, out_size)
    # the maxima, first match first (a nan window matches nothing here: nan == nan is false); then,
    # if a maximum is nan, its window's last nan: the offsets from the last
    passes = [(offsets, lambda window: window == out)]
    if out.size and np.isnan(out.max()):  # max propagates nan: one pass, no array of flags (none when empty)
        passes.append((offsets[::-1], np.isnan))
    for order, matches in passes:
        taken = None  # windows already given their gradient
        for index, (_, _, rows, cols) in enumerate(order):
            window = xp[:, :, rows, cols]
            hit = matches(window)
            if real is not None:  # an all -inf window's maximum is its first real element, not padding
                hit &= real[:, :, rows, cols]
            if taken is None:
                taken = hit
            else:
                np.greater(hit, taken, out=hit)  # hit and not taken
                if index < len(order) - 1:
                    taken |= hit
            # windows apart, on the first pass, write each element once (set); otherwise add
            _where_into(grad_padded[:, :, rows, cols], hit, g, add=not (apart and order is offsets))
    return (_unpad(grad_padded, padding_),)


def _pool_vjp_by_window(
    g: np.ndarray,
    out: np.ndarray,
    x: np.ndarray,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
    out_size: Pair,
    apart: bool,
) -> np.ndarray:
    """:func:`max_pool2d_vjp`'s gradient of x, window by window (:func:`_by_window`): each window's
    pick is its first maximum in row-major order among its real elements (padding is never picked),
    or its last nan, as the offset-by-offset passes pick it, and its ``g`` is set there when windows
    are apart (``g`` holds no -0.0 then), else added. Only the window's real part is looked at, and
    no float of it is copied: a large window over a small image neither pads the input nor copies it
    per window."""
    n, c = x.shape[:2]
    batch, channel = np.indices((n, c), sparse=True)
    grad = np.zeros(x.shape, dtype=x.dtype)
    for i, j, rows, cols, _, _ in _window_parts(kernel, stride, padding, out_size, x.shape[2:]):
        window = x[:, :, rows, cols]
        size, width = window.shape[2] * window.shape[3], window.shape[3]
        top = out[:, :, i, j]
        hit = (window == top[:, :, np.newaxis, np.newaxis]).reshape(n, c, size)  # a new array: no copy
        pick = hit.argmax(axis=2)
        nan = np.isnan(top)
        if nan.any():
            nans = np.isnan(window).reshape(n, c, size)
            pick = np.where(nan, size - 1 - nans[:, :, ::-1].argmax(axis=2), pick)
        at = (batch, channel, rows.start + pick // width, cols.start + pick % width)
        if apart:
            grad[at] = g[:, :, i, j]
        else:  # one window's picks are distinct elements: no two of them add into one
            grad[at] += g[:, :, i, j]
    return grad


#: The unsigned integer of each float's size, whose bits :func:`_where_into` masks.
_BITS: dict[int, np.dtype] = {2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def _where_into(into: np.ndarray, hit: np.ndarray, g: np.ndarray, add: bool) -> None:
    """``into`` (a view) set to ``np.where(hit, g, 0)``, or with ``add`` that added to it, to the
    bit: g's bits and'ed with a mask of all ones where ``hit``, without np.where's branch per
    element (on the benchmark CNN's windows it mispredicts so often that np.where costs three
    times as much), written straight into ``into`` when set."""
    bits = _BITS.get(g.dtype.itemsize)
    if bits is None:  # a long double
        contribution = np.where(hit, g, 0)
    else:
        mask = hit.astype(bits)
        np.negative(mask, out=mask)  # 1 -> all ones
        if not add:
            np.bitwise_and(g.view(bits), mask, out=into.view(bits))
            return
        contribution = np.bitwise_and(g.view(bits), mask, out=mask).view(g.dtype)
    if add:
        into += contribution
    else:
        into[...] = contribution


OPS: tuple[Op, ...] = (
    Op(
        "conv2d", 2,
        forward=conv2d,
        vjp=conv2d_vjp,
        forward_with_residuals=conv2d_with_residuals,
        out_shape=conv2d_shape,
        variadic=True,  # the bias: an optional third input
        max_arity=3,
        samples=lambda rng: [
            ((rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))), {}),
            ((rng.standard_normal((1, 2, 6, 5)), rng.standard_normal((3, 2, 2, 3))), {"stride": 2, "padding": [1, 0]}),
            ((rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)), {}),
            (
                (rng.standard_normal((1, 2, 6, 5)), rng.standard_normal((3, 2, 2, 3)), rng.standard_normal(3)),
                {"stride": [1, 2], "padding": 1},
            ),
        ],
        doc="2-d convolution (cross-correlation, as PyTorch's conv2d) of x (N, C, H, W) with a weight "
        "(O, C, kH, kW), plus a bias (O,) if the node has a third input; attributes `stride` and `padding` "
        "(an int or [h, w]; defaults 1 and 0, zero padding). Output (N, O, H', W'); x, weight and bias share "
        "a float dtype.",
    ),
    Op(
        "max_pool2d", 1,
        forward=max_pool2d,
        vjp=max_pool2d_vjp,
        out_shape=max_pool2d_shape,
        samples=lambda rng: [
            ((rng.permutation(216).reshape(2, 3, 6, 6) / 10.0,), {"kernel_size": 2}),  # no ties
            ((rng.permutation(50).reshape(1, 2, 5, 5) / 10.0,), {"kernel_size": 3, "stride": 2, "padding": 1}),
        ],
        doc="The largest value of each window of x (N, C, H, W), as PyTorch's max_pool2d; attributes "
        "`kernel_size` (an int or [h, w]), `stride` (default kernel_size) and `padding` (default 0, "
        "-inf, at most half the kernel). The gradient goes to each window's first maximum in row-major order "
        "(to its last nan if it holds one, as PyTorch).",
    ),
)  # fmt: skip


@hookimpl
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register conv2d and max_pool2d."""
    for op in OPS:
        register(op)
