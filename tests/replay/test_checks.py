"""Replayed numbers against stored ones (graphsvc.replay.compare): the element rule, the worst nodes, and
nodes without a stored value counted apart. (Where nan or inf first appears: tests/replay/test_replay_faults.py.)"""

from __future__ import annotations

import math

import numpy as np

from graphsvc.replay import compare as checks


def test_differences_are_zero_for_equal_numbers_and_inf_where_one_side_is_nan() -> None:
    replayed = np.array([1.0, np.nan, np.nan, np.inf, 0.0, 3.0, -np.inf])
    stored = np.array([1.5, np.nan, 2.0, np.inf, -0.0, np.nan, np.inf])
    diff, rel = checks.differences(replayed, stored)
    assert diff.tolist() == [0.5, 0.0, math.inf, 0.0, 0.0, math.inf, math.inf]
    assert rel.tolist() == [0.5 / 1.5, 0.0, math.inf, 0.0, 0.0, math.inf, math.inf]


def test_compare_counts_nodes_without_a_stored_value_apart() -> None:
    # nan in a stored column is the format's "no stored value" (values not computed yet, no gradient)
    stored = np.array([1.0, np.nan, 3.0, np.nan, np.nan, np.inf, 7.0])
    replayed = np.array([1.0, 2.0, 3.5, np.nan, 5.0, np.inf, np.nan])
    c = checks.compare("values", replayed, stored, rtol=0.0, atol=0.1)
    assert (c.unstored, c.nodes, c.compared) == (3, 7, 4)
    assert (c.worst_abs, c.worst_abs_node, c.mismatches, c.ok) == (math.inf, 6, 2, False)  # 3.5 vs 3, nan vs 7
    assert (c.worst_rel, c.worst_rel_node) == (math.inf, 6)
    assert (c.worst_abs_at, c.worst_rel_at) == ((6, ()), (6, ()))
    only_missing = checks.compare("values", replayed[:5], stored[:5], rtol=0.0, atol=1.0)
    assert (only_missing.ok, only_missing.mismatches, only_missing.unstored) == (True, 0, 3)
    assert (only_missing.worst_abs, only_missing.worst_abs_node) == (0.5, 2)
    nothing = checks.compare("grads", np.array([1.0, 2.0]), np.array([np.nan, np.nan]), 0.0, 0.0)
    assert (nothing.ok, nothing.unstored, nothing.compared, nothing.worst_abs_node, nothing.worst_rel_node) == (
        True,
        2,
        0,
        None,
        None,
    )
    assert (nothing.worst_abs_at, nothing.worst_rel_at) == (None, None)


def test_compare_reports_the_worst_node() -> None:
    stored = np.array([1.0, 2.0, np.nan, np.inf])
    replayed = np.array([1.0, 2.5, np.nan, np.inf])
    c = checks.compare("values", replayed, stored, rtol=1e-9, atol=0.0)
    assert (c.worst_abs, c.worst_abs_node, c.worst_rel, c.worst_rel_node, c.mismatches) == (0.5, 1, 0.25, 1, 1)
    assert checks.compare("values", stored, stored, 0.0, 0.0).ok
