"""What a command imports on a small graph (its start-up, which a user feels).

Each command runs as a whole process, with the installed example plugins, through a small wrapper
that calls graphsvc's console entry point and then writes the names in ``sys.modules`` to a file.
Speed itself is measured in benchmarks/bench_cli.py, not here; these tests keep the modules that
cost start-up time (pydantic ~80-90 ms, numba ~300 ms, numpy.ma ~20 ms, importlib.metadata and the
email package ~20 ms, hashlib's OpenSSL) off the small-graph path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SEED004_BACKWARD_PLAIN

SEED = "examples/seed004.msgpack"

#: Writes one module name a line (not JSON: the wrapper itself must not import json).
WRAPPER = """
import sys
from graphsvc.__main__ import main

try:
    main()
finally:
    with open({out!r}, "w", encoding="utf-8") as file:
        file.write("\\n".join(sorted(sys.modules)))
"""

#: Never imported by any command on a small graph.
NEVER = ("pydantic", "numba", "llvmlite", "importlib.metadata", "email", "rich")

BACKWARD_LISTING = SEED004_BACKWARD_PLAIN


def imported_by(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``graphsvc ARGS`` from the checkout, stdout piped as in a script; its modules at exit."""
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHSVC_", "_TYPER"))}
    run = subprocess.run(
        [sys.executable, "-c", WRAPPER.format(out=str(out)), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    return run, set(out.read_text(encoding="utf-8").splitlines())


COMMANDS = [
    ["--help"],
    ["--version"],
    ["order", SEED],
    ["inspect", SEED],
    ["validate", SEED],
    ["forward", SEED],
    ["backward", SEED],
    ["ops"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: args[0])
def test_no_command_on_a_small_graph_imports_pydantic_numba_or_importlib_metadata(
    args: list[str], tmp_path: Path
) -> None:
    run, modules = imported_by(args, tmp_path)
    assert (run.returncode, run.stderr) == (0, "")
    assert sorted(m for m in modules if m.split(".")[0] in NEVER or m in NEVER) == []


def test_backward_prints_the_gradients_and_reads_without_the_writing_modules(tmp_path: Path) -> None:
    run, modules = imported_by(["backward", SEED], tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (0, BACKWARD_LISTING, "")
    assert "graphsvc_activations" in modules  # the installed plugins were found and loaded
    assert sorted(m for m in ("graphsvc.format.atomic", "hashlib", "secrets", "numba") if m in modules) == []


@pytest.mark.parametrize(
    "args",
    [
        ["order", SEED],
        ["inspect", SEED],
        ["validate", SEED],
        ["forward", SEED],
        ["backward", SEED],
    ],
    ids=lambda args: args[0],
)
def test_numpy_ma_is_not_imported_on_a_small_graph(args: list[str], tmp_path: Path) -> None:
    run, modules = imported_by(args, tmp_path)
    assert run.returncode == 0
    assert "numpy" in modules and "numpy.ma" not in modules


def test_help_and_version_import_neither_numpy_nor_the_plugins(tmp_path: Path) -> None:
    for args in (["--help"], ["--version"]):
        run, modules = imported_by(args, tmp_path)
        assert run.returncode == 0
        assert sorted(m for m in ("numpy", "msgpack", "pluggy", "graphsvc.pluginhost") if m in modules) == []


def test_view_help_imports_neither_numpy_nor_the_server(tmp_path: Path) -> None:
    run, modules = imported_by(["view", "--help"], tmp_path)
    assert run.returncode == 0
    heavy = ("numpy", "msgpack", "pluggy", "graphsvc.pluginhost", "graphsvc.view", "http.server", "webbrowser")
    assert sorted(m for m in heavy if m in modules) == []


def test_view_serves_without_torch_or_the_plugins(tmp_path: Path) -> None:
    """Showing a graph replays nothing: neither PyTorch nor the plugins are loaded."""
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHSVC_", "_TYPER"))}
    command = [sys.executable, "-c", WRAPPER.format(out=str(out)), "view", SEED, "--no-browser"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().startswith(f"graphsvc view: serving {SEED} (7 nodes) at http://127.0.0.1:")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (0, "")
    modules = set(out.read_text(encoding="utf-8").splitlines())
    assert {"graphsvc.view.server", "graphsvc.view.model"} <= modules
    # the standard library's HTTP server reads headers with the email package: the one start-up cost it adds
    never = tuple(m for m in NEVER if m != "email")
    unwanted = [m for m in modules if m.split(".")[0] in (*never, "torch") or m.startswith("graphsvc.pluginhost")]
    assert sorted(unwanted) == []


@pytest.mark.parametrize(
    "args",
    [["order", SEED], ["forward", SEED], ["backward", SEED], ["validate", SEED], ["inspect", SEED]],
    ids=lambda args: args[0],
)
def test_text_output_imports_neither_json_nor_jsonio(args: list[str], tmp_path: Path) -> None:
    """json (~2-3 ms) is for --json, JSON graph files and float metadata only: the tab-separated
    listings and inspect's summary of seed 004 (string metadata) need none of it."""
    run, modules = imported_by(args, tmp_path)
    assert (run.returncode, run.stderr) == (0, "")
    assert ("graphsvc.console.listing" in modules) == (args[0] in ("order", "forward", "backward"))
    assert sorted(m for m in ("json", "graphsvc.format.jsonio") if m in modules) == []


def test_json_output_does_import_json(tmp_path: Path) -> None:
    """The check above can tell: with --json the same command imports both."""
    run, modules = imported_by(["backward", SEED, "--json"], tmp_path)
    assert run.returncode == 0
    assert run.stdout.startswith('{"output":6,"nodes":[{"id":6,"name":"L","op":"mul","parents":[4,5],"value":35.0,')
    assert {"json", "graphsvc.format.jsonio"} <= modules


# -- the fast paths of graphsvc.text and graphsvc.pluginhost' entry points ---------------------------------


def test_an_entry_point_value_loads_its_module_and_attribute_or_says_it_is_malformed() -> None:
    import graphsvc.pluginhost as plugins

    dist = plugins._Distribution("graphsvc-x", "1.0")
    found = plugins._EntryPoint("x", "os.path : join", dist).load()
    assert found is os.path.join
    assert plugins._EntryPoint("x", "graphsvc.text [extra]", None).load().__name__ == "graphsvc.text"
    with pytest.raises(ValueError) as raised:
        plugins._EntryPoint("bad", "not a module!", None).load()
    assert str(raised.value) == "malformed entry point bad = not a module!"
    assert plugins._EntryPoint("x", "m", dist) == ("x", "m", ("graphsvc-x", "1.0"))


@pytest.mark.parametrize(
    "args",
    [["order", SEED], ["inspect", SEED], ["validate", SEED], ["forward", SEED], ["backward", SEED], ["ops"]],
    ids=lambda args: args[0],
)
def test_a_graph_of_scalars_never_loads_the_tensor_engine(args: list[str], tmp_path: Path) -> None:
    """graphsvc.replay.arrays (~5 ms of frozen dataclasses) and the memory cache are for arrays, even with
    the conv plugin installed (registering its forward_with_residuals reads a signature only)."""
    run, modules = imported_by(args, tmp_path)
    assert (run.returncode, run.stderr) == (0, "")
    if args[0] in ("forward", "backward", "ops", "validate"):  # the commands that load the installed plugins
        assert "graphsvc_conv" in modules
    assert (
        sorted(
            m for m in ("graphsvc.replay.arrays", "graphsvc.replay.memory", "graphsvc.native._cmemory") if m in modules
        )
        == []
    )


def test_a_tensor_graph_does_load_it(tmp_path: Path) -> None:
    """The check above can tell."""
    import numpy as np

    from graphsvc import format as fmt
    from graphsvc.graph import GraphBuilder

    b = GraphBuilder()
    b.add("sum", [b.leaf(np.array([1.0, 2.0]), name="x")], name="L")
    fmt.save(b.build(), tmp_path / "t.msgpack")
    run, modules = imported_by(["backward", str(tmp_path / "t.msgpack")], tmp_path)
    assert run.returncode == 0
    assert {"graphsvc.replay.arrays", "graphsvc.replay.memory"} <= modules


@pytest.mark.parametrize("command", [["order"], ["inspect"], ["validate", "--format-only"]], ids=lambda c: c[-1])
def test_reading_a_file_loads_neither_the_op_table_nor_the_replay_kernels(command: list[str], tmp_path: Path) -> None:
    """A load checks the graph's structure with the compiled structure kernels (csrc/topo.c) alone:
    graphsvc.ops.opmath (~3 ms: the op table, its frozen rules) and the replay kernels are for replays
    (and for ``validate`` without ``--format-only``, which checks the ops as a replay does)."""
    run, modules = imported_by([*command, SEED], tmp_path)
    assert (run.returncode, run.stderr) == (0, "")
    assert "graphsvc.format.layout" in modules  # the check can tell: the file was read
    assert sorted(m for m in ("graphsvc.ops.opmath", "graphsvc.native.replay_kernels") if m in modules) == []


def test_validate_checks_the_ops_with_the_installed_plugins_and_format_only_loads_none(tmp_path: Path) -> None:
    """``validate`` says whether a replay here can run the file, so it loads the plugins (as forward
    does); ``--format-only`` checks the file alone, at the cost of reading it."""
    valid = f"{SEED}: valid graphsvc graph, 7 nodes, 8 edges\n"
    run, modules = imported_by(["validate", SEED], tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (0, valid, "")
    assert {"graphsvc_activations", "graphsvc.replay.columns"} <= modules
    run, modules = imported_by(["validate", "--format-only", SEED], tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (0, valid, "")
    assert sorted(m for m in ("pluggy", "graphsvc.pluginhost", "graphsvc_activations") if m in modules) == []
