"""The tests mirror the rooms: every module of graphsvc has a test module of its own.

* ``graphsvc/<room>/<name>.py`` is tested by ``tests/<room>/test_<name>*.py`` (``test_<name>.py`` or
  ``test_<name>_<more>.py``);
* a room's ``graphsvc/<room>/__init__.py`` by ``tests/<room>/test_<room>*.py``;
* a top-level ``graphsvc/<name>.py`` by ``tests/test_<name>*.py`` (leading and trailing underscores
  dropped: ``__main__.py`` -> ``tests/test_main*.py``), and ``graphsvc/__init__.py`` by
  ``tests/test_graphsvc*.py``;

and one of those test modules imports the module it is named for. The few modules whose tests are
named otherwise, or that hold nothing to test, are listed below with the reason; each entry is
checked too (the test module exists and imports the module; "nothing to test" holds no code).
Test module basenames are unique across tests/: there are no ``__init__.py`` files, so pytest
imports each test module by its basename.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "graphsvc"
TESTS = ROOT / "tests"

#: Modules tested by a test module named otherwise: module (under graphsvc/) -> test module (under tests/).
ELSEWHERE = {
    # the room holds one module, the plugin host: its tests are about plugins
    "pluginhost/__init__.py": "pluginhost/test_plugins.py",
    # the array replay: its tests are the tensor graphs'
    "replay/arrays.py": "replay/test_tensors.py",
    # the column engine replays graphs of scalars: the room's main tests
    "replay/columns.py": "replay/test_replay.py",
    # holding replayed numbers against stored ones: the checks
    "replay/compare.py": "replay/test_checks.py",
    # forward and backward as the library's users call them: the API
    "replay/run.py": "replay/test_api.py",
    # the Engine (compiled kernels or the references) and its primitives: the kernels' tests
    # (tests/native/test_native.py is about the C extensions being built)
    "native/__init__.py": "native/test_kernels.py",
}

#: Modules with nothing to test (no code): module -> why.
NOTHING_TO_TEST = {
    "console/__init__.py": "the room's docstring only",
    "replay/__init__.py": "the room's docstring only",
    "_version.py": "the version string only; tests/test_graphsvc.py holds graphsvc.__version__ to pyproject.toml's",
}

#: Folders of tests/ that are not rooms of graphsvc: the CLI (cli.py) and the example plugins (plugins/).
OTHER_FOLDERS = {"cli", "plugins"}


def modules(package: Path) -> list[str]:
    """Every module of ``package``, as a path relative to it (``format/codec.py``)."""
    return sorted(path.relative_to(package).as_posix() for path in package.rglob("*.py"))


def glob_for(module: str) -> str:
    """Where the test modules named for ``module`` (a path under graphsvc/) are: ``format/test_codec*.py``
    stands for ``format/test_codec.py`` and ``format/test_codec_<more>.py`` (see :func:`named_for`)."""
    parts = module.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        room = parts[-2] if len(parts) > 1 else "graphsvc"
        return "/".join([*parts[:-1], f"test_{room}*.py"])
    return "/".join([*parts[:-1], f"test_{parts[-1].strip('_')}*.py"])


def named_for(tests: Path, module: str) -> list[Path]:
    """The test modules named for ``module``: ``test_graph.py`` and ``test_graph_*.py`` are graph.py's,
    ``test_graphsvc.py`` is not."""
    stem = glob_for(module).removesuffix("*.py")
    return sorted({*tests.glob(f"{stem}.py"), *tests.glob(f"{stem}_*.py")})


def dotted(module: str) -> str:
    """``format/codec.py`` -> ``graphsvc.format.codec``; ``console/__init__.py`` -> ``graphsvc.console``."""
    parts = ["graphsvc", *module.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(test_module: Path) -> set[str]:
    """The graphsvc modules ``test_module`` imports (``from graphsvc.replay import compare`` names
    graphsvc.replay and graphsvc.replay.compare, as either may be the module)."""
    names = set()
    for node in ast.walk(ast.parse(test_module.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name == "graphsvc" or name.startswith("graphsvc.")}


def has_code(path: Path) -> bool:
    """Does the module hold more than a docstring, imports, names bound to literals (``__version__
    = "0.1.0"``, ``version_tuple = (0, 1, 0)``) and, under ``if TYPE_CHECKING:``, type aliases?"""

    def inert(node: ast.stmt) -> bool:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return True  # a docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                return False
            return True
        if isinstance(node, ast.AnnAssign):
            return True  # a declaration: ``version: str``
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            # never run: type aliases there are no code either
            return all(inert(n) or isinstance(n, (ast.Assign, ast.AnnAssign)) for n in [*node.body, *node.orelse])
        return False

    return not all(map(inert, ast.parse(path.read_text()).body))


def problems(package: Path, tests: Path) -> list[str]:
    """What breaks the rule in ``package`` and ``tests``, one line each (empty when it holds)."""
    found = []
    for module in modules(package):
        name = dotted(module)
        if module in NOTHING_TO_TEST:
            if has_code(package / module):
                found.append(f"graphsvc/{module} is listed as having nothing to test, but it holds code")
            continue
        if module in ELSEWHERE:
            candidates = [tests / ELSEWHERE[module]]
            if not candidates[0].is_file():
                found.append(f"graphsvc/{module}: tests/{ELSEWHERE[module]}, listed as its tests, does not exist")
                continue
        else:
            candidates = named_for(tests, module)
            if not candidates:
                found.append(f"graphsvc/{module} has no test module tests/{glob_for(module)}")
                continue
        if not any(name in imported(path) for path in candidates):
            shown = ", ".join(f"tests/{path.relative_to(tests).as_posix()}" for path in candidates)
            found.append(f"graphsvc/{module}: {shown} does not import {name}")
    present = set(modules(package))
    for module in sorted((set(ELSEWHERE) | set(NOTHING_TO_TEST)) - present):
        found.append(f"graphsvc/{module} is listed as an exception but does not exist")
    return found


def test_every_module_has_a_test_module_of_its_own() -> None:
    assert problems(PACKAGE, TESTS) == []


def test_test_module_basenames_are_unique_and_tests_has_no_init_files() -> None:
    test_modules = sorted(TESTS.rglob("test_*.py"))
    names = [path.name for path in test_modules]
    assert sorted({name for name in names if names.count(name) > 1}) == []
    assert sorted(TESTS.rglob("__init__.py")) == []


def test_the_folders_of_tests_are_the_rooms() -> None:
    rooms = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    folders = {path.name for path in TESTS.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))}
    assert folders - rooms - OTHER_FOLDERS == set()
    assert rooms - folders == set()


def test_the_cli_has_its_tests_in_tests_cli() -> None:
    assert any("cli" in imported_from(path) for path in (TESTS / "cli").glob("test_cli*.py"))


def imported_from(test_module: Path) -> set[str]:
    """The modules a test module imports names from (``from cli import app``: cli)."""
    return {
        node.module
        for node in ast.walk(ast.parse(test_module.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }


# -- the rule itself, on made-up trees -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "glob", "name"),
    [
        ("format/codec.py", "format/test_codec*.py", "graphsvc.format.codec"),
        ("format/__init__.py", "format/test_format*.py", "graphsvc.format"),
        ("collector.py", "test_collector*.py", "graphsvc.collector"),
        ("__main__.py", "test_main*.py", "graphsvc.__main__"),
        ("_version.py", "test_version*.py", "graphsvc._version"),
        ("__init__.py", "test_graphsvc*.py", "graphsvc"),
    ],
)
def test_where_a_modules_tests_are_looked_for(module: str, glob: str, name: str) -> None:
    assert (glob_for(module), dotted(module)) == (glob, name)


def write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_rule_names_each_module_without_tests_and_each_test_module_that_does_not_import_its_module(
    tmp_path: Path,
) -> None:
    package, tests = tmp_path / "graphsvc", tmp_path / "tests"
    write(
        package,
        {
            "__init__.py": "X = 1\n",
            "_version.py": '__version__ = "0.1.0"\n',
            "topo.py": "def f(): pass\n",
            "graph.py": "def g(): pass\n",
            "format/__init__.py": '"""Docs."""\n',
            "format/codec.py": "def encode(): pass\n",
            "console/__init__.py": '"""The room."""\n',
            "replay/__init__.py": "def not_only_a_docstring(): pass\n",
            "replay/run.py": "def forward(): pass\n",
        },
    )
    write(
        tests,
        {
            "test_graphsvc.py": "import graphsvc\n",
            "test_topo.py": "from graphsvc.topo import f\n",
            "test_graph_more.py": "from graphsvc import topo\n",  # named for graph.py, imports another module
            "format/test_format_v2.py": "from graphsvc import format as fmt\n",
            "replay/test_replay.py": "from graphsvc.replay import columns\n",
        },
    )
    assert problems(package, tests) == [
        "graphsvc/format/codec.py has no test module tests/format/test_codec*.py",
        "graphsvc/graph.py: tests/test_graph_more.py does not import graphsvc.graph",
        "graphsvc/replay/__init__.py is listed as having nothing to test, but it holds code",
        "graphsvc/replay/run.py: tests/replay/test_api.py, listed as its tests, does not exist",
        "graphsvc/native/__init__.py is listed as an exception but does not exist",
        "graphsvc/pluginhost/__init__.py is listed as an exception but does not exist",
        "graphsvc/replay/arrays.py is listed as an exception but does not exist",
        "graphsvc/replay/columns.py is listed as an exception but does not exist",
        "graphsvc/replay/compare.py is listed as an exception but does not exist",
    ]


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ('"""Docs only."""\n', False),
        ('"""V."""\nfrom __future__ import annotations\n__version__ = version = "0.1.0"\n', False),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    X = tuple\nversion_tuple = (0, 1, 0)\nv: str\n",
            False,
        ),
        ("__version__ = get_version()\n", True),
        ("def f():\n    pass\n", True),
        ("class C:\n    pass\n", True),
        ('print("hello")\n', True),
        ("if TYPE_CHECKING:\n    def f(): pass\n", True),
    ],
)
def test_nothing_to_test_means_no_code(source: str, code: bool, tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert has_code(module) is code
