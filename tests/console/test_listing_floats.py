"""The C listing's line writer and float digits (csrc/text.c) where they are easiest to get wrong:
floats at every decimal and binary exponent of the fast path and at every digit count, and lines
far longer than the writer's per-node guess (a huge name, tag or parent list)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from graphsvc.console import listing
from graphsvc.graph import Graph
from tests.conftest import require_native


@pytest.fixture(autouse=True, scope="module")
def ctext() -> Any:
    return require_native("text")


def c_floats(numbers: npt.NDArray[np.float64]) -> list[str]:
    """Each float as the C listing writes it: the value cell of a one-node-per-float graph."""
    n = len(numbers)
    graph = Graph(["leaf"], np.zeros(n, np.uint16), np.zeros(n + 1, np.int64), np.zeros(0, np.int32), numbers)
    text = "".join(listing.text(graph, np.arange(n), numbers))
    return [line.rsplit("\t", 1)[1] for line in text.splitlines()]


def test_floats_at_every_exponent_and_digit_count_read_as_repr() -> None:
    # the fast path covers [1e-4, 2^53): each power of ten and of two there, and their neighbours
    anchors = np.concatenate([10.0 ** np.arange(-5, 18), 2.0 ** np.arange(-15, 55)])
    near = [anchors]
    for steps in (1, 2, 3):
        up, down = anchors, anchors
        for _ in range(steps):
            up, down = np.nextafter(up, np.inf), np.nextafter(down, 0.0)
        near += [up, down]
    rng = np.random.default_rng(2026)
    # 1 to 17 significant digits, at every decimal exponent of the fast path
    digits = rng.integers(1, 18, 20_000)
    mantissas = rng.integers(10**16, 10**17, 20_000) // 10 ** (17 - digits)
    by_digits = mantissas.astype(np.float64) * 10.0 ** (rng.integers(-4, 17, 20_000) - digits + 1)
    numbers = np.concatenate([*near, by_digits, -by_digits, rng.uniform(1e-4, 2.0**53, 20_000)])
    assert c_floats(numbers) == list(map(repr, numbers.tolist()))
    assert c_floats(np.array([0.1, 0.3, 123456789012345.6, 9007199254740991.0, 1e-4, 0.00011])) == [
        "0.1",
        "0.3",
        "123456789012345.6",  # 16 digits
        "9007199254740991.0",  # the largest the fast path takes
        "0.0001",
        "0.00011",
    ]


def test_lines_much_longer_than_the_writers_guess_list_as_the_reference_does() -> None:
    """One node with 200,000 parents, a 100,000-character name and a long tag, among short ones."""
    n = 200_003
    parents = np.arange(n - 1, dtype=np.int32)  # node n-1 has every other node as a parent
    offsets = np.zeros(n + 1, np.int64)
    offsets[-1] = n - 1
    op_codes = np.zeros(n, np.uint16)
    op_codes[-1] = 1
    values = np.random.default_rng(3).standard_normal(n)
    graph = Graph(["leaf", "sum" * 20_000], op_codes, offsets, parents, values)
    graph.names = {n - 1: "é" * 100_000, 0: "a"}
    nodes = np.array([n - 1, 0, 1, n - 2])
    for args in ((), (values,), (values, -values)):
        c_text = "".join(listing.text(graph, nodes, *args))
        assert c_text == "".join(listing.reference_text(graph, nodes, *args))
    first = c_text.split("\n", 1)[0].split("\t")
    assert first[:2] == [str(n - 1), "é" * 100_000] and len(first[3].split(",")) == n - 1
