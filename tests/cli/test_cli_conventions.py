"""Conventions users bring from other CLIs: global options anywhere, --version, plain help,
choices completed, `-` for standard streams, one way of saying what was written."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.format import jsonio
from graphsvc.graph import GraphBuilder
from tests.conftest import ROOT

SEED004 = ROOT / "examples" / "seed004.msgpack"
COMMANDS = ("order", "inspect", "validate", "convert", "forward", "backward", "render", "ops", "gradcheck", "view")

runner = CliRunner()


def invoke(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


# -- global options after the command ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["backward", "F", "-q"], ["-q", "backward", "F"]),
        (["backward", "F", "--plugin", "p.py", "--debug"], ["--plugin", "p.py", "--debug", "backward", "F"]),
        (["backward", "F", "--plugin=p.py"], ["--plugin=p.py", "backward", "F"]),
        (["--plugin", "a.py", "order", "F", "--quiet"], ["--plugin", "a.py", "--quiet", "order", "F"]),
        # the value of one of the command's options is never taken for a global option
        (["backward", "F", "--output", "-q"], ["backward", "F", "--output", "-q"]),
        (["backward", "F", "--output", "-q", "-q"], ["-q", "backward", "F", "--output", "-q"]),
        # after --, every word is an argument
        (["order", "--", "-q"], ["order", "--", "-q"]),
        (["-q", "order", "F"], ["-q", "order", "F"]),
        (["nosuchcommand", "-q"], ["nosuchcommand", "-q"]),
        (["--plugin", "p.py", "order", "F"], ["--plugin", "p.py", "order", "F"]),
        (["--plugin", "p.py", "ops", "--plugin", "q"], ["--plugin", "p.py", "--plugin", "q", "ops"]),
    ],
)
def test_global_options_after_the_command_work_as_before_it(words: list[str], expected: list[str]) -> None:
    """Click parses them there (each command takes them, hidden): the same output, warnings, exit code."""

    def real(args: list[str]) -> list[str]:  # F: a graph; p.py, q: plugins that fail to load (a warning)
        return [str(SEED004) if word == "F" else word for word in args]

    assert invoke(*real(words)) == invoke(*real(expected))


def test_a_global_option_after_the_command_is_hidden_from_its_help_and_needs_its_value() -> None:
    assert "--plugin" not in invoke("order", "-h")[1].split("Global options")[0]
    code, stdout, stderr = invoke("order", str(SEED004), "--plugin")
    assert (code, stdout, stderr) == (2, "", "Error: Option '--plugin' requires an argument; see graphsvc -h\n")


def test_quiet_and_strict_plugins_work_after_the_command(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text('raise RuntimeError("boom")\n', encoding="utf-8")
    before = invoke("--strict-plugins", "--plugin", str(broken), "backward", str(SEED004))
    after = invoke("backward", str(SEED004), "-q", "--plugin", str(broken), "--strict-plugins")
    assert before == after
    assert after[0] == 4
    code, stdout, stderr = invoke("backward", str(SEED004), "-q")
    assert (code, stderr) == (0, "")
    assert stdout.splitlines()[0] == "6\tL\tmul\t4,5\t35.0\t1.0"


def test_version_prints_the_packages_version() -> None:
    from graphsvc import native

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = sorted(path.stem for path in (ROOT / "csrc").glob("*.c"))  # one extension per C file
    built = [n for n in names if importlib.util.find_spec(f"graphsvc.native._c{n}") is not None]
    runs = f"compiled: {', '.join(built)}" if built else "compiled: none, pure Python (no C compiler at install)"
    if built and not native.enabled():  # GRAPHSVC_NATIVE=0
        runs += "; off with GRAPHSVC_NATIVE=0: pure Python"
    assert invoke("--version") == (0, f"graphsvc {project['version']} ({runs})\n", "")


# -- help and completion ------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_arguments_and_choices_plainly(command: str) -> None:
    code, stdout, _ = invoke(command, "-h")
    assert code == 0
    assert not re.search(r"<[a-z_\[\]|]+>|\{[a-z_]+\}|list\[|``", stdout), stdout  # `` : a docstring's markup
    assert "they may come before or after the command" in stdout.replace("\n  ", " ")


def test_the_command_list_shows_no_docstring_markup() -> None:
    code, stdout, _ = invoke("--help")
    assert code == 0 and "ops " in stdout and "``" not in stdout


def test_help_shows_file_and_the_choices() -> None:
    order = invoke("order", "-h")[1]
    assert "Usage: graphsvc order [OPTIONS] FILE\n" in order
    assert re.search(r"\n  FILE +A graph file", order)
    assert "--algorithm [dfs|kahn]" in order
    assert "--output NODE" in order
    assert "--to [json|msgpack]" in invoke("convert", "-h")[1]
    assert "--set NAME=VALUE" in invoke("backward", "-h")[1]


def complete_bash(words: str, stdin: int | None = None) -> list[str]:
    env = {
        **os.environ,
        "_GRAPHSVC_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    result = subprocess.run(
        [sys.executable, "-m", "graphsvc"], cwd=ROOT, env=env, stdin=stdin, capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout.split()


def test_completion_offers_the_choices_of_a_choice_option() -> None:
    assert complete_bash(f"graphsvc order {SEED004} --algorithm ") == ["dfs", "kahn"]
    assert complete_bash(f"graphsvc convert {SEED004} --to j") == ["json"]


def test_completion_does_not_read_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "graph.msgpack"
    os.mkfifo(fifo)  # nothing ever writes to it: opening it to read would block the shell
    assert complete_bash(f"graphsvc backward {fifo} --output ") == []


@pytest.mark.parametrize("file", ["/dev/stdin", "-"])
def test_completion_does_not_read_standard_input(file: str) -> None:
    """Standard input holds a graph it could list names from: it is the user's, and a pipe or a
    terminal may never end, so completion leaves it alone as it leaves a FIFO."""
    read, write = os.pipe()
    os.write(write, SEED004.read_bytes())
    os.close(write)
    try:
        assert complete_bash(f"graphsvc backward {file} --output ", stdin=read) == []
    finally:
        os.close(read)
    assert complete_bash(f"graphsvc backward {SEED004} --output ") == ["a", "b", "c", "ab", "abc", "apb", "L"]


def test_a_choice_outside_the_list_is_a_usage_error() -> None:
    code, _, stderr = invoke("order", str(SEED004), "--algorithm", "bfs")  # one line, as every error
    assert (code, stderr) == (2, "Error: --algorithm must be dfs or kahn, not 'bfs'\n")


# -- what was written -------------------------------------------------------------------------------------
def test_every_command_that_writes_a_file_says_so_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    expected = {
        ("convert", str(SEED004), "-o", "s.json"): "wrote s.json (7 nodes)\n",
        ("convert", "s.json", "-o", "s.msgpack"): "wrote s.msgpack (7 nodes)\n",
        ("forward", str(SEED004), "--write", "f.msgpack"): "wrote f.msgpack (7 nodes)\n",
        ("backward", str(SEED004), "--write", "b.msgpack"): "wrote b.msgpack (7 nodes)\n",
        ("render", str(SEED004), "-o", "r.dot"): "wrote r.dot (7 nodes)\n",
        ("render", str(SEED004), "-o", "a.dot", "--around", "a", "--depth", "1"): "wrote a.dot (3 nodes)\n",
    }
    for args, message in expected.items():
        code, _, stderr = invoke(*args)
        assert (code, stderr) == (0, message), args
    assert (tmp_path / "s.msgpack").read_bytes() == SEED004.read_bytes()


# -- convert ------------------------------------------------------------------------------------------------
def test_convert_takes_the_form_from_the_extension(tmp_path: Path) -> None:
    json_out, msgpack_out = tmp_path / "g.JSON", tmp_path / "g2.msgpack"
    assert invoke("convert", str(SEED004), "-o", str(json_out))[0] == 0
    assert json_out.read_text(encoding="utf-8") == jsonio.dumps(fmt.load(SEED004))
    assert invoke("convert", str(json_out), "-o", str(msgpack_out))[0] == 0
    assert msgpack_out.read_bytes() == SEED004.read_bytes()
    assert invoke("convert", str(SEED004), "-o", str(tmp_path / "g.txt")) == (
        2,
        "",
        f"Error: say which form to write: --to json or --to msgpack ({tmp_path / 'g.txt'} has no .json or"
        " .msgpack extension)\n",
    )
    assert not (tmp_path / "g.txt").exists()


def test_convert_writes_the_other_form_by_default(tmp_path: Path) -> None:
    """No -o and no --to: msgpack becomes JSON on standard output, JSON becomes msgpack next to it;
    -o - without --to: the other form on standard output, standard input told apart by content."""
    assert invoke("convert", str(SEED004)) == (0, jsonio.dumps(fmt.load(SEED004)), "")
    json_file = tmp_path / "s.json"
    json_file.write_text(jsonio.dumps(fmt.load(SEED004)), encoding="utf-8")
    assert invoke("convert", str(json_file)) == (0, "", f"wrote {tmp_path / 's.msgpack'} (7 nodes)\n")
    assert (tmp_path / "s.msgpack").read_bytes() == SEED004.read_bytes()
    assert invoke("convert", str(SEED004), "-o", "-") == (0, jsonio.dumps(fmt.load(SEED004)), "")
    result = runner.invoke(app, ["convert", "-", "-o", "-"], input=json_file.read_bytes())
    assert (result.exit_code, result.stdout_bytes) == (0, SEED004.read_bytes())
    result = runner.invoke(app, ["convert", "-"], input=SEED004.read_bytes())
    assert (result.exit_code, result.stdout) == (0, jsonio.dumps(fmt.load(SEED004)))
    assert invoke("convert", "-", stdin=json_file.read_bytes()) == (
        2,
        "",
        "Error: reading standard input: say where to write with --out (- for standard output)\n",
    )


def test_convert_writes_standard_output_with_a_dash() -> None:
    code, stdout, stderr = invoke("convert", str(SEED004), "--to", "json", "-o", "-")
    assert (code, stderr) == (0, "")
    assert stdout == jsonio.dumps(fmt.load(SEED004))
    result = runner.invoke(app, ["convert", str(SEED004), "--to", "msgpack", "-o", "-"])
    assert result.exit_code == 0
    assert result.stdout_bytes == SEED004.read_bytes()


def test_write_to_standard_output_is_refused_where_the_listing_goes(tmp_path: Path) -> None:
    assert invoke("forward", str(SEED004), "--write", "-") == (
        2,
        "",
        "Error: --write -: standard output holds the listing; give a file name\n",
    )


def test_render_dash_prints_the_dot_text() -> None:
    code, stdout, _ = invoke("render", str(SEED004), "-o", "-")
    assert code == 0
    assert stdout.startswith("digraph graphsvc {\n")
    assert stdout.count('label="{') == 7  # one record a node


# -- messages ---------------------------------------------------------------------------------------------
def test_inspect_cuts_long_lists_with_a_count(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(1.0, name="x")
    outputs = [b.add("neg", [x], name=f"y{i}") for i in range(20_000)]
    path = tmp_path / "wide.msgpack"
    fmt.save(b.build(outputs=outputs), path)
    code, stdout, _ = invoke("inspect", str(path))
    assert code == 0
    assert "outputs: y0, y1, y2, y3, y4, y5, y6, y7, y8, y9 and 19,990 more\n" in stdout
    assert "leaves: 1 (x)\n" in stdout
    assert max(map(len, stdout.splitlines())) < 200


def test_an_error_is_one_escaped_line_of_bounded_length(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.leaf(1.0, name="a")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)
    name = "x\n\x1b]0;pwned\x07" + "z" * 5000
    code, stdout, stderr = invoke("order", str(path), "--output", name)
    assert (code, stdout) == (2, "")
    assert stderr.count("\n") == 1
    assert "\x1b" not in stderr and "\x07" not in stderr
    assert stderr.startswith("Error: no node named 'x\\n\\x1b]0;pwned\\x07zzz")
    assert stderr.endswith("zz... (5,021 characters) (the outputs: a)\n")  # the name cut, the outputs shown
    assert len(stderr) <= len("Error: ") + 401


def test_json_listing_of_inspect_is_valid_json() -> None:
    code, stdout, _ = invoke("inspect", str(SEED004), "--json")
    assert code == 0
    info = json.loads(stdout)
    assert (info["file"], info["nodes"], info["outputs"]) == (str(SEED004), 7, [{"id": 6, "name": "L"}])


# -- text from the file, escaped wherever the CLI prints it -------------------------------------------------
def test_steps_inspect_and_errors_escape_names_from_the_file(tmp_path: Path) -> None:
    from tests.test_escaping import PIPED, hostile_graph

    path = tmp_path / "hostile.msgpack"
    fmt.save(hostile_graph(), path)
    steps = runner.invoke(app, ["--disable-plugins", "backward", str(path), "--steps"], env=PIPED)
    assert steps.exit_code == 0
    assert steps.stdout.splitlines()[:3] == [
        "step 1: back\\\\slash (mul) grad = 1.0",
        "  -> \\x1b[2J: local derivative 5.0, adds 5.0",
        "  -> \\u202eevil\\u2028: local derivative 7.0, adds 7.0",
    ]
    shown = runner.invoke(app, ["inspect", str(path)], env=PIPED).stdout.splitlines()
    assert "leaves: 3 (tab\\there\\r, new\\nline, [bold red]x[/] [link=https://example.com]y[/link] :smile:)" in shown
    assert "outputs: back\\\\slash" in shown
    assert invoke("backward", str(path), "--output", "x\x1b[2J") == (
        2,
        "",
        "Error: no node named 'x\\x1b[2J'; did you mean '\\x1b[2J'? (the outputs: back\\\\slash)\n",
    )


def test_writing_to_a_full_device_is_one_line_not_an_internal_error() -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "graphsvc", "order", str(SEED004)],
            stdout=full,
            capture_output=False,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert (result.returncode, result.stderr) == (5, "Error: cannot write standard output: No space left on device\n")


def test_validate_names_standard_input_and_escapes_the_path(tmp_path: Path) -> None:
    assert invoke("validate", "-", stdin=SEED004.read_bytes()) == (
        0,
        "standard input: valid graphsvc graph, 7 nodes, 8 edges\n",
        "",
    )
    odd = tmp_path / "a\x1bb.msgpack"
    odd.write_bytes(SEED004.read_bytes())
    assert invoke("validate", str(odd))[1] == f"{tmp_path}/a\\x1bb.msgpack: valid graphsvc graph, 7 nodes, 8 edges\n"


def test_inspect_cuts_a_long_op_table_too(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(1.0, name="x")
    for i in range(1000):
        b.add(f"op{i:04d}", [x])
    path = tmp_path / "many_ops.msgpack"
    fmt.save(b.build(), path)
    lines = invoke("inspect", str(path))[1].splitlines()
    ops = next(line for line in lines if line.startswith("ops: "))
    assert ops.startswith("ops: leaf 1, op0000 1, op0001 1, ")
    assert ops.endswith(", op0038 1 and 961 more")
    plugins = next(line for line in lines if line.startswith("plugins: "))
    assert plugins.endswith("op0039 and 960 more)")
    assert max(map(len, lines)) < 700


def test_progress_covers_converting_and_printing(tmp_path: Path) -> None:
    from tests.cli.test_cli_terminal import cli, with_terminal_stderr

    now = {"GRAPHSVC_PROGRESS_DELAY": "0"}
    code, _, tty = with_terminal_stderr(*cli("convert", str(SEED004), "-o", str(tmp_path / "s.json")), env=now)
    assert code == 0
    assert "converting to json" in tty
    code, _, tty = with_terminal_stderr(
        *cli("convert", str(tmp_path / "s.json"), "-o", str(tmp_path / "s2.msgpack")), env=now
    )
    assert code == 0
    assert f"loading {tmp_path / 's.json'}" in tty
    code, stdout, tty = with_terminal_stderr(*cli("order", str(SEED004)), env=now)
    assert (code, stdout.splitlines()[0]) == (0, "6\tL\tmul\t4,5")
    assert "printing 7 nodes" in tty


def test_progress_covers_from_micrograd() -> None:
    from tests.cli.test_cli_terminal import with_terminal_stderr

    script = (
        "from micrograd.engine import Value\nimport graphsvc\n"
        "a = Value(2.0); b = a * a + 1\ngraphsvc.from_micrograd(b)\n"
    )
    code, stdout, tty = with_terminal_stderr(sys.executable, "-c", script, env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (code, stdout) == (0, "")
    assert "importing from micrograd" in tty


# -- Click's usage errors are one line too ------------------------------------------------------------
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["order"], "Error: FILE is missing; give - to read the graph from standard input; see graphsvc order -h\n"),
        (["order", "--nosuch", "F"], "Error: No such option: --nosuch; see graphsvc order -h\n"),
        (
            ["order", "g.msgpack", "h.msgpack"],
            "Error: Got unexpected extra argument(s) (h.msgpack); see graphsvc order -h\n",
        ),
        (["nosuchcommand"], "Error: No such command 'nosuchcommand'; see graphsvc -h\n"),
        (["--plugin"], "Error: Option '--plugin' requires an argument; see graphsvc -h\n"),
        (["order", "a\nb", "--nosuch"], "Error: No such option: --nosuch; see graphsvc order -h\n"),
    ],
)
def test_usage_errors_are_one_line_with_where_to_look(words: list[str], expected: str) -> None:
    """As every error (docs/cli.md: one line, ``Error: ...``, exit 2 for usage), not Click's usage and hint."""
    assert invoke(*words) == (2, "", expected)


def test_the_console_script_says_usage_errors_in_one_line_and_graphsvc_alone_its_help() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "graphsvc", "order"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert (run.returncode, run.stdout, run.stderr) == (
        2,
        "",
        "Error: FILE is missing; give - to read the graph from standard input; see graphsvc order -h\n",
    )
    alone = subprocess.run([sys.executable, "-m", "graphsvc"], capture_output=True, text=True)
    assert alone.returncode == 2 and (alone.stdout + alone.stderr).startswith("Usage: graphsvc [OPTIONS] COMMAND")


@pytest.mark.parametrize("words", [["order"], ["inspect"], ["validate"], ["convert"], ["forward"], ["backward"]])
def test_a_missing_file_with_redirected_stdin_says_to_give_a_dash(words: list[str]) -> None:
    """``graphsvc order < g.msgpack``: FILE is missing, and standard input is not a terminal."""
    assert invoke(*words, stdin=SEED004.read_bytes()) == (
        2,
        "",
        f"Error: FILE is missing; give - to read the graph from standard input; see graphsvc {words[0]} -h\n",
    )


def test_version_has_a_short_option() -> None:
    assert invoke("-V")[:2] == invoke("--version")[:2]
    assert invoke("-V")[1].startswith("graphsvc ")


def test_a_missing_file_on_a_terminal_is_clicks_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard input on a terminal: nothing to read, so no hint about -."""
    import io

    import cli

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    class MissingParameter(Exception):
        param = type("Param", (), {"metavar": "FILE"})()

    monkeypatch.setattr(sys, "stdin", Terminal())
    assert cli._missing_file(MissingParameter()) is None
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    assert cli._missing_file(MissingParameter()) == "FILE is missing; give - to read the graph from standard input"
