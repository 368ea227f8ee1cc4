"""What a command imports on a small graph (issue 13: start-up a user feels).

Each command runs as a whole process, with the installed example plugins, through a small wrapper
that calls graphsvc's console entry point and then writes the names in ``sys.modules`` to a file.
Speed itself is measured in benchmarks/bench_cli.py, not here; these tests keep the modules that
cost start-up time (pydantic ~80-90 ms, numba ~300 ms, numpy.ma ~20 ms, importlib.metadata and the
email package ~20 ms, hashlib's OpenSSL) off the small-graph path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SEED004_BACKWARD_PLAIN

ROOT = Path(__file__).resolve().parents[1]
SEED = "examples/seed004.msgpack"

WRAPPER = """
import json, sys
from graphsvc.__main__ import main

try:
    main()
finally:
    with open({out!r}, "w", encoding="utf-8") as file:
        json.dump(sorted(sys.modules), file)
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
    return run, set(json.loads(out.read_text(encoding="utf-8")))


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
    assert sorted(m for m in ("graphsvc.atomic", "hashlib", "secrets", "numba") if m in modules) == []


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
        assert sorted(m for m in ("numpy", "msgpack", "pluggy", "graphsvc.plugins") if m in modules) == []
