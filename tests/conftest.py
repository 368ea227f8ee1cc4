"""Fixtures shared by the test modules."""

from __future__ import annotations

import functools
import importlib.util
import os
import pty
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pytest

if TYPE_CHECKING:
    from graphsvc.graph import Graph
    from graphsvc.ops import Op, OpRegistry

# Tests send Ctrl-C (SIGINT) to commands they start. Started with SIGINT ignored (nohup, a background
# job of a shell without job control), pytest would pass that on to every child, which would then
# wait out the test's timeout; with a handler here, each child starts with the default one.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN_DIR = ROOT / "schemas" / "examples"

#: ``graphsvc backward examples/seed004.msgpack``, piped: L = (a*b + c)*(a + b) at a=2, b=3, c=1.
SEED004_BACKWARD_PLAIN = (
    "6\tL\tmul\t4,5\t35.0\t1.0\n"
    "5\tapb\tadd\t0,1\t5.0\t7.0\n"
    "4\tabc\tadd\t3,2\t7.0\t5.0\n"
    "3\tab\tmul\t0,1\t6.0\t5.0\n"
    "2\tc\tleaf\t-\t1.0\t5.0\n"
    "1\tb\tleaf\t-\t3.0\t17.0\n"
    "0\ta\tleaf\t-\t2.0\t22.0\n"
)


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``graphsvc --disable-plugins ARGS`` in this process, through Typer's test runner (``env`` added
    to the environment): the exit code, standard output and standard error."""
    from typer.testing import CliRunner

    from cli import app

    result = CliRunner().invoke(app, ["--disable-plugins", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def python_m_graphsvc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m graphsvc --disable-plugins ARGS`` run from the checkout, its output piped and
    captured as text; ``GRAPHSVC_FORCE_TERMINAL`` unset, then ``env`` added."""
    environment = {k: v for k, v in os.environ.items() if k != "GRAPHSVC_FORCE_TERMINAL"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "graphsvc", "--disable-plugins", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def dense_graph(nodes: int, parents_each: int, seed: int = 0) -> Graph:
    """A graph whose node i > 0 adds min(parents_each, i) parents drawn at random from the nodes
    before it (repeats allowed): many edges on few nodes, which Graphviz's dot lays out slowly."""
    import numpy as np

    from graphsvc.graph import Graph

    rng = np.random.default_rng(seed)
    counts = np.minimum(np.full(nodes, parents_each), np.arange(nodes))
    offsets = np.zeros(nodes + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    parents = [rng.integers(0, node, count) for node, count in enumerate(counts.tolist()) if count]
    parent_ids = np.concatenate(parents).astype(np.int32) if parents else np.zeros(0, np.int32)
    return Graph(["leaf", "add"], (counts > 0).astype(np.uint16), offsets, parent_ids, np.ones(nodes))


def dot_processes(parent: int | None = None) -> set[int]:
    """The ids of the running Graphviz ``dot`` processes (all, or the children of ``parent``), read
    from /proc: a zombie (ended, not yet reaped) counts as running."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if name == "dot" and (parent is None or ppid == parent):
            found.add(int(entry.name))
    return found


def with_terminal_stderr(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ARGV from the checkout with stdout piped and stderr on a pseudo-terminal (100 columns);
    return (code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k != "GRAPHSVC_FORCE_TERMINAL"}
    environment.update({"COLUMNS": "100", **env})
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, env=environment)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child has gone and closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert process.stdout is not None
    stdout = process.stdout.read().decode()
    return process.wait(), stdout, seen.decode(errors="replace")


def graphviz_missing() -> str | None:
    """What drawing with Graphviz lacks here (its ``dot`` program, its Python package), or None."""
    lacking = []
    if shutil.which("dot") is None:
        lacking.append(
            "Graphviz's `dot` program, which is not on PATH "
            "(`apt-get install graphviz` on Debian and Ubuntu, `brew install graphviz` on macOS)"
        )
    try:
        import graphviz  # noqa: F401
    except ImportError:
        lacking.append("the graphviz Python package, a dependency of graphsvc (`pip install graphviz`)")
    return "this test draws with Graphviz and needs " + " and ".join(lacking) if lacking else None


@pytest.fixture
def graphviz_dot() -> None:
    """For tests that draw with Graphviz for real: skipped where it is missing, except with
    ``GRAPHSVC_REQUIRE_GRAPHVIZ=1`` (as ``.ci/run`` sets it), where a missing Graphviz fails them."""
    reason = graphviz_missing()
    if reason is not None:
        skip_unless_required(reason, "GRAPHSVC_REQUIRE_GRAPHVIZ")


def skip_unless_required(reason: str, variable: str) -> NoReturn:
    """Skip the test for ``reason``, except where ``variable`` is 1 (as ``.ci/run`` sets it): there
    what is missing fails the test."""
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason}; {variable}=1 makes that a failure, not a skip", pytrace=False)
    pytest.skip(reason)


#: The Chromium the browser tests drive (never one Playwright downloads).
CHROMIUM = os.environ.get("GRAPHSVC_CHROMIUM", "/usr/bin/chromium")


def browser_missing() -> str | None:
    """What driving a real browser lacks here (Chromium, the playwright package), or None."""
    lacking = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        lacking.append(f"needs Chromium at {CHROMIUM}: apt-get install chromium (or set GRAPHSVC_CHROMIUM)")
    if importlib.util.find_spec("playwright") is None:
        lacking.append("needs playwright: pip install playwright")
    return "; ".join(lacking) if lacking else None


@pytest.fixture
def browser_available() -> None:
    """For tests that load a page in Chromium: skipped where it or playwright is missing, except with
    ``GRAPHSVC_REQUIRE_BROWSER=1`` (as ``.ci/run`` sets it), where that fails them."""
    reason = browser_missing()
    if reason is not None:
        skip_unless_required(reason, "GRAPHSVC_REQUIRE_BROWSER")


#: Why a test that needs PyTorch did not run, and what to do about it.
TORCH_REASON = "needs PyTorch: pip install torch==2.13.0"
#: Set to 1 (as ``.ci/run`` does) to make a test that needs PyTorch fail where it is missing.
REQUIRE_TORCH = "GRAPHSVC_REQUIRE_TORCH"


def torch_missing() -> str | None:
    """Why PyTorch cannot be used here (not installed, or failing to import), or None.

    Looked up before it is imported: pytest puts ``tests/`` on ``sys.path``, where the folder
    ``tests/torch`` would pass for a (namespace) package named ``torch`` where PyTorch is missing;
    only a module with a file of its own (``torch/__init__.py``) is PyTorch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return f"{TORCH_REASON} (no module named 'torch')"
    try:
        import torch  # noqa: F401
    except Exception as exc:
        return f"{TORCH_REASON} ({type(exc).__name__}: {exc})"
    return None


def needs_torch(*, module_level: bool = False) -> ModuleType:
    """PyTorch, for a test that needs it: the one way the tests ask for it. Skipped where it is
    missing, except with ``GRAPHSVC_REQUIRE_TORCH=1`` (as ``.ci/run`` sets it), where that fails
    the test (``module_level``: called at the top of a test module, which it then skips or fails
    whole)."""
    reason = torch_missing()
    if reason is not None:
        if os.environ.get(REQUIRE_TORCH) == "1":
            pytest.fail(f"{reason}; {REQUIRE_TORCH}=1 makes that a failure, not a skip", pytrace=False)
        pytest.skip(TORCH_REASON, allow_module_level=module_level)
    import torch

    return torch


def have_torch() -> bool:
    """For a test that also compares with PyTorch where it is here: whether it is. Where it is
    missing, False, except under ``GRAPHSVC_REQUIRE_TORCH=1``, where that fails the test."""
    reason = torch_missing()
    if reason is not None and os.environ.get(REQUIRE_TORCH) == "1":
        pytest.fail(f"{reason}; {REQUIRE_TORCH}=1 makes that a failure, not a skip", pytrace=False)
    return reason is None


def native_missing(reason: str) -> NoReturn:
    """Skip a test of graphsvc's C extensions that were not built here, except with
    ``GRAPHSVC_REQUIRE_NATIVE=1`` (as ``.ci/run`` sets it), where that fails it."""
    skip_unless_required(reason, "GRAPHSVC_REQUIRE_NATIVE")


def require_native(name: str) -> Any:
    """The C extension ``graphsvc.native._cNAME`` as graphsvc.native's loader gives it, for tests of
    it: skipped where ``GRAPHSVC_NATIVE=0`` turns the extensions off, and where it was not built,
    which fails under ``GRAPHSVC_REQUIRE_NATIVE=1`` (as for :func:`require_compiled`)."""
    import importlib

    from graphsvc import native

    module = native.extension(name)
    if module is not None:
        return module
    if not native.enabled():
        pytest.skip(f"{native.SWITCH}=0 turns graphsvc's C extensions off")
    try:
        importlib.import_module(f"graphsvc.native._c{name}")
    except Exception as exc:
        reason = str(exc)
    else:
        reason = "it loads, but not through graphsvc.native.extension"
    native_missing(
        f"graphsvc.native._c{name} was not built here ({reason}; pip builds it at install with a C compiler)"
    )


def require_compiled() -> Any:
    """The compiled kernels (graphsvc.native), for tests of them: skipped where the C extensions
    were not built (no C compiler at install) or not from this op table (a checkout not rebuilt),
    except with ``GRAPHSVC_REQUIRE_NATIVE=1`` (as ``.ci/run`` sets it), where that fails them."""
    import graphsvc.native as kernels
    from graphsvc.ops import opmath

    if not kernels.enabled():
        pytest.skip(f"{kernels.SWITCH}=0 turns graphsvc's C extensions off")
    compiled = kernels._compiled()
    if compiled is not None and opmath.compiled_primitives():
        return compiled
    if compiled is not None:
        native_missing("graphsvc.native._creplay was built from another op table: run `python hatch_build.py`")
    native_missing("graphsvc's C extensions were not built here (pip builds them at install with a C compiler)")


# -- plugins: keep the ones installed on this machine out of a test ---------------------------------
import graphsvc.pluginhost as _plugins  # noqa: E402

_REAL_ENTRY_POINTS = _plugins._entry_points


@pytest.fixture
def no_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load only the plugins a test names: no entry points, ``GRAPHSVC_PLUGINS`` and
    ``GRAPHSVC_DISABLE_PLUGINS`` unset. A module that wants it for every test says
    ``pytestmark = pytest.mark.usefixtures("no_installed_plugins")``."""
    monkeypatch.delenv("GRAPHSVC_PLUGINS", raising=False)
    monkeypatch.delenv("GRAPHSVC_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(_plugins, "_entry_points", lambda: [])


@pytest.fixture
def installed_plugins(monkeypatch: pytest.MonkeyPatch, no_installed_plugins: None) -> None:
    """The machine's real entry points (the installed example plugins), for the tests about them;
    it runs after :func:`no_installed_plugins`, so it wins in a module that uses both."""
    monkeypatch.setattr(_plugins, "_entry_points", _REAL_ENTRY_POINTS)


# -- the builtin ops -------------------------------------------------------------------------------------
def builtin_registry() -> OpRegistry:
    """The registry of graphsvc's own ops, no plugin's (a new one on each call: a test may add to it)."""
    registry, problems = _plugins.load_registry(disable_third_party=True)
    assert problems == []
    return registry


@pytest.fixture(scope="module")
def registry() -> OpRegistry:
    """:func:`builtin_registry`, made once per test module."""
    return builtin_registry()


def primitive_ops() -> list[Op]:
    """The builtin ops whose kernel is one of the C primitives (graphsvc.ops.opmath.PRIMITIVES)."""
    return [op for op in builtin_registry() if op.kernel is not None]


def same_bits(a: Any, b: Any) -> bool:
    """The same shape and every float64 bit the same, signed zeros too; nan payloads and signs aside
    (numpy does not promise them, and C may differ in a nan's sign bit), any nan equals any nan."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all((a.view(np.uint64) == b.view(np.uint64)) | (np.isnan(a) & np.isnan(b))))


# -- graphs the tests share ------------------------------------------------------------------------------
#: Seed 004's node names in id order: L = (a*b + c)*(a + b).
SEED004_NAMES = ("a", "b", "c", "ab", "abc", "apb", "L")


def seed004_graph(
    a: float = 2.0, b: float = 3.0, c: float = 1.0, *, names: tuple[str, ...] = SEED004_NAMES, values: bool = False
) -> Graph:
    """Seed 004 (examples/seed004.msgpack) built node for node: a, b, c, ab = a*b, abc = ab + c,
    apb = a + b, L = abc * apb. ``values``: the op nodes carry their values (35.0 at L for 2, 3, 1);
    otherwise only the leaves have values."""
    from graphsvc.graph import GraphBuilder

    g = GraphBuilder()
    na, nb, nc = g.leaf(a, name=names[0]), g.leaf(b, name=names[1]), g.leaf(c, name=names[2])

    def value(v: float) -> dict[str, float]:
        return {"value": v} if values else {}

    ab = g.add("mul", [na, nb], name=names[3], **value(a * b))
    abc = g.add("add", [ab, nc], name=names[4], **value(a * b + c))
    apb = g.add("add", [na, nb], name=names[5], **value(a + b))
    g.add("mul", [abc, apb], name=names[6], **value((a * b + c) * (a + b)))
    return g.build()


class MicrogradNode:
    """micrograd's Value as graphsvc.from_micrograd sees it (it duck-types): data, grad, _op and _prev,
    here a list (its order is the set order), so the importer's tests run without micrograd."""

    def __init__(self, data: Any, prev: Iterable[Any] = (), op: Any = "", grad: Any = 0.0) -> None:
        self.data = data
        self.grad = grad
        self._prev = list(prev)
        self._op = op

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"


# -- the golden files' generator and their JSON view ------------------------------------------------------
def import_script(path: Path) -> ModuleType:
    """The Python file at ``path`` imported as a module named after it (registered in sys.modules,
    so that dataclasses and pickling in it can find it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    spec.loader.exec_module(module)
    return module


@functools.cache
def make_golden() -> ModuleType:
    """schemas/examples/make_golden.py, which makes the golden files (imported once)."""
    return import_script(GOLDEN_DIR / "make_golden.py")


def json_schema(name: str) -> Any:
    """A validator of schemas/NAME (a JSON Schema, draft 2020-12, itself checked first)."""
    import json

    import jsonschema

    schema = json.loads((ROOT / "schemas" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def as_json_view(value: Any) -> Any:
    """A decoded document with each bin payload as ``{"$bin": hex}`` (FORMAT.md, the JSON Schemas)."""
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {key: as_json_view(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_json_view(item) for item in value]
    return value


@pytest.fixture
def seed004_file() -> Graph:
    """examples/seed004.msgpack: L = (a*b + c)*(a + b) at a=2, b=3, c=1 (L = 35; gradients a=22,
    b=17, c=5), with its values and gradients stored."""
    from graphsvc.format import load

    return load(EXAMPLES / "seed004.msgpack")
