"""graphsvc.Value next to micrograd's Value, in one run; and trace / from_micrograd at N and 10N.

    python benchmarks/bench_value.py [--repeat K] [--width W] [--sizes N 10N]

Needs micrograd (``pip install micrograd==0.1.0``). Prints a table and writes
benchmarks/results/bench_value.json. What is timed, and how:

* **MLP build**: micrograd's ``MLP(W, [W, W, 1])`` (W = 256 by default) created and applied to one
  input of W floats, which is the whole graph a training step would then differentiate. The same
  ``micrograd/nn.py`` source runs twice: once as micrograd ships it, once executed into a fresh
  module whose ``Value`` is graphsvc's (``nn.py`` does ``from micrograd.engine import Value`` and
  looks the name up at call time). The same random seed gives both the same weights; the outputs
  are checked equal. Target: graphsvc at most 1.5x micrograd. Then ``backward()`` on each graph
  (micrograd: build_topo and each value's closure; graphsvc: trace to columns, one replay, and the
  gradients added back to the values), the gradients checked equal in the first round.
  Targets: building and ``backward()`` each at most 0.5x micrograd's, with the garbage
  collector running.
* **from_micrograd + save**: ``graphsvc.from_micrograd`` of micrograd's differentiated MLP and
  ``graphsvc.save`` of the result to a file (with its fsyncs), next to micrograd's own ``backward()``
  on that graph in the same round. Target: at most 1.0x.
* Each round runs micrograd, then graphsvc; a ratio is graphsvc time / micrograd time within a
  round; min, median and max are over rounds. The graphs are dropped and ``gc.collect()`` runs
  between builds. The rounds run twice: with the cyclic garbage collector paused during each build
  (as ``timeit`` does), and with it running, as in a user's program.
* **Linear time**: ``graphsvc.trace`` of a graphsvc graph, and ``from_micrograd`` of a micrograd
  graph, each at N and 10N nodes (a random DAG of binary ops built with each library's ``Value``:
  node ``i`` combines node ``i - 1`` and a random earlier node). Linear means time per node stays
  flat: the ``10N / N`` ratio of the fastest runs is about 10 (the fastest, because other load on
  the machine only ever adds time).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import random
import sys
import tempfile
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks.graphs import micrograd_postorder  # noqa: E402
from benchmarks.run import stats  # noqa: E402
from graphsvc.micrograd import from_micrograd  # noqa: E402
from graphsvc.value import Value, trace  # noqa: E402

RESULTS = HERE / "results"
#: The targets, graphsvc time / micrograd time: building the MLP, backward() on it (both
#: with graphsvc.Value), and from_micrograd + save against micrograd's backward().
TARGETS = {"build": 0.5, "backward": 0.5, "import_save": 1.0}


def nn_module_with(value_class: type) -> types.ModuleType:
    """micrograd's nn.py executed into a new module whose ``Value`` is ``value_class``."""
    spec = importlib.util.find_spec("micrograd.nn")
    if spec is None or spec.origin is None:
        raise SystemExit("micrograd is not installed: pip install micrograd==0.1.0")
    module = types.ModuleType(f"micrograd_nn_{value_class.__module__.replace('.', '_')}")
    source = Path(spec.origin).read_text()
    exec(compile(source, spec.origin, "exec"), module.__dict__)
    module.__dict__["Value"] = value_class  # replaces what `from micrograd.engine import Value` bound
    return module


def build_mlp(nn: types.ModuleType, width: int, seed: int) -> Any:
    random.seed(seed)
    model = nn.MLP(width, [width, width, 1])
    inputs = [random.uniform(-1.0, 1.0) for _ in range(width)]
    return model(inputs)


def timed(fn: Callable[[], Any], *, pause_gc: bool) -> tuple[float, Any]:
    gc.collect()
    if pause_gc:
        gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return elapsed, result


def mlp_comparison(width: int, repeat: int) -> dict[str, Any]:
    from micrograd import engine

    micro_nn = nn_module_with(engine.Value)
    ours_nn = nn_module_with(Value)
    report: dict[str, Any] = {"width": width}
    scratch = tempfile.TemporaryDirectory()
    path = Path(scratch.name) / "mlp.msgpack"
    for pause_gc in (True, False):
        times: dict[str, list[float]] = {
            "micrograd": [],
            "graphsvc": [],
            "micrograd_bw": [],
            "graphsvc_bw": [],
            "import_save": [],
        }
        for round_ in range(repeat):
            t_micro, out_micro = timed(partial(build_mlp, micro_nn, width, round_), pause_gc=pause_gc)
            data_micro = out_micro.data
            times["micrograd_bw"].append(timed(out_micro.backward, pause_gc=pause_gc)[0])
            grads_micro = sorted(v.grad for v in micrograd_postorder(out_micro)) if round_ == 0 else None
            times["import_save"].append(timed(partial(import_and_save, out_micro, path), pause_gc=pause_gc)[0])
            if round_ == 0 and not _same_grads(graphsvc.load(path), from_micrograd(out_micro)):
                raise SystemExit("from_micrograd + save: the file's gradients differ from the graph's")
            del out_micro
            t_ours, out_ours = timed(partial(build_mlp, ours_nn, width, round_), pause_gc=pause_gc)
            if out_ours.data != data_micro:
                raise SystemExit(f"outputs differ: graphsvc {out_ours.data!r}, micrograd {data_micro!r}")
            times["graphsvc_bw"].append(timed(out_ours.backward, pause_gc=pause_gc)[0])
            if grads_micro is not None and not _close(sorted(_grads(trace(out_ours))), grads_micro):
                raise SystemExit("backward(): graphsvc's gradients differ from micrograd's")
            if "nodes" not in report:
                report["nodes"] = trace(out_ours).num_nodes
            del out_ours
            times["micrograd"].append(t_micro)
            times["graphsvc"].append(t_ours)
        key = "gc_paused" if pause_gc else "gc_running"
        report[key] = _paired(times["micrograd"], times["graphsvc"])
        report[f"backward_{key}"] = _paired(times["micrograd_bw"], times["graphsvc_bw"])
        report[f"import_save_{key}"] = _paired(times["micrograd_bw"], times["import_save"])
    scratch.cleanup()
    return report


def _grads(graph: graphsvc.Graph) -> list[float]:
    if graph.grads is None:
        raise SystemExit("the graph has no gradients")
    return list(graph.grads.tolist())


def _same_grads(a: graphsvc.Graph, b: graphsvc.Graph) -> bool:
    return _grads(a) == _grads(b)


def import_and_save(root: Any, path: Path) -> None:
    graphsvc.save(from_micrograd(root), path)


def _paired(micrograd: list[float], ours: list[float]) -> dict[str, Any]:
    ratios = [o / m for o, m in zip(ours, micrograd, strict=True)]
    return {"micrograd_s": stats(micrograd), "graphsvc_s": stats(ours), "ratio": stats(ratios)}


def _close(ours: list[float], theirs: list[float]) -> bool:
    if len(ours) != len(theirs):
        return False
    return all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in zip(ours, theirs, strict=True))


def random_dag(value_class: Callable[[float], Any], n: int, seed: int) -> Any:
    """n values: a few leaves, then value i = value[i - 1] (+ or *) a random earlier value."""
    rng = random.Random(seed)
    values = [value_class(rng.uniform(0.5, 1.5)) for _ in range(8)]
    while len(values) < n:
        left, right = values[-1], values[rng.randrange(len(values) - 1)]
        values.append(left + right if rng.random() < 0.5 else left * right * 0.5)
    return values[-1]


def linear_time(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    from micrograd import engine

    rows = []
    steps: list[tuple[str, Callable[[float], Any], Callable[[Any], Any]]] = [
        ("trace", Value, trace),
        ("from_micrograd", engine.Value, from_micrograd),
    ]
    for name, value_class, run in steps:
        per_size: list[dict[str, Any]] = []
        for n in sizes:
            root = random_dag(value_class, n, seed=n)
            nodes = trace(root).num_nodes if value_class is Value else from_micrograd(root).num_nodes
            times = [timed(partial(run, root), pause_gc=True)[0] for _ in range(repeat)]
            per_size.append({"size": n, "nodes": nodes, "seconds": stats(times)})
            del root
            gc.collect()
        first, last = per_size[0], per_size[-1]
        rows.append(
            {
                "step": name,
                "sizes": per_size,
                # min: the least disturbed run (the machine's other load only ever adds time)
                "time_ratio": last["seconds"]["min"] / first["seconds"]["min"],
                "size_ratio": last["nodes"] / first["nodes"],
            }
        )
    return rows


def show(mlp: dict[str, Any], linear: list[dict[str, Any]]) -> str:
    lines = [
        f"MLP({mlp['width']}, [{mlp['width']}, {mlp['width']}, 1]) on one input: build the graph "
        f"({mlp['nodes']:,} nodes)",
        f"{'gc':10} {'micrograd s (median)':>21} {'graphsvc s (median)':>20} "
        f"{'graphsvc/micrograd min / median / max':>40}",
    ]
    headings = {
        "build": f"target: at most {TARGETS['build']}x",
        "backward": f"then backward() on that graph (every node's gradient); target: at most {TARGETS['backward']}x",
        "import_save": "from_micrograd + save of micrograd's graph, next to micrograd's backward(); "
        f"target: at most {TARGETS['import_save']}x",
    }
    keys = ("gc_paused", "gc_running", "build", "backward", "backward_gc_paused", "backward_gc_running")
    for key in (*keys, "import_save", "import_save_gc_paused", "import_save_gc_running"):
        if key in headings:
            lines.append(headings[key])
            continue
        row = mlp[key]
        r = row["ratio"]
        lines.append(
            f"{key.removeprefix('backward_').removeprefix('import_save_'):10} {row['micrograd_s']['median']:21.3f} "
            f"{row['graphsvc_s']['median']:20.3f} "
            f"{r['min']:22.2f}x / {r['median']:.2f}x / {r['max']:.2f}x  (runs {r['runs']})"
        )
    lines.append("")
    lines.append(f"{'step':15} {'nodes':>10} {'min s':>8} {'median s':>9} {'max s':>8} {'us/node (min)':>14}")
    for row in linear:
        for size in row["sizes"]:
            t = size["seconds"]
            lines.append(
                f"{row['step']:15} {size['nodes']:10,} {t['min']:8.3f} {t['median']:9.3f} {t['max']:8.3f} "
                f"{1e6 * t['min'] / size['nodes']:14.2f}"
            )
        lines.append(
            f"{'':15} {row['size_ratio']:9.1f}x nodes -> {row['time_ratio']:.1f}x time (min) "
            f"({'linear' if row['time_ratio'] < 1.5 * row['size_ratio'] else 'NOT linear'})"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="rounds per measurement (default 5)")
    parser.add_argument("--width", type=int, default=256, help="MLP width (default 256)")
    parser.add_argument("--sizes", type=int, nargs=2, default=[50_000, 500_000], metavar=("N", "10N"))
    args = parser.parse_args()

    mlp = mlp_comparison(args.width, args.repeat)
    linear = linear_time(args.sizes, max(5, args.repeat))
    print(show(mlp, linear))
    from importlib.metadata import version

    result = {
        "benchmark": "bench_value",
        "graphsvc": graphsvc.__version__,
        "micrograd": version("micrograd"),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "targets": TARGETS,
        "mlp_build": mlp,
        "linear_time": linear,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "bench_value.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
