"""graphsvc.files: a file is read only when what was opened is a regular file, decided by the open
descriptor, never by a look at the path before opening it (which a swap between the two defeats)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from graphsvc import files


def test_a_regular_file_is_opened_blocking_and_read(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"bytes")
    with files.open_regular(path) as file:
        assert os.get_blocking(file.fileno())
        assert file.read() == b"bytes"


@pytest.mark.parametrize(
    ("make", "kind"), [("fifo", "a FIFO"), ("folder", "a folder"), ("device", "a character device")]
)
def test_anything_else_is_refused_at_once_and_closed(tmp_path: Path, make: str, kind: str) -> None:
    path = tmp_path / make
    if make == "fifo":
        os.mkfifo(path)
    elif make == "folder":
        path.mkdir()
    else:
        path = Path(os.devnull)
    before = len(os.listdir("/proc/self/fd"))
    started = time.perf_counter()
    with pytest.raises(files.NotRegularFile) as refused:
        files.open_regular(path)
    assert time.perf_counter() - started < 2  # a FIFO with no writer: not waited for
    assert (str(refused.value), refused.value.kind) == (f"is {kind}, not a regular file", kind)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_fifo_swapped_in_after_a_look_at_the_path_is_still_refused(tmp_path: Path) -> None:
    """The race a check of the path then an open of it loses: the path is a regular file when
    looked at and a FIFO when opened. Only the opened descriptor counts, so it is refused at once."""
    path = tmp_path / "swapped"
    path.write_bytes(b"x")
    assert path.is_file()  # what a caller checking first would see
    path.unlink()
    os.mkfifo(path)
    done: list[BaseException] = []

    def attempt() -> None:
        try:
            files.open_regular(path)
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "opening the FIFO blocked"
    assert [type(exc) for exc in done] == [files.NotRegularFile]


def test_a_missing_file_is_the_error_of_open(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.open_regular(tmp_path / "nope")
