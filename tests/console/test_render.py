"""graphsvc.console.render: DOT text as micrograd's draw_dot, neighbourhoods, the size limit, Graphviz for real."""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from graphsvc.console import render
from graphsvc.errors import GraphFileError, RenderError, UsageError
from graphsvc.format import load
from graphsvc.graph import FLOAT_DTYPE, INDEX_DTYPE, OFFSET_DTYPE, OP_CODE_DTYPE, Graph, GraphBuilder
from tests.conftest import EXAMPLES, dense_graph

SEED004 = EXAMPLES / "seed004.msgpack"
# Rendering is tested for real where Graphviz is installed; without it these tests are skipped, except
# in CI (.ci/run sets GRAPHSVC_REQUIRE_GRAPHVIZ=1), where they fail. See tests/conftest.py.
needs_dot = pytest.mark.usefixtures("graphviz_dot")


SEED004_DOT = """\
digraph graphsvc {
\tgraph [rankdir=LR]
\tnode [fontname="Helvetica" fontsize=11]
\tedge [fontname="Helvetica" fontsize=9]
\tv0 [label="{ a | data 2 | grad 22 }" shape=record]
\tv1 [label="{ b | data 3 | grad 17 }" shape=record]
\tv2 [label="{ c | data 1 | grad 5 }" shape=record]
\tv3 [label="{ ab | data 6 | grad 5 }" shape=record]
\to3 [label="mul" shape=ellipse]
\tv4 [label="{ abc | data 7 | grad 5 }" shape=record]
\to4 [label="add" shape=ellipse]
\tv5 [label="{ apb | data 5 | grad 7 }" shape=record]
\to5 [label="add" shape=ellipse]
\tv6 [label="{ L | data 35 | grad 1 }" shape=record]
\to6 [label="mul" shape=ellipse]
\to3 -> v3
\tv0 -> o3 [headlabel="0"]
\tv1 -> o3 [headlabel="1"]
\to4 -> v4
\tv3 -> o4 [headlabel="0"]
\tv2 -> o4 [headlabel="1"]
\to5 -> v5
\tv0 -> o5 [headlabel="0"]
\tv1 -> o5 [headlabel="1"]
\to6 -> v6
\tv4 -> o6 [headlabel="0"]
\tv5 -> o6 [headlabel="1"]
}
"""


def chain(n: int) -> Graph:
    """x0 -> sin -> sin -> ... : n nodes, node i's parent is i - 1."""
    return Graph(
        op_table=["leaf", "sin"],
        op_codes=np.array([0] + [1] * (n - 1), dtype=OP_CODE_DTYPE),
        parent_offsets=np.concatenate(([0], np.arange(n, dtype=np.int64))).astype(OFFSET_DTYPE),
        parent_indices=np.arange(n - 1, dtype=INDEX_DTYPE),
        values=np.zeros(n, dtype=FLOAT_DTYPE),
        outputs=[n - 1],
    )


def hub(users: int) -> Graph:
    """One constant shared by ``users`` nodes."""
    b = GraphBuilder()
    k = b.const(2.0, name="k")
    for i in range(users):
        b.add("neg", [k], name=f"u{i}")
    return b.build()


# -- DOT text ------------------------------------------------------------------------------------
def test_seed004_is_drawn_as_draw_dot_draws_it() -> None:
    assert render.to_dot(load(SEED004)) == SEED004_DOT


def test_dot_text_is_the_same_every_time() -> None:
    graph = load(SEED004)
    assert render.to_dot(graph) == render.to_dot(load(SEED004))


def test_a_graph_without_gradients_shows_a_dash() -> None:
    b = GraphBuilder()
    x = b.leaf(0.5, name="x")
    b.add("pow", [x], name="y", value=0.25, attrs={"exponent": 2.0})
    text = render.to_dot(b.build())
    assert '\tv0 [label="{ x | data 0.5 | grad - }" shape=record]' in text
    assert '\to1 [label="pow exponent=2" shape=ellipse]' in text
    assert "\tv0 -> o1\n" in text  # one input: no number on the edge


def test_values_a_file_does_not_hold_show_a_dash_as_the_listings_do() -> None:
    """An unreplayed file holds no computed value (nan in the column, no array): `data -`, not
    `data nan`. Once some computed value is held, a nan is a value (the replay's), and a leaf's is
    always its own."""
    b = GraphBuilder()
    x = b.leaf(np.arange(6.0).reshape(2, 3), name="x")
    n = b.leaf(float("nan"), name="n")
    b.add("sum", [b.add("exp", [x], name="e")], name="L")
    b.add("neg", [n], name="m")
    text = render.to_dot(b.build())
    assert '\tv0 [label="{ x | data f64[2,3] | grad - }" shape=record]' in text
    assert '\tv1 [label="{ n | data nan | grad - }" shape=record]' in text
    assert '\tv2 [label="{ e | data - | grad - }" shape=record]' in text
    assert '\tv3 [label="{ L | data - | grad - }" shape=record]' in text
    assert '\tv4 [label="{ m | data - | grad - }" shape=record]' in text
    b = GraphBuilder()
    n = b.leaf(float("nan"), name="n")
    b.add("neg", [n], name="m", value=float("nan"))
    b.add("exp", [b.leaf(0.0)], value=1.0)
    assert '\tv1 [label="{ m | data nan | grad - }" shape=record]' in render.to_dot(b.build())


def test_numbers_use_six_significant_digits() -> None:
    b = GraphBuilder()
    b.leaf(1.0 / 3.0, name="third", grad=-1.5e-12)
    b.leaf(float("nan"), name="nan", grad=float("inf"))
    text = render.to_dot(b.build())
    assert "{ third | data 0.333333 | grad -1.5e-12 }" in text
    assert "{ nan | data nan | grad inf }" in text


def test_names_cannot_break_the_record_or_the_quotes() -> None:
    b = GraphBuilder()
    b.leaf(1.0, name='w{0}|<p> "q" \\')
    b.leaf(2.0, name="x" * 50)
    text = render.to_dot(b.build())
    # the backslash doubled as the listings double it (escape), then each escaped for the record
    assert '\tv0 [label="{ w\\{0\\}\\|\\<p\\>\\ \\"q\\"\\ \\\\\\\\ | data 1 | grad - }" shape=record]' in text
    assert "{ " + "x" * 39 + "… | data 2" in text


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("zw\u200bsp", "zw\\\\u200bsp"),
        ("zwj\u200d", "zwj\\\\u200d"),
        ("soft\xad", "soft\\\\xad"),
        ("tag\U000e0041", "tag\\\\U000e0041"),
        ("\ufeffbom", "\\\\ufeffbom"),
        ("rlo\u202e", "rlo\\\\u202e"),
        ("csi\x9b", "csi\\\\x9b"),
        ("tab\tnl\n", "tab\\\\tnl\\\\n"),
    ],
)
def test_names_and_op_tags_are_escaped_as_the_listings_escape_them(name: str, shown: str) -> None:
    """In DOT text a backslash is written twice, so dot draws ``zw\\u200bsp``, what ``order`` prints."""
    b = GraphBuilder()
    b.add("op" + name, [b.leaf(1.0, name=name)], attrs={"k": name})
    text = render.to_dot(b.build())
    assert f'\tv0 [label="{{ {shown} | data 1 | grad - }}" shape=record]' in text
    assert f'\to1 [label="op{shown} k={shown}" shape=ellipse]' in text
    assert text.isascii()


def test_a_node_without_a_name_is_shown_by_id() -> None:
    b = GraphBuilder()
    b.const(3.0)
    assert "{ #0 | data 3 | grad - }" in render.to_dot(b.build())


# -- neighbourhoods ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("center", "depth", "expected"),
    [
        ("ab", 0, [3]),
        ("ab", 1, [0, 1, 3, 4]),  # a and b (inputs), abc (uses ab)
        ("ab", 2, [0, 1, 2, 3, 4, 5, 6]),  # through a, b: apb; through abc: c and L
        ("c", 1, [2, 4]),
        ("c", 2, [2, 3, 4, 6]),
        ("L", 1, [4, 5, 6]),
        ("a", 1, [0, 3, 5]),
    ],
)
def test_neighbourhood_follows_edges_both_ways(center: str, depth: int, expected: list[int]) -> None:
    graph = load(SEED004)
    assert render.neighbourhood(graph, graph.node_id(center), depth) == expected


def test_neighbourhood_in_a_million_deep_chain_is_iterative() -> None:
    graph = chain(1_000_000)
    assert sys.getrecursionlimit() <= 10_000
    assert render.neighbourhood(graph, 500_000, 3) == list(range(499_997, 500_004))
    assert render.neighbourhood(graph, 0, 2) == [0, 1, 2]
    assert render.neighbourhood(graph, 999_999, 1_000) == list(range(998_999, 1_000_000))


def test_a_neighbourhood_with_hidden_inputs_says_how_many() -> None:
    graph = load(SEED004)
    text = render.to_dot(graph, render.neighbourhood(graph, 3, 1), highlight=3)
    assert [line.split()[0] for line in text.splitlines() if line.startswith("\tv") and "->" not in line] == [
        "v0",
        "v1",
        "v3",
        "v4",
    ]
    assert '\tv3 [label="{ ab | data 6 | grad 5 }" shape=record style=bold penwidth=2]' in text
    assert '\th4 [label="+1" shape=plaintext]' in text  # abc's other input, c, is not drawn
    assert "\th4 -> o4 [style=dashed]" in text
    assert "v2" not in text


def test_negative_depth_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^depth must be 0 or more, not -1$"):
        render.neighbourhood(load(SEED004), 0, -1)


# -- the size limit ------------------------------------------------------------------------------
def test_a_graph_above_the_limit_is_refused_with_a_hint() -> None:
    assert render.MAX_RENDER_NODES == 2000
    assert render.select(chain(2000)) == list(range(2000))
    with pytest.raises(UsageError) as caught:
        render.select(chain(2001))
    assert str(caught.value) == (
        "the graph has 2001 nodes, more than one picture can show (2000); "
        "draw one node's neighbourhood (around=, depth=)"
    )


def test_a_graph_with_too_many_edges_is_refused_with_the_numbers() -> None:
    assert render.MAX_RENDER_EDGES == 2000
    graph = dense_graph(600, 151)  # about the size of the 372 KB file that kept dot busy past 180 s
    with pytest.raises(UsageError) as caught:
        render.select(graph)
    assert str(caught.value) == (
        "the graph has 600 nodes and 79,124 edges, more edges than one picture can show "
        "(2,000: Graphviz would take minutes); draw one node's neighbourhood (around=, depth=)"
    )
    assert render.select(graph, limit=None) == list(range(600))  # DOT text: any size
    exactly = dense_graph(41, 50)  # 1 + 2 + ... + 40 = 820 edges, then a dense one at the cap
    assert render.edges_between(exactly, range(41)) == exactly.num_edges == 820
    assert render.select(dense_graph(63, 1000)) == list(range(63))  # 1,953 edges: drawn
    with pytest.raises(UsageError, match=r"^the graph has 64 nodes and 2,016 edges, more edges than"):
        render.select(dense_graph(64, 1000))


def test_a_neighbourhood_with_too_many_edges_is_refused() -> None:
    graph = dense_graph(600, 151)
    assert render.edges_between(graph, [0, 1]) == 1  # node 1 has the one parent 0
    with pytest.raises(UsageError) as caught:
        render.select(graph, around="599", depth=1)
    assert str(caught.value).startswith("the neighbourhood of #599 within 1 edge has ")
    assert str(caught.value).endswith(
        "more edges than one picture can show (2,000: Graphviz would take minutes); give a smaller depth"
    )
    assert render.select(graph, around="599", depth=0) == [599]


@pytest.fixture
def started_dots(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """The dot processes render.draw starts, as it starts them."""
    started: list[subprocess.Popen[bytes]] = []
    real_start = render._start

    def start(program: str, kind: str) -> subprocess.Popen[bytes]:
        started.append(real_start(program, kind))
        return started[-1]

    monkeypatch.setattr(render, "_start", start)
    return started


@needs_dot
def test_dot_is_stopped_after_the_timeout_and_killed(started_dots: list[subprocess.Popen[bytes]]) -> None:
    slow = render.to_dot(dense_graph(200, 5))  # 985 edges, placed at random: over a minute of dot
    began = time.monotonic()
    with pytest.raises(RenderError) as caught:
        render.draw(slow, "svg", timeout=0.5)
    assert time.monotonic() - began < 5
    assert str(caught.value) == (
        "Graphviz dot did not finish drawing .svg within 0.5 seconds; draw a part of the graph "
        "(the neighbourhood of one node), or write a .dot file and run dot yourself"
    )
    (process,) = started_dots
    assert process.returncode == -signal.SIGKILL and not os.path.exists(f"/proc/{process.pid}")  # killed, reaped


@needs_dot
def test_dot_is_killed_when_drawing_is_interrupted(
    started_dots: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt (Ctrl-C) while dot runs: dot, in a group of its own, is killed and reaped."""

    def interrupted(self: subprocess.Popen[bytes], *args: object, **kwargs: object) -> tuple[bytes, bytes]:
        assert self.poll() is None  # dot is running
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        render.draw(render.to_dot(dense_graph(200, 5)), "svg")
    (process,) = started_dots
    assert process.returncode == -signal.SIGKILL and not os.path.exists(f"/proc/{process.pid}")
    assert os.getpgid(0) != process.pid  # it had a process group of its own


def test_dot_text_has_no_limit(tmp_path: Path) -> None:
    assert render.select(chain(2001), limit=None) == list(range(2001))
    assert render.render(chain(2001), tmp_path / "chain.dot") == 2001
    assert render.select(hub(2500), around="k", depth=1, limit=None)[:3] == [0, 1, 2]


def test_a_neighbourhood_above_the_limit_is_refused() -> None:
    graph = hub(2500)
    assert render.select(graph, around="u7", depth=1) == [0, 8]
    with pytest.raises(UsageError) as caught:
        render.select(graph, around="k", depth=1)
    assert str(caught.value) == (
        "the neighbourhood of k within 1 edge holds more than 2000 nodes, more than one picture can show; "
        "give a smaller depth"
    )


def test_a_large_graph_renders_around_a_node(tmp_path: Path) -> None:
    out = tmp_path / "chain.dot"
    assert render.render(chain(100_000), out, around=50_000, depth=2) == 5
    text = out.read_text()
    assert [line.split()[0] for line in text.splitlines() if line.startswith("\tv") and "->" not in line] == [
        f"v{i}" for i in range(49_998, 50_003)
    ]
    assert '\th49998 [label="+1" shape=plaintext]' in text


# -- files -----------------------------------------------------------------------------------------
def test_dot_output_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz now fails
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "g.dot"
    assert render.render(load(SEED004), out) == 7
    assert out.read_text() == SEED004_DOT


def test_an_unknown_suffix_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"the file name must end in \.svg, \.png, \.pdf or \.dot$"):
        render.render(load(SEED004), tmp_path / "g.txt")
    assert list(tmp_path.iterdir()) == []


@needs_dot
def test_svg_is_drawn_for_real_with_names_and_values(tmp_path: Path) -> None:
    out = tmp_path / "seed004.svg"
    render.render(load(SEED004), out)
    svg = out.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    texts = svg.split(">")
    for word in ("a", "b", "c", "ab", "abc", "apb", "L", "mul", "add", "data 35", "grad 22", "grad 17", "data 7"):
        assert any(t.endswith(word + "</text") for t in texts), word
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


@needs_dot
@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".pdf", b"%PDF")])
def test_png_and_pdf(tmp_path: Path, suffix: str, magic: bytes) -> None:
    out = tmp_path / f"g{suffix}"
    render.render(load(SEED004), out)
    assert out.read_bytes().startswith(magic)


def test_missing_dot_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("graphviz")
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    with pytest.raises(RenderError) as caught:
        render.render(load(SEED004), tmp_path / "g.svg")
    message = str(caught.value)
    assert message.startswith("drawing .svg needs the Graphviz `dot` program, which is not on PATH; install Graphviz")
    assert "`apt-get install graphviz`" in message and "`brew install graphviz`" in message
    assert "pip install" not in message  # only what is missing: the program, not the Python package
    assert list(tmp_path.iterdir()) == []


def test_missing_python_package_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)
    expected = r"^drawing \.png needs the graphviz Python package; install it: `pip install graphviz`; or write a"
    with pytest.raises(RenderError, match=expected):
        render.render(load(SEED004), tmp_path / "g.png")


# -- where a picture goes --------------------------------------------------------------------------
def test_a_picture_goes_to_the_file_a_link_points_to_and_the_link_stays(tmp_path: Path) -> None:
    (tmp_path / "pictures").mkdir()
    link = tmp_path / "latest.dot"
    link.symlink_to("pictures/seed004.dot")  # dangling: the picture is new
    assert render.render(load(SEED004), link) == 7
    assert os.readlink(link) == "pictures/seed004.dot"
    assert (tmp_path / "pictures" / "seed004.dot").read_text() == SEED004_DOT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.dot", "pictures"]


def test_a_picture_is_never_written_onto_a_device_fifo_or_folder_and_graphviz_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_drawing(dot_text: str, kind: str) -> bytes:
        raise AssertionError("Graphviz ran for a picture that cannot be written")

    monkeypatch.setattr(render, "draw", no_drawing)
    os.mkfifo(tmp_path / "pipe.svg")
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "null.pdf").symlink_to(os.devnull)
    expected = {
        "pipe.svg": "not a regular file (a FIFO)",
        "folder.png": "not a regular file (a directory)",
        "null.pdf": f"not a regular file (it links to {os.devnull}, a character device)",
    }
    for name, why in expected.items():
        with pytest.raises(GraphFileError) as caught:
            render.render(load(SEED004), tmp_path / name)
        assert str(caught.value) == f"cannot write {tmp_path / name}: {why}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.png", "null.pdf", "pipe.svg"]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe.svg").st_mode)
    assert list((tmp_path / "folder.png").iterdir()) == []
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_failing_graphviz_leaves_the_old_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(dot_text: str, kind: str) -> bytes:
        raise RenderError("Graphviz dot failed: syntax error in line 1")

    monkeypatch.setattr(render, "draw", failing)
    out = tmp_path / "g.svg"
    out.write_bytes(b"<svg>old</svg>")
    with pytest.raises(RenderError, match=r"^Graphviz dot failed: syntax error in line 1$"):
        render.render(load(SEED004), out)
    assert out.read_bytes() == b"<svg>old</svg>"
    assert list(tmp_path.iterdir()) == [out]


# -- the graphviz_dot fixture (tests/conftest.py) ----------------------------------------------------
@pytest.mark.parametrize("required", [None, "1"])
def test_without_dot_the_graphviz_fixture_skips_but_fails_where_graphviz_is_required(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, required: str | None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    if required is None:
        monkeypatch.delenv("GRAPHSVC_REQUIRE_GRAPHVIZ", raising=False)
    else:
        monkeypatch.setenv("GRAPHSVC_REQUIRE_GRAPHVIZ", required)
    outcome = pytest.skip.Exception if required is None else pytest.fail.Exception
    with pytest.raises(outcome) as caught:
        request.getfixturevalue("graphviz_dot")
    reason = (
        "this test draws with Graphviz and needs Graphviz's `dot` program, which is not on PATH "
        "(`apt-get install graphviz` on Debian and Ubuntu, `brew install graphviz` on macOS)"
    )
    if importlib.util.find_spec("graphviz") is None:
        reason += " and the graphviz Python package, a dependency of graphsvc (`pip install graphviz`)"
    if required is not None:
        reason += "; GRAPHSVC_REQUIRE_GRAPHVIZ=1 makes that a failure, not a skip"
    assert caught.value.msg == reason


def test_the_graphviz_fixture_names_a_missing_python_package(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "dot").write_text("#!/bin/sh\n")
    (tmp_path / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))  # a dot, but no Python package
    monkeypatch.setitem(sys.modules, "graphviz", None)
    monkeypatch.setenv("GRAPHSVC_REQUIRE_GRAPHVIZ", "1")
    with pytest.raises(pytest.fail.Exception) as caught:
        request.getfixturevalue("graphviz_dot")
    assert caught.value.msg == (
        "this test draws with Graphviz and needs the graphviz Python package, a dependency of graphsvc "
        "(`pip install graphviz`); GRAPHSVC_REQUIRE_GRAPHVIZ=1 makes that a failure, not a skip"
    )


def test_with_graphviz_installed_the_graphviz_fixture_lets_the_test_run(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("graphviz")
    (tmp_path / "dot").write_text("#!/bin/sh\n")
    (tmp_path / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GRAPHSVC_REQUIRE_GRAPHVIZ", "1")
    assert request.getfixturevalue("graphviz_dot") is None


def test_tensor_nodes_are_labelled_with_dtype_and_shape() -> None:
    import graphsvc

    b = GraphBuilder()
    x = b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("sum", [x], name="s")
    graph = graphsvc.backward(b.build())
    lines = render.to_dot(graph).splitlines()
    assert '\tv0 [label="{ x | data f32[2,3] | grad f32[2,3] }" shape=record]' in lines
    assert '\tv1 [label="{ s | data f32[]\\ 6 | grad f32[]\\ 1 }" shape=record]' in lines  # "\ ": a kept space
