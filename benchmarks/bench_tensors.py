"""Tensor graphs: graphsvc's replay next to hand-written numpy and PyTorch, in one run.

    python benchmarks/bench_tensors.py [--rounds K] [--threads T] [--models mlp cnn transformer]
        [--isolate | --keep-freed-memory]

Needs torch (``pip install torch==2.13.0``) and the conv plugin (``pip install ./plugins/graphsvc-conv``,
for the CNN). Prints a table and writes benchmarks/results/bench_tensors.md and .json. What is timed:

* The three models of :mod:`benchmarks.tensor_models` at the issue's sizes, float32, one forward and
  backward pass each (the loss and every parameter's gradient):

  - **graphsvc replay**: ``graphsvc.replay.arrays.replay`` of the graph from its loss (its forward and
    backward passes, as ``graphsvc.backward`` runs them), with the ops resolved once before timing
    (what an engine step costs);
  - **graphsvc.backward**: the whole public call: resolving the ops, the replay, and storing every
    value and gradient in a new Graph;
  - **op calls alone**: the same op calls as graphsvc's replay (functions, inputs, attributes,
    residuals, memory reuse) in a plain loop planned before timing (:func:`op_calls_alone`): what
    the replay would cost if its engine cost nothing. ``graphsvc replay / op calls alone`` is the
    engine's share; ``op calls alone / numpy by hand`` the graph's own (more, smaller steps than the
    hand-written code: a bias added by its own node, log_softmax and nll_loss apart);
  - **numpy by hand**: :mod:`benchmarks.numpy_models`, the floor for a numpy engine;
  - **PyTorch**: the same computation with torch (leaves with ``requires_grad``, their ``.grad``
    cleared before each pass), ``loss.backward()``.

* Memory: graphsvc's replays allocate through :mod:`graphsvc.replay.memory` (numpy's memory handler with
  a cache: a pass gets back the blocks the last one freed), the other alternatives through glibc.
  All of them share one process, so graphsvc keeping its blocks also changes glibc's adaptive
  thresholds for the others (glibc raises its mmap threshold when a large block is freed). With
  ``--keep-freed-memory`` glibc keeps freed memory for every alternative: nobody pays page faults,
  and the ratios compare the work alone (written to ``bench_tensors_kept_memory.md``). With
  ``--isolate`` each alternative runs in a process of its own, forked before any of them ran (the
  passes still interleaved, one process at a time): each meets the allocator as it would alone,
  as a user runs it (``bench_tensors_isolated.md``). One thread only: PyTorch's OpenMP threads
  do not survive a fork (a child waited forever at its first matrix product).
* Threads: every alternative uses the same number, ``--threads`` (default 1): numpy's OpenBLAS is
  pinned with ``OPENBLAS_NUM_THREADS`` (set before numpy is imported; the run reads the count back
  from OpenBLAS and prints it) and PyTorch with ``torch.set_num_threads``. One thread by default
  because the machine's two cores are shared: a BLAS thread that waits for a busy core stalls the
  whole matmul, and the rounds then measure the other processes more than the engines.
* Rounds: a round makes ``--passes`` sweeps, each sweep one pass of every alternative in turn (the
  order rotates from sweep to sweep), with the cyclic garbage collector paused; an alternative's
  time in a round is its fastest pass (other processes on the shared machine only ever add time,
  and interleaving the passes exposes every alternative to the same load). A ratio is taken within
  a round (``a / b`` is a's time over b's: below 1 means a is faster); min, median and max are over
  the rounds. Every alternative runs a
  few passes untimed first, and the first pass's loss and gradients are checked against PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import sys


def _threads_from_argv(argv: list[str]) -> int:
    """``--threads`` read before numpy is imported: OpenBLAS takes its thread count from the
    environment when it loads."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_known_args(argv)[0].threads


THREADS = _threads_from_argv(sys.argv[1:])
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = str(THREADS)

import ctypes  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, ClassVar  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import graphsvc  # noqa: E402
from benchmarks.numpy_models import NUMPY, torch_loss  # noqa: E402
from benchmarks.op_calls import op_calls_alone  # noqa: E402
from benchmarks.run import machine, stats  # noqa: E402
from benchmarks.tensor_models import MODELS, TensorModel  # noqa: E402
from graphsvc.ops import OpRegistry  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import arrays as tensors  # noqa: E402
from graphsvc.replay import columns as replay  # noqa: E402

RESULTS = HERE / "results"
#: The goal: graphsvc's replay within this factor of the hand-written numpy floor.
GOAL = 1.05
ALTERNATIVES = ("graphsvc replay", "graphsvc.backward", "op calls alone", "numpy by hand", "PyTorch")
#: The ratios reported, as (numerator, denominator) times.
RATIOS = (
    ("graphsvc replay", "numpy by hand"),
    ("graphsvc replay", "PyTorch"),
    ("numpy by hand", "PyTorch"),
    ("graphsvc.backward", "numpy by hand"),
    ("graphsvc.backward", "PyTorch"),
    ("graphsvc replay", "op calls alone"),
    ("op calls alone", "numpy by hand"),
)


def keep_freed_memory() -> None:
    """Have glibc keep freed memory for the next allocation (``mallopt``): by default it returns
    the heap's free top to the system and serves arrays of 128 KiB and more (a threshold that adapts)
    with fresh ``mmap`` pages, so each pass pays page faults for the memory it touches (for the
    transformer, about 18 MB a pass for graphsvc, which keeps every gradient, and 12 MB for the
    hand-written numpy). Process-wide: every alternative runs under it."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_mmap_threshold, 32 << 20)):
        raise SystemExit("mallopt refused the settings (not glibc?)")


def run_header(argv: list[str] | None, torch_threads: int, **options: Any) -> dict[str, Any]:
    """What every tensor benchmark's result begins with: when, how it was run, on what machine and
    threads, the load, and ``options`` (its rounds, passes, ...)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:] if argv is None else argv,
        "machine": machine(),
        "blas_threads": blas_threads(),
        "torch_threads": torch_threads,
        **options,
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def blas_threads() -> int | None:
    """The thread count numpy's OpenBLAS runs with, asked from the library itself."""
    for path in glob.glob(str(Path(np.__file__).parent.parent / "numpy.libs" / "*openblas*")):
        library = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(library, symbol):
                return int(getattr(library, symbol)())
    return None


def steps(model: TensorModel, registry: OpRegistry) -> dict[str, Callable[[], Any]]:
    """One forward and backward pass of ``model`` per alternative; each returns (loss, {name: grad})."""
    import torch

    graph, params = model.graph, list(model.params)
    ops = replay.resolve_ops(graph, registry)
    loss_id = graph.node_id("loss")

    def graphsvc_replay() -> tuple[Any, dict[str, Any]]:
        values, grads = tensors.replay(graph, ops, loss_id)  # as graphsvc.backward runs it
        assert grads is not None
        return values[loss_id], {name: grads[graph.node_id(name)] for name in params}

    def graphsvc_backward() -> tuple[Any, dict[str, Any]]:
        result = graphsvc.backward(graph, output="loss", registry=registry)
        return result.value("loss"), {name: result.grad(name) for name in params}

    def numpy_by_hand() -> tuple[Any, dict[str, Any]]:
        return NUMPY[model.name](model.params, model.data, model.config)

    leaves = {name: torch.tensor(array, requires_grad=True) for name, array in model.params.items()}
    data = {name: torch.tensor(array) for name, array in model.data.items()}

    def pytorch() -> tuple[Any, dict[str, Any]]:
        for leaf in leaves.values():
            leaf.grad = None
        loss = torch_loss(model.name, leaves, data, model.config)
        loss.backward()
        return loss, leaves

    ops_alone = op_calls_alone(graph, ops, loss_id, params)
    passes = (graphsvc_replay, graphsvc_backward, ops_alone, numpy_by_hand, pytorch)
    return dict(zip(ALTERNATIVES, passes, strict=True))


def check(model: TensorModel, results: dict[str, tuple[Any, dict[str, Any]]]) -> float:
    """The largest gradient error of any alternative against PyTorch, relative to the largest
    element of that gradient; raises if it exceeds float32's 1e-4."""
    loss, leaves = results["PyTorch"]
    worst = 0.0
    for name, (their_loss, grads) in results.items():
        if name == "PyTorch":
            continue
        assert abs(float(their_loss) - loss.item()) <= 1e-4 * abs(loss.item()), (model.name, name)
        for key, leaf in leaves.items():
            expected = leaf.grad.numpy()
            got = np.asarray(grads[key])
            assert got.dtype == expected.dtype, (model.name, name, key, got.dtype)
            error = float(np.abs(got - expected).max() / np.abs(expected).max())
            if error > 1e-4:
                raise SystemExit(f"{model.name}: {name}'s gradient of {key} is off by {error:.3g} (relative)")
            worst = max(worst, error)
    return worst


def timed(step: Callable[[], Any]) -> Callable[[], float]:
    """``step`` as a pass that answers its own time (as a :class:`Worker` does)."""

    def run() -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    return run


def one_round(passes_of: dict[str, Callable[[], float]], passes: int) -> dict[str, float]:
    """Each alternative's fastest of ``passes`` passes (each call runs one and answers its time:
    :func:`timed`, or a :class:`Worker`), the passes interleaved, the collector paused."""
    order = list(passes_of)
    times: dict[str, list[float]] = {alt: [] for alt in order}
    gc.collect()
    gc.disable()
    try:
        for sweep in range(passes):
            for alt in order[sweep % len(order) :] + order[: sweep % len(order)]:
                times[alt].append(passes_of[alt]())
    finally:
        gc.enable()
    return {alt: min(ts) for alt, ts in times.items()}


class Worker:
    """An alternative in a process of its own, forked from this one before any alternative ran:
    the passes stay interleaved by :func:`one_round`, but no alternative's
    allocations change the allocator's state (glibc's adaptive thresholds, its free lists) for
    another. Called, it runs one pass there and returns that pass's time."""

    #: This process's ends of the workers' pipes: a new worker's child closes them, so that each
    #: child sees the end of its commands when this process closes its end, or dies.
    _ends: ClassVar[set[int]] = set()

    def __init__(self, step: Callable[[], Any]) -> None:
        to_child, self._commands = os.pipe()
        self._replies, to_parent = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            for end in (*Worker._ends, self._commands, self._replies):
                os.close(end)
            os._exit(self._serve(step, to_child, to_parent))
        os.close(to_child)
        os.close(to_parent)
        Worker._ends |= {self._commands, self._replies}

    @staticmethod
    def _serve(step: Callable[[], Any], commands: int, replies: int) -> int:
        """The child: ``p`` runs a timed pass and answers its seconds, ``c`` collects garbage, ``q``
        or the end of the commands ends it."""
        gc.disable()
        try:
            while (command := os.read(commands, 1)) not in (b"q", b""):
                if command == b"c":
                    gc.collect()
                    os.write(replies, b"0\n")
                    continue
                start = time.perf_counter()
                step()
                os.write(replies, f"{time.perf_counter() - start!r}\n".encode())
        except BaseException as exc:
            print(f"benchmark child failed: {exc!r}", file=sys.stderr, flush=True)
            return 1
        return 0

    def _ask(self, command: bytes) -> float:
        try:
            os.write(self._commands, command)
        except BrokenPipeError:  # the child is gone (it said why on stderr)
            raise SystemExit("a benchmark child process failed (see above)") from None
        reply = b""
        while not reply.endswith(b"\n"):
            part = os.read(self._replies, 64)
            if not part:
                raise SystemExit("a benchmark child process failed (see above)")
            reply += part
        return float(reply)

    def __call__(self) -> float:
        return self._ask(b"p")

    def collect(self) -> None:
        self._ask(b"c")

    def close(self) -> None:
        os.write(self._commands, b"q")
        for end in (self._commands, self._replies):
            os.close(end)
            Worker._ends.discard(end)
        os.waitpid(self.pid, 0)


def bench_model(name: str, registry: OpRegistry, rounds: int, passes: int, isolate: bool = False) -> dict[str, Any]:
    model = MODELS[name](np.float32, 0)
    alternatives = steps(model, registry)
    workers = {alt: Worker(step) for alt, step in alternatives.items()} if isolate else {}
    passes_of = workers or {alt: timed(step) for alt, step in alternatives.items()}
    error = check(model, {alt: step() for alt, step in alternatives.items()})  # here, after the forks
    for run in passes_of.values():
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {alt: [] for alt in alternatives}
    for _ in range(rounds):
        for worker in workers.values():  # each child collects its own garbage, as one_round does here
            worker.collect()
        for alt, seconds in one_round(passes_of, passes).items():
            times[alt].append(seconds)
    for worker in workers.values():
        worker.close()
    ratios = {f"{a} / {b}": stats([x / y for x, y in zip(times[a], times[b], strict=True)]) for a, b in RATIOS}
    row = {
        "model": name,
        "config": model.config,
        "nodes": model.graph.num_nodes,
        "max_relative_gradient_error": error,
        "seconds": {alt: stats(ts) for alt, ts in times.items()},
        "ratios": ratios,
    }
    line = ", ".join(f"{alt} {statistics.median(ts) * 1e3:.2f} ms" for alt, ts in times.items())
    print(f"{name}: {line}", flush=True)
    for key, s in ratios.items():
        print(f"  {key:40} {s['median']:6.2f}x (min {s['min']:.2f}, max {s['max']:.2f})", flush=True)
    return row


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Tensor graphs: graphsvc replay, hand-written numpy, PyTorch",
        "",
        f"Run {result['date']} with `python benchmarks/bench_tensors.py {' '.join(result['argv'])}` "
        f"({result['seconds']:.0f} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, numpy {m['numpy']} "
        f"(OpenBLAS threads: {result['blas_threads']}), torch {m['torch']} (threads: {result['torch_threads']}); "
        f"graphsvc {m['graphsvc']} at {m['commit']}. float32; {result['rounds']} rounds of "
        f"{result['passes']} interleaved passes (a round's time: an alternative's fastest pass). "
        + (
            "Each alternative ran in a process of its own (`--isolate`): no alternative changed the allocator's "
            "state for another. "
            if result.get("isolate")
            else ""
        )
        + f"Load average at the start: {result['load_average']}."
        + (
            " glibc kept freed memory for reuse (`--keep-freed-memory`, every alternative): no page faults from"
            " one pass to the next."
            if result.get("keep_freed_memory")
            else ""
        ),
        "",
        "## Time of one forward + backward pass (median over rounds)",
        "",
        "| model | nodes | " + " | ".join(ALTERNATIVES) + " | max gradient error vs PyTorch |",
        "|---|---:|" + "---:|" * len(ALTERNATIVES) + "---:|",
    ]
    for row in result["models"]:
        cells = [f"{row['seconds'][alt]['median'] * 1e3:.2f} ms" for alt in ALTERNATIVES]
        lines.append(
            f"| {row['model']} | {row['nodes']} | "
            + " | ".join(cells)
            + f" | {row['max_relative_gradient_error']:.1e} |"
        )
    lines += [
        "",
        "## Ratios (time / time within a round; below 1: the first is faster)",
        "",
        f"Goal (issue 14): graphsvc replay / numpy by hand at most {GOAL}.",
        "",
        "| model | ratio | median | min | max |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["models"]:
        for key, s in row["ratios"].items():
            mark = "**" if key == "graphsvc replay / numpy by hand" else ""
            lines.append(
                f"| {row['model']} | {key} | {mark}{s['median']:.2f}x{mark} | {s['min']:.2f}x | {s['max']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per model (default 7)")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per alternative and round (default 5)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="each alternative in a forked process of its own (passes still interleaved): no alternative "
        "changes the allocator's state for another; with --threads 1 only",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="have glibc keep freed memory for reuse (every alternative): separates page faults from the work",
    )
    args = parser.parse_args(argv)
    if args.isolate and args.threads != 1:  # GNU OpenMP's pool, once used here, hangs a forked child
        parser.error("--isolate runs with --threads 1 only (PyTorch's OpenMP threads do not survive a fork)")
    import torch  # after the options: --help works without it

    if args.keep_freed_memory:
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    registry, problems = load_registry(["graphsvc_conv"] if "cnn" in args.models else [])
    if problems:
        raise SystemExit(f"plugins failed to load ({problems}); the CNN needs: pip install ./plugins/graphsvc-conv")
    start = time.perf_counter()
    result: dict[str, Any] = run_header(
        argv,
        torch.get_num_threads(),
        rounds=args.rounds,
        passes=args.passes,
        keep_freed_memory=args.keep_freed_memory,
        isolate=args.isolate,
    )
    print(f"threads: OpenBLAS {result['blas_threads']}, torch {result['torch_threads']}", flush=True)
    result["models"] = [bench_model(name, registry, args.rounds, args.passes, args.isolate) for name in args.models]
    result["seconds"] = time.perf_counter() - start
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        stem = "bench_tensors" + ("_kept_memory" if args.keep_freed_memory else "")
        stem += "_isolated" if args.isolate else ""
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / f"{stem}.md").write_text(markdown(result))
        print(f"wrote {RESULTS / f'{stem}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
