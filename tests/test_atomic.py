"""Atomic saves under faults: an exception at every point of a save, a child process killed with SIGKILL
in the middle of saves, and two processes saving and loading the same files at once. A reader always
sees the old file or the new one, never a part; a normal error leaves no temporary file behind."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphsvc import format as fmt
from graphsvc.errors import GraphFileError
from graphsvc.graph import Graph, GraphBuilder

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


def test_an_exception_at_any_point_of_a_save_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "g.msgpack"
    fmt.save(chain(50, 1.0), path)
    old = path.read_bytes()
    new_graph = chain(60, 2.0)
    real_encode = fmt._encode
    chunks = sum(1 for _ in real_encode(new_graph))
    assert chunks > 20

    for fail_at in range(chunks + 1):

        def failing(graph: Graph, fail_at: int = fail_at) -> Iterator[bytes | memoryview]:
            for i, chunk in enumerate(real_encode(graph)):
                if i == fail_at:
                    raise RuntimeError(f"failed at chunk {i}")
                yield chunk
            if fail_at == chunks:
                raise RuntimeError("failed after the last chunk")

        monkeypatch.setattr(fmt, "_encode", failing)
        with pytest.raises(RuntimeError, match=r"^failed "):
            fmt.save(new_graph, path)
        assert path.read_bytes() == old, fail_at
        assert _files(tmp_path) == ["g.msgpack"], fail_at
    monkeypatch.setattr(fmt, "_encode", real_encode)

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
def test_sigkill_in_the_middle_of_saves_never_leaves_a_partial_file(tmp_path: Path) -> None:
    """A child saves two graphs (about 2 MB each) over one path in a loop; it is killed at a random
    moment, again and again. The path always holds one of them whole."""
    graphs = [chain(100_000, 1.0), chain(100_000, 2.0)]
    contents = {fmt.dumps(g) for g in graphs}
    path = tmp_path / "g.msgpack"
    fmt.save(graphs[0], path)
    rng = random.Random(6)
    kills = mid_save = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline or kills < 10:
        pid = os.fork()
        if pid == 0:  # the child: save forever until killed
            try:
                while True:
                    for graph in graphs:
                        fmt.save(graph, path)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        kills += 1
        assert path.read_bytes() in contents, f"kill {kills}: a partial or foreign file"
        fmt.load(path)
        leftovers = [p for p in tmp_path.iterdir() if p.name != "g.msgpack"]
        assert all(p.name.startswith(".g.msgpack.") and p.name.endswith(".tmp") for p in leftovers)
        mid_save += bool(leftovers)
        for leftover in leftovers:  # SIGKILL leaves no chance to clean up; that is the only way one stays
            leftover.unlink()
        if kills >= 200:
            break
    assert kills >= 10
    assert mid_save >= 1, "no kill landed in the middle of a save: the test proved nothing"


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
