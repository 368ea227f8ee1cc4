"""graphsvc.replay.step: one Step type for both engines, for L = (a*b + c)*(a + b) (seed004)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

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


def test_swept_steps_are_the_reference_sweep_s_steps_to_the_bit(registry: Any) -> None:
    """SweptSteps makes each step when read, from the sweep's columns: the same steps, bit for bit,
    as the reference sweep recording them one by one, over a DAG where nodes share parents, with
    nodes that are not ancestors of the output (skipped) between them."""
    from benchmarks import graphs as G
    from graphsvc.replay import columns
    from graphsvc.replay.step import SweptSteps

    graph = G.dag(600, seed=3)
    values = columns.forward(graph, registry)
    output = 500  # not the last node: the ancestors skip ids
    grads, swept = columns.backward_steps(graph, registry, output, values)
    assert isinstance(swept, SweptSteps)
    from graphsvc.native import engine_for
    from graphsvc.topo import ancestors

    ops = columns.resolve_ops(graph, registry)
    engine = engine_for(graph.num_nodes)
    nodes = np.flatnonzero(ancestors(graph, output, engine))
    local = columns._edge_derivatives(graph, ops, values, nodes, engine, None)
    recorded: list[Step] = []
    expected = columns.reference_sweep(graph, output, local, nodes, recorded)
    assert grads.tobytes() == expected.tobytes()
    assert len(swept) == len(recorded) == len(nodes) < 600
    assert list(swept) == recorded and swept == recorded
    assert [s.node for s in swept] == sorted(nodes.tolist(), reverse=True)
    assert swept[0] == recorded[0] and swept[-1] == recorded[-1] and swept[17] == recorded[17]
    assert swept[5:40] == recorded[5:40] and swept[40:5:-3] == recorded[40:5:-3] and swept[3:3] == []
    with pytest.raises(IndexError):
        swept[len(recorded)]

    def bits(steps: Any) -> list[Any]:
        return [
            (s.node, np.float64(s.grad).tobytes(), [(p, np.float64(c).tobytes()) for p, _, c in s.contributions])
            for s in steps
        ]

    assert bits(swept) == bits(recorded)
    assert repr(swept) == f"<SweptSteps of {len(recorded)} steps>"
