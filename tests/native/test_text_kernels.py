"""The C listings (graphsvc.native._ctext, behind listing.text and listing.json_objects) against the
pure-Python references, byte for byte: every example file, a large random graph with hostile names
and odd floats, every chunk size, and floats one by one against ``repr``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from graphsvc import format as fmt
from graphsvc.console import listing
from graphsvc.graph import Graph
from graphsvc.topo import reverse_topological_order
from tests.conftest import ROOT, require_native

EXAMPLES = sorted([*(ROOT / "examples").glob("*.msgpack"), *(ROOT / "schemas" / "examples").glob("*.msgpack")])


@pytest.fixture(autouse=True, scope="module")
def ctext() -> Any:
    """Every test here compares graphsvc.native._ctext with the references (see require_native)."""
    return require_native("text")


def test_the_c_listing_is_in_use_when_built() -> None:
    from graphsvc.native import _ctext

    assert listing.NATIVE is True
    assert listing._ctext is _ctext


def both_texts(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> tuple[str, str]:
    """(C, reference) text, each chunk checked to end with a newline."""
    c_chunks = list(listing.text(graph, nodes, values, grads))
    reference_chunks = list(listing.reference_text(graph, nodes, values, grads))
    assert [len(chunk) for chunk in c_chunks] == [len(chunk) for chunk in reference_chunks]
    assert all(chunk.endswith("\n") for chunk in c_chunks)
    return "".join(c_chunks), "".join(reference_chunks)


def both_json(
    graph: Graph,
    nodes: npt.ArrayLike,
    values: npt.NDArray[np.float64] | None = None,
    grads: npt.NDArray[np.float64] | None = None,
) -> tuple[str, str]:
    c_chunks = list(listing.json_objects(graph, nodes, values, grads))
    reference_chunks = list(listing.reference_json_objects(graph, nodes, values, grads))
    assert c_chunks == reference_chunks  # chunk by chunk, the leading commas included
    return "[" + "".join(c_chunks) + "]", "[" + "".join(reference_chunks) + "]"


def assert_same_listings(
    graph: Graph, nodes: npt.ArrayLike, values: npt.NDArray[np.float64], grads: npt.NDArray[np.float64]
) -> None:
    """Text and JSON, C == reference, without values, with values, with both, with grads alone."""
    for args in ((), (values,), (values, grads), (None, grads)):
        c_text, reference = both_texts(graph, nodes, *args)
        assert c_text == reference
        c_json, reference = both_json(graph, nodes, *args)
        assert c_json == reference
    parsed = json.loads(c_json)  # the C document parses back to the nodes it lists
    ids = np.asarray(nodes).tolist()
    assert [item["id"] for item in parsed] == ids
    assert [item["name"] for item in parsed] == [graph.names.get(node) for node in ids]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_example_file_lists_the_same(path: Path) -> None:
    graph = fmt.load(path)
    nodes = reverse_topological_order(graph, None, "dfs")
    grads = graph.grads if graph.grads is not None else np.linspace(-1.0, 1.0, graph.num_nodes)
    assert_same_listings(graph, nodes, graph.values, grads)
    c_json, _ = both_json(graph, nodes, graph.values)
    parsed = json.loads(c_json)
    assert [item["parents"] for item in parsed] == [graph.parents(int(node)) for node in nodes]
    expected = [value if math.isfinite(value) else repr(value) for value in graph.values[nodes].tolist()]
    assert [item["value"] for item in parsed] == expected


#: Names that escaping (text) and json.dumps (JSON) must both get right.
HOSTILE = [
    "",
    "plain",
    'quote " and \\ backslash',
    "tab\tnew\nline\rreturn",
    "\x1b[31mred\x1b[0m",
    "\x00\x01\x08\x0c\x1f\x7f\x80\x85\x9f",
    "é ü 中文 🙂 \u2028\u2029 \u202e bidi \u2066",
    "\\n spelled, not a newline",
    "-",
    "lone \ud800 surrogate \udfff",
]

#: Floats where repr is easy to get wrong.
ODD = np.array(
    [
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        0.0,
        -0.0,
        5e-324,
        -2.2250738738585072e-308,
        2.2250738585072014e-308,
        1e16,
        9999999999999998.0,
        1e-7,
        1e-4,
        0.0001,
        9.999999999999999e-05,
        1e-5,
        0.1,
        0.3,
        1 / 3,
        2.0**53,
        2.0**53 - 1,
        2.0**-20,
        1.7976931348623157e308,
        123456789012345.25,
        965943514308051.25,
        1e22,
        1.5e300,
        -123.456,
        100.0,
        1e15,
    ]
)


def random_graph(n: int, seed: int) -> tuple[Graph, npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """n nodes: a fifth leaves, the rest with 1-3 earlier parents (repeats allowed); most named with
    hostile names; values and grads random bit patterns, ordinary floats and the odd ones above."""
    rng = np.random.default_rng(seed)
    op_table = ["leaf", "const", "add", "mul", 'we"ird\top\\', "\x1b]op"]
    leaves = max(n // 5, 1)
    counts = np.concatenate([np.zeros(leaves, np.int64), rng.integers(1, 4, n - leaves)])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    owner = np.repeat(np.arange(n), counts)
    parents = (rng.random(len(owner)) * owner).astype(np.int32)  # an earlier node
    codes = np.concatenate([rng.integers(0, 2, leaves), rng.integers(2, len(op_table), n - leaves)]).astype(np.uint16)

    def floats() -> npt.NDArray[np.float64]:
        out = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 20, n)
        out[::10] = rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64)[::10]  # any bit pattern
        out[1::7] = rng.choice(ODD, len(out[1::7]))
        return out

    names = {int(i): HOSTILE[int(i) % len(HOSTILE)] + str(int(i) % 97) for i in rng.permutation(n)[: n * 4 // 5]}
    names[0] = ""  # an empty name is "-" in text, "" in JSON
    values, grads = floats(), floats()
    graph = Graph(op_table, codes, offsets, parents, values, None, names)
    return graph, values, grads


@pytest.fixture(scope="module")
def big() -> tuple[Graph, npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    return random_graph(70_000, seed=13)


@pytest.mark.parametrize("chunk", [1, 2, 3, listing.CHUNK])
def test_a_large_random_graph_lists_the_same_at_every_chunk_size(
    chunk: int,
    big: tuple[Graph, npt.NDArray[np.float64], npt.NDArray[np.float64]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph, values, grads = big
    # every node across two full chunks; at the tiny sizes (slow in the reference) every 17th node
    nodes = np.arange(graph.num_nodes)[:: -1 if chunk == listing.CHUNK else -17]
    monkeypatch.setattr(listing, "CHUNK", chunk)
    assert_same_listings(graph, nodes, values, grads)


def test_names_without_escapes_and_graphs_without_names() -> None:
    graph, values, grads = random_graph(5_000, seed=1)
    graph.names = {node: f"n{node}" for node in range(0, graph.num_nodes, 2)}
    assert_same_listings(graph, np.arange(graph.num_nodes), values, grads)
    graph.names = {}
    assert_same_listings(graph, np.arange(graph.num_nodes), values, grads)
    text, _ = both_texts(graph, [4_000, 1])
    assert text.splitlines()[1] == f"1\t-\t{graph.op(1)}\t-"


def test_a_lone_surrogate_lists_escaped() -> None:
    """json.loads makes one from "\\ud800" in a JSON graph file; strict UTF-8 refuses it, so it is
    listed escaped (as its JSON escape in JSON), never as it is."""
    graph = Graph(["leaf"], np.zeros(1, np.uint16), np.zeros(2, np.int64), np.zeros(0, np.int32), np.array([1.5]))
    graph.names = {0: "a\ud800b"}
    c_text, reference = both_texts(graph, [0])
    assert c_text == reference == "0\ta\\ud800b\tleaf\t-\n"
    c_json, reference = both_json(graph, [0], graph.values)
    assert c_json == reference == '[{"id":0,"name":"a\\ud800b","op":"leaf","parents":[],"value":1.5,"grad":null}]'
    assert json.loads(c_json)[0]["name"] == "a\ud800b"


#: Characters that draw as nothing, reorder text or drive a terminal, each written as repr writes it in
#: text and as its JSON escape in JSON (graphsvc.text.escape, json_escaped; docs/cli.md).
INVISIBLE = [
    ("\u200b", "\\u200b", "\\u200b"),
    ("\u200d", "\\u200d", "\\u200d"),
    ("\xad", "\\xad", "\\u00ad"),
    ("\U000e0041", "\\U000e0041", "\\udb40\\udc41"),
    ("\ufeff", "\\ufeff", "\\ufeff"),
    ("\u202e", "\\u202e", "\\u202e"),
    ("\x9b", "\\x9b", "\\u009b"),
    ("\x7f", "\\x7f", "\\u007f"),
    ("\u2029", "\\u2029", "\\u2029"),
    ("\xa0", "\\xa0", "\\u00a0"),
]


@pytest.mark.parametrize(("char", "text", "json_text"), INVISIBLE, ids=[ascii(c) for c, _, _ in INVISIBLE])
def test_invisible_characters_list_escaped_alike_in_c_and_python(char: str, text: str, json_text: str) -> None:
    graph = Graph(
        ["leaf", f"op{char}"],
        np.array([0, 1], np.uint16),
        np.array([0, 0, 1], np.int64),
        np.zeros(1, np.int32),
        np.array([1.5, 2.0]),
    )
    graph.names = {0: f"a{char}b", 1: f"é{char}"}
    c_text, reference = both_texts(graph, [1, 0], graph.values)
    assert c_text == reference == f"1\té{text}\top{text}\t0\t2.0\n0\ta{text}b\tleaf\t-\t1.5\n"
    c_json, reference = both_json(graph, [1, 0])
    assert (
        c_json
        == reference
        == (
            f'[{{"id":1,"name":"é{json_text}","op":"op{json_text}","parents":[0]}},'
            f'{{"id":0,"name":"a{json_text}b","op":"leaf","parents":[]}}]'
        )
    )
    assert [node["name"] for node in json.loads(c_json)] == [f"é{char}", f"a{char}b"]


def floats_texts(numbers: npt.NDArray[np.float64]) -> list[str]:
    """Each float as the C listing writes it (the value cell of a one-node-per-float graph)."""
    n = len(numbers)
    graph = Graph(["leaf"], np.zeros(n, np.uint16), np.zeros(n + 1, np.int64), np.zeros(0, np.int32), numbers)
    return [line.rsplit("\t", 1)[1] for line in "".join(listing.text(graph, np.arange(n), numbers)).splitlines()]


def test_floats_are_written_as_repr_writes_them() -> None:
    rng = np.random.default_rng(5)
    n = 50_000
    numbers = np.concatenate(
        [
            ODD,
            rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64),  # any bit pattern
            rng.standard_normal(n) * 10.0 ** rng.integers(-6, 18, n),
            np.round(rng.uniform(0, 1e6, n)) / 10.0 ** rng.integers(0, 9, n),  # short decimals
            (rng.integers(0, 2**20, n) + 0.25 * rng.integers(0, 4, n)) * 2.0 ** rng.integers(-4, 40, n),  # ties
            2.0 ** rng.integers(-1074, 1024, n),  # powers of two
            np.nextafter(np.round(rng.uniform(0, 100, n), 3), rng.choice([np.inf, -np.inf], n)),
            rng.integers(-(2**53), 2**53, n).astype(np.float64),
        ]
    )
    assert floats_texts(numbers) == list(map(repr, numbers.tolist()))
    assert floats_texts(np.array([965943514308051.25, 0.0001, 1e-05, 1e16, -0.0, 5e-324])) == [
        "965943514308051.2",  # a tie: .2 and .3 both read back, the even digit wins
        "0.0001",
        "1e-05",
        "1e+16",
        "-0.0",
        "5e-324",
    ]


def test_bad_columns_are_refused() -> None:
    from graphsvc.native import _ctext

    codes, offsets, parents = np.zeros(2, np.uint16), np.zeros(3, np.int64), np.zeros(0, np.int32)
    with pytest.raises(IndexError, match=r"^node 2 is not in the graph's columns$"):
        _ctext.text_chunk(np.array([2]), codes, offsets, parents, None, ["leaf"], None, None)
    with pytest.raises(IndexError, match=r"^node 1: op code 1 has no tag$"):
        _ctext.text_chunk(np.array([1]), np.array([0, 1], np.uint16), offsets, parents, None, ["leaf"], None, None)
    with pytest.raises(TypeError, match=r"^values: items of format 'l', not one of 'd'$"):
        _ctext.text_chunk(np.array([0]), codes, offsets, parents, None, ["leaf"], np.zeros(2, np.int64), None)
    with pytest.raises(ValueError, match=r"^names: 2 items for 1 node$"):
        _ctext.json_chunk(np.array([0]), codes, offsets, parents, ["a", "b"], ["leaf"], None, None, False)
    with pytest.raises(ValueError, match=r"^offsets: 3 items for 1 node \(not N \+ 1\)$"):
        _ctext.json_chunk(np.array([0]), codes[:1], offsets, parents, ["a"], ["leaf"], None, None, False)


def test_names_and_tags_from_any_iterable_stay_alive_while_the_chunk_is_written() -> None:
    """The C listing keeps its own tuple of the cells: a generator's strings (freed at once before)
    and a list the tags' generator empties are written as given."""
    text = require_native("text")
    n = 3
    ids = np.arange(n, dtype=np.int64)
    codes = np.zeros(n, dtype=np.uint16)
    offsets = np.zeros(n + 1, dtype=np.int64)
    parents = np.zeros(0, dtype=np.int32)
    names = [f"name{i}" * 20 for i in range(n)]
    expected = "".join(f"{i}\t{names[i]}\tleaf\t-\n" for i in range(n))
    assert (
        text.text_chunk(ids, codes, offsets, parents, (f"name{i}" * 20 for i in range(n)), ["leaf"], None, None)
        == expected
    )
    emptied = list(names)

    def tags() -> Any:
        emptied.clear()
        yield "leaf"

    assert text.text_chunk(ids, codes, offsets, parents, emptied, tags(), None, None) == expected
