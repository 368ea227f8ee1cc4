"""Replayed numbers against stored ones (``--check``), and where nan or inf first appears: the
comparing that :mod:`graphsvc.replay.columns` does not do (it only replays).

One :class:`Comparison` and one :class:`NonFinite`, whichever engine replayed: the column
comparison here (:func:`compare`, :func:`first_nonfinite`) and the array one
(:func:`graphsvc.replay.arrays.compare`, :func:`graphsvc.replay.arrays.first_nonfinite`) both give
them, a scalar's index being ``()``. :func:`differences` is the one element rule they share;
:func:`finite` looks for nan and inf in many arrays at once, grouped by :class:`ArrayGroups`
(which the CLI's tensor listings stack the same way).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from graphsvc.graph import TENSOR_DTYPES

if TYPE_CHECKING:  # annotations only: numpy.typing is not imported at run time
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

__all__ = [
    "DEFAULT_TOLERANCES",
    "ArrayGroups",
    "Comparison",
    "Element",
    "NonFinite",
    "Tolerance",
    "compare",
    "differences",
    "finite",
    "first_nonfinite",
    "tolerance",
    "tolerance_problem",
    "tolerance_text",
    "used",
]

#: A node and an index into its array (``()`` for a scalar): where a difference or a nan is.
Element = tuple[int, tuple[int, ...]]


class Tolerance(NamedTuple):
    """How far a replayed number may be from the stored one: ``|replayed - stored| <= atol + rtol * |stored|``."""

    rtol: float
    atol: float


#: ``--check``'s tolerance for the numbers of each dtype, when ``--rtol``/``--atol`` are not given:
#:
#: * float64: rtol 1e-9, atol 1e-12, room for a replay on another machine to differ in the last bits
#:   (libm's exp, log, tanh...; a sum in another order);
#: * float32: rtol 1e-4, atol 1e-6. float32's epsilon is 1.19e-7, and a sum of n products computed
#:   in another order (numpy's matmul against PyTorch's) may differ by up to about n epsilons
#:   relative to the sum of the terms' sizes: 1e-4 is a sum over ~840 terms (a 784-wide layer); atol
#:   covers the elements that cancel to near 0, where a relative difference means nothing. Measured
#:   on an MLP 784-512-512-10 (batch 128) whose stored numbers are PyTorch's: worst abs diff 2.4e-6
#:   of values, 3.5e-8 of gradients, no element beyond (1e-4, 1e-6), 14 nodes beyond float64's;
#: * int64 (indices, labels): equal numbers only.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-9, 1e-12),
    "float32": Tolerance(1e-4, 1e-6),
    "int64": Tolerance(0.0, 0.0),
}


def tolerance(
    dtypes: Iterable[np.dtype], rtol: float | None = None, atol: float | None = None
) -> tuple[str, Tolerance]:
    """The tolerance to compare numbers of ``dtypes`` (a replayed array's and the stored one's) with:
    the loosest of their defaults (:data:`DEFAULT_TOLERANCES`: float32's when float32 meets
    float64), with ``rtol`` and ``atol`` in its place where given; and the name of the dtype it is
    the default of (what the report says it used)."""
    chosen = max(
        (dtype.name if dtype.name in DEFAULT_TOLERANCES else "float64" for dtype in dtypes),
        key=lambda name: DEFAULT_TOLERANCES[name],
        default="float64",
    )
    default = DEFAULT_TOLERANCES[chosen]
    return chosen, Tolerance(default.rtol if rtol is None else rtol, default.atol if atol is None else atol)


def tolerance_text(tolerances: Sequence[tuple[str, Tolerance]]) -> str:
    """The tolerances a check used, as its line says them: ``float32: rtol 1e-4, atol 1e-6; int64:
    rtol 0, atol 0`` (``""`` for none)."""

    def number(x: float) -> str:  # 1e-4, not 0.0001 nor 1e-04; 0.5 as it is
        if x == 0 or 1e-3 <= abs(x) < 1e4:
            return "0" if x == 0 else repr(x)
        mantissa, exponent = repr(x).split("e") if "e" in repr(x) else f"{x:e}".split("e")
        if float(f"{mantissa}e{exponent}") != x:  # f"{x:e}" keeps 6 digits: the shortest that is x
            mantissa, exponent = f"{x:.16e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.') if '.' in mantissa else mantissa}e{int(exponent)}"

    return "; ".join(f"{dtype}: rtol {number(t.rtol)}, atol {number(t.atol)}" for dtype, t in tolerances)


def used(found: Iterable[tuple[str, Tolerance]]) -> tuple[tuple[str, Tolerance], ...]:
    """The distinct tolerances ``found`` (the dtype each is the default of), in the order of
    :data:`DEFAULT_TOLERANCES`."""
    distinct = dict(found)
    return tuple((dtype, distinct[dtype]) for dtype in DEFAULT_TOLERANCES if dtype in distinct)


class Comparison(NamedTuple):
    """How far replayed numbers are from stored ones, values or gradients (``what``).

    A node mismatches when any of its elements has ``|replayed - stored| > atol + rtol * |stored|``
    (or, for arrays, the shapes differ), with the tolerance of its dtype (:func:`tolerance`).
    A stored nan is the format's "no stored value" (FORMAT.md:
    values not computed yet, no gradient), as is a node with no stored array: those nodes are
    counted in ``unstored`` and not compared; ``inf`` equals ``inf``. The worst differences are
    over the compared elements, each at a node and an index into its array (``()`` for a scalar;
    ``None`` when nothing was compared).
    """

    what: str
    worst_abs: float
    worst_abs_at: Element | None
    worst_rel: float
    worst_rel_at: Element | None
    mismatches: int
    #: How many nodes have no stored number (nan in the file): not compared, not mismatches.
    unstored: int = 0
    #: How many nodes were replayed (``nodes - unstored`` were compared).
    nodes: int = 0
    #: The tolerances the compared nodes were held to, each with the dtype whose default it is
    #: (:func:`tolerance`), in the order of :data:`DEFAULT_TOLERANCES`; empty when nothing was compared.
    tolerances: tuple[tuple[str, Tolerance], ...] = ()

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    @property
    def compared(self) -> int:
        """How many nodes had a stored number to compare with."""
        return self.nodes - self.unstored

    @property
    def worst_abs_node(self) -> int | None:
        """The node of the worst absolute difference (None when nothing was compared)."""
        return None if self.worst_abs_at is None else self.worst_abs_at[0]

    @property
    def worst_rel_node(self) -> int | None:
        """The node of the worst relative difference."""
        return None if self.worst_rel_at is None else self.worst_rel_at[0]


def differences(replayed: FloatArray, stored: FloatArray, atol: float = 0.0) -> tuple[FloatArray, FloatArray]:
    """``|replayed - stored|`` and that over ``|stored|``, element by element (float64): 0 where
    the two are equal (two nans included), inf where only one is nan. The relative difference is
    counted where ``|stored| > atol`` (0 elsewhere): at or below ``atol`` the absolute tolerance
    decides (a gradient of 1e-8 against a stored 0 is no ratio: it read as 1e+295); with ``atol``
    0, a difference from a stored 0 is inf. Shared by the column comparison (:func:`compare`) and
    the array one (:func:`graphsvc.replay.arrays.compare`)."""
    with np.errstate(all="ignore"):
        same = (replayed == stored) | (np.isnan(replayed) & np.isnan(stored))
        diff = np.where(same, 0.0, np.abs(replayed - stored))
        diff = np.where(np.isnan(diff), np.inf, diff)
        size = np.abs(stored)
        rel = np.where(size == 0.0, np.inf, diff / np.where(size == 0.0, 1.0, size))  # no ratio over 0
        rel = np.where((diff == 0.0) | ((size <= atol) & (atol > 0)), 0.0, rel)
        rel = np.where(np.isnan(rel) | np.isinf(diff), np.inf, rel)
    return diff, rel


def tolerance_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the tolerance called ``name`` (``--rtol``, ``atol``), or None. A
    tolerance is a finite number, 0 or more (0: equal numbers only); numpy's ``isclose`` warns that
    the others are invalid. inf would not be "accept anything" either (an inf ``rtol`` times a
    stored 0 is nan, which accepts nothing); a large number (``1e300``) is."""
    if 0 <= value < math.inf:
        return None
    return f"{name} must be a finite number, 0 or more, not {value!r}"


def compare(
    what: str, replayed: FloatArray, stored: FloatArray, rtol: float | None = None, atol: float | None = None
) -> Comparison:
    """Compare two float64 columns; a node mismatches when ``|replayed - stored| > atol + rtol *
    |stored|`` (``None``: float64's default, :data:`DEFAULT_TOLERANCES`).

    Nodes whose stored number is nan have no stored value: they are counted, not compared.
    """
    dtype, (rtol, atol) = tolerance([np.dtype(np.float64)], rtol, atol)
    has_value = ~np.isnan(stored)
    close = np.isclose(replayed, stored, rtol=rtol, atol=atol, equal_nan=True) | ~has_value
    diff, rel = differences(replayed, stored, atol)
    n = len(diff)
    unstored = n - int(np.count_nonzero(has_value))
    compared = n > unstored
    abs_node = int(np.argmax(np.where(has_value, diff, -1.0))) if compared else None
    rel_node = int(np.argmax(np.where(has_value, rel, -1.0))) if compared else None
    return Comparison(
        what=what,
        worst_abs=float(diff[abs_node]) if abs_node is not None else 0.0,
        worst_abs_at=None if abs_node is None else (abs_node, ()),
        worst_rel=float(rel[rel_node]) if rel_node is not None else 0.0,
        worst_rel_at=None if rel_node is None else (rel_node, ()),
        mismatches=int(np.count_nonzero(~close)),
        unstored=unstored,
        nodes=n,
        tolerances=((dtype, Tolerance(rtol, atol)),) if compared else (),
    )


@dataclass(frozen=True)
class NonFinite:
    """Where nan or inf first appears in replayed values or gradients (``what``): its node, its
    value, how many nodes hold one, and where in the node's array (``()`` for a scalar).

    First means the lowest id for values (node ids are a topological order, so the forward pass
    meets it first) and the highest for gradients (the backward sweep runs in decreasing id order);
    within an array, the first element in C order. A nan or inf is a finding, not an error: replay
    goes on and the exit code does not change.
    """

    what: str
    node: int
    value: float
    count: int
    index: tuple[int, ...] = ()


def first_nonfinite(what: str, column: FloatArray, *, backward: bool = False) -> NonFinite | None:
    """The first node of a float64 ``column`` holding nan or inf (see :class:`NonFinite`), or None."""
    bad = np.flatnonzero(~np.isfinite(column))
    if not len(bad):
        return None
    node = int(bad[-1] if backward else bad[0])
    return NonFinite(what, node, float(column[node]), len(bad))


# -- many arrays at once ---------------------------------------------------------------------------
Arrays = Sequence[np.ndarray | None]

_INDEX_DTYPE = np.dtype(np.int64)

#: Most elements stacked into one matrix: bounds the memory a batch holds besides the arrays.
BATCH_ELEMENTS = 1 << 20


class ArrayGroups:
    """The positions in a list of arrays, those that can be stacked grouped by dtype and shape,
    the others (:attr:`alone`) apart; ``None`` in neither.

    numpy's overhead a call makes one call an array cost about 200 µs a node over a million small
    arrays; a group's elements stacked into one matrix, an array a row, make each statistic one
    reduction along the rows. Two kinds of array are never stacked, where a row's result could
    differ in its last bits from the array's own: one that is not C-contiguous (numpy sums it in
    its memory order), and one of more than ``np.getbufsize()`` elements (numpy's float64 sum of a
    float32 array adds up buffers of that many cast elements)."""

    def __init__(self, arrays: Arrays) -> None:
        limit = np.getbufsize()
        self.alone: list[int] = []
        alone = self.alone
        # a dtype and shape's list, or ``alone`` itself for one that is never stacked: decided once
        by_kind: dict[tuple[np.dtype, tuple[int, ...]], list[int]] = {}
        for position, array in enumerate(arrays):
            if array is None:
                continue
            key = (array.dtype, array.shape)
            positions = by_kind.get(key)
            if positions is None:
                stackable = 0 < array.size <= limit and array.dtype in TENSOR_DTYPES
                positions = by_kind[key] = [] if stackable else alone
            if array.flags.c_contiguous:
                positions.append(position)
            else:
                alone.append(position)
        self.by_kind = {key: positions for key, positions in by_kind.items() if positions is not alone and positions}

    def stacked(self, arrays: Arrays) -> Iterator[tuple[np.dtype, tuple[int, ...], list[int], np.ndarray]]:
        """Each group a batch at a time (at most :data:`BATCH_ELEMENTS` elements): its dtype and
        shape, the batch's positions and its arrays as the rows of one matrix (a copy of their
        elements: read-only, C order)."""
        for (dtype, shape), positions in self.by_kind.items():
            size = math.prod(shape)
            step = max(1, BATCH_ELEMENTS // size)
            for start in range(0, len(positions), step):
                batch = positions[start : start + step]
                # a C-contiguous array's buffer is its elements in order; a group holds no None
                joined = b"".join([arrays[p] for p in batch])  # type: ignore[misc]
                yield dtype, shape, batch, np.frombuffer(joined, dtype=dtype).reshape(len(batch), size)


def finite(arrays: Arrays) -> list[bool]:
    """Whether each array holds only finite numbers (``np.all(np.isfinite(array))``; ``True`` for
    ``None``, for an int64 array and for an empty one), worked out a group at a time
    (:class:`ArrayGroups`)."""
    result = [True] * len(arrays)
    groups = ArrayGroups(arrays)
    for dtype, _, batch, matrix in groups.stacked(arrays):
        if dtype != _INDEX_DTYPE:
            for position, ok in zip(batch, np.isfinite(matrix).all(axis=1).tolist(), strict=True):
                result[position] = ok
    for position in groups.alone:
        array = arrays[position]
        assert array is not None
        result[position] = array.dtype == _INDEX_DTYPE or bool(np.all(np.isfinite(array)))
    return result
