"""graphsvc.replay.compare.differences: the relative difference where the absolute tolerance decides."""

from __future__ import annotations

import math

import numpy as np


def test_with_atol_0_a_difference_from_a_stored_0_is_no_finite_ratio() -> None:
    from graphsvc.replay.compare import differences

    diff, rel = differences(np.array([1e-3, 2.0, 0.0]), np.array([0.0, 1.0, 0.0]), 0.0)
    assert diff.tolist() == [1e-3, 1.0, 0.0] and rel.tolist() == [math.inf, 1.0, 0.0]
    _, rel = differences(np.array([1e-3, 2.0]), np.array([0.0, 1.0]), 1e-2)
    assert rel.tolist() == [0.0, 1.0]  # at or below atol, atol decides
