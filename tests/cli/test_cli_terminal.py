"""What a person at a terminal sees: rich tables (exact cells), plain text when piped, the progress bar on
stderr only, shell completion of node and op names, and an example in every command's help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli import app
from graphsvc.console import terminal
from tests.conftest import ROOT, SEED004_BACKWARD_PLAIN, python_m_graphsvc, with_terminal_stderr

SEED000 = "examples/seed000.msgpack"
SEED004 = "examples/seed004.msgpack"
runner = CliRunner()
TERMINAL = {"GRAPHSVC_FORCE_TERMINAL": "1", "NO_COLOR": "1", "COLUMNS": "120"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def table(*args: str, code: int = 0) -> list[str]:
    """The command's output as a terminal shows it, styles removed, trailing blanks trimmed."""
    result = runner.invoke(app, ["--disable-plugins", *args], env=TERMINAL)
    assert (result.exit_code, result.stderr) == (code, "")
    return [ANSI.sub("", line).rstrip() for line in result.stdout.splitlines()]


def cells(lines: list[str]) -> list[list[str]]:
    """Rows of a table below its header rule, split on the column gaps."""
    start = next(i for i, line in enumerate(lines) if set(line) == {"─"}) + 1
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start:]]


# -- tables on a terminal --------------------------------------------------------------------------
def test_backward_table_is_aligned_with_exact_cells() -> None:
    lines = table("backward", SEED004)
    assert lines[0].split() == ["id", "name", "op", "parents", "value", "grad"]
    assert lines[2:] == [
        " 6   L      mul    4,5        35.0    1.0",
        " 5   apb    add    0,1         5.0    7.0",
        " 4   abc    add    3,2         7.0    5.0",
        " 3   ab     mul    0,1         6.0    5.0",
        " 2   c      leaf   -           1.0    5.0",
        " 1   b      leaf   -           3.0   17.0",
        " 0   a      leaf   -           2.0   22.0",
    ]


def test_forward_table_and_check_lines() -> None:
    lines = table("forward", SEED004, "--set", "a=3", "--check", code=1)
    assert (
        lines[-1] == "check values (float64: rtol 1e-9, atol 1e-12)"
        ": worst abs diff 25.0 at L, worst rel diff 0.7142857142857143 at L: 5 beyond tolerance"
    )
    assert cells(lines[:-1]) == [
        ["6", "L", "mul", "4,5", "60.0"],
        ["5", "apb", "add", "0,1", "6.0"],
        ["4", "abc", "add", "3,2", "10.0"],
        ["3", "ab", "mul", "0,1", "9.0"],
        ["2", "c", "leaf", "-", "1.0"],
        ["1", "b", "leaf", "-", "3.0"],
        ["0", "a", "leaf", "-", "3.0"],
    ]


def test_order_table() -> None:
    assert cells(table("order", SEED000, "--algorithm", "kahn")) == [
        ["5", "y", "log", "4"],
        ["4", "t3", "add", "3,2"],
        ["2", "t2", "exp", "1"],
        ["1", "t1", "sin", "0"],
        ["0", "z", "leaf", "-"],
        ["3", "1", "const", "-"],
    ]


def test_inspect_table() -> None:
    rows = [re.split(r"\s{2,}", line.strip()) for line in table("inspect", SEED004)]
    assert rows == [
        ["file", f"{SEED004} (685 bytes)"],
        ["format version", "1.0"],
        ["nodes", "7"],
        ["edges", "8"],
        ["leaves", "3 (a, b, c)"],
        ["outputs", "L"],
        ["depth", "3"],
        ["gradients stored", "yes"],
        ["ops", "add 2, leaf 3, mul 2"],
        ["plugins", "graphsvc 0.1.0 (add, leaf, mul)"],
        ["metadata", "source: seed 004; expression: L = (a*b + c)*(a + b)"],
    ]


def test_ops_table() -> None:
    lines = table("ops")
    assert lines[0].split() == ["op", "inputs", "version", "plugin", "kind"]
    rows = {row[0]: row for row in cells(lines)}
    assert rows["add"] == ["add", "2", "1", "graphsvc 0.1.0", "vectorized"]
    assert rows["leaf"] == ["leaf", "0", "1", "graphsvc 0.1.0", "leaf tag"]


def test_force_terminal_0_and_long_listings_print_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["backward", SEED004], env={**TERMINAL, "GRAPHSVC_FORCE_TERMINAL": "0"})
    assert result.stdout == SEED004_BACKWARD_PLAIN
    monkeypatch.setattr(terminal, "TABLE_MAX_ROWS", 6)
    result = runner.invoke(app, ["backward", SEED004], env=TERMINAL)
    assert result.stdout == SEED004_BACKWARD_PLAIN


# -- piped: the plain text, byte for byte -----------------------------------------------------------
graphsvc = python_m_graphsvc  # python -m graphsvc --disable-plugins ARGS, its output piped


def test_piped_output_is_the_plain_text() -> None:
    assert graphsvc("backward", SEED004).stdout == SEED004_BACKWARD_PLAIN
    assert graphsvc("order", SEED000, "--algorithm", "kahn").stdout == (
        "5\ty\tlog\t4\n4\tt3\tadd\t3,2\n2\tt2\texp\t1\n1\tt1\tsin\t0\n0\tz\tleaf\t-\n3\t1\tconst\t-\n"
    )
    assert graphsvc("forward", SEED004).stdout.splitlines()[0] == "6\tL\tmul\t4,5\t35.0"
    assert graphsvc("inspect", SEED004).stdout.splitlines()[:3] == [
        f"file: {SEED004} (685 bytes)",
        "format version: 1.0",
        "nodes: 7",
    ]
    assert "add\t2\t1\tgraphsvc 0.1.0\tvectorized" in graphsvc("ops").stdout.splitlines()


# -- the progress bar --------------------------------------------------------------------------------
def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "graphsvc", "--disable-plugins", *args]


def test_progress_appears_on_the_terminal_and_never_on_stdout() -> None:
    code, stdout, tty = with_terminal_stderr(*cli("backward", SEED004), env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (code, stdout) == (0, SEED004_BACKWARD_PLAIN)
    assert f"loading {SEED004}" in tty
    assert "replaying forward and backward" in tty


def test_no_progress_with_quiet() -> None:
    code, stdout, tty = with_terminal_stderr(*cli("--quiet", "backward", SEED004), env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (code, stdout, tty) == (0, SEED004_BACKWARD_PLAIN, "")


def test_no_progress_when_stderr_is_piped() -> None:
    result = graphsvc("backward", SEED004, env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (result.returncode, result.stdout, result.stderr) == (0, SEED004_BACKWARD_PLAIN, "")


@pytest.mark.parametrize(("seconds", "shown"), [(0.0, False), (0.8, True)])
def test_progress_waits_for_slow_work(seconds: float, shown: bool) -> None:
    script = (
        "import time; from graphsvc.console.terminal import progress\n"
        f"with progress('slow work'): time.sleep({seconds})"
    )
    code, stdout, tty = with_terminal_stderr(sys.executable, "-c", script, env={"GRAPHSVC_PROGRESS_DELAY": "0.3"})
    assert (code, stdout) == (0, "")
    assert ("slow work" in tty) is shown


# -- shell completion --------------------------------------------------------------------------------
def complete(shell: str, words: str) -> list[str]:
    env = {"_GRAPHSVC_COMPLETE": f"complete_{shell}"}
    if shell == "bash":
        env.update({"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))})
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
        env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    result = subprocess.run(
        [sys.executable, "-m", "graphsvc"], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout.split()


def test_bash_completes_node_names_from_the_file() -> None:
    assert complete("bash", f"graphsvc backward {SEED004} --output ") == ["a", "b", "c", "ab", "abc", "apb", "L"]
    assert complete("bash", f"graphsvc order {SEED004} --output a") == ["a", "ab", "abc", "apb"]
    assert complete("bash", f"graphsvc render {SEED004} -o x.svg --around ap") == ["apb"]
    assert complete("bash", f"graphsvc render --depth 1 {SEED004} --output L") == ["L"]


def test_set_completes_leaves_with_an_equals_sign() -> None:
    assert complete("bash", f"graphsvc forward --check {SEED004} --set ") == ["a=", "b=", "c="]


def test_fish_completes_op_names() -> None:
    ops = complete("fish", "graphsvc --disable-plugins gradcheck --op s")
    assert {"sin", "sub", "sqrt"} <= set(ops)
    assert all(op.startswith("s") for op in ops)


def test_zsh_completes_node_names() -> None:
    assert "apb" in " ".join(complete("zsh", f"graphsvc backward {SEED004} --output ap"))


def test_completion_is_silent_on_a_bad_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.msgpack"
    junk.write_bytes(b"not a graph")
    assert complete("bash", f"graphsvc backward {junk} --output ") == []
    assert complete("bash", "graphsvc backward nosuch.msgpack --output ") == []
    assert complete("bash", "graphsvc backward --output ") == []


# -- help -------------------------------------------------------------------------------------------
def test_every_command_has_an_example() -> None:
    group = get_command(app)
    names = sorted(group.commands)  # type: ignore[attr-defined]
    assert {"order", "inspect", "validate", "convert", "forward", "backward", "render", "ops", "gradcheck"} <= set(
        names
    )
    for name in [None, *names]:
        result = runner.invoke(app, [name, "-h"] if name else ["-h"])
        assert result.exit_code == 0
        examples = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("Example:")]
        assert len(examples) == 1, name
        assert examples[0].startswith("Example: graphsvc "), name
        if name:
            assert f" {name}" in examples[0], name


def test_set_completes_only_nodes_the_replay_lets_it_set(tmp_path: Path) -> None:
    """A node of an op that takes no inputs has no parents, yet is no leaf: the replay refuses to set
    it ("node noise is a noise node, not a leaf"), so completion does not offer it."""
    from graphsvc import format as fmt
    from graphsvc.graph import GraphBuilder

    b = GraphBuilder()
    x, seed = b.leaf(1.0, name="x"), b.add("noise", [], name="noise")
    b.add("add", [b.add("mul", [x, seed], name="y"), b.const(2.0, name="two")], name="z")
    path = tmp_path / "noise.msgpack"
    fmt.save(b.build(), path)
    assert complete("bash", f"graphsvc forward {path} --set ") == ["x=", "two="]
