"""The JSON form read straight into columns (C, ``graphsvc.native._cjson``) against the long way
(``json.loads`` and the document's checks): the same graph, the same warnings or the same error,
for documents a writer gives, hand-written ones, hostile ones and thousands of mutated ones."""

from __future__ import annotations

import json
import math
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fuzz.property import described
from graphsvc import format as fmt
from graphsvc.errors import GraphFileError
from graphsvc.format import jsonio
from graphsvc.graph import Graph, GraphBuilder
from tests.conftest import make_golden, require_native

golden = make_golden()


@pytest.fixture(autouse=True)
def cjson() -> Any:
    return require_native("json")


def outcome(read: Callable[[], tuple[Graph, tuple[int, int]]]) -> tuple[Any, ...]:
    """``("graph", what it holds, its version, the warnings)`` or ``(error type, message)``."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            graph, version = read()
        except GraphFileError as exc:  # FormatError is one
            return type(exc).__name__, str(exc)
    return "graph", described(graph), version, [str(w.message) for w in said]


def both_ways(text: str) -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
    """The outcome of ``loads_versioned`` with the C reader and the long way's alone, and whether
    the C reader took the document."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        took = jsonio.read_columns(text.encode()) is not None if _encodable(text) else False
    return outcome(lambda: jsonio.loads_versioned(text)), outcome(lambda: jsonio.read_objects(text)), took


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def document(nodes: list[dict[str, Any]], **top: Any) -> str:
    return json.dumps({"format": "graphsvc-json", "version": [1, 0], "nodes": nodes, **top}, ensure_ascii=False)


def hostile() -> Graph:
    b = GraphBuilder()
    x = b.leaf(math.nan, name='a"\\\n\t\x01\u202e\u200b\U0001f600\x7f\x9b')
    y = b.add('op "\u202e', [x, x], value=math.inf, name="é", attrs={"k\u202e": [1, 2.5, "s\n"], "n": {"d": [[1]]}})
    b.add("mul", [y, x], value=-0.0, attrs={"big": 2**64 - 1, "neg": -(2**63), "t": True, "f": False, "z": None})
    graph = b.build(metadata={"m": [1, {"q": "\u2028"}], "nodes": [], "x": 1e-320})
    graph.grads = np.array([1e-320, -math.inf, 5e16])
    return graph


#: A document's start, up to its nodes.
TOP = '{"format": "graphsvc-json", "version": [1, 0], "nodes": '


def tensors() -> Graph:
    """Arrays of every dtype and kind of shape, nan and inf in them, scalar nodes between them."""
    b = GraphBuilder()
    f32 = np.array([[0.1, np.nan], [np.inf, -1e-45], [3.4e38, -0.0]], dtype=np.float32)
    for i, array in enumerate(
        [
            np.float64(2.5).reshape(()),
            np.zeros((0,)),
            np.zeros((2, 0)),
            np.zeros((0, 3)),
            np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 12,
            f32,
            np.array([np.nan, -np.inf, 1e300, -0.0]),
            np.ones((1, 1, 1, 2)),
        ]
    ):
        b.leaf(array, name=f"a{i}")
        b.leaf(float(i))
    graph = b.build()
    graph.grad_arrays = {5: np.array([[1.5, 2.0]] * 3, dtype=np.float32).reshape(3, 2), 0: np.float64(1.0).reshape(())}
    graph.grads = np.arange(graph.num_nodes, dtype=np.float64)
    return graph


WRITTEN: dict[str, Callable[[], Graph]] = {
    **{f"golden {name}": make for name, make in golden.GOLDEN.items()},
    **{f"golden v2 {name}": make for name, make in golden.GOLDEN_V2.items()},
    "tensors": tensors,
    "hostile": hostile,
    "empty": lambda: GraphBuilder().build(),
}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_what_the_writer_writes_is_read_in_c_as_the_long_way_reads_it(name: str) -> None:
    text = jsonio.dumps(WRITTEN[name]())
    fast, slow, took = both_ways(text)
    assert took and fast == slow and fast[0] == "graph"


def test_the_columns_are_the_numbers_json_loads_gives() -> None:
    text = document(
        [
            {"id": 0, "op": "leaf", "value": -0, "grad": "n\\u0061n"},  # -0 is the integer 0: 0.0
            {"id": 1, "op": "leaf", "value": 12345678901234567890123, "grad": -0.0},
            {"id": 2, "op": "add", "parents": [0, 1], "value": 0.1e-2, "grad": 1e2},
            {"id": 3, "op": "leaf", "value": "inf"},
            {"op": "neg", "parents": [3], "value": "-inf", "name": "out"},
        ]
    ).replace('"n\\\\u0061n"', '"n\\u0061n"')
    fast, slow, took = both_ways(text)
    assert took and fast == slow
    graph = jsonio.loads(text)
    assert [float(v).hex() for v in graph.values] == [
        (0.0).hex(),
        float(12345678901234567890123).hex(),
        (0.001).hex(),
        "inf",
        "-inf",
    ]
    assert graph.grads is not None and [str(g) for g in graph.grads.tolist()] == ["nan", "-0.0", "100.0", "nan", "nan"]
    assert graph.grads.view(np.uint64)[0] == 0x7FF8000000000000  # float("nan")'s bits, as json.loads gives
    assert graph.names == {4: "out"} and graph.outputs == [2, 4]  # no outputs: the sinks


@pytest.mark.parametrize(
    "text",
    [
        document([{"id": 1, "op": "leaf"}, {"id": 0, "op": "neg", "parents": [1]}]),  # ids in another order
        document([{"op": "leaf", "name": "a"}, {"op": "neg", "parents": ["a"]}]),  # a parent by name
        document([{"op": "leaf"}, {"op": "neg", "parents": [0], "parnets": [0]}]),  # an unknown key: warned
        document([{"op": "leaf"}], future=1),
        document([{"op": "leaf"}], ops={"leaf": {"plugin": None, "version": None, "x": 1}}),
        document([{"op": "leaf"}], outputs=["a"]),
        document([{"op": "leaf", "name": "a"}], outputs=["a"]),
        document([{"op": "leaf", "value": {"dtype": "float64", "shape": [], "data": 1.0}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float64", "shape": [], "data": 1.0}}]),  # 1.0: no arrays
        document([{"op": "leaf", "value": {"shape": [1], "dtype": "float64", "data": [1]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "int64", "shape": [2], "data": [1, 2.0]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "int64", "shape": [1], "data": [2**63]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float32", "shape": [1], "data": [1e39]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float32", "shape": [2], "data": [1, "nan"]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float64", "shape": [2, 1], "data": [[1], 2]}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float64", "shape": [0, 2**60], "data": []}}], version=[2, 0]),
        document([{"op": "leaf", "value": {"dtype": "float64", "shape": [1], "data": [1], "x": 0}}], version=[2, 0]),
        document(
            [{"op": "leaf", "value": {"dtype": "float64", "shape": [2], "data": [1, 2]}, "grad": 1.0}], version=[2, 0]
        ),
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "op": "neg"}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [], "nodes": []}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "attrs": {"a": 1, "a": 2}}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "value": NaN}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "value": 1e400}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "value": 01}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "name": "\\ud800"}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "name": "\\udc00\\ud800"}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "name": "\\ud83d\\ude00"}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "attrs": {"k": 1'
        + "0" * 5000
        + "}}]}",
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf"}]} x',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "name": "tab\there"}]}',
        '\ufeff{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf"}]}',
        '{"format": "graphsvc-json", "version": [3, 0], "nodes": []}',
        '{"format": "graphsvc-json", "version": [1, true], "nodes": []}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": ""}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "name": ""}]}',
        TOP + '[{"op": "leaf", "name": "a"}, {"op": "leaf", "name": "a"}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "neg"}], "metadata": [1]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "attrs": [1]}]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf"}], "outputs": [1]}',
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf", "attrs": '
        + "[" * 40
        + "]" * 40
        + "}]}",
    ],
)
def test_hand_written_and_hostile_documents_read_as_the_long_way_reads_them(text: str) -> None:
    fast, slow, _ = both_ways(text)
    assert fast == slow


def test_the_c_reader_leaves_to_the_long_way_what_it_does_not_take(cjson: Any) -> None:
    """What the C reader takes, and the cases it leaves (each read right by the long way above)."""
    plain = document([{"op": "leaf", "name": "a", "attrs": {"k": [1, "x"]}}, {"op": "neg", "parents": [0]}])
    assert cjson.read(plain.encode()) is not None
    for left in (
        plain.replace('"name": "a"', '"name": "a", "nmae": 1'),  # unknown key
        plain.replace('"parents": [0]', '"parents": ["a"]'),  # a parent by name
        plain.replace('"k": [1, "x"]', '"k": [1, "x"], "k": 2'),  # repeated key
        plain.replace('"name": "a"', '"name": "\\udc00"'),  # lone surrogate
        plain[:-1],  # cut short
        plain.replace('"neg"', '"neg", "value": 1e999'),  # too large for a float64
        plain.replace('"neg"', '"neg", "value": {"shape": [], "dtype": "float64", "data": 1}'),  # keys' order
    ):
        assert cjson.read(left.encode()) is None, left


@pytest.mark.parametrize(
    "shape",
    [[0, 2**39, 2**39], [0, 2**39, 2**39, 2**39], [3, 0, 2**39, 2**39 + 1], [0, 2**40 - 1, 2**40 - 1, 16]],
)
def test_an_empty_axis_beside_sizes_whose_product_passes_2_63_is_refused_as_the_long_way_does(
    shape: list[int], cjson: Any
) -> None:
    """The item count of a shape is checked before each product (an int64 product would wrap, and
    the C reader took the shape numpy then refused with an uncaught ValueError)."""
    text = document(
        [{"op": "leaf", "value": {"dtype": "float64", "shape": shape, "data": [[]] * shape[0]}}], version=[2, 0]
    )
    assert cjson.read(text.encode()) is None
    with pytest.raises(fmt.FormatError) as error:
        jsonio.loads_versioned(text)
    assert str(error.value) == f"node 0: value: the shape {shape} is too large (more than 2**63 - 1 bytes)"


def test_out_of_memory_in_c_reads_the_long_way(monkeypatch: pytest.MonkeyPatch) -> None:
    text = jsonio.dumps(golden.GOLDEN["grads"]())

    class NoMemory:
        @staticmethod
        def read(data: Any) -> None:
            raise MemoryError

    monkeypatch.setattr(jsonio, "extension", lambda name: NoMemory)
    assert jsonio.read_columns(text.encode()) is None
    assert described(jsonio.loads(text)) == described(jsonio.read_objects(text)[0])


def test_a_file_and_a_stream_are_read_in_c(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = hostile()
    path = tmp_path / "g.json"
    text = jsonio.dumps(graph)
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    calls: list[int] = []
    real = jsonio.read_columns

    def counted(data: Any) -> Any:
        found = real(data)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(jsonio, "read_columns", counted)
    with open(path, "rb") as stream:
        assert described(fmt.load(path)) == described(fmt.load(stream)) == described(jsonio.read_objects(text)[0])
    assert calls == [True, True]


def mutations(text: str, count: int, seed: int) -> list[str]:
    """``count`` copies of ``text``, each changed in one place: a byte replaced by one a JSON
    document is made of, deleted, or doubled."""
    rng = random.Random(seed)
    alphabet = [*'{}[]:,"\\ -+.0123456789eEnatrufl', "\\u", "\\ud800", "\u202e", "nan", "\t", "\x01"]
    out = []
    for _ in range(count):
        at = rng.randrange(len(text))
        kind = rng.randrange(3)
        if kind == 0:
            out.append(text[:at] + rng.choice(alphabet) + text[at + 1 :])
        elif kind == 1:
            out.append(text[:at] + text[at + 1 :])
        else:
            out.append(text[:at] + text[at] + text[at:])
    return out


@pytest.mark.parametrize("name", ["golden attrs_metadata", "golden grads", "hostile", "tensors"])
def test_mutated_documents_read_as_the_long_way_reads_them(name: str) -> None:
    text = jsonio.dumps(WRITTEN[name]())
    taken = 0
    for mutated in mutations(text, 700, seed=len(name)):
        fast, slow, took = both_ways(mutated)
        assert fast == slow, mutated
        taken += took
    assert taken > 100  # many mutations leave a document the C reader takes (a digit, a space)


def test_arrays_read_in_c_are_read_only_for_good() -> None:
    text = jsonio.dumps(tensors())
    found = jsonio.read_columns(text.encode())
    assert found is not None
    graph = found[0]
    for array in [*graph.arrays.values(), *graph.grad_arrays.values()]:
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):
            array.flags.writeable = True
