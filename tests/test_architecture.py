"""The shape of graphsvc's imports: no cycle among its modules, and no room importing a room above it.

Read from the source with :mod:`ast`, nothing imported. Every ``import`` and ``from ... import``
of a graphsvc module counts, those inside functions too (a lazy import is still a dependency);
those under ``if TYPE_CHECKING:`` do not (they never run: annotations only). ``from P import name``
is an import of the module ``P.name`` where there is one, else of ``P``; an import of ``P.m`` is not
one of its parent packages, which Python runs first: the same room's ``__init__``, or ``graphsvc``'s,
which imports only the base at run time (a test below holds it there). What the source does not
spell as an import statement is not seen: ``importlib.import_module`` (graphsvc.native's loader,
the package's lazy attributes in ``graphsvc/__init__.py``).

:data:`LAYERS` lists the layers from the bottom up; a module may import its own layer and those
below. Every module file under ``graphsvc/`` must belong to one, so a new module is placed on
purpose (a room's package covers its submodules), and docs/architecture.md's module map must list it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layers, bottom to top. An entry is a module, or a room (a package) and every module in it;
#: ``graphsvc`` itself is the package's ``__init__`` only.
LAYERS: list[tuple[str, ...]] = [
    # base: what every room may use (hookspecs names graphsvc.ops only under TYPE_CHECKING)
    (
        "graphsvc._version",
        "graphsvc.errors",
        "graphsvc.text",
        "graphsvc.files",
        "graphsvc.collector",
        "graphsvc.hookspecs",
    ),
    ("graphsvc.native",),  # the C extensions, their one loader, the sweeps' Engine
    ("graphsvc.graph", "graphsvc.topo"),  # the graph model and orderings
    ("graphsvc.format",),  # the wire format
    ("graphsvc.ops",),  # the op contract, registry, builtin ops, op math
    ("graphsvc.pluginhost",),  # plugin loading, the default registry
    ("graphsvc.replay",),  # the engines and the replay entry points
    ("graphsvc.console",),  # listings and rendering
    ("graphsvc.torch", "graphsvc.diff", "graphsvc.view"),  # rooms to come (one layer until they need more)
    ("graphsvc.value", "graphsvc.micrograd", "graphsvc.testing", "graphsvc.drawing"),  # what users import
    ("graphsvc", "graphsvc.__main__", "cli"),  # the top: the package's lazy names, the CLI
]

#: Entries of LAYERS with no module yet.
FUTURE = {"graphsvc.torch", "graphsvc.diff", "graphsvc.view"}


class Import(NamedTuple):
    """One import statement of one graphsvc module."""

    module: str
    file: str  # its path in the repository
    line: int
    target: str  # the graphsvc module it imports
    text: str  # the statement, as written

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.module} imports {self.target} ({self.text})"


def modules(root: Path) -> dict[str, Path]:
    """Every module of ``root``'s graphsvc package, and ``cli`` (the repository's cli.py), by name."""
    found = {}
    for path in sorted((root / "graphsvc").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    if (root / "cli.py").exists():
        found["cli"] = root / "cli.py"
    return found


def _runs(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``tree``, but for the bodies of ``if TYPE_CHECKING:`` (never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                yield child
                yield from _runs(child)
            continue
        yield node
        yield from _runs(node)


def imports(root: Path) -> list[Import]:
    """Every import of a graphsvc module (or of cli) by a graphsvc module or cli, as run."""
    known = modules(root)
    found = []
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _runs(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for name in dict.fromkeys(names):
                while name not in known and "." in name:  # an attribute of a module, or a C extension
                    name = name.rpartition(".")[0]
                if name in known and name != module:
                    file = path.relative_to(root).as_posix()
                    found.append(Import(module, file, node.lineno, name, ast.unparse(node)))
    return found


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module``'s layer, or None where none holds it."""
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            if module == entry or (entry != "graphsvc" and module.startswith(entry + ".")):
                return index
    return None


def layering_violations(found: list[Import]) -> list[Import]:
    """The imports of a module of a higher layer than the importer's."""
    wrong = []
    for edge in found:
        mine, theirs = layer_of(edge.module), layer_of(edge.target)
        if mine is not None and theirs is not None and theirs > mine:
            wrong.append(edge)
    return wrong


def cycle(found: list[Import]) -> list[Import] | None:
    """One cycle of imports (each importing the next, the last the first), or None."""
    edges: dict[str, list[Import]] = {}
    for edge in found:
        edges.setdefault(edge.module, []).append(edge)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Import] = []

    def visit(module: str) -> list[Import] | None:
        state[module] = 1
        for edge in edges.get(module, []):
            if state.get(edge.target) == 1:  # back to a module on the path: the cycle closes there
                start = next(i for i, step in enumerate(path) if step.module == edge.target)
                return [*path[start:], edge]
            if edge.target not in state:
                path.append(edge)
                closed = visit(edge.target)
                if closed is not None:
                    return closed
                path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state:
            closed = visit(module)
            if closed is not None:
                return closed
    return None


def _layer(module: str) -> str:
    index = layer_of(module)
    return f"layer {index} ({', '.join(LAYERS[index])})" if index is not None else "no layer"


# -- the tests -----------------------------------------------------------------------------------------
def test_no_module_imports_a_layer_above_its_own() -> None:
    wrong = [edge for edge in layering_violations(imports(ROOT))]
    assert not wrong, "imports of a higher layer (see LAYERS in tests/test_architecture.py):\n" + "\n".join(
        f"{edge}: {_layer(edge.module)} imports {_layer(edge.target)}" for edge in wrong
    )


def test_no_import_cycle() -> None:
    closed = cycle(imports(ROOT))
    assert closed is None, "an import cycle:\n" + "\n".join(map(str, closed or []))


def test_the_package_top_imports_only_the_base_at_run_time() -> None:
    """Every ``import graphsvc.x`` runs ``graphsvc/__init__.py`` first: it names the rest lazily."""
    found = [edge for edge in imports(ROOT) if edge.module == "graphsvc"]
    assert [str(edge) for edge in found if layer_of(edge.target) != 0] == []


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [name for name in modules(ROOT) if layer_of(name) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS in tests/test_architecture.py): {unplaced}"
    entries = [entry for layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries))
    names = modules(ROOT)
    missing = [
        entry
        for entry in entries
        if entry not in FUTURE and entry not in names and not any(name.startswith(entry + ".") for name in names)
    ]
    assert not missing, f"entries of LAYERS that name no module (a typo, or a room removed): {missing}"


# -- the checks catch what they should ----------------------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_an_import_inside_a_function_of_a_higher_layer_is_named_with_its_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "graphsvc/__init__.py": "",
            "graphsvc/native/__init__.py": "import os\n\n\ndef digest():\n    from ..ops.opmath import digest\n",
            "graphsvc/ops/__init__.py": "from graphsvc import native\n",
            "graphsvc/ops/opmath.py": "",
        },
    )
    wrong = layering_violations(imports(root))
    assert [str(edge) for edge in wrong] == [
        "graphsvc/native/__init__.py:5: graphsvc.native imports graphsvc.ops.opmath (from ..ops.opmath import digest)"
    ]


def test_a_cycle_through_a_lazy_import_is_found_and_type_checking_imports_are_not(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "graphsvc/__init__.py": "",
            "graphsvc/graph.py": "import typing\nif typing.TYPE_CHECKING:\n    from graphsvc import value\n",
            "graphsvc/topo.py": "from graphsvc.graph import Graph\n",
            "graphsvc/value.py": "import graphsvc.topo\n",
        },
    )
    assert cycle(imports(root)) is None
    (root / "graphsvc" / "graph.py").write_text("def f():\n    import graphsvc.topo\n", encoding="utf-8")
    closed = cycle(imports(root))
    assert closed is not None
    assert sorted(str(edge) for edge in closed) == [
        "graphsvc/graph.py:2: graphsvc.graph imports graphsvc.topo (import graphsvc.topo)",
        "graphsvc/topo.py:1: graphsvc.topo imports graphsvc.graph (from graphsvc.graph import Graph)",
    ]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("graphsvc", 10),
        ("cli", 10),
        ("graphsvc.native.loader", 1),
        ("graphsvc.ops.opmath", 4),
        ("graphsvc.nobody", None),
    ],
)
def test_a_room_holds_its_submodules_and_the_top_only_itself(module: str, layer: int | None) -> None:
    assert layer_of(module) == layer


def documented_modules(page: str) -> list[str]:
    """The ``.py`` files of the module map in ``page`` (docs/architecture.md's "The rooms, module by
    module"), each a path from the repository's root: an indented line is inside the folder above it."""
    block = page.split("## The rooms, module by module", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    folders: list[str] = []
    found = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders = [*folders[:depth], name]
        if name.endswith(".py"):
            found.append("".join(folders))
    return found


def test_the_module_map_of_docs_architecture_lists_every_module_once() -> None:
    listed = documented_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    real = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "graphsvc").rglob("*.py"))
    assert sorted(name for name in listed if name.startswith("graphsvc/")) == real
    assert len(listed) == len(set(listed))


def test_documented_modules_reads_folders_by_indentation() -> None:
    lines = ["cli.py  the app", "graphsvc/", "  a.py  x", "  room/", "    b.py  y", "  c.py  z"]
    page = "\n".join(["## The rooms, module by module", "", "```text", *lines, "```", ""])
    assert documented_modules(page) == ["cli.py", "graphsvc/a.py", "graphsvc/room/b.py", "graphsvc/c.py"]
