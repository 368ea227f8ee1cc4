"""The inspection commands: order, inspect, validate, convert; exit codes and exact output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder
from tests.conftest import ROOT

GOLDEN = ROOT / "schemas" / "examples"
SEED000 = str(GOLDEN / "seed000.msgpack")

runner = CliRunner()

SEED000_LINES = [
    "5\ty\tlog\t4",
    "4\tt3\tadd\t3,2",
    "2\tt2\texp\t1",
    "1\tt1\tsin\t0",
    "0\tz\tleaf\t-",
    "3\t1\tconst\t-",
]


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


# -- order ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["dfs", "kahn"])
def test_order_text(algorithm: str) -> None:
    assert invoke("order", SEED000, "--algorithm", algorithm) == (0, "\n".join(SEED000_LINES) + "\n", "")


def test_order_defaults_to_dfs_over_the_whole_graph() -> None:
    assert invoke("order", SEED000)[1].splitlines() == SEED000_LINES


def test_an_empty_graph_orders_and_replays_to_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "empty.msgpack"
    fmt.save(GraphBuilder().build(), path)
    assert invoke("order", str(path)) == (0, "", "")
    assert invoke("forward", str(path)) == (0, "", "")


@pytest.mark.parametrize("output", ["t3", "4"])
def test_order_json_from_one_output_by_name_or_id(output: str) -> None:
    code, out, err = invoke("order", SEED000, "--output", output, "--algorithm", "kahn", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "algorithm": "kahn",
        "output": 4,
        "nodes": [
            {"id": 4, "name": "t3", "op": "add", "parents": [3, 2]},
            {"id": 2, "name": "t2", "op": "exp", "parents": [1]},
            {"id": 1, "name": "t1", "op": "sin", "parents": [0]},
            {"id": 0, "name": "z", "op": "leaf", "parents": []},
            {"id": 3, "name": "1", "op": "const", "parents": []},
        ],
    }


def test_order_an_unnamed_node_and_repeated_parents() -> None:
    code, out, _ = invoke("order", str(GOLDEN / "attrs_metadata.msgpack"), "--output", "2")
    assert (code, out) == (0, "2\t-\tmul\t0,0\n0\tx\tleaf\t-\n")


def test_order_dfs_and_kahn_differ(tmp_path: Path) -> None:
    b = GraphBuilder()
    a = b.leaf(name="a")
    bb = b.leaf(name="b")
    c = b.add("h", [a, bb], name="c")
    b.add("f", [bb, c], name="e")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)

    def names(algorithm: str) -> list[str | None]:
        out = invoke("order", str(path), "--algorithm", algorithm, "--json")[1]
        return [node["name"] for node in json.loads(out)["nodes"]]

    assert names("dfs") == ["e", "c", "a", "b"]
    assert names("kahn") == ["e", "c", "b", "a"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "nope"], "Error: no node named 'nope' (the outputs: y)\n"),
        (["--output", "6"], "Error: no node with id 6 (the graph has 6 nodes)\n"),
        (["--algorithm", "bfs"], "Error: --algorithm must be dfs or kahn, not 'bfs'\n"),
    ],
)
def test_order_usage_errors_exit_2(args: list[str], message: str) -> None:
    assert invoke("order", SEED000, *args) == (2, "", message)


# -- inspect ----------------------------------------------------------------------------------------
def test_inspect_text() -> None:
    path = str(GOLDEN / "attrs_metadata.msgpack")
    code, out, err = invoke("inspect", path)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"file: {path} (622 bytes)",
        "format version: 1.0",
        "nodes: 4",
        "edges: 4",
        "leaves: 1 (x)",
        "outputs: clipped, #2",
        "depth: 2",
        "gradients stored: no",
        "ops: clip 1, leaf 1, mul 1, pow 1",
        "plugins: graphsvc (builtin) (leaf, mul); graphsvc-extra-ops 1.2.0 (pow); unknown (clip)",
        'metadata: author: graphsvc; step: 7; lr: 0.5; frozen: false; tags: ["a",1]; nested: {"k":null}',
    ]


def test_inspect_json() -> None:
    path = str(GOLDEN / "grads.msgpack")
    code, out, err = invoke("inspect", path, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "file": path,
        "file_size": 597,
        "format_version": [1, 0],
        "nodes": 7,
        "edges": 8,
        "leaves": 3,
        "outputs": [{"id": 6, "name": "L"}],
        "depth": 3,
        "has_grads": True,
        "tensors": None,
        "ops": {"leaf": 3, "mul": 2, "add": 2},
        "plugins": {"graphsvc (builtin)": ["add", "leaf", "mul"]},
        "metadata": {},
    }


def test_inspect_json_shows_a_newer_minor_version(tmp_path: Path) -> None:
    document = msgpack.unpackb((GOLDEN / "worked.msgpack").read_bytes())
    document["version"] = [1, 4]
    path = tmp_path / "newer.msgpack"
    path.write_bytes(msgpack.packb(document))
    assert json.loads(invoke("inspect", str(path), "--json")[1])["format_version"] == [1, 4]


def test_inspect_json_with_metadata_json_cannot_hold(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.leaf()
    path = tmp_path / "m.msgpack"
    fmt.save(b.build(metadata={"lr": float("nan"), "top": float("-inf"), "blob": b"\x00\xff"}), path)
    code, out, _ = invoke("inspect", str(path), "--json")
    assert code == 0
    assert json.loads(out)["metadata"] == {"lr": "nan", "top": "-inf", "blob": {"$bin": "00ff"}}
    code, out, err = invoke("convert", str(path), "--to", "json")
    assert (code, out) == (1, "")
    assert err == (
        "Error: cannot write the graph as JSON: Out of range float values are not JSON compliant: nan "
        "(in JSON, attributes and metadata cannot hold nan, inf or bin data)\n"
    )


# -- validate and bad files -------------------------------------------------------------------------
def test_validate_ok() -> None:
    assert invoke("validate", SEED000) == (0, f"{SEED000}: valid graphsvc graph, 6 nodes, 5 edges\n", "")


@pytest.mark.parametrize("command", ["validate", "order", "inspect"])
def test_a_bad_file_exits_3_with_one_error_line(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bad.msgpack"
    path.write_bytes((GOLDEN / "seed000.msgpack").read_bytes()[:-3])
    assert invoke(command, str(path)) == (
        3,
        "",
        f"Error: {path}: the file is truncated: 566 bytes end in the middle of the document\n",
    )


def test_a_structurally_bad_file_exits_3(tmp_path: Path) -> None:
    document = msgpack.unpackb((GOLDEN / "worked.msgpack").read_bytes())
    document["names"] = [[0, "a"], [2, "a"]]
    path = tmp_path / "dup.msgpack"
    path.write_bytes(msgpack.packb(document))
    assert invoke("validate", str(path)) == (3, "", f"Error: {path}: name 'a' is used by nodes 0 and 2\n")


@pytest.mark.parametrize("command", ["validate", "order", "inspect"])
def test_a_missing_file_exits_3(tmp_path: Path, command: str) -> None:
    path = tmp_path / "missing.msgpack"
    assert invoke(command, str(path)) == (3, "", f"Error: {path}: no such file\n")


def test_a_folder_exits_3(tmp_path: Path) -> None:
    assert invoke("validate", str(tmp_path)) == (3, "", f"Error: {tmp_path}: is a folder, not a graph file\n")


# -- validate: what a replay checks; keys the reader does not know ---------------------------------
def write_json(tmp_path: Path, nodes: list[dict[str, object]], **top: object) -> str:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"format": "graphsvc-json", "version": [1, 0], "nodes": nodes, **top}), "utf-8")
    return str(path)


LEAVES: list[dict[str, object]] = [{"name": "a", "op": "leaf", "value": 2.0}, {"name": "b", "op": "leaf", "value": 3.0}]
NOT_REPLAYABLE = "a valid graph file, but it cannot be replayed here"


def test_validate_names_an_unknown_op_with_the_replays_did_you_mean_and_exits_4(tmp_path: Path) -> None:
    path = write_json(tmp_path, [*LEAVES, {"name": "y", "op": "ad", "parents": ["a", "b"]}])
    message = (
        f"{path}: {NOT_REPLAYABLE}: the graph uses an op not registered here: ad (plugin unknown; did you mean 'add'?)"
    )
    assert invoke("validate", path) == (4, "", f"Error: {message}\n")
    assert invoke("--disable-plugins", "validate", path)[2] == (
        f"Error: {message}; if not, run without --disable-plugins (it keeps out every plugin, --plugin ones too)\n"
    )
    path = write_json(tmp_path, [*LEAVES, {"name": "y", "op": "frobnicate", "parents": ["a", "b"]}])
    assert invoke("validate", path) == (
        4,
        "",
        f"Error: {path}: {NOT_REPLAYABLE}: the graph uses an op not registered here: frobnicate (plugin unknown); "
        "install the plugin that provides it or pass --plugin\n",
    )


def test_validate_checks_parent_counts_and_attributes_as_a_replay_does(tmp_path: Path) -> None:
    from graphsvc import __version__

    path = write_json(tmp_path, [*LEAVES, {"name": "y", "op": "add", "parents": ["a"]}])
    assert invoke("validate", path) == (
        4,
        "",
        f"Error: {path}: {NOT_REPLAYABLE}: node y: op add takes 2 inputs but the node has 1 parent\n",
    )
    assert invoke("forward", path)[0::2] == (4, "Error: node y: op add takes 2 inputs but the node has 1 parent\n")
    path = write_json(tmp_path, [*LEAVES, {"name": "y", "op": "exp", "parents": ["a"], "attrs": {"base": 2}}])
    assert invoke("validate", path) == (
        4,
        "",
        f"Error: {path}: {NOT_REPLAYABLE}: node y: op 'exp' (graphsvc {__version__}) has no attribute 'base' "
        "(it takes none)\n",
    )


def test_validate_format_only_checks_the_file_alone(tmp_path: Path) -> None:
    path = write_json(tmp_path, [*LEAVES, {"name": "y", "op": "ad", "parents": ["a", "b"]}])
    assert invoke("validate", "--format-only", path) == (0, f"{path}: valid graphsvc graph, 3 nodes, 2 edges\n", "")


def test_validate_warns_about_each_unknown_key_and_strict_refuses_them(tmp_path: Path) -> None:
    nodes = [{"name": "a", "op": "leaf", "vaule": 2.0}, LEAVES[1], {"name": "y", "op": "add", "parnets": ["a", "b"]}]
    path = write_json(tmp_path, nodes, output=["y"])
    warnings = (
        f"Warning: {path}: the document: unknown key 'output' (did you mean 'outputs'?); ignored\n"
        f"Warning: {path}: nodes[0]: unknown key 'vaule' (did you mean 'value'?); ignored\n"
        f"Warning: {path}: nodes[2]: unknown key 'parnets' (did you mean 'parents'?); ignored\n"
    )
    assert invoke("validate", "--format-only", path) == (
        0,
        f"{path}: valid graphsvc graph, 3 nodes, 0 edges\n",
        warnings,
    )
    assert invoke("validate", path) == (
        4,
        "",
        warnings + f"Error: {path}: {NOT_REPLAYABLE}: node y: op add takes 2 inputs but the node has 0 parents\n",
    )
    assert invoke("validate", "--strict", path) == (
        3,
        "",
        f"Error: {path}: the document: unknown key 'output' (did you mean 'outputs'?) (2 more unknown keys); "
        "a strict read refuses unknown keys\n",
    )


def test_every_command_that_reads_warns_on_stderr_and_json_stays_pure(tmp_path: Path) -> None:
    path = write_json(tmp_path, LEAVES, metdata={})
    warning = f"Warning: {path}: the document: unknown key 'metdata' (did you mean 'metadata'?); ignored\n"
    code, out, err = invoke("inspect", path, "--json")
    assert (code, json.loads(out)["nodes"], err) == (0, 2, warning)
    assert invoke("order", path) == (0, "1\tb\tleaf\t-\n0\ta\tleaf\t-\n", warning)
    assert invoke("convert", path, "--to", "msgpack", "-o", str(tmp_path / "g.msgpack"))[2] == (
        warning + f"wrote {tmp_path / 'g.msgpack'} (2 nodes)\n"
    )
    assert invoke("validate", "--strict", str(tmp_path / "g.msgpack"))[0] == 0  # a rewrite drops them


# -- convert ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["worked", "seed000", "grads", "attrs_metadata"])
def test_convert_to_json_and_back_gives_identical_bytes(tmp_path: Path, name: str) -> None:
    source = GOLDEN / f"{name}.msgpack"
    code, text, err = invoke("convert", str(source), "--to", "json")
    assert (code, err) == (0, "")
    json_path = tmp_path / f"{name}.json"
    json_path.write_text(text)
    code, out, err = invoke("convert", str(json_path), "--to", "msgpack")
    back = tmp_path / f"{name}.msgpack"
    assert (code, out, err) == (0, "", f"wrote {back} ({fmt.load(source).num_nodes} nodes)\n")
    assert back.read_bytes() == source.read_bytes()


def test_convert_with_out_files(tmp_path: Path) -> None:
    json_path = tmp_path / "w.json"
    assert invoke("convert", str(GOLDEN / "worked.msgpack"), "--to", "json", "-o", str(json_path))[0] == 0
    assert json.loads(json_path.read_text())["format"] == "graphsvc-json"
    target = tmp_path / "again.msgpack"
    assert invoke("convert", str(json_path), "--to", "msgpack", "--out", str(target))[0] == 0
    assert target.read_bytes() == (GOLDEN / "worked.msgpack").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.msgpack", "w.json"]


def test_convert_a_json_cycle_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "cycle.json"
    nodes = [
        {"id": 0, "name": "a", "op": "f", "parents": ["b"]},
        {"id": 1, "name": "b", "op": "f", "parents": ["a"]},
    ]
    path.write_text(json.dumps({"format": "graphsvc-json", "version": [1, 0], "nodes": nodes}))
    assert invoke("convert", str(path), "--to", "msgpack") == (
        3,
        "",
        f"Error: {path}: the graph has a cycle: 0 (a) -> 1 (b) -> 0 (a)\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cycle.json"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--to", "yaml"], 2, "Error: --to must be json or msgpack, not 'yaml'\n"),
        (["--to", "msgpack", "--out", "{json}"], 2, "Error: refusing to overwrite the input {json}; give --out\n"),
    ],
)
def test_convert_usage_errors(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    json_path = tmp_path / "g.json"
    json_path.write_text(json.dumps({"format": "graphsvc-json", "version": [1, 0], "nodes": [{"op": "leaf"}]}))
    args = [a.format(json=json_path) for a in args]
    assert invoke("convert", str(json_path), *args) == (code, "", message.format(json=json_path))


def test_convert_to_json_refuses_to_overwrite_its_input(tmp_path: Path) -> None:
    path = tmp_path / "g.msgpack"
    path.write_bytes((GOLDEN / "worked.msgpack").read_bytes())
    assert invoke("convert", str(path), "--to", "json", "-o", str(path)) == (
        2,
        "",
        f"Error: refusing to overwrite the input {path}; give --out\n",
    )
    assert path.read_bytes() == (GOLDEN / "worked.msgpack").read_bytes()


def test_convert_missing_json_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert invoke("convert", str(path), "--to", "msgpack") == (3, "", f"Error: {path}: no such file\n")


# -- entry points ---------------------------------------------------------------------------------
def test_help_mentions_every_inspection_command() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    for command in ("order", "inspect", "validate", "convert"):
        assert f"  {command} " in out
    assert invoke("order", "-h")[1].count("Example: graphsvc order") == 1


@pytest.mark.parametrize(
    "command", [[sys.executable, "-m", "graphsvc", "--help"], [sys.executable, "cli.py", "--help"]]
)
def test_entry_points_run_from_the_repository_root(command: list[str]) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout and "order" in done.stdout and "inspect" in done.stdout
    assert done.stderr == ""


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    """ "1 edge", not "1 edges" (graphsvc.text.counted, used by every count in a message)."""
    from graphsvc.text import counted

    assert [counted(0, "node"), counted(1, "node"), counted(2, "edge"), counted(1234567, "node", thousands=True)] == [
        "0 nodes",
        "1 node",
        "2 edges",
        "1,234,567 nodes",
    ]
    # a float in its shortest form (the seconds a FIFO is waited for)
    assert [counted(1.0, "second"), counted(0.3, "second"), counted(2.5, "second")] == [
        "1 second",
        "0.3 seconds",
        "2.5 seconds",
    ]
    b = GraphBuilder()
    b.add("neg", [b.leaf(2.0, name="x")], name="y")
    path = tmp_path / "two.msgpack"
    fmt.save(b.build(), path)
    assert invoke("validate", str(path)) == (0, f"{path}: valid graphsvc graph, 2 nodes, 1 edge\n", "")


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "no such file"), (b"hi\n", "not a graphsvc file: it starts with b'hi\\n', not a msgpack map")],
)
def test_convert_of_a_missing_or_broken_file_is_that_error_whatever_out_would_be(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "in.msgpack"
    if content is not None:
        path.write_bytes(content)
    result = runner.invoke(app, ["convert", str(path)])
    assert (result.exit_code, result.stdout, result.stderr) == (3, "", f"Error: {path}: {problem}\n")
