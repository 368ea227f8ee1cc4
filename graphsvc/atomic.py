"""Atomic file writes: a temporary file in the same folder, fsync, then ``os.replace``.

A reader sees the old file or the new one, never a part of one; after an error no temporary file
is left behind.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from graphsvc.errors import GraphFileError


@contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Yield a stream; when the block ends without error, its bytes replace ``path`` at once."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise GraphFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, _file_mode(path))  # mkstemp makes the file private (0600); give it a normal mode
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise GraphFileError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    _fsync_folder(folder)


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, or the mode ``open`` would give a new file."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
