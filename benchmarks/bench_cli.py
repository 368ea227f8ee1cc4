"""Printing every node from the command line: graphsvc's CLI next to micrograd's own printing.

    python benchmarks/bench_cli.py [--repeat K] [--width W] [--nodes N]

Needs micrograd (``pip install micrograd==0.1.0``). Writes benchmarks/results/bench_cli.json.

* **graphsvc**: ``graphsvc order FILE``, ``graphsvc backward FILE`` and the same with ``--json``,
  each a whole process (start-up, load, replay, printing), stdout to /dev/null; wall time and the
  process's peak resident memory, min / median / max over K runs.
* **micrograd**: printing the same MLP graph the way a micrograd user would: ``build_topo`` (with the
  recursion limit raised), ``backward()``, then ``print(v)`` for each node in reverse order, to
  /dev/null. Only the printing is timed (the graph is already built; ``backward()`` is not timed), so
  the comparison favours micrograd.
* **scale**: the commands again on the wide random DAG of N nodes (1,000,000 by default), reported
  per node, which is what decides whether printing ten million nodes is usable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks import graphs  # noqa: E402
from benchmarks.run import stats  # noqa: E402

COMMANDS = (["order"], ["backward"], ["order", "--json"], ["backward", "--json"])


#: Runs the command given as its arguments and prints its wall seconds and peak resident bytes. A
#: small fresh process starts it, so the peak is the command's own: a child forked straight from this
#: benchmark (which holds micrograd's graph) would report this process's memory as its peak.
TRAMPOLINE = """
import os, resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
elapsed = time.perf_counter() - start
print(code, elapsed, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def run_cli(command: list[str], path: Path) -> tuple[float, int]:
    """Wall seconds and peak resident bytes of one ``graphsvc`` process, stdout discarded."""
    argv = [sys.executable, "-m", "graphsvc", command[0], str(path), *command[1:]]
    report = subprocess.run([sys.executable, "-c", TRAMPOLINE, *argv], capture_output=True, text=True, check=True)
    code, elapsed, peak = report.stdout.split()
    if code != "0":
        raise SystemExit(f"{' '.join(argv)} exited with {code}")
    return float(elapsed), int(peak)


def measure(command: list[str], path: Path, repeat: int) -> dict[str, Any]:
    runs = [run_cli(command, path) for _ in range(repeat)]
    return {"seconds": stats([t for t, _ in runs]), "peak_bytes": max(m for _, m in runs)}


def micrograd_print(root: Any, repeat: int) -> dict[str, float]:
    sys.setrecursionlimit(1_000_000)
    topo = graphs.micrograd_build_topo(root)
    root.backward()
    times = []
    with open(os.devnull, "w") as sink:
        for _ in range(repeat):
            start = time.perf_counter()
            for v in reversed(topo):
                print(v, file=sink)
            times.append(time.perf_counter() - start)
    return stats(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    args = parser.parse_args()
    results: dict[str, Any] = {"repeat": args.repeat}
    with tempfile.TemporaryDirectory(prefix="graphsvc-bench-cli-") as folder:
        root = graphs.micrograd_mlp(args.width)[1]
        mlp_graph, _ = graphs.from_micrograd(root)
        mlp_path = Path(folder) / "mlp.msgpack"
        graphsvc.save(mlp_graph, mlp_path)
        dag_path = Path(folder) / "dag.msgpack"
        graphsvc.save(graphs.dag(args.nodes), dag_path)
        mlp_nodes = mlp_graph.num_nodes
        micrograd = micrograd_print(root, args.repeat)
        results["mlp"] = {"nodes": mlp_nodes, "micrograd print loop": micrograd}
        print(f"MLP, {mlp_nodes:,} nodes: micrograd printing its nodes {micrograd['median']:.2f} s")
        for command in COMMANDS:
            got = measure(command, mlp_path, args.repeat)
            results["mlp"][" ".join(command)] = got
            ratio = micrograd["median"] / got["seconds"]["median"]
            print(
                f"  graphsvc {' '.join(command):16} {got['seconds']['median']:.2f} s (whole process), "
                f"{got['peak_bytes'] / 2**20:.0f} MiB peak; micrograd's print loop / graphsvc = {ratio:.2f}x"
            )
        results["dag"] = {"nodes": args.nodes}
        print(f"random DAG, {args.nodes:,} nodes:")
        for command in COMMANDS:
            got = measure(command, dag_path, args.repeat)
            results["dag"][" ".join(command)] = got
            print(
                f"  graphsvc {' '.join(command):16} {got['seconds']['median']:.2f} s, "
                f"{got['seconds']['median'] / args.nodes * 1e6:.2f} us/node, "
                f"{got['peak_bytes'] / args.nodes:.0f} bytes/node peak"
            )
    out = HERE / "results" / "bench_cli.json"
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
