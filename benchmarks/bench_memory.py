"""Peak memory out of proportion to the file: whole processes, peak RSS per node and per byte of file.

Two graphs of N nodes (default 1,000,000), each next to the baseline a user would compare it with:

- ``empty``: a chain ``x -> neg -> neg ...`` whose every node holds an empty float32 array as its
  value and its gradient (a tensor table of 2N entries and no data), loaded (``graphsvc.load``);
  next to the same chain holding float64 scalars (``scalars``: no tensor table), loaded;
- ``chain``: benchmarks/graphs.py's recurrent chain of N ops (float64 scalars), ``graphsvc
  backward`` next to ``graphsvc backward --steps`` (every step of the pass printed, to /dev/null).

Each step runs in its own process (``--child``), which runs the measured command as its only child
and reports that child's peak resident set (``ru_maxrss`` of ``RUSAGE_CHILDREN``) and wall time;
``floor`` is ``python -c "import graphsvc, numpy"``, the interpreter's own. The table gives the
peak, the peak per node and per byte of the file, and the ratio to the baseline. Writes
``results/bench_memory.json`` and ``.md`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def build(nodes: int, directory: Path) -> dict[str, Path]:
    """The three graph files, built once into ``directory`` (reused when there)."""
    import numpy as np

    import graphsvc
    from benchmarks import graphs as G
    from graphsvc import GraphBuilder

    files = {name: directory / f"{name}-{nodes}.msgpack" for name in ("empty", "scalars", "chain")}
    if not files["empty"].exists():
        b = GraphBuilder()
        empty = np.empty((0,), np.float32)
        node = b.leaf(empty, name="x", grad=empty)
        for _ in range(nodes - 1):
            node = b.add("neg", [node], value=empty, grad=empty)
        graphsvc.save(b.build(), files["empty"])
    if not files["scalars"].exists():
        b = GraphBuilder()
        node = b.leaf(1.0, name="x", grad=1.0)
        for i in range(nodes - 1):
            node = b.add("neg", [node], value=float((-1) ** (i + 1)), grad=1.0)
        graphsvc.save(b.build(), files["scalars"])
    if not files["chain"].exists():
        graphsvc.save(G.chain(nodes), files["chain"])
    return files


def child(command: list[str]) -> None:
    """Run ``command`` (its output to /dev/null) as this process's only child; print its peak RSS and time."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, cwd=ROOT, check=False)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"returncode": done.returncode, "peak_bytes": peak, "seconds": seconds}))


def measure(command: list[str]) -> dict[str, Any]:
    """``command``'s peak RSS and wall time, from a fresh process of :func:`child`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--", *command], cwd=ROOT, env=env, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    if result["returncode"] != 0:
        raise SystemExit(f"{command} exited {result['returncode']}: {out.stderr}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench_memory.py", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of each graph (default 1,000,000)")
    parser.add_argument("--dir", type=Path, default=None, help="where the graph files are kept (default: a temp dir)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results/ files")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.command)
        return
    with tempfile.TemporaryDirectory() as temporary:
        directory = args.dir or Path(temporary)
        directory.mkdir(parents=True, exist_ok=True)
        files = build(args.nodes, directory)
        py, cli = sys.executable, [sys.executable, "-m", "graphsvc", "-q"]
        load = "import sys, graphsvc; graph = graphsvc.load(sys.argv[1])"
        steps = {
            "floor": ([py, "-c", "import graphsvc, numpy"], None),
            "load empty": ([py, "-c", load, str(files["empty"])], "empty"),
            "load scalars": ([py, "-c", load, str(files["scalars"])], "scalars"),
            "backward": ([*cli, "backward", str(files["chain"])], "chain"),
            "backward --steps": ([*cli, "backward", str(files["chain"]), "--steps"], "chain"),
        }
        rows: dict[str, dict[str, Any]] = {}
        for name, (command, file) in steps.items():
            result = measure(command)
            size = files[file].stat().st_size if file else 0
            rows[name] = {"file": file, "file_bytes": size, **result}
    floor = rows["floor"]["peak_bytes"]
    for name, baseline in (("load empty", "load scalars"), ("backward --steps", "backward")):
        rows[name]["baseline"] = baseline
        rows[name]["ratio_to_baseline"] = rows[name]["peak_bytes"] / rows[baseline]["peak_bytes"]
    lines = [
        f"nodes: {args.nodes:,}; {platform.machine()}, Python {platform.python_version()}",
        "",
        "| step | file MB | peak MB | peak per node | above the floor per node | peak / file | / baseline |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        peak, size = row["peak_bytes"], row["file_bytes"]
        versus = f"{row['ratio_to_baseline']:.2f}x {row['baseline']}" if "baseline" in row else ""
        lines.append(
            f"| {name} | {size / 1e6:.1f} | {peak / 1e6:.0f} | {peak / args.nodes:,.0f} B | "
            f"{(peak - floor) / args.nodes:,.0f} B | {peak / size if size else 0:.1f}x | {versus} |"
        )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_memory.json").write_text(json.dumps({"nodes": args.nodes, "rows": rows}, indent=1) + "\n")
        (RESULTS / "bench_memory.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
