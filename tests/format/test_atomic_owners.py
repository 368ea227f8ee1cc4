"""Saves among other users' files (issue 25, items S1, S4 and 12): a symbolic link is followed only
where the kernel's protected_symlinks would follow it; the replaced file's owner and group are
kept; its setuid, setgid and sticky bits are not. Another user is simulated with chown to uid and
gid 12345, which needs root (the tests skip without it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from graphsvc import format as fmt
from graphsvc.errors import OutputError
from graphsvc.format import atomic
from graphsvc.graph import Graph, GraphBuilder

OTHER = 12345
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")


def small() -> Graph:
    b = GraphBuilder()
    b.leaf(2.0, name="x")
    return b.build()


def sticky_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def planted_link(folder: Path, owner: int) -> tuple[Path, Path]:
    """``folder/model.msgpack``: a link, owned by ``owner``, to a script outside the folder."""
    script = folder.parent / "script.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    link = folder / "model.msgpack"
    link.symlink_to(script)
    os.lchown(link, owner, owner)
    return link, script


@as_root
def test_another_users_link_in_a_sticky_world_writable_folder_is_refused(tmp_path: Path) -> None:
    folder = sticky_folder(tmp_path)
    link, script = planted_link(folder, OTHER)
    with pytest.raises(OutputError) as caught:
        fmt.save(small(), link)
    assert str(caught.value) == (
        f"cannot write {link}: a symbolic link owned by uid {OTHER} in a sticky world-writable folder, neither "
        "yours nor the folder owner's: not followed, as the kernel's protected_symlinks would not; remove it or "
        "write elsewhere"
    )
    assert script.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert sorted(p.name for p in folder.iterdir()) == ["model.msgpack"]
    assert os.readlink(link) == str(script)


@as_root
def test_such_a_link_later_in_a_chain_is_refused_and_named(tmp_path: Path) -> None:
    folder = sticky_folder(tmp_path)
    planted, script = planted_link(folder, OTHER)
    mine = tmp_path / "mine.msgpack"
    mine.symlink_to(planted)
    with pytest.raises(OutputError, match=rf"^cannot write {mine}: a symbolic link \({planted}\) owned by uid"):
        fmt.save(small(), mine)
    assert script.read_bytes() == b"#!/bin/sh\necho hi\n"


@as_root
@pytest.mark.parametrize("who", ["me", "folder owner", "not sticky"])
def test_links_the_kernel_follows_are_followed(tmp_path: Path, who: str) -> None:
    folder = sticky_folder(tmp_path)
    if who == "folder owner":
        os.chown(folder, OTHER, OTHER)
    if who == "not sticky":
        folder.chmod(0o777)
    link, script = planted_link(folder, OTHER if who != "me" else os.geteuid())
    fmt.save(small(), link)
    assert fmt.load(script).value("x") == 2.0
    assert os.path.islink(link)


@as_root
def test_root_saving_over_another_users_file_keeps_its_owner_group_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "theirs.msgpack"
    fmt.save(small(), path)
    os.chown(path, OTHER, OTHER + 1)
    path.chmod(0o640)
    fmt.save(small(), path)
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (OTHER, OTHER + 1, 0o640)


def test_a_new_file_belongs_to_the_user_saving(tmp_path: Path) -> None:
    path = tmp_path / "new.msgpack"
    fmt.save(small(), path)
    info = os.stat(path)
    assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid())


def test_a_user_who_cannot_keep_the_owner_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user other than root: fchown to another owner fails with EPERM."""
    path = tmp_path / "theirs.msgpack"
    fmt.save(small(), path)
    before = path.read_bytes()
    real = os.stat

    def owned_by_other(target: object, *args: object, **kwargs: object) -> os.stat_result:
        info = real(target, *args, **kwargs)  # type: ignore[arg-type]
        if str(target) == str(path):
            fields = list(info)
            fields[stat.ST_UID] = OTHER
            return os.stat_result(fields)
        return info

    def refused(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "stat", owned_by_other)
    monkeypatch.setattr(os, "fchown", refused)
    with pytest.raises(OutputError) as caught:
        fmt.save(small(), path)
    assert str(caught.value) == (
        f"cannot write {path}: it belongs to uid {OTHER}, and the file replacing it would belong to uid "
        f"{os.geteuid()} (only root can give a file away); save it elsewhere"
    )
    assert caught.value.exit_code == 5
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.msgpack"]


@pytest.mark.parametrize(("old", "new"), [(0o4755, 0o755), (0o2750, 0o750), (0o6777, 0o777), (0o1644, 0o644)])
def test_setuid_setgid_and_sticky_are_dropped(tmp_path: Path, old: int, new: int) -> None:
    path = tmp_path / "tool.msgpack"
    fmt.save(small(), path)
    path.chmod(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == old
    fmt.save(small(), path)
    assert stat.S_IMODE(os.stat(path).st_mode) == new
    with atomic.atomic_writer(path) as stream:
        stream.write(b"x")
    assert stat.S_IMODE(os.stat(path).st_mode) == new
