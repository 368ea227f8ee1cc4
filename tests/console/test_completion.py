"""graphsvc.console.completion: node names, NAME= for --set and op names, from a context as Click
gives one while completing; nothing on a bad or missing file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from graphsvc.console import completion
from tests.conftest import ROOT

SEED004 = str(ROOT / "examples" / "seed004.msgpack")


class Context:
    """What the callbacks read of Click's context: the parsed parameters, the command's name and options."""

    def __init__(self, file: str | None, words: str = "") -> None:
        self.params: dict[str, Any] = {} if file is None else {"file": file}
        self.info_name = "backward"
        self.command = type("Command", (), {"params": []})()


def test_node_names_and_assignments_from_the_file() -> None:
    ctx: Any = Context(SEED004)
    assert completion.node_names(ctx, "a") == ["a", "ab", "abc", "apb"]
    assert completion.node_names(ctx, "") == ["a", "b", "c", "ab", "abc", "apb", "L"]  # by id
    assert completion.assignments(ctx, "") == ["a=", "b=", "c="]  # leaves only
    assert completion.assignments(ctx, "a=") == []


def test_a_file_with_an_unknown_key_completes_without_a_warning(tmp_path: Path) -> None:
    """A warning would be printed into the shell's command line."""
    import warnings

    path = tmp_path / "g.json"
    path.write_text(
        '{"format": "graphsvc-json", "version": [1, 0], "nodes": [{"name": "x", "op": "leaf", "vaule": 1}]}'
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert completion.node_names(Context(str(path)), "") == ["x"]  # type: ignore[arg-type]
    assert caught == []


def test_nothing_from_a_bad_or_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"not a graph")
    assert completion.node_names(Context(str(bad)), "") == []  # type: ignore[arg-type]
    monkeypatch.delenv("_TYPER_COMPLETE_ARGS", raising=False)
    monkeypatch.delenv("COMP_WORDS", raising=False)
    assert completion.node_names(Context(None), "") == []  # type: ignore[arg-type]


def test_the_file_is_found_among_the_words_when_the_parse_stopped_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("_TYPER_COMPLETE_ARGS", raising=False)
    monkeypatch.setenv("COMP_WORDS", f"graphsvc backward {SEED004} --output ")
    assert completion.completion_file(Context(None)) == SEED004  # type: ignore[arg-type]
    assert completion.node_names(Context(None), "L") == ["L"]  # type: ignore[arg-type]


def test_op_names_take_inputs(no_installed_plugins: None) -> None:
    names = completion.op_names("")
    assert "add" in names and "relu" in names and "leaf" not in names
    assert completion.op_names("ad") == ["add", "addmm"]


# -- candidates from a file, quoted for the shell that completes ----------------------------------
#: Names a file can hold that a shell would run, split or misread if inserted as they are.
HOSTILE = ("w$(touch X)", "b`id`", "c'q", "a b", "x\ny", 'L:"z"', "tab\there", "\x1b]0;t\x07", "e\\$(id)", "p:::q")


def test_each_shell_gets_candidates_it_inserts_safely() -> None:
    """bash and PowerShell insert a candidate as it is: quoted; zsh and fish quote it themselves:
    as it is, but for what Typer's zsh script would misread; control characters: never offered."""
    assert completion.for_shell(HOSTILE, "bash") == [
        "'w$(touch X)'",
        "'b`id`'",
        "'c'\\''q'",
        "'a b'",
        "'L:\"z\"'",
        "'e\\$(id)'",
        "p:::q",
    ]
    assert completion.for_shell(HOSTILE, "zsh") == ["w$(touch X)", "b`id`", "a b", "p:::q"]
    assert completion.for_shell(HOSTILE, "fish") == ["w$(touch X)", "b`id`", "c'q", "a b", 'L:"z"', "e\\$(id)", "p:::q"]
    powershell = ["'w$(touch X)'", "'b`id`'", "'c''q'", "'a b'", "'L:\"z\"'", "'e\\$(id)'"]
    assert completion.for_shell(HOSTILE, "powershell") == powershell
    assert completion.for_shell(HOSTILE, "pwsh") == powershell
    assert completion.for_shell(["o\u2019k", "plain_1.x=", "-lead"], "powershell") == [
        "'o\u2019\u2019k'",
        "plain_1.x=",
        "-lead",
    ]
    assert completion.for_shell((*HOSTILE, "plain_1.x="), "tcsh") == ["p:::q", "plain_1.x="]  # not known: plain only
    assert completion.for_shell(HOSTILE, None) == [*HOSTILE[:4], HOSTILE[5], *HOSTILE[8:]]  # no control characters


def test_after_a_typed_prefix_bash_quotes_the_rest_and_powershell_offers_only_plain_names() -> None:
    """Typer keeps only candidates that start with what was typed: bash gets the typed part as it
    is and the rest quoted (when the typed part is plain itself), PowerShell only plain names."""
    names = ["w$(touch X)=", "w_plain=", "w'q"]
    assert completion.for_shell(names, "bash", "w") == ["w'$(touch X)='", "w_plain=", "w''\\''q'"]
    assert completion.for_shell(["a b", "a$b"], "bash", "a b") == []  # typed as 'a b: cannot be kept unquoted
    assert completion.for_shell(names, "powershell", "w") == ["w_plain="]
    assert completion.for_shell(names, "zsh", "w") == ["w$(touch X)=", "w_plain="]
    assert completion.for_shell(names, "fish", "w") == names


@pytest.mark.parametrize(
    ("value", "shell"),
    [("complete_bash", "bash"), ("bash_complete", "bash"), ("complete_pwsh", "pwsh"), ("complete_tcsh", "")],
)
def test_the_completing_shell_is_read_from_the_completion_variable(
    value: str, shell: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_GRAPHSVC_COMPLETE", value)
    assert completion.completing_shell() == shell
    monkeypatch.delenv("_GRAPHSVC_COMPLETE")
    monkeypatch.setenv("_CLI_PY_COMPLETE", value)  # python cli.py
    assert completion.completing_shell() == shell
    monkeypatch.delenv("_CLI_PY_COMPLETE")
    assert completion.completing_shell() is None


@pytest.fixture
def hostile_names_file(tmp_path: Path) -> Path:
    from graphsvc import format as fmt
    from tests.conftest import seed004_graph

    names = (f"w$(touch {tmp_path}/X)", "b`id`", "c'q", "ab", "a b", "x\ny", 'L:"z"')
    path = tmp_path / "hostile.msgpack"
    fmt.save(seed004_graph(names=names), path)
    return path


def complete(shell: str, words: str) -> str:
    """What ``graphsvc`` prints to the shell's completion script asking to complete ``words``, run
    as the scripts Typer writes run it (bash: COMP_WORDS and COMP_CWORD; the others: _TYPER_COMPLETE_ARGS)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_COMPLETE") and k != "COMP_WORDS"}
    env.update(_GRAPHSVC_COMPLETE=f"complete_{shell}", GRAPHSVC_DISABLE_PLUGINS="1")
    if shell == "bash":
        env.update(COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - (not words.endswith(" "))))
    else:
        env.update(_TYPER_COMPLETE_ARGS=words, _TYPER_COMPLETE_FISH_ACTION="get-args")
    done = subprocess.run(
        [sys.executable, "-m", "graphsvc"], cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stderr == ""
    return done.stdout


def test_the_completion_protocol_quotes_names_from_the_file_for_each_shell(hostile_names_file: Path) -> None:
    file, x = str(hostile_names_file), f"{hostile_names_file.parent}/X"
    assert complete("bash", f"graphsvc backward {file} --set ") == f"'w$(touch {x})='\n'b`id`='\n'c'\\''q='\n"
    assert complete("bash", f"graphsvc backward {file} --output a") == "ab\na' b'\n"
    assert complete("bash", f"graphsvc backward {file} --set w") == f"w'$(touch {x})='\n"
    assert complete("bash", f"graphsvc backward {file} --set 'w") == f"w'$(touch {x})='\n"
    assert complete("zsh", f"graphsvc backward {file} --output ") == (
        f'_arguments \'*: :(("w\\$(touch {x})"\n"b\\`id\\`"\n"ab"\n"a b"))\'\n'
    )
    assert complete("fish", f"graphsvc backward {file} --output ") == f'w$(touch {x})\nb`id`\nc\'q\nab\na b\nL:"z"\n'
    assert complete("powershell", f"graphsvc backward {file} --output ") == (
        f"'w$(touch {x})'::: \n'b`id`'::: \n'c''q'::: \nab::: \n'a b'::: \n'L:\"z\"'::: \n"
    )
    assert not (hostile_names_file.parent / "X").exists()


def test_bash_inserts_each_candidate_as_a_word_that_runs_nothing(hostile_names_file: Path) -> None:
    """Typer's own bash script, run by bash: each word it puts in COMPREPLY, read back by bash as
    a command line would be, is the name itself, and nothing ran."""
    import shutil
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_COMPLETE")}
    env.update(GRAPHSVC_DISABLE_PLUGINS="1", PYTHON=sys.executable)
    script = subprocess.run(
        [sys.executable, "-m", "graphsvc"],
        cwd=ROOT,
        env={**env, "_GRAPHSVC_COMPLETE": "source_bash"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    run = (
        'graphsvc() { "$PYTHON" -m graphsvc "$@"; }\n'
        f"{script}\n"
        f'COMP_WORDS=(graphsvc backward {hostile_names_file} --set ""); COMP_CWORD=4\n'
        "_graphsvc_completion graphsvc\n"
        'for word in "${COMPREPLY[@]}"; do eval "printf \'[%s]\\n\' $word"; done\n'
    )
    done = subprocess.run(["bash", "--norc", "-c", run], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    x = f"{hostile_names_file.parent}/X"
    assert (done.returncode, done.stdout, done.stderr) == (0, f"[w$(touch {x})=]\n[b`id`=]\n[c'q=]\n", "")
    assert not (hostile_names_file.parent / "X").exists()


def test_a_fifo_as_the_file_is_refused_at_once_without_being_opened_for_long(tmp_path: Path) -> None:
    import time

    fifo = tmp_path / "graph.msgpack"
    os.mkfifo(fifo)
    started = time.perf_counter()
    assert completion.node_names(Context(str(fifo)), "") == []  # type: ignore[arg-type]
    assert time.perf_counter() - started < 2  # a FIFO with no writer: refused, not waited for (5 s)


def test_a_file_larger_than_the_completion_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.msgpack"
    big.write_bytes((ROOT / "examples" / "seed004.msgpack").read_bytes())
    os.truncate(big, completion.COMPLETION_MAX_BYTES + 1)
    reads: list[int] = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: reads.append(n) or real(fd, n, at))
    assert completion.node_names(Context(str(big)), "") == []  # type: ignore[arg-type]
    assert reads == []
