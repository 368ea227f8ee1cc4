"""Differential fuzzing of the JSON form's C reader (``graphsvc.native._cjson``) against the long way.

Run from the top of the checkout::

    python fuzz/fuzz_json.py --seconds 60 --seed 1

Each input is a mutated JSON graph document (from the golden files in ``schemas/examples/`` and
generated graphs with arrays, attributes, names and hostile text): bytes flipped, inserted, removed
or repeated, numbers, escapes, nesting and shapes swapped in. Each is read by ``loads_versioned``
(the C reader first) and by ``read_objects`` alone (``json.loads``): the same graph (types and bits
included) or the same error type and message, else the input is written to ``json-diff-<sha1>.json``
and the run ends with status 1. Any exception other than a ``GraphFileError`` is a failure too. A
failing input is replayed with ``python fuzz/fuzz_json.py json-diff-<sha1>.json``.

For memory errors in C, build the extensions with AddressSanitizer and run under it::

    CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" python hatch_build.py json
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 python fuzz/fuzz_json.py --seconds 600

(then ``python hatch_build.py json`` again for the ordinary build). One process, no threads.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fuzz.property import described  # noqa: E402
from graphsvc import format as fmt  # noqa: E402
from graphsvc.errors import GraphFileError  # noqa: E402
from graphsvc.format import jsonio  # noqa: E402
from graphsvc.graph import Graph, GraphBuilder  # noqa: E402

#: Pieces spliced into documents: what a reader gets wrong at its edges.
PIECES = [
    "[" * 70 + "]" * 70,
    "[" * 100_000,
    '"\\ud800"',
    '"\\ud83d\\ude00"',
    '"\\udc00\\ud800"',
    '"\\u0000"',
    '"\\u00e9\\/\\b\\f"',
    '"\\',
    '"\\u12',
    "\x00",
    "\xff",
    "\xed\xa0\x80",
    "-0",
    "-0.0",
    "1e999",
    "-1e-400",
    "1e308",
    "3.4028235e38",
    "3.4028236e38",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1" + "0" * 400,
    "NaN",
    "Infinity",
    '"nan"',
    '"-inf"',
    '"in\\u0066"',
    "01",
    "1.",
    ".5",
    "1e",
    "true",
    "nul",
    '{"dtype": "float64", "shape": [0, 549755813888, 549755813888], "data": []}',
    '{"dtype": "int64", "shape": [2147483648], "data": []}',
    '{"dtype": "float32", "shape": [], "data": 1e39}',
    '{"dtype": "float64", "shape": [' + ", ".join(["1"] * 33) + "], " + '"data": ' + "[" * 33 + "1" + "]" * 33 + "}",
    "2147483647",
    "4294967296",
    '"a", "a": 1',
]


def generated() -> list[Graph]:
    """Graphs a writer gives: scalars, arrays of every dtype, names and attributes with hostile text."""
    b = GraphBuilder()
    x = b.leaf(math.nan, name='a"\\\n\t\x01\u202e\U0001f600')
    y = b.add("add", [x, x], value=math.inf, name="\u00e9", attrs={"k": [1, 2.5, "s\n", {"d": [[1]]}]})
    b.add("mul", [y, x], value=-0.0, attrs={"big": 2**64 - 1, "neg": -(2**63), "t": True, "z": None})
    scalars = b.build(metadata={"m": [1, {"q": "\u2028"}], "x": 1e-320})
    scalars.grads = np.array([1e-320, -math.inf, 5e16])
    b = GraphBuilder()
    for i, array in enumerate(
        [
            np.float64(2.5).reshape(()),
            np.zeros((2, 0)),
            np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 12,
            np.array([[0.1, np.nan], [np.inf, -1e-45]], dtype=np.float32),
            np.array([np.nan, -np.inf, 1e300, -0.0]),
        ]
    ):
        b.leaf(array, name=f"a{i}")
        b.leaf(float(i))
    tensors = b.build()
    tensors.grad_arrays = {3: np.array([[1.5, 2.0]] * 2, dtype=np.float32)}
    return [scalars, tensors]


def seeds() -> list[bytes]:
    graphs = generated()
    for path in sorted((ROOT / "schemas" / "examples").glob("**/*.msgpack")):
        try:
            graphs.append(fmt.load(path))
        except GraphFileError:
            pass
    found = []
    for graph in graphs:
        try:
            found.append(jsonio.dumps(graph).encode())
        except GraphFileError:
            pass
    return found


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(7)
        if kind == 0 and out:  # a byte changed
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif kind == 1:  # a piece spliced in, replacing a token's worth of bytes
            piece = rng.choice(PIECES).encode("latin-1" if rng.random() < 0.2 else "utf-8", "surrogatepass")
            out[at : at + rng.randrange(8)] = piece
        elif kind == 2:  # cut
            del out[at : at + rng.randrange(1, 16)]
        elif kind == 3:  # a stretch repeated
            out[at:at] = out[at : at + rng.randrange(1, 64)]
        elif kind == 4:  # the end cut off
            del out[at:]
        elif kind == 5:  # a digit changed
            digits = [i for i, c in enumerate(out) if 0x30 <= c <= 0x39]
            if digits:
                out[rng.choice(digits)] = rng.choice(b"0123456789-.eE")
        else:  # a quote, a bracket or a comma added or removed
            out[at:at] = bytes([rng.choice(b'"[]{},:\\')])
    return bytes(out)


def outcome(read: Callable[[], tuple[Graph, tuple[int, int]]]) -> tuple[Any, ...]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            graph, version = read()
        except GraphFileError as exc:
            return type(exc).__name__, str(exc)
        except Exception as exc:
            return "UNCAUGHT", type(exc).__name__, str(exc)[:200]
    return "graph", described(graph), version, [str(w.message) for w in said]


def check(data: bytes) -> str | None:
    """What is wrong with reading ``data`` both ways, or None."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            jsonio.read_columns(data)  # bytes straight into C, valid UTF-8 or not
        except Exception as exc:
            return f"read_columns raised {type(exc).__name__}: {exc}"
    if text is None:
        return None
    fast = outcome(lambda: jsonio.loads_versioned(text))
    slow = outcome(lambda: jsonio.read_objects(text))
    if fast[0] == "UNCAUGHT" or slow[0] == "UNCAUGHT":
        return f"uncaught: {fast if fast[0] == 'UNCAUGHT' else slow}"
    if fast != slow:
        return f"differ:\n  C first: {str(fast)[:400]}\n  long way: {str(slow)[:400]}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("replay", nargs="*", help="inputs to read again")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.replay:
        problems = [(name, check(Path(name).read_bytes())) for name in args.replay]
        for name, problem in problems:
            print(f"{name}: {problem or 'the same both ways'}")
        return 1 if any(problem for _, problem in problems) else 0
    rng = random.Random(args.seed)
    pool = seeds()
    start, runs = time.monotonic(), 0
    while time.monotonic() - start < args.seconds:
        data = mutate(rng.choice(pool), rng)
        runs += 1
        problem = check(data)
        if problem is not None:
            name = f"json-diff-{hashlib.sha1(data).hexdigest()}.json"
            Path(name).write_bytes(data)
            print(f"after {runs} inputs: {problem}\nsaved as {name}")
            return 1
        if runs % 500 == 0 and len(pool) < 400:  # a document both ways read alike joins the pool
            pool.append(data)
    print(f"{runs} inputs in {time.monotonic() - start:.0f} s, {len(seeds())} seeds: the same both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
