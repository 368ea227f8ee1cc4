"""Replaying a captured PyTorch step, next to PyTorch's own step, in one run.

    python benchmarks/bench_capture_replay.py [--rounds K] [--passes P] [--models mlp transformer]
        [--clock cpu|wall] [--storage-rounds K] [--process-rounds K] [--no-storage] [--no-processes]
        [--no-write]

Needs torch (``pip install torch==2.13.0``) and safetensors (for the storage comparison). Prints the
tables and writes benchmarks/results/bench_capture_replay.md and .json. The models are
``bench_capture.py``'s: the MLP 784-512-512-10 at batch 128 with a cross-entropy, and
``nn.TransformerEncoderLayer`` (d_model 128, 4 heads, feed-forward 512, dropout 0, batch_first) on 8
sequences of 64, loss the mean square of its output; float32, one thread (``OPENBLAS_NUM_THREADS``
and ``OMP_NUM_THREADS`` set before numpy and torch load, ``torch.set_num_threads(1)``).

Each model's step (``zero_grad``, forward, loss, backward) is captured once
(``graphsvc.torch.capture``), saved with ``graphsvc.save`` and loaded with ``graphsvc.load``; the
loaded graph is what is replayed. Before timing, the replay's loss and parameter gradients are
checked against the gradients PyTorch gave in the captured step (stored in the graph). Then, in
rounds, one pass each in turn, ``--passes`` times (a round keeps each alternative's fastest pass;
the garbage collector paused), timed by the process's CPU time (``--clock cpu``, the default: on a
shared machine wall time measures the other processes too):

- **PyTorch**: PyTorch's own step on the same model and input (``zero_grad(set_to_none=True)``,
  forward, loss, ``backward()``): the parameters' gradients;
- **graphsvc replay**: ``graphsvc.replay.arrays.replay`` of the loaded graph from its output, the
  ops resolved before timing (``bench_per_node.py``'s "graphsvc replay"): the engine alone;
- **graphsvc.backward**: the whole public call on the loaded graph (resolving the ops, the forward
  and backward replay, the new Graph holding every value and gradient).

Ratios are an alternative's time over PyTorch's within a round; min, median and max over the rounds.

**Where graphsvc's time goes**: the replay's op calls in a plain loop (forward, then the VJPs from
the output, as the replay makes them, with its memory reuse), each call timed, median over
``--passes * 3`` passes, summed by op and pass (forward or VJP); the rest of the replay's time is the
engine's own (its checks, read-only flags, the gradients summed).

**Where PyTorch's time goes**: the same step under ``torch.profiler`` (CPU), ``--passes * 3`` steps
after ten: each ATen op's self time (its own, without the ops it calls) per step, summed over
its calls, with the autograd engine's own nodes (``autograd::engine::...``, ``...Backward0``) and
every row under 1% of the step left out of the table; the profiler's own cost per call inflates
the small ops. Next to graphsvc's table, op by op, it says what is left against PyTorch.

**The floor of the matrix products**: every matrix product the step makes (the forward and the
VJPs' products of ``addmm`` and 2-d ``matmul`` nodes, of the shapes and layouts the replay gives
them), once with ``np.matmul`` (numpy's BLAS) and once with ``torch.mm`` on the same arrays, each
alternative the sum of its products' times, interleaved in rounds like the steps. The replay makes
the products PyTorch's step makes: the capture records the batch as a ``const``, so neither computes
the input's gradient.

**Storage of the captured step** (unless ``--no-storage``): ``bench_storage.py``'s save and load
comparisons on the loaded graph's arrays (every value and gradient), the file in the page cache,
against the goals that ``bench_storage.py`` meets for the tensor benchmark graphs:
``graphsvc.save`` without its fsyncs at most ``safetensors.numpy.save_file``'s time,
``graphsvc.load(mmap=True)`` at most ``safetensors.torch.load_file``'s; the file's size next to
safetensors'.

**Whole processes** (unless ``--no-processes``), wall time of each from start to exit, once per
round each, alternating: ``python -m graphsvc backward FILE`` (start-up, loading the plugins, the
load, the forward and backward replay, every node printed to ``/dev/null``), next to a Python
process that imports torch, builds the model and its input and runs one step (start-up, ``import
torch``, building, one step; nothing printed), byte-compiled as an installed wheel is.
"""

from __future__ import annotations

import argparse
import os
import sys

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # before numpy and torch load: they read it once

import collections  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks import bench_storage  # noqa: E402
from benchmarks.bench_per_node import CLOCKS, header_lines, op_nodes, timed  # noqa: E402
from benchmarks.bench_tensors import one_round, run_header  # noqa: E402
from benchmarks.run import startup_env, stats  # noqa: E402
from graphsvc import topo  # noqa: E402
from graphsvc.graph import Graph  # noqa: E402
from graphsvc.ops import NEEDS_INPUT_GRAD, RESIDUALS, Op, OpRegistry  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import arrays as tensors  # noqa: E402
from graphsvc.replay import columns, memory  # noqa: E402
from graphsvc.replay.run import output_node  # noqa: E402

RESULTS = HERE / "results"
ALTERNATIVES = ("PyTorch", "graphsvc replay", "graphsvc.backward")
#: The models, by the name ``--models`` takes (``bench_capture.py``'s builders of the same names).
MODEL_NAMES = {
    "mlp": "MLP 784-512-512-10, batch 128",
    "transformer": "TransformerEncoderLayer d128 h4, seq 64, batch 8",
}
#: Builds a model: (module, loss closure, inputs).
Build = Callable[[], tuple[Any, Callable[[], Any], list[Any]]]
#: A whole process that builds a model and runs one PyTorch step, by model.
TORCH_PROCESS = (
    "import torch; torch.set_num_threads(1); from benchmarks.bench_capture import {name}; "
    "model, loss, inputs = {name}(); model.zero_grad(set_to_none=True); loss().backward()"
)
#: The storage ratios whose goals bench_storage.py meets for the tensor benchmark graphs.
STORAGE_GOALS = (
    ("graphsvc.save without fsync", "safetensors.numpy.save_file", 1.0),
    ("graphsvc.load(mmap=True)", "safetensors.torch.load_file", 1.0),
    ("graphsvc.save", "safetensors.numpy.save_file", None),
    ("graphsvc.load", "safetensors.numpy.load_file", None),
)


def builders() -> dict[str, Build]:
    from benchmarks import bench_capture

    return {"mlp": bench_capture.mlp, "transformer": bench_capture.transformer}


# -- the captured step ------------------------------------------------------------------------------
def capture_step(build: Build, path: Path) -> tuple[Graph, float, float]:
    """One step of the model ``build`` makes, captured, saved to ``path`` and loaded back: the loaded
    graph, and how long the save and the load took (once each, wall time)."""
    from graphsvc.torch import capture

    model, loss, _ = build()
    model.zero_grad(set_to_none=True)
    with capture(model) as run:
        loss().backward()
    graph = run.graph()
    start = time.perf_counter()
    graphsvc.save(graph, path)
    saved = time.perf_counter()
    loaded = graphsvc.load(path)
    return loaded, saved - start, time.perf_counter() - saved


#: How far a parameter's gradient may be from PyTorch's, relative to its largest element. Not
#: float32's 1e-6: the transformer's loss, the mean square of a layer norm's output whose weight is
#: 1 and bias 0, sends the layer norm's input a gradient that is nearly all cancellation (out is
#: proportional to x normalized), about 1e-3 of the gradient it receives, so both float32 results
#: are mostly rounding there; the parameters before it get that rounding (up to 1% here).
GRADIENT_RTOL = 0.05


def check(graph: Graph, registry: OpRegistry) -> float:
    """The replay's largest error on a parameter's gradient against PyTorch's (the leaves whose
    gradient the capture stored), relative to that gradient's largest element; stops the run past
    :data:`GRADIENT_RTOL`."""
    result = graphsvc.backward(graph, registry=registry)
    worst = 0.0
    for node, want in graph.grad_arrays.items():
        if graph.op(node) != "leaf":
            continue
        got = result.grad_arrays.get(node)
        if got is None or got.shape != want.shape:
            raise SystemExit(f"node {graph.label(node)}: the replay gives no gradient of PyTorch's shape")
        error = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
        if error > GRADIENT_RTOL:
            raise SystemExit(f"node {graph.label(node)}: the replay's gradient is off by {error:.3g} (relative)")
        worst = max(worst, error)
    return worst


def steps(build: Build, graph: Graph, registry: OpRegistry) -> dict[str, Callable[[], Any]]:
    """One pass of each alternative."""
    model, loss, _ = build()
    ops = columns.resolve_ops(graph, registry)
    output = output_node(graph, None)

    def pytorch() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    def graphsvc_replay() -> Any:
        return tensors.replay(graph, ops, output)

    def graphsvc_backward() -> Graph:
        return graphsvc.backward(graph, registry=registry)

    return dict(zip(ALTERNATIVES, (pytorch, graphsvc_replay, graphsvc_backward), strict=True))


# -- where graphsvc's time goes ---------------------------------------------------------------------
def breakdown(graph: Graph, ops: list[Op | None], passes: int, clock: Callable[[], float]) -> dict[str, Any]:
    """Each op call of the replay timed: ``{"forward NAME" | "vjp NAME": seconds}`` summed over the
    op's nodes (each node's median over ``passes``), the nodes of each op; and, each pass followed
    by one pass of the replay itself (the same moment of a shared machine), the medians of a pass's
    op calls (``total``) and of the replay (``replay``)."""
    output = output_node(graph, None)
    calls = tensors._calls(graph, ops)
    values0 = tensors.forward(graph, ops)
    requires = tensors.requires_grad(graph, calls, values0)
    reached = topo.ancestors(graph, output)
    order = np.flatnonzero(reached)[::-1].tolist()
    per_node: dict[tuple[str, int], list[float]] = collections.defaultdict(list)

    def one_pass() -> None:
        values = [v if c is None else None for v, c in zip(values0, calls, strict=True)]
        residuals: dict[int, Any] = {}
        with np.errstate(all="ignore"), memory.reuse():
            for node, call in enumerate(calls):
                if call is None:
                    continue
                op, parents, attrs = call
                inputs = [values[p] for p in parents]
                start = clock()
                if op.forward_with_residuals is not None and reached[node]:
                    values[node], residuals[node] = op.forward_with_residuals(*inputs, **attrs)
                else:
                    assert op.forward is not None
                    values[node] = op.forward(*inputs, **attrs)
                per_node[("forward", node)].append(clock() - start)
            grads: list[Any] = [None] * len(values)
            grads[output] = np.ones_like(values[output])
            for node in order:
                call = calls[node]
                if call is None or grads[node] is None:
                    continue
                op, parents, attrs = call
                vjp = op.tensor_vjp
                needs = tuple(requires[p] for p in parents)
                keywords = dict(attrs)
                if vjp.takes_needs:
                    keywords[NEEDS_INPUT_GRAD] = needs
                if vjp.takes_residuals:
                    keywords[RESIDUALS] = residuals.pop(node, None)
                start = clock()
                cotangents = vjp.function(grads[node], values[node], *[values[p] for p in parents], **keywords)
                per_node[("vjp", node)].append(clock() - start)
                for parent, ct, need in zip(parents, cotangents, needs, strict=True):
                    if ct is not None and need:
                        grads[parent] = ct if grads[parent] is None else grads[parent] + ct

    def replay_pass() -> float:
        start = clock()
        tensors.replay(graph, ops, output)
        return clock() - start

    for _ in range(2):
        one_pass()
        replay_pass()
    per_node.clear()
    replays, totals = [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(passes):
            one_pass()
            totals.append(sum(times[-1] for times in per_node.values()))
            replays.append(replay_pass())
    finally:
        gc.enable()
    by_op: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, int] = collections.Counter()
    for (phase, node), times in per_node.items():
        name = graph.op(node)
        by_op[f"{phase} {name}"] += statistics.median(times)
        nodes[f"{phase} {name}"] += 1
    ranked = sorted(by_op.items(), key=lambda item: -item[1])
    return {
        "seconds": dict(ranked),
        "nodes": dict(nodes),
        "total": statistics.median(totals),
        "replay": statistics.median(replays),
    }


def pytorch_breakdown(build: Build, passes: int) -> dict[str, Any]:
    """PyTorch's step under ``torch.profiler``: ``{"seconds": {ATen op: self seconds per step},
    "calls": {ATen op: calls per step}, "total": the step's profiled seconds}``, ``passes`` steps
    after ten; the autograd engine's own nodes left out (their time is the ATen ops' they call)."""
    from torch.profiler import ProfilerActivity, profile

    model, loss, _ = build()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    for _ in range(10):  # the allocator's memory touched, as in the timed steps
        step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            step()
    total = (time.perf_counter() - start) / passes
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        seconds[event.key] = event.self_cpu_time_total / 1e6 / passes
        calls[event.key] = round(event.count / passes)
    ranked = dict(sorted(seconds.items(), key=lambda item: -item[1]))
    return {"seconds": ranked, "calls": calls, "total": total}


# -- the matrix products alone: numpy's BLAS next to PyTorch's ----------------------------------------
def products(graph: Graph, ops: list[Op | None]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 2-d matrix products of the step (forward, then each VJP's), as the replay's operands: a
    VJP's product for each operand that gets a gradient (:func:`graphsvc.replay.arrays.requires_grad`:
    the parameters and what is computed from them, not the batch, a ``const``), those PyTorch's step
    makes."""
    output = output_node(graph, None)
    calls = tensors._calls(graph, ops)
    values = tensors.forward(graph, ops)
    requires = tensors.requires_grad(graph, calls, values)
    _, grads = tensors.replay(graph, ops, output)
    assert grads is not None
    found: list[tuple[np.ndarray, np.ndarray]] = []
    for node, call in enumerate(calls):
        if call is None or graph.op(node) not in ("addmm", "matmul"):
            continue
        operands = [values[p] for p in call[1]][-2:]
        a, b = operands
        g = grads[node]
        if a is None or b is None or a.ndim != 2 or b.ndim != 2 or g is None:
            continue
        found.append((a, b))
        first, second = call[1][-2:]
        if requires[first]:
            found.append((g, b.T))
        if requires[second]:
            found.append((a.T, g))
    return found


def product_steps(pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Callable[[], Any]]:
    import torch

    # writable copies in the same layouts (a transpose stays one): torch shares their memory
    pairs = [(np.array(a, order="K"), np.array(b, order="K")) for a, b in pairs]
    as_tensors = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in pairs]

    def numpy_products() -> None:
        for a, b in pairs:
            np.matmul(a, b)

    def torch_products() -> None:
        for a, b in as_tensors:
            torch.mm(a, b)

    return {"np.matmul (OpenBLAS)": numpy_products, "torch.mm": torch_products}


# -- whole processes --------------------------------------------------------------------------------
def processes(name: str, path: Path, rounds: int) -> dict[str, list[float]]:
    """Wall time of ``python -m graphsvc backward FILE`` and of a process that imports torch, builds
    the model and runs one step, once per round each, alternating."""
    with tempfile.TemporaryDirectory(prefix="bench_capture_replay-pycache-") as pycache:
        env = startup_env(Path(pycache))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH", "")) if p)
        commands = {
            "graphsvc backward FILE": [sys.executable, "-m", "graphsvc", "backward", str(path)],
            "python: import torch, build, one step": [sys.executable, "-c", TORCH_PROCESS.format(name=name)],
        }
        times: dict[str, list[float]] = {alt: [] for alt in commands}
        for argv in commands.values():  # warm: byte-compiled modules, the file in the page cache
            subprocess.run(argv, env=env, cwd=HERE.parent, stdout=subprocess.DEVNULL, check=True)
        for round_ in range(rounds):
            order = list(commands)[round_ % 2 :] + list(commands)[: round_ % 2]
            for alt in order:
                start = time.perf_counter()
                subprocess.run(commands[alt], env=env, cwd=HERE.parent, stdout=subprocess.DEVNULL, check=True)
                times[alt].append(time.perf_counter() - start)
    return times


# -- one model --------------------------------------------------------------------------------------
def ratios(times: dict[str, list[float]], over: str) -> dict[str, dict[str, float]]:
    rounds = range(len(times[over]))
    return {alt: stats([ts[r] / times[over][r] for r in rounds]) for alt, ts in times.items() if alt != over}


def timed_rounds(
    alternatives: dict[str, Callable[[], Any]], rounds: int, passes: int, clock: str
) -> dict[str, list[float]]:
    passes_of = {alt: timed(step, CLOCKS[clock]) for alt, step in alternatives.items()}
    for run in passes_of.values():
        for _ in range(2):
            run()
    times: dict[str, list[float]] = {alt: [] for alt in alternatives}
    for _ in range(rounds):
        for alt, seconds in one_round(passes_of, passes).items():
            times[alt].append(seconds)
    return times


def bench_model(
    name: str, title: str, build: Build, registry: OpRegistry, folder: Path, args: argparse.Namespace
) -> dict[str, Any]:
    path = folder / f"{name}.msgpack"
    graph, save_once, load_once = capture_step(build, path)
    error = check(graph, registry)
    ops = columns.resolve_ops(graph, registry)
    row: dict[str, Any] = {
        "model": name,
        "title": title,
        "nodes": graph.num_nodes,
        "op_nodes": op_nodes(graph),
        "ops": dict(collections.Counter(graph.op(n) for n in range(graph.num_nodes))),
        "file_bytes": path.stat().st_size,
        "first_save_seconds": save_once,
        "first_load_seconds": load_once,
        "max_relative_gradient_error": error,
    }
    times = timed_rounds(steps(build, graph, registry), args.rounds, args.passes, args.clock)
    row["seconds"] = {alt: stats(ts) for alt, ts in times.items()}
    row["ratios"] = ratios(times, "PyTorch")
    row["breakdown"] = breakdown(graph, ops, args.passes * 3, CLOCKS[args.clock])
    row["pytorch_breakdown"] = pytorch_breakdown(build, args.passes * 3)
    pairs = products(graph, ops)
    product_times = timed_rounds(product_steps(pairs), args.rounds, args.passes, args.clock)
    row["products"] = {
        "count": len(pairs),
        "seconds": {alt: stats(ts) for alt, ts in product_times.items()},
        "ratio": ratios(product_times, "torch.mm")["np.matmul (OpenBLAS)"],
    }
    print(f"{name} ({row['op_nodes']} op nodes, file {row['file_bytes'] / 1e6:.1f} MB, gradient error {error:.1e}):")
    for alt, s in row["seconds"].items():
        line = f"  {alt:32} {s['median'] * 1e3:8.2f} ms"
        if alt in row["ratios"]:
            r = row["ratios"][alt]
            line += f"   {r['median']:.2f}x PyTorch ({r['min']:.2f}-{r['max']:.2f})"
        print(line, flush=True)
    p = row["products"]
    print(f"  {p['count']} matrix products: np.matmul / torch.mm {_r(p['ratio'])}")
    if args.storage:
        row["storage"] = storage(name, graph, folder, args)
    if args.processes:
        process_times = processes(name, path, args.process_rounds)
        row["process_seconds"] = {alt: stats(ts) for alt, ts in process_times.items()}
        row["process_ratio"] = ratios(process_times, "python: import torch, build, one step")
    return row


def storage(name: str, graph: Graph, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """bench_storage.py's saves and loads (page cache warm) on the captured step's arrays."""
    arrays = bench_storage.arrays_of(graph)
    files = bench_storage.files_for(folder, f"{name}-storage")
    fsyncs = bench_storage.FsyncTimer()
    saves = bench_storage.save_steps(graph, arrays, files, fsyncs)
    for step in saves.values():
        step()
    loads = bench_storage.load_steps(files)
    for alt, step in loads.items():
        bench_storage.same_arrays(arrays, bench_storage.as_arrays(step()), alt)
    times: dict[str, list[float]] = {alt: [] for alt in (*saves, *loads)}
    for _ in range(args.storage_rounds):
        for alt, seconds in bench_storage.one_round(saves, args.passes, lambda alt: os.sync()).items():
            times[alt].append(seconds)
        for alt, seconds in bench_storage.one_round(loads, args.passes).items():
            times[alt].append(seconds)
    found = bench_storage.ratios_of(times, STORAGE_GOALS)
    for r in found:
        print(f"  {r['ratio']:62} {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})", flush=True)
    return {
        "array_bytes": sum(a.nbytes for a in arrays.values()),
        "file_bytes": {tool: files.of(tool).stat().st_size for tool in ("graphsvc", "safetensors", "torch")},
        "seconds": {alt: stats(ts) for alt, ts in times.items()},
        "ratios": found,
    }


# -- the report -------------------------------------------------------------------------------------
def _r(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def _ms(s: dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.2f}"


def floor(row: dict[str, Any]) -> float:
    """PyTorch's step with its matrix products at numpy's speed, over PyTorch's step (medians):
    what an engine that calls numpy's BLAS could reach at best."""
    pytorch = row["seconds"]["PyTorch"]["median"]
    products = row["products"]["seconds"]
    extra = products["np.matmul (OpenBLAS)"]["median"] - products["torch.mm"]["median"]
    return float((pytorch + extra) / pytorch)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Replaying a captured PyTorch step, next to PyTorch's own step",
        "",
        *header_lines(result, "bench_capture_replay.py"),
        "",
        "## One step: forward and backward (ms, median; ratios to PyTorch within a round, min-max)",
        "",
        "| model | op nodes | PyTorch | graphsvc replay | graphsvc.backward | replay / PyTorch | backward / PyTorch |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["models"]:
        s, r = row["seconds"], row["ratios"]
        lines.append(
            f"| {row['title']} | {row['op_nodes']} | {_ms(s['PyTorch'])} | {_ms(s['graphsvc replay'])} | "
            f"{_ms(s['graphsvc.backward'])} | {_r(r['graphsvc replay'])} | {_r(r['graphsvc.backward'])} |"
        )
    lines += [
        "",
        "## The matrix products alone: numpy's BLAS next to PyTorch's on the same operands",
        "",
        "| model | products | np.matmul ms | torch.mm ms | np.matmul / torch.mm |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["models"]:
        p = row["products"]
        lines.append(
            f"| {row['model']} | {p['count']} | {_ms(p['seconds']['np.matmul (OpenBLAS)'])} | "
            f"{_ms(p['seconds']['torch.mm'])} | {_r(p['ratio'])} |"
        )
    lines += [
        "",
        "The floor of a numpy engine: PyTorch's step with its matrix products at numpy's speed (PyTorch's "
        "time + the products' time with np.matmul - with torch.mm, medians), over PyTorch's step:",
        "",
        "| model | floor / PyTorch | graphsvc replay / floor | graphsvc.backward / floor |",
        "|---|---:|---:|---:|",
    ]
    for row in result["models"]:
        f = floor(row)
        lines.append(
            f"| {row['model']} | {f:.2f}x | {row['ratios']['graphsvc replay']['median'] / f:.2f}x | "
            f"{row['ratios']['graphsvc.backward']['median'] / f:.2f}x |"
        )
    for row in result["models"]:
        b = row["breakdown"]
        replay = b.get("replay", row["seconds"]["graphsvc replay"]["median"])
        lines += _time_table(
            f"Where graphsvc's time goes: {row['model']} (each op's calls, median of each node's; ms)",
            f"A pass's op calls take {b['total'] * 1e3:.2f} ms (median), the replay's own passes, each right "
            f"after one of those, {replay * 1e3:.2f} ms: the rest, {(replay - b['total']) * 1e3:.2f} ms, is the "
            "engine's own (checks, read-only flags, the gradients summed).",
            ("op, pass", "nodes", "share of the op calls"),
            b["seconds"],
            b["nodes"],
            b["total"],
        )
        t = row.get("pytorch_breakdown")
        if t is None:
            continue
        shown = {op: sec for op, sec in t["seconds"].items() if sec >= 0.01 * t["total"]}
        lines += _time_table(
            f"Where PyTorch's time goes: {row['model']} (ATen ops' self time per step under torch.profiler; ms)",
            f"A profiled step takes {t['total'] * 1e3:.2f} ms; its ATen ops' self times sum to "
            f"{sum(t['seconds'].values()) * 1e3:.2f} ms (the rest: the autograd engine, Python, the profiler). "
            f"Ops under 1% of the step: {sum(t['seconds'].values()) * 1e3 - sum(shown.values()) * 1e3:.2f} ms.",
            ("ATen op", "calls", "share of the step"),
            shown,
            t["calls"],
            t["total"],
        )
    if all("storage" in row for row in result["models"]):
        lines += [
            "",
            "## Save and load of the captured step (page cache warm; ratios within a round, min-max)",
            "",
            "| model | arrays | graphsvc file | safetensors file | graphsvc.save | without fsync | "
            "graphsvc.load | load(mmap=True) | ratio | goal | median | min-max | met |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|",
        ]
        for row in result["models"]:
            st = row["storage"]
            sec = st["seconds"]
            head = (
                f"| {row['model']} | {st['array_bytes'] / 1e6:.1f} MB | {st['file_bytes']['graphsvc'] / 1e6:.1f} MB | "
                f"{st['file_bytes']['safetensors'] / 1e6:.1f} MB | {_ms(sec['graphsvc.save'])} ms | "
                f"{_ms(sec['graphsvc.save without fsync'])} ms | {_ms(sec['graphsvc.load'])} ms | "
                f"{_ms(sec['graphsvc.load(mmap=True)'])} ms"
            )
            for i, r in enumerate(st["ratios"]):
                goal = "" if r["goal"] is None else f"<= {r['goal']:.2f}"
                met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
                prefix = head if i == 0 else "| | | | | | | |"
                lines.append(
                    f"{prefix} | {r['ratio']} | {goal} | {r['median']:.2f}x | {r['min']:.2f}-{r['max']:.2f} | {met} |"
                )
    if all("process_seconds" in row for row in result["models"]):
        lines += [
            "",
            "## Whole processes (wall time, median over rounds; ratio within a round)",
            "",
            "| model | `graphsvc backward FILE` | python: import torch, build, one step | ratio |",
            "|---|---:|---:|---:|",
        ]
        for row in result["models"]:
            p = row["process_seconds"]
            lines.append(
                f"| {row['model']} | {_ms(p['graphsvc backward FILE'])} ms | "
                f"{_ms(p['python: import torch, build, one step'])} ms | "
                f"{_r(row['process_ratio']['graphsvc backward FILE'])} |"
            )
    return "\n".join(lines) + "\n"


def _time_table(
    heading: str,
    sentence: str,
    columns: tuple[str, str, str],
    seconds: dict[str, float],
    counts: dict[str, int],
    total: float,
) -> list[str]:
    """A "where the time goes" section: its heading, a sentence, then a row per key of ``seconds``
    (its count, milliseconds and share of ``total``)."""
    what, count, share = columns
    lines = ["", f"## {heading}", "", sentence, "", f"| {what} | {count} | ms | {share} |", "|---|---:|---:|---:|"]
    for key, sec in seconds.items():
        lines.append(f"| {key} | {counts[key]} | {sec * 1e3:.3f} | {sec / total:.1%} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=9, help="rounds per model (default 9)")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per alternative and round (default 5)")
    parser.add_argument("--models", nargs="+", choices=list(MODEL_NAMES), default=list(MODEL_NAMES))
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu", help="cpu (default) or wall")
    parser.add_argument("--storage-rounds", type=int, default=5, help="rounds of saves and loads (default 5)")
    parser.add_argument("--process-rounds", type=int, default=5, help="rounds of whole processes (default 5)")
    parser.add_argument("--no-storage", dest="storage", action="store_false", help="skip saves and loads")
    parser.add_argument("--no-processes", dest="processes", action="store_false", help="skip whole processes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    args = parser.parse_args(argv)
    import torch  # after the options: --help works without it

    torch.set_num_threads(1)
    registry, problems = load_registry()
    if problems:
        raise SystemExit(f"plugins failed to load: {problems}")
    start = time.perf_counter()
    result: dict[str, Any] = run_header(
        argv, torch.get_num_threads(), rounds=args.rounds, passes=args.passes, clock=args.clock
    )
    print(f"threads: OpenBLAS {result['blas_threads']}, torch {result['torch_threads']}", flush=True)
    models = builders()
    with tempfile.TemporaryDirectory(prefix="bench_capture_replay-") as folder:
        result["models"] = [
            bench_model(name, MODEL_NAMES[name], models[name], registry, Path(folder), args) for name in args.models
        ]
    result["load_average_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    result["seconds"] = time.perf_counter() - start
    text = markdown(result)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_capture_replay.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "bench_capture_replay.md").write_text(text)
        print(f"wrote {RESULTS / 'bench_capture_replay.md'}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
