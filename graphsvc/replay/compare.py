"""Replayed numbers against stored ones (``--check``), and where nan or inf first appears: the
comparing that :mod:`graphsvc.replay.columns` does not do (it only replays).

:func:`differences` is the one element rule, shared by the column comparison here (:func:`compare`)
and the array one (:func:`graphsvc.replay.arrays.compare`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # annotations only: numpy.typing is not imported at run time
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

__all__ = ["Comparison", "NonFinite", "compare", "differences", "first_nonfinite", "tolerance_problem"]


class Comparison(NamedTuple):
    """How far replayed numbers are from stored ones.

    A stored nan is the format's "no stored value" (FORMAT.md: values not computed yet, no gradient),
    so those nodes are counted in ``unstored`` and not compared; ``inf`` equals ``inf``. The worst
    differences are over the compared nodes (``None`` nodes when none was compared).
    """

    what: str
    worst_abs: float
    worst_abs_node: int | None
    worst_rel: float
    worst_rel_node: int | None
    mismatches: int
    #: How many nodes have no stored number (nan in the file): not compared, not mismatches.
    unstored: int = 0
    #: How many nodes the columns hold (``nodes - unstored`` were compared).
    nodes: int = 0

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    @property
    def compared(self) -> int:
        """How many nodes had a stored number to compare with."""
        return self.nodes - self.unstored

    @property
    def worst_abs_at(self) -> tuple[int, tuple[int, ...]] | None:
        """Where the worst absolute difference is, as :class:`graphsvc.replay.arrays.TensorComparison`
        says it: (node, index into its array), the index ``()`` for a scalar."""
        return None if self.worst_abs_node is None else (self.worst_abs_node, ())

    @property
    def worst_rel_at(self) -> tuple[int, tuple[int, ...]] | None:
        """Where the worst relative difference is: (node, ``()``)."""
        return None if self.worst_rel_node is None else (self.worst_rel_node, ())


def differences(replayed: FloatArray, stored: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``|replayed - stored|`` and that over ``|stored|``, element by element (float64): 0 where
    the two are equal (two nans included), inf where only one is nan. Shared by the column
    comparison (:func:`compare`) and the array one (:func:`graphsvc.replay.arrays.compare`)."""
    with np.errstate(all="ignore"):
        same = (replayed == stored) | (np.isnan(replayed) & np.isnan(stored))
        diff = np.where(same, 0.0, np.abs(replayed - stored))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = np.where(diff == 0.0, 0.0, diff / np.maximum(np.abs(stored), np.finfo(np.float64).tiny))
        rel = np.where(np.isnan(rel), np.inf, rel)
    return diff, rel


def tolerance_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the tolerance called ``name`` (``--rtol``, ``atol``), or None. A
    tolerance is a finite number, 0 or more (0: equal numbers only); numpy's ``isclose`` warns that
    the others are invalid. inf would not be "accept anything" either (an inf ``rtol`` times a
    stored 0 is nan, which accepts nothing); a large number (``1e300``) is."""
    if 0 <= value < math.inf:
        return None
    return f"{name} must be a finite number, 0 or more, not {value!r}"


def compare(what: str, replayed: FloatArray, stored: FloatArray, rtol: float, atol: float) -> Comparison:
    """Compare two columns; a node mismatches when ``|replayed - stored| > atol + rtol * |stored|``.

    Nodes whose stored number is nan have no stored value: they are counted, not compared.
    """
    has_value = ~np.isnan(stored)
    close = np.isclose(replayed, stored, rtol=rtol, atol=atol, equal_nan=True) | ~has_value
    diff, rel = differences(replayed, stored)
    n = len(diff)
    unstored = n - int(np.count_nonzero(has_value))
    compared = n > unstored
    abs_node = int(np.argmax(np.where(has_value, diff, -1.0))) if compared else None
    rel_node = int(np.argmax(np.where(has_value, rel, -1.0))) if compared else None
    return Comparison(
        what=what,
        worst_abs=float(diff[abs_node]) if abs_node is not None else 0.0,
        worst_abs_node=abs_node,
        worst_rel=float(rel[rel_node]) if rel_node is not None else 0.0,
        worst_rel_node=rel_node,
        mismatches=int(np.count_nonzero(~close)),
        unstored=unstored,
        nodes=n,
    )


@dataclass(frozen=True)
class NonFinite:
    """Where nan or inf first appears in a column of replayed numbers.

    For values that is the lowest id (node ids are a topological order, so the forward pass meets
    it first); for gradients the highest id (the backward sweep runs in decreasing id order).
    A nan or inf is a finding, not an error: replay goes on and the exit code does not change.
    """

    what: str
    node: int
    value: float
    count: int


def first_nonfinite(what: str, column: FloatArray, *, backward: bool = False) -> NonFinite | None:
    """The first node of ``column`` holding nan or inf (see :class:`NonFinite`), or None."""
    bad = np.flatnonzero(~np.isfinite(column))
    if not len(bad):
        return None
    node = int(bad[-1] if backward else bad[0])
    return NonFinite(what, node, float(column[node]), len(bad))
