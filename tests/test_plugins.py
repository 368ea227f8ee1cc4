"""Plugin wiring: the fixed load order, provenance, broken plugins reported while the rest load, strict
mode, GRAPHSVC_DISABLE_PLUGINS, and the installed example plugins found through their entry points.

Installed entry points never leak into a test: an autouse fixture replaces the entry-point lookup with
an empty list, and the few tests that want the real ones restore it explicitly.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import graphsvc
from graphsvc import plugins
from graphsvc.builtin_ops import BUILTIN_OPS
from graphsvc.errors import OpError, PluginError
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op, evaluate, local_derivatives
from graphsvc.plugins import PluginProblem, load_registry
from graphsvc.testing import check_registry

REAL_ENTRY_POINTS = plugins._entry_points
BUILTIN_NAMES = sorted(op.name for op in BUILTIN_OPS)
EXAMPLE_OPS = {
    "softplus": "graphsvc-activations",
    "gelu": "graphsvc-activations",
    "silu": "graphsvc-activations",
    "leaky_relu": "graphsvc-activations",
    "elu": "graphsvc-activations",
    "hypot": "graphsvc-binary",
    "atan2": "graphsvc-binary",
}

CUBE_PLUGIN = """
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    __version__ = "2.0"

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,)))
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("GRAPHSVC_PLUGINS", raising=False)
    monkeypatch.delenv("GRAPHSVC_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [])
    yield


def write_plugin(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return str(path)


def module_registering(name: str, *ops: Op) -> ModuleType:
    module = ModuleType(name)

    @hookimpl
    def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
        for op in ops:
            register(op)

    module.graphsvc_register_ops = graphsvc_register_ops  # type: ignore[attr-defined]
    return module


def unary(name: str) -> Op:
    return Op(name, 1, forward=lambda x: x, derivatives=lambda x, out: (1.0,))


@dataclass
class FakeDist:
    name: str
    version: str


@dataclass
class FakeEntryPoint:
    name: str
    module: ModuleType | Exception
    dist: FakeDist | None = None
    value: str = field(default="")

    def load(self) -> ModuleType:
        if isinstance(self.module, Exception):
            raise self.module
        return self.module


# -- what gets loaded ------------------------------------------------------------------------------
def test_with_third_party_plugins_disabled_only_the_builtins_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plugins, "_entry_points", lambda: [FakeEntryPoint("ep", module_registering("m", unary("x")))])
    monkeypatch.setenv("GRAPHSVC_PLUGINS", write_plugin(tmp_path, "env_plugin", CUBE_PLUGIN))
    registry, problems = load_registry([write_plugin(tmp_path, "cli_plugin", CUBE_PLUGIN)], disable_third_party=True)
    assert ([op.name for op in registry], problems) == (BUILTIN_NAMES, [])


def test_graphsvc_disable_plugins_1_loads_only_the_builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "_entry_points", lambda: [FakeEntryPoint("ep", module_registering("m", unary("x")))])
    monkeypatch.setenv("GRAPHSVC_DISABLE_PLUGINS", "1")
    registry, problems = load_registry([write_plugin(tmp_path, "cli_plugin", CUBE_PLUGIN)])
    assert ([op.name for op in registry], problems) == (BUILTIN_NAMES, [])
    monkeypatch.setenv("GRAPHSVC_DISABLE_PLUGINS", "0")
    assert "cube" in load_registry([write_plugin(tmp_path, "cli_plugin", CUBE_PLUGIN)])[0]


def test_a_py_file_plugin_is_loaded_with_its_module_name_and_version(tmp_path: Path) -> None:
    registry, problems = load_registry([write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)])
    assert problems == []
    cube = registry.get("cube")
    assert (cube.plugin, cube.plugin_version) == ("cube_plugin", "2.0")
    assert registry.get("add").plugin == "graphsvc"
    assert "cube_plugin" not in sys.modules  # a plugin file does not linger as an importable module


def test_a_module_name_plugin_is_imported_and_a_missing_version_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_plugin(tmp_path, "graphsvc_test_module_plugin", CUBE_PLUGIN.replace('__version__ = "2.0"', ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "graphsvc_test_module_plugin", raising=False)
    try:
        registry, problems = load_registry(["graphsvc_test_module_plugin"])
    finally:
        sys.modules.pop("graphsvc_test_module_plugin", None)
    assert problems == []
    assert (registry.get("cube").plugin, registry.get("cube").plugin_version) == ("graphsvc_test_module_plugin", None)


def test_graphsvc_plugins_is_a_comma_separated_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_plugin(tmp_path, "first", CUBE_PLUGIN)
    second = write_plugin(tmp_path, "second", CUBE_PLUGIN.replace('"cube"', '"square"'))
    monkeypatch.setenv("GRAPHSVC_PLUGINS", f" {first} ,, {second}")
    registry, problems = load_registry()
    assert problems == []
    assert (registry.get("cube").plugin, registry.get("square").plugin) == ("first", "second")


def test_entry_points_record_the_distribution_name_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        FakeEntryPoint("with_dist", module_registering("m1", unary("one")), FakeDist("graphsvc-one", "1.5")),
        FakeEntryPoint("no_dist", module_registering("m2", unary("two"))),
    ]
    monkeypatch.setattr(plugins, "_entry_points", lambda: eps)
    registry, problems = load_registry()
    assert problems == []
    assert (registry.get("one").plugin, registry.get("one").plugin_version) == ("graphsvc-one", "1.5")
    assert (registry.get("two").plugin, registry.get("two").plugin_version) == ("no_dist", None)


def test_the_order_is_builtins_entry_points_by_name_environment_then_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    twin = unary("twin")
    eps = [
        FakeEntryPoint("b", module_registering("mb", twin), FakeDist("dist-b", "2.0")),
        FakeEntryPoint("a", module_registering("ma", twin), FakeDist("dist-a", "1.0")),
    ]
    monkeypatch.setattr(plugins, "_entry_points", lambda: eps)
    monkeypatch.setenv("GRAPHSVC_PLUGINS", write_plugin(tmp_path, "env_twin", CUBE_PLUGIN.replace('"cube"', '"twin"')))
    extra = write_plugin(tmp_path, "extra_twin", CUBE_PLUGIN.replace('"cube"', '"twin"'))
    registry, problems = load_registry([extra])
    assert registry.get("twin").plugin == "dist-a"
    assert problems == [
        PluginProblem("dist-b", "op 'twin' is registered by both dist-a 1.0 and dist-b 2.0 (the first one is kept)"),
        PluginProblem(
            str(tmp_path / "env_twin.py"),
            "op 'twin' is registered by both dist-a 1.0 and env_twin 2.0 (the first one is kept)",
        ),
        PluginProblem(extra, "op 'twin' is registered by both dist-a 1.0 and extra_twin 2.0 (the first one is kept)"),
    ]


def test_a_plugin_cannot_override_a_builtin_but_its_other_ops_load(tmp_path: Path) -> None:
    body = CUBE_PLUGIN + '        register(Op("add", 2, forward=min, derivatives=lambda x, y, out: (0.0, 0.0)))\n'
    path = write_plugin(tmp_path, "sneaky", body)
    registry, problems = load_registry([path])
    assert problems == [
        PluginProblem(
            path,
            f"op 'add' is registered by both graphsvc {graphsvc.__version__} and sneaky 2.0 (the first one is kept)",
        )
    ]
    assert registry.get("add").plugin == "graphsvc"
    assert registry.get("cube").plugin == "sneaky"


def test_the_same_plugin_given_twice_is_loaded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)
    monkeypatch.setenv("GRAPHSVC_PLUGINS", path)
    registry, problems = load_registry([path, "graphsvc.builtin_ops"])
    assert problems == []
    assert registry.get("cube").plugin == "cube_plugin"


def test_every_call_starts_from_a_fresh_registry(tmp_path: Path) -> None:
    first, _ = load_registry([write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)])
    second, _ = load_registry()
    assert "cube" in first and "cube" not in second
    assert len(second) == len(BUILTIN_OPS)


# -- broken plugins ----------------------------------------------------------------------------------
BROKEN = {
    "import_error": """
        raise ImportError("needs torch")
    """,
    "raising_hook": """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("staged", 1, forward=abs, derivatives=lambda x, out: (1.0,)))
            raise RuntimeError("boom")
    """,
    "bad_signature": """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_ops(registry):
            pass
    """,
    "no_argument": """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_ops():
            pass
    """,
    "malformed_op": """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("", 1, forward=abs, derivatives=abs))
            register(Op("neg_arity", -1, forward=abs, derivatives=abs))
            register(Op("no_derivatives", 1, forward=abs, derivatives=None))
            register("softsign")
            register(Op("fine", 1, forward=abs, derivatives=lambda x, out: (1.0,)))
    """,
    "typo_hook": """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_op(register):
            pass
    """,
    "no_hook": """
        def graphsvc_register_ops(register):  # not marked with @hookimpl
            pass
    """,
}


def test_broken_plugins_are_reported_by_name_and_the_rest_still_load(tmp_path: Path) -> None:
    paths = {name: write_plugin(tmp_path, name, body) for name, body in BROKEN.items()}
    missing = str(tmp_path / "missing.py")
    good = write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)
    registry, problems = load_registry([*paths.values(), "graphsvc_no_such_plugin", missing, good])
    assert problems == [
        PluginProblem(paths["import_error"], "cannot import: ImportError: needs torch"),
        PluginProblem(
            paths["raising_hook"],
            "graphsvc_register_ops raised RuntimeError: boom (none of its ops were registered)",
        ),
        PluginProblem(
            paths["bad_signature"],
            "bad hook: graphsvc_register_ops(registry) must take the one argument the hook passes: "
            "graphsvc_register_ops(register)",
        ),
        PluginProblem(
            paths["no_argument"],
            "bad hook: graphsvc_register_ops() takes no argument, so it cannot register ops: "
            "graphsvc_register_ops(register)",
        ),
        PluginProblem(paths["malformed_op"], "malformed op: an op's name must be a non-empty string, not ''"),
        PluginProblem(
            paths["malformed_op"], "malformed op: op 'neg_arity': arity must be a non-negative integer, not -1"
        ),
        PluginProblem(
            paths["malformed_op"], "malformed op: op 'no_derivatives': derivatives must be a function, not None"
        ),
        PluginProblem(paths["malformed_op"], "malformed op: register() expects a graphsvc.ops.Op, not str"),
        PluginProblem(
            paths["typo_hook"], "unknown hook 'graphsvc_register_op' (the only hook is graphsvc_register_ops)"
        ),
        PluginProblem(paths["no_hook"], "defines no @hookimpl graphsvc_register_ops(register)"),
        PluginProblem(
            "graphsvc_no_such_plugin", "cannot import: ModuleNotFoundError: No module named 'graphsvc_no_such_plugin'"
        ),
        PluginProblem(missing, f"cannot import: FileNotFoundError: no such file: {missing}"),
    ]
    assert "staged" not in registry  # a hook that raised commits nothing
    assert registry.get("fine").plugin == "malformed_op"  # its well-formed op still loads
    assert registry.get("cube").plugin == "cube_plugin"
    assert str(problems[0]) == f"plugin {paths['import_error']}: cannot import: ImportError: needs torch"


def test_an_entry_point_that_fails_to_import_is_named_by_its_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        FakeEntryPoint("broken", ImportError("No module named 'torch'"), FakeDist("graphsvc-torch", "0.3")),
        FakeEntryPoint("fine", module_registering("m", unary("one")), FakeDist("graphsvc-one", "1.0")),
    ]
    monkeypatch.setattr(plugins, "_entry_points", lambda: eps)
    registry, problems = load_registry()
    assert problems == [PluginProblem("graphsvc-torch", "cannot import: ImportError: No module named 'torch'")]
    assert registry.get("one").plugin == "graphsvc-one"


def test_strict_mode_makes_the_first_problem_fatal(tmp_path: Path) -> None:
    broken = write_plugin(tmp_path, "import_error", BROKEN["import_error"])
    also_broken = write_plugin(tmp_path, "raising_hook", BROKEN["raising_hook"])
    with pytest.raises(PluginError) as info:
        load_registry([write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN), broken, also_broken], strict=True)
    assert str(info.value) == f"plugin {broken}: cannot import: ImportError: needs torch"
    assert info.value.exit_code == 4


def test_strict_mode_makes_a_duplicate_fatal(tmp_path: Path) -> None:
    path = write_plugin(tmp_path, "sneaky", CUBE_PLUGIN.replace('"cube"', '"add"'))
    with pytest.raises(PluginError) as info:
        load_registry([path], strict=True)
    assert str(info.value) == (
        f"plugin {path}: op 'add' is registered by both graphsvc {graphsvc.__version__} and sneaky 2.0 "
        "(the first one is kept)"
    )


def test_register_cannot_be_called_after_the_hook_returned() -> None:
    kept: list[Callable[[Op], None]] = []
    module = ModuleType("hoarder")

    @hookimpl
    def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
        kept.append(register)

    module.graphsvc_register_ops = graphsvc_register_ops  # type: ignore[attr-defined]
    sys.modules["graphsvc_test_hoarder"] = module
    try:
        load_registry(["graphsvc_test_hoarder"])
    finally:
        del sys.modules["graphsvc_test_hoarder"]
    with pytest.raises(OpError) as info:
        kept[0](unary("late"))
    assert str(info.value) == "register() was called after graphsvc_register_ops returned; call it inside the hook"


# -- the installed example plugins ---------------------------------------------------------------------
@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "_entry_points", REAL_ENTRY_POINTS)


@pytest.mark.usefixtures("installed")
def test_the_example_plugins_are_found_through_their_entry_points() -> None:
    registry, problems = load_registry()
    assert problems == []
    found = {op.name: (op.plugin, op.plugin_version) for op in registry if op.name in EXAMPLE_OPS}
    assert found == {name: (dist, "0.1.0") for name, dist in EXAMPLE_OPS.items()}
    assert [op.name for op in registry if not op.vectorized] == ["gelu"]


@pytest.mark.usefixtures("installed")
def test_the_example_plugins_ops_pass_gradcheck() -> None:
    registry, _ = load_registry()
    results = check_registry(registry, EXAMPLE_OPS)
    assert [(r.op, r.ok, r.message) for r in results] == [(name, True, "") for name in EXAMPLE_OPS]


@pytest.mark.usefixtures("installed")
def test_the_per_element_gelu_matches_hand_values_and_a_vectorized_equivalent() -> None:
    registry, _ = load_registry()
    gelu = registry.get("gelu")
    x = np.array([-2.0, 0.0, 1.0, 3.5])
    out = evaluate(gelu, [x], {})
    erf = np.array([math.erf(v / math.sqrt(2)) for v in x])
    assert out.tolist() == (0.5 * x * (1 + erf)).tolist()
    assert out[2] == pytest.approx(0.8413447460685429)
    assert local_derivatives(gelu, [x], out, {})[0][1] == 0.5


@pytest.mark.usefixtures("installed")
def test_the_alpha_attribute_of_the_example_activations() -> None:
    registry, _ = load_registry()
    x = np.array([-2.0, 3.0])
    leaky = registry.get("leaky_relu")
    assert evaluate(leaky, [x], {}).tolist() == [-0.02, 3.0]  # default alpha 0.01
    out = evaluate(leaky, [x], {"alpha": 0.5})
    assert local_derivatives(leaky, [x], out, {"alpha": 0.5})[0].tolist() == [0.5, 1.0]
    elu = registry.get("elu")
    out = evaluate(elu, [x], {"alpha": 2.0})
    assert out[0] == pytest.approx(2.0 * math.expm1(-2.0))
    assert local_derivatives(elu, [x], out, {"alpha": 2.0})[0].tolist() == pytest.approx([2.0 * math.exp(-2.0), 1.0])
    atan2 = registry.get("atan2")
    y, xx = np.array([1.0]), np.array([1.0])
    assert evaluate(atan2, [y, xx], {})[0] == pytest.approx(math.pi / 4)
    assert [d[0] for d in local_derivatives(atan2, [y, xx], np.array([math.pi / 4]), {})] == [0.5, -0.5]
