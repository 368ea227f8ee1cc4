"""graphsvc.replay.step: one Step type for both engines, for L = (a*b + c)*(a + b) (seed004)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphsvc.graph import Graph
from graphsvc.replay.run import replay_values
from graphsvc.replay.step import Step


def test_the_column_engine_s_steps_give_local_derivatives(seed004_file: Graph, registry: Any) -> None:
    run = replay_values(seed004_file, registry, {}, 6, steps=True)
    assert not run.arrays
    assert run.steps is not None and [step.node for step in run.steps] == [6, 5, 4, 3, 2, 1, 0]
    # L = abc * apb: dL/dabc = apb = 5, dL/dapb = abc = 7; ab = a*b: local a -> b = 3, b -> a = 2
    assert run.steps[0] == Step(6, 1.0, [(4, 5.0, 5.0), (5, 7.0, 7.0)])
    assert run.steps[3] == Step(3, 5.0, [(0, 3.0, 15.0), (1, 2.0, 10.0)])
    assert run.steps[-1] == Step(0, 22.0, [])  # a leaf: where the gradient ends


def test_the_tensor_engine_s_steps_give_what_each_parent_is_sent(seed004_file: Graph, registry: Any) -> None:
    run = replay_values(seed004_file, registry, {0: np.array(2.0)}, 6, steps=True)  # an array: tensors
    assert run.arrays and run.steps is not None
    first = run.steps[0]
    assert (first.node, float(first.grad)) == (6, 1.0)
    assert [(parent, local, float(sent)) for parent, local, sent in first.contributions] == [
        (4, None, 5.0),  # no local derivative: a VJP maps gradients
        (5, None, 7.0),
    ]
    assert {step.node: float(step.grad) for step in run.steps if step.node < 3} == {0: 22.0, 1: 17.0, 2: 5.0}
