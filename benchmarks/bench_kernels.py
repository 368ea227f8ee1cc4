"""graphsvc's compiled kernels in C (``graphsvc.native.topo_kernels``, ...) next to their numba twins
(``benchmarks/numba_kernels.py``), in one process.

    python benchmarks/bench_kernels.py [--rounds K] [--mlp-width W] [--size N] [--big N] [--big-rounds K]
                                       [--no-big] [--clock cpu]

Each case is a name and a function ``(kernels, graph) -> result`` that calls one kernel as its
caller in graphsvc does (scratch arrays allocated the same way, inside the timing); ``kernels`` is
the C kernels (every module graphsvc.native merges over numba's) or ``benchmarks/numba_kernels.py``. For every
graph and case: one untimed call of each (numba loads or compiles then), the two results compared,
then K rounds, each timing C then numba with the garbage collector paused; ratio = numba / C
within a round; min, median and max over the rounds. The dfs and child-count orders run from the
graph's output (as ``graphsvc backward`` and run.py's order step do).

To add a group of kernels: write its cases below as functions and add a list of them to CASES.

Graphs (benchmarks/graphs.py): the 1,000,000-node random DAG and micrograd's MLP(W, [W, W, 1]);
then, on the 10,000,000-node DAG, the depth-first order alone, next to numpy's own gather
``values[parent_indices]`` in the same rounds (target: the order within 3x of that gather's time).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import graphs as G  # noqa: E402
from graphsvc.graph import LEAF_TAGS, Graph  # noqa: E402

Case = tuple[str, Callable[[Any, Graph], Any]]


# -- the orderings and the structure check (graphsvc/topo.py, graph.py, replay/columns.py) ---------
def dfs_postorder(k: Any, g: Graph) -> Any:
    n = g.num_nodes
    pairs, visited = np.empty(2 * n, dtype=np.int32), np.empty(n, dtype=np.bool_)
    return k.dfs_postorder(np.array(g.outputs[:1]), g.parent_offsets, g.parent_indices, pairs, visited)


def child_count_order(k: Any, g: Graph) -> Any:
    n = g.num_nodes
    pairs, counts, reached = np.empty(2 * n, np.int32), np.empty(n, np.int64), np.empty(n, np.bool_)
    return k.child_count_order(np.array(g.outputs[:1]), g.parent_offsets, g.parent_indices, pairs, counts, reached)


def levels(k: Any, g: Graph) -> Any:
    return k.levels(g.parent_offsets, g.parent_indices, g.num_nodes)


def ancestors(k: Any, g: Graph) -> Any:
    return k.ancestors(g.parent_offsets, g.parent_indices, g.outputs[0], g.num_nodes)


def structure_ok(k: Any, g: Graph) -> Any:
    leaf = np.array([tag in LEAF_TAGS for tag in g.op_table])
    return k.structure_ok(g.parent_offsets, g.parent_indices, g.op_codes, len(g.op_table), leaf)


def first_arity_mismatch(k: Any, g: Graph) -> Any:
    arity = np.array([-1 if tag in LEAF_TAGS else (1 if tag in ("relu", "pow") else 2) for tag in g.op_table])
    return k.first_arity_mismatch(g.op_codes, g.parent_offsets, arity)


ORDERINGS: list[Case] = [
    ("dfs_postorder", dfs_postorder),
    ("child_count_order", child_count_order),
    ("levels", levels),
    ("ancestors", ancestors),
    ("structure_ok", structure_ok),
    ("first_arity_mismatch", first_arity_mismatch),
]

#: Every case, in the order they run (a section per group of kernels).
CASES: list[Case] = ORDERINGS


# -- timing -----------------------------------------------------------------------------------------
#: What a round measures: wall time (perf_counter), or with ``--clock cpu`` this process's CPU time
#: (process_time), which leaves out the time other processes take the core away on a busy machine.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    gc.disable()
    try:
        start = clock()
        fn()
        return clock() - start
    finally:
        gc.enable()


def same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def summary(xs: list[float], scale: float = 1e3) -> str:
    """min, median and max (in milliseconds, or as they are with ``scale=1``)."""
    return " ".join(f"{x * scale:8.2f}" for x in (min(xs), statistics.median(xs), max(xs)))


def compare(label: str, graph: Graph, case: Case, ours: Any, theirs: Any, rounds: int) -> None:
    name, run = case
    assert same(run(ours, graph), run(theirs, graph)), f"{label} {name}: C and numba differ"
    c_times, numba_times = [], []
    for _ in range(rounds):
        c_times.append(timed(lambda: run(ours, graph)))
        numba_times.append(timed(lambda: run(theirs, graph)))
    ratios = [t / c for c, t in zip(c_times, numba_times, strict=True)]
    print(f"{label:5} {name:21} {summary(c_times)} | {summary(numba_times)} | {summary(ratios, 1)}")


def native() -> SimpleNamespace:
    """Every kernel written in C, by name (the modules graphsvc.native merges over numba's)."""
    found: dict[str, Any] = {}
    for name in ("graphsvc.native.topo_kernels", "graphsvc.native.replay_kernels"):
        module = importlib.import_module(name)
        found.update({key: getattr(module, key) for key in module.__all__})
    return SimpleNamespace(**found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mlp-width", type=int, default=256)
    parser.add_argument("--size", type=int, default=1_000_000, help="nodes of the random DAG")
    parser.add_argument("--big", type=int, default=10_000_000, help="nodes of the DAG for the order vs the gather")
    parser.add_argument("--big-rounds", type=int, default=5)
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    from benchmarks import numba_kernels as _jit

    ours = native()
    _, root, _ = G.micrograd_mlp(args.mlp_width)
    graphs = {"dag": G.dag(args.size), "mlp": G.from_micrograd(root)[0]}
    del root
    print(
        f"dag: {graphs['dag'].num_nodes:,} nodes; mlp: {graphs['mlp'].num_nodes:,} nodes; "
        f"{args.rounds} rounds; {args.clock} time"
    )
    print(f"{'graph':5} {'kernel':21} {'C, ms: min median max':>26} | {'numba, ms':>26} | {'numba / C':>26}")
    for label, graph in graphs.items():
        for case in CASES:
            compare(label, graph, case, ours, _jit, args.rounds)

    if args.no_big:
        return
    big = G.dag(args.big)
    values, parents = np.array(big.values), np.array(big.parent_indices)
    assert same(dfs_postorder(ours, big), dfs_postorder(_jit, big))
    c_times, numba_times, gather_times = [], [], []
    for _ in range(args.big_rounds):
        gather_times.append(timed(lambda: values[parents]))
        c_times.append(timed(lambda: dfs_postorder(ours, big)))
        numba_times.append(timed(lambda: dfs_postorder(_jit, big)))
    print(f"\ndag of {big.num_nodes:,} nodes, {args.big_rounds} rounds, ms: min median max")
    print(f"  numpy values[parent_indices] {summary(gather_times)}")
    print(f"  dfs_postorder C              {summary(c_times)}")
    print(f"  dfs_postorder numba          {summary(numba_times)}")
    over = [c / g for c, g in zip(c_times, gather_times, strict=True)]
    print(f"  C / gather                   {summary(over, 1)}   (issue 13: at most 3)")
    ratios = [t / c for c, t in zip(c_times, numba_times, strict=True)]
    print(f"  numba / C                    {summary(ratios, 1)}")


if __name__ == "__main__":
    main()
