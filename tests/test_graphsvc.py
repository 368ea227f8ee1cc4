"""graphsvc/__init__.py: the public names, each imported from its home module on first use (PEP 562),
so ``import graphsvc`` alone costs neither numpy nor msgpack; and the example of its docstring."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib

import pytest

import graphsvc
from tests.conftest import EXAMPLES, ROOT


def test_every_public_name_has_a_home_and_is_the_home_modules_object() -> None:
    assert set(graphsvc.__all__) == set(graphsvc._HOME) | {"__version__"}
    for name, home in graphsvc._HOME.items():
        if name == "diff":  # the function, or the room graphsvc.diff once imported, which called is the function
            assert getattr(graphsvc, name) in (graphsvc.diff, importlib.import_module(home)), name
            continue
        assert getattr(graphsvc, name) is getattr(importlib.import_module(home), name), name


def test_graphsvc_diff_is_the_function_before_and_after_the_room_is_imported() -> None:
    import graphsvc.diff as room

    graph = graphsvc.load(EXAMPLES / "seed004.msgpack")
    assert graphsvc.diff(graph, graph).equal
    assert room(graph, graph, rtol=0.0, atol=0.0).equal
    assert room.diff(graph, graph).to_json()["first_divergence"] == {"values": None, "grads": None}


def test_a_name_once_used_is_a_plain_attribute() -> None:
    value = graphsvc.reverse_topological_order
    assert vars(graphsvc)["reverse_topological_order"] is value


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError) as info:
        graphsvc.nothing_here  # noqa: B018
    assert str(info.value) == "module 'graphsvc' has no attribute 'nothing_here'"
    assert not hasattr(graphsvc, "builtin")  # a module's name is not a public name


def test_the_version_is_the_projects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert graphsvc.__version__ == project["version"] == "0.1.0"


def test_importing_graphsvc_imports_none_of_its_rooms_nor_numpy_nor_msgpack() -> None:
    script = "import sys, graphsvc; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
    script += "('graphsvc', 'numpy', 'msgpack', 'pluggy') and m != 'graphsvc._version')))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout == "graphsvc\n"


def test_the_docstrings_example() -> None:
    """L = (a*b + c)*(a + b) at a=2, b=3 and c set to 2: L = 8 * 5 = 40, dL/da = b(a+b) + (ab+c) = 15 + 8."""
    graph = graphsvc.backward(graphsvc.load(EXAMPLES / "seed004.msgpack"), set={"c": 2.0})
    assert (graph.value("L"), graph.grad("a")) == (40.0, 23.0)
    assert (graph.grad("b"), graph.grad("c")) == (18.0, 5.0)  # a(a+b) + (ab+c) = 10 + 8; a + b
    assert "(40.0, 23.0)" in (graphsvc.__doc__ or "")


def test_seed_004_as_saved() -> None:
    """At the file's values a=2, b=3, c=1: L = 7 * 5 = 35, dL/da = 15 + 7 = 22, dL/db = 10 + 7 = 17, dL/dc = 5."""
    graph = graphsvc.backward(graphsvc.load(EXAMPLES / "seed004.msgpack"))
    assert graph.value("L") == 35.0
    assert [graph.grad(name) for name in ("a", "b", "c", "ab", "abc", "apb", "L")] == [
        22.0,
        17.0,
        5.0,
        5.0,
        5.0,
        7.0,
        1.0,
    ]
