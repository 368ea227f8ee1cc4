"""Node listings: the exact text and JSON of every kind of node, the same across chunk boundaries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.console import listing
from graphsvc.graph import Graph, GraphBuilder

runner = CliRunner()


def graph() -> Graph:
    """Leaves with and without names, a constant, repeated parents, three parents, odd floats."""
    b = GraphBuilder()
    a = b.leaf(2.0, name="a")
    c = b.const(-0.0)
    x = b.add("add", [a, c], value=2.0, name='x "é" \\')
    y = b.add("mul", [x, x], value=4.0)
    b.add("sum3", [y, a, x], value=math.nan, name="out")
    return b.build()


NUMBERS = np.array([2.0, -0.0, 2.0, 4.0, math.nan])
GRADS = np.array([math.inf, -math.inf, 0.1, 1e-300, 1.0])
ORDER = [4, 3, 2, 0, 1]

TEXT = [
    "4\tout\tsum3\t3,0,2",
    "3\t-\tmul\t2,2",
    '2\tx "é" \\\\\tadd\t0,1',  # the backslash doubled: text cells are escaped
    "0\ta\tleaf\t-",
    "1\t-\tconst\t-",
]
REPLAY_CELLS = [("nan", "1.0"), ("4.0", "1e-300"), ("2.0", "0.1"), ("2.0", "inf"), ("-0.0", "-inf")]


@pytest.mark.parametrize("chunk", [1, 2, 3, listing.CHUNK])
def test_text_lines_across_chunks(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "CHUNK", chunk)
    assert "".join(listing.text(graph(), ORDER)) == "".join(line + "\n" for line in TEXT)
    replayed = [f"{line}\t{v}\t{g}\n" for line, (v, g) in zip(TEXT, REPLAY_CELLS, strict=True)]
    assert "".join(listing.text(graph(), ORDER, NUMBERS, GRADS)) == "".join(replayed)
    rows = [row for part in listing.rows(graph(), ORDER, NUMBERS) for row in part]
    assert rows[1] == ("3", "-", "mul", "2,2", "4.0")


def test_no_nodes_no_text() -> None:
    assert list(listing.text(graph(), [])) == []
    assert list(listing.json_objects(graph(), [])) == []


@pytest.mark.parametrize("chunk", [1, 2, listing.CHUNK])
def test_json_objects_are_what_json_dumps_writes(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "CHUNK", chunk)
    g = graph()
    plain = [{"id": n, "name": g.names.get(n), "op": g.op(n), "parents": g.parents(n)} for n in ORDER]
    replay = [
        {**item, "value": v, "grad": gr}
        for item, v, gr in zip(plain, ["nan", 4.0, 2.0, 2.0, -0.0], [1.0, 1e-300, 0.1, "inf", "-inf"], strict=True)
    ]
    without_grads = [{**item, "grad": None} for item in replay]
    for got, expected in (
        (listing.json_objects(g, ORDER), plain),
        (listing.json_objects(g, ORDER, NUMBERS, GRADS), replay),
        (listing.json_objects(g, ORDER, NUMBERS), without_grads),
    ):
        text = "[" + "".join(got) + "]"
        assert text == json.dumps(expected, separators=(",", ":"), ensure_ascii=False)
    assert json.loads("[" + "".join(listing.json_objects(g, ORDER)) + "]")[2]["name"] == 'x "é" \\'


@pytest.mark.parametrize(
    "command", [["order", "--json"], ["order"], ["backward", "--json"], ["forward", "--json", "--check"], ["backward"]]
)
def test_the_cli_prints_the_same_bytes_whatever_the_chunk(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = GraphBuilder()
    x = b.leaf(0.5, name="x")
    node = x
    for _ in range(9):
        node = b.add("mul", [node, x], value=0.0)  # stored values 0: --check reports every mismatch
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(outputs=[node]), path)
    whole = runner.invoke(app, [command[0], str(path), *command[1:]])
    monkeypatch.setattr(listing, "CHUNK", 3)
    chunked = runner.invoke(app, [command[0], str(path), *command[1:]])
    assert chunked.output == whole.output and chunked.exit_code == whole.exit_code
    if "--json" in command:
        document = json.loads(whole.output)
        assert [item["id"] for item in document["nodes"]][:3] == [9, 8, 7]
        if command[0] == "backward":
            assert document["nodes"][-1]["grad"] == 10 * 0.5**9  # d(x^10)/dx at x = 0.5
        if "--check" in command:
            assert document["check"]["values"]["mismatches"] == 9 and whole.exit_code == 1
