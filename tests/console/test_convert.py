"""graphsvc.console.convert: which form and file convert writes, and the writing itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphsvc.console import convert
from graphsvc.errors import UsageError
from graphsvc.format import load
from graphsvc.graph import Graph


def test_the_form_follows_the_extension() -> None:
    assert [convert.form_of(Path(name)) for name in ("a.json", "a.JSON", "a.msgpack", "a.mpk", "a.msgpk")] == [
        "json",
        "json",
        "msgpack",
        "msgpack",
        "msgpack",
    ]
    with pytest.raises(UsageError, match=r"^say which form to write: --to json or --to msgpack \(a.txt has no "):
        convert.form_of(Path("a.txt"))
    with pytest.raises(UsageError, match=r"^say which form to write: --to json or --to msgpack$"):
        convert.form_of(None)


def test_without_out_the_form_is_the_other_one(tmp_path: Path, seed004_file: Graph) -> None:
    from graphsvc.format import jsonio, save

    msgpack_file, json_file, empty = tmp_path / "g.msgpack", tmp_path / "g.json", tmp_path / "empty"
    save(seed004_file, msgpack_file)
    json_file.write_text(jsonio.dumps(seed004_file), encoding="utf-8")
    empty.write_bytes(b"")
    assert [convert.input_form(f) for f in (msgpack_file, json_file, empty, tmp_path / "missing")] == [
        "msgpack",
        "json",
        "json",  # loading it says what is wrong
        "json",
    ]
    assert convert.form_of(None, msgpack_file) == convert.form_of(Path("-"), msgpack_file) == "json"
    assert convert.form_of(None, json_file) == convert.form_of(Path("-"), json_file) == "msgpack"
    assert convert.form_of(Path("o.json"), json_file) == "json"  # the extension wins
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert convert.input_form(fifo) is None
    with pytest.raises(
        UsageError, match=r"^say which form to write: --to json or --to msgpack \(.*fifo cannot be peeked at\)$"
    ):
        convert.form_of(None, fifo)


def test_the_target(tmp_path: Path) -> None:
    graph_file = tmp_path / "g.json"
    graph_file.write_text("{}", encoding="utf-8")
    assert convert.target_of(graph_file, "json", None) == Path("-")
    assert convert.target_of(graph_file, "msgpack", None) == tmp_path / "g.msgpack"
    assert convert.target_of(graph_file, "msgpack", tmp_path / "o.bin") == tmp_path / "o.bin"
    with pytest.raises(UsageError, match=r"^refusing to overwrite the input .*g.json; give --out$"):
        convert.target_of(graph_file, "json", graph_file)
    with pytest.raises(UsageError, match=r"^reading standard input: say where to write with --out"):
        convert.target_of(Path("-"), "msgpack", None)


def test_write_both_forms_to_files_and_json_to_stdout(
    seed004_file: Graph, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    convert.write(seed004_file, "json", tmp_path / "g.json", quiet=True)
    convert.write(seed004_file, "msgpack", tmp_path / "g.msgpack", quiet=True)
    assert capsysbinary.readouterr().err.decode().splitlines() == [
        f"wrote {tmp_path / 'g.json'} (7 nodes)",
        f"wrote {tmp_path / 'g.msgpack'} (7 nodes)",
    ]
    for name in ("g.json", "g.msgpack"):
        assert load(tmp_path / name).grads.tolist() == [22.0, 17.0, 5.0, 5.0, 5.0, 7.0, 1.0]  # type: ignore[union-attr]
    convert.write(seed004_file, "json", Path("-"), quiet=True)
    out, err = capsysbinary.readouterr()
    assert err == b""
    assert json.loads(out)["nodes"][0] == {
        "id": 0,
        "name": "a",
        "op": "leaf",
        "parents": [],
        "value": 2.0,
        "grad": 22.0,
    }


def test_json_is_written_a_chunk_at_a_time_and_a_refused_graph_writes_nothing(
    seed004_file: Graph, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphsvc.errors import GraphsvcError
    from graphsvc.format import jsonio

    monkeypatch.setattr(jsonio, "CHUNK_NODES", 2)  # seed004's 7 nodes: 4 chunks of nodes
    writes: list[bytes] = []
    real = convert.printing.write_bytes
    monkeypatch.setattr(convert.printing, "write_bytes", lambda data: (writes.append(data), real(data))[1])
    convert.write(seed004_file, "json", Path("-"), quiet=True)
    out = capsysbinary.readouterr().out
    assert len(writes) == 6 and b"".join(writes) == out == jsonio.dumps(seed004_file).encode()
    graph = seed004_file.copy()
    graph.attrs[6] = {"lr": float("nan")}  # the last node: its chunk is the last one
    writes.clear()
    target = tmp_path / "g.json"
    for where in (Path("-"), target):
        with pytest.raises(GraphsvcError, match=r"^cannot write the graph as JSON: Out of range float values"):
            convert.write(graph, "json", where, quiet=True)
    assert writes == [] and capsysbinary.readouterr() == (b"", b"") and not target.exists()
