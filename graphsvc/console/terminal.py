"""What the CLI shows a person at a terminal: aligned tables on stdout, a progress bar on stderr.

Piped output stays the plain, stable text that ``cli.py`` prints itself; this module is used only
when stdout (for tables) or stderr (for progress) is a terminal. rich is imported inside the
functions that draw, so the CLI's start-up does not pay for it.

* ``GRAPHSVC_FORCE_TERMINAL=1`` draws tables even when stdout is not a terminal (tests, ``less -R``);
  ``GRAPHSVC_FORCE_TERMINAL=0`` prints plain text even on a terminal.
* The progress bar appears only for work that is still running after :data:`PROGRESS_DELAY` seconds
  (``GRAPHSVC_PROGRESS_DELAY`` changes it, for tests and demos), never on stdout, never when stderr
  is not a terminal, never with ``--quiet``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from graphsvc.text import one_line

FORCE_TERMINAL_ENV = "GRAPHSVC_FORCE_TERMINAL"
PROGRESS_DELAY_ENV = "GRAPHSVC_PROGRESS_DELAY"
#: Seconds of work before a progress bar appears.
PROGRESS_DELAY = 1.0
#: Longer listings print as plain text even on a terminal: rich measures every cell before drawing.
TABLE_MAX_ROWS = 5000

#: A column: its header and how its cells are justified ("left" or "right").
Column = tuple[str, str]


def _forced() -> bool | None:
    value = os.environ.get(FORCE_TERMINAL_ENV, "").strip()
    if not value:
        return None
    return value not in ("0", "false", "no")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def stdout_is_terminal() -> bool:
    """True when output goes to a person (a terminal, or ``GRAPHSVC_FORCE_TERMINAL=1``)."""
    forced = _forced()
    return _isatty(sys.stdout) if forced is None else forced


def wants_table(rows: int) -> bool:
    """Draw ``rows`` rows as a table? Only on a terminal, and only up to :data:`TABLE_MAX_ROWS`."""
    return rows <= TABLE_MAX_ROWS and stdout_is_terminal()


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], show_header: bool = True) -> None:
    """Print an aligned table to stdout.

    Cells are plain text: no rich markup (``[bold]``, ``[link=...]``) or emoji code is interpreted.
    Text from a file should come escaped (:func:`graphsvc.text.escape`, as
    :func:`graphsvc.console.listing.rows` gives it); any control character still in a cell is escaped here,
    so none reaches the terminal.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_header=show_header, show_edge=False, pad_edge=False)
    for header, justify in columns:
        table.add_column(header, justify="right" if justify == "right" else "left", no_wrap=justify == "right")
    for row in rows:
        table.add_row(*map(_printable, row))
    console = Console(file=sys.stdout, force_terminal=_forced() or None, markup=False, emoji=False, highlight=False)
    console.print(table)


def _printable(cell: str) -> str:
    """``cell`` with its control characters escaped (backslashes left alone: escaped text stays as
    it is), however long."""
    return one_line(cell, limit=sys.maxsize)


def _progress_delay() -> float:
    try:
        return max(0.0, float(os.environ.get(PROGRESS_DELAY_ENV, PROGRESS_DELAY)))
    except ValueError:
        return PROGRESS_DELAY


@contextmanager
def progress(description: str, quiet: bool = False) -> Iterator[None]:
    """Show an indeterminate progress bar on stderr while the block runs, if it runs long.

    Nothing is shown when ``quiet``, when stderr is not a terminal, or when the block ends within
    the delay. The bar is drawn by a timer thread and erased when the block ends.
    """
    if quiet or not _isatty(sys.stderr):
        yield
        return
    lock = threading.Lock()
    finished = False
    shown: list[Any] = []

    def show() -> None:
        with lock:
            if finished:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr, markup=False, highlight=False),
                transient=True,
                redirect_stdout=False,  # never let the bar capture, or write to, stdout
                redirect_stderr=False,
            )
            bar.add_task(one_line(description), total=None)  # a file path can hold anything
            bar.start()
            shown.append(bar)

    delay = _progress_delay()
    timer = threading.Timer(delay, show)
    timer.daemon = True
    if delay > 0:
        timer.start()
    else:
        show()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            finished = True
        for bar in shown:
            bar.stop()
