"""The JSON form of a graph, read and written, as whole processes: graphsvc next to ``json``,
``orjson`` and ``msgspec`` on the same files in the same run.

Every alternative runs in a fresh ``python`` process of its own (started with ``os.posix_spawn``);
its wall time is the whole process's, start-up included, and the child reports the time of the
step itself and its peak resident memory (``VmHWM``, read from ``/proc/self/status`` at its end).
Peak memory per node is the peak minus that of a process that imports the same modules and does
nothing else (the first row of each table), over the graph's nodes.

Reading (a JSON file already in the page cache, to a result in memory):

* ``graphsvc.load``: the bytes read into the columns in C (``graphsvc.native._cjson``), checked,
  a Graph (what every command does with a JSON file).
* ``graphsvc.load, the long way``: the same call with the C reader turned off, so ``json.loads``
  and the document's checks run: how graphsvc read JSON before the C reader, and what it still
  does with a document the C reader does not take (a tensor graph's array objects, say).
* ``json.loads``, ``orjson.loads``, ``msgspec.json.decode`` of the file's bytes: a document of
  Python dicts and lists, nothing checked, no graph: the floor of reading into Python objects.

Writing (a graph loaded from its msgpack file, to a JSON file):

* ``graphsvc convert``: ``jsonio.chunks`` written to the file, as ``graphsvc convert --to json``
  writes it (a chunk of 65,536 nodes at a time).
* ``whole document, indented``: ``json.dumps(to_document(graph), indent=1)`` with arrays of numbers
  on one line, the bytes graphsvc wrote before it streamed (the same bytes as the row above).
* ``json.dumps``, ``orjson.dumps``, ``msgspec.json.encode`` of ``to_document(graph)`` (compact):
  what a user of those libraries would write (the document of dicts built first).
* Every row's process first loads the msgpack file; ``load msgpack`` is that alone.

Each round runs every alternative once, in the same order; a ratio is graphsvc's time (or peak)
over the other's within a round, and the tables give the median and, in parentheses, min and max
over the rounds. A missing ``orjson`` or ``msgspec`` is said and its rows left out.

    python benchmarks/bench_json.py                        # 1M, 2M, 5M-node chains and a tensor graph
    python benchmarks/bench_json.py --sizes 100000 --rounds 1 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

PEERS = ("orjson", "msgspec")

#: What each child runs, given the file's path as sys.argv[1] (and the output's as sys.argv[2]).
#: Each prints the seconds its step took.
PRELUDE = """
import sys, time, json
import numpy
import graphsvc
from graphsvc.format import jsonio
"""
READERS: dict[str, str] = {
    "start-up": "t = time.perf_counter()",
    "graphsvc.load": "t = time.perf_counter(); g = graphsvc.load(sys.argv[1])",
    "graphsvc.load, the long way": (
        "jsonio.read_columns = lambda data: None\nt = time.perf_counter(); g = graphsvc.load(sys.argv[1])"
    ),
    "json.loads": "t = time.perf_counter(); d = json.loads(open(sys.argv[1], 'rb').read())",
    "orjson.loads": "import orjson\nt = time.perf_counter(); d = orjson.loads(open(sys.argv[1], 'rb').read())",
    "msgspec.json.decode": (
        "import msgspec\nt = time.perf_counter(); d = msgspec.json.decode(open(sys.argv[1], 'rb').read())"
    ),
}
_LOADED = "g = graphsvc.load(sys.argv[1])\nt = time.perf_counter()\n"
WRITERS: dict[str, str] = {
    "load msgpack": _LOADED,
    "graphsvc convert": _LOADED
    + "with open(sys.argv[2], 'wb') as f:\n    for chunk in jsonio.chunks(g):\n        f.write(chunk)",
    "whole document, indented": _LOADED
    + "from graphsvc.text import json_escaped\n"
    + "text = json.dumps(jsonio.to_document(g), indent=1, ensure_ascii=False, allow_nan=False)\n"
    + "text = json_escaped(jsonio._FLAT_ARRAY.sub(jsonio._one_line, text)) + '\\n'\n"
    + "open(sys.argv[2], 'wb').write(text.encode())",
    "json.dumps": _LOADED
    + "open(sys.argv[2], 'wb').write(json.dumps(jsonio.to_document(g), ensure_ascii=False).encode())",
    "orjson.dumps": "import orjson\n" + _LOADED + "open(sys.argv[2], 'wb').write(orjson.dumps(jsonio.to_document(g)))",
    "msgspec.json.encode": "import msgspec\n"
    + _LOADED
    + "open(sys.argv[2], 'wb').write(msgspec.json.encode(jsonio.to_document(g)))",
}
#: The row each group's ratios are of, and the rows that are not alternatives (the floor of the process).
OURS = {"read": "graphsvc.load", "write": "graphsvc convert"}
BASE = {"read": "start-up", "write": "load msgpack"}


#: The child's last line: its peak resident memory in bytes, VmHWM of its own address space (the
#: ``ru_maxrss`` that ``wait4`` gives counts the parent's pages at the spawn too).
PEAK = "print(next(int(line.split()[1]) * 1024 for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n"


def run_child(code: str, *args: str) -> dict[str, float]:
    """One fresh process running ``PRELUDE + code``: its wall time, its step's time, its peak RSS (bytes)."""
    source = PRELUDE + code + "\nprint(time.perf_counter() - t)\n" + PEAK
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out_r, out_w = os.pipe()
    start = time.perf_counter()
    actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_CLOSE, out_r)]
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", source, *args], env, file_actions=actions)
    os.close(out_w)
    with os.fdopen(out_r) as stream:
        printed = stream.read()
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"a benchmark process failed ({status}):\n{source}")
    step, peak = printed.strip().splitlines()[-2:]
    return {"wall": wall, "step": float(step), "peak": float(peak)}


# -- the graphs ----------------------------------------------------------------------------------
def chain_graph(nodes: int) -> Any:
    """benchmarks/graphs.py's recurrent chain of ``nodes`` nodes, with a gradient per node."""
    from benchmarks import graphs

    graph = graphs.chain(nodes)
    graph.grads = graph.values * 0.5
    return graph


def tensor_graph(nodes: int = 200, side: int = 100) -> Any:
    """A chain of ``nodes`` float64 arrays of ``side`` x ``side`` (``tanh`` of the one before), each
    with a gradient: 2 x nodes x side^2 numbers."""
    import numpy as np

    from graphsvc.graph import GraphBuilder

    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.leaf(rng.standard_normal((side, side)), name="x")
    grads = {x: rng.standard_normal((side, side))}
    for _ in range(nodes - 1):
        value = np.tanh(rng.standard_normal((side, side)))
        x = b.add("tanh", [x], value=value)
        grads[x] = rng.standard_normal((side, side))
    graph = b.build()
    graph.grad_arrays = grads
    return graph


def make_files(folder: Path, sizes: list[int], tensors: bool) -> list[dict[str, Any]]:
    import graphsvc
    from graphsvc.format import jsonio

    made = []
    cases = [("chain", lambda n=n: chain_graph(n)) for n in sizes]
    if tensors:
        cases.append(("tensor chain, arrays of 100x100 float64 with gradients", tensor_graph))
    for i, (kind, make) in enumerate(cases):
        graph = make()
        label = f"{kind}, {graph.num_nodes:,} nodes"
        msgpack_path, json_path = folder / f"g{i}.msgpack", folder / f"g{i}.json"
        graphsvc.save(graph, msgpack_path)
        with open(json_path, "wb") as f:
            for chunk in jsonio.chunks(graph):
                f.write(chunk)
        made.append(
            {
                "graph": label,
                "nodes": graph.num_nodes,
                "msgpack": msgpack_path,
                "json": json_path,
                "json_bytes": json_path.stat().st_size,
            }
        )
        del graph
    return made


# -- the run -------------------------------------------------------------------------------------
def measure(case: dict[str, Any], rounds: int, peers: list[str], out: Path, write: bool) -> dict[str, Any]:
    groups: dict[str, dict[str, list[dict[str, float]]]] = {"read": {}, "write": {}}
    readers = {k: v for k, v in READERS.items() if not any(p in k for p in PEERS if p not in peers)}
    writers = {k: v for k, v in WRITERS.items() if not any(p in k for p in PEERS if p not in peers)}
    for _ in range(rounds):
        for name, code in readers.items():
            groups["read"].setdefault(name, []).append(run_child(code, str(case["json"])))
            print(f"  {case['graph']}: read {name}: {groups['read'][name][-1]['wall']:.2f} s", flush=True)
        if write:
            for name, code in writers.items():
                groups["write"].setdefault(name, []).append(run_child(code, str(case["msgpack"]), str(out)))
                print(f"  {case['graph']}: write {name}: {groups['write'][name][-1]['wall']:.2f} s", flush=True)
                out.unlink(missing_ok=True)
    return {key: value for key, value in case.items() if key not in ("msgpack", "json")} | {"runs": groups}


def summary(case: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """Per alternative: median wall, step and peak; peak per node above the group's floor; the ratios
    of graphsvc's wall and peak to it within each round (median, min, max)."""
    runs = case["runs"][group]
    if not runs:
        return []
    ours, base = runs[OURS[group]], runs[BASE[group]]
    rows = []
    for name, alternative in runs.items():
        rounds = len(alternative)
        over = [alternative[r]["peak"] - base[r]["peak"] for r in range(rounds)]
        walls = [ours[r]["wall"] / alternative[r]["wall"] for r in range(rounds)]
        peaks = [ours[r]["peak"] / alternative[r]["peak"] for r in range(rounds)]
        rows.append(
            {
                "alternative": name,
                "wall_s": statistics.median(x["wall"] for x in alternative),
                "step_s": statistics.median(x["step"] for x in alternative),
                "peak_bytes": statistics.median(x["peak"] for x in alternative),
                "peak_over_floor_per_node": statistics.median(over) / case["nodes"],
                "peak_over_floor_per_json_byte": statistics.median(over) / case["json_bytes"],
                "wall_ratio": [statistics.median(walls), min(walls), max(walls)],
                "peak_ratio": [statistics.median(peaks), min(peaks), max(peaks)],
            }
        )
    return rows


def ratio(r: list[float]) -> str:
    return f"{r[0]:.3f}x ({r[1]:.3f}-{r[2]:.3f})"


def report(results: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        "# The JSON form: graphsvc next to json, orjson and msgspec",
        "",
        f"Run {info['date']} with `{info['command']}` ({info['seconds']:.0f} s).",
        "",
        f"Machine: {info['machine']}; Python {info['python']}, {info['versions']}; graphsvc at {info['commit']}. "
        f"{info['rounds']} rounds. Load average at the start: {info['load_average']}. "
        "Method: the docstring of `benchmarks/bench_json.py`. Wall: the whole process, start-up included; "
        "step: the call alone, timed inside the process; peak: the process's peak resident memory; "
        "per node: the peak above the first row's (the process without the step), over the nodes. "
        "Ratios: graphsvc's row over each row within a round, median (min-max).",
    ]
    for case in results:
        lines += ["", f"## {case['graph']}: {case['json_bytes']:,} bytes of JSON"]
        for group, title in (("read", "Reading the JSON file"), ("write", "Writing the JSON file")):
            rows = summary(case, group)
            if not rows:
                continue
            lines += [
                "",
                f"### {title}",
                "",
                "| alternative | wall | step | peak | per node | per byte of JSON | graphsvc's wall / it | "
                "graphsvc's peak / it |",
                "|---|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for row in rows:
                lines.append(
                    f"| {row['alternative']} | {row['wall_s']:.2f} s | {row['step_s']:.2f} s | "
                    f"{row['peak_bytes'] / 2**20:,.0f} MiB | {row['peak_over_floor_per_node']:,.0f} B | "
                    f"{row['peak_over_floor_per_json_byte']:.2f} | {ratio(row['wall_ratio'])} | "
                    f"{ratio(row['peak_ratio'])} |"
                )
    return "\n".join(lines) + "\n"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "graphsvc", "csrc"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    versions = []
    for name in ("numpy", *PEERS):
        try:
            versions.append(f"{name} {importlib.import_module(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    return {
        "machine": f"{cpu}, {os.cpu_count()} cores; {platform.platform()}",
        "python": platform.python_version(),
        "versions": ", ".join(versions),
        "commit": commit + (" + uncommitted changes" if dirty else ""),
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


import importlib  # noqa: E402  (after sys.path is set: graphsvc from this checkout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 2_000_000, 5_000_000])
    parser.add_argument("--rounds", type=int, default=3, help="rounds for graphs under 5M nodes (default 3)")
    parser.add_argument("--big-rounds", type=int, default=1, help="rounds for graphs of 5M nodes or more (default 1)")
    parser.add_argument("--no-tensors", action="store_true", help="leave out the tensor graph")
    parser.add_argument("--no-writing", action="store_true", help="time reading only")
    parser.add_argument("--no-write", action="store_true", help="print the tables; write nothing into results/")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (default: the temp folder)")
    args = parser.parse_args(argv)
    peers = [name for name in PEERS if importlib.util.find_spec(name) is not None]
    for name in PEERS:
        if name not in peers:
            print(f"{name} is not installed (pip install -e '.[bench]'): its rows are left out", file=sys.stderr)
    started = time.time()
    info = machine()
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch)
        for case in make_files(folder, args.sizes, not args.no_tensors):
            rounds = args.big_rounds if case["nodes"] >= 5_000_000 else args.rounds
            results.append(measure(case, rounds, peers, folder / "out.json", not args.no_writing))
            case["json"].unlink()
            case["msgpack"].unlink()
    info |= {
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "command": " ".join(["python benchmarks/bench_json.py", *(argv if argv is not None else sys.argv[1:])]),
        "seconds": time.time() - started,
        "rounds": f"{args.rounds} (5M nodes and more: {args.big_rounds})",
    }
    text = report(results, info)
    print(text)
    if not args.no_write:
        (HERE / "results" / "bench_json.md").write_text(text)
        for case in results:
            case["summary"] = {group: summary(case, group) for group in ("read", "write")}
        (HERE / "results" / "bench_json.json").write_text(json.dumps({**info, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
