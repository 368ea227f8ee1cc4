"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent

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
    if reason is None:
        return
    if os.environ.get("GRAPHSVC_REQUIRE_GRAPHVIZ") == "1":
        pytest.fail(f"{reason}; GRAPHSVC_REQUIRE_GRAPHVIZ=1 makes that a failure, not a skip", pytrace=False)
    pytest.skip(reason)


def native_missing(reason: str) -> NoReturn:
    """Skip a test of graphsvc's C extensions that were not built here, except with
    ``GRAPHSVC_REQUIRE_NATIVE=1`` (as ``.ci/run`` sets it), where that fails it."""
    if os.environ.get("GRAPHSVC_REQUIRE_NATIVE") == "1":
        pytest.fail(f"{reason}; GRAPHSVC_REQUIRE_NATIVE=1 makes that a failure, not a skip", pytrace=False)
    pytest.skip(reason)


def require_native(name: str) -> Any:
    """The C extension ``graphsvc.native._cNAME``, for tests of it: skipped where it was not built, failed
    under ``GRAPHSVC_REQUIRE_NATIVE=1`` (as for :func:`require_compiled`)."""
    import importlib

    try:
        return importlib.import_module(f"graphsvc.native._c{name}")
    except ImportError as exc:
        native_missing(
            f"graphsvc.native._c{name} was not built here ({exc}; pip builds it at install with a C compiler)"
        )


def require_compiled() -> Any:
    """The compiled kernels (graphsvc.native), for tests of them: skipped where the C extensions
    were not built (no C compiler at install), except with ``GRAPHSVC_REQUIRE_NATIVE=1`` (as
    ``.ci/run`` sets it), where that fails them."""
    import graphsvc.native as kernels

    compiled = kernels._compiled()
    if compiled is not None:
        return compiled
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


@pytest.fixture
def seed004_graph() -> Any:
    """examples/seed004.msgpack: L = (a*b + c)*(a + b) at a=2, b=3, c=1 (L = 35; gradients a=22,
    b=17, c=5), with its values and gradients stored."""
    from graphsvc.format import load

    return load(ROOT / "examples" / "seed004.msgpack")


@pytest.fixture
def builtin_registry() -> Any:
    """graphsvc's own ops only (no installed or named plugin)."""
    from graphsvc.pluginhost import load_registry

    registry, problems = load_registry(disable_third_party=True)
    assert problems == []
    return registry
