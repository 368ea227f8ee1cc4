"""graphsvc.native's one loader of the C extensions, and its one switch: ``GRAPHSVC_NATIVE=0`` turns
all six off, and then the pure-Python twins give the same output."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphsvc.native as native
from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder
from graphsvc.native import loader
from tests.conftest import ROOT, require_native

SEED = "examples/seed004.msgpack"


def test_every_module_that_runs_an_extension_gets_it_from_the_loader() -> None:
    for name in native.EXTENSIONS:
        assert native.extension(name) is require_native(name), name
    from graphsvc import value
    from graphsvc.console import listing
    from graphsvc.format import document, fastload
    from graphsvc.native import replay_kernels, topo_kernels
    from graphsvc.replay import memory

    assert listing._ctext is native.extension("text")
    assert memory._cmemory is native.extension("memory")
    assert fastload._ctable is document._ctable is native.compiled_table() is native.extension("table")
    assert value.native_walk() is native.extension("walk")
    assert topo_kernels._ctopo is native.extension("topo")
    assert replay_kernels._creplay is native.extension("replay")


def test_the_package_gives_the_loaders_functions() -> None:
    assert (native.extension, native.EXTENSIONS) == (loader.extension, loader.EXTENSIONS)


def test_the_loader_knows_each_c_file_and_no_other_name() -> None:
    assert list(native.EXTENSIONS) == sorted(path.stem for path in (ROOT / "csrc").glob("*.c"))
    with pytest.raises(ValueError, match="graphsvc has no C extension 'jit'"):
        native.extension("jit")


def _run(args: list[str], switch: str | None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHSVC_")}
    if switch is not None:
        env["GRAPHSVC_NATIVE"] = switch
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, check=False)


STATUS = """
from graphsvc import native
from graphsvc.console import listing
from graphsvc.format import document, fastload
from graphsvc.ops import opmath
from graphsvc.replay import memory
from graphsvc.value import native_walk

print(*[name for name in native.EXTENSIONS if native.extension(name) is not None])
print(native.enabled(), native.engine_for(10**6).name, native.compiled_checks().name, native.opmath_digest())
print(opmath.compiled_primitives(), listing.NATIVE, memory.available(), native_walk() is not None)
print(*[table is not None for table in (fastload._ctable, document._ctable, native.compiled_table())])
"""


def test_graphsvc_native_0_turns_every_extension_off() -> None:
    off = _run(["-c", STATUS], "0")
    lines = ["", "False reference reference None", "False False False False", "False False False"]
    assert (off.stdout.split("\n"), off.stderr) == ([*lines, ""], "")
    for name in native.EXTENSIONS:
        require_native(name)
    on = _run(["-c", STATUS], None)
    assert on.stderr == ""
    digest = native.opmath_digest()
    lines = [" ".join(native.EXTENSIONS), f"True compiled compiled {digest}", "True True True True", "True True True"]
    assert on.stdout.split("\n") == [*lines, ""]


REPLAY = """
import hashlib, sys
import graphsvc
from graphsvc.value import Value

graph = graphsvc.backward(graphsvc.load(sys.argv[1]))
print(hashlib.sha256(graph.values.tobytes() + graph.grads.tobytes()).hexdigest())
a, b = Value(2.0, name="a"), Value(3.0, name="b")
L = (a * b + 1.0) * (a + b) / (a - b).relu().max(0.5)
L.backward()
print(L.data, a.grad, b.grad, graphsvc.trace(L).num_nodes)
"""


def _big_graph(path: Path) -> None:
    """A chain past NATIVE_THRESHOLD of correctly rounded ops (their bits do not depend on libm),
    each step taking a leaf of its own."""
    b = GraphBuilder()
    node = b.leaf(0.5, name="x")
    ops = ("add", "mul", "sub", "div", "max", "mul", "min", "add")
    for i in range(native.NATIVE_THRESHOLD + 200):
        node = b.add(ops[i % len(ops)], [node, b.leaf(1.0 + (i % 13) / 16)])
        if i % 7 == 0:
            node = b.add("sqrt", [b.add("abs", [node])])
    fmt.save(b.build([node]), path)


def test_replays_loads_and_listings_are_the_same_with_the_extensions_off(tmp_path: Path) -> None:
    big = tmp_path / "big.msgpack"
    _big_graph(big)
    runs = [
        ["-c", REPLAY, str(big)],
        ["-m", "graphsvc", "backward", SEED],
        ["-m", "graphsvc", "-q", "backward", str(big)],
        ["-m", "graphsvc", "-q", "forward", str(big), "--json"],
        ["-m", "graphsvc", "-q", "order", str(big)],
        ["-m", "graphsvc", "inspect", str(big)],
    ]
    for args in runs:
        on, off = _run(args, None), _run(args, "0")
        assert (on.returncode, on.stderr) == (off.returncode, off.stderr) == (0, ""), args
        assert on.stdout == off.stdout, args
        assert on.stdout, args


def test_version_says_the_extensions_are_off() -> None:
    for name in native.EXTENSIONS:
        require_native(name)
    on = _run(["-m", "graphsvc", "--version"], None).stdout
    off = _run(["-m", "graphsvc", "--version"], "0").stdout
    built = native.built()
    assert on == f"graphsvc {importlib.import_module('graphsvc').__version__} (compiled: {', '.join(built)})\n"
    assert off == on.replace(")\n", "; off with GRAPHSVC_NATIVE=0: pure Python)\n")
