"""graphsvc's command line as whole processes: start-up on a small graph, and printing every node.

    python benchmarks/bench_cli.py [--only startup|listing] [--rounds R] [--repeat K] [--width W] [--nodes N]

Needs micrograd (``pip install micrograd==0.1.0``). Writes benchmarks/results/bench_cli.json (each
part updates its own keys) and the tables benchmarks/results/bench_cli_startup.md and
benchmarks/results/bench_cli_listing.md. ``--nodes 0`` leaves out the random DAG.

Start-up (targets: any command on a graph under 10,000 nodes at most 2x ``python -c "import typer"``,
``graphsvc --help`` at most 1.5x):

* ``python -c "import typer"``, ``python -c "import typer, numpy"`` (the floor of any command that
  reads a graph into numpy columns), ``graphsvc --help``, ``--version``, ``order``, ``inspect``,
  ``validate``, ``backward``, ``forward`` on examples/seed004.msgpack (7 nodes), ``graphsvc ops``,
  and a micrograd script that builds seed 004's expression, ``L = (a*b + c)*(a + b)``, differentiates
  it and prints it (:data:`MICROGRAD_SEED004`), each a whole process, R rounds (15 by default). Every
  round runs every command once, in a fresh random order, so drift on a shared machine falls on all of
  them alike. ``graphsvc`` is the console script installed next to this Python (not a pyenv shim).
  The installed example plugins are found and loaded as a user's would be.
* Wall time (min / median / max) and the child's CPU time (user + system, median; less sensitive to
  other processes on the machine than wall time); ratios are medians over ``import typer``'s median,
  and per round (the command's time over ``import typer``'s in the same round: min / median / max).
  The load average at the start is recorded with the figures.
* The processes run with byte-compiled modules, as an installed wheel does (pip compiles them at
  install): ``PYTHONDONTWRITEBYTECODE`` is removed from their environment and ``PYTHONPYCACHEPREFIX``
  points at a temporary folder, warmed by one untimed run of each command. (Without that, every run
  would compile cli.py and graphsvc's modules from source.)

Printing every node (the listing part):

* **graphsvc**: ``graphsvc order FILE``, ``graphsvc backward FILE`` and the same with ``--json``,
  each a whole process (start-up, load, replay, printing), stdout to /dev/null, with byte-compiled
  modules as for start-up; wall time and the process's peak resident memory, min / median / max over
  K rounds.
* **micrograd**: printing the same MLP graph the way a micrograd user would: ``build_topo`` (with the
  recursion limit raised), ``backward()``, then ``print(v)`` for each node in reverse order, to
  /dev/null. Only the printing is timed (the graph is already built; ``backward()`` is not timed), so
  the comparison favours micrograd.
* Each round runs micrograd's loop once, then each command once, so load on the shared machine falls
  on all of them alike; the speed-up (micrograd's loop / graphsvc's process) is taken within each
  round and reported as min / median / max over the rounds.
* **scale**: the commands again on the wide random DAG of N nodes (1,000,000 by default), reported
  per node, which is what decides whether printing ten million nodes is usable.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
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
from benchmarks.run import startup_env, stats  # noqa: E402

COMMANDS = (["order"], ["backward"], ["order", "--json"], ["backward", "--json"])


#: Runs the command given as its arguments and prints its wall seconds and peak resident bytes. A
#: small fresh process starts it, so the peak is the command's own: a child forked straight from this
#: benchmark (which holds micrograd's graph) would report this process's memory as its peak.
TRAMPOLINE = """
import os, resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
elapsed = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(code, elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)
"""


def run_cli(command: list[str], path: Path, env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """Wall seconds, peak resident bytes and CPU seconds (user + system, every thread) of one
    ``graphsvc`` process, stdout discarded."""
    argv = [sys.executable, "-m", "graphsvc", command[0], str(path), *command[1:]]
    # run from /tmp, not the checkout: ``python -m`` puts the working folder first on sys.path, which
    # would hide a variant's PYTHONPATH
    report = subprocess.run(
        [sys.executable, "-c", TRAMPOLINE, *argv],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    code, elapsed, peak, cpu = report.stdout.split()
    if code != "0":
        raise SystemExit(f"{' '.join(argv)} exited with {code}")
    return float(elapsed), int(peak), float(cpu)


def measure(command: list[str], path: Path, repeat: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    run_cli(command, path, env)  # untimed: writes the byte-compiled modules
    runs = [run_cli(command, path, env) for _ in range(repeat)]
    return {"seconds": stats([t for t, _, _ in runs]), "peak_bytes": max(m for _, m, _ in runs)}


def micrograd_topo(root: Any) -> list[Any]:
    """micrograd's graph as its user prints it: ``build_topo`` (recursion limit raised), ``backward()``."""
    sys.setrecursionlimit(1_000_000)
    topo = graphs.micrograd_build_topo(root)
    root.backward()
    return topo


def micrograd_print(topo: list[Any]) -> tuple[float, float]:
    """Wall and CPU seconds of one ``print(v)`` for every node, in reverse order, to /dev/null."""
    with open(os.devnull, "w") as sink:
        start, cpu = time.perf_counter(), time.process_time()
        for v in reversed(topo):
            print(v, file=sink)
        return time.perf_counter() - start, time.process_time() - cpu


# -- start-up on a small graph -------------------------------------------------------------------------
SEED004 = HERE.parent / "examples" / "seed004.msgpack"

#: micrograd building seed 004's expression, differentiating it and printing the four values.
MICROGRAD_SEED004 = """
from micrograd.engine import Value
a, b, c = Value(2.0), Value(3.0), Value(1.0)
L = (a * b + c) * (a + b)
L.backward()
for v in (L, a, b, c):
    print(v)
"""

BASELINE = "python -c 'import typer'"
FLOOR = "python -c 'import typer, numpy'"
#: The issue's ceilings, as a ratio to ``import typer``'s median.
CEILINGS = {"graphsvc --help": 1.5}
DEFAULT_CEILING = 2.0


def console_script() -> str:
    """The ``graphsvc`` script installed beside this Python (a pyenv shim would add a bash start-up)."""
    beside = Path(sys.executable).parent / "graphsvc"
    found = str(beside) if beside.exists() else shutil.which("graphsvc")
    if found is None:
        raise SystemExit("graphsvc's console script is not installed (pip install -e .)")
    return found


def startup_commands() -> dict[str, list[str]]:
    graphsvc_cmd = console_script()
    seed = str(SEED004)
    commands = {BASELINE: [sys.executable, "-c", "import typer"]}
    # what any command that touches a graph's numpy columns cannot go below
    commands[FLOOR] = [sys.executable, "-c", "import typer, numpy"]
    commands["graphsvc --help"] = [graphsvc_cmd, "--help"]
    commands["graphsvc --version"] = [graphsvc_cmd, "--version"]
    for name in ("order", "inspect", "validate", "backward", "forward"):
        commands[f"graphsvc {name} seed004"] = [graphsvc_cmd, name, seed]
    commands["graphsvc ops"] = [graphsvc_cmd, "ops"]
    commands["micrograd script (seed 004)"] = [sys.executable, "-c", MICROGRAD_SEED004]
    return commands


def run_timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one process, its output discarded."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=HERE.parent)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read() if process.stderr is not None else b""
    if process.stderr is not None:
        process.stderr.close()
    if process.returncode != 0 or stderr:
        raise SystemExit(f"{' '.join(argv)} exited with {process.returncode}: {stderr.decode(errors='replace')}")
    return elapsed, usage.ru_utime + usage.ru_stime


def startup(rounds: int, variants: dict[str, str]) -> dict[str, Any]:
    """Time the start-up commands; ``variants`` maps a label to a ``PYTHONPATH`` under which every
    command runs again, in the same rounds (another checkout, another typer), as "command [label]"."""
    plain = startup_commands()
    commands = {name: (argv, "") for name, argv in plain.items()}
    for label, pythonpath in variants.items():
        for name, argv in plain.items():
            if name.startswith("graphsvc") or name == BASELINE:
                commands[f"{name} [{label}]"] = (argv, pythonpath)
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    shuffle = random.Random(13)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="graphsvc-bench-pycache-") as pycache:
        env = startup_env(Path(pycache))
        envs = {path: {**env, "PYTHONPATH": path} if path else env for path in {"", *variants.values()}}
        for argv, path in commands.values():  # untimed: writes the byte-compiled modules
            run_timed(argv, envs[path])
        for _ in range(rounds):
            shuffle.shuffle(order)
            for name in order:
                argv, path = commands[name]
                elapsed, used = run_timed(argv, envs[path])
                wall[name].append(elapsed)
                cpu[name].append(used)
    base = statistics.median(wall[BASELINE])
    base_cpu = statistics.median(cpu[BASELINE])
    results: dict[str, Any] = {
        "rounds": rounds,
        "typer": _version("typer"),
        "variants": variants,
        "load average": load,
        "commands": {},
    }
    for name in commands:
        ratio = statistics.median(wall[name]) / base
        ceiling = CEILINGS.get(name, DEFAULT_CEILING) if name in plain and name.startswith("graphsvc") else None
        results["commands"][name] = {
            "wall": stats(wall[name]),
            "cpu": stats(cpu[name]),
            "ratio": ratio,
            # the command's time over import typer's in the same round
            "round ratios": stats([t / b for t, b in zip(wall[name], wall[BASELINE], strict=True)]),
            "cpu ratio": statistics.median(cpu[name]) / base_cpu,
            "ceiling": ceiling,
        }
    return results


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def startup_table(results: dict[str, Any]) -> str:
    lines = [
        f"Whole processes, {results['rounds']} rounds, typer {results['typer']}, Python "
        f"{sys.version.split()[0]}, load average at the start {_load_text(results.get('load average'))}; "
        f"ratio = median / median of `{BASELINE}`; per round: the command's time / `{BASELINE}`'s in the same "
        "round (min / median / max).",
        *(f"[{label}]: the same command with PYTHONPATH={path}" for label, path in results["variants"].items()),
        "",
        "| command | wall min | median | max | ratio | per round | CPU median | CPU ratio | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, got in results["commands"].items():
        w, c = got["wall"], got["cpu"]
        ceiling = got["ceiling"]
        target = "" if ceiling is None else f"<= {ceiling}x: {'met' if got['ratio'] <= ceiling else 'MISSED'}"
        r = got.get("round ratios")
        per_round = "" if r is None else f"{r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}x"
        lines.append(
            f"| `{name}` | {w['min'] * 1e3:.0f} ms | {w['median'] * 1e3:.0f} ms | {w['max'] * 1e3:.0f} ms "
            f"| {got['ratio']:.2f}x | {per_round} | {c['median'] * 1e3:.0f} ms | {got['cpu ratio']:.2f}x | {target} |"
        )
    return "\n".join(lines) + "\n"


def _load_text(load: Any) -> str:
    return "?" if not load else " / ".join(f"{x:.2f}" for x in load) + f" (1 / 5 / 15 min, {os.cpu_count()} cores)"


def listing_table(results: dict[str, Any]) -> str:
    mlp = results["mlp"]
    loop = mlp["micrograd print loop"]
    lines = [
        f"MLP({results.get('width', '?')}), {mlp['nodes']:,} nodes; {results['repeat']} rounds, load average at the "
        f"start {_load_text(results.get('load average'))}. micrograd's loop of `print(v)` over the built, "
        f"differentiated graph: {loop['min']:.2f} / {loop['median']:.2f} / {loop['max']:.2f} s (min / median / max; "
        f"CPU median {mlp['micrograd cpu']['median']:.2f} s). "
        "Speed-up = micrograd's loop / graphsvc's whole process, in the same round (target: at least 2x).",
        "",
        *(f"[{label}]: the same command with PYTHONPATH={path}" for label, path in results["variants"].items()),
        "",
        "CPU: the process's user + system seconds, every thread (numpy's OpenBLAS threads included), "
        "next to micrograd's loop's; less sensitive to the other processes on the machine.",
        "",
        "| `graphsvc ... FILE > out` | wall min | median | max | peak memory | speed-up min | median | max "
        "| CPU median | CPU speed-up min / median / max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in results["mlp commands"]:
        got = mlp[name]
        s, up, cpu_up = got["seconds"], got["speedup"], got["cpu speedup"]
        lines.append(
            f"| `graphsvc {name}` | {s['min']:.2f} s | {s['median']:.2f} s | {s['max']:.2f} s "
            f"| {got['peak_bytes'] / 2**20:.0f} MiB | {up['min']:.2f}x | {up['median']:.2f}x | {up['max']:.2f}x "
            f"| {got['cpu']['median']:.2f} s | {cpu_up['min']:.2f} / {cpu_up['median']:.2f} / {cpu_up['max']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


# -- printing every node --------------------------------------------------------------------------------
def listing(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "repeat": args.repeat,
        "width": args.width,
        "variants": args.variants,
        "load average": os.getloadavg(),
    }
    with (
        tempfile.TemporaryDirectory(prefix="graphsvc-bench-cli-") as folder,
        tempfile.TemporaryDirectory(prefix="graphsvc-bench-pycache-") as pycache,
    ):
        env = startup_env(Path(pycache))  # byte-compiled modules, as for start-up
        root = graphs.micrograd_mlp(args.width)[1]
        mlp_graph, _ = graphs.from_micrograd(root)
        mlp_path = Path(folder) / "mlp.msgpack"
        graphsvc.save(mlp_graph, mlp_path)
        dag_path = Path(folder) / "dag.msgpack"
        if args.nodes:
            graphsvc.save(graphs.dag(args.nodes), dag_path)
        mlp_nodes = mlp_graph.num_nodes
        topo = micrograd_topo(root)
        # every command, and again under each variant's PYTHONPATH (as "command [label]")
        envs = {" ".join(command): (command, env) for command in COMMANDS}
        for label, pythonpath in args.variants.items():
            envs.update({f"{' '.join(c)} [{label}]": (c, {**env, "PYTHONPATH": pythonpath}) for c in COMMANDS})
        for command, command_env in envs.values():  # untimed: writes the byte-compiled modules
            run_cli(command, mlp_path, command_env)
        # rounds: micrograd's loop, then each command once, so load on the shared machine falls on
        # all of them alike; the ratio is taken within each round
        loop: list[float] = []
        loop_cpu: list[float] = []
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in envs}
        for _ in range(args.repeat):
            wall, cpu = micrograd_print(topo)
            loop.append(wall)
            loop_cpu.append(cpu)
            for name, (command, command_env) in envs.items():
                runs[name].append(run_cli(command, mlp_path, command_env))
        results["mlp"] = {"nodes": mlp_nodes, "micrograd print loop": stats(loop), "micrograd cpu": stats(loop_cpu)}
        results["mlp commands"] = list(runs)
        print(f"MLP, {mlp_nodes:,} nodes: micrograd printing its nodes {statistics.median(loop):.2f} s (median)")
        for name, timed in runs.items():
            seconds = [t for t, _, _ in timed]
            speedups = [m / t for m, t in zip(loop, seconds, strict=True)]
            cpu_speedups = [m / c for m, (_, _, c) in zip(loop_cpu, timed, strict=True)]
            results["mlp"][name] = {
                "seconds": stats(seconds),
                "peak_bytes": max(m for _, m, _ in timed),
                "speedup": stats(speedups),  # micrograd's loop / graphsvc, per round
                "cpu": stats([c for _, _, c in timed]),
                "cpu speedup": stats(cpu_speedups),  # the same in CPU seconds
            }
            print(
                f"  graphsvc {name:16} {statistics.median(seconds):.2f} s (whole process), "
                f"{max(m for _, m, _ in timed) / 2**20:.0f} MiB peak; micrograd's print loop / graphsvc per round: "
                f"min {min(speedups):.2f}x, median {statistics.median(speedups):.2f}x, max {max(speedups):.2f}x"
            )
        markdown = HERE / "results" / "bench_cli_listing.md"
        markdown.write_text(
            "# Printing every node of micrograd's MLP (benchmarks/bench_cli.py)\n\n" + listing_table(results),
            encoding="utf-8",
        )
        print(f"wrote {markdown}")
        if not args.nodes:
            return results
        results["dag"] = {"nodes": args.nodes}
        print(f"random DAG, {args.nodes:,} nodes:")
        for command in COMMANDS:
            got = measure(command, dag_path, args.repeat, env)
            results["dag"][" ".join(command)] = got
            print(
                f"  graphsvc {' '.join(command):16} {got['seconds']['median']:.2f} s, "
                f"{got['seconds']['median'] / args.nodes * 1e6:.2f} us/node, "
                f"{got['peak_bytes'] / args.nodes:.0f} bytes/node peak"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["startup", "listing"], help="run one part (default: both)")
    parser.add_argument("--rounds", type=int, default=15, help="start-up rounds (default 15)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=PYTHONPATH",
        help="also run the commands with this PYTHONPATH (e.g. another checkout unpacked by "
        "`git archive`, or another typer installed with pip --target), side by side",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    args = parser.parse_args()
    out = HERE / "results" / "bench_cli.json"
    try:
        results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        results = {}
    args.variants = dict(variant.split("=", 1) for variant in args.variant)
    if args.only in (None, "startup"):
        results["startup"] = startup(args.rounds, args.variants)
        table = startup_table(results["startup"])
        print(table)
        markdown = HERE / "results" / "bench_cli_startup.md"
        markdown.write_text("# Start-up on a small graph (benchmarks/bench_cli.py)\n\n" + table, encoding="utf-8")
        print(f"wrote {markdown}")
    if args.only in (None, "listing"):
        results.update(listing(args))
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
