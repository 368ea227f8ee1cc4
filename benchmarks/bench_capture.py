"""The cost of graphsvc.torch.capture: a PyTorch training step with and without it, side by side.

Two models in float32 on one thread (``torch.set_num_threads(1)``): the MLP 784-512-512-10 at
batch 128 with a cross-entropy loss, and ``nn.TransformerEncoderLayer`` (d_model 128, 4 heads,
feed-forward 512, dropout 0, batch_first) on a batch of 8 sequences of 64, loss the mean square of
its output. A step is ``zero_grad``, forward, loss and backward; under capture it is the whole
``with capture(model) as run:`` block, building the graph at its end included (``run.graph()``
returns it), saving it not.

Each round times every kind of step (plain, floor, keeper, captured) in turn, each right after an
untimed step of the same kind, and a round's ratio is its captured time over the plain time of the
same round; the table gives the ratios' min, median and max. The untimed step puts the C library's
memory where that kind of step leaves it, as in a loop of such steps: a step that frees more
memory than the next one uses (the keeper's outputs and gradients) lets glibc give pages back to
the system, which the next kind of step would otherwise fault back in (2,000 page faults and 4 ms
for a captured transformer step timed right after a keeper step), and a plain step timed after a
captured one runs in memory the captured step left cold, which flatters the ratio.

The fixed cost per ATen call is measured on a chain of ``n`` tiny elementwise ops (4 floats, so
the op itself costs next to nothing): (captured time - plain time) / (calls the capture recorded),
with the calls counted from the graph (its nodes other than leaves and consts; the table's
``nodes`` column counts the same).

The ``floor`` column is what keeping every value costs at least: a plain step followed by one copy
of each parameter, its gradient and the step's input (what the caller still holds and may change
next, so a graph must copy it), over the plain step of the same round (median). The ``keeper``
column is what any recorder at the ATen level pays before it records anything: the same step under
a ``TorchDispatchMode`` that only keeps each forward op's output and a hook keeping its gradient
(the backward outside the mode, as capture runs it), plus those copies. The difference between
``captured`` and ``keeper`` is capture's own work (mapping ops, naming, building the graph: the
keeper holds the step's memory as the graph does); the ``own work`` column is its median over the
rounds, each round's (captured - keeper) / plain.

The ``page faults`` column is the median number of minor page faults of a plain step and of a
captured one (``plain / captured``): each is a first touch of a page the system just gave the process
(which the system zeroes first). A captured step's graph holds its values, gradients and copies past
the step; when it is freed, the C library may give that memory back to the system (glibc's malloc
does when the top of its heap is free), and the next step's memory is new pages again.

Times are the process's CPU time by default (``--clock cpu``; every step runs on one thread): on
the shared machine the benchmarks run on, wall time (``--clock wall``) mostly measures the other
processes.

``python benchmarks/bench_capture.py [--rounds K] [--clock cpu|wall]`` prints the table and writes
``results/bench_capture.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from graphsvc.replay import memory
from graphsvc.torch import capture

RESULTS = Path(__file__).resolve().parent / "results"
#: The clocks ``--clock`` chooses from: the process's CPU time (every thread of it), or wall time.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
#: The clock the steps are timed by (``main`` sets the one ``--clock`` names).
clock: Callable[[], float] = CLOCKS["cpu"]


def mlp() -> tuple[nn.Module, Callable[[], Any], list[Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    return model, lambda: F.cross_entropy(model(x), y), [x]


def transformer() -> tuple[nn.Module, Callable[[], Any], list[Any]]:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
    x = torch.randn(8, 64, 128)
    return model, lambda: model(x).pow(2).mean(), [x]


def chain(n: int) -> tuple[nn.Module, Callable[[], Any], list[Any]]:
    """n tiny ops: what a call costs the capture, not what it costs PyTorch."""
    model = nn.Linear(4, 4)
    x = torch.randn(1, 4)

    def step() -> Any:
        h = model(x)
        for _ in range(n):
            h = h * 1.0001
        return h.sum()

    return model, step, [x]


def plain_step(model: nn.Module, loss: Callable[[], Any]) -> float:
    start = clock()
    model.zero_grad(set_to_none=True)
    loss().backward()
    return clock() - start


def copies(model: nn.Module, inputs: list[Any]) -> list[Any]:
    """One copy of the step's inputs, each parameter and its gradient: what a graph must copy (in
    memory an earlier step's copies gave back, as capture's copies are: numpy's own allocator gives
    a block this large fresh pages each time, a page fault each)."""
    with memory.reuse():
        kept = [t.detach().numpy().copy() for t in inputs]
        for p in model.parameters():
            kept.append(p.detach().numpy().copy())
            if p.grad is not None:
                kept.append(p.grad.numpy().copy())
    return kept


def floor_step(model: nn.Module, loss: Callable[[], Any], inputs: list[Any]) -> float:
    start = clock()
    model.zero_grad(set_to_none=True)
    loss().backward()
    copies(model, inputs)
    return clock() - start


class _KeepingMode(TorchDispatchMode):
    """Keeps every forward output in ``outputs`` (a class made once: a mode class made each step
    would cost its making each step)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # no torch._dynamo.disable around the handler (Dynamo never runs here), as capture

    def __init__(self, outputs: list[Any]) -> None:
        super().__init__()
        self.outputs = outputs

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func._op(*args, **(kwargs or {}))  # the operator itself, as capture calls it
        if isinstance(out, torch.Tensor):
            self.outputs.append(out)
        return out


class _Keeper:
    """A dispatch mode that keeps every forward output and its gradient, and records nothing."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []
        self.grads: list[Any] = []
        self.mode = _KeepingMode(self.outputs)

    def hook_all(self) -> None:
        for t in self.outputs:
            if t.grad_fn is not None and t.dtype.is_floating_point:
                t.register_hook(self.grads.append)


def keeper_step(model: nn.Module, loss: Callable[[], Any], inputs: list[Any]) -> float:
    start = clock()
    model.zero_grad(set_to_none=True)
    keeper = _Keeper()
    with keeper.mode:
        value = loss()
    keeper.hook_all()
    value.backward()
    copies(model, inputs)
    return clock() - start


def captured_step(model: nn.Module, loss: Callable[[], Any]) -> tuple[float, int]:
    start = clock()
    model.zero_grad(set_to_none=True)
    with capture(model) as run:
        loss().backward()
    graph = run.graph()
    elapsed = clock() - start
    return elapsed, sum(graph.op(n) not in ("leaf", "const") for n in range(graph.num_nodes))


def compare(name: str, model: nn.Module, loss: Callable[[], Any], inputs: list[Any], rounds: int) -> dict[str, Any]:
    for _ in range(2):  # warm-up of each
        plain_step(model, loss)
        floor_step(model, loss, inputs)
        keeper_step(model, loss, inputs)
        captured_step(model, loss)
    plain, captured, ratios, floors, keepers, own = [], [], [], [], [], []
    plain_faults, captured_faults = [], []
    nodes = 0
    for _ in range(rounds):
        plain_step(model, loss)  # each kind of step timed after an untimed one of its kind (see above)
        before = page_faults()
        p = plain_step(model, loss)
        plain_faults.append(page_faults() - before)
        floor_step(model, loss, inputs)
        f = floor_step(model, loss, inputs)
        keeper_step(model, loss, inputs)
        k = keeper_step(model, loss, inputs)
        captured_step(model, loss)
        before = page_faults()
        c, nodes = captured_step(model, loss)
        captured_faults.append(page_faults() - before)
        plain.append(p)
        captured.append(c)
        ratios.append(c / p)
        floors.append(f / p)
        keepers.append(k / p)
        own.append((c - k) / p)
    return {
        "model": name,
        "plain_ms": statistics.median(plain) * 1e3,
        "captured_ms": statistics.median(captured) * 1e3,
        "ratio_min": min(ratios),
        "ratio_median": statistics.median(ratios),
        "ratio_max": max(ratios),
        "nodes": nodes,
        "floor_median": statistics.median(floors),
        "keeper_median": statistics.median(keepers),
        "own_median": statistics.median(own),
        "plain_page_faults": statistics.median(plain_faults),
        "captured_page_faults": statistics.median(captured_faults),
    }


def page_faults() -> int:
    """The process's minor page faults so far: each the first touch of a page of memory the system
    just gave it."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def per_call(rounds: int, n: int = 2000) -> dict[str, Any]:
    row = compare(f"chain of {n} tiny ops", *chain(n), rounds)
    row["us_per_call"] = (row["captured_ms"] - row["plain_ms"]) * 1e3 / row["nodes"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    rows = [
        compare("MLP 784-512-512-10, batch 128", *mlp(), args.rounds),
        compare("TransformerEncoderLayer d128 h4, seq 64, batch 8", *transformer(), args.rounds),
    ]
    call = per_call(args.rounds)
    lines = [
        f"torch {torch.__version__}, {platform.machine()}, one thread, float32, {args.rounds} rounds, "
        f"{'CPU' if args.clock == 'cpu' else 'wall'} time",
        "",
        "| step | plain ms | captured ms | ratio min | median | max | floor | keeper | own work | op nodes "
        "| page faults |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['model']} | {r['plain_ms']:.2f} | {r['captured_ms']:.2f} | {r['ratio_min']:.2f} | "
            f"{r['ratio_median']:.2f} | {r['ratio_max']:.2f} | {r['floor_median']:.2f} | "
            f"{r['keeper_median']:.2f} | {r['own_median']:.2f} | {r['nodes']} | "
            f"{r['plain_page_faults']:.0f} / {r['captured_page_faults']:.0f} |"
            for r in [*rows, call]
        ),
        "",
        f"fixed cost per recorded ATen call: {call['us_per_call']:.1f} us (the chain's extra time over its nodes)",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_capture.md").write_text(text + "\n")
    result = {"clock": args.clock, "rows": rows, "per_call": call}
    (RESULTS / "bench_capture.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
