"""The tensor engine's cost per node: graphs of many small ops, graphsvc next to PyTorch eager.

    python benchmarks/bench_per_node.py [--rounds K] [--passes P] [--dtypes float32 float64]
        [--models deep_mlp attention_stack] [--clock cpu|wall] [--no-write]

Needs torch (``pip install torch==2.13.0``). Prints a table and writes
benchmarks/results/bench_per_node.md and .json. The graphs (:data:`benchmarks.tensor_models.SMALL_OP_MODELS`)
have many nodes on small arrays, as a captured PyTorch step has (views, transposes, reshapes), so
the time is mostly what each node costs whoever runs it, not arithmetic:

- ``deep_mlp``: 64 linear layers of width 16 (``matmul``, ``add`` of a broadcast bias), relu and
  tanh alternating, batch 32, loss ``mean(sum(h, axis=1))``: 194 op nodes;
- ``attention_stack``: 8 transformer-like blocks (batch 2, sequence 8, d_model 16, 2 heads, MLP 32)
  of reshape, transpose, matmul, mul, softmax, add and relu: 185 op nodes.

Each in float32 and float64, one thread (``OPENBLAS_NUM_THREADS``, ``torch.set_num_threads``). What
is timed, one forward and backward pass each:

- **graphsvc replay**: ``graphsvc.replay.arrays.replay`` from the loss, the ops resolved before
  timing (as ``bench_tensors.py``);
- **graphsvc.backward**: the whole public call, including the new Graph that holds every value and
  gradient;
- **op calls alone**: the replay's op calls in a plain loop planned before timing
  (:func:`benchmarks.op_calls.op_calls_alone`): the ops' own time (their numpy math and their own
  Python), without the engine;
- **PyTorch**: the same computation in eager PyTorch, ``loss.backward()``, the leaves' ``.grad``
  cleared before each pass.

Figures per op node (the graph's nodes that are not ``leaf`` or ``const``): each alternative's time
divided by that count; **the engine's own cost** is ``graphsvc replay`` minus ``op calls alone``
(the dispatch loop, the checks of every result, read-only flags, gradient bookkeeping); **storing
the result** is ``graphsvc.backward`` minus ``graphsvc replay`` (resolving the ops and building the
new Graph), per node of the graph. PyTorch's cost per op node is its forward+backward time over the
same count. Rounds as in ``bench_tensors.py`` (interleaved passes, the fastest kept, the collector
paused; differences and ratios taken within a round; min, median and max over the rounds), timed
by the process's CPU time by default (``--clock cpu``; every alternative runs one thread): on the
shared machine the benchmarks run on, wall time mostly measures the other processes (``--clock
wall`` for it).
"""

from __future__ import annotations

import argparse
import os
import sys


def _threads_from_argv(argv: list[str]) -> int:
    """``--threads`` read before numpy is imported: OpenBLAS takes its thread count from the
    environment when it loads."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_known_args(argv)[0].threads


THREADS = _threads_from_argv(sys.argv[1:])
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = str(THREADS)

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks.bench_tensors import RESULTS, one_round, run_header  # noqa: E402
from benchmarks.numpy_models import torch_loss  # noqa: E402
from benchmarks.op_calls import op_calls_alone  # noqa: E402
from benchmarks.run import stats  # noqa: E402
from benchmarks.tensor_models import SMALL_OP_MODELS, TensorModel  # noqa: E402
from graphsvc.graph import CONST, LEAF  # noqa: E402
from graphsvc.ops import OpRegistry  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import arrays as tensors  # noqa: E402
from graphsvc.replay import columns as replay  # noqa: E402

#: How the report names each clock.
CLOCK_WORDS = {"cpu": "the process's CPU time (`--clock cpu`)", "wall": "wall time (`--clock wall`)"}
ALTERNATIVES = ("graphsvc replay", "graphsvc.backward", "op calls alone", "PyTorch")
#: The dtypes the graphs are built in, by the name ``--dtypes`` takes.
DTYPES = {"float32": np.float32, "float64": np.float64}


#: The clocks ``--clock`` chooses from: the process's CPU time (every thread of it), or wall time.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def timed(step: Callable[[], Any], clock: Callable[[], float]) -> Callable[[], float]:
    """``step`` as a pass that answers its own time on ``clock``."""

    def run() -> float:
        start = clock()
        step()
        return clock() - start

    return run


def op_nodes(graph: graphsvc.Graph) -> int:
    """The nodes an op computes (not ``leaf`` or ``const``)."""
    table = graph.op_table
    computed = [code for code, tag in enumerate(table) if tag not in (LEAF, CONST)]
    return int(np.isin(graph.op_codes, computed).sum())


def steps(model: TensorModel, registry: OpRegistry) -> dict[str, Callable[[], Any]]:
    """One forward and backward pass of ``model`` per alternative; each returns (loss, {name: grad})."""
    import torch

    graph, params = model.graph, list(model.params)
    ops = replay.resolve_ops(graph, registry)
    loss_id = graph.node_id("loss")
    param_ids = {name: graph.node_id(name) for name in params}

    def graphsvc_replay() -> tuple[Any, dict[str, Any]]:
        values, grads = tensors.replay(graph, ops, loss_id)
        assert grads is not None
        return values[loss_id], {name: grads[node] for name, node in param_ids.items()}

    def graphsvc_backward() -> tuple[Any, dict[str, Any]]:
        result = graphsvc.backward(graph, output="loss", registry=registry)
        return result.value("loss"), {name: result.grad(name) for name in params}

    leaves = {name: torch.tensor(array, requires_grad=True) for name, array in model.params.items()}
    data = {name: torch.tensor(array) for name, array in model.data.items()}

    def pytorch() -> tuple[Any, dict[str, Any]]:
        for leaf in leaves.values():
            leaf.grad = None
        loss = torch_loss(model.name, leaves, data, model.config)
        loss.backward()
        return loss.detach().numpy(), {name: leaf.grad.numpy() for name, leaf in leaves.items()}

    ops_alone = op_calls_alone(graph, ops, loss_id, params)
    return dict(zip(ALTERNATIVES, (graphsvc_replay, graphsvc_backward, ops_alone, pytorch), strict=True))


def check(model: TensorModel, results: dict[str, tuple[Any, dict[str, Any]]], rtol: float) -> float:
    """The largest gradient error of any alternative against PyTorch's, relative to that gradient's
    largest element; stops the run when one exceeds ``rtol``."""
    loss, expected = results["PyTorch"]
    worst = 0.0
    for name, (their_loss, grads) in results.items():
        if abs(float(their_loss) - float(loss)) > rtol * abs(float(loss)):
            raise SystemExit(f"{model.name}: {name}'s loss {float(their_loss)} is not PyTorch's {float(loss)}")
        for key, want in expected.items():
            got = np.asarray(grads[key])
            if got.dtype != want.dtype:
                raise SystemExit(f"{model.name}: {name}'s gradient of {key} is {got.dtype}, PyTorch's {want.dtype}")
            error = float(np.abs(got - want).max() / max(np.abs(want).max(), np.finfo(want.dtype).tiny))
            if error > rtol:
                raise SystemExit(f"{model.name}: {name}'s gradient of {key} is off by {error:.3g} (relative)")
            worst = max(worst, error)
    return worst


def figures(times: dict[str, list[float]], ops: int, nodes: int) -> dict[str, dict[str, float]]:
    """Microseconds per op node (per node for storing the result), min/median/max over rounds, and
    the ratios to PyTorch's cost per op node, each taken within a round."""
    rounds = range(len(times["PyTorch"]))

    def per(values: list[float], count: int) -> dict[str, float]:
        return stats([v * 1e6 / count for v in values])

    engine = [times["graphsvc replay"][r] - times["op calls alone"][r] for r in rounds]
    store = [times["graphsvc.backward"][r] - times["graphsvc replay"][r] for r in rounds]
    torch_times = times["PyTorch"]
    return {
        "graphsvc replay, µs per op node": per(times["graphsvc replay"], ops),
        "graphsvc.backward, µs per op node": per(times["graphsvc.backward"], ops),
        "op calls alone, µs per op node": per(times["op calls alone"], ops),
        "PyTorch, µs per op node": per(torch_times, ops),
        "engine's own cost, µs per op node": per(engine, ops),
        "storing the result, µs per node": per(store, nodes),
        "engine's own cost / PyTorch's": stats([engine[r] / torch_times[r] for r in rounds]),
        "graphsvc replay / PyTorch": stats([times["graphsvc replay"][r] / torch_times[r] for r in rounds]),
        "graphsvc.backward / PyTorch": stats([times["graphsvc.backward"][r] / torch_times[r] for r in rounds]),
    }


def bench_model(
    name: str, dtype: str, registry: OpRegistry, rounds: int, passes: int, clock: str = "cpu"
) -> dict[str, Any]:
    model = SMALL_OP_MODELS[name](DTYPES[dtype], 0)
    alternatives = steps(model, registry)
    error = check(model, {alt: step() for alt, step in alternatives.items()}, 1e-4 if dtype == "float32" else 1e-10)
    passes_of = {alt: timed(step, CLOCKS[clock]) for alt, step in alternatives.items()}
    for run in passes_of.values():
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {alt: [] for alt in alternatives}
    for _ in range(rounds):
        for alt, seconds in one_round(passes_of, passes).items():
            times[alt].append(seconds)
    ops, nodes = op_nodes(model.graph), model.graph.num_nodes
    row = {
        "model": name,
        "dtype": dtype,
        "config": model.config,
        "nodes": nodes,
        "op_nodes": ops,
        "max_relative_gradient_error": error,
        "seconds": {alt: stats(ts) for alt, ts in times.items()},
        "figures": figures(times, ops, nodes),
    }
    line = ", ".join(f"{alt} {statistics.median(ts) * 1e3:.2f} ms" for alt, ts in times.items())
    print(f"{name} {dtype} ({ops} op nodes of {nodes}): {line}", flush=True)
    for key, s in row["figures"].items():
        unit = "" if "µs" in key else "x"
        print(f"  {key:36} {s['median']:7.2f}{unit} (min {s['min']:.2f}, max {s['max']:.2f})", flush=True)
    return row


def header_lines(result: dict[str, Any], script: str) -> list[str]:
    """A result's first lines, for the benchmarks timed in interleaved rounds of passes by
    :data:`CLOCK_WORDS`: the command and its duration, the machine, threads, commit, rounds, clock and
    load (at the end too, where the result has it)."""
    m = result["machine"]
    end = f"; at the end: {result['load_average_end']}" if "load_average_end" in result else ""
    return [
        f"Run {result['date']} with `python benchmarks/{script} {' '.join(result['argv'])}` "
        f"({result['seconds']:.0f} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, numpy {m['numpy']} "
        f"(OpenBLAS threads: {result['blas_threads']}), torch {m['torch']} (threads: {result['torch_threads']}); "
        f"graphsvc {m['graphsvc']} at {m['commit']}. {result['rounds']} rounds of {result['passes']} interleaved "
        f"passes (a round's time: an alternative's fastest pass), timed by {CLOCK_WORDS[result['clock']]}. "
        f"Load average at the start: {result['load_average']}{end}.",
    ]


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The tensor engine's cost per node: graphs of many small ops, graphsvc and PyTorch",
        "",
        *header_lines(result, "bench_per_node.py"),
        "",
        "## Microseconds per op node, one forward + backward pass (median; min-max over rounds)",
        "",
        "| model | dtype | op nodes | graphsvc replay | graphsvc.backward | op calls alone | PyTorch "
        "| engine's own cost | storing the result (per node) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = (
        "graphsvc replay, µs per op node",
        "graphsvc.backward, µs per op node",
        "op calls alone, µs per op node",
        "PyTorch, µs per op node",
        "engine's own cost, µs per op node",
        "storing the result, µs per node",
    )
    for row in result["models"]:
        cells = [
            f"{row['figures'][k]['median']:.1f} ({row['figures'][k]['min']:.1f}-{row['figures'][k]['max']:.1f})"
            for k in keys
        ]
        lines.append(f"| {row['model']} | {row['dtype']} | {row['op_nodes']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Ratios to PyTorch (within a round; below 1: graphsvc's is smaller)",
        "",
        "| model | dtype | engine's own cost / PyTorch's | graphsvc replay / PyTorch | graphsvc.backward / PyTorch |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["models"]:
        cells = []
        for k in ("engine's own cost / PyTorch's", "graphsvc replay / PyTorch", "graphsvc.backward / PyTorch"):
            s = row["figures"][k]
            cells.append(f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})")
        lines.append(f"| {row['model']} | {row['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per model and dtype (default 7)")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per alternative and round (default 5)")
    parser.add_argument("--models", nargs="+", choices=list(SMALL_OP_MODELS), default=list(SMALL_OP_MODELS))
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="cpu",
        help="cpu: the process's CPU time (default; on a busy machine, wall time measures the other processes "
        "too); wall: elapsed time",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    args = parser.parse_args(argv)
    import torch  # after the options: --help works without it

    torch.set_num_threads(args.threads)
    registry, problems = load_registry(disable_third_party=True)
    if problems:
        raise SystemExit(f"graphsvc's builtin ops failed to load: {problems}")
    start = time.perf_counter()
    result: dict[str, Any] = run_header(
        argv, torch.get_num_threads(), rounds=args.rounds, passes=args.passes, clock=args.clock
    )
    print(f"threads: OpenBLAS {result['blas_threads']}, torch {result['torch_threads']}", flush=True)
    result["models"] = [
        bench_model(name, dtype, registry, args.rounds, args.passes, args.clock)
        for name in args.models
        for dtype in args.dtypes
    ]
    result["seconds"] = time.perf_counter() - start
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_per_node.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "bench_per_node.md").write_text(markdown(result))
        print(f"wrote {RESULTS / 'bench_per_node.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
