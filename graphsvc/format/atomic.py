"""Atomic file writes: new bytes go to a temporary file in the target's folder, are synced to disk,
then take the target's name in one ``os.replace``.

What a save through :func:`atomic_writer` promises:

- A reader sees the old file or the new one, never a part of one.
- The file written is the one the path names after following symbolic links, as ``cp`` and a shell
  redirection do; the links stay links. A dangling link writes the path it points to; links that
  loop are an error.
- A link is followed only where the kernel's ``fs.protected_symlinks`` would follow it: a link in a
  sticky world-writable folder (``/tmp``) owned by someone other than the user saving and the
  folder's owner is refused (another user's link there could aim a save, root's too, at any file).
- Only a regular file is ever replaced: a device, FIFO, socket or directory is refused before
  anything is created.
- The replaced file's permission bits are kept, but never its setuid, setgid or sticky bit (as
  ``install`` and editors drop them: 4755 becomes 0755); a new file gets ``0o666 & ~umask``.
- The replaced file's owner and group are kept: root saving over another user's file gives the
  new file that user and group (``fchown`` before the rename), so its owner can still read it. A
  user who cannot give the new file the old one's owner (only root can give a file away) is
  refused; one who owns it but cannot keep its group gets their own group, as editors do.
- The file and its folder are fsynced.
- After an error the target is untouched and no temporary file remains.
- The temporary name is short (``.graphsvc-XXXXXXXX.tmp``), so a target name of NAME_MAX (255)
  bytes can be written.

A process killed with SIGKILL cannot clean up, so where the data sits while it is written matters.
On Linux it goes to an anonymous file (``O_TMPFILE``) that the kernel discards if the process dies.
The file gets a name only after every byte is written and synced, and keeps it only until the
``os.replace`` that follows: the link and the rename, about a hundred microseconds (the old file is
held open across the rename, so freeing its blocks happens after it, not inside the window). A kill
inside that window leaves a complete temporary file beside the target, the one way one can stay.
Its name is the same for every save of that target (``XXXXXXXX`` is a hash of the target's name),
and each save holds a lock on its file from before the link until after the rename, so the next
save of the target finds a leftover nobody holds, removes it, and there is never more than one.

Where ``O_TMPFILE`` is missing (another system, a filesystem that refuses it, ``/proc`` not
mounted), the temporary file is named (``tempfile.mkstemp``, 8 random characters) from the start:
a kill at any moment of the write may leave it, and nothing removes it later.

Not guarded against: another process turning the target into something else (a directory, a link)
between the check and the replace.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import secrets
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from graphsvc.errors import OutputError
from graphsvc.text import escape

#: Where Linux shows a process's open files; linking from here gives an anonymous file a name.
PROC_FD = "/proc/self/fd"
#: The temporary file's name around 8 hex digits (a hash of the target's name, or random): short, so a
#: target name of 255 bytes still fits.
TMP_PREFIX, TMP_SUFFIX = ".graphsvc-", ".tmp"
#: Seconds a save waits for another save of the same file to finish its replace.
SAVE_WAIT = 10.0
#: Symbolic links followed in a row before giving up (Linux's own limit).
MAX_LINKS = 40
#: errno values with which a filesystem (or an older kernel) refuses O_TMPFILE.
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)
#: errno values with which fallocate(2) says it cannot reserve space on this file: it is then written
#: without (mode 0 refuses where the filesystem lacks it; glibc's posix_fallocate would write zeros).
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


@contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Yield a stream; when the block ends without error, its bytes replace ``path`` at once.

    ``path`` may be a symbolic link (the file it points to is written) but must not name a device,
    FIFO, socket or directory. Raises :class:`OutputError` (one line) when the file cannot be
    written; an exception from the block passes through. Either way the target is untouched.
    """
    path = Path(path)
    target = writable_target(path)
    folder = target.parent
    old_info = _old_info(path, target)
    tmp_name: str | None = None
    try:
        fd = _anonymous_file(folder)
        if fd is None:
            fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=TMP_SUFFIX, dir=folder)
        try:
            _keep_owner(fd, old_info, path)  # before the mode: a change of owner clears setuid and setgid
            os.fchmod(fd, _file_mode(old_info))  # mkstemp makes the file private (0600); give it a normal mode
            stream = os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
        except BaseException:
            os.close(fd)
            raise
        with stream:  # open until the replace is done: it holds the lock _name_anonymous takes
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
            old = _old_file(target)
            try:
                if tmp_name is None:
                    tmp_name = _name_anonymous(stream.fileno(), target)
                os.replace(tmp_name, target)
            finally:
                if old is not None:
                    os.close(old)
    except BaseException as exc:
        if tmp_name is not None:
            with suppress(OSError):
                os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {escape(str(path))}: {exc.strerror or exc}") from None
        raise
    _fsync_folder(folder)


def _old_info(path: Path, target: Path) -> os.stat_result | None:
    """The file about to be replaced, as ``stat`` sees it; None when there is none yet."""
    try:
        return os.stat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"cannot write {escape(str(path))}: {exc.strerror or exc}") from None


def _keep_owner(fd: int, old: os.stat_result | None, path: Path) -> None:
    """Give the new file ``fd`` the owner and group of the file it replaces (``old``).

    Root can (and so keeps another user's file theirs); anyone can keep a group they are in.
    A user who cannot keep the owner is refused (:class:`OutputError`): the new file would be
    theirs, not its owner's. Their own file whose group they cannot keep gets their group."""
    if old is None:
        return
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) == (old.st_uid, old.st_gid):
        return
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
        return
    except PermissionError:
        pass
    if old.st_uid != new.st_uid:
        raise OutputError(
            f"cannot write {escape(str(path))}: it belongs to uid {old.st_uid}, and the file replacing it "
            f"would belong to uid {new.st_uid} (only root can give a file away); save it elsewhere"
        )
    with suppress(PermissionError):
        os.fchown(fd, -1, old.st_gid)


def reserve(stream: IO[Any], size: int) -> None:
    """Reserve ``size`` bytes for the file ``stream`` writes (from its start), before writing them.

    Linux's ``fallocate(2)`` in mode 0: the blocks are allocated now, so a filesystem that delays
    allocation (ext4) has none left to do when the file is renamed over the target, and a full disk
    is found before a byte is written. Where the filesystem or the system cannot (``EOPNOTSUPP``,
    ``ENOSYS``, ``EINVAL``, not Linux) nothing happens; another error (``ENOSPC``) raises
    :class:`OSError`, which :func:`atomic_writer` turns into its one-line :class:`OutputError`.
    The file's size becomes ``size``: write exactly that many bytes.
    """
    if size > 0:
        error = _fallocate(stream.fileno(), size)
        if error and error not in _NO_FALLOCATE:
            raise OSError(error, os.strerror(error))


def _fallocate(fd: int, size: int) -> int:
    """``fallocate(fd, 0, 0, size)``: 0, or the errno it failed with (``ENOSYS`` without one)."""
    call = _libc_fallocate()
    return errno.ENOSYS if call is None else call(fd, size)


@functools.cache
def _libc_fallocate() -> Callable[[int, int], int] | None:
    """The C library's ``fallocate`` through ctypes (loaded on the first save), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int

    def call(fd: int, size: int) -> int:
        return 0 if function(fd, 0, 0, size) == 0 else ctypes.get_errno()

    return call


def writable_target(path: Path) -> Path:
    """The file a save to ``path`` writes: ``path`` with its symbolic links followed.

    Raises :class:`OutputError` when that is not a regular file (a device, FIFO, socket or
    directory), the links loop, or a link is one the kernel's ``fs.protected_symlinks`` would not
    follow (:func:`_check_link`); a missing file is fine (a save creates it).
    """
    target = path
    seen: set[tuple[int, int]] = set()
    for _ in range(MAX_LINKS + 1):
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            return target
        except OSError as exc:
            raise OutputError(f"cannot write {escape(str(path))}: {exc.strerror or exc}") from None
        if not stat.S_ISLNK(info.st_mode):
            kind = next((name for is_kind, name in _KINDS if is_kind(info.st_mode)), None)
            if kind is None:
                return target
            where = "" if target == path else f"it links to {escape(str(target))}, "
            raise OutputError(f"cannot write {escape(str(path))}: not a regular file ({where}{kind})")
        if (info.st_dev, info.st_ino) in seen:
            raise OutputError(f"cannot write {escape(str(path))}: its symbolic links form a loop")
        seen.add((info.st_dev, info.st_ino))
        _check_link(path, target, info)
        target = target.parent / os.readlink(target)  # an absolute link replaces the folder
    raise OutputError(f"cannot write {escape(str(path))}: more than {MAX_LINKS} symbolic links in a row")


def _check_link(path: Path, link: Path, info: os.stat_result) -> None:
    """Refuse to follow ``link`` (``info``: its ``lstat``) where Linux's ``fs.protected_symlinks``
    would: in a sticky world-writable folder, a link owned neither by the user saving nor by the
    folder's owner. Following links in user space skips the kernel's guard, so it is made here,
    on every system, whatever the sysctl says."""
    try:
        folder = os.stat(link.parent)
    except OSError:
        return  # the readlink that follows says what is wrong
    sticky_world_writable = folder.st_mode & (stat.S_ISVTX | stat.S_IWOTH) == stat.S_ISVTX | stat.S_IWOTH
    if not sticky_world_writable or info.st_uid in (os.geteuid(), folder.st_uid):
        return
    where = "" if link == path else f" ({escape(str(link))})"
    raise OutputError(
        f"cannot write {escape(str(path))}: a symbolic link{where} owned by uid {info.st_uid} in a sticky "
        f"world-writable folder, neither yours nor the folder owner's: not followed, as the kernel's "
        f"protected_symlinks would not; remove it or write elsewhere"
    )


def temporary_name(target: Path) -> str:
    """The name a save of ``target`` gives its temporary file, in the target's folder, on Linux: the
    same for every save of it, so the next save finds one a killed save left behind."""
    return f"{TMP_PREFIX}{hashlib.blake2s(os.fsencode(target.name), digest_size=4).hexdigest()}{TMP_SUFFIX}"


def _anonymous_file(folder: Path) -> int | None:
    """A file without a name in ``folder``, open for writing; None where the system cannot make one."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir(PROC_FD):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in _NO_TMPFILE:
            return None
        raise


def _name_anonymous(fd: int, target: Path) -> str:
    """Give the anonymous file ``fd`` the temporary name of ``target`` in its folder; return it.

    The name (:func:`temporary_name`) is the same for every save of ``target``, so a temporary file
    left by a save killed between link and replace is found, and removed, by the next save. Each save
    locks its file (``flock``) before linking it and keeps the lock until the replace is done: a
    named temporary file nobody holds a lock on belongs to a dead process. One that is locked is
    waited for (a live save holds the name for microseconds).
    """
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)  # the file has no name yet: nobody else can hold this lock
    name = temporary_name(target)
    # A folder descriptor makes os.link call linkat(2) with AT_SYMLINK_FOLLOW, which links the file the
    # /proc entry stands for; without one, Python before 3.13 calls link(2), which fails with EXDEV.
    folder_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + SAVE_WAIT
        shared = True  # the target's own name; False: a random one, never removed when taken
        while True:
            try:
                os.link(f"{PROC_FD}/{fd}", name, dst_dir_fd=folder_fd, follow_symlinks=True)
            except FileExistsError:
                pass
            else:
                return os.path.join(target.parent, name)
            free = _remove_if_stale(folder_fd, name) if shared else None
            if free is None:  # a leftover that cannot be opened to tell, or a random name taken
                shared, name = False, f"{TMP_PREFIX}{secrets.token_hex(4)}{TMP_SUFFIX}"
            elif not free:
                if time.monotonic() > deadline:
                    raise TimeoutError(errno.ETIMEDOUT, f"another save of it has not finished in {SAVE_WAIT:g} s")
                time.sleep(0.001)
    finally:
        os.close(folder_fd)


def _remove_if_stale(folder_fd: int, name: str) -> bool | None:
    """Remove the temporary file ``name`` if no live save holds it. True: the name is free now;
    False: a live save holds it; None: it cannot be opened to tell."""
    import fcntl

    try:
        other = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return None
    try:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        held = os.fstat(other)
        try:
            now = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):  # still the file we hold the lock on
            try:
                os.unlink(name, dir_fd=folder_fd)
            except OSError:  # another user's leftover in a sticky folder such as /tmp: not ours to remove
                return None
        return True
    finally:
        os.close(other)


def _old_file(target: Path) -> int | None:
    """A descriptor holding the file about to be replaced, or None. While it is open, the replace
    does not free the old file's blocks (milliseconds for a large file on ext4): that happens when
    it is closed, after the replace, outside the window in which a temporary name exists."""
    flag = getattr(os, "O_PATH", None)
    if flag is None:
        return None
    try:
        return os.open(target, flag | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None


#: The permission bits a save keeps from the file it replaces: not setuid, setgid or sticky.
_KEPT_MODE = 0o777


def _file_mode(old: os.stat_result | None) -> int:
    """The permission bits of the file being replaced (without setuid, setgid and sticky), or the
    mode ``open`` would give a new file."""
    if old is not None:
        return stat.S_IMODE(old.st_mode) & _KEPT_MODE
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
