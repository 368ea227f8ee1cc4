"""PyTorch's backward on a saved graph, timed in its own process: ``torch_backward.py FILE ROUNDS``.

run.py runs this in a child process because a PyTorch backward leaves the process slower for
numpy work that follows (graphsvc's MLP backward measured about 5x slower in the same process
right after one, even after a pause), which would bill PyTorch's after-effects to graphsvc.
Prints one JSON object: the backward times, and whether the leaf gradients match graphsvc's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

import graphsvc  # noqa: E402
from benchmarks import graphs as G  # noqa: E402
from benchmarks.run import timed  # noqa: E402
from graphsvc.pluginhost import load_registry  # noqa: E402
from graphsvc.replay import columns as replay  # noqa: E402


def main() -> None:
    path, rounds = sys.argv[1], int(sys.argv[2])
    graph = graphsvc.load(path)
    registry = load_registry(disable_third_party=True)[0]
    ours = replay.backward(graph, registry, graph.outputs[0])
    out, leaves, leaf_ids = G.to_torch(graph)
    times = []
    for _ in range(rounds):
        for t in leaves:
            t.grad = None
        times.append(timed(lambda: out.backward(retain_graph=True)))
    theirs = np.array([0.0 if t.grad is None else t.grad.item() for t in leaves])
    matches = bool(np.allclose(ours[leaf_ids], theirs, rtol=1e-9, atol=1e-300))
    print(json.dumps({"times": times, "matches": matches}))


if __name__ == "__main__":
    main()
