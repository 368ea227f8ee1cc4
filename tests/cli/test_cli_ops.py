"""The `ops` and `gradcheck` commands: exit codes and exact output, plugin warnings and strict mode.

Installed entry points never leak in: conftest's ``no_installed_plugins`` replaces the entry-point lookup
with an empty list; the tests of the installed example plugins use ``installed_plugins``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("no_installed_plugins")

BUILTIN_LINES = [
    "abs\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "add\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "addmm\t3\t1\tgraphsvc 0.1.0\tvjp",
    "amax\t1\t1\tgraphsvc 0.1.0\tvjp",
    "batch_norm\t3-5\t1\tgraphsvc 0.1.0\tvjp",
    "broadcast_to\t1\t1\tgraphsvc 0.1.0\tvjp",
    "clamp\t1\t1\tgraphsvc 0.1.0\tvjp",
    "concatenate\t1+\t1\tgraphsvc 0.1.0\tvjp",
    "const\t0\t1\tgraphsvc 0.1.0\tleaf tag",
    "cos\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "div\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "exp\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "layer_norm\t3\t1\tgraphsvc 0.1.0\tvjp",
    "leaf\t0\t1\tgraphsvc 0.1.0\tleaf tag",
    "log\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "log_softmax\t1\t1\tgraphsvc 0.1.0\tvjp",
    "matmul\t2\t1\tgraphsvc 0.1.0\tvjp",
    "max\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "mean\t1\t1\tgraphsvc 0.1.0\tvjp",
    "min\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "mse_loss\t2\t1\tgraphsvc 0.1.0\tvjp",
    "mul\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "neg\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "nll_loss\t2\t1\tgraphsvc 0.1.0\tvjp",
    "pow\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "relu\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "reshape\t1\t1\tgraphsvc 0.1.0\tvjp",
    "scaled_dot_product_attention\t3-4\t1\tgraphsvc 0.1.0\tvjp",
    "sigmoid\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "sin\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "slice\t1\t1\tgraphsvc 0.1.0\tvjp",
    "softmax\t1\t1\tgraphsvc 0.1.0\tvjp",
    "sqrt\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "stack\t1+\t1\tgraphsvc 0.1.0\tvjp",
    "sub\t2\t1\tgraphsvc 0.1.0\tvectorized",
    "sum\t1\t1\tgraphsvc 0.1.0\tvjp",
    "take\t2\t1\tgraphsvc 0.1.0\tvjp",
    "tanh\t1\t1\tgraphsvc 0.1.0\tvectorized",
    "transpose\t1\t1\tgraphsvc 0.1.0\tvjp",
    "where\t3\t1\tgraphsvc 0.1.0\tvjp",
]

PLUGIN = """
    import math
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    __version__ = "2.0"

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,), version="3"))
        register(Op("bad_square", 1, forward=lambda x: x * x, derivatives=lambda x, out: (x,)))
        register(Op("expm1", 1, forward=math.expm1, derivatives=lambda x, out: (out + 1,), vectorized=False))
"""

OK_LINE = re.compile(
    r"^(?P<op>\w+) \((?P<source>[^)]*)\): ok \((?P<points>\d+) points(?P<skipped>, \d+ skipped where the forward "
    r"is not finite)?; max abs error \d\.\de[-+]\d\d, max rel error \d\.\de[-+]\d\d\)$"
)


@pytest.fixture
def plugin_file(tmp_path: Path) -> str:
    path = tmp_path / "my_ops.py"
    path.write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    return str(path)


@pytest.fixture
def broken_file(tmp_path: Path) -> str:
    path = tmp_path / "broken.py"
    path.write_text('raise RuntimeError("boom")\n', encoding="utf-8")
    return str(path)


# -- ops -----------------------------------------------------------------------------------------------
def test_ops_lists_the_builtins_sorted_by_name() -> None:
    result = runner.invoke(app, ["ops"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == BUILTIN_LINES
    assert result.stderr == ""


def test_ops_shows_each_plugins_ops_with_its_provenance(plugin_file: str) -> None:
    result = runner.invoke(app, ["--plugin", plugin_file, "ops"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "cube\t1\t3\tmy_ops 2.0\tvectorized" in lines
    assert "expm1\t1\t1\tmy_ops 2.0\tper element" in lines
    assert lines == sorted(lines)
    assert len(lines) == len(BUILTIN_LINES) + 3


def test_ops_json() -> None:
    result = runner.invoke(app, ["ops", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert list(document) == ["ops", "families"]
    assert document["families"] == []
    assert [item["name"] for item in document["ops"]] == [line.split("\t")[0] for line in BUILTIN_LINES]
    assert document["ops"][1] == {
        "name": "add",
        "arity": 2,
        "variadic": False,
        "max_arity": None,
        "version": "1",
        "plugin": "graphsvc",
        "plugin_version": "0.1.0",
        "vectorized": True,
        "doc": "x + y. Distributes the gradient: both inputs receive it unchanged.",
        "vjp": False,
    }
    ops = {item["name"]: item for item in document["ops"]}
    keys = ("name", "arity", "variadic", "max_arity", "vjp")
    assert [ops["concatenate"][key] for key in keys] == ["concatenate", 1, True, None, True]
    assert [ops["batch_norm"][key] for key in keys] == ["batch_norm", 3, True, 5, True]


def test_ops_shows_a_variadic_ops_range_of_inputs() -> None:
    """conv2d takes 2 or 3 inputs (x, weight and an optional bias): "2-3", max_arity 3 in --json."""
    pytest.importorskip("graphsvc_conv", reason="pip install ./plugins/graphsvc-conv")
    result = runner.invoke(app, ["--plugin", "graphsvc_conv", "ops"])
    assert result.exit_code == 0, result.output
    assert [line for line in result.stdout.splitlines() if line.startswith("conv2d")] == [
        "conv2d\t2-3\t1\tgraphsvc_conv 0.1.0\tvjp"
    ]
    document = json.loads(runner.invoke(app, ["--plugin", "graphsvc_conv", "ops", "--json"]).stdout)
    (conv2d,) = [op for op in document["ops"] if op["name"] == "conv2d"]
    assert [conv2d[key] for key in ("arity", "variadic", "max_arity")] == [2, True, 3]


# -- ops NAME ------------------------------------------------------------------------------------------
def test_ops_name_shows_each_op_in_full_in_the_order_asked() -> None:
    result = runner.invoke(app, ["ops", "pow", "sum", "leaf", "concatenate", "pow"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert result.stdout == (
        "op: pow\n"
        "kind: vectorized\n"
        "inputs: 1\n"
        "attributes: exponent (required)\n"
        "plugin: graphsvc 0.1.0\n"
        "version: 1\n"
        "doc:\n"
        "  x ** exponent, with a constant exponent (attribute `exponent`). nan for x < 0 and a non-integer exponent.\n"
        "\n"
        "op: sum\n"
        "kind: vjp\n"
        "inputs: 1\n"
        "attributes: axis=None, keepdims=False\n"
        "plugin: graphsvc 0.1.0\n"
        "version: 1\n"
        "doc:\n"
        "  np.sum over `axis` (default: all), keeping reduced axes with `keepdims`.\n"
        "\n"
        "op: leaf\n"
        "kind: leaf tag\n"
        "inputs: 0\n"
        "attributes: none (a leaf tag's values come from the file)\n"
        "plugin: graphsvc 0.1.0\n"
        "version: 1\n"
        "doc:\n"
        "  An input: a value a user may set (a weight, an x).\n"
        "\n"
        "op: concatenate\n"
        "kind: vjp\n"
        "inputs: 1 or more (variadic)\n"
        "attributes: axis=0\n"
        "plugin: graphsvc 0.1.0\n"
        "version: 1\n"
        "doc:\n"
        "  np.concatenate of one or more inputs along `axis` (default 0).\n"
    )


def test_ops_name_json_is_the_listings_object_with_kind_and_attributes() -> None:
    result = runner.invoke(app, ["ops", "--json", "pow", "sum"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == {
        "ops": [
            {
                "name": "pow",
                "arity": 1,
                "variadic": False,
                "max_arity": None,
                "version": "1",
                "plugin": "graphsvc",
                "plugin_version": "0.1.0",
                "vectorized": True,
                "doc": "x ** exponent, with a constant exponent (attribute `exponent`). nan for x < 0 and a "
                "non-integer exponent.",
                "vjp": False,
                "kind": "vectorized",
                "attributes": [{"name": "exponent", "required": True}],
            },
            {
                "name": "sum",
                "arity": 1,
                "variadic": False,
                "max_arity": None,
                "version": "1",
                "plugin": "graphsvc",
                "plugin_version": "0.1.0",
                "vectorized": True,
                "doc": "np.sum over `axis` (default: all), keeping reduced axes with `keepdims`.",
                "vjp": True,
                "kind": "vjp",
                "attributes": [
                    {"name": "axis", "required": False, "default": None},
                    {"name": "keepdims", "required": False, "default": False},
                ],
            },
        ]
    }
    leaf = json.loads(runner.invoke(app, ["ops", "leaf", "--json"]).stdout)["ops"][0]
    assert (leaf["kind"], leaf["attributes"]) == ("leaf tag", None)


def test_ops_name_of_a_variadic_op_with_a_maximum() -> None:
    pytest.importorskip("graphsvc_conv", reason="pip install ./plugins/graphsvc-conv")
    result = runner.invoke(app, ["--plugin", "graphsvc_conv", "ops", "conv2d", "max_pool2d"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "op: conv2d",
        "kind: vjp",
        "inputs: 2 to 3 (variadic)",
        "attributes: stride=1, padding=0",
        "plugin: graphsvc_conv 0.1.0",
    ]
    assert "attributes: kernel_size (required), stride=None, padding=0" in lines


PLUGIN_WITH_DOCS = r'''
    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    def scale(x, factor, *, shift=(0.5, float("inf")), mode=object()):
        return x * factor

    def anything(x, **attrs):
        return x

    DOC = """Scale x by `factor`.

        Then \x1b[31mshift\u202e it; a second paragraph,
          indented.
    """

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("scale\u200b", 1, forward=scale, vjp=lambda g, out, x, **a: (g,), doc=DOC, version="2\n"))
        register(Op("anything", 1, forward=anything, vjp=lambda g, out, x, **a: (g,)))
'''


def test_ops_name_escapes_what_a_plugin_wrote_and_keeps_its_whole_doc(tmp_path: Path) -> None:
    path = tmp_path / "documented.py"
    path.write_text(textwrap.dedent(PLUGIN_WITH_DOCS), encoding="utf-8")
    result = runner.invoke(app, ["--plugin", str(path), "ops", "scale\u200b", "anything"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "op: scale\\u200b\n"
        "kind: vjp\n"
        "inputs: 1\n"
        "attributes: factor (required), shift=(0.5, inf), mode=<object object at ADDR>\n"
        "plugin: documented\n"
        "version: 2\\n\n"
        "doc:\n"
        "  Scale x by `factor`.\n"
        "\n"
        "  Then \\x1b[31mshift\\u202e it; a second paragraph,\n"
        "    indented.\n"
        "\n"
        "op: anything\n"
        "kind: vjp\n"
        "inputs: 1\n"
        "attributes: any (not checked)\n"
        "plugin: documented\n"
        "version: 1\n"
        "doc:\n"
        "  (none)\n"
    ).replace("ADDR", re.search(r"<object object at (0x[0-9a-f]+)>", result.stdout).group(1))  # type: ignore[union-attr]
    document = json.loads(runner.invoke(app, ["--plugin", str(path), "ops", "--json", "scale\u200b"]).stdout)
    (scale,) = document["ops"]
    assert scale["attributes"] == [
        {"name": "factor", "required": True},
        {"name": "shift", "required": False, "default": [0.5, "inf"]},
        {"name": "mode", "required": False, "default": {"repr": scale["attributes"][2]["default"]["repr"]}},
    ]
    assert scale["attributes"][2]["default"]["repr"].startswith("<object object at 0x")
    assert scale["doc"].startswith("Scale x by `factor`.\n\n    Then \x1b[31mshift\u202e")


def test_ops_name_unknown_says_did_you_mean_and_exits_4() -> None:
    result = runner.invoke(app, ["ops", "pow", "ad"])
    assert (result.exit_code, result.stdout) == (4, "")
    assert result.stderr == (
        "Error: unknown op 'ad': no loaded plugin registers it; did you mean 'add'? (see `graphsvc ops`)\n"
    )
    far = runner.invoke(app, ["ops", "--json", "zzzzz"])
    assert (far.exit_code, far.stdout) == (4, "")
    assert far.stderr == "Error: unknown op 'zzzzz': no loaded plugin registers it (see `graphsvc ops`)\n"


def test_a_broken_plugin_is_a_warning_and_everything_else_loads(plugin_file: str, broken_file: str) -> None:
    result = runner.invoke(app, ["--plugin", broken_file, "--plugin", plugin_file, "ops"])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"Warning: plugin {broken_file}: cannot import: RuntimeError: boom\n"
    assert "cube\t1\t3\tmy_ops 2.0\tvectorized" in result.stdout.splitlines()


def test_strict_plugins_makes_a_broken_plugin_exit_4(broken_file: str) -> None:
    result = runner.invoke(app, ["--strict-plugins", "--plugin", broken_file, "ops"])
    assert result.exit_code == 4
    assert result.stdout == ""
    assert result.stderr == f"Error: plugin {broken_file}: cannot import: RuntimeError: boom\n"


@pytest.mark.parametrize(
    ("statement", "described"),
    [("import sys; sys.exit(0)", "SystemExit: 0"), ("raise KeyboardInterrupt", "KeyboardInterrupt")],
)
def test_a_plugin_that_exits_at_import_is_a_warning_not_a_silent_exit(
    tmp_path: Path, plugin_file: str, statement: str, described: str
) -> None:
    quitter = tmp_path / "quitter.py"
    quitter.write_text(f'print("hello from quitter")\n{statement}\n', encoding="utf-8")
    result = runner.invoke(app, ["--plugin", str(quitter), "--plugin", plugin_file, "ops", "--json"])
    assert result.exit_code == 0, result.output
    assert "cube" in [op["name"] for op in json.loads(result.stdout)["ops"]]
    assert result.stderr == f"hello from quitter\nWarning: plugin {quitter}: cannot import: {described}\n"
    strict = runner.invoke(app, ["--strict-plugins", "--plugin", str(quitter), "ops"])
    assert (strict.exit_code, strict.stdout) == (4, "")
    assert strict.stderr == f"hello from quitter\nError: plugin {quitter}: cannot import: {described}\n"


def test_gradcheck_of_an_op_that_exits_fails_with_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "exits.py"
    path.write_text(
        "import sys\n"
        "from graphsvc.hookspecs import hookimpl\n"
        "from graphsvc.ops import Op\n"
        "@hookimpl\n"
        "def graphsvc_register_ops(register):\n"
        "    register(Op('quit', 1, forward=lambda x: sys.exit(2), derivatives=lambda x, out: (1.0,)))\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["--plugin", str(path), "gradcheck", "--op", "quit"])
    assert result.exit_code == 1
    assert result.stdout == "quit (exits): FAIL: op 'quit' (exits): forward raised SystemExit: 2\n"
    assert result.stderr == "Error: gradcheck failed for 1 of 1 op: quit\n"


def test_disable_plugins_by_option_or_environment(plugin_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["--disable-plugins", "--plugin", plugin_file, "ops"])
    assert (result.exit_code, result.stdout.splitlines()) == (0, BUILTIN_LINES)
    monkeypatch.setenv("GRAPHSVC_PLUGINS", plugin_file)
    monkeypatch.setenv("GRAPHSVC_DISABLE_PLUGINS", "1")
    result = runner.invoke(app, ["ops"])
    assert (result.exit_code, result.stdout.splitlines()) == (0, BUILTIN_LINES)


def test_a_duplicate_op_is_a_warning_naming_both_plugins(tmp_path: Path) -> None:
    path = tmp_path / "sneaky.py"
    path.write_text(textwrap.dedent(PLUGIN).replace('"cube"', '"add"'), encoding="utf-8")
    result = runner.invoke(app, ["--plugin", str(path), "ops"])
    assert result.exit_code == 0
    assert result.stderr == (
        f"Warning: plugin {path}: op 'add' is registered by both graphsvc 0.1.0 and sneaky 2.0 "
        "(the first one is kept)\n"
    )
    assert "add\t2\t1\tgraphsvc 0.1.0\tvectorized" in result.stdout.splitlines()


# -- gradcheck -------------------------------------------------------------------------------------------
def test_gradcheck_passes_every_builtin() -> None:
    result = runner.invoke(app, ["gradcheck"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    matches = [OK_LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [(m["op"], m["source"]) for m in matches if m] == [
        (line.split("\t")[0], "graphsvc 0.1.0") for line in BUILTIN_LINES if "leaf tag" not in line
    ]


def test_gradcheck_of_named_ops_in_the_order_given() -> None:
    result = runner.invoke(app, ["gradcheck", "--op", "log", "--op", "mul", "--op", "leaf"])
    assert result.exit_code == 0, result.output
    log, mul, leaf = result.stdout.splitlines()
    log_match, mul_match = OK_LINE.match(log), OK_LINE.match(mul)
    assert (
        log_match
        and log_match["points"] == "3"
        and log_match["skipped"] == ", 2 skipped where the forward is not finite"
    )
    assert mul_match and mul_match["points"] == "20" and mul_match["skipped"] is None
    assert leaf == "leaf (graphsvc 0.1.0): nothing to check (a leaf tag)"


def test_gradcheck_exits_1_naming_the_ops_that_fail(plugin_file: str) -> None:
    result = runner.invoke(
        app, ["--plugin", plugin_file, "gradcheck", "--op", "bad_square", "--op", "cube", "--op", "expm1"]
    )
    assert result.exit_code == 1
    bad, cube, expm1 = result.stdout.splitlines()
    assert bad == (
        "bad_square (my_ops 2.0): FAIL: d/d(input 0) at (-1.7): derivatives give -1.7, finite differences give -3.4"
    )
    assert OK_LINE.match(cube) and OK_LINE.match(expm1)
    assert result.stderr == "Error: gradcheck failed for 1 of 3 ops: bad_square\n"


def test_gradcheck_reports_a_float16_forward_as_a_replay_does(tmp_path: Path) -> None:
    """It reported "vjp gives 1.28085, finite differences give 0": the output was cast to float64."""
    path = tmp_path / "halves.py"
    path.write_text(
        textwrap.dedent(
            """
            import numpy as np
            from graphsvc.hookspecs import hookimpl
            from graphsvc.ops import Op

            def samples(rng):
                return [((rng.standard_normal((2, 3)),), {})]

            @hookimpl
            def graphsvc_register_ops(register):
                register(Op("half", 1, forward=lambda x: (2 * x).astype(np.float16), vjp=lambda g, out, x: (2 * g,),
                            samples=samples))
                register(Op("halfe", 1, forward=lambda x: (2 * x).astype(np.float16),
                            derivatives=lambda x, out: (2.0,)))
            """
        ),
        encoding="utf-8",
    )
    result = runner.invoke(app, ["--plugin", str(path), "gradcheck", "--op", "half", "--op", "halfe"])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"{name} (halves): FAIL: op '{name}' (halves): forward returned an array of float16, "
        "not an array of float64, float32 or int64"
        for name in ("half", "halfe")
    ]
    assert result.stderr == "Error: gradcheck failed for 2 of 2 ops: half, halfe\n"


def test_gradcheck_json(plugin_file: str) -> None:
    result = runner.invoke(app, ["--plugin", plugin_file, "gradcheck", "--op", "bad_square", "--op", "cube", "--json"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert (document["ok"], document["failed"]) == (False, ["bad_square"])
    assert [(item["op"], item["ok"], item["points"], item["plugin"]) for item in document["ops"]] == [
        ("bad_square", False, 5, "my_ops"),
        ("cube", True, 5, "my_ops"),
    ]


def test_gradcheck_of_an_unknown_op_exits_4() -> None:
    result = runner.invoke(app, ["gradcheck", "--op", "softplus"])
    assert result.exit_code == 4
    assert result.stderr == "Error: unknown op 'softplus': no loaded plugin registers it (see `graphsvc ops`)\n"


@pytest.mark.usefixtures("installed_plugins")
def test_the_installed_example_plugins_pass_gradcheck() -> None:
    names = ["softplus", "gelu", "silu", "leaky_relu", "elu", "hypot", "atan2"]
    result = runner.invoke(app, ["gradcheck", *(arg for name in names for arg in ("--op", name))])
    assert result.exit_code == 0, result.output
    sources = [m["source"] for m in map(OK_LINE.match, result.stdout.splitlines()) if m]
    assert sources == ["graphsvc-activations 0.1.0"] * 5 + ["graphsvc-binary 0.1.0"] * 2


# -- help and start-up -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["ops", "gradcheck"])
def test_help_has_an_example(command: str) -> None:
    result = runner.invoke(app, [command, "-h"])
    assert result.exit_code == 0
    assert f"Example: graphsvc --plugin my_ops.py {command}" in result.stdout


def test_cli_start_up_imports_neither_numpy_nor_plugins() -> None:
    watched = ("numpy", "pluggy", "graphsvc.pluginhost", "graphsvc.ops")
    code = f"import sys, cli; print(sorted(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]
    )
    assert out.stdout == "[]\n"


def test_what_an_op_prints_during_gradcheck_goes_to_stderr_and_names_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "chatty.py"
    path.write_text(
        textwrap.dedent(
            """
            import os
            from graphsvc.hookspecs import hookimpl
            from graphsvc.ops import Op

            def forward(x):
                print("computing")
                os.write(1, b"")  # nothing, but through the file descriptor
                return x * x

            @hookimpl
            def graphsvc_register_ops(register):
                register(Op("sq\\x1b]0;T\\x07", 1, forward=forward, derivatives=lambda x, out: (2 * x,)))
            """
        ),
        encoding="utf-8",
    )
    result = runner.invoke(app, ["--plugin", str(path), "gradcheck", "--op", "sq\x1b]0;T\x07", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["ops"][0]["op"] == "sq\x1b]0;T\x07"  # JSON escapes it
    assert set(result.stderr.splitlines()) == {"computing"}
    text = runner.invoke(app, ["--plugin", str(path), "gradcheck", "--op", "sq\x1b]0;T\x07"])
    assert text.exit_code == 0
    assert text.stdout.startswith("sq\\x1b]0;T\\x07 (chatty): ok (")
    assert "\x1b" not in text.stdout


def test_op_kind_is_what_ops_lists() -> None:
    """``Op.kind``, the column ``graphsvc ops`` prints, for each of its four answers."""
    from graphsvc.ops import Op
    from graphsvc.pluginhost import load_registry

    def square(x: float) -> float:
        return x * x

    def twice(x: float, out: float) -> tuple[float]:
        return (2 * x,)

    assert Op("tag", 0, forward=None).kind == "leaf tag"
    assert Op("sq", 1, forward=square, derivatives=twice).kind == "vectorized"
    assert Op("sq", 1, forward=square, derivatives=twice, vectorized=False).kind == "per element"
    assert Op("sq", 1, forward=square, vjp=lambda g, out, x: (2 * x * g,)).kind == "vjp"
    registry = load_registry(disable_third_party=True)[0]
    kinds = {op.name: op.kind for op in registry}
    assert (kinds["leaf"], kinds["const"], kinds["mul"], kinds["matmul"]) == (
        "leaf tag",
        "leaf tag",
        "vectorized",
        "vjp",
    )


def test_an_unknown_op_after_a_plugin_failed_to_load_points_at_its_warning(broken_file: str) -> None:
    result = runner.invoke(app, ["--plugin", broken_file, "gradcheck", "--op", "scale_rows"])
    assert result.exit_code == 4
    assert result.stderr == (
        f"Warning: plugin {broken_file}: cannot import: RuntimeError: boom\n"
        "Error: unknown op 'scale_rows': no loaded plugin registers it (see `graphsvc ops`); "
        f"plugin {broken_file} failed to load (see the warning above)\n"
    )
    again = runner.invoke(app, ["gradcheck", "--op", "scale_rows"])  # the next command starts afresh
    assert again.stderr == "Error: unknown op 'scale_rows': no loaded plugin registers it (see `graphsvc ops`)\n"


def test_ops_a_graph_lacks_after_plugins_failed_to_load_name_them(broken_file: str, tmp_path: Path) -> None:
    from graphsvc import GraphBuilder, save

    builder = GraphBuilder()
    x = builder.leaf(2.0, name="x")
    builder.add("my_cube", [x], name="y")
    path = tmp_path / "g.msgpack"
    save(builder.build(), path)
    quitter = tmp_path / "other_broken.py"
    quitter.write_text("raise RuntimeError('boom')\n")
    result = runner.invoke(app, ["--plugin", broken_file, "--plugin", str(quitter), "backward", str(path)])
    assert result.exit_code == 4
    assert result.stderr.splitlines()[-1] == (
        "Error: the graph uses an op not registered here: my_cube (plugin unknown); install the plugin that "
        f"provides it or pass --plugin; plugins {broken_file}, {quitter} failed to load (see the warning above)"
    )


def test_a_plugins_keyboard_interrupt_is_its_failure_where_ctrl_c_cannot_arrive(tmp_path: Path) -> None:
    """Under nohup or in a background job SIGINT is ignored: no Ctrl-C can come, so a
    KeyboardInterrupt is the plugin's own, a warning, not the user stopping the command (exit 130)."""
    import signal
    import subprocess
    import sys

    quitter = tmp_path / "quitter.py"
    quitter.write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "graphsvc", "--plugin", str(quitter), "ops", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, f"Warning: plugin {quitter}: cannot import: KeyboardInterrupt\n")
    assert "add" in [op["name"] for op in json.loads(done.stdout)["ops"]]
