"""Peak memory and time of one step, run in a fresh process by run.py: ``memstep.py STEP FILE WARMUP_FILE``.

Method: import everything, load the step's inputs, and run the step once on a small warm-up graph
(so the C kernels and the op registry are already resident). Then collect garbage, read
the resident set size (``VmRSS``), reset the kernel's peak counter (``echo 5 > /proc/self/clear_refs``
resets ``VmHWM``), run the step on the real graph, keep its result alive, and read ``VmHWM``. The
step's peak is ``VmHWM - VmRSS before``: memory the step needed on top of its inputs, including its
result. For the peaks, run.py sets ``MALLOC_MMAP_THRESHOLD_`` so freed large blocks go back to the
kernel at once and cannot hide a later allocation. ``step_seconds`` is the step's wall time (run.py
times steps this way too, without that setting: the cost of one CLI-like use, in a process whose
memory has not served an earlier run of the same step). Prints one JSON object.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _prepare(step: str, path: str) -> Any:
    """The inputs of ``step`` for the file at ``path`` (not counted in its peak)."""
    import graphsvc
    from graphsvc.pluginhost import load_registry

    if step == "load":
        return None
    if step == "pickle_load":
        return None
    if step == "pickle_dump":
        with open(path, "rb") as f:
            return pickle.load(f)
    graph = graphsvc.load(path)
    registry = load_registry(disable_third_party=True)[0] if step in ("forward", "backward") else None
    return graph, registry


def _run(step: str, path: str, inputs: Any, out: str) -> Any:
    import graphsvc
    from graphsvc.replay import columns as replay
    from graphsvc.topo import reverse_topological_order

    if step == "load":
        return graphsvc.load(path)
    if step == "pickle_load":
        with open(path, "rb") as f:
            return pickle.load(f)
    if step == "pickle_dump":
        with open(out, "wb") as f:
            pickle.dump(inputs, f, protocol=5)
        return None
    graph, registry = inputs
    output = graph.outputs[0]
    if step == "save":
        return graphsvc.save(graph, out)
    if step == "validate":
        return graph.check()
    if step == "order":
        return reverse_topological_order(graph, output)
    if step == "forward":
        return replay.forward(graph, registry)
    if step == "backward":
        return replay.backward(graph, registry, output)
    raise SystemExit(f"unknown step {step!r}")


def _warm_up(path: str) -> None:
    """Import what the steps use and run a compiled order and check once: one-time costs are not a
    step's."""
    import graphsvc
    from graphsvc.topo import reverse_topological_order

    graph = graphsvc.load(path)
    reverse_topological_order(graph)
    graph.check()


def main() -> None:
    step, path, warmup = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        if not step.startswith("pickle"):
            _warm_up(warmup)
            result = _run(step, warmup, _prepare(step, warmup), out)
            del result
        inputs = _prepare(step, path)
        gc.collect()
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        start = time.perf_counter()
        result = _run(step, path, inputs, out)
        seconds = time.perf_counter() - start
        peak = _status("VmHWM")
        del result
    row = {"step": step, "baseline_bytes": before, "peak_bytes": peak, "step_peak_bytes": peak - before}
    print(json.dumps({**row, "step_seconds": seconds}))


if __name__ == "__main__":
    main()
