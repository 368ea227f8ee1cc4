"""graphsvc.console.terminal: when output counts as a terminal (GRAPHSVC_FORCE_TERMINAL), the tables
it draws (plain cells, control characters escaped) and the progress bar on stderr (only on a
terminal, only after GRAPHSVC_PROGRESS_DELAY seconds, its description escaped)."""

from __future__ import annotations

import io
import sys

import pytest

from graphsvc.console import terminal
from tests.conftest import with_terminal_stderr

MARKUP = "[bold red]x[/] [link=https://example.com]y[/link] :smile:"


class _Closed(io.StringIO):
    def isatty(self) -> bool:
        raise ValueError("I/O operation on closed file")


@pytest.mark.parametrize(
    ("value", "forced"),
    [(None, None), ("", None), ("  ", None), ("1", True), ("yes", True), ("0", False), (" 0 ", False),
     ("false", False), ("no", False)],
)  # fmt: skip
def test_force_terminal_reads_the_environment(
    value: str | None, forced: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv("GRAPHSVC_FORCE_TERMINAL", raising=False)
    else:
        monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", value)
    assert terminal._forced() is forced


def test_stdout_is_a_terminal_when_forced_or_when_it_is_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHSVC_FORCE_TERMINAL", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert terminal.stdout_is_terminal() is False
    monkeypatch.setattr(sys, "stdout", _Closed())
    assert terminal.stdout_is_terminal() is False  # a closed stream is no terminal, and no crash
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "1")
    assert terminal.stdout_is_terminal() is True
    assert terminal._isatty(object()) is False


def test_a_table_only_up_to_5000_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "1")
    assert terminal.TABLE_MAX_ROWS == 5000
    assert (terminal.wants_table(0), terminal.wants_table(5000), terminal.wants_table(5001)) == (True, True, False)
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "0")
    assert terminal.wants_table(1) is False


def test_print_table_aligns_left_and_right_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "0")
    terminal.print_table([("name", "left"), ("n", "right")], [["a", "1"], ["bbbb", "100"]])
    assert out.getvalue().splitlines() == ["name     n", "─" * 10, "a        1", "bbbb   100"]


def test_print_table_escapes_control_characters_left_in_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("GRAPHSVC_FORCE_TERMINAL", "0")
    terminal.print_table([("name", "left"), ("n", "right")], [["a\x1b]0;t\x07 \\ " + MARKUP, "1"]], show_header=False)
    assert out.getvalue().rstrip() == "a\\x1b]0;t\\x07 \\ " + MARKUP + "   1"


def test_a_cell_is_never_cut() -> None:
    assert terminal._printable("x" * 10_000 + "\n") == "x" * 10_000 + "\\n"


@pytest.mark.parametrize(("value", "delay"), [(None, 1.0), ("0.25", 0.25), ("0", 0.0), ("-3", 0.0), ("soon", 1.0)])
def test_the_progress_delay(value: str | None, delay: float, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("GRAPHSVC_PROGRESS_DELAY", raising=False)
    else:
        monkeypatch.setenv("GRAPHSVC_PROGRESS_DELAY", value)
    assert terminal._progress_delay() == delay


def test_no_progress_when_stderr_is_not_a_terminal_or_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHSVC_PROGRESS_DELAY", "0")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    ran = []
    with terminal.progress("loading"):
        ran.append(1)
    with terminal.progress("loading", quiet=True):
        ran.append(2)
    assert (ran, err.getvalue()) == ([1, 2], "")


def test_progress_shows_nothing_when_quiet_even_on_a_terminal() -> None:
    script = "from graphsvc.console.terminal import progress\nwith progress('loading', quiet=True): pass\nprint('done')"
    code, stdout, tty = with_terminal_stderr(sys.executable, "-c", script, env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (code, stdout, tty) == (0, "done\n", "")


def test_progress_description_is_escaped() -> None:
    script = "from graphsvc.console.terminal import progress\nwith progress('loading /tmp/\\x1b]0;pwned\\x07x'): pass"
    code, stdout, tty = with_terminal_stderr(sys.executable, "-c", script, env={"GRAPHSVC_PROGRESS_DELAY": "0"})
    assert (code, stdout) == (0, "")
    assert "loading /tmp/\\x1b]0;pwned\\x07x" in tty
    assert "\x1b]0;" not in tty
