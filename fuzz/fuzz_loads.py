"""Coverage-guided fuzzing of the graph file decoder with atheris (libFuzzer for Python).

Run from the top of the checkout (``pip install -e ".[fuzz]"`` first)::

    python fuzz/fuzz_loads.py -max_total_time=600

With no corpus folder given, the harness uses ``fuzz/corpus/`` (not committed), seeded from the
golden files in ``schemas/examples/`` and the graphs in ``examples/``. Any libFuzzer option works
(``-runs=N``, ``-jobs=2``, ``-rss_limit_mb=512``); a crash is written to ``crash-<sha1>`` and replayed
with ``python fuzz/fuzz_loads.py crash-<sha1>``.

The property: ``graphsvc.format.loads`` either returns a graph or raises ``FormatError``, never
another exception; and a graph that loads survives what the CLI does with it (encode and reload to
the same bytes, both orderings, depth, forward and backward replay with the builtin ops, where only
a ``GraphsvcError`` may escape).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["graphsvc"]):
    from graphsvc import format as fmt
    from graphsvc import replay
    from graphsvc.errors import FormatError, GraphsvcError
    from graphsvc.plugins import load_registry
    from graphsvc.topo import depth, reverse_topological_order

REGISTRY, _ = load_registry(disable_third_party=True)
CORPUS = ROOT / "fuzz" / "corpus"
SEEDS = [*sorted((ROOT / "schemas" / "examples").glob("*.msgpack")), *sorted((ROOT / "examples").glob("*.msgpack"))]


def test_one_input(data: bytes) -> None:
    try:
        graph = fmt.loads(data)
    except FormatError as exc:
        if str(exc).startswith("invalid document: "):  # format.py's safety net: a bug it hid
            raise AssertionError(f"the safety net caught a bug: {exc}") from exc
        return
    encoded = fmt.dumps(graph)
    if fmt.dumps(fmt.loads(encoded)) != encoded:
        raise AssertionError("a loaded graph does not round-trip to the same bytes")
    for algorithm in ("dfs", "kahn"):
        reverse_topological_order(graph, None, algorithm)
    depth(graph)
    try:
        values = replay.forward(graph, REGISTRY)
        for output in graph.outputs[:1]:
            replay.backward(graph, REGISTRY, output, values)
    except GraphsvcError:
        pass


def main() -> None:
    args = list(sys.argv)
    if not any(not arg.startswith("-") for arg in args[1:]):
        CORPUS.mkdir(parents=True, exist_ok=True)
        for seed in SEEDS:
            target = CORPUS / f"seed-{seed.parent.name}-{seed.name}"
            if not target.exists():
                shutil.copyfile(seed, target)
        args.append(str(CORPUS))
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
