"""A graph loaded with ``load(mmap=True)`` whose file was truncated under the mapping (issue 25,
item 13): saving, encoding or replaying it says what happened (exit 3) instead of "Bad address",
and never reads a lost page (that would be SIGBUS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphsvc import format as fmt
from graphsvc.errors import OutputError
from graphsvc.format import document, jsonio
from graphsvc.graph import Graph, GraphBuilder


def mapped_then_truncated(tmp_path: Path) -> Graph:
    import numpy as np

    b = GraphBuilder()
    x = b.leaf(np.ones((256, 256)), name="x")
    b.add("neg", [x], name="y", value=-np.ones((256, 256)))
    path = tmp_path / "mapped.msgpack"
    fmt.save(b.build(), path)
    graph = fmt.load(path, mmap=True)
    os.truncate(path, 4096)
    return graph


TRUNCATED = (
    "the file this graph's arrays are mapped from (load(mmap=True)) is now 4,096 bytes, shorter than the "
    "1,049,002 mapped: it was truncated while mapped, and reading its arrays would kill the process (SIGBUS); "
    "load it again"
)


def test_saving_or_replaying_a_graph_whose_mapped_file_was_truncated_says_so(tmp_path: Path) -> None:
    from graphsvc.errors import GraphFileError
    from graphsvc.replay import run

    graph = mapped_then_truncated(tmp_path)
    out = tmp_path / "out.msgpack"
    attempts = (
        lambda: fmt.save(graph, out),
        lambda: fmt.dumps(graph),
        lambda: jsonio.dumps(graph),
        lambda: run.forward(graph),
    )
    for attempt in attempts:
        with pytest.raises(GraphFileError) as caught:
            attempt()
        assert (str(caught.value), caught.value.exit_code) == (TRUNCATED, 3)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mapped.msgpack"]


def test_a_truncation_after_the_check_is_said_not_bad_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's write(2) from a page a truncation removed fails with EFAULT: said as what happened."""
    from graphsvc.errors import GraphFileError

    graph = mapped_then_truncated(tmp_path)
    monkeypatch.setattr(fmt, "check_mapped", lambda graph: None)
    out = tmp_path / "out.msgpack"
    with pytest.raises(GraphFileError) as caught:
        fmt.save(graph, out)
    assert str(caught.value) == (
        "the file this graph's arrays are mapped from (load(mmap=True)) was truncated or changed while mapped: "
        "its arrays cannot be read; load it again"
    )
    assert not isinstance(caught.value, OutputError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mapped.msgpack"]


def test_an_intact_mapped_graph_saves_and_replays(tmp_path: Path) -> None:
    import numpy as np

    from graphsvc.replay import run

    b = GraphBuilder()
    x = b.leaf(np.ones((4, 4)), name="x")
    b.add("neg", [x], name="y")
    path = tmp_path / "mapped.msgpack"
    fmt.save(b.build(), path)
    graph = fmt.load(path, mmap=True)
    assert len(document.mappings(graph)) == 1
    fmt.check_mapped(graph)
    fmt.save(graph, tmp_path / "copy.msgpack")
    assert np.array_equal(run.forward(graph).value("y"), -np.ones((4, 4)))
