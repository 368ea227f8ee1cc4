"""``graphsvc diff`` on two graphs of a million nodes, next to ``graphsvc validate`` of both.

    python benchmarks/bench_diff.py [--nodes N] [--rounds R] [--dir DIR] [--no-write]

Three pairs of the recurrent chain of benchmarks/graphs.py (``mul, add, relu`` per step, about N
nodes, 1,000,000 by default, with gradients), written to DIR (a temporary folder by default):

* **identical**: the graph and a copy of it (diff's fast path: one structure, numbers compared);
* **one leaf**: the second run's input ``x0`` changed by one part in a million and replayed: every
  value and gradient downstream differs, the first divergence is the first op;
* **one op**: the op of the node in the middle changed (``add`` for ``mul`` or back): the
  structures differ, so diff aligns the nodes by walking from the outputs (in C), and everything
  the changed node depends on stays unaligned.

Per round and pair, whole processes one after the other (load on the shared machine falls on both
alike): the floor, ``graphsvc validate A`` then ``graphsvc validate B``; then ``graphsvc diff A B``
(exit 0 or 1 as expected, or the run fails). Reported: min / median / max over the rounds of each
time and of the ratio of diff to the floor in the same round. Target: at most 3x. Writes
benchmarks/results/bench_diff.json and .md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
#: The pairs, and the exit code diff must give on each.
PAIRS = {"identical": 0, "one leaf": 1, "one op": 1}


def write_pairs(nodes: int, folder: Path) -> dict[str, tuple[Path, Path]]:
    import graphsvc
    from benchmarks import graphs

    base = graphsvc.backward(graphs.chain(nodes))
    a = folder / "a.msgpack"
    graphsvc.save(base, a)
    files = {"identical": (a, a)}
    nudged = base.copy()
    values = nudged.values.copy()
    values[0] *= 1 + 1e-6
    nudged.values = values
    leaf = folder / "leaf.msgpack"
    graphsvc.save(graphsvc.backward(nudged), leaf)
    files["one leaf"] = (a, leaf)
    changed = base.copy()
    middle = changed.num_nodes // 2
    table = list(changed.op_table)
    swap = "add" if changed.op(middle) != "add" else "mul"
    if swap not in table:
        table.append(swap)
    codes = changed.op_codes.copy()
    codes[middle] = table.index(swap)
    changed.op_table, changed.op_codes = table, codes
    op = folder / "op.msgpack"
    graphsvc.save(changed, op)
    files["one op"] = (a, op)
    return files


def timed(args: list[str], expect: int) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "graphsvc", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"graphsvc {' '.join(args)} exited {done.returncode}, not {expect}: {done.stderr.strip()}")
    return elapsed


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of each graph (about)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each measurement")
    parser.add_argument("--dir", type=Path, default=None, help="where the graph files go (default: a temporary folder)")
    parser.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/bench_diff.*")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.dir or Path(scratch)
        files = write_pairs(options.nodes, folder)
        rows = {}
        for name, (a, b) in files.items():
            floors, diffs, ratios = [], [], []
            for _ in range(options.rounds):
                floor = timed(["validate", str(a)], 0) + timed(["validate", str(b)], 0)
                took = timed(["diff", str(a), str(b)], PAIRS[name])
                floors.append(floor)
                diffs.append(took)
                ratios.append(took / floor)
            rows[name] = {"validate A + B s": floors, "diff s": diffs, "diff / validate": ratios}
    lines = [
        f"graphsvc diff on two chains of {options.nodes:,} nodes, {options.rounds} rounds, min / median / max",
        "",
        "| pair | validate A + B (s) | diff A B (s) | diff / validate |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | {' | '.join(spread(xs) for xs in row.values())} |")
    print("\n".join(lines))
    if not options.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_diff.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (RESULTS / "bench_diff.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
