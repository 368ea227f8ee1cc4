"""graphsvc.__main__: ``python -m graphsvc`` and the ``graphsvc`` console command run the Typer app's
``run``: graphsvc.cli's in a wheel (cli.py ships inside the package), the checkout's cli.py otherwise;
any other missing module is not hidden."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

import pytest

from graphsvc.__main__ import main
from tests.conftest import SEED004_BACKWARD_PLAIN, python_m_graphsvc


def fake_cli(name: str, calls: list[str]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.run = lambda: calls.append(name)  # type: ignore[attr-defined]
    return module


def test_a_checkout_runs_the_top_level_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "graphsvc.cli", None)  # import graphsvc.cli: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "cli", fake_cli("cli", calls))
    main()
    assert calls == ["cli"]


def test_a_wheel_runs_the_cli_inside_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "graphsvc.cli", fake_cli("graphsvc.cli", calls))
    monkeypatch.setitem(sys.modules, "cli", fake_cli("cli", calls))
    main()
    assert calls == ["graphsvc.cli"]


class _BrokenCli(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds graphsvc.cli, whose own import fails for want of another module."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "graphsvc.cli" else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        raise ModuleNotFoundError("No module named 'typer'", name="typer")


def test_a_module_missing_inside_the_packaged_cli_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.delitem(sys.modules, "graphsvc.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenCli(), *sys.meta_path])
    monkeypatch.setitem(sys.modules, "cli", fake_cli("cli", calls))
    with pytest.raises(ModuleNotFoundError) as info:
        main()
    assert info.value.name == "typer"
    assert calls == []


def test_python_m_graphsvc_lists_seed_000_in_reverse_topological_order() -> None:
    result = python_m_graphsvc("order", "examples/seed000.msgpack")
    assert (result.returncode, result.stderr) == (0, "")
    assert [line.split("\t")[1] for line in result.stdout.splitlines()] == ["y", "t3", "t2", "t1", "z", "1"]
    assert result.stdout.splitlines()[0] == "5\ty\tlog\t4"


def test_python_m_graphsvc_backward_gives_seed_004s_gradients() -> None:
    result = python_m_graphsvc("backward", "examples/seed004.msgpack")
    assert (result.returncode, result.stdout, result.stderr) == (0, SEED004_BACKWARD_PLAIN, "")


def test_python_m_graphsvc_exits_with_the_clis_code(tmp_path: Path) -> None:
    missing = tmp_path / "missing.msgpack"
    result = python_m_graphsvc("order", str(missing))
    assert (result.returncode, result.stdout, result.stderr) == (3, "", f"Error: {missing}: no such file\n")
