"""Opening a file to read it only when it is a regular file, decided by what was opened.

Checking a path (``os.stat``, ``Path.is_file``) and then opening it is a race: the path can be
replaced by a FIFO between the two, and opening a FIFO waits for a writer, for ever. So
:func:`open_regular` opens first, without waiting (``O_NONBLOCK``: a FIFO's open returns at once),
asks the open descriptor what it is (``fstat``), and only then, for a regular file, clears
``O_NONBLOCK`` and hands it out. Anything else is closed again, unread.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

__all__ = ["NotRegularFile", "open_regular"]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file; ``kind`` says what (``"a FIFO"``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"is {kind}, not a regular file")
        self.kind = kind
        self.strerror = str(self)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading (unbuffered, binary), when what was opened is a regular file;
    :class:`NotRegularFile` when it is not, the ``OSError`` of ``open`` when it cannot be opened.
    Never blocks: a FIFO (even one swapped in for the file a moment before) is refused, not waited for."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(
                next((kind for test, kind in _KINDS if test(mode)), "neither a regular file nor a folder")
            )
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
