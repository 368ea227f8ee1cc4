"""graphsvc.console.printing: one JSON line, a streamed JSON listing, lines, rows, the file words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphsvc.console import printing


def test_json_text_is_compact_keeps_unicode_and_escapes_lone_surrogates() -> None:
    assert printing.json_text({"a": [1, 2.5], "name": "é名"}) == '{"a":[1,2.5],"name":"é名"}'
    assert printing.json_text({"name": "é\u2028\u200b"}) == '{"name":"é\\u2028\\u200b"}'  # unprintable: escaped
    assert printing.json_text("\udc80") == '"\\udc80"'
    with pytest.raises(ValueError):
        printing.json_text(float("nan"))  # numbers are made JSON first (jsonio.json_float)


def test_jsonable_metadata() -> None:
    assert printing.jsonable({"x": [float("inf"), b"\x01\xff", 2], "y": "s"}) == {
        "x": ["inf", {"$bin": "01ff"}, 2],
        "y": "s",
    }


def test_a_json_listing_streams_its_nodes_between_head_and_tail(capsys: pytest.CaptureFixture[str]) -> None:
    printing.print_json_listing({"output": 6}, ['{"id":1}', ',{"id":0}'], 2, {"nonfinite": None}, quiet=True)
    out = capsys.readouterr().out
    assert out == '{"output":6,"nodes":[{"id":1},{"id":0}],"nonfinite":null}\n'
    assert json.loads(out)["nodes"] == [{"id": 1}, {"id": 0}]
    printing.print_json_listing({}, [], 0, {}, quiet=True)
    assert capsys.readouterr().out == '{"nodes":[]}\n'


def test_lines_rows_and_nothing_for_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "0")
    printing.echo_lines([])
    printing.echo_lines(["a", "b"])
    printing.print_rows([("op", "left"), ("inputs", "right")], [["add", "2"], ["neg", "1"]])
    assert capsys.readouterr().out == "a\nb\nadd\t2\nneg\t1\n"


def test_files_as_messages_name_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert printing.is_stdio(Path("-")) and not printing.is_stdio(Path("x")) and not printing.is_stdio(None)
    assert (printing.shown(Path("-")), printing.shown(Path("a/b.json"))) == ("standard input", "a/b.json")
    printing.wrote(Path("out\n.msgpack"), 1234)
    assert capsys.readouterr() == ("", "wrote out\\n.msgpack (1,234 nodes)\n")
