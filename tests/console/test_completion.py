"""graphsvc.console.completion: node names, NAME= for --set and op names, from a context as Click
gives one while completing; nothing on a bad or missing file."""

from __future__ import annotations

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
    assert completion.op_names("ad") == ["add"]
