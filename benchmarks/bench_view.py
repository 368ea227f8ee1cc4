"""graphsvc view's data side: ViewModel on graphs of a million nodes, next to ``graphsvc validate``.

    python benchmarks/bench_view.py [--nodes N] [--rounds R] [--dir DIR] [--no-write]

Two graphs of about N nodes (1,000,000 by default), written to DIR (a temporary folder by default):

* **chain**: the recurrent chain of benchmarks/graphs.py (``mul, add, relu`` per step), unnamed:
  every group is a range group (``#0–262,143``), nested four deep.
* **mlp**: a micrograd-MLP-like graph, MLP(W, [W, W, 1]) written out as micrograd builds it: per
  neuron, its weights ``w{layer}.{neuron}.{input}`` and bias ``b{layer}.{neuron}`` (named leaves), the
  products ``w*x`` and the running sum from the bias (unnamed: each joins its first parent's group),
  then ``tanh``; the one output is named ``loss``. W is chosen so the graph has about N nodes.

Each graph gets its gradients (``graphsvc.backward``) before it is saved, so the value and gradient
overlays have numbers to aggregate.

Per round and graph, two whole processes, one after the other (so load on the shared machine falls
on both alike): the floor, ``python -m graphsvc validate FILE`` (start-up, load, structure check);
then a child that imports graphsvc, loads FILE, builds a ``ViewModel``, asks for the root's view,
the view with the root's first group open and that group's first subgroup open, a name search
(``w1.3``; on the chain, an op tag, ``relu``) and an id search (``#123456``). The child reports each
step's time and its peak resident memory (``ru_maxrss``). Reported: min / median / max over the
rounds of each step, and of the ratio of the child's whole process to validate's in the same round.
Targets: the ViewModel built within a few seconds of the load; each view under 0.1 s; a search
under 0.5 s. Writes benchmarks/results/bench_view.json and .md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
STEPS = ["load", "build", "view root", "view open", "search name", "search id"]


def mlp(nodes: int, seed: int = 0) -> Any:
    """The micrograd-MLP-like named graph of about ``nodes`` nodes (see the module docstring)."""
    from graphsvc.graph import FLOAT_DTYPE, INDEX_DTYPE, OFFSET_DTYPE, Graph

    width = max(2, int((nodes / 6) ** 0.5))
    rng = np.random.default_rng(seed)
    ops = ["leaf", "mul", "add", "tanh"]
    codes: list[np.ndarray] = []
    values: list[np.ndarray] = []
    parents: list[np.ndarray] = []  # per node, two parent ids (-1: none)
    names: dict[int, str] = {}
    n = 0

    def block(code: int, vals: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        nonlocal n
        ids = np.arange(n, n + len(vals), dtype=np.int64)
        codes.append(np.full(len(vals), code, dtype=np.uint16))
        values.append(vals)
        parents.append(np.stack([first, second], axis=1))
        n += len(vals)
        return ids

    none = np.full(width, -1, dtype=np.int64)
    x_ids = block(0, rng.uniform(-1.0, 1.0, width), none, none)
    x_vals = values[-1]
    for layer, outs in enumerate([width, width, 1], start=1):
        ins = len(x_ids)
        w_ids = block(0, rng.uniform(-1.0, 1.0, outs * ins), np.full(outs * ins, -1), np.full(outs * ins, -1))
        w_vals = values[-1].reshape(outs, ins)
        b_ids = block(0, rng.uniform(-1.0, 1.0, outs), np.full(outs, -1), np.full(outs, -1))
        b_vals = values[-1]
        for j in range(outs):
            names[int(b_ids[j])] = f"b{layer}.{j}"
            for k in range(ins):
                names[int(w_ids[j * ins + k])] = f"w{layer}.{j}.{k}"
        products = w_vals * x_vals[None, :]
        m_ids = block(1, products.ravel(), w_ids, np.tile(x_ids, outs)).reshape(outs, ins)
        sums = b_vals[:, None] + np.cumsum(products, axis=1)
        previous = np.concatenate([b_ids[:, None], np.zeros((outs, ins - 1), dtype=np.int64)], axis=1)
        first_add = n
        previous[:, 1:] = first_add + (np.arange(outs)[:, None] * ins + np.arange(ins - 1)[None, :])
        a_ids = block(2, sums.ravel(), previous.ravel(), m_ids.ravel()).reshape(outs, ins)
        x_vals = np.tanh(sums[:, -1])
        x_ids = block(3, x_vals, a_ids[:, -1], np.full(outs, -1))
    names[int(x_ids[0])] = "loss"
    code = np.concatenate(codes)
    pairs = np.concatenate(parents)
    counts = (pairs >= 0).sum(axis=1)
    offsets = np.zeros(n + 1, dtype=OFFSET_DTYPE)
    np.cumsum(counts, out=offsets[1:])
    return Graph(
        op_table=ops,
        op_codes=code,
        parent_offsets=offsets,
        parent_indices=pairs[pairs >= 0].astype(INDEX_DTYPE),
        values=np.concatenate(values).astype(FLOAT_DTYPE),
        names=names,
        outputs=[n - 1],
        metadata={"benchmark": "view-mlp", "width": width},
    )


def make(kind: str, nodes: int, folder: Path) -> Path:
    import graphsvc
    from benchmarks import graphs as G

    path = folder / f"{kind}-{nodes}.msgpack"
    if not path.exists():
        graph = G.chain(nodes) if kind == "chain" else mlp(nodes)
        graphsvc.save(graphsvc.backward(graph), path)
    return path


def child(path: str, kind: str) -> None:
    """One measured run in this process: print the times of :data:`STEPS` and the peak memory as JSON."""
    started = time.perf_counter()
    import graphsvc
    from graphsvc.view.model import ViewModel

    times: dict[str, float] = {}

    def timed(step: str, call: Any) -> Any:
        t = time.perf_counter()
        result = call()
        times[step] = time.perf_counter() - t
        return result

    graph = timed("load", lambda: graphsvc.load(path))
    model = timed("build", lambda: ViewModel(graph, files=[path]))
    root = timed("view root", lambda: model.view([]))
    first = next(item["id"] for item in root["items"] if item["kind"] == "group")
    opened = model.view([first])
    sub = next((item["id"] for item in opened["items"] if item["kind"] == "group" and item["id"] != first), None)
    shown = timed("view open", lambda: model.view([first] if sub is None else [first, sub]))
    found = timed("search name", lambda: model.search("relu" if kind == "chain" else "w1.3"))
    by_id = timed("search id", lambda: model.search("#123456"))
    json.dumps([root, shown, found, by_id, model.meta()], allow_nan=False)
    print(
        json.dumps(
            {
                "times": times,
                "whole": time.perf_counter() - started,
                "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "nodes": graph.num_nodes,
                "groups": model.meta()["groups"],
                "root_items": len(root["items"]),
                "open_items": len(shown["items"]),
            }
        )
    )


def run(command: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return seconds, done.stdout


def spread(xs: list[float], unit: float = 1.0) -> str:
    return f"{min(xs) * unit:.3g} / {statistics.median(xs) * unit:.3g} / {max(xs) * unit:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench_view.py", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000, help="about how many nodes each graph has")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per graph")
    parser.add_argument("--dir", type=Path, default=None, help="where the graphs are written (reused if there)")
    parser.add_argument("--no-write", action="store_true", help="print only; write nothing to benchmarks/results")
    parser.add_argument("--child", nargs=2, metavar=("FILE", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    env_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ["PYTHONPATH"] = env_path
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = {"nodes": args.nodes, "rounds": args.rounds, "load_average": os.getloadavg()}
        lines = [
            f"# graphsvc view: ViewModel next to `graphsvc validate` ({args.nodes:,} nodes, {args.rounds} rounds)",
            "",
            "min / median / max; times in ms, peak in MB; ratio = the child's whole process over validate's",
            "",
            "| graph | nodes | groups | validate | " + " | ".join(STEPS) + " | ratio | peak |",
            "|---" * (len(STEPS) + 6) + "|",
        ]
        for kind in ("chain", "mlp"):
            path = make(kind, args.nodes, folder)
            floors, wholes, peaks, ratios = [], [], [], []
            steps: dict[str, list[float]] = {step: [] for step in STEPS}
            report: dict[str, Any] = {}
            for _ in range(args.rounds):
                floor, _out = run([sys.executable, "-m", "graphsvc", "validate", str(path)])
                whole, out = run([sys.executable, str(Path(__file__).resolve()), "--child", str(path), kind])
                report = json.loads(out)
                floors.append(floor)
                wholes.append(whole)
                ratios.append(whole / floor)
                peaks.append(report["peak_bytes"])
                for step in STEPS:
                    steps[step].append(report["times"][step])
            results[kind] = {
                "nodes": report["nodes"],
                "groups": report["groups"],
                "validate_seconds": floors,
                "child_seconds": wholes,
                "ratios": ratios,
                "peak_bytes": peaks,
                "steps_seconds": steps,
            }
            cells = [spread(floors, 1e3), *(spread(steps[step], 1e3) for step in STEPS), spread(ratios)]
            lines.append(
                f"| {kind} | {report['nodes']:,} | {report['groups']:,} | "
                + " | ".join(cells)
                + f" | {spread([float(p) for p in peaks], 1e-6)} |"
            )
        text = "\n".join(lines) + "\n"
        print(text, end="")
        if not args.no_write:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "bench_view.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            (RESULTS / "bench_view.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
