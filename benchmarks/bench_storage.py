"""Storage of tensor graphs: graphsvc's save and load next to safetensors and torch, in one run.

    python benchmarks/bench_storage.py [--rounds K] [--passes P] [--models mlp cnn transformer] [--dir D]
                                       [--no-cold] [--no-memory] [--no-processes] [--no-write]

Needs safetensors (``pip install safetensors==0.8.0``), torch (``pip install torch==2.13.0``) and the
conv plugin (``pip install ./plugins/graphsvc-conv``, for the CNN). Prints a table and writes
benchmarks/results/bench_storage.md and .json. What is measured:

* The graphs: the three models of :mod:`benchmarks.tensor_models` at the issue's sizes, float32, after
  ``graphsvc.backward`` (every node's value and gradient filled in). The peers store **the same
  arrays**: a dict ``"{node}.value"`` / ``"{node}.grad"`` -> array (numpy arrays for safetensors.numpy,
  ``torch.from_numpy`` of them for torch), built before any timing. graphsvc saves the Graph itself
  (also its columns, op table and names: a little more work and a few KB more).
* Save, each tool to a file of its own in the same folder, replacing the previous pass's file:

  - ``graphsvc.save``: the whole atomic save (an ``O_TMPFILE`` written, fsynced, linked, renamed
    over the old file; the folder fsynced). Its time spent inside ``os.fsync`` is timed apart by a
    wrapper around ``os.fsync`` during the call (``fsync`` in the tables);
  - ``graphsvc.save without fsync``: the same call with ``os.fsync`` replaced by a no-op for its
    duration (nothing else changes): what compares with the peers, which never sync;
  - ``safetensors.numpy.save_file`` and ``torch.save`` (a dict of tensors);
  - ``bare write``: the floor, no tool at all: ``os.writev`` of graphsvc's encoded buffers (encoded
    before the timing starts) into a file of its own, opened with ``O_TRUNC`` over the previous
    pass's file, then closed: the old file's blocks freed and the bytes copied to the page cache,
    which every save here at least costs (``graphsvc.save without fsync / bare write`` is what
    graphsvc adds to it, ``bare write / torch.save`` the best ratio any writer could reach).

  Before every save pass the run calls ``os.sync()`` (untimed), so every tool replaces a file that
  is already written back (what a save of a file saved a while ago meets) and graphsvc's fsync waits
  for its own file only.
* Load, each from its own file, the page cache warm (the file was just written and read by the
  warm-up passes):

  - ``graphsvc.load``: reads the data section into one buffer (from 16 MiB on, when its pages are in the
    page cache, in two halves at once, the second by a helper thread); every array is a read-only view of it;
  - ``graphsvc.load(mmap=True)``: maps the file; every array is a read-only view of the mapping;
  - ``safetensors.numpy.load_file``: an array of its own per tensor (eager);
  - ``safetensors.torch.load_file``: tensors viewing a private mapping of the file (mapped);
  - ``torch.load`` (``weights_only=True``, the default) and ``torch.load(mmap=True)``.

  Every tool's result is checked equal to the arrays saved (dtype, shape, bytes) once before timing.
  A load's result is kept until its timer stops and freed after (not billed to the next pass).
* Cold (unless ``--no-cold``): the same loads, each preceded (untimed) by
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file, after every file was synced; a pass counts as
  cold when a ``preadv(RWF_NOWAIT)`` of the file's middle page right after the advice finds it gone
  (the table says how many were). A mapped load reads no data, so its cold time is the header's.
* Rounds: a round makes ``--passes`` sweeps, each sweep one pass of every alternative in turn (the
  order rotates from sweep to sweep), with the cyclic garbage collector paused; an alternative's
  time in a round is its fastest pass (other processes on the shared machine only ever add time).
  A ratio ``a / b`` is a's time over b's within a round (below 1: a is faster); min, median and max
  are over the rounds (at least 7). Targets are judged on the median.
* Whole processes (unless ``--no-processes``): a fresh ``python -c`` per load that imports the tool
  and loads the model's file, next to one that only imports numpy, once per round each, the order
  rotating; wall time to the process's exit (what a user's script pays: start-up plus the load).
  They run byte-compiled, as an installed wheel does (``benchmarks.run.startup_env``: without
  ``PYTHONDONTWRITEBYTECODE``, with a warmed ``PYTHONPYCACHEPREFIX``); before, a shell that set
  ``PYTHONDONTWRITEBYTECODE`` made every graphsvc process compile graphsvc's modules from source.
* Peak memory of a load (unless ``--no-memory``): each tool in a fresh process (this script with
  ``--peak``), which imports numpy, graphsvc, safetensors and torch, loads a tiny file of the same
  kind once (so every module is resident), collects garbage, reads ``VmRSS``, resets ``VmHWM``
  (``echo 5 > /proc/self/clear_refs``), loads the file, keeps the result and reads ``VmHWM``:
  the peak is ``VmHWM - VmRSS before``, quoted as a multiple of the arrays' own bytes. A mapped
  load's pages count only once touched (file pages, shared with the page cache); the rows
  "then every array read" touch every byte of every array (a sum) and show that count.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks.run import machine, startup_env, stats  # noqa: E402
from benchmarks.tensor_models import MODELS  # noqa: E402
from graphsvc.format import codec  # noqa: E402
from graphsvc.graph import Graph  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402

RESULTS = HERE / "results"
BARE = "bare write"
SAVES = ("graphsvc.save", "graphsvc.save without fsync", "safetensors.numpy.save_file", "torch.save", BARE)
LOADS = (
    "graphsvc.load",
    "graphsvc.load(mmap=True)",
    "safetensors.numpy.load_file",
    "safetensors.torch.load_file",
    "torch.load",
    "torch.load(mmap=True)",
)
#: Which file each tool reads and writes (by suffix).
SUFFIX = {"graphsvc": ".msgpack", "safetensors": ".safetensors", "torch": ".pt"}
#: The ratios reported (numerator, denominator) and the goal for the median, if any.
SAVE_RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("graphsvc.save without fsync", "safetensors.numpy.save_file", 1.0),
    ("graphsvc.save without fsync", "torch.save", 1 / 3),
    ("graphsvc.save", "safetensors.numpy.save_file", None),
    ("graphsvc.save", "torch.save", None),
    ("graphsvc.save without fsync", BARE, None),
    (BARE, "torch.save", None),
)
LOAD_RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("graphsvc.load", "safetensors.numpy.load_file", 1.0),
    ("graphsvc.load(mmap=True)", "safetensors.torch.load_file", 1.0),
    ("graphsvc.load", "torch.load", None),
    ("graphsvc.load(mmap=True)", "torch.load(mmap=True)", None),
)
#: Whole processes: a fresh ``python -c`` that imports the tool and loads the model's file (what a
#: user's script pays: start-up plus the load), next to one that only imports numpy.
PROCESS_LOADS = {
    "python -c 'import numpy'": "import numpy",
    "graphsvc.load": "import graphsvc; graphsvc.load({path!r})",
    "safetensors.numpy.load_file": "from safetensors.numpy import load_file; load_file({path!r})",
    "torch.load": "import torch; torch.load({path!r})",
}
PROCESS_RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("graphsvc.load", "safetensors.numpy.load_file", None),
    ("graphsvc.load", "torch.load", None),
    ("graphsvc.load", "python -c 'import numpy'", None),
)
#: The goal: a load's peak memory at most this many times the arrays' own bytes.
PEAK_GOAL = 1.1
#: The loads whose peak is measured; "then every array read" also touches every byte of the arrays.
TOUCHED = ", then every array read"
PEAK_TOOLS = (*LOADS, f"graphsvc.load(mmap=True){TOUCHED}", f"safetensors.torch.load_file{TOUCHED}")


def tool_of(alternative: str) -> str:
    return "bare" if alternative == BARE else alternative.split(".", 1)[0]


# -- the arrays ---------------------------------------------------------------------------------
def arrays_of(graph: Graph) -> dict[str, np.ndarray]:
    """Every value and gradient array of the graph, by ``"{node}.value"`` / ``"{node}.grad"``."""
    named = {f"{node}.value": array for node, array in graph.arrays.items()}
    named.update({f"{node}.grad": array for node, array in graph.grad_arrays.items()})
    return {name: np.ascontiguousarray(named[name]) for name in sorted(named)}


def same_arrays(expected: dict[str, np.ndarray], got: dict[str, Any], who: str) -> None:
    """Raise unless ``got`` holds exactly ``expected``'s arrays (dtype, shape, bytes)."""
    if sorted(got) != sorted(expected):
        raise SystemExit(f"{who}: the names differ")
    for name, array in expected.items():
        other = got[name]
        other = other.numpy() if hasattr(other, "numpy") else np.asarray(other)
        if other.dtype != array.dtype or other.shape != array.shape or other.tobytes() != array.tobytes():
            raise SystemExit(f"{who}: {name} differs")


# -- the alternatives ---------------------------------------------------------------------------
@dataclass
class Files:
    """The file each tool writes and reads for one model."""

    graphsvc: Path
    safetensors: Path
    torch: Path
    bare: Path

    def of(self, alternative: str) -> Path:
        path: Path = getattr(self, tool_of(alternative))
        return path


def files_for(folder: Path, stem: str) -> Files:
    return Files(
        *(folder / f"{stem}{SUFFIX[tool]}" for tool in ("graphsvc", "safetensors", "torch")), folder / f"{stem}.bare"
    )


class FsyncTimer:
    """``os.fsync`` replaced, for the duration of a call, by a timed call of the real one (or a no-op)."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.seconds = 0.0

    @contextmanager
    def timing(self, skip: bool = False) -> Iterator[None]:
        real = self.real

        def fsync(fd: Any) -> None:
            if skip:
                return
            start = time.perf_counter()
            try:
                real(fd)
            finally:
                self.seconds += time.perf_counter() - start

        self.seconds = 0.0
        os.fsync = fsync
        try:
            yield
        finally:
            os.fsync = real


def save_steps(
    graph: Graph, arrays: dict[str, np.ndarray], files: Files, fsyncs: FsyncTimer
) -> dict[str, Callable[[], Any]]:
    import safetensors.numpy
    import torch

    tensors = {name: torch.from_numpy(np.array(array)) for name, array in arrays.items()}

    def graphsvc_save() -> None:
        with fsyncs.timing():
            graphsvc.save(graph, files.graphsvc)

    def graphsvc_save_without_fsync() -> None:
        with fsyncs.timing(skip=True):
            graphsvc.save(graph, files.graphsvc)

    def safetensors_save() -> None:
        safetensors.numpy.save_file(arrays, files.safetensors)

    def torch_save() -> None:
        torch.save(tensors, files.torch)

    chunks = [chunk for chunk in codec.encode(graph) if len(chunk)]
    if len(chunks) > 1024:  # IOV_MAX: one writev could not take them
        raise SystemExit(f"bare write: {len(chunks)} buffers, more than one writev takes")

    def bare_write() -> None:
        fd = os.open(files.bare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            written = os.writev(fd, chunks)
        finally:
            os.close(fd)
        if written != sum(map(len, chunks)):  # a short write: never on a local disk with room
            raise SystemExit(f"bare write: {written} bytes written")

    steps = (graphsvc_save, graphsvc_save_without_fsync, safetensors_save, torch_save, bare_write)
    return dict(zip(SAVES, steps, strict=True))


def load_steps(files: Files) -> dict[str, Callable[[], Any]]:
    """Each load alternative (a graph's arrays by name are :func:`as_arrays` of its result)."""
    import safetensors.numpy
    import safetensors.torch
    import torch

    return {
        "graphsvc.load": lambda: graphsvc.load(files.graphsvc),
        "graphsvc.load(mmap=True)": lambda: graphsvc.load(files.graphsvc, mmap=True),
        "safetensors.numpy.load_file": lambda: safetensors.numpy.load_file(files.safetensors),
        "safetensors.torch.load_file": lambda: safetensors.torch.load_file(files.safetensors),
        "torch.load": lambda: torch.load(files.torch),
        "torch.load(mmap=True)": lambda: torch.load(files.torch, mmap=True),
    }


def as_arrays(result: Any) -> dict[str, Any]:
    return arrays_of(result) if isinstance(result, Graph) else result


# -- timing -------------------------------------------------------------------------------------
def one_round(
    alternatives: dict[str, Callable[[], Any]],
    passes: int,
    before: Callable[[str], None] | None = None,
    after: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Each alternative's fastest of ``passes`` passes, the passes interleaved, the collector paused;
    ``before(alt)`` runs untimed before each pass, ``after(alt)`` after it."""
    order = list(alternatives)
    times: dict[str, list[float]] = {alt: [] for alt in order}
    gc.collect()
    gc.disable()
    try:
        for sweep in range(passes):
            for alt in order[sweep % len(order) :] + order[: sweep % len(order)]:
                if before is not None:
                    before(alt)
                start = time.perf_counter()
                result = alternatives[alt]()
                times[alt].append(time.perf_counter() - start)
                del result
                if after is not None:
                    after(alt)
    finally:
        gc.enable()
    return {alt: min(ts) for alt, ts in times.items()}


def ratios_of(times: dict[str, list[float]], pairs: tuple[tuple[str, str, float | None], ...]) -> list[dict[str, Any]]:
    rows = []
    for a, b, goal in pairs:
        s = stats([x / y for x, y in zip(times[a], times[b], strict=True)])
        rows.append({"ratio": f"{a} / {b}", **s, "goal": goal, "met": None if goal is None else s["median"] <= goal})
    return rows


def drop_cache(path: Path) -> bool:
    """Ask the kernel to drop ``path``'s pages; True when its middle page is then not cached. (Asked
    twice: a page still in another CPU's list of recently used pages survives the first.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(fd).st_size
        probe = bytearray(4096)
        try:
            os.preadv(fd, [probe], (size // 2) & ~4095, os.RWF_NOWAIT)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- peak memory ----------------------------------------------------------------------------------
def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def peak_child(tool: str, path: str, tiny: str) -> None:
    """Run in a fresh process: print the peak of one load (see the module docstring) as JSON."""
    # every process imports the same modules, whichever it times
    import safetensors.numpy
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    touch = tool.endswith(TOUCHED)
    load = tool.removesuffix(TOUCHED)

    def run(file: str) -> Any:
        files = Files(Path(file), Path(file), Path(file), Path(file))
        result = load_steps(files)[load]()
        if touch:
            for array in as_arrays(result).values():
                array.sum()
        return result

    run(tiny)
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    result = run(path)
    peak = _status("VmHWM") - before
    print(json.dumps({"tool": tool, "peak_bytes": peak, "kept": result is not None}))


def peaks(files: Files, tiny: Files, array_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for tool in PEAK_TOOLS:
        alt = tool.removesuffix(TOUCHED)
        cmd = [sys.executable, __file__, "--peak", tool, str(files.of(alt)), str(tiny.of(alt))]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        peak = json.loads(out.strip().splitlines()[-1])["peak_bytes"]
        rows.append({"tool": tool, "peak_bytes": peak, "ratio": peak / array_bytes})
    return rows


def process_loads(files: Files, rounds: int) -> dict[str, list[float]]:
    """Each of :data:`PROCESS_LOADS` as a whole process, once per round, the order rotating from round
    to round: wall time from ``subprocess.run`` to its exit. The processes run byte-compiled, as an
    installed wheel does (``benchmarks/bench_cli.py``'s environment: no ``PYTHONDONTWRITEBYTECODE``,
    a ``PYTHONPYCACHEPREFIX`` of their own, warmed by one untimed run of each)."""
    order = list(PROCESS_LOADS)
    times: dict[str, list[float]] = {alt: [] for alt in order}
    with tempfile.TemporaryDirectory(prefix="graphsvc-pycache-") as pycache:
        env = startup_env(Path(pycache))
        commands = {
            alt: [sys.executable, "-c", PROCESS_LOADS[alt].format(path="" if alt not in LOADS else str(files.of(alt)))]
            for alt in order
        }
        for alt in order:  # compiles what each imports, once
            subprocess.run(commands[alt], check=True, capture_output=True, env=env)
        for round_ in range(rounds):
            for alt in order[round_ % len(order) :] + order[: round_ % len(order)]:
                start = time.perf_counter()
                subprocess.run(commands[alt], check=True, capture_output=True, env=env)
                times[alt].append(time.perf_counter() - start)
    return times


# -- the run --------------------------------------------------------------------------------------
def filesystem(path: Path) -> str:
    """The filesystem ``path`` lies on, from /proc/self/mounts: its type, device and mount point."""
    real = os.path.realpath(path)
    best = ("?", "?", "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[2]):
            best = (kind, device, mount)
    return f"{best[0]} ({best[1]} mounted at {best[2]})"


def write_all(graph: Graph, arrays: dict[str, np.ndarray], files: Files) -> None:
    steps = save_steps(graph, arrays, files, FsyncTimer())
    for alt in ("graphsvc.save", "safetensors.numpy.save_file", "torch.save"):
        steps[alt]()


def bench_model(name: str, registry: Any, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    model = MODELS[name](np.float32, 0)
    graph = graphsvc.backward(model.graph, output="loss", registry=registry)
    arrays = arrays_of(graph)
    array_bytes = sum(array.nbytes for array in arrays.values())
    files = files_for(workdir, name)
    tiny_model = MODELS["mlp"](np.float32, 0, batch=2, sizes=(4, 3, 2))
    tiny_graph = graphsvc.backward(tiny_model.graph, output="loss", registry=registry)
    tiny = files_for(workdir, "tiny")
    write_all(tiny_graph, arrays_of(tiny_graph), tiny)

    fsyncs = FsyncTimer()
    saves = save_steps(graph, arrays, files, fsyncs)
    fsync_seconds: list[float] = []

    def before_save(alt: str) -> None:
        os.sync()

    def after_save(alt: str) -> None:
        if alt == "graphsvc.save":
            fsync_seconds.append(fsyncs.seconds)

    for step in saves.values():  # warm-up, and the files the loads read
        step()
    loads = load_steps(files)
    for alt, step in loads.items():
        same_arrays(arrays, as_arrays(step()), alt)
        for _ in range(2):
            step()

    row: dict[str, Any] = {
        "model": name,
        "config": model.config,
        "nodes": graph.num_nodes,
        "arrays": len(arrays),
        "array_bytes": array_bytes,
        "file_bytes": {tool: os.path.getsize(files.of(tool)) for tool in SUFFIX},
    }
    save_times: dict[str, list[float]] = {alt: [] for alt in saves}
    fsync_in_round: list[float] = []
    for _ in range(args.rounds):
        fsync_seconds.clear()
        for alt, seconds in one_round(saves, args.passes, before_save, after_save).items():
            save_times[alt].append(seconds)
        fsync_in_round.append(min(fsync_seconds))
    row["save_seconds"] = {alt: stats(ts) for alt, ts in save_times.items()}
    row["fsync_seconds"] = stats(fsync_in_round)
    row["save_ratios"] = ratios_of(save_times, SAVE_RATIOS)

    load_times: dict[str, list[float]] = {alt: [] for alt in loads}
    for _ in range(args.rounds):
        for alt, seconds in one_round(loads, args.passes).items():
            load_times[alt].append(seconds)
    row["load_seconds"] = {alt: stats(ts) for alt, ts in load_times.items()}
    row["load_ratios"] = ratios_of(load_times, LOAD_RATIOS)

    if args.cold:
        for path in (files.graphsvc, files.safetensors, files.torch):
            sync_file(path)
        cold_passes = {alt: [0, 0] for alt in loads}

        def make_cold(alt: str) -> None:
            cold_passes[alt][1] += 1
            cold_passes[alt][0] += drop_cache(files.of(alt))

        cold_times: dict[str, list[float]] = {alt: [] for alt in loads}
        for _ in range(args.rounds):
            for alt, seconds in one_round(loads, args.cold_passes, make_cold).items():
                cold_times[alt].append(seconds)
        row["cold_load_seconds"] = {alt: stats(ts) for alt, ts in cold_times.items()}
        row["cold_load_ratios"] = ratios_of(cold_times, LOAD_RATIOS)
        row["cold_passes_verified"] = {alt: f"{cold}/{total}" for alt, (cold, total) in cold_passes.items()}
    if args.memory:
        row["peaks"] = peaks(files, tiny, array_bytes)
    if args.processes:
        process_times = process_loads(files, args.rounds)
        row["process_load_seconds"] = {alt: stats(ts) for alt, ts in process_times.items()}
        row["process_load_ratios"] = ratios_of(process_times, PROCESS_RATIOS)
        for ratio in row["process_load_ratios"]:
            print(f"  whole process: {ratio['ratio']:45} {ratio['median']:6.2f}x (min {ratio['min']:.2f})")
    ms = ", ".join(f"{alt} {statistics.median(ts) * 1e3:.2f} ms" for alt, ts in {**save_times, **load_times}.items())
    print(f"{name}: {ms}", flush=True)
    for ratio in row["save_ratios"] + row["load_ratios"]:
        print(f"  {ratio['ratio']:60} {ratio['median']:6.2f}x (min {ratio['min']:.2f}, max {ratio['max']:.2f})")
    for peak in row.get("peaks", []):
        print(f"  peak {peak['tool']:55} {peak['ratio']:.3f}x the arrays' bytes")
    return row


# -- the report -----------------------------------------------------------------------------------
def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for row in result["models"]:
        for ratio in row["save_ratios"] + row["load_ratios"]:
            if ratio["goal"] is not None:
                rows.append(
                    {
                        "model": row["model"],
                        "target": ratio["ratio"],
                        "goal": f"<= {ratio['goal']:.2f}",
                        "median": ratio["median"],
                        "met": ratio["met"],
                    }
                )
        for peak in row.get("peaks", []):
            if peak["tool"] == "graphsvc.load":
                rows.append(
                    {
                        "model": row["model"],
                        "target": "graphsvc.load peak memory / arrays' bytes",
                        "goal": f"<= {PEAK_GOAL}",
                        "median": peak["ratio"],
                        "met": peak["ratio"] <= PEAK_GOAL,
                    }
                )
    return rows


def _ms(s: dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.2f} ms"


def _ratio_lines(row: dict[str, Any], key: str) -> list[str]:
    lines = []
    for r in row[key]:
        goal = "" if r["goal"] is None else f"<= {r['goal']:.2f}: {'met' if r['met'] else '**not met**'}"
        lines.append(
            f"| {row['model']} | {r['ratio']} | **{r['median']:.2f}x** | {r['min']:.2f}x | {r['max']:.2f}x | {goal} |"
        )
    return lines


def _table(
    title: str,
    columns: Iterable[str],
    models: list[dict[str, Any]],
    cells: Callable[[dict[str, Any]], list[str]],
    note: str = "",
) -> list[str]:
    """A section: its title, a note, and a table of one row per model, ``cells(row)`` after its name."""
    columns = list(columns)
    lines = ["", f"## {title}", "", *([note, ""] if note else [])]
    lines += ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    return lines + [f"| {row['model']} | " + " | ".join(cells(row)) + " |" for row in models]


def _ratio_table(models: list[dict[str, Any]], key: str) -> list[str]:
    lines = ["", "| model | ratio | median | min | max | |", "|---|---|---:|---:|---:|---|"]
    return lines + [line for row in models for line in _ratio_lines(row, key)]


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    models = result["models"]
    lines = [
        "# Storage of tensor graphs: graphsvc, safetensors, torch",
        "",
        f"Run {result['date']} with `python benchmarks/bench_storage.py {' '.join(result['argv'])}` "
        f"({result['seconds']:.0f} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, numpy {m['numpy']}, "
        f"safetensors {result['safetensors']}, torch {m['torch']}, msgpack {m['msgpack']}; graphsvc "
        f"{m['graphsvc']} at {m['commit']}. Files on {result['filesystem']}. {result['rounds']} rounds of "
        f"{result['passes']} interleaved passes (a round's time: an alternative's fastest pass). "
        f"Load average at the start: {result['load_average']}. Method: the docstring of "
        "`benchmarks/bench_storage.py`.",
        "",
        "The graphs: each model's graph after `graphsvc.backward`, float32, every value and gradient an array.",
        "",
        "| model | nodes | arrays | arrays' bytes | graphsvc file | safetensors file | torch file |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in models:
        f = row["file_bytes"]
        lines.append(
            f"| {row['model']} | {row['nodes']} | {row['arrays']} | {row['array_bytes']:,} | {f['graphsvc']:,} | "
            f"{f['safetensors']:,} | {f['torch']:,} |"
        )
    lines += _table(
        "Save (median over rounds; `fsync`: the part of `graphsvc.save` spent in `os.fsync`)",
        [*SAVES, "fsync"],
        models,
        lambda row: [*(_ms(row["save_seconds"][alt]) for alt in SAVES), _ms(row["fsync_seconds"])],
    )
    lines += _table(
        "Load, page cache warm (median over rounds)",
        LOADS,
        models,
        lambda row: [_ms(row["load_seconds"][alt]) for alt in LOADS],
    )
    lines += [
        "",
        "## Ratios (time / time within a round; below 1: graphsvc is faster)",
        "",
        "| model | ratio | median | min | max | goal (issue 14) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in models:
        lines += _ratio_lines(row, "save_ratios") + _ratio_lines(row, "load_ratios")
    if all("cold_load_seconds" in row for row in models):
        lines += _table(
            "Load, page cache cold (`posix_fadvise(DONTNEED)` before each pass; median over rounds)",
            LOADS,
            models,
            lambda row: [
                f"{_ms(row['cold_load_seconds'][alt])} ({row['cold_passes_verified'][alt]} cold)" for alt in LOADS
            ],
            note="A mapped load reads no array data: its cold time is the header's; reading the arrays comes later.",
        )
        lines += _ratio_table(models, "cold_load_ratios")
    if all("peaks" in row for row in models):
        lines += _table(
            "Peak memory of a load, in a fresh process (VmHWM - VmRSS before), / the arrays' bytes",
            PEAK_TOOLS,
            models,
            lambda row: [f"{p['ratio']:.3f}x ({p['peak_bytes'] / 2**20:.1f} MiB)" for p in row["peaks"]],
        )
    if all("process_load_seconds" in row for row in models):
        lines += _table(
            "Load as a whole process (a fresh `python -c` that imports the tool and loads the file; median)",
            PROCESS_LOADS,
            models,
            lambda row: [_ms(row["process_load_seconds"][alt]) for alt in PROCESS_LOADS],
        )
        lines += _ratio_table(models, "process_load_ratios")
    lines += ["", "## Targets (issue 14; judged on the median)", "", "| model | target | goal | measured | met |"]
    lines.append("|---|---|---|---:|---|")
    for t in result["targets"]:
        lines.append(
            f"| {t['model']} | {t['target']} | {t['goal']} | {t['median']:.2f} | {'yes' if t['met'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per alternative and round (default 5)")
    parser.add_argument("--cold-passes", type=int, default=2, help="passes per round of the cold loads (default 2)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go (default: the temp folder)")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache loads")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory processes")
    parser.add_argument(
        "--no-processes", dest="processes", action="store_false", help="skip the loads timed as whole processes"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    parser.add_argument("--peak", nargs=3, metavar=("TOOL", "FILE", "TINY_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak:
        peak_child(*args.peak)
        return 0
    import safetensors
    import torch

    torch.set_num_threads(1)
    registry, problems = load_registry(["graphsvc_conv"] if "cnn" in args.models else [])
    if problems:
        raise SystemExit(f"plugins failed to load ({problems}); the CNN needs: pip install ./plugins/graphsvc-conv")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_storage-", dir=args.dir) as folder:
        workdir = Path(folder)
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "argv": sys.argv[1:] if argv is None else argv,
            "machine": machine(),
            "safetensors": safetensors.__version__,
            "filesystem": filesystem(workdir),
            "rounds": args.rounds,
            "passes": args.passes,
            "cold_passes": args.cold_passes if args.cold else 0,
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        }
        print(f"files on {result['filesystem']}", flush=True)
        result["models"] = [bench_model(name, registry, workdir, args) for name in args.models]
    result["targets"] = targets(result)
    result["seconds"] = time.perf_counter() - start
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_storage.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "bench_storage.md").write_text(markdown(result))
        print(f"wrote {RESULTS / 'bench_storage.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
