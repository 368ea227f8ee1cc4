"""graphsvc.hookspecs: the pluggy markers of project "graphsvc" and its two hook specifications,
graphsvc_register_ops(register) and graphsvc_register_op_families(register). A plugin's hookimpl is
checked against them by pluggy."""

from __future__ import annotations

import inspect
from typing import Any

import pluggy
import pytest

import graphsvc
from graphsvc import hookspecs
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op, OpFamily


def manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def test_the_markers_belong_to_project_graphsvc() -> None:
    assert hookspecs.PROJECT_NAME == "graphsvc"
    assert hookspecs.hookimpl.project_name == "graphsvc"
    assert hookspecs.hookspec.project_name == "graphsvc"
    assert graphsvc.hookimpl is hookimpl


def test_the_module_specifies_two_hooks_taking_register() -> None:
    specs = [name for name, value in vars(hookspecs).items() if hasattr(value, "graphsvc_spec")]
    assert specs == ["graphsvc_register_ops", "graphsvc_register_op_families"]
    for spec in (hookspecs.graphsvc_register_ops, hookspecs.graphsvc_register_op_families):
        assert list(inspect.signature(spec).parameters) == ["register"]
        assert spec.graphsvc_spec["firstresult"] is False  # type: ignore[attr-defined]
        assert spec.graphsvc_spec["historic"] is False  # type: ignore[attr-defined]


def test_a_plugin_marked_with_hookimpl_registers_op_families() -> None:
    class Plugin:
        @hookimpl
        def graphsvc_register_op_families(self, register: Any) -> None:
            register(OpFamily("scale.", lambda tag: None, doc="x times K"))

    pm = manager()
    pm.register(Plugin(), name="scales")
    registered: list[OpFamily] = []
    assert pm.hook.graphsvc_register_op_families(register=registered.append) == []
    assert [(family.prefix, family.doc, family.name) for family in registered] == [("scale.", "x times K", "scale.*")]


def test_a_plugin_marked_with_hookimpl_is_called_with_register() -> None:
    class Plugin:
        @hookimpl
        def graphsvc_register_ops(self, register: Any) -> None:
            register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,)))

    class Other:
        @hookimpl
        def graphsvc_register_ops(self) -> None:  # a hookimpl may take fewer arguments than the spec
            pass

    pm = manager()
    pm.register(Plugin(), name="cubes")
    pm.register(Other(), name="other")
    registered: list[Op] = []
    assert (
        pm.hook.graphsvc_register_ops(register=registered.append) == []
    )  # no firstresult: every result, None left out
    assert [(op.name, op.arity) for op in registered] == [("cube", 1)]
    assert registered[0].derivatives is not None and registered[0].derivatives(2.0, 8.0) == (12.0,)


def test_a_hookimpl_with_an_argument_the_spec_does_not_have_is_refused() -> None:
    class Misspelt:
        @hookimpl
        def graphsvc_register_ops(self, regster: Any) -> None:
            pass

    with pytest.raises(pluggy.PluginValidationError) as info:
        manager().register(Misspelt(), name="misspelt")
    assert "regster" in str(info.value) and "graphsvc_register_ops" in str(info.value)


def test_a_function_marked_with_another_projects_marker_is_not_a_graphsvc_plugin() -> None:
    other = pluggy.HookimplMarker("not-graphsvc")

    class Foreign:
        @other
        def graphsvc_register_ops(self, register: Any) -> None:
            raise AssertionError("called")

    pm = manager()
    pm.register(Foreign(), name="foreign")
    assert pm.hook.graphsvc_register_ops(register=print) == []
