"""Text from a file cannot forge output: names and op tags holding tabs, newlines, terminal escape
sequences, bidi controls, backslashes and rich markup come out escaped in the piped listings, in the
tables on a terminal and in error messages, and exactly as json.dumps writes them in --json."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.console import listing
from graphsvc.errors import GraphStructureError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.topo import topological_sort
from tests.conftest import seed004_graph

runner = CliRunner()
PIPED = {"GRAPHSVC_FORCE_TERMINAL": "0"}
TERMINAL = {"GRAPHSVC_FORCE_TERMINAL": "1", "NO_COLOR": "1", "COLUMNS": "200"}
MARKUP = "[bold red]x[/] [link=https://example.com]y[/link] :smile:"

#: seed 004's L = (a*b + c)*(a + b) at a=2, b=3, c=1, every name hostile: (name, how it prints)
NAMES = [
    ("tab\there\r", r"tab\there\r"),
    ("new\nline", r"new\nline"),
    (MARKUP, MARKUP),
    ("\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),  # sets the terminal's title
    ("\x1b[2J", r"\x1b[2J"),  # clears the screen
    ("\u202eevil\u2028", r"\u202eevil\u2028"),  # right-to-left override; line separator
    ("back\\slash", r"back\\slash"),
]
SHOWN = [shown for _, shown in NAMES]


def hostile_graph() -> Graph:
    return seed004_graph(names=tuple(name for name, _ in NAMES), values=True)


@pytest.fixture
def hostile_file(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.msgpack"
    fmt.save(hostile_graph(), path)
    return path


def rows(*cells: tuple[str, ...]) -> str:
    return "".join("\t".join(row) + "\n" for row in cells)


# -- piped: tab-separated text ----------------------------------------------------------------------
def test_order_piped_escapes_every_name(hostile_file: Path) -> None:
    result = runner.invoke(app, ["order", str(hostile_file)], env=PIPED)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == rows(
        ("6", SHOWN[6], "mul", "4,5"),
        ("5", SHOWN[5], "add", "0,1"),
        ("4", SHOWN[4], "add", "3,2"),
        ("2", SHOWN[2], "leaf", "-"),
        ("3", SHOWN[3], "mul", "0,1"),
        ("1", SHOWN[1], "leaf", "-"),
        ("0", SHOWN[0], "leaf", "-"),
    )
    assert [len(line.split("\t")) for line in result.stdout.splitlines()] == [4] * 7


def test_backward_piped_escapes_every_name(hostile_file: Path) -> None:
    result = runner.invoke(app, ["--disable-plugins", "backward", str(hostile_file)], env=PIPED)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == rows(
        ("6", SHOWN[6], "mul", "4,5", "35.0", "1.0"),
        ("5", SHOWN[5], "add", "0,1", "5.0", "7.0"),
        ("4", SHOWN[4], "add", "3,2", "7.0", "5.0"),
        ("3", SHOWN[3], "mul", "0,1", "6.0", "5.0"),
        ("2", SHOWN[2], "leaf", "-", "1.0", "5.0"),
        ("1", SHOWN[1], "leaf", "-", "3.0", "17.0"),
        ("0", SHOWN[0], "leaf", "-", "2.0", "22.0"),
    )


def test_forward_piped_escapes_every_name(hostile_file: Path) -> None:
    result = runner.invoke(app, ["--disable-plugins", "forward", str(hostile_file)], env=PIPED)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == rows(
        ("6", SHOWN[6], "mul", "4,5", "35.0"),
        ("5", SHOWN[5], "add", "0,1", "5.0"),
        ("4", SHOWN[4], "add", "3,2", "7.0"),
        ("3", SHOWN[3], "mul", "0,1", "6.0"),
        ("2", SHOWN[2], "leaf", "-", "1.0"),
        ("1", SHOWN[1], "leaf", "-", "3.0"),
        ("0", SHOWN[0], "leaf", "-", "2.0"),
    )


@pytest.mark.parametrize("chunk", [1, 2, 3, listing.CHUNK])
def test_op_tags_are_escaped_and_only_chunks_that_need_it_change(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "CHUNK", chunk)
    b = GraphBuilder()
    x = b.leaf(1.0, name="x")
    y = b.add("my\top\x1b[31m", [x], name="plain")
    b.add("f", [y], name="a\nb")
    b.add("f", [x])
    text = "".join(listing.text(b.build(), [3, 2, 1, 0]))
    assert text == rows(
        ("3", "-", "f", "0"),
        ("2", "a\\nb", "f", "1"),
        ("1", "plain", "my\\top\\x1b[31m", "0"),
        ("0", "x", "leaf", "-"),
    )


def test_op_tags_from_the_file_are_escaped_by_inspect_and_in_errors(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.add("my\top\x1b]0;T\x07", [b.leaf(1.0, name="x")], name="y")
    path = tmp_path / "tag.msgpack"
    fmt.save(b.build(), path)
    tag = "my\\top\\x1b]0;T\\x07"
    piped = runner.invoke(app, ["inspect", str(path)], env=PIPED)
    assert (piped.exit_code, piped.stderr) == (0, "")
    assert piped.stdout.splitlines()[-2:] == [
        f"ops: leaf 1, {tag} 1",
        f"plugins: graphsvc (builtin) (leaf); unknown ({tag})",
    ]
    table = runner.invoke(app, ["inspect", str(path)], env=TERMINAL)
    assert (table.exit_code, table.stderr) == (0, "")
    assert_nothing_raw(table.stdout)
    assert [line.rstrip().split(maxsplit=1) for line in table.stdout.splitlines()[-2:]] == [
        ["ops", f"leaf 1, {tag} 1"],
        ["plugins", f"graphsvc (builtin) (leaf); unknown ({tag})"],
    ]
    refused = runner.invoke(app, ["--disable-plugins", "forward", str(path)], env=PIPED)
    assert (refused.exit_code, refused.stdout, refused.stderr) == (
        4,
        "",
        f"Error: the graph uses an op not registered here: {tag} (plugin unknown); install the plugin that provides"
        " it, without --disable-plugins (it keeps out every plugin, --plugin ones too)\n",
    )


# -- JSON: exactly what json.dumps writes -------------------------------------------------------------
def test_order_json_escapes_control_characters_as_json_does(hostile_file: Path) -> None:
    result = runner.invoke(app, ["order", str(hostile_file), "--json"])
    assert result.exit_code == 0
    out = result.stdout
    assert '{"id":3,"name":"\\u001b]0;pwned\\u0007","op":"mul","parents":[0,1]}' in out
    assert '{"id":0,"name":"tab\\there\\r","op":"leaf","parents":[]}' in out
    assert '{"id":6,"name":"back\\\\slash","op":"mul","parents":[4,5]}' in out
    assert '"name":"\\u202eevil\\u2028"' in out  # valid JSON as they are, and escaped: inert on a terminal
    assert "\x1b" not in out and "\x07" not in out and "\n" not in out[:-1]
    document = json.loads(out)
    assert [node["name"] for node in sorted(document["nodes"], key=lambda n: n["id"])] == [n for n, _ in NAMES]


# -- on a terminal: rich tables --------------------------------------------------------------------
def table_rows(stdout: str) -> list[list[str]]:
    lines = [line.rstrip() for line in stdout.splitlines()]
    start = next(i for i, line in enumerate(lines) if set(line) == {"─"}) + 1
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start:]]


def assert_nothing_raw(stdout: str) -> None:
    for raw in ("\x1b]", "\x07", "\x1b[2J", "\u202e", "\u2028", "\r", "\t"):
        assert raw not in stdout, repr(raw)


def test_backward_table_shows_escaped_names_and_markup_literally(hostile_file: Path) -> None:
    result = runner.invoke(app, ["--disable-plugins", "backward", str(hostile_file)], env=TERMINAL)
    assert (result.exit_code, result.stderr) == (0, "")
    assert_nothing_raw(result.stdout)
    assert table_rows(result.stdout) == [
        ["6", SHOWN[6], "mul", "4,5", "35.0", "1.0"],
        ["5", SHOWN[5], "add", "0,1", "5.0", "7.0"],
        ["4", SHOWN[4], "add", "3,2", "7.0", "5.0"],
        ["3", SHOWN[3], "mul", "0,1", "6.0", "5.0"],
        ["2", SHOWN[2], "leaf", "-", "1.0", "5.0"],
        ["1", SHOWN[1], "leaf", "-", "3.0", "17.0"],
        ["0", SHOWN[0], "leaf", "-", "2.0", "22.0"],
    ]


def test_order_table_shows_escaped_names(hostile_file: Path) -> None:
    result = runner.invoke(app, ["order", str(hostile_file), "--output", "\x1b[2J"], env=TERMINAL)
    assert (result.exit_code, result.stderr) == (0, "")
    assert_nothing_raw(result.stdout)
    assert table_rows(result.stdout) == [
        ["4", SHOWN[4], "add", "3,2"],
        ["2", SHOWN[2], "leaf", "-"],
        ["3", SHOWN[3], "mul", "0,1"],
        ["1", SHOWN[1], "leaf", "-"],
        ["0", SHOWN[0], "leaf", "-"],
    ]


# -- messages --------------------------------------------------------------------------------------
def test_a_long_cycle_is_cut_and_its_nodes_escaped() -> None:
    ring = {i: [(i - 1) % 25] for i in range(25)}
    with pytest.raises(GraphStructureError) as info:
        topological_sort(ring)
    assert str(info.value) == "the graph has a cycle: 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 9 -> (15 more) -> 0"
    with pytest.raises(GraphStructureError) as info:
        topological_sort({0: [1], 1: [0]}, {0: "0 (a\nb\x1b[2J)", 1: "1 (" + "x" * 100 + ")"})
    long = "1 (" + "x" * 37 + "... (104 characters)"
    assert str(info.value) == f"the graph has a cycle: 0 (a\\nb\\x1b[2J) -> {long} -> 0 (a\\nb\\x1b[2J)"


def test_a_cycle_of_exactly_ten_nodes_is_shown_whole() -> None:
    with pytest.raises(GraphStructureError) as info:
        topological_sort({i: [(i - 1) % 10] for i in range(10)})
    assert str(info.value) == "the graph has a cycle: 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 9 -> 0"


# -- lone surrogates: a JSON file's "\ud800", a plugin's text ------------------------------------------
SURROGATES_JSON = (
    '{"format": "graphsvc-json", "version": [1, 0], "nodes": ['
    '{"id": 0, "name": "a\\udc80", "op": "leaf", "parents": [], "value": 1.0},'
    '{"id": 1, "name": "b", "op": "neg\\ud800", "parents": [0], "value": -1.0}],'
    ' "metadata": {"m\\udc80": "\\ud83d"}}'
)


def run_cli(*args: str, cwd: Path) -> tuple[int, bytes, bytes]:
    """The real CLI in a process, its standard output strict UTF-8 (a UTF-8 locale's)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHSVC_")}
    env.update(LC_ALL="C.UTF-8", PYTHONUTF8="0", PYTHONIOENCODING="utf-8:strict")
    script = Path(__file__).resolve().parent.parent / "cli.py"
    process = subprocess.run([sys.executable, str(script), *args], capture_output=True, cwd=cwd, env=env)
    return process.returncode, process.stdout, process.stderr


def test_lone_surrogates_from_a_json_file_are_refused_and_the_message_is_utf_8(tmp_path: Path) -> None:
    """json.loads makes "\\ud800" a lone surrogate: not Unicode text, which a graph file holds
    (FORMAT.md §9, §13); every command refuses the file, and the error line names the string, escaped."""
    (tmp_path / "s.json").write_text(SURROGATES_JSON)
    message = b"Error: s.json: the string at nodes[0].name holds a lone surrogate (\\udc80), which is not Unicode text"
    for command in (["validate"], ["order"], ["order", "--json"], ["inspect"], ["convert", "--to", "msgpack"]):
        assert run_cli(command[0], "s.json", *command[1:], cwd=tmp_path) == (3, b"", message + b"\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["s.json"]


def test_lone_surrogates_in_a_plugins_text_are_escaped(tmp_path: Path) -> None:
    (tmp_path / "surrogates.py").write_text(
        "from graphsvc.hookspecs import hookimpl\n"
        "from graphsvc.ops import Op\n"
        '__version__ = "1\\udc80"\n'
        "def forward(x):\n"
        '    raise ValueError("bad \\ud800")\n'
        "@hookimpl\n"
        "def graphsvc_register_ops(register):\n"
        '    register(Op("sur", 1, forward=forward, vjp=lambda g, out, x: (g,), doc="d\\udc80",\n'
        "                samples=lambda rng: [((rng.standard_normal(2),), {})]))\n"
    )
    code, out, err = run_cli("--plugin", "surrogates.py", "ops", cwd=tmp_path)
    assert (code, err) == (0, b"")
    assert b"sur\t1\t1\tsurrogates 1\\udc80\tvjp\n" in out
    code, out, err = run_cli("--plugin", "surrogates.py", "ops", "--json", cwd=tmp_path)
    assert (code, err) == (0, b"")
    (sur,) = [op for op in json.loads(out.decode())["ops"] if op["name"] == "sur"]
    assert (sur["plugin_version"], sur["doc"]) == ("1\udc80", "d\udc80")
    code, out, err = run_cli("--plugin", "surrogates.py", "gradcheck", "--op", "sur", cwd=tmp_path)
    assert (code, err) == (1, b"Error: gradcheck failed for 1 of 1 op: sur\n")
    assert out == (
        b"sur (surrogates 1\\udc80): FAIL: op 'sur' (surrogates 1\\udc80): forward raised ValueError: bad \\ud800\n"
    )


# -- characters that draw as nothing, reorder text or drive a terminal, on every output path ------------
#: (name, as text shows it, as JSON writes it): zero-width space and joiner, soft hyphen, a tag
#: character, the byte-order mark, a right-to-left override, a C1 CSI (one byte on some terminals)
INVISIBLE = [
    ("zw\u200bsp", r"zw\u200bsp", r"zw\u200bsp"),
    ("zwj\u200d", r"zwj\u200d", r"zwj\u200d"),
    ("soft\xad", r"soft\xad", r"soft\u00ad"),
    ("tag\U000e0041", r"tag\U000e0041", r"tag\udb40\udc41"),
    ("\ufeffbom", r"\ufeffbom", r"\ufeffbom"),
    ("rlo\u202e", r"rlo\u202e", r"rlo\u202e"),
    ("csi\x9b", r"csi\x9b", r"csi\u009b"),
]
TEXT = [text for _, text, _ in INVISIBLE]
JSON = [json_text for _, _, json_text in INVISIBLE]


@pytest.fixture
def invisible_file(tmp_path: Path) -> Path:
    path = tmp_path / "invisible.msgpack"
    fmt.save(seed004_graph(names=tuple(name for name, _, _ in INVISIBLE), values=True), path)
    return path


def assert_no_invisible_character(out: str, allowed: str = "\t\n") -> None:
    """Nothing unprintable in ``out`` but the ``allowed`` characters (a listing's tabs and newlines)."""
    assert "".join(char for char in out if not char.isprintable() and char not in allowed) == ""


def test_invisible_characters_are_escaped_in_text_listings(invisible_file: Path) -> None:
    order = runner.invoke(app, ["order", str(invisible_file)], env=PIPED)
    assert (order.exit_code, order.stderr) == (0, "")
    assert order.stdout == rows(
        ("6", TEXT[6], "mul", "4,5"),
        ("5", TEXT[5], "add", "0,1"),
        ("4", TEXT[4], "add", "3,2"),
        ("2", TEXT[2], "leaf", "-"),
        ("3", TEXT[3], "mul", "0,1"),
        ("1", TEXT[1], "leaf", "-"),
        ("0", TEXT[0], "leaf", "-"),
    )
    forward = runner.invoke(app, ["--disable-plugins", "forward", str(invisible_file)], env=PIPED)
    assert (forward.exit_code, forward.stderr) == (0, "")
    assert forward.stdout == rows(
        ("6", TEXT[6], "mul", "4,5", "35.0"),
        ("5", TEXT[5], "add", "0,1", "5.0"),
        ("4", TEXT[4], "add", "3,2", "7.0"),
        ("3", TEXT[3], "mul", "0,1", "6.0"),
        ("2", TEXT[2], "leaf", "-", "1.0"),
        ("1", TEXT[1], "leaf", "-", "3.0"),
        ("0", TEXT[0], "leaf", "-", "2.0"),
    )
    backward = runner.invoke(app, ["--disable-plugins", "backward", str(invisible_file)], env=PIPED)
    assert (backward.exit_code, backward.stderr) == (0, "")
    assert backward.stdout == rows(
        ("6", TEXT[6], "mul", "4,5", "35.0", "1.0"),
        ("5", TEXT[5], "add", "0,1", "5.0", "7.0"),
        ("4", TEXT[4], "add", "3,2", "7.0", "5.0"),
        ("3", TEXT[3], "mul", "0,1", "6.0", "5.0"),
        ("2", TEXT[2], "leaf", "-", "1.0", "5.0"),
        ("1", TEXT[1], "leaf", "-", "3.0", "17.0"),
        ("0", TEXT[0], "leaf", "-", "2.0", "22.0"),
    )
    inspect = runner.invoke(app, ["inspect", str(invisible_file)], env=PIPED)
    assert (inspect.exit_code, inspect.stderr) == (0, "")
    assert inspect.stdout.splitlines()[4:6] == [f"leaves: 3 ({TEXT[0]}, {TEXT[1]}, {TEXT[2]})", f"outputs: {TEXT[6]}"]
    for out in (order.stdout, forward.stdout, backward.stdout, inspect.stdout):
        assert_no_invisible_character(out)


def test_invisible_characters_are_escaped_in_tables(invisible_file: Path) -> None:
    result = runner.invoke(app, ["order", str(invisible_file)], env=TERMINAL)
    assert (result.exit_code, result.stderr) == (0, "")
    assert_no_invisible_character(result.stdout, allowed="\n\x1b")  # the header's bold
    assert table_rows(result.stdout) == [
        ["6", TEXT[6], "mul", "4,5"],
        ["5", TEXT[5], "add", "0,1"],
        ["4", TEXT[4], "add", "3,2"],
        ["2", TEXT[2], "leaf", "-"],
        ["3", TEXT[3], "mul", "0,1"],
        ["1", TEXT[1], "leaf", "-"],
        ["0", TEXT[0], "leaf", "-"],
    ]


def test_invisible_characters_are_json_escapes_in_json(invisible_file: Path) -> None:
    order = runner.invoke(app, ["order", str(invisible_file), "--json"])
    assert (order.exit_code, order.stderr) == (0, "")
    nodes = [(6, "mul", "4,5"), (5, "add", "0,1"), (4, "add", "3,2"), (2, "leaf", ""), (3, "mul", "0,1")]
    nodes += [(1, "leaf", ""), (0, "leaf", "")]
    listed = ",".join(f'{{"id":{i},"name":"{JSON[i]}","op":"{op}","parents":[{p}]}}' for i, op, p in nodes)
    assert order.stdout == '{"algorithm":"dfs","output":null,"nodes":[' + listed + "]}\n"
    inspect = runner.invoke(app, ["inspect", str(invisible_file), "--json"])
    assert (inspect.exit_code, inspect.stderr) == (0, "")
    assert f'"outputs":[{{"id":6,"name":"{JSON[6]}"}}]' in inspect.stdout
    backward = runner.invoke(app, ["--disable-plugins", "backward", str(invisible_file), "--json"])
    assert backward.exit_code == 0
    assert f'{{"id":3,"name":"{JSON[3]}","op":"mul","parents":[0,1],"value":6.0,"grad":5.0}}' in backward.stdout
    for out in (order.stdout, inspect.stdout, backward.stdout):
        assert out.isascii()  # every name here is escaped to ASCII
        document = json.loads(out)
    assert [node["name"] for node in json.loads(order.stdout)["nodes"]][-1] == INVISIBLE[0][0]
    converted = runner.invoke(app, ["convert", str(invisible_file), "--to", "json", "-o", "-"])
    assert (converted.exit_code, converted.stderr) == (0, "")
    assert all(f'"name": "{json_text}"' in converted.stdout for json_text in JSON)  # the file's JSON form too
    from graphsvc.format import jsonio

    assert converted.stdout.isascii() and jsonio.loads(converted.stdout).names == {
        node: name for node, (name, _, _) in enumerate(INVISIBLE)
    }
    assert document["nodes"][0]["name"] == INVISIBLE[6][0]


def test_invisible_characters_are_escaped_in_dot_and_errors(invisible_file: Path) -> None:
    dot = runner.invoke(app, ["--disable-plugins", "render", str(invisible_file), "-o", "-"])
    assert (dot.exit_code, dot.stderr) == (0, "")
    labels = re.findall(r'^\tv\d+ \[label="\{ (.*?) \|', dot.stdout, flags=re.M)
    assert labels == [text.replace("\\", "\\\\") for text in TEXT]  # DOT writes a backslash twice
    assert dot.stdout.isascii()
    refused = runner.invoke(
        app, ["--disable-plugins", "backward", str(invisible_file), "--set", f"{INVISIBLE[6][0]}=1"]
    )
    assert (refused.exit_code, refused.stdout) == (2, "")
    assert refused.stderr == f"Error: node {TEXT[6]} is a mul node, not a leaf: only leaves can be set\n"
    unknown = runner.invoke(app, ["order", str(invisible_file), "--output", "zw\u200dsp"])
    assert (unknown.exit_code, unknown.stdout) == (2, "")
    assert unknown.stderr.startswith("Error: no node named 'zw\\u200dsp'")
    assert_no_invisible_character(refused.stderr + unknown.stderr)
