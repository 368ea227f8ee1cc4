"""graphsvc side by side with the tools a user would pick instead, in one run.

    python benchmarks/run.py [--quick] [--sizes N 10N] [--repeat K]

Prints a table and writes benchmarks/results/latest.json and latest.md. Graphs and their other
forms are described in benchmarks/graphs.py. What is timed, and how:

* Every graphsvc step runs once untimed on a 60,000-node graph first, so the op registry is loaded
  and every module imported before any timing (the compiled kernels, C extensions built at
  install, need no warm-up of their own).
* Each comparison runs K rounds; a round runs each alternative, then graphsvc, on the same input.
  A ratio is alternative time / graphsvc time within a round; min, median and max are over rounds.
  A comparison whose rounds are slow stops after ``--budget`` seconds (at least one round); the
  number of rounds is reported.
* The cyclic garbage collector is paused inside every timed region (as ``timeit`` does) and run
  between runs, with the long-lived graphs frozen (``gc.freeze``) so that takes milliseconds. This
  favours micrograd and PyTorch, whose builds would otherwise trigger full collections.
* Every timed run starts after a 0.25 s pause, so one tool's after-effects (PyTorch's backward
  leaves the process slow for a moment) are not billed to the next tool.
* save = to a file (graphsvc.save writes a temporary file, fsyncs and renames; pickle and msgpack
  just write). load = from that file, still in the page cache; graphsvc.load validates.
* The alternatives' inputs (per-node dicts, graphlib's ``{node: parents}`` map, micrograd and
  PyTorch graphs) are built before the timing starts.
* PyTorch: ``out.backward(retain_graph=True)``, which fills ``.grad`` of the leaves only;
  graphsvc and micrograd compute every node's gradient. This favours PyTorch. It runs in a child
  process (torch_backward.py says why), with the same timing function; its rounds are paired with
  graphsvc's rounds in this process.
* Peak memory: each step in a fresh process (benchmarks/memstep.py explains the method).
* Scaling (N -> 10N nodes of the random DAG) is given two ways: the in-process medians above, and
  each step timed in 3 fresh processes (a process that has not run the step before, as one CLI use;
  the in-process rounds reuse memory an earlier round warmed up). Beside them, numpy's plain gather
  ``values[parent_indices]`` (the random reads a forward sweep makes) shows how the machine's memory
  alone scales once the graph outgrows the caches.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import graphlib
import itertools
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks import graphs as G  # noqa: E402
from graphsvc.graph import Graph  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import columns as replay  # noqa: E402
from graphsvc.topo import ancestors, levels, reverse_topological_order  # noqa: E402

RESULTS = HERE / "results"
STEPS = ("save", "load", "validate", "order", "forward", "backward")
MEMORY_LIMIT = 150  # bytes per node at 10N
SETTLE = 0.25  # seconds of rest before every timed run
MEMORY_STEPS = ("save", "load", "validate", "order", "backward")  # the steps held to MEMORY_LIMIT


# -- timing ---------------------------------------------------------------------------------------
#: Scaling: a step's time may grow at most this many times as much as numpy's own
#: ``values[parent_indices]`` gather grows between the same two sizes in the same run.
GATHER_SCALING_FACTOR = 1.5
#: ... and the depth-first order at the largest size takes at most this many times that gather.
ORDER_OVER_GATHER = 3.0


def timed(fn: Callable[[], Any], setup: Callable[[], Any] | None = None) -> float:
    if setup is not None:
        setup()
    gc.collect()
    # Let the previous run's leftovers settle: right after a PyTorch backward, the next 20 ms of
    # numpy work measured 7-10x slower for a moment (threads still spinning, memory being freed).
    # Write back every dirty page first: graphsvc's save fsyncs, and without this its fsync would
    # also wait for the writeback of the pickle file the previous run left in the page cache.
    os.sync()
    time.sleep(SETTLE)
    gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    del result
    return elapsed


def startup_env(pycache: Path) -> dict[str, str]:
    """The environment of a timed whole process: byte-compiled modules, as an installed wheel has
    them (no ``PYTHONDONTWRITEBYTECODE``; ``PYTHONPYCACHEPREFIX`` is ``pycache``, which the caller
    warms with one untimed run), and no ``GRAPHSVC_*`` setting of this shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("GRAPHSVC_")}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def stats(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "runs": len(xs)}


class Bench:
    def __init__(self, repeat: int, budget: float) -> None:
        self.repeat = repeat
        self.budget = budget
        self.comparisons: list[dict[str, Any]] = []
        self.steps: dict[str, dict[str, dict[str, float]]] = {}  # graph -> step -> graphsvc time stats

    def compare(
        self,
        graph: str,
        step: str,
        ours: Callable[[], Any],
        alternatives: dict[str, tuple[Any, Callable[[], Any] | None]],
        note: str = "",
    ) -> None:
        times: dict[str, list[float]] = {"graphsvc": [], **{name: [] for name in alternatives}}
        # Move the long-lived graphs (micrograd's, PyTorch's) out of the collector's sight, so the
        # collection between runs only looks at what the runs made (and takes milliseconds).
        gc.collect()
        gc.freeze()
        try:
            start = time.perf_counter()
            for _ in range(self.repeat):
                for name, (fn, setup) in alternatives.items():
                    if isinstance(fn, list):  # measured in another process: take its next round
                        times[name].append(fn[len(times[name]) % len(fn)])
                        continue
                    times[name].append(timed(fn, setup))
                times["graphsvc"].append(timed(ours))
                if time.perf_counter() - start > self.budget:
                    break
        finally:
            gc.unfreeze()
        ours_t = times["graphsvc"]
        self.steps.setdefault(graph, {})[step] = stats(ours_t)
        for name in alternatives:
            ratios = [a / o for a, o in zip(times[name], ours_t, strict=True)]
            row = {
                "graph": graph,
                "step": step,
                "alternative": name,
                "graphsvc_s": stats(ours_t),
                "alternative_s": stats(times[name]),
                "ratio": stats(ratios),
                "note": note,
            }
            self.comparisons.append(row)
            print(
                f"  {graph:6} {step:9} graphsvc {stats(ours_t)['median']:9.4f}s | {name:22} "
                f"{stats(times[name])['median']:9.4f}s | ratio {row['ratio']['median']:8.1f}x "
                f"(min {row['ratio']['min']:.1f}, max {row['ratio']['max']:.1f}, runs {len(ratios)})",
                flush=True,
            )
        if not alternatives:
            s = stats(ours_t)
            print(f"  {graph:6} {step:9} graphsvc {s['median']:9.4f}s (min {s['min']:.4f}, max {s['max']:.4f})")


# -- machine ------------------------------------------------------------------------------------------
def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        mem_kib = 0
    root = HERE.parent  # the pathspecs below are relative to the checkout's root
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "graphsvc", "cli.py"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        commit += " + uncommitted changes to graphsvc" if dirty else ""
    except OSError:
        commit = ""
    engine = Path(graphsvc.__file__).parent
    commit += "" if engine == root / "graphsvc" else f" (graphsvc imported from {engine})"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "micrograd": _version("micrograd"),
        "msgpack": _version("msgpack"),
        "graphsvc": graphsvc.__version__,
        "commit": commit,
        "native": os.environ.get("GRAPHSVC_NATIVE", "1") != "0",
    }


# -- the benchmark -----------------------------------------------------------------------------------
def warm_up(registry: Any, workdir: Path) -> None:
    """Run every graphsvc step once on a graph above the native threshold."""
    g = G.dag(60_000)
    path = workdir / "warmup.graphsvc"
    graphsvc.save(g, path)
    loaded = graphsvc.load(path)
    loaded.check()
    for algorithm in ("dfs", "kahn"):
        reverse_topological_order(loaded, loaded.outputs[0], algorithm)
        reverse_topological_order(loaded, None, algorithm)
    levels(loaded)
    replay.forward(loaded, registry)
    replay.backward(loaded, registry, loaded.outputs[0])
    c = G.chain(60_000)
    replay.forward(c, registry)
    replay.backward(c, registry, c.outputs[0])


def describe(name: str, g: Graph, how: str) -> dict[str, Any]:
    info = {
        "nodes": g.num_nodes,
        "edges": g.num_edges,
        "depth": int(levels(g).max()),
        "ops": g.op_histogram(),
        "built_with": how,
    }
    print(f"graph {name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, depth {info['depth']:,} ({how})", flush=True)
    return info


def file_steps(
    bench: Bench, name: str, g: Graph, workdir: Path, registry: Any, alternatives: bool, sizes: dict[str, Any]
) -> Graph:
    """save and load (vs pickle and msgpack when ``alternatives``), then validate; returns the loaded graph."""
    ours = workdir / f"{name}.graphsvc"
    pkl = workdir / f"{name}.pickle"
    mpk = workdir / f"{name}.msgpack"
    alts_save: dict[str, tuple[Callable[[], Any], Any]] = {}
    alts_load: dict[str, tuple[Callable[[], Any], Any]] = {}
    if alternatives:
        records = G.to_records(g)

        def pickle_dump() -> None:
            with open(pkl, "wb") as f:
                pickle.dump(records, f, protocol=5)

        def msgpack_dump() -> None:
            with open(mpk, "wb") as f:
                f.write(msgpack.packb(records))

        def pickle_load() -> Any:
            with open(pkl, "rb") as f:
                return pickle.load(f)

        def msgpack_load() -> Any:
            with open(mpk, "rb") as f:
                return msgpack.unpackb(f.read())

        alts_save = {"pickle (per-node dicts)": (pickle_dump, None), "msgpack (per-node maps)": (msgpack_dump, None)}
        alts_load = {"pickle (per-node dicts)": (pickle_load, None), "msgpack (per-node maps)": (msgpack_load, None)}
    bench.compare(name, "save", lambda: graphsvc.save(g, ours), alts_save)
    bench.compare(name, "load", lambda: graphsvc.load(ours), alts_load)
    loaded = graphsvc.load(ours)
    sizes[name] = {"graphsvc": ours.stat().st_size, "nodes": g.num_nodes}
    if alternatives:
        sizes[name]["pickle (per-node dicts)"] = pkl.stat().st_size
        sizes[name]["msgpack (per-node maps)"] = mpk.stat().st_size
        assert G.same_graph(loaded, G.from_records(pickle_load())), f"{name}: pickle round trip differs"
        assert G.same_graph(loaded, G.from_records(msgpack_load())), f"{name}: msgpack round trip differs"
        del records
    assert G.same_graph(loaded, g), f"{name}: graphsvc round trip differs"
    bench.compare(name, "validate", loaded.check, {})
    return loaded


def replay_steps(
    bench: Bench,
    name: str,
    loaded: Graph,
    registry: Any,
    micrograd: dict[str, Any] | None,
    torch_graph: dict[str, Any] | None,
    records: dict[str, Any] | None,
    checks: dict[str, Any],
) -> None:
    """order, forward and backward, against micrograd, graphlib and PyTorch where given."""
    output = loaded.outputs[0]
    order_alts: dict[str, tuple[Callable[[], Any], Any]] = {}
    if micrograd is not None:
        root = micrograd["root"]
        order_alts["micrograd build_topo"] = (lambda: G.micrograd_build_topo(root), None)
    if records is not None:
        parents = G.parents_map(records)
        order_alts["graphlib"] = (lambda: list(graphlib.TopologicalSorter(parents).static_order()), None)
    bench.compare(name, "order", lambda: reverse_topological_order(loaded, output), order_alts)
    reached = len(reverse_topological_order(loaded, output))
    checks.setdefault(name, {})["order_reaches"] = reached

    forward_alts: dict[str, tuple[Callable[[], Any], Any]] = {}
    if micrograd is not None:
        forward_alts["micrograd (building it)"] = (micrograd["build"], None)
    bench.compare(name, "forward", lambda: replay.forward(loaded, registry), forward_alts)
    values = replay.forward(loaded, registry)
    checks[name]["forward_matches_stored"] = bool(np.allclose(values, loaded.values, rtol=1e-12, atol=0))

    backward_alts: dict[str, tuple[Callable[[], Any], Any]] = {}
    if micrograd is not None:
        root, nodes = micrograd["root"], micrograd["nodes"]

        def zero() -> None:
            for v in nodes:
                v.grad = 0

        backward_alts["micrograd backward()"] = (root.backward, zero)
    if torch_graph is not None:
        backward_alts["PyTorch autograd (own process)"] = (torch_graph["times"], None)
    bench.compare(name, "backward", lambda: replay.backward(loaded, registry, output), backward_alts)
    grads = replay.backward(loaded, registry, output)
    if micrograd is not None:
        theirs = np.sort(np.array([float(v.grad) for v in micrograd["nodes"]]))
        checks[name]["backward_matches_micrograd"] = bool(np.allclose(np.sort(grads), theirs, rtol=1e-9, atol=1e-300))
    if torch_graph is not None:
        checks[name]["backward_matches_torch"] = torch_graph["matches"]


def run_mlp(bench: Bench, width: int, workdir: Path, registry: Any, result: dict[str, Any], torch_ok: bool) -> None:
    """micrograd's MLP: built with micrograd, converted, then every step against the alternatives."""
    model, root, x = G.micrograd_mlp(width)
    mlp, how = G.from_micrograd(root)
    result["graphs"]["mlp"] = describe("mlp", mlp, f"micrograd MLP({width}, [{width}, {width}, 1]), {how}")
    mg = {"root": root, "nodes": G.micrograd_postorder(root), "build": lambda: model(x)}
    records = G.to_records(mlp)
    loaded = file_steps(bench, "mlp", mlp, workdir, registry, True, result["file_sizes"])
    torch_graph = torch_backward(workdir / "mlp.graphsvc", bench.repeat) if torch_ok else None
    replay_steps(bench, "mlp", loaded, registry, mg, torch_graph, records, result["checks"])


def run_chain(bench: Bench, n: int, workdir: Path, registry: Any, result: dict[str, Any], torch_ok: bool) -> None:
    """The deep chain: numpy columns for graphsvc, the same chain built with micrograd and PyTorch."""
    chain = G.chain(n)
    result["graphs"]["chain"] = describe("chain", chain, f"numpy columns: relu(x*w + b) x {n // 3:,} steps")
    croot, (x0, w, b) = G.micrograd_chain(n)
    mg = {
        "root": croot,
        "nodes": G.micrograd_postorder(croot),
        "build": lambda: G.build_micrograd_chain(n, x0, w, b),
    }
    converted, how = G.from_micrograd(croot)
    result["checks"]["chain"] = {
        "micrograd_chain_matches_columns": bool(
            converted.num_nodes == chain.num_nodes
            and converted.op_histogram() == chain.op_histogram()
            and np.array_equal(np.sort(converted.values), np.sort(chain.values))
        ),
        "micrograd_converter": how,
    }
    del converted
    records = G.to_records(chain)
    loaded = file_steps(bench, "chain", chain, workdir, registry, True, result["file_sizes"])
    torch_graph = torch_backward(workdir / "chain.graphsvc", bench.repeat) if torch_ok else None
    replay_steps(bench, "chain", loaded, registry, mg, torch_graph, records, result["checks"])


def run_pow_chain(bench: Bench, n: int, workdir: Path, registry: Any, result: dict[str, Any], torch_ok: bool) -> None:
    """The chain of ``n`` pows, each with its ``exponent`` attribute: numpy columns for graphsvc, the
    same chain built with micrograd and PyTorch. Values and gradients are also compared with
    micrograd's bit for bit: the same libm ``pow`` and the same products on both sides."""
    chain = G.pow_chain(n)
    result["graphs"]["pow_chain"] = describe("pow_chain", chain, f"numpy columns: x ** exponent x {n:,} steps")
    root, x0, exponents = G.micrograd_pow_chain(n)
    nodes = G.micrograd_postorder(root)  # the chain's order: x0, then each pow
    mg = {"root": root, "nodes": nodes, "build": lambda: G.build_micrograd_pow_chain(x0, exponents)}
    converted, how = G.from_micrograd(root)
    result["checks"]["pow_chain"] = {
        "micrograd_chain_matches_columns": G.same_graph(dataclasses.replace(converted, grads=None), chain),
        "micrograd_converter": how,
    }
    del converted
    records = G.to_records(chain)
    loaded = file_steps(bench, "pow_chain", chain, workdir, registry, True, result["file_sizes"])
    torch_graph = torch_backward(workdir / "pow_chain.graphsvc", bench.repeat) if torch_ok else None
    replay_steps(bench, "pow_chain", loaded, registry, mg, torch_graph, records, result["checks"])
    values = replay.forward(loaded, registry)
    grads = replay.backward(loaded, registry, loaded.outputs[0])  # micrograd's: left by its last round
    result["checks"]["pow_chain"] |= {
        "values_same_bits_as_micrograd": bool(np.array_equal(values, [v.data for v in nodes])),
        "backward_same_bits_as_micrograd": bool(np.array_equal(grads, [v.grad for v in nodes])),
    }


def run_scalar_ops(bench: Bench, n: int, registry: Any, result: dict[str, Any]) -> None:
    """The scalar graphs of ops beyond micrograd 0.1.0's (graphs.py): a chain of ``n`` steps
    ``x = tanh(x * w + b)`` and an ``n``-node random DAG mixing add, mul and tanh; forward against
    micrograd building the same graph, backward against micrograd's ``backward()``."""
    chain = G.tanh_chain(n)
    result["graphs"]["tanh_chain"] = describe("tanh_chain", chain, f"numpy columns: tanh(x*w + b) x {n:,} steps")
    root, (x0, w, b) = G.micrograd_tanh_chain(n)
    mg = {"root": root, "build": lambda: G.build_micrograd_tanh_chain(n, x0, w, b)}
    forward_backward(bench, "tanh_chain", chain, registry, mg, result["checks"])
    del chain, root, mg
    gc.collect()
    dag = G.dag(n, ops=G.MIXED_OPS)
    result["graphs"]["mixed_dag"] = describe("mixed_dag", dag, "numpy columns: random DAG of add, mul, tanh")
    columns = G.micrograd_columns(dag)
    mg = {"root": G.build_micrograd_graph(columns), "build": lambda: G.build_micrograd_graph(columns)}
    forward_backward(bench, "mixed_dag", dag, registry, mg, result["checks"])


def forward_backward(
    bench: Bench, name: str, graph: Graph, registry: Any, micrograd: dict[str, Any], checks: dict[str, Any]
) -> None:
    """forward (micrograd: building the graph) and backward (micrograd: ``backward()``), then the
    results compared: values bit for bit (libm's tanh on both sides), gradients within 1e-9."""
    output = graph.outputs[0]
    root = micrograd["root"]
    nodes = G.micrograd_postorder(root)
    bench.compare(
        name,
        "forward",
        lambda: replay.forward(graph, registry),
        {"micrograd (building it)": (micrograd["build"], None)},
    )
    values = replay.forward(graph, registry)

    def zero() -> None:
        for v in nodes:
            v.grad = 0

    bench.compare(
        name,
        "backward",
        lambda: replay.backward(graph, registry, output, values),
        {"micrograd backward()": (root.backward, zero)},
    )
    grads = replay.backward(graph, registry, output, values)
    theirs = np.sort(np.array([float(v.grad) for v in nodes]))
    ours = np.sort(grads[np.flatnonzero(ancestors(graph, output))])
    checks[name] = {
        "output_value_same_bits_as_micrograd": bool(values[output] == root.data),
        "backward_matches_micrograd": bool(
            len(ours) == len(theirs) and np.allclose(ours, theirs, rtol=1e-9, atol=1e-300)
        ),
    }


def torch_backward(path: Path, rounds: int) -> dict[str, Any]:
    """PyTorch's backward times on the graph at ``path``, measured in a child process (see torch_backward.py)."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "torch_backward.py"), str(path), str(rounds)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory(name: str, path: Path, warmup: Path, steps: tuple[str, ...], nodes: int) -> list[dict[str, Any]]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    rows = []
    for step in steps:
        proc = subprocess.run(
            [sys.executable, str(HERE / "memstep.py"), step, str(path), str(warmup)],
            capture_output=True,
            text=True,
            env=env,
            cwd=HERE.parent,
            check=False,
        )
        if proc.returncode != 0:
            rows.append({"graph": name, "step": step, "error": proc.stderr.strip().splitlines()[-1:]})
            print(f"  memory {name} {step}: FAILED {proc.stderr.strip()[-300:]}")
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        row = {"graph": name, "step": step, "nodes": nodes, **got, "bytes_per_node": got["step_peak_bytes"] / nodes}
        rows.append(row)
        print(f"  memory {name:6} {step:12} {row['bytes_per_node']:7.1f} bytes/node", flush=True)
    return rows


def fresh_times(name: str, path: Path, warmup: Path, runs: int) -> dict[str, dict[str, float]]:
    """Each step's time in fresh processes (``runs`` of them per step; memstep.py times it), as one
    use of the CLI pays it: no earlier run of the step has left its memory warm."""
    times: dict[str, dict[str, float]] = {}
    for step in STEPS:
        seconds = []
        for _ in range(runs):
            os.sync()
            proc = subprocess.run(
                [sys.executable, str(HERE / "memstep.py"), step, str(path), str(warmup)],
                capture_output=True,
                text=True,
                cwd=HERE.parent,
                check=True,
            )
            seconds.append(json.loads(proc.stdout.strip().splitlines()[-1])["step_seconds"])
        times[step] = stats(seconds)
        print(f"  fresh  {name:12} {step:9} {fmt_s(times[step]['median'])}", flush=True)
    return times


def gather_reference(g: Graph, repeat: int) -> dict[str, float]:
    """The memory system alone: numpy's ``values[parent_indices]``, the reads a forward sweep makes
    (one per edge, at random places), with no graph code around them."""
    values, parents = np.array(g.values), np.array(g.parent_indices)
    return stats([timed(lambda: values[parents]) for _ in range(repeat)])


def cli_startup(runs: int) -> dict[str, Any]:
    exe = shutil.which("graphsvc")
    ours = [exe, "--help"] if exe else [sys.executable, "-m", "graphsvc", "--help"]
    typer = [sys.executable, "-c", "import typer"]

    def once(cmd: list[str]) -> float:
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        return time.perf_counter() - start

    once(ours), once(typer)  # warm the file cache
    a, b = [], []
    for _ in range(runs):
        b.append(once(typer))
        a.append(once(ours))
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    out = {"command": " ".join(ours), "graphsvc_s": stats(a), "import_typer_s": stats(b), "ratio": stats(ratios)}
    print(
        f"  CLI start-up: graphsvc --help {stats(a)['median']:.3f}s, import typer {stats(b)['median']:.3f}s, "
        f"ratio {stats(ratios)['median']:.2f}x"
    )
    return out


# -- targets -------------------------------------------------------------------------------------------
def find(comparisons: list[dict[str, Any]], graph: str, step: str, alt: str) -> dict[str, Any] | None:
    for row in comparisons:
        if row["graph"] == graph and row["step"] == step and row["alternative"].startswith(alt):
            return row
    return None


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    comps = result["comparisons"]
    steps = result["graphsvc_steps"]
    targets: list[dict[str, Any]] = []

    def add(name: str, measured: float | None, goal: str, met: bool | None) -> None:
        targets.append({"target": name, "goal": goal, "measured": measured, "met": met})

    def ratio(graph: str, step: str, alt: str, goal: float, label: str) -> None:
        row = find(comps, graph, step, alt)
        if row is None:
            add(label, None, f">= {goal}x", None)
        else:
            add(label, row["ratio"]["median"], f">= {goal}x", row["ratio"]["median"] >= goal)

    ratio("mlp", "backward", "micrograd", 10, "MLP backward vs micrograd backward()")
    ratio("mlp", "backward", "PyTorch", 30, "MLP backward vs PyTorch autograd")
    ratio("mlp", "forward", "micrograd", 10, "MLP forward vs micrograd building it")
    ratio("chain", "forward", "micrograd", 1, "chain forward vs micrograd building it")
    ratio("tanh_chain", "forward", "micrograd", 50, "tanh chain forward vs micrograd building it (issue 14)")
    ratio("mixed_dag", "forward", "micrograd", 30, "add/mul/tanh DAG forward vs micrograd building it (issue 14)")
    ratio("tanh_chain", "backward", "micrograd", 30, "tanh chain backward vs micrograd backward() (issue 14)")
    ratio("mixed_dag", "backward", "micrograd", 30, "add/mul/tanh DAG backward vs micrograd backward() (issue 14)")
    for graph in ("dag", "chain", "mlp"):
        ratio(graph, "load", "pickle", 20, f"{graph} load vs pickle")
        ratio(graph, "save", "pickle", 20, f"{graph} save vs pickle (issue 2)")
        size = result["file_sizes"].get(graph, {})
        if "pickle (per-node dicts)" in size:
            r = size["graphsvc"] / size["pickle (per-node dicts)"]
            add(f"{graph} file size / pickle's", r, "< 1 (smaller)", r < 1)
    for step in ("load", "order", "backward"):
        if step in steps.get("chain", {}) and step in steps.get("dag", {}):
            r = steps["chain"][step]["median"] / steps["dag"][step]["median"]
            add(f"deep chain / wide DAG, {step}", r, "<= 3x", r <= 3)
    for row in result.get("scaling", []):
        if row["step"] == "gather":  # the hardware's own scaling, for context: not a graphsvc step
            continue
        add(
            f"scaling {row['step']}, {row['how']} ({row['small']:,} -> {row['large']:,} nodes)",
            row["time_ratio"],
            f"<= {row['limit']:.1f}x",
            row["time_ratio"] <= row["limit"],
        )
    big = result["config"]["sizes"][-1]
    big_name = "dag" if len(result["config"]["sizes"]) == 1 else f"dag{big}"
    gather = result.get("gather", {}).get(big_name)
    order = steps.get(big_name, {}).get("order")
    if gather and order:
        r = order["median"] / gather["median"]
        add(f"{big:,} nodes: depth-first order / numpy's gather", r, f"<= {ORDER_OVER_GATHER}x", r <= ORDER_OVER_GATHER)
    big_rows = [r for r in result["memory"] if r["graph"] == f"dag{big}" and r["step"] in MEMORY_STEPS]
    for row in big_rows:
        if "error" in row:
            add(f"{big:,} nodes: {row['step']} completes under {MEMORY_LIMIT} B/node", None, "completes", False)
        else:
            bpn = row["bytes_per_node"]
            add(f"{big:,} nodes: {row['step']} peak bytes/node", bpn, f"< {MEMORY_LIMIT}", bpn < MEMORY_LIMIT)
    cli = result.get("cli")
    if cli:
        r = cli["ratio"]["median"]
        add("graphsvc --help / python -c 'import typer'", r, "<= 1.5x", r <= 1.5)
    return targets


# -- report ---------------------------------------------------------------------------------------------
def fmt_s(x: float) -> str:
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# graphsvc benchmarks",
        "",
        f"Run {result['started']} with `{result['command']}` ({result['elapsed_s']:.0f} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}; Python {m['python']}, "
        f"numpy {m['numpy']}, torch {m['torch']}, micrograd {m['micrograd']}, "
        f"msgpack {m['msgpack']}; graphsvc {m['graphsvc']} at {m['commit']} "
        f"(C extensions {'on' if m['native'] else 'off'}).",
        "",
        "## Graphs",
        "",
        "| graph | nodes | edges | depth | built with |",
        "|---|---:|---:|---:|---|",
    ]
    for name, info in result["graphs"].items():
        lines.append(f"| {name} | {info['nodes']:,} | {info['edges']:,} | {info['depth']:,} | {info['built_with']} |")
    lines += [
        "",
        "## graphsvc against the alternatives",
        "",
        "Ratio = alternative time / graphsvc time in the same round (higher is better for graphsvc); "
        "min / median / max over the rounds.",
        "",
        "| graph | step | graphsvc (median) | alternative | alternative (median) | ratio median | min | max | rounds |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["comparisons"]:
        lines.append(
            f"| {r['graph']} | {r['step']} | {fmt_s(r['graphsvc_s']['median'])} | {r['alternative']} | "
            f"{fmt_s(r['alternative_s']['median'])} | **{r['ratio']['median']:.1f}x** | {r['ratio']['min']:.1f}x | "
            f"{r['ratio']['max']:.1f}x | {r['ratio']['runs']} |"
        )
    lines += ["", "## graphsvc steps (seconds: median, min, max)", ""]
    lines += ["| graph | " + " | ".join(STEPS) + " |", "|---|" + "---:|" * len(STEPS)]
    for graph, steps in result["graphsvc_steps"].items():
        cells = [fmt_s(steps[s]["median"]) if s in steps else "" for s in STEPS]
        lines.append(f"| {graph} | " + " | ".join(cells) + " |")
    lines += scaling_markdown(result)
    lines += [
        "",
        "## File sizes (bytes per node)",
        "",
        "| graph | graphsvc | pickle (per-node dicts) | msgpack (per-node maps) |",
    ]
    lines.append("|---|---:|---:|---:|")
    for graph, s in result["file_sizes"].items():
        n = s["nodes"]
        cells = [
            f"{s[k] / n:.1f}" if k in s else ""
            for k in ("graphsvc", "pickle (per-node dicts)", "msgpack (per-node maps)")
        ]
        lines.append(f"| {graph} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Peak memory (bytes per node)",
        "",
        "Each step in a fresh process: peak resident set size during the step minus the resident size "
        "just before it (inputs loaded, kernels and registry warmed up on a small graph); so it "
        "counts the step's working memory and its result. See benchmarks/memstep.py.",
        "",
    ]
    mem_steps = list(dict.fromkeys(r["step"] for r in result["memory"]))
    lines += ["| graph | " + " | ".join(mem_steps) + " |", "|---|" + "---:|" * len(mem_steps)]
    for graph in dict.fromkeys(r["graph"] for r in result["memory"]):
        by = {r["step"]: r for r in result["memory"] if r["graph"] == graph}
        cells = []
        for s in mem_steps:
            r = by.get(s)
            cells.append("" if r is None else ("failed" if "error" in r else f"{r['bytes_per_node']:.1f}"))
        lines.append(f"| {graph} | " + " | ".join(cells) + " |")
    cli = result.get("cli")
    if cli:
        lines += [
            "",
            "## CLI start-up",
            "",
            f"`{Path(cli['command'].split()[0]).name} --help`: {fmt_s(cli['graphsvc_s']['median'])}; "
            f"`python -c 'import typer'`: {fmt_s(cli['import_typer_s']['median'])}; "
            f"ratio {cli['ratio']['median']:.2f}x (min {cli['ratio']['min']:.2f}, max {cli['ratio']['max']:.2f}, "
            f"{cli['ratio']['runs']} runs).",
        ]
    lines += ["", "## Targets", "", "| target | goal | measured | met |", "|---|---|---:|---|"]
    for t in result["targets"]:
        measured = "" if t["measured"] is None else f"{t['measured']:.2f}"
        met = {True: "yes", False: "**NO**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['goal']} | {measured} | {met} |")
    lines += ["", "## Checks", "", "```", json.dumps(result["checks"], indent=1), "```", ""]
    if result["config"]["quick"]:
        lines.insert(2, "**Quick run: smaller sizes than the targets are set for.**\n")
    return "\n".join(lines)


def scaling_markdown(result: dict[str, Any]) -> list[str]:
    rows = result.get("scaling", [])
    if not rows:
        return []
    small, large = rows[0]["small"], rows[0]["large"]
    names = ["dag", f"dag{large}"]
    lines = [
        "",
        f"## Scaling: random DAG, {small:,} -> {large:,} nodes",
        "",
        "In-process: the medians above (rounds in one process, which reuses its warm memory between "
        "rounds). Fresh processes: each step timed once per process, 3 processes, median (what one CLI "
        "use pays; benchmarks/memstep.py). Gather: numpy's `values[parent_indices]` alone, the random "
        "reads a forward sweep makes: how this machine's memory scales when the data outgrows its caches.",
        "",
        f"| step | in-process {small:,} | in-process {large:,} | ratio | fresh {small:,} | fresh {large:,} | ratio |"
        " limit (1.5x gather's) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fresh, ours = result.get("fresh_steps", {}), result["graphsvc_steps"]
    for step in STEPS:
        ratio = {r["how"]: r["time_ratio"] for r in rows if r["step"] == step}
        cells = [fmt_s(ours[n][step]["median"]) for n in names] + [f"{ratio['in-process rounds']:.1f}x"]
        if fresh:
            cells += [fmt_s(fresh[n][step]["median"]) for n in names] + [f"{ratio['fresh processes']:.1f}x"]
        limit = next(r["limit"] for r in rows if r["step"] == step)
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {limit:.1f}x |")
    gather = result.get("gather")
    if gather:
        r = next(r["time_ratio"] for r in rows if r["step"] == "gather")
        cells = [fmt_s(gather[n]["median"]) for n in names] + [f"{r:.1f}x", "", "", "", ""]
        lines.append("| gather (reference) | " + " | ".join(cells) + " |")
    return lines


# -- main --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test, about 2 minutes)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", help="DAG sizes; the first is also the chain length (default 1e6 1e7)"
    )
    parser.add_argument("--repeat", type=int, help="rounds per comparison (default 5, quick 3)")
    parser.add_argument("--mlp-width", type=int, help="micrograd MLP width (default 256, quick 128)")
    parser.add_argument("--budget", type=float, default=60.0, help="stop a comparison's rounds after this many seconds")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory processes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for latest.json and latest.md")
    parser.add_argument("--render", action="store_true", help="only rebuild latest.md (and targets) from latest.json")
    parser.add_argument(
        "--only",
        choices=("relu", "ops", "pow"),
        help="relu: micrograd's graphs (mlp, chain, dags, scaling, memory, start-up); ops: the tanh chain and "
        "the add/mul/tanh DAG; pow: the chain of pows, each with its exponent attribute",
    )
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads((args.out / "latest.json").read_text())
        result["targets"] = evaluate_targets(result)
        (args.out / "latest.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (args.out / "latest.md").write_text(markdown(result))
        print(markdown(result))
        return 0
    sizes = args.sizes or ([100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000])
    repeat = args.repeat or (3 if args.quick else 5)
    width = args.mlp_width or (128 if args.quick else 256)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    n = sizes[0]
    # micrograd's build_topo recurses once per node of the chain: raise the limit in this process only.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3 * n + 10_000))

    registry, _ = load_registry(disable_third_party=True)
    bench = Bench(repeat, args.budget)
    result: dict[str, Any] = {
        "started": started,
        "command": "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "config": {"quick": args.quick, "sizes": sizes, "repeat": repeat, "mlp_width": width, "budget_s": args.budget},
        "graphs": {},
        "file_sizes": {},
        "checks": {},
        "memory": [],
    }
    print(f"machine: {result['machine']}", flush=True)
    torch_ok = not args.no_torch and _version("torch") is not None
    with tempfile.TemporaryDirectory(prefix="graphsvc-bench-") as tmp:
        workdir = Path(tmp)
        warm_up(registry, workdir)
        relu = args.only in (None, "relu")
        if args.only in (None, "ops"):
            run_scalar_ops(bench, n, registry, result)
            gc.collect()
        if relu:
            run_mlp(bench, width, workdir, registry, result, torch_ok)
            gc.collect()
            run_chain(bench, n, workdir, registry, result, torch_ok)
            gc.collect()
        if args.only in (None, "pow"):
            run_pow_chain(bench, n, workdir, registry, result, torch_ok)
            gc.collect()

        # DAGs ------------------------------------------------------------------------------------
        for i, size in enumerate(sizes if relu else []):
            name = "dag" if i == 0 else f"dag{size}"
            g = G.dag(size)
            result["graphs"][name] = describe(name, g, "numpy columns: random DAG, 10 layers + sum tree")
            records = G.to_records(g) if i == 0 else None
            loaded = file_steps(bench, name, g, workdir, registry, i == 0, result["file_sizes"])
            replay_steps(bench, name, loaded, registry, None, None, records, result["checks"])
            result.setdefault("gather", {})[name] = gather_reference(loaded, repeat)
            del g, records, loaded
            gc.collect()
        result["graphsvc_steps"] = bench.steps
        result["comparisons"] = bench.comparisons

        # scaling ---------------------------------------------------------------------------------
        names = ["dag"] + [f"dag{s}" for s in sizes[1:]] if relu else []
        print("fresh processes:", flush=True)
        warm = workdir / "warmup.graphsvc"
        result["fresh_steps"] = {name: fresh_times(name, workdir / f"{name}.graphsvc", warm, 3) for name in names}
        result["scaling"] = []
        pairs = list(zip(names, sizes, strict=True)) if relu else []
        for (a, sa), (b_, sb) in itertools.pairwise(pairs):
            # the rule: a step may grow at most 1.5x as much as numpy's own random
            # gather grows between the same sizes in the same run (and never need be under 1.2x linear)
            gather_ratio = result["gather"][b_]["median"] / result["gather"][a]["median"]
            limit = max(GATHER_SCALING_FACTOR * gather_ratio, 1.2 * sb / sa)
            for how, table in (("in-process rounds", bench.steps), ("fresh processes", result["fresh_steps"])):
                for step in STEPS:
                    r = table[b_][step]["median"] / table[a][step]["median"]
                    result["scaling"].append(
                        {"step": step, "how": how, "small": sa, "large": sb, "time_ratio": r, "limit": limit}
                    )
            result["scaling"].append(
                {
                    "step": "gather",
                    "how": "in-process rounds",
                    "small": sa,
                    "large": sb,
                    "time_ratio": gather_ratio,
                    "limit": None,
                }
            )

        # memory ------------------------------------------------------------------------------------
        if not args.no_memory and relu:
            print("peak memory (fresh process per step):", flush=True)
            warm = workdir / "warmup.graphsvc"
            for name in ["mlp", "chain", *names]:
                nodes = result["graphs"][name]["nodes"]
                result["memory"] += memory(name, workdir / f"{name}.graphsvc", warm, STEPS, nodes)
            nodes = result["graphs"]["dag"]["nodes"]
            result["memory"] += memory("dag", workdir / "dag.pickle", warm, ("pickle_dump", "pickle_load"), nodes)

    if args.only in (None, "relu"):
        result["cli"] = cli_startup(10)
    result["elapsed_s"] = time.perf_counter() - t0
    result["targets"] = evaluate_targets(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    md = markdown(result)
    (args.out / "latest.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
