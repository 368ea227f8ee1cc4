"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest


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


def require_native(name: str) -> Any:
    """The C extension ``graphsvc._cNAME``, for tests of it: skipped where it was not built, failed
    under ``GRAPHSVC_REQUIRE_NATIVE=1`` (as for :func:`require_compiled`)."""
    import importlib

    try:
        return importlib.import_module(f"graphsvc._c{name}")
    except ImportError as exc:
        reason = f"graphsvc._c{name} was not built here ({exc}; pip builds it at install with a C compiler)"
    if os.environ.get("GRAPHSVC_REQUIRE_NATIVE") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def require_compiled() -> Any:
    """The compiled kernels (graphsvc.kernels), for tests of them: skipped where the C extensions
    were not built (no C compiler at install), except with ``GRAPHSVC_REQUIRE_NATIVE=1`` (as
    ``.ci/run`` sets it), where that fails them."""
    from graphsvc import kernels

    compiled = kernels._compiled()
    if compiled is not None:
        return compiled
    reason = "graphsvc's C extensions were not built here (pip builds them at install with a C compiler)"
    if os.environ.get("GRAPHSVC_REQUIRE_NATIVE") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


# -- plugins: keep the ones installed on this machine out of a test ---------------------------------
from graphsvc import plugins as _plugins  # noqa: E402

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
