"""Op families (graphsvc.ops.OpFamily): a plugin serves an open set of tags sharing a prefix through a
resolver the registry asks once per tag, after the ops registered by name; a resolver's fault leaves
the tag unknown with the reason; the hook that registers them, its problems, and the error for a
PyTorch operator no plugin serves."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.errors import MissingOpsError, OpError, UnknownOpError
from graphsvc.graph import GraphBuilder
from graphsvc.ops import Op, OpFamily, OpRegistry, check_family_declaration, known_family
from graphsvc.pluginhost import PluginProblem, load_registry
from graphsvc.replay.run import check_replayable

pytestmark = pytest.mark.usefixtures("no_installed_plugins")


def scale_op(tag: str) -> Op:
    """``scale.K``: x times K (``scale.2_5``: 2.5)."""
    k = float(tag.removeprefix("scale.").replace("_", "."))
    return Op(tag, 1, forward=lambda x: k * x, derivatives=lambda x, out: (k,), doc=f"x times {k}")


class Resolver:
    """A resolver that counts its calls and answers as ``answers`` says (else :func:`scale_op`)."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[str] = []
        self.answers = answers

    def __call__(self, tag: str) -> Any:
        self.calls.append(tag)
        answer = self.answers.get(tag.removeprefix("scale."), scale_op)
        if isinstance(answer, BaseException):
            raise answer
        return answer(tag) if callable(answer) else answer


def registry_with(*families: OpFamily, plugin: str = "scales", version: str | None = "1.0") -> OpRegistry:
    registry, problems = load_registry(disable_third_party=True)
    assert problems == []
    for family in families:
        registry.register_family(family, plugin=plugin, plugin_version=version)
    return registry


# -- the registry ------------------------------------------------------------------------------------------
def test_a_family_resolves_a_tag_once_and_records_its_plugin() -> None:
    resolver = Resolver()
    registry = registry_with(OpFamily("scale.", resolver, doc="x times K"))
    assert "scale.2_5" in registry
    op = registry.get("scale.2_5")
    assert (op.name, op.plugin, op.plugin_version, op.source) == ("scale.2_5", "scales", "1.0", "scales 1.0")
    assert float(op.forward(np.array([2.0]))[0]) == 5.0  # type: ignore[misc]
    assert registry.get("scale.2_5") is op
    assert resolver.calls == ["scale.2_5"]  # asked once, the answer kept
    assert "scalex" not in registry and resolver.calls == ["scale.2_5"]  # no prefix, no question
    assert [op.name for op in registry] == sorted(op.name for op in registry)  # families' ops are not listed
    assert "scale.2_5" not in [op.name for op in registry]
    assert [family.name for family in registry.families()] == ["scale.*"]
    assert repr(registry) == f"<OpRegistry of {len(registry)} ops and 1 op family>"


def test_an_op_registered_by_name_wins_over_a_family() -> None:
    resolver = Resolver()
    registry = registry_with(OpFamily("scale.", resolver))
    registry.register(Op("scale.2", 1, forward=lambda x: 20 * x, derivatives=lambda x, out: (20.0,)), plugin="mine")
    assert registry.get("scale.2").plugin == "mine"
    assert resolver.calls == []


def test_the_longest_prefix_decides() -> None:
    registry = registry_with(OpFamily("scale.", Resolver()), OpFamily("scale.big.", lambda tag: None))
    assert "scale.3" in registry
    assert "scale.big.3" not in registry
    assert registry.unknown_reason("scale.big.3") == "scales 1.0 knows no op of that name"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ValueError("boom"), "scales 1.0: its resolver raised ValueError: boom"),
        (SystemExit(3), "scales 1.0: its resolver raised SystemExit: 3"),
        (KeyboardInterrupt(), "scales 1.0: its resolver raised KeyboardInterrupt"),
        (OpError("no scale called 'x'"), "scales 1.0: no scale called 'x'"),
        (None, "scales 1.0 knows no op of that name"),
        (lambda tag: 7, "scales 1.0: its resolver returned int, not a graphsvc.ops.Op"),
        (lambda tag: scale_op("scale.2"), "scales 1.0: malformed op: its resolver returned op 'scale.2' for this tag"),
        (
            lambda tag: Op(tag, -1, forward=None),
            "scales 1.0: malformed op: op 'scale.x': arity must be a non-negative integer, not -1",
        ),
    ],
)
def test_a_resolver_fault_leaves_the_tag_unknown_with_the_reason(answer: Any, reason: str) -> None:
    answers = {"x": answer if answer is not None else (lambda tag: None)}
    registry = registry_with(OpFamily("scale.", Resolver(**answers)))
    assert "scale.x" not in registry
    assert registry.unknown_reason("scale.x") == reason
    with pytest.raises(UnknownOpError) as caught:
        registry.get("scale.x")
    assert str(caught.value) == f"unknown op 'scale.x': {reason}"
    assert "scale.3" in registry  # the family still serves its other tags


def test_a_replay_names_the_reason_and_the_graph_is_checked_before_anything_runs() -> None:
    registry = registry_with(OpFamily("scale.", Resolver(x=ValueError("boom"))))
    b = GraphBuilder()
    x = b.leaf(2.0, name="x")
    b.add("mul", [b.add("scale.x", [x], name="y"), b.add("nope", [x], name="z")], name="L")
    with pytest.raises(MissingOpsError) as caught:
        graphsvc.backward(b.build(), registry=registry)
    assert str(caught.value) == (
        "the graph uses ops not registered here: scale.x (scales 1.0: its resolver raised ValueError: boom), "
        "nope (plugin unknown); install the plugin that provides the other"
    )
    assert caught.value.exit_code == 4 and caught.value.install_hint


def test_a_replay_through_a_family_gives_the_op_s_gradients_and_records_its_plugin() -> None:
    registry = registry_with(OpFamily("scale.", Resolver()))
    b = GraphBuilder()
    x = b.leaf(2.0, name="x")
    y = b.add("scale.2_5", [x], name="y")
    b.add("mul", [y, y], name="L")
    result = graphsvc.backward(b.build(), registry=registry)
    assert (float(result.values[2]), result.grad("x")) == (25.0, 25.0)  # L = 6.25 x^2: dL/dx = 12.5 x
    assert result.op_sources["scale.2_5"].plugin == "scales"


def test_a_second_family_of_a_prefix_is_refused_naming_both() -> None:
    registry = registry_with(OpFamily("scale.", Resolver()))
    with pytest.raises(OpError) as caught:
        registry.register_family(OpFamily("scale.", Resolver()), plugin="other", plugin_version="2")
    assert (
        str(caught.value) == "op family 'scale.*' is registered by both scales 1.0 and other 2 (the first one is kept)"
    )
    assert registry.families()[0].plugin == "scales"


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ("scale.", "register() expects a graphsvc.ops.OpFamily, not str"),
        (OpFamily("", Resolver()), "an op family's prefix must be a non-empty string, not ''"),
        (OpFamily("scale.", 3), "op family 'scale.*': resolve must be a function, not 3"),  # type: ignore[arg-type]
        (OpFamily("scale.", Resolver(), doc=None), "op family 'scale.*': doc must be a string, not None"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_family_is_refused(family: Any, message: str) -> None:
    with pytest.raises(OpError) as caught:
        check_family_declaration(family)
    assert str(caught.value) == message


# -- PyTorch's operators, where no plugin serves them ------------------------------------------------------
def aten_graph(*tags: str) -> Any:
    b = GraphBuilder()
    x = b.leaf(np.ones(3), name="x")
    for i, tag in enumerate(tags):
        x = b.add(tag, [x], name=f"n{i}", attrs={"args": [{"input": 0}]})
    return b.build()


def test_a_pytorch_operator_no_plugin_serves_says_what_to_install() -> None:
    registry = registry_with()
    assert known_family("aten.embedding.default") == (
        "a PyTorch operator",
        "the graphsvc-torch plugin and PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0)",
    )
    assert known_family("atenx") is None
    with pytest.raises(MissingOpsError) as caught:
        check_replayable(aten_graph("aten.mkldnn_rnn_layer.default"), registry, "step.msgpack")
    assert str(caught.value) == (
        "step.msgpack: a valid graph file, but it cannot be replayed here: op 'aten.mkldnn_rnn_layer.default' is a "
        "PyTorch operator: replaying it needs the graphsvc-torch plugin and PyTorch "
        "(pip install ./plugins/graphsvc-torch torch==2.13.0)"
    )
    assert caught.value.exit_code == 4 and not caught.value.install_hint
    with pytest.raises(UnknownOpError) as unknown:
        registry.get("aten.embedding.default")
    assert str(unknown.value) == (
        "op 'aten.embedding.default' is a PyTorch operator: replaying it needs the graphsvc-torch plugin and "
        "PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0)"
    )


def test_several_pytorch_operators_and_another_unknown_op_are_said_together() -> None:
    registry = registry_with()
    with pytest.raises(MissingOpsError) as caught:
        graphsvc.forward(
            aten_graph("aten.embedding.default", "lstm_cell", "aten.mkldnn_rnn_layer.default"), registry=registry
        )
    assert str(caught.value) == (
        "the graph uses an op not registered here: lstm_cell (plugin unknown); install the plugin that provides it; "
        "ops 'aten.embedding.default', 'aten.mkldnn_rnn_layer.default' are PyTorch operators: replaying them needs "
        "the graphsvc-torch plugin and PyTorch (pip install ./plugins/graphsvc-torch torch==2.13.0)"
    )
    assert caught.value.install_hint


def test_a_family_of_the_known_prefix_speaks_for_its_tags() -> None:
    registry = registry_with(OpFamily("aten.", lambda tag: None), plugin="graphsvc-torch", version="0.1.0")
    with pytest.raises(MissingOpsError) as caught:
        graphsvc.forward(aten_graph("aten.nope.default"), registry=registry)
    assert str(caught.value) == (
        "the graph uses an op not registered here: aten.nope.default (graphsvc-torch 0.1.0 knows no op of that name)"
    )


# -- the hook ---------------------------------------------------------------------------------------------
SCALES_PLUGIN = """
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op, OpFamily

    __version__ = "1.0"
    CALLS = []


    def resolve(tag):
        CALLS.append(tag)
        k = float(tag.removeprefix("scale."))
        return Op(tag, 1, forward=lambda x: k * x, derivatives=lambda x, out: (k,))


    @hookimpl
    def graphsvc_register_op_families(register):
        register(OpFamily("scale.", resolve, doc="scale.K: x times K"))
"""


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_a_plugin_registers_a_family_and_ops_through_both_hooks(tmp_path: Path) -> None:
    both = write(
        tmp_path,
        "both",
        SCALES_PLUGIN
        + """

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("scale.10", 1, forward=lambda x: 10 * x, derivatives=lambda x, out: (10.0,)))
    """,
    )
    registry, problems = load_registry([both])
    assert problems == []
    family = registry.family("scale.")
    assert family is not None
    assert (family.plugin, family.plugin_version, family.doc) == ("both", "1.0", "scale.K: x times K")
    assert registry.get("scale.10").forward(np.array([1.0]))[0] == 10.0  # type: ignore[misc]
    assert registry.get("scale.3").source == "both 1.0"


def test_family_problems_are_reported_by_plugin_and_the_rest_loads(tmp_path: Path) -> None:
    first = write(tmp_path, "first", SCALES_PLUGIN)
    second = write(tmp_path, "second", SCALES_PLUGIN.replace('"1.0"', '"2.0"'))
    raising = write(
        tmp_path,
        "raising",
        """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import OpFamily

        @hookimpl
        def graphsvc_register_op_families(register):
            register(OpFamily("half.", lambda tag: None))
            raise RuntimeError("half done")
        """,
    )
    malformed = write(
        tmp_path,
        "malformed",
        """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import OpFamily

        @hookimpl
        def graphsvc_register_op_families(register):
            register("aten.")
            register(OpFamily("good.", lambda tag: None))
        """,
    )
    no_argument = write(
        tmp_path,
        "no_argument",
        """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_op_families():
            pass
        """,
    )
    registry, problems = load_registry([first, second, raising, malformed, no_argument])
    assert problems == [
        PluginProblem(
            second, "op family 'scale.*' is registered by both first 1.0 and second 2.0 (the first one is kept)"
        ),
        PluginProblem(
            raising,
            "graphsvc_register_op_families raised RuntimeError: half done (none of its op families were registered)",
        ),
        PluginProblem(malformed, "malformed op family: register() expects a graphsvc.ops.OpFamily, not str"),
        PluginProblem(
            no_argument,
            "bad hook: graphsvc_register_op_families() takes no argument, so it cannot register op families: "
            "graphsvc_register_op_families(register)",
        ),
    ]
    assert [family.name for family in registry.families()] == ["good.*", "scale.*"]
    assert registry.get("scale.3").source == "first 1.0"


def test_loading_a_plugin_asks_no_family(tmp_path: Path) -> None:
    family = write(tmp_path, "family", SCALES_PLUGIN)
    ops = write(
        tmp_path,
        "ops",
        """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("scale.7", 1, forward=lambda x: 7 * x, derivatives=lambda x, out: (7.0,)))
        """,
    )
    registry, problems = load_registry([family, ops])
    assert problems == []
    resolver = registry.families()[0].resolve
    assert resolver.__globals__["CALLS"] == []  # type: ignore[attr-defined]
    assert registry.get("scale.7").plugin == "ops"  # the op registered by name, not the family's
    assert resolver.__globals__["CALLS"] == []  # type: ignore[attr-defined]
