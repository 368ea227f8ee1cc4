"""graphsvc render: the picture from the command line, --replay, --around/--depth, the size limit."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder
from tests.conftest import EXAMPLES, ROOT, dense_graph, dot_processes, run_cli

SEED004 = EXAMPLES / "seed004.msgpack"
# Rendering is tested for real where Graphviz is installed; without it these tests are skipped, except
# in CI (.ci/run sets GRAPHSVC_REQUIRE_GRAPHVIZ=1), where they fail. See tests/conftest.py.
needs_dot = pytest.mark.usefixtures("graphviz_dot")


run = run_cli


def records(dot: str) -> list[str]:
    """The value records' labels, in the order drawn."""
    return re.findall(r'^\tv\d+ \[label="\{ (.*?) \}"', dot, flags=re.M)


@pytest.fixture
def seed004_no_grads(tmp_path: Path) -> Path:
    """seed004 with its values zeroed above the leaves and no gradients: only a replay fills them in."""
    graph = fmt.load(SEED004).copy()
    graph.grads = None
    graph.values[3:] = np.nan
    path = tmp_path / "bare.msgpack"
    fmt.save(graph, path)
    return path


def test_replay_fills_in_values_and_gradients(tmp_path: Path, seed004_no_grads: Path) -> None:
    out = tmp_path / "g.dot"
    code, stdout, stderr = run("render", str(seed004_no_grads), "-o", str(out))
    assert (code, stdout, stderr) == (0, "", f"wrote {out} (7 nodes)\n")
    assert records(out.read_text()) == [
        "a | data 2 | grad -",
        "b | data 3 | grad -",
        "c | data 1 | grad -",
        "ab | data - | grad -",
        "abc | data - | grad -",
        "apb | data - | grad -",
        "L | data - | grad -",
    ]
    code, stdout, stderr = run("render", str(seed004_no_grads), "--replay", "-o", str(out))
    assert (code, stdout) == (0, "")
    assert records(out.read_text()) == [
        "a | data 2 | grad 22",
        "b | data 3 | grad 17",
        "c | data 1 | grad 5",
        "ab | data 6 | grad 5",
        "abc | data 7 | grad 5",
        "apb | data 5 | grad 7",
        "L | data 35 | grad 1",
    ]


def test_replay_with_another_output(tmp_path: Path) -> None:
    out = tmp_path / "g.dot"
    code, _, _ = run("render", str(SEED004), "--replay", "--output", "apb", "-o", str(out))
    assert code == 0
    assert records(out.read_text()) == [
        "a | data 2 | grad 1",
        "b | data 3 | grad 1",
        "c | data 1 | grad 0",
        "ab | data 6 | grad 0",
        "abc | data 7 | grad 0",
        "apb | data 5 | grad 1",
        "L | data 35 | grad 0",
    ]


def test_output_without_replay_is_a_usage_error(tmp_path: Path) -> None:
    code, _, stderr = run("render", str(SEED004), "--output", "apb", "-o", str(tmp_path / "g.dot"))
    assert (code, stderr) == (2, "Error: --output chooses the node to differentiate: it needs --replay\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("depth", ["-1", "3"])
def test_depth_without_around_is_a_usage_error(tmp_path: Path, depth: str) -> None:
    code, _, stderr = run("render", str(SEED004), "--depth", depth, "-o", str(tmp_path / "g.dot"))
    assert (code, stderr) == (
        2,
        "Error: --depth goes with --around NODE: it limits the picture to the nodes near that one\n",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_negative_depth_is_refused_in_the_clis_words(tmp_path: Path) -> None:
    code, _, stderr = run("render", str(SEED004), "--around", "ab", "--depth", "-1", "-o", str(tmp_path / "g.dot"))
    assert (code, stderr) == (2, "Error: --depth must be 0 or more, not -1\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("around", "depth", "drawn"),
    [
        ("ab", "0", ["ab"]),
        ("ab", "1", ["a", "b", "ab", "abc"]),
        ("L", "1", ["abc", "apb", "L"]),
        ("L", "2", ["a", "b", "c", "ab", "abc", "apb", "L"]),  # abc, apb and their inputs
    ],
)
def test_around_and_depth_draw_exact_node_sets(tmp_path: Path, around: str, depth: str, drawn: list[str]) -> None:
    out = tmp_path / "g.dot"
    code, _, stderr = run("render", str(SEED004), "--around", around, "--depth", depth, "-o", str(out))
    names = [label.split(" | ")[0] for label in records(out.read_text())]
    assert code == 0
    assert names == drawn
    assert stderr == f"wrote {out} ({len(drawn)} node{'' if len(drawn) == 1 else 's'})\n"


def test_around_by_id_and_default_depth(tmp_path: Path) -> None:
    out = tmp_path / "g.dot"
    code, _, _ = run("render", str(SEED004), "--around", "2", "-o", str(out))  # c, depth 2
    assert code == 0
    assert [label.split(" | ")[0] for label in records(out.read_text())] == ["c", "ab", "abc", "L"]


def test_an_unknown_node_is_a_usage_error(tmp_path: Path) -> None:
    code, _, stderr = run("render", str(SEED004), "--around", "zz", "-o", str(tmp_path / "g.dot"))
    assert (code, stderr) == (2, "Error: no node named 'zz'\n")


def test_a_large_graph_is_refused_without_around(tmp_path: Path) -> None:
    b = GraphBuilder()
    node = b.leaf(1.0, name="x0")
    for i in range(1, 2001):
        node = b.add("neg", [node], name=f"x{i}", value=1.0)
    path = tmp_path / "big.msgpack"
    fmt.save(b.build(), path)
    out = tmp_path / "big.svg"
    code, stdout, stderr = run("render", str(path), "-o", str(out))
    assert (code, stdout) == (2, "")
    assert stderr == (
        "Error: the graph has 2001 nodes, more than one picture can show (2000); "
        "draw the neighbourhood of one node with --around NODE --depth K\n"
    )
    assert not out.exists()
    code, _, stderr = run("render", str(path), "--around", "x1000", "--depth", "1", "-o", str(tmp_path / "near.dot"))
    assert (code, stderr) == (0, f"wrote {tmp_path / 'near.dot'} (3 nodes)\n")
    # DOT text is not laid out here: .dot and standard output take the whole graph
    code, _, stderr = run("render", str(path), "-o", str(tmp_path / "big.dot"))
    assert (code, stderr) == (0, f"wrote {tmp_path / 'big.dot'} (2,001 nodes)\n")
    code, stdout, _ = run("render", str(path), "-o", "-")
    assert code == 0 and stdout.startswith("digraph") and stdout.count("label=") >= 2001


def test_a_missing_file_exits_3(tmp_path: Path) -> None:
    code, _, stderr = run("render", str(tmp_path / "nope.msgpack"), "-o", str(tmp_path / "g.svg"))
    assert (code, stderr) == (3, f"Error: {tmp_path / 'nope.msgpack'}: no such file\n")


@needs_dot
def test_svg_for_real(tmp_path: Path) -> None:
    out = tmp_path / "seed004.svg"
    code, _, stderr = run("render", str(SEED004), "--replay", "-o", str(out))
    assert (code, stderr) == (0, f"wrote {out} (7 nodes)\n")
    svg = out.read_text()
    shown = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    for text in ("a", "b", "c", "ab", "abc", "apb", "L", "data 2", "grad 22", "data 3", "grad 17", "data 35", "mul"):
        assert text in shown, text


def test_a_picture_onto_a_link_to_dev_null_exits_5_and_leaves_it_alone(tmp_path: Path) -> None:
    link = tmp_path / "out.dot"
    link.symlink_to(os.devnull)
    code, _, stderr = run("render", str(SEED004), "-o", str(link))
    assert (code, stderr) == (
        5,
        f"Error: cannot write {link}: not a regular file (it links to {os.devnull}, a character device)\n",
    )
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert os.readlink(link) == os.devnull
    assert list(tmp_path.iterdir()) == [link]


def test_missing_dot_exits_1_with_install_hint(tmp_path: Path) -> None:
    pytest.importorskip("graphviz")
    code, _, stderr = run("render", str(SEED004), "-o", str(tmp_path / "g.svg"), env={"PATH": str(tmp_path)})
    assert code == 1
    assert stderr.startswith("Error: drawing .svg needs the Graphviz `dot` program, which is not on PATH;")
    assert "apt-get install graphviz" in stderr and "brew install graphviz" in stderr
    assert "pip install" not in stderr  # the Python package is there: only the program is named
    assert list(tmp_path.iterdir()) == []


def test_the_readme_pictures_show_their_graphs() -> None:
    images = EXAMPLES.parent / "docs" / "images"
    seed004 = re.findall(r"<text[^>]*>([^<]*)</text>", (images / "seed004.svg").read_text())
    for text in ("a", "b", "c", "ab", "abc", "apb", "L", "data 35", "grad 22", "grad 17", "grad 5"):
        assert text in seed004, text
    mlp = re.findall(r"<text[^>]*>([^<]*)</text>", (images / "micrograd_mlp.svg").read_text())
    for text in ("loss", "data 18.4322", "ypred3", "pow exponent=2", "+2"):
        assert text in mlp, text


def test_the_micrograd_mlp_example_renders_around_its_loss(tmp_path: Path) -> None:
    out = tmp_path / "mlp.dot"
    code, _, stderr = run(
        "render", str(EXAMPLES / "micrograd_mlp.msgpack"), "--around", "loss", "--depth", "3", "-o", str(out)
    )
    assert (code, stderr) == (0, f"wrote {out} (11 nodes)\n")
    assert '\tv393 [label="{ loss | data 18.4322 | grad 1 }" shape=record style=bold penwidth=2]' in out.read_text()


# -- dense graphs, and no dot left behind -------------------------------------------------------------
def test_a_dense_graph_is_refused_at_once_with_the_numbers(tmp_path: Path) -> None:
    path = tmp_path / "dense.msgpack"
    fmt.save(dense_graph(600, 151), path)
    began = time.monotonic()
    code, stdout, stderr = run("render", str(path), "-o", str(tmp_path / "dense.svg"))
    assert time.monotonic() - began < 10
    assert (code, stdout) == (2, "")
    assert stderr == (
        "Error: the graph has 600 nodes and 79,124 edges, more edges than one picture can show "
        "(2,000: Graphviz would take minutes); draw the neighbourhood of one node with --around NODE --depth K\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense.msgpack"]


@needs_dot
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 128 + signal.SIGINT), (signal.SIGTERM, 128 + signal.SIGTERM)]
)
def test_a_render_stopped_while_dot_runs_leaves_no_dot_behind(tmp_path: Path, signum: int, code: int) -> None:
    """Ctrl-C (SIGINT) or SIGTERM sent to graphsvc while dot lays out a graph within the caps that
    it takes over a minute on: graphsvc ends at once, and its dot with it; no picture is written."""
    path = tmp_path / "slow.msgpack"
    fmt.save(dense_graph(200, 5), path)
    process = subprocess.Popen(
        [sys.executable, "-m", "graphsvc", "--disable-plugins", "render", str(path), "-o", str(tmp_path / "s.svg")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a shell: Ctrl-C not ignored
    )
    try:
        deadline = time.monotonic() + 30
        dots: set[int] = set()
        while not dots and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
            dots = dot_processes(parent=process.pid)
        assert len(dots) == 1, "dot did not start"
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == code, stderr
    assert dot_processes() & dots == set()  # the dot that ran is gone
    (dot,) = dots
    assert not os.path.exists(f"/proc/{dot}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.msgpack"]
