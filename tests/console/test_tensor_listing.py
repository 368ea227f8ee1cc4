"""graphsvc.console.tensor_listing: the listings of tensor graphs, the numbers of many arrays worked out at
once, held to its one-array functions (summary, json_cell, norm; graphsvc.replay.arrays.describe; the
nan/inf test of graphsvc.replay.compare.finite) text for text and bit for bit, and the CLI's listings to
rows built with those."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.console import listing, tensor_listing
from graphsvc.console.tensor_listing import json_cell, node_cells, norm, summary
from graphsvc.graph import GraphBuilder
from graphsvc.pluginhost import load_registry
from graphsvc.replay import compare
from graphsvc.replay.arrays import describe
from graphsvc.replay.run import replay_values

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

#: Numbers that rounding, signs and overflow get wrong: signed zeros, nan, the infinities, the
#: largest and smallest of each dtype (a float32 sum of them overflows in float32, not in float64).
SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324, 3.4e38, -3.4e38, 1e-45, 1.5, -2.5, 0.5]

SHAPES = [(), (0,), (0, 3), (1,), (2,), (3, 4), (7,), (8,), (9,), (17,), (2, 3, 5), (100,), (8192,), (8193,)]


def random_arrays(rng: np.random.Generator, count: int) -> list[np.ndarray | None]:
    """Arrays of every dtype a graph holds, of shapes that come back often (so groups have many
    members), with special numbers in some; some views that are not C-contiguous; some None."""
    arrays: list[np.ndarray | None] = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.05:
            arrays.append(None)
            continue
        shape = SHAPES[rng.integers(len(SHAPES))] if rng.random() < 0.95 else (int(rng.integers(1, 40)),)
        dtype = [np.float64, np.float32, np.int64][rng.integers(3)]
        if dtype is np.int64:
            array = np.asarray(rng.integers(-(2**62), 2**62, size=shape, dtype=np.int64))
        else:
            with np.errstate(all="ignore"):
                array = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 40, size=shape)).astype(dtype)
            if array.size and rng.random() < 0.3:
                flat = array.reshape(-1)
                where = rng.integers(array.size, size=int(rng.integers(1, 4)))
                with np.errstate(all="ignore"):
                    flat[where] = np.array(SPECIAL, dtype=np.float64)[rng.integers(len(SPECIAL), size=len(where))]
        if array.ndim >= 2 and rng.random() < 0.3:
            array = array.T  # not C-contiguous (unless a dimension is 1)
        elif array.ndim == 1 and array.size > 2 and rng.random() < 0.1:
            array = array[::2]  # strided
        array.flags.writeable = rng.random() < 0.5
        arrays.append(array)
    return arrays


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def reference_json(array: np.ndarray | None) -> str:
    return json.dumps(json_cell(array, data=False), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@contextmanager
def bufsize(size: int) -> Iterator[None]:
    old = np.setbufsize(size)
    try:
        yield
    finally:
        np.setbufsize(old)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("batch", [7, 1 << 20])  # 7 elements: a group in many batches, an array per batch
def test_the_numbers_of_many_arrays_are_those_of_one_array_at_a_time(
    seed: int, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compare, "BATCH_ELEMENTS", batch)
    arrays = random_arrays(np.random.default_rng(seed), 1500)
    assert tensor_listing.summaries(arrays) == ["-" if a is None else summary(a) for a in arrays]
    gradients = tensor_listing.summaries(arrays, gradient=True)
    assert gradients == ["-" if a is None else summary(a, gradient=True) for a in arrays]
    assert tensor_listing.json_cells(arrays) == [reference_json(a) for a in arrays]
    norms = tensor_listing.norms(arrays)
    assert [bits(n) for n, a in zip(norms, arrays, strict=True) if a is not None] == [
        bits(norm(a)) for a in arrays if a is not None
    ]
    assert compare.finite(arrays) == [a is None or a.dtype == np.int64 or bool(np.all(np.isfinite(a))) for a in arrays]
    assert tensor_listing.descriptions(arrays) == [None if a is None else describe(a) for a in arrays]


def test_a_float32_array_larger_than_numpy_s_buffer_keeps_its_own_sum() -> None:
    """np.mean(float32, dtype=float64) adds up buffers of np.getbufsize() cast elements: a mean of
    one matrix row would differ in the last bit for some of these (their float64 sums round: the
    exponents are far apart), so they are left to summary()."""
    rng = np.random.default_rng(7)
    arrays = [(rng.standard_normal(200) * 10.0 ** rng.integers(-6, 6, 200)).astype(np.float32) for _ in range(300)]
    with bufsize(16):
        assert tensor_listing.summaries(list(arrays)) == [summary(a) for a in arrays]
        assert tensor_listing.json_cells(list(arrays)) == [reference_json(a) for a in arrays]
        rows = np.stack(arrays).astype(np.float64)
        differing = (np.add.reduce(rows, axis=1) / 200).tolist() != [
            float(np.mean(a, dtype=np.float64)) for a in arrays
        ]
    assert differing  # the rule is needed: one row's pairwise sum is not the buffered one


def test_summaries_of_the_forms_a_listing_shows() -> None:
    arrays: list[np.ndarray | None] = [
        np.array(2.5),
        np.array(-0.0),
        np.array(np.nan),
        np.float32(0.1) * np.ones((), dtype=np.float32),
        np.array(7, dtype=np.int64),
        np.zeros((0, 3), dtype=np.float32),
        np.array([3, -9, 4], dtype=np.int64),
        np.array([1.0, np.inf], dtype=np.float32),
        np.array([-0.0, -0.0]),
        np.array([3.4e38, 3.4e38], dtype=np.float32),
        None,
    ]
    assert tensor_listing.summaries(arrays) == [
        "2.5",
        "-0.0",
        "nan",
        "f32[] 0.1",
        "i64[] 7",
        "f32[0,3]",
        "i64[3] min=-9 max=4",
        "f32[2] mean=inf max|x|=inf",
        "f64[2] mean=0 max|x|=0",  # numpy's sum starts from +0.0
        "f32[2] mean=3.4e+38 max|x|=3.4e+38",  # the mean is taken in float64: no overflow
        "-",
    ]
    assert tensor_listing.summaries(arrays) == ["-" if a is None else summary(a) for a in arrays]
    assert tensor_listing.json_cells(arrays[:3] + arrays[6:8]) == [
        "2.5",
        "-0.0",
        '"nan"',
        '{"dtype":"int64","shape":[3],"min":-9,"max":4}',
        '{"dtype":"float32","shape":[2],"mean":"inf","max_abs":"inf"}',
    ]


# -- the CLI's listings ----------------------------------------------------------------------------
runner = CliRunner()


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A tensor graph of every kind of cell: float32 and float64 arrays, a transposed view (not
    C-contiguous), int64 indices (no gradient), 0-d results, an inf off the loss's path, names that
    need escaping."""
    b = GraphBuilder()
    x = b.leaf(np.array([[1.5, -2.0, 0.25], [4.0, -0.0, 3.0]], dtype=np.float32), name="x")
    w = b.leaf(np.array([0.5, -1.0, 2.0]), name="w\tweights")
    i = b.const(np.array([2, 0], dtype=np.int64), name="i")
    rows = b.add("take", [b.add("neg", [b.add("transpose", [x], name="xT")]), i], attrs={"axis": 0})
    h = b.add("tanh", [rows], name='"h"')
    m = b.add("mul", [b.add("sum", [h], attrs={"axis": 1}), b.add("sum", [w])])
    y = b.add("sum", [b.add("mul", [m, m])], name="loss")
    b.add("neg", [b.leaf(np.array([1.0, np.inf, -0.0], dtype=np.float32), name="bad")])
    out = b.add("add", [y, b.add("sum", [x], name="total")], name="out")
    fmt.save(b.build(outputs=[out]), tmp_path / "mixed.msgpack")
    return tmp_path / "mixed.msgpack"


def cli(*args: str) -> str:
    result = runner.invoke(app, ["--disable-plugins", *args])
    assert (result.exit_code, result.stderr) == (0, "")
    return result.stdout


#: ``graphsvc backward --steps mixed.msgpack``, as the listing printed it a node at a time.
MIXED_STEPS = """\
step 1: out (add) grad f64[] norm 1
  -> loss: f64[] norm 1
  -> total: f32[] norm 1
step 2: total (sum) grad f32[] norm 1
  -> x: f32[2,3] norm 2.44949
step 3: loss (sum) grad f64[] norm 1
  -> #10: f64[2] norm 1.41421
step 4: #10 (mul) grad f64[2] norm 1.41421
  -> #9: f64[2] norm 3.40885
  -> #9: f64[2] norm 3.40885
step 5: #9 (mul) grad f64[2] norm 6.81771
  -> #7: f32[2] norm 10.2266
  -> #8: f64[] norm 15.4937
step 6: #8 (sum) grad f64[] norm 15.4937
  -> w\\tweights: f64[3] norm 26.8359
step 7: #7 (sum) grad f32[2] norm 10.2266
  -> "h": f32[2,2] norm 14.4625
step 8: "h" (tanh) grad f32[2,2] norm 14.4625
  -> #5: f32[2,2] norm 5.46931
step 9: #5 (take) grad f32[2,2] norm 5.46931
  -> #4: f32[3,2] norm 5.46931
  -> i: no gradient
step 10: #4 (neg) grad f32[3,2] norm 5.46931
  -> xT: f32[3,2] norm 5.46931
step 11: xT (transpose) grad f32[3,2] norm 5.46931
  -> x: f32[2,3] norm 5.46931
step 12: w\\tweights (leaf) grad f64[3] norm 26.8359
step 13: x (leaf) grad f32[2,3] norm 7.04515

"""

#: ``graphsvc backward mixed.msgpack``, as it was listed a node at a time.
MIXED_LISTING = """\
15	out	add	11,14	18.370280276089947	1.0
14	total	sum	0	f32[] 6.75	f32[] 1.0
13	-	neg	12	f32[3] mean=-inf max|x|=inf	f32[3] mean=0 max|g|=0
12	bad	leaf	-	f32[3] mean=inf max|x|=inf	f32[3] mean=0 max|g|=0
11	loss	sum	10	11.620280276089947	1.0
10	-	mul	9,9	f64[2] mean=5.81014 max|x|=8.16083	f64[2] mean=1 max|g|=1
9	-	mul	7,8	f64[2] mean=-2.35834 max|x|=2.85672	f64[2] mean=-4.71668 max|g|=5.71343
8	-	sum	1	1.5	15.493707034786596
7	-	sum	6	f32[2] mean=-1.57223 max|x|=1.90448	f32[2] mean=-7.07501 max|g|=8.57015
6	"h"	tanh	5	f32[2,2] mean=-0.786113 max|x|=0.999329	f32[2,2] mean=-7.07501 max|g|=8.57015
5	-	take	4,2	f32[2,2] mean=-2.1875 max|x|=4	f32[2,2] mean=-1.7151 max|g|=5.24517
4	-	neg	3	f32[3,2] mean=-1.125 max|x|=4	f32[3,2] mean=-1.1434 max|g|=5.24517
3	xT	transpose	0	f32[3,2] mean=1.125 max|x|=4	f32[3,2] mean=1.1434 max|g|=5.24517
2	i	const	-	i64[2] min=0 max=2	-
1	w\\tweights	leaf	-	f64[3] mean=0.5 max|x|=2	f64[3] mean=15.4937 max|g|=15.4937
0	x	leaf	-	f32[2,3] mean=1.125 max|x|=4	f32[2,3] mean=2.1434 max|g|=6.24517
nonfinite values: first at bad[1] (node 12, leaf) = inf; 2 of 16 nodes
"""


@pytest.mark.parametrize("chunk", [3, listing.CHUNK])  # 3 nodes: a listing of many chunks
def test_forward_and_backward_list_each_node_as_node_cells_gives_it(
    mixed: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "CHUNK", chunk)
    for command in ("forward", "backward"):
        graph, run = replayed(mixed, command == "backward")
        nodes = range(graph.num_nodes - 1, -1, -1)
        rows = "".join("\t".join(node_cells(graph, node, run.values, run.grads)) + "\n" for node in nodes)
        assert cli(command, str(mixed)).startswith(rows)
        objects = [
            {
                "id": node,
                "name": graph.names.get(node),
                "op": graph.op(node),
                "parents": graph.parents(node),
                "value": json_cell(run.values[node], False),
                "grad": None if run.grads is None else json_cell(run.grads[node], False),
            }
            for node in nodes
        ]
        nodes_text = ",".join(json.dumps(o, separators=(",", ":"), ensure_ascii=False) for o in objects)
        assert f'"nodes":[{nodes_text}],' in cli(command, str(mixed), "--json")


def test_the_mixed_graph_s_listing_and_steps_exactly(mixed: Path) -> None:
    assert cli("backward", str(mixed)) == MIXED_LISTING
    assert cli("backward", str(mixed), "--steps") == MIXED_STEPS + MIXED_LISTING
    steps = json.loads(cli("backward", str(mixed), "--steps", "--json"))["steps"]
    assert steps[4] == {
        "node": 9,
        "grad": {"dtype": "float64", "shape": [2], "norm": 6.817706440171782},
        "to": [{"parent": 7, "norm": 10.226559762493663}, {"parent": 8, "norm": 15.493707034786596}],
    }
    assert steps[8]["to"][1] == {"parent": 2, "norm": None}


def replayed(path: Path, backward: bool) -> tuple[Any, Any]:
    graph = fmt.load(path)
    registry, problems = load_registry(disable_third_party=True)
    assert not problems
    return graph, replay_values(graph, registry, {}, graph.num_nodes - 1 if backward else None, steps=backward)
