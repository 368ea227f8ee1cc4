"""Op families on the command line: `ops` lists each as one row (and in --json), `validate` and the
replays accept the tags a family resolves, a resolver's fault is an error naming the tag and the
reason (exit 4, never a traceback), and a file of PyTorch operators with no plugin to replay them
still inspects, orders and renders, while a replay says what to install."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import graphsvc
from cli import app
from graphsvc.graph import GraphBuilder

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("no_installed_plugins")

SCALES = """
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op, OpError, OpFamily

    __version__ = "1.0"


    def resolve(tag):
        name = tag.removeprefix("scale.")
        if name == "boom":
            raise ZeroDivisionError("division by zero")
        if name == "exit":
            raise SystemExit(2)
        if name == "bad":
            raise OpError("no scale called 'bad'")
        k = float(name.replace("_", "."))
        return Op(tag, 1, forward=lambda x: k * x, derivatives=lambda x, out: (k,), doc=f"x times {k}")


    @hookimpl
    def graphsvc_register_op_families(register):
        register(OpFamily("scale.", resolve, doc="scale.K: x times K"))
"""

TORCH_HINT = (
    "op 'aten.mkldnn_rnn_layer.default' is a PyTorch operator: replaying it needs the graphsvc-torch plugin and "
    "PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0)"
)


@pytest.fixture
def scales(tmp_path: Path) -> str:
    path = tmp_path / "scales.py"
    path.write_text(textwrap.dedent(SCALES))
    return str(path)


def graph_file(tmp_path: Path, tag: str) -> str:
    """L = y * y with y = TAG(x) at x = 2."""
    b = GraphBuilder()
    x = b.leaf(2.0, name="x")
    y = b.add(tag, [x], name="y", attrs={"args": [{"input": 0}]} if tag.startswith("aten.") else None)
    b.add("mul", [y, y], name="L")
    path = tmp_path / "g.msgpack"
    graphsvc.save(b.build(), path)
    return str(path)


def test_ops_lists_a_family_as_one_row(scales: str) -> None:
    result = runner.invoke(app, ["--plugin", scales, "ops"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "scale.*\t-\t-\tscales 1.0\tfamily" in lines
    assert [line.split("\t")[0] for line in lines] == sorted(line.split("\t")[0] for line in lines)
    result = runner.invoke(app, ["--plugin", scales, "ops", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["families"] == [
        {
            "name": "scale.*",
            "prefix": "scale.",
            "plugin": "scales",
            "plugin_version": "1.0",
            "doc": "scale.K: x times K",
        }
    ]


def test_validate_and_replays_accept_the_tags_a_family_resolves(scales: str, tmp_path: Path) -> None:
    path = graph_file(tmp_path, "scale.2_5")
    result = runner.invoke(app, ["--plugin", scales, "validate", path])
    assert (result.exit_code, result.stdout) == (0, f"{path}: valid graphsvc graph, 3 nodes, 3 edges\n")
    result = runner.invoke(app, ["--plugin", scales, "backward", path])
    assert result.exit_code == 0, result.output
    # L = (2.5 x)^2 = 25 at x = 2; dL/dy = 2y = 10, dL/dx = 12.5 x = 25
    assert result.stdout == "2\tL\tmul\t1,1\t25.0\t1.0\n1\ty\tscale.2_5\t0\t5.0\t10.0\n0\tx\tleaf\t-\t2.0\t25.0\n"


@pytest.mark.parametrize(
    ("tag", "reason"),
    [
        ("scale.boom", "scales 1.0: its resolver raised ZeroDivisionError: division by zero"),
        ("scale.exit", "scales 1.0: its resolver raised SystemExit: 2"),
        ("scale.bad", "scales 1.0: no scale called 'bad'"),
    ],
)
def test_a_resolver_fault_is_an_error_naming_the_tag(scales: str, tmp_path: Path, tag: str, reason: str) -> None:
    path = graph_file(tmp_path, tag)
    for command in ("validate", "backward"):
        result = runner.invoke(app, ["--plugin", scales, command, path])
        assert result.exit_code == 4, result.output
        prefix = f"{path}: a valid graph file, but it cannot be replayed here: " if command == "validate" else ""
        assert result.stderr == f"Error: {prefix}the graph uses an op not registered here: {tag} ({reason})\n"
        assert result.stdout == ""


def test_a_pytorch_operator_without_its_plugin(tmp_path: Path) -> None:
    path = graph_file(tmp_path, "aten.mkldnn_rnn_layer.default")
    result = runner.invoke(app, ["validate", path])
    assert (result.exit_code, result.stderr) == (
        4,
        f"Error: {path}: a valid graph file, but it cannot be replayed here: {TORCH_HINT}\n",
    )
    result = runner.invoke(app, ["backward", path])
    assert (result.exit_code, result.stderr) == (4, f"Error: {TORCH_HINT}\n")
    result = runner.invoke(app, ["--disable-plugins", "forward", path])
    assert (result.exit_code, result.stderr) == (
        4,
        f"Error: {TORCH_HINT}; and run without --disable-plugins (it keeps out every plugin, --plugin ones too)\n",
    )
    # what needs no replay works without PyTorch or the plugin
    result = runner.invoke(app, ["order", path])
    assert (result.exit_code, result.stdout) == (
        0,
        "2\tL\tmul\t1,1\n1\ty\taten.mkldnn_rnn_layer.default\t0\n0\tx\tleaf\t-\n",
    )
    result = runner.invoke(app, ["inspect", path])
    assert result.exit_code == 0, result.output
    assert "ops: aten.mkldnn_rnn_layer.default 1, leaf 1, mul 1" in result.stdout.splitlines()
    out = tmp_path / "g.dot"
    result = runner.invoke(app, ["render", path, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "aten.mkldnn_rnn_layer.default" in out.read_text()


def test_an_array_graph_of_a_pytorch_operator_inspects_without_torch(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("aten.relu.default", [x], name="y", attrs={"args": [{"input": 0}]})
    path = tmp_path / "t.msgpack"
    graphsvc.save(b.build(), path)
    result = runner.invoke(app, ["order", str(path)])
    assert (result.exit_code, result.stdout) == (0, "1\ty\taten.relu.default\t0\n0\tx\tleaf\t-\n")
