"""Coverage-guided fuzzing of the graph file decoder with atheris (libFuzzer for Python).

Run from the top of the checkout (``pip install -e ".[fuzz]"`` first)::

    python fuzz/fuzz_loads.py -max_total_time=600

With no corpus folder given, the harness uses ``fuzz/corpus/`` (not committed), seeded from the
golden files in ``schemas/examples/`` and the graphs in ``examples/``. Any libFuzzer option works
(``-runs=N``, ``-jobs=2``, ``-rss_limit_mb=512``); a crash is written to ``crash-<sha1>`` and replayed
with ``python fuzz/fuzz_loads.py crash-<sha1>``.

The property is ``fuzz/property.py``'s, shared with the hypothesis tests in
``tests/format/test_hostile_files.py``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["graphsvc"]):
    from fuzz.property import check_input
    from graphsvc.pluginhost import load_registry

REGISTRY, _ = load_registry(disable_third_party=True)
CORPUS = ROOT / "fuzz" / "corpus"
SEEDS = [*sorted((ROOT / "schemas" / "examples").glob("*.msgpack")), *sorted((ROOT / "examples").glob("*.msgpack"))]


def test_one_input(data: bytes) -> None:
    check_input(data, REGISTRY)


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
