"""The replay sweeps in C (``graphsvc.native.replay_kernels``) next to numba's twins
(``benchmarks/numba_kernels.py``), in one run.

    python benchmarks/bench_replay_kernels.py [--repeat K] [--mlp-width W] [--size N] [--no-startup]

Graphs (benchmarks/graphs.py): micrograd's MLP (``MLP(W, [W, W, 1])``, W = 256: 395,265 nodes),
the recurrent chain of N ops and the wide random DAG of N nodes (N = 1,000,000). Every op of the
three is a compiled primitive, so replay takes the whole-graph sweeps.

What is timed, per graph, C then numba within each round:

* ``replay.forward`` and ``replay.backward`` (from the last node), end to end: resolving the ops,
  the primitive table, allocating results and scratch, the sweep. Each is given its engine
  (:class:`graphsvc.native.Engine`): C's is graphsvc's compiled one; numba's is the same with the
  five replay sweeps swapped for ``benchmarks/numba_kernels.py``'s.
* The kernels alone, called directly from each module with the same arguments, prepared before
  the clock starts (results and scratch allocated and written once, so no first-touch page faults
  are timed): ``forward_all_primitives``, ``forward_primitives`` over every computed node,
  ``backward_primitives`` (the fused backward), ``primitive_derivatives`` over the output's
  ancestors, then ``backward_sweep`` (which allocates its result, in both).

* Start-up (not with ``--no-startup``), in a fresh process each round (``python -c``): importing
  the module and the first call of ``backward_primitives`` on a 4-node graph (numba: its import and
  loading the kernel from its cache, compiled by an earlier run; C: importing the extension). Wall
  time of the whole process, next to ``python -c "import numpy"`` in the same round.

Otherwise numba's kernels are compiled (or loaded from its cache) and run once before any timing, as are C's.
In the first round each result of C is checked equal, bit for bit, to numba's. A ratio is C time /
numba time within a round; min, median and max are over rounds (>= 5). The machine's other load
only ever adds time: the minimum is the most telling.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
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

import graphsvc.native as kernels  # noqa: E402
from benchmarks import graphs as G  # noqa: E402
from graphsvc.graph import Graph  # noqa: E402
from graphsvc.ops import OpRegistry  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import columns as replay  # noqa: E402
from graphsvc.topo import ancestors  # noqa: E402

SWEEPS = (
    "backward_sweep",
    "forward_all_primitives",
    "forward_primitives",
    "primitive_derivatives",
    "backward_primitives",
)


def numba_engine(c: Any, jit: Any) -> kernels.Engine:
    """The compiled engine with numba's five sweeps (the other kernels C's, as graphsvc runs them)."""
    return kernels.Engine(SimpleNamespace(**{**vars(c), **{name: getattr(jit, name) for name in SWEEPS}}))


def same_bits(a: Any, b: Any) -> bool:
    if a is None or b is None or np.isscalar(a):
        return bool(a == b)
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a.view(np.uint64) == b.view(np.uint64)) | (np.isnan(a) & np.isnan(b))))


class Steps:
    """The steps timed on one graph: name -> (C call, numba call), each returning what it computed."""

    def __init__(self, graph: Graph, registry: OpRegistry, c: Any, jit: Any) -> None:
        #: Each call prepares (untimed) and returns the call to time, which returns what it computed.
        self.steps: dict[str, tuple[Callable[[], Callable[[], Any]], Callable[[], Callable[[], Any]]]] = {}
        n, output = graph.num_nodes, graph.num_nodes - 1
        values = replay.forward(graph, registry)
        ops = replay.resolve_ops(graph, registry)
        table = replay._primitive_table(ops)
        plan = replay._primitive_params(graph, table)
        assert replay._all_primitives(graph, ops, table, plan), "every op must be a primitive"
        kinds = replay._primitive_kinds(graph, ops, plan)
        params = plan.params  # each node's parameter (pow's exponent), as replay passes them; None: no node has one
        codes, offsets, parents = graph.op_codes, graph.parent_offsets, graph.parent_indices
        computed = np.flatnonzero(graph.parent_counts() > 0)
        reach = np.flatnonzero(ancestors(graph, output))

        engines = {False: kernels.Engine(c), True: numba_engine(c, jit)}

        def forward_end_to_end(numba: bool) -> Callable[[], Callable[[], Any]]:
            engine = engines[numba]
            return lambda: lambda: replay.forward(graph, registry, engine=engine)

        def backward_end_to_end(numba: bool) -> Callable[[], Callable[[], Any]]:
            engine = engines[numba]
            return lambda: lambda: replay.backward(graph, registry, output, values, engine=engine)

        def forward_all(module: Any) -> Callable[[], Callable[[], Any]]:
            def prepare() -> Callable[[], Any]:
                out = graph.values.copy()
                return lambda: module.forward_all_primitives(codes, table, offsets, parents, out, params) or out

            return prepare

        def forward_nodes(module: Any) -> Callable[[], Callable[[], Any]]:
            def prepare() -> Callable[[], Any]:
                out = graph.values.copy()
                return lambda: (module.forward_primitives(computed, kinds, offsets, parents, out, 0, params), out)[1]

            return prepare

        def backward_fused(module: Any) -> Callable[[], Callable[[], Any]]:
            def prepare() -> Callable[[], Any]:
                grads = np.ones(n)
                both, reached = np.ones(2 * (output + 1)), np.ones(output + 1, dtype=np.bool_)
                return lambda: (
                    module.backward_primitives(
                        offsets, parents, codes, table, values, output, both, reached, grads, params
                    ),
                    grads,
                )[1]

            return prepare

        def derivatives(module: Any) -> Callable[[], Callable[[], Any]]:
            def prepare() -> Callable[[], Any]:
                local = np.ones(graph.num_edges)
                return lambda: (
                    module.primitive_derivatives(reach, kinds, offsets, parents, values, local, params) or local
                )

            return prepare

        local = np.zeros(graph.num_edges)
        c.primitive_derivatives(reach, kinds, offsets, parents, values, local, params)

        def sweep(module: Any) -> Callable[[], Callable[[], Any]]:
            return lambda: lambda: module.backward_sweep(offsets, parents, local, reach, output, n)

        self.steps = {
            "replay.forward": (forward_end_to_end(False), forward_end_to_end(True)),
            "replay.backward": (backward_end_to_end(False), backward_end_to_end(True)),
            "forward_all_primitives": (forward_all(c), forward_all(jit)),
            "forward_primitives": (forward_nodes(c), forward_nodes(jit)),
            "backward_primitives": (backward_fused(c), backward_fused(jit)),
            "primitive_derivatives": (derivatives(c), derivatives(jit)),
            "backward_sweep": (sweep(c), sweep(jit)),
        }


#: A fresh process's first fused backward, on x * y + x; {module} is the kernels' module.
STARTUP = """
import numpy as np
import {module} as k
grads = np.empty(4)
offsets, parents = np.array([0, 0, 0, 2, 4]), np.array([0, 1, 2, 0], dtype=np.int32)
codes, table = np.array([0, 0, 1, 2], dtype=np.uint16), np.array([0, 3, 1], dtype=np.int8)
values = np.array([2.0, 5.0, 10.0, 12.0])
k.backward_primitives(offsets, parents, codes, table, values, 3, np.empty(8), np.empty(4, dtype=bool), grads)
assert grads.tolist() == [6.0, 2.0, 1.0, 1.0], grads
"""


def startup(repeat: int) -> None:
    """Whole processes: numpy alone, then the C module's first call, then numba's, each round."""
    commands = {
        "numpy alone": "import numpy",
        "C": STARTUP.format(module="graphsvc.native.replay_kernels"),
        "numba": STARTUP.format(module="benchmarks.numba_kernels"),
    }
    subprocess.run([sys.executable, "-c", commands["numba"]], check=True)  # compiled and cached, if not yet
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, code in commands.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times[name].append(time.perf_counter() - start)
    ratios = [c / n for c, n in zip(times["C"], times["numba"], strict=True)]
    print("\n| fresh process: import + first call | seconds min / median / max |")
    print("|---|---|")
    for name, xs in times.items():
        print(f"| {name} | {summary(xs)} |")
    print(f"| C / numba | {min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f} |")


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def summary(xs: list[float]) -> str:
    return f"{min(xs):.4g} / {statistics.median(xs):.4g} / {max(xs):.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds per step (at least 5)")
    parser.add_argument("--mlp-width", type=int, default=256)
    parser.add_argument("--size", type=int, default=1_000_000, help="chain ops and DAG nodes")
    parser.add_argument("--no-startup", action="store_true", help="skip the fresh-process start-up rounds")
    args = parser.parse_args(argv)
    repeat = max(5, args.repeat)

    c = kernels._compiled()
    assert c is not None and c.backward_sweep.__module__ == "graphsvc.native.replay_kernels", (
        "the C sweeps are not built"
    )
    try:
        from benchmarks import numba_kernels as jit
    except ImportError as exc:
        raise SystemExit(f"this benchmark needs numba: pip install -e '.[bench]' ({exc})") from None

    registry, _ = load_registry(disable_third_party=True)
    _, root, _ = G.micrograd_mlp(args.mlp_width)
    mlp, _ = G.from_micrograd(root)
    del root
    graphs = {
        f"mlp ({mlp.num_nodes:,} nodes)": mlp,
        f"chain ({args.size:,} ops)": G.chain(args.size),
        f"dag ({args.size:,} nodes)": G.dag(args.size),
    }
    print(
        "C (graphsvc.native.replay_kernels) vs numba (benchmarks/numba_kernels.py), "
        f"seconds min / median / max over {repeat} rounds; "
        "ratio = C / numba within a round\n"
    )
    print("| graph | step | C (s) | numba (s) | C / numba |")
    print("|---|---|---|---|---|")
    for label, graph in graphs.items():
        steps = Steps(graph, registry, c, jit).steps
        for step, (ours, theirs) in steps.items():
            warm = time.perf_counter()
            ours()(), theirs()()  # the first calls: numba compiles or loads its cache
            if step == "replay.forward" and label.startswith("mlp"):
                first = time.perf_counter() - warm
                print(f"(numba's first calls on the first graph, compile or cache load: {first:.2f} s)")
            c_times, numba_times, ratios = [], [], []
            for round_ in range(repeat):
                tc, rc = timed(ours())
                tn, rn = timed(theirs())
                if round_ == 0:
                    assert same_bits(rc, rn), f"{label} {step}: C and numba differ"
                c_times.append(tc)
                numba_times.append(tn)
                ratios.append(tc / tn)
            print(
                f"| {label} | {step} | {summary(c_times)} | {summary(numba_times)} | "
                f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f} |",
                flush=True,
            )
    if not args.no_startup:
        startup(repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
