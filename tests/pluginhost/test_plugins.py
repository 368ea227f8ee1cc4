"""Plugin wiring: the fixed load order, provenance, broken plugins reported while the rest load, strict
mode, GRAPHSVC_DISABLE_PLUGINS, and the installed example plugins found through their entry points.

Installed entry points never leak into a test: conftest's ``no_installed_plugins`` replaces the
entry-point lookup with an empty list, and the few tests that want the real ones use ``installed_plugins``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import graphsvc
import graphsvc.pluginhost as plugins
from graphsvc.errors import OpError, PluginError
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op, evaluate, local_derivatives
from graphsvc.ops.builtin import BUILTIN_OPS
from graphsvc.pluginhost import PluginProblem, load_registry
from graphsvc.testing import check_registry

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

BUILTIN_NAMES = sorted(op.name for op in BUILTIN_OPS)
EXAMPLE_OPS = {
    "softplus": "graphsvc-activations",
    "gelu": "graphsvc-activations",
    "silu": "graphsvc-activations",
    "leaky_relu": "graphsvc-activations",
    "elu": "graphsvc-activations",
    "hypot": "graphsvc-binary",
    "atan2": "graphsvc-binary",
    "conv2d": "graphsvc-conv",
    "max_pool2d": "graphsvc-conv",
}

CUBE_PLUGIN = """
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    __version__ = "2.0"

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,)))
"""


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


def test_a_module_name_the_path_lacks_names_the_file_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console script's sys.path has no current folder, and graphsvc does not add it: a module
    name there fails, saying to pass the file; the same name with no such file keeps Python's words."""
    write_plugin(tmp_path, "graphsvc_test_here_plugin", CUBE_PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "graphsvc_test_here_plugin", raising=False)
    registry, problems = load_registry(["graphsvc_test_here_plugin", "graphsvc_test_nowhere_plugin"])
    assert "cube" not in registry and "graphsvc_test_here_plugin" not in sys.modules
    assert problems == [
        PluginProblem(
            "graphsvc_test_here_plugin",
            "cannot import 'graphsvc_test_here_plugin': no module of that name on Python's path "
            "(pass the file: ./graphsvc_test_here_plugin.py)",
        ),
        PluginProblem(
            "graphsvc_test_nowhere_plugin",
            "cannot import: ModuleNotFoundError: No module named 'graphsvc_test_nowhere_plugin'",
        ),
    ]
    registry, problems = load_registry(["./graphsvc_test_here_plugin.py"])
    assert (problems, registry.get("cube").plugin) == ([], "graphsvc_test_here_plugin")


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
    registry, problems = load_registry([path, "graphsvc.ops.builtin"])
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
            paths["malformed_op"], "malformed op: op 'no_derivatives': give derivatives (an elementwise op) or vjp"
        ),
        PluginProblem(paths["malformed_op"], "malformed op: register() expects a graphsvc.ops.Op, not str"),
        PluginProblem(
            paths["typo_hook"],
            "unknown hook 'graphsvc_register_op' (the hooks are graphsvc_register_ops and "
            "graphsvc_register_op_families)",
        ),
        PluginProblem(
            paths["no_hook"],
            "defines no @hookimpl graphsvc_register_ops(register) or graphsvc_register_op_families(register)",
        ),
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


# -- plugins that exit, interrupt or print ------------------------------------------------------------
#: Statements that end a plugin's import or hook without an ordinary exception, and how each is described.
ENDINGS = [
    ("import sys; sys.exit(0)", "SystemExit: 0"),
    ("import sys; sys.exit()", "SystemExit"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise GeneratorExit('bye')", "GeneratorExit: bye"),
    ("raise type('PluginBaseError', (BaseException,), {})('mine')", "PluginBaseError: mine"),
]


@pytest.mark.parametrize(("statement", "described"), ENDINGS, ids=[e[1] for e in ENDINGS])
def test_a_plugin_that_exits_or_interrupts_at_import_is_a_broken_plugin(
    tmp_path: Path, statement: str, described: str
) -> None:
    quitter = write_plugin(tmp_path, "quitter", statement)
    registry, problems = load_registry([quitter, write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)])
    assert problems == [PluginProblem(quitter, f"cannot import: {described}")]
    assert registry.get("cube").plugin == "cube_plugin"  # the plugins after it still load
    with pytest.raises(PluginError) as info:
        load_registry([quitter], strict=True)
    assert str(info.value) == f"plugin {quitter}: cannot import: {described}"


@pytest.mark.parametrize(("statement", "described"), ENDINGS, ids=[e[1] for e in ENDINGS])
def test_a_hook_that_exits_or_interrupts_is_a_broken_plugin(tmp_path: Path, statement: str, described: str) -> None:
    body = f"""
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("staged", 1, forward=abs, derivatives=lambda x, out: (1.0,)))
            {statement}
    """
    quitter = write_plugin(tmp_path, "quitter", body)
    registry, problems = load_registry([quitter, write_plugin(tmp_path, "cube_plugin", CUBE_PLUGIN)])
    assert problems == [
        PluginProblem(quitter, f"graphsvc_register_ops raised {described} (none of its ops were registered)")
    ]
    assert "staged" not in registry and "cube" in registry


def test_the_users_ctrl_c_while_a_plugin_is_imported_stops_loading(tmp_path: Path) -> None:
    # A real SIGINT, delivered while the plugin's code runs: not the plugin's failure.
    sleeper = write_plugin(
        tmp_path, "sleeper", "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n"
    )
    with pytest.raises(KeyboardInterrupt):
        load_registry([sleeper])


def test_a_module_getattr_that_exits_while_pluggy_inspects_it_is_a_broken_plugin(tmp_path: Path) -> None:
    body = """
        import sys

        def __getattr__(name):
            sys.exit(3)
    """
    path = write_plugin(tmp_path, "lazy", body)
    registry, problems = load_registry([path])
    assert [p.plugin for p in problems] == [path]
    assert "SystemExit: 3" in problems[0].message
    assert len(registry) == len(BUILTIN_OPS)


def test_what_a_plugin_prints_at_import_and_in_its_hook_goes_to_stderr_in_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = """
        print("importing chatty")
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            print("registering")
            register(Op("chatty", 1, forward=lambda x: x, derivatives=lambda x, out: (1.0,)))
    """
    path = write_plugin(tmp_path, "chatty", body)
    # the library leaves the process's stdout alone (it may be another thread's, or the caller's data) ...
    registry, problems = load_registry([path])
    assert (problems, "chatty" in registry) == ([], True)
    assert capsys.readouterr().out == "importing chatty\nregistering\n"
    # ... the CLI, whose stdout is data, sends it to stderr
    from typer.testing import CliRunner

    from cli import app

    result = CliRunner().invoke(app, ["--plugin", path, "ops", "--json"])
    assert result.exit_code == 0
    assert "chatty" in [op["name"] for op in json.loads(result.stdout)["ops"]]
    assert result.stderr == "importing chatty\nregistering\n"


def test_plugin_output_to_stderr_moves_file_descriptor_1_too(tmp_path: Path) -> None:
    code = """
import os, sys
from graphsvc.pluginhost import plugin_output_to_stderr
print("before")
with plugin_output_to_stderr():
    print("python print")
    sys.stdout.write("sys.stdout write\\n")
    os.write(1, b"fd 1 write\\n")
    print("to sys.__stdout__", file=sys.__stdout__)
print("after")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "before\nafter\n"
    assert sorted(result.stderr.splitlines()) == ["fd 1 write", "python print", "sys.stdout write", "to sys.__stdout__"]


def test_many_duplicates_are_one_problem_with_a_count(tmp_path: Path) -> None:
    body = """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            for _ in range(2):
                for i in range(25):
                    register(Op(f"dup{i}", 1, forward=abs, derivatives=lambda x, out: (1.0,)))
            for name in ("add", "sub", "mul"):
                register(Op(name, 2, forward=max, derivatives=lambda x, y, out: (1.0, 1.0)))
    """
    path = write_plugin(tmp_path, "dups", body)
    registry, problems = load_registry([path])
    assert problems == [
        PluginProblem(
            path,
            "25 ops are registered twice by dups (the first ones are kept): "
            "dup0, dup1, dup2, dup3, dup4, dup5, dup6, dup7, dup8, dup9 and 15 more",
        ),
        PluginProblem(
            path,
            f"3 ops are registered by both graphsvc {graphsvc.__version__} and dups (the first ones are kept): "
            "add, sub, mul",
        ),
    ]
    assert registry.get("dup24").plugin == "dups"


def test_an_op_whose_functions_cannot_take_its_inputs_is_refused_at_registration(tmp_path: Path) -> None:
    body = """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("binary", 2, forward=lambda x: x, derivatives=lambda x, y, out: (1.0, 1.0)))
            register(Op("unary", 1, forward=lambda x: x, derivatives=lambda x, out: (1.0,)))
    """
    path = write_plugin(tmp_path, "arity", body)
    registry, problems = load_registry([path])
    assert problems == [
        PluginProblem(
            path, "malformed op: op 'binary': forward(x) cannot take its inputs as 2 positional arguments (arity 2)"
        )
    ]
    assert "unary" in registry and "binary" not in registry


# -- the installed example plugins ---------------------------------------------------------------------
@pytest.mark.usefixtures("installed_plugins")
def test_the_example_plugins_are_found_through_their_entry_points() -> None:
    registry, problems = load_registry()
    assert problems == []
    found = {op.name: (op.plugin, op.plugin_version) for op in registry if op.name in EXAMPLE_OPS}
    assert found == {name: (dist, "0.1.0") for name, dist in EXAMPLE_OPS.items()}
    assert [op.name for op in registry if not op.vectorized] == ["gelu"]


@pytest.mark.usefixtures("installed_plugins")
def test_the_example_plugins_ops_pass_gradcheck() -> None:
    registry, _ = load_registry()
    results = check_registry(registry, EXAMPLE_OPS)
    assert [(r.op, r.ok, r.message) for r in results] == [(name, True, "") for name in EXAMPLE_OPS]


@pytest.mark.usefixtures("installed_plugins")
def test_the_per_element_gelu_matches_hand_values_and_a_vectorized_equivalent() -> None:
    registry, _ = load_registry()
    gelu = registry.get("gelu")
    x = np.array([-2.0, 0.0, 1.0, 3.5])
    out = evaluate(gelu, [x], {})
    erf = np.array([math.erf(v / math.sqrt(2)) for v in x])
    assert out.tolist() == (0.5 * x * (1 + erf)).tolist()
    assert out[2] == pytest.approx(0.8413447460685429)
    assert local_derivatives(gelu, [x], out, {})[0][1] == 0.5


@pytest.mark.usefixtures("installed_plugins")
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


def test_a_huge_multi_line_exception_is_cut_to_one_short_problem(tmp_path: Path) -> None:
    path = write_plugin(tmp_path, "verbose", 'raise ValueError("line\\n" * 10_000)')
    _, problems = load_registry([path])
    assert [p.message for p in problems] == [
        "cannot import: ValueError: " + "line\n" * 35 + "li... (50,000 characters)"
    ]


def test_overlapping_redirects_in_two_threads_restore_stdout_once_both_end() -> None:
    original = sys.stdout
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with plugins.plugin_output_to_stderr():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with plugins.plugin_output_to_stderr():
            b_in.set()
            a_out.wait(5)
            seen.append(sys.stdout is sys.stderr)  # the first one out must not restore it yet

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [True]
    assert sys.stdout is original
    assert plugins._redirects == 0


# -- finding the entry points without importlib.metadata -----------------------------------------------
def _entry_tuples(eps: object) -> list[tuple[str, str, str | None, str | None]]:
    return [
        (ep.name, ep.value, ep.dist.name if ep.dist else None, ep.dist.version if ep.dist else None)
        for ep in eps  # type: ignore[attr-defined]
    ]


def _importlib_entry_points(path: list[str], group: str) -> list[tuple[str, str, str | None, str | None]]:
    import importlib
    import importlib.metadata

    importlib.invalidate_caches()
    saved = sys.path[:]
    sys.path[:] = path
    try:
        return _entry_tuples(importlib.metadata.entry_points(group=group))
    finally:
        sys.path[:] = saved


def _install(site: Path, folder: str, metadata: str | None, entry_points: str | None) -> Path:
    info = site / folder
    info.mkdir(parents=True)
    if metadata is not None:
        (info / ("PKG-INFO" if folder.endswith(".egg-info") else "METADATA")).write_text(metadata, encoding="utf-8")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points), encoding="utf-8")
    return info


@pytest.mark.parametrize("group", ["graphsvc", "console_scripts", "pytest11"])
def test_the_scan_finds_what_importlib_metadata_finds_on_this_machine(group: str) -> None:
    found = plugins._scan_entry_points(sys.path, sys.meta_path, group)
    assert found is not None
    assert _entry_tuples(found) == _importlib_entry_points(sys.path[:], group)
    if group == "graphsvc":
        # the torch plugin where it is installed (CI installs it after the README's test command's plugins)
        torch_plugin = importlib.util.find_spec("graphsvc_torch") is not None
        assert sorted(_entry_tuples(found)) == [
            ("activations", "graphsvc_activations", "graphsvc-activations", "0.1.0"),
            ("binary", "graphsvc_binary", "graphsvc-binary", "0.1.0"),
            ("conv", "graphsvc_conv", "graphsvc-conv", "0.1.0"),
            *([("torch", "graphsvc_torch", "graphsvc-torch", "0.1.0")] if torch_plugin else []),
        ]


def test_the_scan_reads_entry_points_txt_and_metadata_as_importlib_metadata_does(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _install(
        first,
        "Alpha.Pkg-1.0.dist-info",
        "Metadata-Version: 2.1\nName: alpha.pkg\nVersion: 1.0\nSummary: a\n\nName: not a header\n",
        """
        # a comment
        [console_scripts]
        alpha = alpha_mod:main

        [graphsvc]
          first =  alpha_mod:Namespace.value [extra]
        # another comment
        second=alpha_mod
        [graphsvc.other]
        third = alpha_mod
        """,
    )
    (first / "alpha_mod.py").write_text("class Namespace:\n    value = 42\n", encoding="utf-8")
    _install(
        first, "beta-2.0.egg-info", "Metadata-Version: 1.1\nName: Beta\nVersion: 2.0b1\n", "[graphsvc]\nb = beta\n"
    )
    (first / "gamma-1.0.egg-info").write_text("Metadata-Version: 1.1\nName: gamma\nVersion: 1.0\n", encoding="utf-8")
    _install(first, "no_entry_points-1.0.dist-info", "Metadata-Version: 2.1\nName: no-entry-points\n", None)
    # the same distribution again, further down the path: importlib.metadata keeps the first one
    _install(second, "alpha_pkg-0.5.dist-info", "Name: alpha-pkg\nVersion: 0.5\n", "[graphsvc]\nold = alpha_old\n")
    _install(second, "delta-3.0.dist-info", "Name: delta\nVersion: 3.0\n", "[graphsvc]\nd = delta_mod:hook\n")
    path = [str(first), str(tmp_path / "missing"), str(second)]

    found = plugins._scan_entry_points(path, sys.meta_path)
    assert found is not None
    expected = [
        ("first", "alpha_mod:Namespace.value [extra]", "alpha.pkg", "1.0"),
        ("second", "alpha_mod", "alpha.pkg", "1.0"),
        ("b", "beta", "Beta", "2.0b1"),
        ("d", "delta_mod:hook", "delta", "3.0"),
    ]
    assert sorted(_entry_tuples(found)) == sorted(expected)
    assert sorted(_importlib_entry_points(path, "graphsvc")) == sorted(expected)

    by_name = {ep.name: ep for ep in found}
    sys.path.insert(0, str(first))
    try:
        assert by_name["first"].load() == 42
        assert by_name["second"].load().Namespace.value == 42
    finally:
        sys.path.remove(str(first))
        sys.modules.pop("alpha_mod", None)


def test_a_distribution_without_name_or_version_is_named_by_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(
        tmp_path, "nameless-1.0.dist-info", "Metadata-Version: 2.1\n", "[graphsvc]\nnameless = graphsvc_nameless\n"
    )
    (tmp_path / "graphsvc_nameless.py").write_text(textwrap.dedent(CUBE_PLUGIN), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points", lambda: plugins._scan_entry_points([str(tmp_path)], sys.meta_path))
    try:
        registry, problems = load_registry()
    finally:
        sys.modules.pop("graphsvc_nameless", None)
    assert problems == []
    # no Name/Version headers: the entry point's name, and the module's __version__
    assert (registry.get("cube").plugin, registry.get("cube").plugin_version) == ("nameless", "2.0")


def test_a_plugin_installed_or_removed_is_seen_by_the_very_next_scan(tmp_path: Path) -> None:
    path = [str(tmp_path)]
    assert plugins._scan_entry_points(path, sys.meta_path) == []
    info = _install(
        tmp_path, "graphsvc_new-1.0.dist-info", "Name: graphsvc-new\nVersion: 1.0\n", "[graphsvc]\nnew = m\n"
    )
    assert _entry_tuples(plugins._scan_entry_points(path, sys.meta_path)) == [("new", "m", "graphsvc-new", "1.0")]
    for file in info.iterdir():
        file.unlink()
    info.rmdir()
    assert plugins._scan_entry_points(path, sys.meta_path) == []


@pytest.mark.usefixtures("installed_plugins")
def test_a_zip_or_another_distribution_finder_is_left_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zipfile

    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\nVersion: 1.0\n")
        zipped.writestr("zipped-1.0.dist-info/entry_points.txt", "[graphsvc]\nz = zipped_mod\n")
    assert plugins._scan_entry_points([str(tmp_path), str(archive)], sys.meta_path) is None
    assert plugins._scan_entry_points([str(tmp_path / "old.egg")], sys.meta_path) is None

    class Finder:
        @staticmethod
        def find_distributions(context: object) -> list[object]:
            return []

    assert plugins._scan_entry_points([str(tmp_path)], [*sys.meta_path, Finder()]) is None
    # the real lookup then asks importlib.metadata, which reads the zip
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(archive)])
    assert _entry_tuples(plugins._entry_points()) == [("z", "zipped_mod", "zipped", "1.0")]


def test_a_plugin_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """Only what was opened decides (a FIFO swapped in after a look at the path is never waited for)."""
    fifo = tmp_path / "ops.py"
    os.mkfifo(fifo)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(load_registry([str(fifo)])), daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "loading the plugin blocked"
    _, problems = result[0]  # type: ignore[misc]
    assert problems == [PluginProblem(str(fifo), f"cannot import: OSError: {fifo} is a FIFO, not a regular file")]


def test_distribution_metadata_that_is_a_fifo_is_not_read(tmp_path: Path) -> None:
    info = tmp_path / "evil-1.0.dist-info"
    info.mkdir()
    os.mkfifo(info / "entry_points.txt")
    assert plugins._read_text(str(info), "entry_points.txt") is None
