"""The benchmark generators on tiny sizes: valid graphs, equal in every form the benchmarks compare.

Not a timed test: speed is measured by ``python benchmarks/run.py``.
"""

from __future__ import annotations

import graphlib
import pickle

import msgpack
import numpy as np
import pytest

import graphsvc
from benchmarks import graphs as G
from graphsvc import replay
from graphsvc.plugins import load_registry
from graphsvc.topo import levels, reverse_topological_order


@pytest.fixture(scope="module")
def registry():
    return load_registry(disable_third_party=True)[0]


def test_dag_has_exactly_n_nodes_one_output_and_small_depth():
    g = G.dag(1000)
    g.check()
    assert g.num_nodes == 1000
    assert g.num_edges == 2 * (1000 - g.op_histogram()["leaf"])
    assert g.outputs == [999]
    computed_sinks = [s for s in g.sinks().tolist() if g.op(s) != "leaf"]
    assert computed_sinks == [999]  # every computed node feeds the output (a few leaves may not)
    assert int(levels(g).max()) == 9 + 7  # 9 layers, then a sum tree over 90 nodes
    assert np.isfinite(g.values).all()


def test_dag_is_reproducible_from_its_seed():
    assert G.same_graph(G.dag(500, seed=3), G.dag(500, seed=3))
    assert not G.same_graph(G.dag(500, seed=3), G.dag(500, seed=4))


def test_chain_is_as_deep_as_it_is_long():
    g = G.chain(30)
    g.check()
    assert g.num_nodes == 3 + 30
    assert int(levels(g).max()) == 30
    assert g.parents(3) == [0, 1] and g.parents(4) == [3, 2] and g.parents(5) == [4]
    assert g.parents(6) == [5, 1]


@pytest.mark.parametrize("graph", [G.dag(300), G.chain(30)], ids=["dag", "chain"])
def test_replay_reproduces_the_generated_values(graph, registry):
    assert np.array_equal(replay.forward(graph, registry), graph.values)


@pytest.mark.parametrize("graph", [G.dag(300), G.chain(30)], ids=["dag", "chain"])
def test_graph_is_equal_across_formats(graph, tmp_path):
    path = tmp_path / "g.graphsvc"
    graphsvc.save(graph, path)
    loaded = graphsvc.load(path)
    records = G.to_records(graph)
    assert G.same_graph(loaded, graph)
    assert G.same_graph(G.from_records(pickle.loads(pickle.dumps(records, protocol=5))), graph)
    assert G.same_graph(G.from_records(msgpack.unpackb(msgpack.packb(records))), graph)


def test_graphlib_and_graphsvc_orders_are_both_valid():
    g = G.dag(300)
    position = {
        node: i for i, node in enumerate(graphlib.TopologicalSorter(G.parents_map(G.to_records(g))).static_order())
    }
    ours = {int(node): i for i, node in enumerate(reverse_topological_order(g, g.outputs[0]))}
    for child in range(g.num_nodes):
        for parent in g.parents(child):
            assert position[parent] < position[child]
            assert ours[parent] > ours[child]


def test_micrograd_chain_matches_the_columns(registry):
    root, (x0, w, b) = G.micrograd_chain(30)
    columns = G.chain(30)
    assert root.data == columns.values[-1]
    converted, _ = G.from_micrograd(root)
    fallback = G.micrograd_to_graph(root)
    for g in (converted, fallback):
        g.check()
        assert g.num_nodes == columns.num_nodes
        assert g.op_histogram() == columns.op_histogram()
        assert sorted(g.values.tolist()) == sorted(columns.values.tolist())
    root.backward()
    grads = replay.backward(columns, registry, columns.outputs[0])
    assert grads[:3] == pytest.approx([x0.grad, w.grad, b.grad], rel=1e-12)
    assert len(G.micrograd_build_topo(root)) == columns.num_nodes


def test_micrograd_mlp_converts_and_replays(registry):
    _model, root, _x = G.micrograd_mlp(4)
    g = G.micrograd_to_graph(root)
    g.check()
    assert g.num_nodes == len(G.micrograd_postorder(root))
    assert replay.forward(g, registry)[-1] == pytest.approx(root.data, rel=1e-12)
    root.backward()
    ours = replay.backward(g, registry, g.outputs[0])
    theirs = [v.grad for v in G.micrograd_postorder(root)]
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_torch_expression_matches(registry):
    torch = pytest.importorskip("torch")
    g = G.dag(300)
    out, leaves, leaf_ids = G.to_torch(g)
    assert out.dtype == torch.float64 and out.dim() == 0
    assert out.item() == pytest.approx(g.values[-1], rel=1e-12)
    out.backward()
    grads = replay.backward(g, registry, g.outputs[0])
    assert [0.0 if t.grad is None else t.grad.item() for t in leaves] == pytest.approx(
        grads[leaf_ids].tolist(), rel=1e-9
    )
