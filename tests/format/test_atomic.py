"""Atomic saves: what they write (the file a symbolic link points to, never a device, FIFO, socket or
directory; a name of 255 bytes) and how they survive faults: an exception at every point of a save,
a child process killed with SIGKILL in the middle of saves, two processes saving and loading the
same files at once. A reader always sees the old file or the new one, never a part; an error leaves
no temporary file behind, and a kill leaves one only in the microseconds between link and replace.
Most tests run every way a save can go: an anonymous file (O_TMPFILE) or the named fallback."""

from __future__ import annotations

import errno
import mmap
import os
import random
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest

from graphsvc import format as fmt
from graphsvc.errors import GraphFileError
from graphsvc.format import atomic, codec
from graphsvc.format.atomic import atomic_writer
from graphsvc.graph import Graph, GraphBuilder
from tests.conftest import EXAMPLES

posix_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork and SIGKILL")


def chain(n: int, value: float) -> Graph:
    """A chain of ``n`` nodes: leaf, then alternating sin and neg; every value is ``value``."""
    b = GraphBuilder()
    b.leaf(value, name="x")
    for i in range(1, n):
        b.add("sin" if i % 2 else "neg", [i - 1], value=value)
    return b.build(metadata={"value": value})


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- the ways a save can go --------------------------------------------------------------------------
def _o_tmpfile_works(folder: Path) -> bool:
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir(atomic.PROC_FD):
        return False
    try:
        os.close(os.open(folder, flag | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


def _must_not_be_called(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("this save went the wrong way")


@pytest.fixture
def anonymous_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves write anonymous files (O_TMPFILE), never a named temporary file from the start."""
    if not _o_tmpfile_works(tmp_path):
        pytest.skip("no O_TMPFILE here (not Linux, or the filesystem refuses it)")
    monkeypatch.setattr(atomic, "tempfile", SimpleNamespace(mkstemp=_must_not_be_called))


WAYS = ["O_TMPFILE", "no O_TMPFILE", "O_TMPFILE refused", "no /proc"]


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way a save can go: an anonymous file, or the fallback, a named temporary file, where the
    system has no O_TMPFILE, the filesystem refuses it, or /proc is not mounted."""
    way: str = request.param
    if way == "O_TMPFILE":
        request.getfixturevalue("anonymous_files")
        return way
    monkeypatch.setattr(atomic, "_name_anonymous", _must_not_be_called)
    if way == "no O_TMPFILE":
        monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    elif way == "O_TMPFILE refused":
        real_open = os.open
        flag = getattr(os, "O_TMPFILE", 0)

        def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flag and flags & flag == flag:
                raise OSError(errno.EOPNOTSUPP, "Operation not supported")
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
    else:
        monkeypatch.setattr(atomic, "PROC_FD", str(tmp_path / "no-proc"))
    return way


def test_while_a_save_writes_no_temporary_file_is_seen_where_o_tmpfile_works(tmp_path: Path, way: str) -> None:
    path = tmp_path / "g.msgpack"
    with atomic_writer(path) as stream:
        stream.write(b"new")
        during = _files(tmp_path)
    if way == "O_TMPFILE":
        assert during == []
    else:
        assert len(during) == 1 and re.fullmatch(r"\.graphsvc-\w{8}\.tmp", during[0]), during
    assert _files(tmp_path) == ["g.msgpack"]
    assert path.read_bytes() == b"new"


def test_a_text_save_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path, way: str) -> None:
    path = tmp_path / "notes.json"
    path.write_text("old")
    path.chmod(0o640)
    with atomic_writer(path, "w") as stream:
        stream.write("new é")
    assert path.read_bytes() == "new é".encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


# -- symbolic links -------------------------------------------------------------------------------
def test_a_save_onto_a_symbolic_link_writes_the_file_it_points_to_and_keeps_the_link(tmp_path: Path, way: str) -> None:
    data, links = tmp_path / "data", tmp_path / "links"
    data.mkdir()
    links.mkdir()
    real = data / "real.msgpack"
    fmt.save(chain(5, 1.0), real)
    real.chmod(0o640)
    (links / "relative").symlink_to("../data/real.msgpack")
    (links / "absolute").symlink_to(real)
    (links / "chain").symlink_to("relative")  # chain -> relative -> ../data/real.msgpack
    (tmp_path / "outer").symlink_to("links/chain")  # a chain through two folders
    pointing = {name: os.readlink(tmp_path / name) for name in ("links/relative", "links/absolute", "links/chain")}
    pointing["outer"] = "links/chain"
    for i, name in enumerate(["links/relative", "links/absolute", "links/chain", "outer"]):
        graph = chain(6 + i, float(i))
        fmt.save(graph, tmp_path / name)
        assert real.read_bytes() == fmt.dumps(graph), name
    assert {name: os.readlink(tmp_path / name) for name in pointing} == pointing
    assert pointing["links/absolute"] == str(real)
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert (_files(tmp_path), _files(data), _files(links)) == (
        ["data", "links", "outer"],
        ["real.msgpack"],
        ["absolute", "chain", "relative"],
    )


def test_a_dangling_link_writes_the_path_it_points_to(tmp_path: Path, way: str) -> None:
    link = tmp_path / "link.msgpack"
    link.symlink_to("new.msgpack")
    fmt.save(chain(5, 1.0), link)
    assert os.readlink(link) == "new.msgpack"
    assert (tmp_path / "new.msgpack").read_bytes() == fmt.dumps(chain(5, 1.0))
    assert _files(tmp_path) == ["link.msgpack", "new.msgpack"]

    nowhere = tmp_path / "nowhere.msgpack"
    nowhere.symlink_to("missing/new.msgpack")
    with pytest.raises(GraphFileError) as caught:
        fmt.save(chain(5, 1.0), nowhere)
    assert str(caught.value) == f"cannot write {nowhere}: No such file or directory"
    assert _files(tmp_path) == ["link.msgpack", "new.msgpack", "nowhere.msgpack"]


def test_links_that_loop_or_run_too_long_are_refused(tmp_path: Path, way: str) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "self").symlink_to("self")
    for name in ("a", "self"):
        with pytest.raises(GraphFileError) as caught:
            fmt.save(chain(3, 1.0), tmp_path / name)
        assert str(caught.value) == f"cannot write {tmp_path / name}: its symbolic links form a loop"
    # 40 links in a row are followed, as Linux does; 41 are not
    (tmp_path / "l40").symlink_to("file")
    for i in range(40, 0, -1):
        (tmp_path / f"l{i - 1}").symlink_to(f"l{i}")
    fmt.save(chain(3, 1.0), tmp_path / "l1")
    assert (tmp_path / "file").read_bytes() == fmt.dumps(chain(3, 1.0))
    with pytest.raises(GraphFileError) as caught:
        fmt.save(chain(4, 1.0), tmp_path / "l0")
    assert str(caught.value) == f"cannot write {tmp_path / 'l0'}: more than 40 symbolic links in a row"
    assert (tmp_path / "file").read_bytes() == fmt.dumps(chain(3, 1.0))
    assert len(_files(tmp_path)) == 3 + 41 + 1


# -- only regular files ---------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "described"), [("fifo", "a FIFO"), ("socket", "a socket"), ("folder", "a directory")])
def test_a_fifo_socket_or_directory_is_refused_and_left_as_it_was(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch, kind: str, described: str
) -> None:
    monkeypatch.chdir(tmp_path)  # a socket's path must be short
    target = tmp_path / "target"
    listener = None
    if kind == "fifo":
        os.mkfifo("target")
    elif kind == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind("target")
    else:
        target.mkdir()
        (target / "inside").write_bytes(b"kept")
    (tmp_path / "link").symlink_to("target")
    before = os.lstat(target)
    try:
        with pytest.raises(GraphFileError) as caught:
            fmt.save(chain(3, 1.0), target)
        assert str(caught.value) == f"cannot write {target}: not a regular file ({described})"
        with pytest.raises(GraphFileError) as caught:
            fmt.save(chain(3, 1.0), tmp_path / "link")
        assert (
            str(caught.value)
            == f"cannot write {tmp_path / 'link'}: not a regular file (it links to {target}, {described})"
        )
        with pytest.raises(GraphFileError) as caught:
            fmt.save(chain(3, 1.0), "target")  # a relative path is shown as given
        assert str(caught.value) == f"cannot write target: not a regular file ({described})"
    finally:
        if listener is not None:
            listener.close()
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (before.st_mode, before.st_ino, before.st_mtime_ns)
    assert _files(tmp_path) == ["link", "target"]
    if kind == "folder":
        assert _files(target) == ["inside"]


def test_dev_null_is_refused_and_stays_a_character_device(tmp_path: Path, way: str) -> None:
    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        pytest.skip(f"{os.devnull} is not a character device here")
    before = os.stat(os.devnull)
    with pytest.raises(GraphFileError) as caught:
        fmt.save(chain(3, 1.0), os.devnull)
    assert str(caught.value) == f"cannot write {os.devnull}: not a regular file (a character device)"
    (tmp_path / "out.msgpack").symlink_to(os.devnull)
    with pytest.raises(GraphFileError) as caught:
        fmt.save(chain(3, 1.0), tmp_path / "out.msgpack")
    assert str(caught.value) == (
        f"cannot write {tmp_path / 'out.msgpack'}: not a regular file (it links to {os.devnull}, a character device)"
    )
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert os.readlink(tmp_path / "out.msgpack") == os.devnull
    assert _files(tmp_path) == ["out.msgpack"]


def test_a_block_device_is_refused(way: str) -> None:
    dev = Path("/dev")
    devices = sorted(p for p in dev.iterdir() if stat.S_ISBLK(os.lstat(p).st_mode)) if dev.is_dir() else []
    if not devices:
        pytest.skip("no block device in /dev")
    before = os.lstat(devices[0])
    with pytest.raises(GraphFileError) as caught:
        fmt.save(chain(3, 1.0), devices[0])
    assert str(caught.value) == f"cannot write {devices[0]}: not a regular file (a block device)"
    after = os.lstat(devices[0])
    assert stat.S_ISBLK(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_forward_write_to_dev_null_exits_5_and_leaves_it_alone() -> None:
    from typer.testing import CliRunner

    from cli import app

    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        pytest.skip(f"{os.devnull} is not a character device here")
    seed004 = EXAMPLES / "seed004.msgpack"
    result = CliRunner().invoke(app, ["--disable-plugins", "forward", str(seed004), "--write", os.devnull])
    assert (result.exit_code, result.stderr) == (
        5,
        f"Error: cannot write {os.devnull}: not a regular file (a character device)\n",
    )
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


# -- long names -----------------------------------------------------------------------------------
def test_a_name_of_255_bytes_can_be_written_and_replaced(tmp_path: Path, way: str) -> None:
    name = "g" * 247 + ".msgpack"
    assert len(os.fsencode(name)) == 255  # NAME_MAX on Linux, macOS and the BSDs
    fmt.save(chain(5, 1.0), tmp_path / name)
    fmt.save(chain(6, 2.0), tmp_path / name)
    assert (tmp_path / name).read_bytes() == fmt.dumps(chain(6, 2.0))
    assert _files(tmp_path) == [name]


# -- faults ---------------------------------------------------------------------------------------
def test_an_exception_at_any_point_of_a_save_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(chain(50, 1.0), path)
    old = path.read_bytes()
    new_graph = chain(60, 2.0)
    real_encode = codec.encode
    chunks = sum(1 for _ in real_encode(new_graph))
    assert chunks > 15

    for fail_at in range(chunks + 1):

        def failing(graph: Graph, stored: Any = None, fail_at: int = fail_at) -> Iterator[bytes | memoryview]:
            for i, chunk in enumerate(real_encode(graph, stored)):
                if i == fail_at:
                    raise RuntimeError(f"failed at chunk {i}")
                yield chunk
            if fail_at == chunks:
                raise RuntimeError("failed after the last chunk")

        monkeypatch.setattr(codec, "encode", failing)
        with pytest.raises(RuntimeError, match=r"^failed "):
            fmt.save(new_graph, path)
        assert path.read_bytes() == old, fail_at
        assert _files(tmp_path) == ["g.msgpack"], fail_at
    monkeypatch.setattr(codec, "encode", real_encode)

    for name in ("fsync", "replace"):  # the two system calls after the last write
        with monkeypatch.context() as patch:
            patch.setattr(os, name, _raise_os_error)
            with pytest.raises(GraphFileError, match=r"^cannot write .*: Input/output error$"):
                fmt.save(new_graph, path)
        assert path.read_bytes() == old
        assert _files(tmp_path) == ["g.msgpack"]
    fmt.save(new_graph, path)
    assert fmt.dumps(fmt.load(path)) == fmt.dumps(new_graph)


def _raise_os_error(*args: object) -> None:
    raise OSError(5, "Input/output error")


@posix_only
def test_sigkill_at_any_moment_leaves_the_old_file_or_the_new_one_and_nothing_else(
    tmp_path: Path, anonymous_files: None
) -> None:
    """A child saves two graphs (about 3 MB each) over one path in a loop and is killed at a random
    moment, 100 times. The path always holds one of them whole, and the folder holds nothing else,
    except after a kill in the microseconds between link and replace: then one complete file under
    the target's temporary name, which the next save removes."""
    graphs = [chain(150_000, 1.0), chain(150_000, 2.0)]
    contents = {fmt.dumps(g) for g in graphs}
    path = tmp_path / "g.msgpack"
    fmt.save(graphs[0], path)
    leftover = atomic.temporary_name(path)
    in_save = mmap.mmap(-1, 1)  # shared with the children: 1 while one is inside fmt.save
    rng = random.Random(6)
    kills = killed_in_save = 0
    deadline = time.monotonic() + 20.0
    while kills < 100 and time.monotonic() < deadline:
        pid = os.fork()
        if pid == 0:  # the child: save until killed
            try:
                while True:
                    for graph in graphs:
                        in_save[0] = 1
                        fmt.save(graph, path)
                        in_save[0] = 0
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        kills += 1
        killed_in_save += in_save[0]
        in_save[0] = 0
        assert path.read_bytes() in contents, f"kill {kills}: a partial or foreign file"
        fmt.load(path)
        others = [name for name in _files(tmp_path) if name != "g.msgpack"]
        if others:  # killed between link and replace: every byte was written already
            assert others == [leftover], f"kill {kills}"
            assert (tmp_path / leftover).read_bytes() in contents, f"kill {kills}: a partial temporary file"
    assert kills >= 50
    assert killed_in_save >= kills // 2, "the kills did not land in the middle of saves: the test proved nothing"
    fmt.save(graphs[1], path)  # removes a leftover of a kill in the window, if the last kill left one
    assert _files(tmp_path) == ["g.msgpack"]
    assert path.read_bytes() == fmt.dumps(graphs[1])


@posix_only
def test_a_save_killed_between_link_and_replace_leaves_a_complete_file_the_next_save_removes(
    tmp_path: Path, anonymous_files: None
) -> None:
    path = tmp_path / "g.msgpack"
    old, new, newer = chain(50, 1.0), chain(60, 2.0), chain(70, 3.0)
    fmt.save(old, path)
    pid = os.fork()
    if pid == 0:  # the child dies just before its replace, as a SIGKILL there would leave it
        try:
            os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
            fmt.save(new, path)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    leftover = atomic.temporary_name(path)
    assert re.fullmatch(r"\.graphsvc-[0-9a-f]{8}\.tmp", leftover)
    assert _files(tmp_path) == [leftover, "g.msgpack"]
    assert path.read_bytes() == fmt.dumps(old)
    assert (tmp_path / leftover).read_bytes() == fmt.dumps(new)
    fmt.save(newer, path)
    assert _files(tmp_path) == ["g.msgpack"]
    assert path.read_bytes() == fmt.dumps(newer)


def test_a_save_waits_for_a_live_save_of_the_same_file_then_gives_up(
    tmp_path: Path, anonymous_files: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temporary file someone holds a lock on belongs to a live save: it is waited for, up to
    SAVE_WAIT seconds, never removed."""
    fcntl = pytest.importorskip("fcntl")
    path = tmp_path / "g.msgpack"
    fmt.save(chain(5, 1.0), path)
    held = tmp_path / atomic.temporary_name(path)
    held.write_bytes(b"a live save's file")
    monkeypatch.setattr(atomic, "SAVE_WAIT", 0.2)
    with open(held, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(GraphFileError) as caught:
            fmt.save(chain(6, 2.0), path)
        assert time.monotonic() - started >= 0.2
        assert str(caught.value) == f"cannot write {path}: another save of it has not finished in 0.2 s"
        assert _files(tmp_path) == [held.name, "g.msgpack"]
        assert held.read_bytes() == b"a live save's file"
        assert path.read_bytes() == fmt.dumps(chain(5, 1.0))

        # A live save that ends (its replace takes the name away) within the wait: this save goes on.
        monkeypatch.setattr(atomic, "SAVE_WAIT", 10.0)

        def end_the_live_save() -> None:
            held.unlink()  # as its replace would take the name away
            holder.close()

        finish = threading.Timer(0.1, end_the_live_save)
        finish.start()
        fmt.save(chain(7, 3.0), path)
        finish.join()
    assert _files(tmp_path) == ["g.msgpack"]
    assert path.read_bytes() == fmt.dumps(chain(7, 3.0))


def test_a_leftover_that_cannot_be_checked_is_left_alone(
    tmp_path: Path, anonymous_files: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "g.msgpack"
    leftover = tmp_path / atomic.temporary_name(path)
    leftover.write_bytes(b"someone else's")
    monkeypatch.setattr(atomic, "_remove_if_stale", lambda folder_fd, name: None)  # as if unreadable
    fmt.save(chain(5, 1.0), path)
    assert _files(tmp_path) == [leftover.name, "g.msgpack"]
    assert leftover.read_bytes() == b"someone else's"
    assert path.read_bytes() == fmt.dumps(chain(5, 1.0))


@posix_only
def test_sigkill_without_o_tmpfile_still_leaves_a_whole_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback (a named temporary file from the start) keeps the target whole too, but a kill
    while it writes leaves its temporary file: the module docstring says so."""
    monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    graphs = [chain(100_000, 1.0), chain(100_000, 2.0)]
    contents = {fmt.dumps(g) for g in graphs}
    path = tmp_path / "g.msgpack"
    fmt.save(graphs[0], path)
    rng = random.Random(7)
    kills = 0
    while kills < 20:
        pid = os.fork()
        if pid == 0:
            try:
                while True:
                    for graph in graphs:
                        fmt.save(graph, path)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills += 1
        assert path.read_bytes() in contents, f"kill {kills}: a partial or foreign file"
        for other in _files(tmp_path):
            assert other == "g.msgpack" or re.fullmatch(r"\.graphsvc-\w{8}\.tmp", other), other


def _soak(folder: Path, graphs: list[Graph], contents: set[bytes], seed: int, seconds: float) -> str | None:
    """Save and load random files of ``folder`` until the time is up; the first problem, or None."""
    rng = random.Random(seed)
    names = [folder / f"g{i}.msgpack" for i in range(3)]
    loads = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        path = rng.choice(names)
        if rng.random() < 0.5:
            fmt.save(rng.choice(graphs), path)
            continue
        try:
            graph = fmt.load(path)
        except Exception as exc:
            return f"load {loads} of {path.name}: {type(exc).__name__}: {exc}"
        if fmt.dumps(graph) not in contents:
            return f"load {loads} of {path.name}: a graph that was never saved"
        loads += 1
    return None if loads > 20 else f"only {loads} loads"


@posix_only
def test_two_processes_saving_and_loading_the_same_files_always_load_a_complete_file(tmp_path: Path) -> None:
    graphs = [chain(n, float(n)) for n in (10, 5_000, 40_000)]
    contents = {fmt.dumps(g) for g in graphs}
    for i in range(3):
        fmt.save(graphs[i], tmp_path / f"g{i}.msgpack")
    report = tmp_path / "reports"
    report.mkdir()
    children = []
    for seed in (1, 2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                problem = _soak(tmp_path, graphs, contents, seed, 2.0)
                (report / str(seed)).write_text(problem or "ok")
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert [(report / str(seed)).read_text() for seed in (1, 2)] == ["ok", "ok"]
    assert _files(tmp_path) == ["g0.msgpack", "g1.msgpack", "g2.msgpack", "reports"]
    assert {fmt.load(tmp_path / f"g{i}.msgpack").num_nodes for i in range(3)} <= {10, 5_000, 40_000}


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="POSIX signals and fork")


def test_a_leftover_that_may_not_be_removed_does_not_stop_the_save(
    tmp_path: Path, anonymous_files: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a sticky folder such as /tmp another user's leftover cannot be removed (EPERM): the save
    takes a name of its own instead of failing."""
    path = tmp_path / "g.msgpack"
    leftover = tmp_path / atomic.temporary_name(path)
    leftover.write_bytes(b"another user's")
    real_unlink = os.unlink

    def unlink(name: Any, *args: Any, **kwargs: Any) -> None:
        if str(name).endswith(leftover.name):
            raise PermissionError(1, "Operation not permitted")
        real_unlink(name, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    fmt.save(chain(5, 1.0), path)
    assert path.read_bytes() == fmt.dumps(chain(5, 1.0))
    assert _files(tmp_path) == [leftover.name, "g.msgpack"]
    assert leftover.read_bytes() == b"another user's"


# -- reserving the file's size, writing with writev ------------------------------------------------------
def test_a_save_reserves_exactly_the_file_s_size_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    real = atomic._fallocate

    def spy(fd: int, size: int) -> int:
        calls.append((os.fstat(fd).st_size, size))  # the file is still empty when it is reserved
        return real(fd, size)

    monkeypatch.setattr(atomic, "_fallocate", spy)
    graph = chain(60, 2.0)
    fmt.save(graph, tmp_path / "g.msgpack")
    expected = fmt.dumps(graph)
    assert calls == [(0, len(expected))]
    assert (tmp_path / "g.msgpack").read_bytes() == expected


def test_reserve_allocates_the_blocks_and_sets_the_size(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb") as stream:
        if atomic._fallocate(stream.fileno(), 1) in (errno.EOPNOTSUPP, errno.ENOSYS):
            pytest.skip("no fallocate(2) on this filesystem")
        atomic.reserve(stream, 1 << 20)
        info = os.fstat(stream.fileno())
    assert info.st_size == 1 << 20
    assert info.st_blocks * 512 >= 1 << 20


@pytest.mark.parametrize("error", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_a_filesystem_that_cannot_reserve_is_written_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str, error: int
) -> None:
    monkeypatch.setattr(atomic, "_fallocate", lambda fd, size: error)
    graph = chain(60, 2.0)
    fmt.save(graph, tmp_path / "g.msgpack")
    assert (tmp_path / "g.msgpack").read_bytes() == fmt.dumps(graph)
    assert _files(tmp_path) == ["g.msgpack"]


def test_a_full_disk_is_found_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(chain(50, 1.0), path)
    old = path.read_bytes()
    monkeypatch.setattr(atomic, "_fallocate", lambda fd, size: errno.ENOSPC)
    monkeypatch.setattr(os, "writev", _must_not_be_called)
    with pytest.raises(GraphFileError) as refused:
        fmt.save(chain(60, 2.0), path)
    assert str(refused.value) == f"cannot write {path}: No space left on device"
    assert path.read_bytes() == old
    assert _files(tmp_path) == ["g.msgpack"]


def test_short_writes_are_resumed_and_a_failing_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "g.msgpack"
    graph = chain(60, 2.0)
    real_writev = os.writev
    calls = []

    def short(fd: int, buffers: list[Any]) -> int:  # at most 7 bytes of the first buffer at a time
        calls.append(len(buffers))
        return real_writev(fd, [memoryview(buffers[0])[:7]])

    monkeypatch.setattr(os, "writev", short)
    fmt.save(graph, path)
    assert path.read_bytes() == fmt.dumps(graph)
    assert len(calls) > len(fmt.dumps(graph)) // 7

    def failing(fd: int, buffers: list[Any]) -> int:
        if len(calls) > 20:
            raise OSError(5, "Input/output error")
        return short(fd, buffers)

    calls.clear()
    monkeypatch.setattr(os, "writev", failing)
    with pytest.raises(GraphFileError) as refused:
        fmt.save(chain(61, 3.0), path)
    assert str(refused.value) == f"cannot write {path}: Input/output error"
    assert path.read_bytes() == fmt.dumps(graph)
    assert _files(tmp_path) == ["g.msgpack"]
