"""The benchmark generators on tiny sizes: valid graphs, equal in every form the benchmarks compare;
every benchmark script answers ``--help`` or runs on a tiny graph, so none rots unseen; the numba
kernels the C ones are measured against compute what the C ones compute.

Not a timed test: speed is measured by ``python benchmarks/run.py``.
"""

from __future__ import annotations

import dataclasses
import graphlib
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import graphsvc
from benchmarks import graphs as G
from graphsvc.ops import opmath
from graphsvc.ops.opmath import PRIMITIVE_ARITY, PRIMITIVES
from graphsvc.replay import columns as replay
from graphsvc.topo import levels, reverse_topological_order
from tests.conftest import ROOT, needs_torch, require_compiled, same_bits


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


def test_pow_chain_is_one_pow_per_step_each_with_its_exponent():
    g = G.pow_chain(30)
    g.check()
    assert (g.num_nodes, int(levels(g).max())) == (1 + 30, 30)
    assert g.op_histogram() == {"leaf": 1, "pow": 30}
    assert [g.parents(i) for i in (1, 2, 30)] == [[0], [1], [29]]
    assert sorted(g.attrs) == list(range(1, 31))
    assert {a["exponent"] for a in g.attrs.values()} == {1.0001, 1 / 1.0001}
    assert g.values[0] == 1.5 and g.values[2] == (1.5 ** g.attrs[1]["exponent"]) ** g.attrs[2]["exponent"]


def test_pow_chain_stays_finite_and_moves_over_many_steps(registry):
    """The exponents' product walks around 1: no value or gradient overflows or settles on a cycle."""
    g = G.pow_chain(100_000)
    grads = replay.backward(g, registry, g.outputs[0])
    assert np.isfinite(g.values).all() and np.isfinite(grads).all()
    assert 1.4 < g.values.min() < g.values.max() < 1.6 and len(np.unique(g.values)) > 1000
    assert 0.5 < grads.min() < grads.max() < 2


@pytest.mark.parametrize("graph", [G.dag(300), G.chain(30), G.pow_chain(30)], ids=["dag", "chain", "pow_chain"])
def test_replay_reproduces_the_generated_values(graph, registry):
    if graph.attrs:  # pow: libm's in the generator (math.pow), the same bits only through the C loop
        require_compiled()
    assert np.array_equal(replay.forward(graph, registry), graph.values)


@pytest.mark.parametrize("graph", [G.dag(300), G.chain(30), G.pow_chain(30)], ids=["dag", "chain", "pow_chain"])
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


def test_micrograd_pow_chain_is_the_columns_bit_for_bit(registry):
    """The same libm pow and the same products on both sides: values and gradients agree exactly."""
    require_compiled()  # the C loop calls libm's pow; numpy's own loop may differ in the last bit
    root, x0, exponents = G.micrograd_pow_chain(30)
    columns = G.pow_chain(30)
    assert exponents == [columns.attrs[i]["exponent"] for i in range(1, 31)]
    converted, _ = G.from_micrograd(root)
    assert G.same_graph(dataclasses.replace(converted, grads=None), columns)  # micrograd's grads: all 0
    nodes = G.micrograd_postorder(root)
    assert replay.forward(columns, registry).tolist() == [v.data for v in nodes]
    root.backward()
    assert replay.backward(columns, registry, columns.outputs[0]).tolist() == [v.grad for v in nodes]
    assert nodes[0] is x0


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
    torch = needs_torch()
    g = G.dag(300)
    out, leaves, leaf_ids = G.to_torch(g)
    assert out.dtype == torch.float64 and out.dim() == 0
    assert out.item() == pytest.approx(g.values[-1], rel=1e-12)
    out.backward()
    grads = replay.backward(g, registry, g.outputs[0])
    assert [0.0 if t.grad is None else t.grad.item() for t in leaves] == pytest.approx(
        grads[leaf_ids].tolist(), rel=1e-9
    )


# -- every benchmark script runs --------------------------------------------------------------------
BENCHMARKS = ROOT / "benchmarks"
#: The scripts with a command line of options: each answers --help.
WITH_HELP = [
    "bench_capture.py",
    "bench_capture_replay.py",
    "bench_cli.py",
    "bench_diff.py",
    "bench_memory.py",
    "bench_json.py",
    "bench_kernels.py",
    "bench_per_node.py",
    "bench_replay_kernels.py",
    "bench_storage.py",
    "bench_tensors.py",
    "bench_value.py",
    "bench_view.py",
    "bench_view_page.py",
    "numba_kernels.py",
    "run.py",
]
#: The helpers run.py starts in a child process with positional arguments: each gets a tiny run below.
CHILDREN = ["memstep.py", "torch_backward.py"]


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_benchmark_script_is_smoke_tested() -> None:
    """A new script must join WITH_HELP or CHILDREN (and get its tiny run)."""
    scripts = [path.name for path in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()]
    assert sorted(scripts) == sorted(WITH_HELP + CHILDREN)


#: Scripts that need an optional package at import, before they read their options.
NEEDS = {
    "numba_kernels.py": ("numba", "pip install -e '.[bench]': benchmarks/numba_kernels.py needs numba"),
}
#: The scripts that import PyTorch: asked for as every test asks (needs_torch).
NEEDS_TORCH = {"bench_capture.py", "bench_capture_replay.py"}


@pytest.mark.parametrize("name", WITH_HELP)
def test_benchmark_script_answers_help(name: str) -> None:
    if name in NEEDS:
        module, reason = NEEDS[name]
        pytest.importorskip(module, reason=reason)
    if name in NEEDS_TORCH:
        needs_torch()
    before = (BENCHMARKS / name).read_bytes()
    result = script(str(BENCHMARKS / name), "--help")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(f"usage: {name} [-h]")
    assert (BENCHMARKS / name).read_bytes() == before  # numba_kernels.py's --help rewrites nothing


def test_bench_tensors_refuses_to_isolate_alternatives_that_run_several_threads() -> None:
    """A forked child cannot use GNU OpenMP once its parent ran a parallel region: PyTorch's child
    waited forever at its first matrix product. Refused at once, before torch is imported (so
    this runs without torch too)."""
    result = script(str(BENCHMARKS / "bench_tensors.py"), "--isolate", "--threads", "2", "--no-write", "--rounds", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.endswith(
        "error: --isolate runs with --threads 1 only (PyTorch's OpenMP threads do not survive a fork)\n"
    )


def test_bench_diff_runs_on_tiny_graphs(tmp_path: Path) -> None:
    result = script(
        str(BENCHMARKS / "bench_diff.py"), "--nodes", "300", "--rounds", "1", "--dir", str(tmp_path), "--no-write"
    )
    assert (result.returncode, result.stderr) == (0, "")
    rows = [line.split(" | ")[0] for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["| pair", "| identical", "| one leaf", "| one op"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.msgpack", "leaf.msgpack", "op.msgpack"]


def test_bench_view_runs_on_tiny_graphs(tmp_path: Path) -> None:
    result = script(
        str(BENCHMARKS / "bench_view.py"), "--nodes", "300", "--rounds", "1", "--dir", str(tmp_path), "--no-write"
    )
    assert (result.returncode, result.stderr) == (0, "")
    rows = [line.split(" | ")[:3] for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    # the chain: 100 steps of mul, add, relu after x0, w, b; the MLP(7, [7, 7, 1]): 7 inputs, then per
    # layer 3 x inputs x outputs + 2 x outputs (weights, products, sums; biases, tanh)
    assert rows == [["| graph", "nodes", "groups"], ["| chain", "303", "6"], ["| mlp", "352", "21"]]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chain-300.msgpack", "mlp-300.msgpack"]


def test_bench_memory_runs_on_tiny_graphs(tmp_path: Path) -> None:
    result = script(str(BENCHMARKS / "bench_memory.py"), "--nodes", "50", "--dir", str(tmp_path), "--no-write")
    assert (result.returncode, result.stderr) == (0, "")
    rows = [line.split(" | ")[0].lstrip("| ") for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["step", "floor", "load empty", "load scalars", "backward", "backward --steps"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "chain-50.msgpack",
        "empty-50.msgpack",
        "scalars-50.msgpack",
    ]
    empty = graphsvc.load(tmp_path / "empty-50.msgpack")
    assert (len(empty.arrays), len(empty.grad_arrays), empty.arrays[49].shape) == (50, 50, (0,))


def test_memstep_runs_a_step_on_a_tiny_graph(tmp_path: Path) -> None:
    graphsvc.save(G.chain(30), tmp_path / "chain.graphsvc")
    graphsvc.save(G.chain(3), tmp_path / "warm.graphsvc")
    result = script(
        str(BENCHMARKS / "memstep.py"), "backward", str(tmp_path / "chain.graphsvc"), str(tmp_path / "warm.graphsvc")
    )
    assert (result.returncode, result.stderr) == (0, "")
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["step_peak_bytes"] >= 0 and measured["step_seconds"] > 0


def test_torch_backward_runs_on_a_tiny_graph(tmp_path: Path) -> None:
    needs_torch()
    graphsvc.save(G.chain(30), tmp_path / "chain.graphsvc")
    result = script(str(BENCHMARKS / "torch_backward.py"), str(tmp_path / "chain.graphsvc"), "1")
    assert result.returncode == 0, result.stderr[-500:]
    measured = json.loads(result.stdout.splitlines()[-1])
    assert (len(measured["times"]), measured["matches"]) == (1, True)


def test_run_py_compares_the_pow_chain_on_a_tiny_graph(tmp_path: Path) -> None:
    """run.py's whole pow chain path (the only graph whose nodes carry attributes): every step timed
    against its alternatives, and every check of its results true (bit for bit with micrograd's
    libm pow: through the C loop)."""
    require_compiled()
    options = ["--only", "pow", "--sizes", "300", "--repeat", "1", "--no-torch", "--no-memory", "--out", str(tmp_path)]
    result = script(str(BENCHMARKS / "run.py"), *options)
    assert result.returncode == 0, result.stderr[-500:]
    measured = json.loads((tmp_path / "latest.json").read_text())
    assert measured["graphs"]["pow_chain"]["nodes"] == 301
    steps = [(r["step"], r["alternative"]) for r in measured["comparisons"] if r["graph"] == "pow_chain"]
    assert steps == [
        ("save", "pickle (per-node dicts)"),
        ("save", "msgpack (per-node maps)"),
        ("load", "pickle (per-node dicts)"),
        ("load", "msgpack (per-node maps)"),
        ("order", "micrograd build_topo"),
        ("order", "graphlib"),
        ("forward", "micrograd (building it)"),
        ("backward", "micrograd backward()"),
    ]
    checks = measured["checks"]["pow_chain"]
    assert checks.pop("micrograd_converter").startswith("graphsvc.micrograd")
    assert checks == {
        "micrograd_chain_matches_columns": True,
        "order_reaches": 301,
        "forward_matches_stored": True,
        "backward_matches_micrograd": True,
        "values_same_bits_as_micrograd": True,
        "backward_same_bits_as_micrograd": True,
    }


# -- the numba kernels: the C replay sweeps' twins ----------------------------------------------------
@pytest.fixture(scope="module")
def jit():  # type: ignore[no-untyped-def]
    pytest.importorskip("numba", reason="pip install -e '.[bench]': benchmarks/numba_kernels.py needs numba")
    from benchmarks import numba_kernels

    return numba_kernels


@pytest.fixture(scope="module")
def c():  # type: ignore[no-untyped-def]
    import graphsvc.native as kernels

    compiled = kernels._compiled()
    if compiled is None:
        pytest.skip("graphsvc's C kernels are not built here")
    return compiled


def pow_graph() -> graphsvc.Graph:
    """Every primitive once, pow with two exponents (a per-node parameter), on inputs where each is finite."""
    b = graphsvc.GraphBuilder()
    x, y = b.leaf(0.75, name="x"), b.leaf(1.5, name="y")
    nodes = [b.add("pow", [x], attrs={"exponent": 3.0}), b.add("pow", [y], attrs={"exponent": -0.5})]
    for op in PRIMITIVES:
        if op != "pow":
            nodes.append(b.add(op, [x, y] if PRIMITIVE_ARITY[op] == 2 else [x]))
    while len(nodes) > 1:
        nodes = [b.add("add", nodes[:2]), *nodes[2:]]
    return b.build()


def test_numba_math_is_generated_from_the_current_table(jit) -> None:  # type: ignore[no-untyped-def]
    assert jit.generated() in (BENCHMARKS / "numba_kernels.py").read_text()
    assert sorted(jit.WORDS) == sorted(opmath.WORDS)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.5, 0.5, 3.0, 1e-310, 1e308, -1e308, 710.0, -745.5, 1e-20])
SPECIAL = np.concatenate([SPECIAL, [np.inf, -np.inf, np.nan]])


@pytest.mark.parametrize("op", PRIMITIVES)
def test_numba_primitives_compute_the_bits_c_computes(jit, c, op: str) -> None:  # type: ignore[no-untyped-def]
    code = PRIMITIVES.index(op) + 1
    x, y = np.repeat(SPECIAL, len(SPECIAL)), np.tile(SPECIAL, len(SPECIAL))
    for param in (2.0, 3.0, 0.5, -1.0, 0.0, np.inf, np.nan):
        out = c.elementwise(code, x, y, param)
        assert same_bits(jit.elementwise(code, x, y, param), out), (op, param)
        ours, theirs = c.elementwise_partials(code, x, y, out, param), jit.elementwise_partials(code, x, y, out, param)
        assert same_bits(ours[0], theirs[0]) and same_bits(ours[1], theirs[1]), (op, param)


def test_numba_sweeps_take_params_as_the_c_ones_do(jit, c, registry) -> None:  # type: ignore[no-untyped-def]
    graph = pow_graph()
    ops = replay.resolve_ops(graph, registry)
    table = replay._primitive_table(ops)
    plan = replay._primitive_params(graph, table)
    assert replay._all_primitives(graph, ops, table, plan)
    assert plan.params is not None and plan.params[2:4].tolist() == [3.0, -0.5]
    columns = (graph.op_codes, table, graph.parent_offsets, graph.parent_indices)
    results = []
    for kernels in (c, jit):
        values = graph.values.copy()
        kernels.forward_all_primitives(*columns, values, plan.params)
        results.append(values)
    assert same_bits(results[0], results[1])
    assert results[1][2] == 0.75**3 and np.isfinite(results[1]).all()
    # without params, or with the wrong number, both refuse in the same words
    for params, words in [
        (None, "params: node 2 is a primitive with a parameter (code 6), but no params were given"),
        (np.zeros(3), f"params: 3 items, expected one per node ({graph.num_nodes})"),
    ]:
        for kernels in (c, jit):
            with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
                kernels.forward_all_primitives(*columns, graph.values.copy(), params)


def test_replay_kernels_benchmark_runs_on_tiny_graphs(jit, c, registry, capsys) -> None:  # type: ignore[no-untyped-def]
    """Its steps agree, C and numba, on every graph it times, and on one with pow (params); then
    its main() on tiny sizes prints a row for each step of each graph."""
    from benchmarks import bench_replay_kernels as bench

    for graph in (G.chain(40), G.dag(400), pow_graph()):
        for step, (ours, theirs) in bench.Steps(graph, registry, c, jit).steps.items():
            assert bench.same_bits(ours()(), theirs()()), step
    assert bench.main(["--repeat", "5", "--mlp-width", "2", "--size", "200", "--no-startup"]) == 0
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| mlp") or line.startswith("| chain") or line.startswith("| dag")
    ]
    assert len(rows) == 3 * len(bench.Steps(G.chain(3), registry, c, jit).steps)


def test_bench_capture_compares_a_step_with_and_without_capture() -> None:
    needs_torch()
    from benchmarks import bench_capture

    row = bench_capture.per_call(rounds=1, n=3)
    assert row["model"] == "chain of 3 tiny ops"
    from graphsvc.pluginhost import load_registry

    # t and addmm (or t, matmul and add: the linear layer), three muls and the sum
    assert row["nodes"] == (6 if "addmm" in load_registry()[0] else 7)
    assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]


def test_bench_capture_replay_times_a_captured_step_next_to_pytorchs(tmp_path: Path) -> None:
    """A tiny MLP's step captured, saved, loaded, checked against PyTorch's gradients and replayed,
    one round of one pass: every alternative timed, the products found, the report written."""
    import argparse

    torch = needs_torch()
    from benchmarks import bench_capture_replay as bench
    from graphsvc.pluginhost import load_registry

    def tiny() -> tuple[Any, Any, list[Any]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        return model, lambda: torch.nn.functional.cross_entropy(model(x), y), [x]

    args = argparse.Namespace(rounds=1, passes=1, clock="cpu", storage=False, processes=False)
    row = bench.bench_model("tiny", "tiny MLP", tiny, load_registry()[0], tmp_path, args)
    assert row["max_relative_gradient_error"] < 1e-5
    assert list(row["seconds"]) == list(bench.ALTERNATIVES)
    # the input and the labels are consts (they require no gradient)
    assert row["ops"] == {
        "leaf": 4, "const": 2, "transpose": 2, "addmm": 2, "relu": 1, "log_softmax": 1, "nll_loss": 1
    }  # fmt: skip
    # the forward products and the weights' gradients (no input gradient: the input is a const)
    assert (row["products"]["graphsvc's"]["count"], row["products"]["PyTorch's"]["count"]) == (5, 5)
    assert set(row["breakdown"]["nodes"]) >= {"forward addmm", "vjp addmm", "vjp nll_loss"}
    from benchmarks.run import machine as run_machine

    result = {
        "date": "d", "argv": [], "machine": run_machine(), "blas_threads": 1, "torch_threads": 1, "rounds": 1,
        "passes": 1, "clock": "cpu", "load_average": "0", "load_average_end": "0", "seconds": 1.0, "models": [row],
    }  # fmt: skip
    assert "| tiny MLP | 7 |" in bench.markdown(result)


def test_bench_json_runs_on_a_tiny_chain() -> None:
    """Every alternative of bench_json.py on a 300-node chain, one round: each process ran and
    reported its time and peak; graphsvc's rows are there (orjson's and msgspec's where installed)."""
    result = script(str(BENCHMARKS / "bench_json.py"), "--sizes", "300", "--rounds", "1", "--no-tensors", "--no-write")
    assert result.returncode == 0, result.stderr
    for row in ("| graphsvc.load |", "| graphsvc.load, the long way |", "| json.loads |", "| graphsvc convert |"):
        assert row in result.stdout
    assert "## chain, 303 nodes: " in result.stdout  # graphs.chain(300): 3 leaves and 100 steps of 3 ops
