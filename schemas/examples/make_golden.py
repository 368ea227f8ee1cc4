"""Build the golden example files of the format spec (run from the repository root).

    python schemas/examples/make_golden.py

Each file is the encoder's output for a graph built here by hand. ``tests/format/test_format.py`` rebuilds
the same graphs, checks that the encoder still gives the committed bytes, pins each file's sha256,
and validates each decoded file against ``schemas/graphsvc-v1.schema.json``. The tensor graphs of
``GOLDEN_V2`` (format 2.0) go to ``v2/`` and are pinned the same way by ``tests/format/test_format_v2.py``
against ``schemas/graphsvc-v2.schema.json``. A change to any of these bytes is a change to the
format: it needs a new version (see ``schemas/FORMAT.md``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from graphsvc.format import save
from graphsvc.graph import Graph, GraphBuilder, OpSource

HERE = Path(__file__).resolve().parent
#: Where the format 2.0 files go (apart, so that what globs the 1.0 files keeps finding only them).
V2 = HERE / "v2"


def _float_from_bits(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


def worked() -> Graph:
    """The worked example of FORMAT.md: y = a * 3 at a = 2."""
    b = GraphBuilder()
    a = b.leaf(2.0, name="a")
    three = b.const(3.0)
    b.add("mul", [a, three], name="y", value=6.0)
    return b.build()


def seed000() -> Graph:
    """Seed 000: y = log(1 + exp(sin(z))) at z = 0.5. Reverse order: y t3 t2 t1 z 1.

    Values are literals (not ``math.sin(0.5)``) so the bytes cannot depend on the platform's libm.
    """
    b = GraphBuilder()
    z = b.leaf(0.5, name="z")
    t1 = b.add("sin", [z], name="t1", value=0.479425538604203)
    t2 = b.add("exp", [t1], name="t2", value=1.6151462964420837)
    one = b.const(1.0, name="1")
    t3 = b.add("add", [one, t2], name="t3", value=2.6151462964420835)
    b.add("log", [t3], name="y", value=0.9613200410541526)
    return b.build(metadata={"source": "seed 000"})


def grads() -> Graph:
    """Seed 004 with its gradients: L = (a*b + c)*(a + b) at a=2, b=3, c=1."""
    b = GraphBuilder()
    a = b.leaf(2.0, name="a", grad=22.0)
    bb = b.leaf(3.0, name="b", grad=17.0)
    c = b.leaf(1.0, name="c", grad=5.0)
    ab = b.add("mul", [a, bb], name="ab", value=6.0, grad=5.0)
    abc = b.add("add", [ab, c], name="abc", value=7.0, grad=5.0)
    apb = b.add("add", [a, bb], name="apb", value=5.0, grad=7.0)
    b.add("mul", [abc, apb], name="L", value=35.0, grad=1.0)
    return b.build()


def attrs_metadata() -> Graph:
    """Attributes of every msgpack-native kind, an op from a plugin, two outputs and rich metadata."""
    b = GraphBuilder()
    b.op_sources["pow"] = OpSource("graphsvc-extra-ops", "1.2.0")
    x = b.leaf(3.0, name="x")
    sq = b.add("pow", [x], name="sq", value=9.0, attrs={"exponent": 2.0})
    b.add("mul", [x, x], value=9.0)  # unnamed, the same parent twice
    b.add(
        "clip",
        [sq],
        name="clipped",
        value=5.0,
        attrs={"upper": 5, "lower": -1, "inclusive": True, "mode": "hard", "extra": None, "bounds": [-1, 5.5]},
    )
    return b.build(
        outputs=["clipped", 2],
        metadata={"author": "graphsvc", "step": 7, "lr": 0.5, "frozen": False, "tags": ["a", 1], "nested": {"k": None}},
    )


def special_floats() -> Graph:
    """Values whose bits must survive: -0.0, inf, -inf, nan, -nan and a nan with a payload."""
    b = GraphBuilder()
    specials = [-0.0, math.inf, -math.inf, math.nan, _float_from_bits(0xFFF8000000000000)]
    ids = [b.leaf(v, grad=-v) for v in specials]
    b.add("sum", ids, value=_float_from_bits(0x7FF8000000000123), grad=0.0)
    return b.build()


GOLDEN: dict[str, Callable[[], Graph]] = {
    "worked": worked,
    "seed000": seed000,
    "grads": grads,
    "attrs_metadata": attrs_metadata,
    "special_floats": special_floats,
}


def tensor_worked() -> Graph:
    """The worked example of FORMAT.md §15: y = x * w with x = [1.5, -2] (float32) and w = 3."""
    b = GraphBuilder()
    x = b.leaf(np.array([1.5, -2.0], dtype=np.float32), name="x")
    w = b.leaf(3.0, name="w")
    b.add("mul", [x, w], name="y", value=np.array([4.5, -6.0], dtype=np.float32))
    return b.build()


def tensor_kinds() -> Graph:
    """Every dtype, a 0-d array, empty arrays, array gradients beside a grads column, and the bits
    that must survive: float32 -0.0, infinities and nans with payloads, int64's extremes."""
    b = GraphBuilder()
    f32 = np.array([0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000], dtype=np.uint32)
    x = b.leaf(f32.view(np.float32).reshape(2, 3), name="x", grad=np.full((2, 3), 0.5, dtype=np.float32))
    labels = b.leaf(np.array([-(1 << 63), -1, 0, (1 << 63) - 1], dtype=np.int64), name="labels")
    scale = b.leaf(np.array(2.0), name="scale", grad=np.array(-0.0))  # 0-d float64
    empty = b.const(np.zeros((0, 4), dtype=np.float64), name="empty")
    bias = b.leaf(1.0, name="bias", grad=0.25)  # a scalar node: the grads column
    picked = b.add("take", [x, labels], attrs={"axis": 1}, value=np.zeros((2, 0), dtype=np.float32))
    b.add("add", [picked, scale, empty, bias], name="out")
    return b.build(metadata={"made by": "make_golden.tensor_kinds"})


GOLDEN_V2: dict[str, Callable[[], Graph]] = {
    "tensor_worked": tensor_worked,
    "tensor_kinds": tensor_kinds,
}


def main() -> None:
    for name, make in GOLDEN.items():
        save(make(), HERE / f"{name}.msgpack")
    V2.mkdir(exist_ok=True)
    for name, make in GOLDEN_V2.items():
        save(make(), V2 / f"{name}.msgpack")


if __name__ == "__main__":
    main()
