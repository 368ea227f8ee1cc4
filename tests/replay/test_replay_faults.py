"""Faults during replay: a plugin op that raises or returns the wrong shape is named with its plugin
and node on every path (node by node, numpy groups, per element, forward and backward); nan and inf
are reported where they first appear, without changing the exit code."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc.errors import ReplayError
from graphsvc.graph import Graph, GraphBuilder
from graphsvc.ops import Op, OpRegistry, UserInterrupt
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay
from graphsvc.replay import compare as checks

runner = CliRunner()


def _registry_with(op: Op) -> OpRegistry:
    registry, _ = load_registry(disable_third_party=True)
    registry.register(op, plugin="demo", plugin_version="1.0")
    return registry


def _graph(width: int, bad_at: float) -> tuple[Graph, int]:
    """``width`` leaves 0, 1, 2, ... each feeding one ``bad`` node, summed into ``total``. The op
    misbehaves only for the input ``bad_at``, so the error must name that node, not the first."""
    b = GraphBuilder()
    nodes = [b.add("bad", [b.leaf(float(i))], name=f"n{i}") for i in range(width)]
    total = nodes[0]
    for node in nodes[1:]:
        total = b.add("add", [total, node])
    return b.build(outputs=[total]), int(bad_at)


def _forward_raises(x: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise ZeroDivisionError("boom")
    return x


def _forward_wrong_shape(x: Any) -> Any:
    return np.zeros(7) if np.any(np.asarray(x) == 3.0) else x


def _derivatives_raise(x: Any, out: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise ValueError("no slope here")
    return (np.ones_like(x),)


def _derivatives_wrong_shape(x: Any, out: Any) -> Any:
    return (np.zeros(7),) if np.any(np.asarray(x) == 3.0) else (np.ones_like(x),)


def _per_element_raises(x: float) -> float:
    return 1.0 / (x - 3.0)  # Python floats: ZeroDivisionError at x == 3 only


def _per_element_wrong_type(x: float, out: float) -> Any:
    return ("slope",) if x == 3.0 else (1.0,)


FAULTS = [
    (
        "forward raises",
        Op("bad", 1, _forward_raises, lambda x, out: (np.ones_like(x),)),
        "node n3: op 'bad' (demo 1.0): forward raised ZeroDivisionError: boom",
    ),
    (
        "forward returns the wrong shape",
        Op("bad", 1, _forward_wrong_shape, lambda x, out: (np.ones_like(x),)),
        None,  # the node-by-node and grouped paths word the shape differently; both name n3
    ),
    (
        "derivatives raise",
        Op("bad", 1, lambda x: x, _derivatives_raise),
        "node n3: op 'bad' (demo 1.0): derivatives raised ValueError: no slope here",
    ),
    (
        "derivatives return the wrong shape",
        Op("bad", 1, lambda x: x, _derivatives_wrong_shape),
        "node n3: op 'bad' (demo 1.0): derivatives returned an array of shape (7,), expected (1,) or a scalar",
    ),
    (
        "per-element forward raises",
        Op("bad", 1, _per_element_raises, lambda x, out: (1.0,), vectorized=False),
        "node n3: op 'bad' (demo 1.0): forward raised ZeroDivisionError: float division by zero",
    ),
    (
        "per-element derivatives return a string",
        Op("bad", 1, lambda x: x + 10.0, _per_element_wrong_type, vectorized=False),
        "node n3: op 'bad' (demo 1.0): derivatives returned str, not a float (a per-element op returns Python floats)",
    ),
]


@pytest.mark.parametrize("width", [5, 40], ids=["node by node", "numpy groups"])
@pytest.mark.parametrize(("op", "message"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_faulty_op_is_named_with_its_plugin_and_the_node_it_failed_on(
    op: Op, message: str | None, width: int
) -> None:
    graph, _ = _graph(width, 3.0)
    registry = _registry_with(op)
    with pytest.raises(ReplayError) as info:
        values = replay.forward(graph, registry)
        replay.backward(graph, registry, graph.outputs[0], values)
    text = str(info.value)
    if message is None:
        assert text.startswith("node n3: op 'bad' (demo 1.0): forward returned an array of shape (7,)"), text
    else:
        assert text == message


def test_a_faulty_op_through_the_cli_exits_1_with_one_line(tmp_path: Path) -> None:
    plugin = tmp_path / "shaky.py"
    plugin.write_text(
        "import numpy as np\n"
        "from graphsvc.hookspecs import hookimpl\n"
        "from graphsvc.ops import Op\n"
        "__version__ = '0.2'\n"
        "@hookimpl\n"
        "def graphsvc_register_ops(register):\n"
        "    register(Op('shaky', 1, forward=lambda x: np.zeros(3), derivatives=lambda x, out: (x,)))\n",
        encoding="utf-8",
    )
    b = GraphBuilder()
    b.add("shaky", [b.leaf(1.0, name="x")], name="y")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)
    result = runner.invoke(app, ["--plugin", str(plugin), "forward", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "Error: node y: op 'shaky' (shaky 0.2): forward returned an array of shape (3,), expected (1,) or a scalar\n"
    )


# -- nan and inf ----------------------------------------------------------------------------------------
def test_first_nonfinite_is_vectorized_and_takes_the_order_of_each_pass() -> None:
    column = np.array([1.0, 2.0, np.inf, 3.0, np.nan, -np.inf, 0.0])
    assert checks.first_nonfinite("values", column) == checks.NonFinite("values", 2, math.inf, 3)
    found = checks.first_nonfinite("grads", column, backward=True)
    assert found == checks.NonFinite("grads", 5, -math.inf, 3)
    assert checks.first_nonfinite("values", np.array([1.0, -0.0, 1e308])) is None
    assert checks.first_nonfinite("values", np.array([], dtype=np.float64)) is None


def _log_of_zero(tmp_path: Path) -> Path:
    """out = log(x) * x + w at x = 0: log gives -inf (node 2), then -inf * 0 = nan (node 3).

    Backward: d out/d x = log(x) + x * (1/x) = -inf + 0 * inf = nan, first at x in the sweep;
    d out/d lx = x = 0.
    """
    b = GraphBuilder()
    x = b.leaf(0.0, name="x")
    w = b.leaf(2.0, name="w")
    lx = b.add("log", [x], name="lx")
    m = b.add("mul", [lx, x], name="m")
    b.add("add", [m, w], name="out")
    path = tmp_path / "nf.msgpack"
    fmt.save(b.build(), path)
    return path


def test_backward_text_says_where_nan_and_inf_first_appeared(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--disable-plugins", "backward", str(_log_of_zero(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == [
        "nonfinite values: first at lx (node 2, log) = -inf; 3 of 5 nodes",
        "nonfinite grads: first in the backward sweep at x (node 0, leaf) = nan; 1 of 5 nodes",
    ]


def test_backward_json_has_a_nonfinite_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--disable-plugins", "backward", str(_log_of_zero(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nonfinite"] == {
        "values": {"node": 2, "name": "lx", "op": "log", "value": "-inf", "count": 3},
        "grads": {"node": 0, "name": "x", "op": "leaf", "value": "nan", "count": 1},
    }


def test_forward_json_all_finite_says_null(tmp_path: Path) -> None:
    path = _log_of_zero(tmp_path)
    result = runner.invoke(app, ["--disable-plugins", "forward", str(path), "--set", "x=1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nonfinite"] == {"values": None}
    text = runner.invoke(app, ["--disable-plugins", "forward", str(path), "--set", "x=1"])
    assert "nonfinite" not in text.stdout


def test_check_shows_nonfinite_before_the_comparison_and_keeps_its_exit_code(tmp_path: Path) -> None:
    # Replaying the file's own leaves gives the stored nan/-inf back (nan equals nan for --check),
    # so --check passes with exit 0 and the nonfinite lines still say where they came from.
    replayed = tmp_path / "replayed.msgpack"
    source = _log_of_zero(tmp_path)
    assert runner.invoke(app, ["--disable-plugins", "backward", str(source), "--write", str(replayed)]).exit_code == 0
    result = runner.invoke(app, ["--disable-plugins", "backward", str(replayed), "--check"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-4:-2] == [
        "nonfinite values: first at lx (node 2, log) = -inf; 3 of 5 nodes",
        "nonfinite grads: first in the backward sweep at x (node 0, leaf) = nan; 1 of 5 nodes",
    ]
    assert result.stdout.splitlines()[-1].endswith(": ok")
    as_json = json.loads(
        runner.invoke(app, ["--disable-plugins", "forward", str(replayed), "--check", "--json"]).stdout
    )
    assert as_json["check"]["values"]["ok"] is True
    assert as_json["nonfinite"]["values"]["node"] == 2


# -- ops that exit, interrupt, print or return what is not a number -------------------------------------
def _exits(x: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise SystemExit(0)
    return x


def _interrupts(x: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise KeyboardInterrupt
    return x


class _PluginStop(BaseException):
    pass


def _custom_base(x: Any, out: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise _PluginStop("stop")
    return (np.ones_like(x),)


def _out_of_memory(x: Any) -> Any:
    if np.any(np.asarray(x) == 3.0):
        raise MemoryError
    return x


def _huge(x: float) -> Any:
    return 10**400 if x == 3.0 else x


def _text(x: Any) -> Any:
    return "1.5" if np.any(np.asarray(x) == 3.0) else x


def _nothing(x: Any) -> Any:
    return None if np.any(np.asarray(x) == 3.0) else x


BASE_FAULTS = [
    ("sys.exit", Op("bad", 1, _exits, lambda x, out: (1.0,)), "forward raised SystemExit: 0"),
    ("KeyboardInterrupt", Op("bad", 1, _interrupts, lambda x, out: (1.0,)), "forward raised KeyboardInterrupt"),
    ("custom BaseException", Op("bad", 1, lambda x: x, _custom_base), "derivatives raised _PluginStop: stop"),
    ("MemoryError", Op("bad", 1, _out_of_memory, lambda x, out: (1.0,)), "forward raised MemoryError"),
    (
        "an integer out of range",
        Op("bad", 1, _huge, lambda x, out: (1.0,), vectorized=False),
        "forward returned a number out of float64's range",
    ),
    ("a string", Op("bad", 1, _text, lambda x, out: (1.0,)), "forward returned str, not real numbers"),
    ("None", Op("bad", 1, _nothing, lambda x, out: (1.0,)), "forward returned NoneType, not real numbers"),
]


@pytest.mark.parametrize("width", [5, 40], ids=["node by node", "numpy groups"])
@pytest.mark.parametrize(("op", "message"), [f[1:] for f in BASE_FAULTS], ids=[f[0] for f in BASE_FAULTS])
def test_an_op_that_exits_interrupts_or_returns_no_number_is_a_replay_error(op: Op, message: str, width: int) -> None:
    graph, _ = _graph(width, 3.0)
    registry = _registry_with(op)
    with pytest.raises(ReplayError) as info:
        values = replay.forward(graph, registry)
        replay.backward(graph, registry, graph.outputs[0], values)
    assert str(info.value) == f"node n3: op 'bad' (demo 1.0): {message}"


def test_the_users_ctrl_c_during_a_replay_stops_it() -> None:
    """A real SIGINT while an op runs is the user's: it is not turned into the op's ReplayError."""

    def forward(x: Any) -> Any:
        if np.any(np.asarray(x) == 3.0):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, long before the sleep ends
        return x

    graph, _ = _graph(5, 3.0)
    registry = _registry_with(Op("bad", 1, forward, lambda x, out: (1.0,)))
    with pytest.raises(KeyboardInterrupt) as info:
        replay.forward(graph, registry)
    assert type(info.value) is UserInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


@pytest.mark.parametrize("width", [5, 40], ids=["node by node", "numpy groups"])
def test_an_ops_prints_in_a_library_replay_stay_on_stdout(width: int, capsys: pytest.CaptureFixture[str]) -> None:
    def loud(x: Any) -> Any:
        print("forward!")
        return x

    def loud_slope(x: Any, out: Any) -> Any:
        print("slope!")
        return (1.0,)

    graph, _ = _graph(width, 3.0)
    registry = _registry_with(Op("bad", 1, loud, loud_slope))
    values = replay.forward(graph, registry)
    replay.backward(graph, registry, graph.outputs[0], values)
    # a library replay leaves stdout to its caller; the CLI moves it (the noisy plugin test below)
    assert set(capsys.readouterr().out.splitlines()) == {"forward!", "slope!"}


NOISY_PLUGIN = """
import os, sys
import numpy as np
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op

print("noise at import")
os.write(1, b"fd noise at import\\n")

def forward(x):
    print("noise in forward")
    os.write(1, b"fd noise in forward\\n")
    return x * 2.0

def derivatives(x, out):
    sys.stdout.write("noise in derivatives\\n")
    return (2.0,)

@hookimpl
def graphsvc_register_ops(register):
    print("noise in the hook")
    register(Op("noisy", 1, forward=forward, derivatives=derivatives))
"""


def test_a_noisy_plugin_cannot_corrupt_json_output_of_a_real_process(tmp_path: Path) -> None:
    plugin = tmp_path / "noisy.py"
    plugin.write_text(NOISY_PLUGIN, encoding="utf-8")
    b = GraphBuilder()
    b.add("noisy", [b.leaf(1.5, name="x")], name="y")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)
    env = {**os.environ, "GRAPHSVC_DISABLE_PLUGINS": "0"}
    env.pop("GRAPHSVC_PLUGINS", None)
    result = subprocess.run(
        [sys.executable, "-m", "graphsvc", "--plugin", str(plugin), "backward", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stderr
    nodes = {node["name"]: node for node in json.loads(result.stdout)["nodes"]}
    assert (nodes["y"]["value"], nodes["x"]["grad"]) == (3.0, 2.0)
    assert {
        "noise at import",
        "fd noise at import",
        "noise in the hook",
        "noise in forward",
        "fd noise in forward",
        "noise in derivatives",
    } <= set(result.stderr.splitlines())


# -- results that are not what they seem ------------------------------------------------------------
def _tensor_registry(*ops: Op) -> OpRegistry:
    registry, problems = load_registry(disable_third_party=True)
    assert not problems
    for op in ops:
        registry.register(op, plugin="sneaky")
    return registry


def _two_calls(op: str) -> Graph:
    """loss = sum(op(x) + op(y)): the op runs twice, its first result still needed after the second."""
    b = GraphBuilder()
    x, y = b.leaf(np.array([1.0, 2.0, 3.0]), name="x"), b.leaf(np.array([10.0, 20.0, 30.0]), name="y")
    b.add("sum", [b.add("add", [b.add(op, [x], name="a"), b.add(op, [y], name="c")])], name="loss")
    return b.build()


_SCRATCH = np.zeros(3)


@pytest.mark.parametrize(
    "forward",
    [
        pytest.param(lambda x: np.multiply(x, 2, out=_SCRATCH)[:], id="a view of a buffer it keeps"),
        pytest.param(lambda x: np.multiply(x, 2, out=_SCRATCH), id="the buffer it keeps"),
        pytest.param(lambda x: np.multiply(x, 2, out=_SCRATCH).reshape(3, 1)[:, 0], id="a view of a view of it"),
    ],
)
def test_an_op_that_reuses_a_buffer_cannot_change_an_earlier_nodes_value(forward: Any) -> None:
    def vjp(g: Any, out: Any, x: Any) -> Any:
        return (np.multiply(g, 2, out=_SCRATCH)[:],)  # a cotangent in the same buffer

    registry = _tensor_registry(Op("double", 1, forward=forward, vjp=vjp))
    import graphsvc

    result = graphsvc.backward(_two_calls("double"), registry=registry)
    assert result.value("a").tolist() == [2.0, 4.0, 6.0]
    assert result.value("c").tolist() == [20.0, 40.0, 60.0]
    assert result.value("loss") == 132.0
    assert result.grad("x").tolist() == result.grad("y").tolist() == [2.0, 2.0, 2.0]
    _SCRATCH[:] = 99.0  # the plugin writes again later: what the replay returned does not change
    assert result.value("a").tolist() == [2.0, 4.0, 6.0] and result.grad("x").tolist() == [2.0, 2.0, 2.0]


def test_fresh_results_and_views_of_inputs_are_kept_without_a_copy() -> None:
    from graphsvc.replay import arrays

    registry = _tensor_registry()
    b = GraphBuilder()
    x = b.leaf(np.arange(6.0), name="x")
    b.add("sum", [b.add("reshape", [b.add("exp", [x], name="e")], attrs={"shape": [2, 3]}, name="r")], name="loss")
    graph = b.build()
    ops = replay.resolve_ops(graph, registry)
    values = arrays.forward(graph, ops)
    e, r = values[graph.node_id("e")], values[graph.node_id("r")]
    assert e is not None and r is not None
    assert np.shares_memory(r, e)  # reshape's view of exp's own result, not a copy
    assert not e.flags.writeable and not r.flags.writeable


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_elementwise_op_whose_inputs_broadcast_past_the_limit_is_refused_before_it_runs(
    dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(1, 1024) + (1024, 1): 4 MiB of float32, 8 MiB of float64; under a limit of 3 MiB both are
    refused before the add allocates, and 512 rows (2 MiB of float32) pass: the dtype is looked at,
    not assumed to be the widest."""
    import graphsvc

    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "3MiB")

    def graph(rows: int) -> Graph:
        b = GraphBuilder()
        row, column = b.leaf(np.ones((1, 1024), dtype=dtype)), b.leaf(np.ones((rows, 1), dtype=dtype))
        b.add("sum", [b.add("add", [row, column], name="grid")], name="loss")
        return b.build()

    for _ in range(2):  # the second time, the broadcast shape is known already
        with pytest.raises(ReplayError) as caught:
            graphsvc.forward(graph(1024), registry=_tensor_registry())
        size = "4.0 MiB" if dtype == np.float32 else "8.0 MiB"
        assert str(caught.value) == (
            f"node grid (add): asks for a 1024x1024 {np.dtype(dtype)} array ({size}), more than the limit of "
            "3.0 MiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)"
        )
    if dtype == np.float32:
        assert graphsvc.forward(graph(512), registry=_tensor_registry()).value("loss") == 2 * 512 * 1024


def test_an_elementwise_op_returning_another_shape_is_refused_in_the_tensor_forward() -> None:
    op = Op("wrong", 1, forward=lambda x: np.zeros(5), derivatives=lambda x, out: (np.ones_like(x),))
    b = GraphBuilder()
    b.add("sum", [b.add("wrong", [b.leaf(np.ones(3), name="x")], name="w")], name="loss")
    import graphsvc

    with pytest.raises(ReplayError) as caught:
        graphsvc.forward(b.build(), registry=_tensor_registry(op))
    assert str(caught.value) == (
        "node w: op 'wrong' (sneaky): forward returned an array of shape [5], but an elementwise op returns "
        "its inputs' broadcast shape [3]"
    )


@pytest.mark.parametrize("declares_needs", [False, True])
def test_a_vjp_returning_none_for_an_input_that_needs_a_gradient_is_an_error(declares_needs: bool) -> None:
    if declares_needs:

        def vjp(g: Any, out: Any, x: Any, y: Any, needs_input_grad: Any = None) -> Any:
            return (g * y, None)
    else:

        def vjp(g: Any, out: Any, x: Any, y: Any) -> Any:
            return (g * y, None)

    registry = _tensor_registry(Op("times", 2, forward=lambda x, y: x * y, vjp=vjp))
    b = GraphBuilder()
    x, w = b.leaf(np.ones(3), name="x"), b.leaf(np.ones(3), name="w")
    b.add("sum", [b.add("times", [x, w], name="t")], name="loss")
    import graphsvc

    with pytest.raises(ReplayError) as caught:
        graphsvc.backward(b.build(), registry=registry)
    assert str(caught.value) == (
        "node t: op 'times' (sneaky): vjp returned None for input 1, which needs a gradient "
        "(None is only for an input whose needs_input_grad entry is False)"
    )
    # a const array is data: it needs no gradient, and None for it is fine
    b = GraphBuilder()
    x, w = b.leaf(np.ones(3), name="x"), b.const(np.full(3, 2.0), name="w")
    b.add("sum", [b.add("times", [x, w], name="t")], name="loss")
    assert graphsvc.backward(b.build(), registry=registry).grad("x").tolist() == [2.0, 2.0, 2.0]


class _Unreadable:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "said"),
    [(ValueError("no data"), "ValueError: no data"), (SystemExit(3), "SystemExit: 3")],
)
def test_an_array_like_whose_array_method_raises_is_an_error_naming_the_op(exc: BaseException, said: str) -> None:
    import graphsvc

    tensor = _tensor_registry(Op("lazy", 1, forward=lambda x: _Unreadable(exc), vjp=lambda g, out, x: (g,)))
    b = GraphBuilder()
    b.add("sum", [b.add("lazy", [b.leaf(np.ones(3), name="x")], name="z")], name="loss")
    with pytest.raises(ReplayError) as caught:
        graphsvc.forward(b.build(), registry=tensor)
    assert str(caught.value) == (
        f"node z: op 'lazy' (sneaky): forward returned _Unreadable, which raised {said} when read as an array"
    )
    columns = _registry_with(Op("lazy", 1, forward=lambda x: _Unreadable(exc), derivatives=lambda x, out: (1.0,)))
    b = GraphBuilder()
    b.add("lazy", [b.leaf(1.0, name="x")], name="z")
    with pytest.raises(ReplayError) as caught:
        replay.forward(b.build(), columns)
    assert str(caught.value) == (
        f"node z: op 'lazy' (demo 1.0): forward returned _Unreadable, which raised {said} when read as an array"
    )


@pytest.mark.parametrize(
    ("derivatives", "said"),
    [
        (lambda x, out: (None,), "derivatives returned NoneType for input 0, not real numbers"),
        (
            lambda x, out: (np.ones((2, 3)),),
            "derivatives returned a partial of shape [2, 3] for input 0, where the output's shape is [3]",
        ),
    ],
)
def test_an_elementwise_ops_partial_that_is_none_or_widens_g_is_an_error_in_the_tensor_backward(
    derivatives: Any, said: str
) -> None:
    import graphsvc

    registry = _tensor_registry(Op("twice", 1, forward=lambda x: x * 2, derivatives=derivatives))
    b = GraphBuilder()
    b.add("sum", [b.add("twice", [b.leaf(np.ones(3), name="x")], name="w")], name="loss")
    with pytest.raises(ReplayError) as caught:
        graphsvc.backward(b.build(), registry=registry)
    assert str(caught.value) == f"node w: op 'twice' (sneaky): {said}"
