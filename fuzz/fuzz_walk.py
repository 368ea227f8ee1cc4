"""Differential fuzzing of diff's alignment walk in C (``align_walk``) against its Python reference.

Run from the top of the checkout::

    python fuzz/fuzz_walk.py --seconds 60 --seed 1

Each case is two random graphs grown from one seed: leaves (some named), then ops of one or two
inputs over a few tags, the second graph drifting from the first (other tags, other inputs, nodes
added or missing) so that nodes compete for partners, and one or two outputs. Each
pair is aligned by ``graphsvc.diff.align`` with the compiled walk and with the reference walk: the
same pairs and the same unaligned nodes, or the case's seed is printed and the run ends with status
1 (replayed with ``python fuzz/fuzz_walk.py --case SEED``). Any exception is a failure too.

For memory errors in C, build the extension with AddressSanitizer and run under it::

    CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" python hatch_build.py topo
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 python fuzz/fuzz_walk.py --seconds 600

(then ``python hatch_build.py topo`` again for the ordinary build). One process, no threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphsvc.diff import align  # noqa: E402
from graphsvc.graph import Graph, GraphBuilder  # noqa: E402
from graphsvc.native import REFERENCE, Engine, _compiled, built  # noqa: E402

UNARY = ("neg", "exp")
TAGS = ("add", "mul", "sub", *UNARY)


def pair(case: int) -> tuple[Graph, Graph]:
    """Two graphs grown by the same draws from one seed, the second drifting from the first (another
    tag, another input, a node added or left out, after the first quarter) by draws of its own."""
    shape = np.random.default_rng(case)
    leaves, ops, drift = int(shape.integers(1, 6)), int(shape.integers(0, 150)), float(shape.random())
    two_outputs = shape.random() < 0.2
    graphs = []
    for variant in (0, 1):
        same = np.random.default_rng([case, 1])  # both graphs draw the same sequence from it
        own = np.random.default_rng([case, 2])
        b = GraphBuilder()
        nodes = [b.leaf(float(i), f"x{i}" if same.random() < 0.5 else None) for i in range(leaves)]
        names: set[str] = set()
        for i in range(ops):
            op = TAGS[int(same.integers(len(TAGS)))]
            picks = [int(k) for k in same.integers(0, 1 << 30, size=2)]
            name = f"n{int(same.integers(0, 60))}" if same.random() < 0.3 else None
            if variant and i > ops // 4 and own.random() < drift:
                change = int(own.integers(4))
                if change == 0:
                    op = TAGS[int(own.integers(len(TAGS)))]
                elif change == 1:
                    picks[0] = int(own.integers(0, 1 << 30))
                elif change == 2:
                    nodes.append(b.leaf(float(-i)))  # a node only here
                else:
                    continue  # a node left out
            inputs = [nodes[k % len(nodes)] for k in picks[: 1 if op in UNARY else 2]]
            if name in names:
                name = None
            elif name is not None:
                names.add(name)
            nodes.append(b.add(op, inputs, name=name))
        outputs = [nodes[-1], nodes[len(nodes) // 2]] if two_outputs else [nodes[-1]]
        graphs.append(b.build(list(dict.fromkeys(outputs))))
    return graphs[0], graphs[1]


def check(case: int) -> str | None:
    """None when both walks align the case's pair alike, else what differs."""
    a, b = pair(case)
    matched_c, unaligned_c = align(a, b, engine=Engine(_compiled()))
    matched_py, unaligned_py = align(a, b, engine=REFERENCE)
    if matched_c.tolist() != matched_py.tolist():
        return f"case {case}: the pairs differ"
    if [u.to_json() for u in unaligned_c] != [u.to_json() for u in unaligned_py]:
        return f"case {case}: the unaligned nodes differ"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0, help="the first case; cases count up from it")
    parser.add_argument("--case", type=int, action="append", default=[], help="a case to run again")
    args = parser.parse_args()
    if not built():
        print("the C extensions are not built here (pip install -e . builds them)")
        return 2
    if args.case:
        problems = [check(case) for case in args.case]
        for case, problem in zip(args.case, problems, strict=True):
            print(problem or f"case {case}: the same both ways")
        return 1 if any(problems) else 0
    start, case = time.monotonic(), args.seed
    while time.monotonic() - start < args.seconds:
        problem = check(case)
        if problem is not None:
            print(f"{problem}\nreplay: python fuzz/fuzz_walk.py --case {case}")
            return 1
        case += 1
    print(f"{case - args.seed} cases in {time.monotonic() - start:.0f} s: the same both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
