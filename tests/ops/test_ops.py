"""The op contract and the registry: registration rules, lookup, and calling ops over many nodes."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from graphsvc.errors import OpError, ReplayError
from graphsvc.ops import (
    Attributes,
    Op,
    OpRegistry,
    UserInterrupt,
    evaluate,
    evaluate_node,
    interrupts_told_apart,
    local_derivatives,
)

CUBE = Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,))
HYPOT = Op("hypot", 2, forward=np.hypot, derivatives=lambda x, y, out: (x / out, y / out))
HYPOT_PER_ELEMENT = Op(
    "hypot",
    2,
    forward=math.hypot,
    derivatives=lambda x, y, out: (x / out, y / out),
    vectorized=False,
)


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


# -- the registry --------------------------------------------------------------------------------
def test_register_records_the_plugin_and_looks_up_by_name() -> None:
    registry = OpRegistry()
    registry.register(CUBE, plugin="cubes", plugin_version="1.2")
    op = registry.get("cube")
    assert (op.plugin, op.plugin_version, op.source) == ("cubes", "1.2", "cubes 1.2")
    assert op.forward is CUBE.forward
    assert "cube" in registry and "cubes" not in registry and 3 not in registry
    assert len(registry) == 1


def test_iteration_is_sorted_by_name() -> None:
    registry = OpRegistry()
    for name in ("mul", "add", "leaky_relu", "Zeta"):
        registry.register(Op(name, 1, forward=abs, derivatives=lambda x, out: (1.0,)))
    assert [op.name for op in registry] == ["Zeta", "add", "leaky_relu", "mul"]


def test_a_duplicate_name_is_an_error_naming_both_plugins_and_nothing_is_overridden() -> None:
    registry = OpRegistry()
    registry.register(CUBE, plugin="first", plugin_version="1.0")
    other = Op("cube", 1, forward=lambda x: x, derivatives=lambda x, out: (1.0,))
    with pytest.raises(OpError) as info:
        registry.register(other, plugin="second")
    assert str(info.value) == "op 'cube' is registered by both first 1.0 and second (the first one is kept)"
    assert info.value.exit_code == 4
    assert registry.get("cube").forward is CUBE.forward
    assert len(registry) == 1


def test_the_same_plugin_registering_a_name_twice_is_named_once() -> None:
    registry = OpRegistry()
    registry.register(CUBE, plugin="first", plugin_version="1.0")
    with pytest.raises(OpError, match=r"^op 'cube' is registered twice by first 1\.0 \(the first one is kept\)$"):
        registry.register(CUBE, plugin="first", plugin_version="1.0")


def test_an_unknown_op_is_an_error_naming_it() -> None:
    with pytest.raises(OpError) as info:
        OpRegistry().get("softplus")
    assert str(info.value) == "unknown op 'softplus': no loaded plugin registers it (see `graphsvc ops`)"


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("cube", "register() expects a graphsvc.ops.Op, not str"),
        (Op("", 1, abs, abs), "an op's name must be a non-empty string, not ''"),
        (Op(3, 1, abs, abs), "an op's name must be a non-empty string, not 3"),  # type: ignore[arg-type]
        (Op("f", -1, abs, abs), "op 'f': arity must be a non-negative integer, not -1"),
        (Op("f", True, abs, abs), "op 'f': arity must be a non-negative integer, not True"),
        (Op("f", 1, None, abs), "op 'f': forward must be a function, not None"),
        (Op("f", 2, abs, "d"), "op 'f': derivatives must be a function, not 'd'"),  # type: ignore[arg-type]
        (
            Op("f", 0, abs, None),
            "op 'f': arity 0 is for leaf tags, whose values come from the file, "
            "so forward, derivatives and vjp must be None",
        ),
        (Op("f", 1, abs, abs, version=2), "op 'f': version must be a non-empty string, not 2"),  # type: ignore[arg-type]
        (Op("f", 1, abs, abs, vectorized=1), "op 'f': vectorized must be True or False, not 1"),  # type: ignore[arg-type]
        (
            Op("f", 1, abs, abs, kernel=["neg"]),  # type: ignore[arg-type]
            "op 'f': kernel ['neg'] is not a primitive of arity 1 (add, sub, mul, div, neg, pow, exp, log, sqrt, "
            "sin, cos, tanh, relu, sigmoid, abs, max, min)",
        ),
    ],
)
def test_a_malformed_op_is_refused_with_the_reason(op: object, message: str) -> None:
    registry = OpRegistry()
    with pytest.raises(OpError) as info:
        registry.register(op)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert len(registry) == 0


# -- evaluate and local_derivatives --------------------------------------------------------------
def test_evaluate_runs_a_vectorized_op_once_over_every_node() -> None:
    calls: list[int] = []

    def forward(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        return x**3

    op = Op("cube", 1, forward=forward, derivatives=lambda x, out: (3 * x**2,))
    x = column(1.0, 2.0, -3.0)
    out = evaluate(op, [x], {})
    assert out.dtype == np.float64 and out.tolist() == [1.0, 8.0, -27.0]
    assert calls == [3]
    assert [d.tolist() for d in local_derivatives(op, [x], out, {})] == [[3.0, 12.0, 27.0]]


def test_a_scalar_derivative_is_broadcast_to_every_node() -> None:
    add = Op("add", 2, forward=lambda x, y: x + y, derivatives=lambda x, y, out: (1.0, 1.0))
    x, y = column(1.0, 2.0, 3.0), column(10.0, 20.0, 30.0)
    out = evaluate(add, [x, y], {})
    partials = local_derivatives(add, [x, y], out, {})
    assert [d.tolist() for d in partials] == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert all(d.shape == (3,) and d.dtype == np.float64 for d in partials)


def test_boolean_and_integer_results_become_float64() -> None:
    step = Op("step", 1, forward=lambda x: x > 0, derivatives=lambda x, out: (0,))
    x = column(-1.0, 2.0)
    out = evaluate(step, [x], {})
    assert out.dtype == np.float64 and out.tolist() == [0.0, 1.0]
    assert local_derivatives(step, [x], out, {})[0].tolist() == [0.0, 0.0]


def test_attributes_are_passed_as_keywords_to_both_functions() -> None:
    power = Op(
        "pow",
        1,
        forward=lambda x, exponent: x**exponent,
        derivatives=lambda x, out, exponent: (exponent * x ** (exponent - 1),),
    )
    x = column(2.0, 3.0)
    out = evaluate(power, [x], {"exponent": 3.0})
    assert out.tolist() == [8.0, 27.0]
    assert local_derivatives(power, [x], out, {"exponent": 3.0})[0].tolist() == [12.0, 27.0]


def test_the_per_element_fallback_gives_the_same_numbers_as_the_vectorized_op() -> None:
    x, y = column(3.0, -1.5, 0.25, 1e200), column(4.0, 2.0, -0.5, 1e200)
    out = evaluate(HYPOT, [x, y], {})
    out_each = evaluate(HYPOT_PER_ELEMENT, [x, y], {})
    assert out_each.tolist() == out.tolist()
    assert out.tolist()[0] == 5.0
    expected = [d.tolist() for d in local_derivatives(HYPOT, [x, y], out, {})]
    assert [d.tolist() for d in local_derivatives(HYPOT_PER_ELEMENT, [x, y], out_each, {})] == expected
    assert expected[0][0] == 3.0 / 5.0 and expected[1][0] == 4.0 / 5.0


def test_the_per_element_fallback_passes_python_floats() -> None:
    seen: list[type] = []

    def forward(x: float) -> float:
        seen.append(type(x))
        return math.sqrt(x)

    op = Op("sqrt", 1, forward=forward, derivatives=lambda x, out: (0.5 / out,), vectorized=False)
    assert evaluate(op, [column(4.0, 9.0)], {}).tolist() == [2.0, 3.0]
    assert seen == [float, float]
    assert evaluate(op, [column()], {}).shape == (0,)


@pytest.mark.filterwarnings("error")
def test_nan_and_inf_are_values_not_errors() -> None:
    log = Op("log", 1, forward=np.log, derivatives=lambda x, out: (1.0 / x,))
    x = column(-1.0, 0.0, 1.0)
    out = evaluate(log, [x], {})
    assert math.isnan(out[0]) and out[1] == -math.inf and out[2] == 0.0
    (d,) = local_derivatives(log, [x], out, {})
    assert d[0] == -1.0 and d[1] == math.inf


def test_an_exception_in_forward_is_a_replay_error_naming_the_op_and_its_plugin() -> None:
    def forward(x: float) -> float:
        return 1.0 / x

    op = Op(
        "inv",
        1,
        forward=forward,
        derivatives=lambda x, out: (-out * out,),
        vectorized=False,
        plugin="p",
        plugin_version="0.3",
    )
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0, 0.0)], {})
    assert str(info.value) == "op 'inv' (p 0.3): forward raised ZeroDivisionError: float division by zero"


def test_a_missing_attribute_is_reported_through_the_exception() -> None:
    power = Op("pow", 1, forward=lambda x, exponent: x**exponent, derivatives=lambda x, out, exponent: (x,))
    with pytest.raises(ReplayError, match=r"^op 'pow' \(an unnamed plugin\): forward raised TypeError: .*'exponent'$"):
        evaluate(power, [column(1.0)], {})


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        (
            lambda x: np.ones((3, 2)),
            "op 'bad' (an unnamed plugin): forward returned an array of shape (3, 2), expected (3,) or a scalar",
        ),
        (
            lambda x: x[:2],
            "op 'bad' (an unnamed plugin): forward returned an array of shape (2,), expected (3,) or a scalar",
        ),
        (lambda x: "text", "op 'bad' (an unnamed plugin): forward returned str, not real numbers"),
        (lambda x: x + 1j, "op 'bad' (an unnamed plugin): forward returned ndarray of complex128, not real numbers"),
    ],
)
def test_a_forward_of_the_wrong_shape_or_type_is_a_replay_error(forward: object, message: str) -> None:
    op = Op("bad", 1, forward=forward, derivatives=lambda x, out: (1.0,))  # type: ignore[arg-type]
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0, 2.0, 3.0)], {})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("derivatives", "message"),
    [
        # a bare array would be read as one partial per node: refused
        (
            lambda x, y, out: y,
            "op 'bad' (an unnamed plugin): derivatives returned ndarray, expected a tuple of 2 partial derivatives",
        ),
        (
            lambda x, y, out: (y,),
            "op 'bad' (an unnamed plugin): derivatives returned 1 partial derivatives, expected 2",
        ),
    ],
)
def test_derivatives_must_return_one_partial_per_input(derivatives: object, message: str) -> None:
    op = Op("bad", 2, forward=lambda x, y: x * y, derivatives=derivatives)  # type: ignore[arg-type]
    x, y = column(1.0, 2.0), column(3.0, 4.0)
    with pytest.raises(ReplayError) as info:
        local_derivatives(op, [x, y], x * y, {})
    assert str(info.value) == message


def test_a_per_element_op_must_return_floats() -> None:
    op = Op("bad", 1, forward=lambda x: [x], derivatives=lambda x, out: (1.0,), vectorized=False)
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0)], {})
    assert str(info.value) == (
        "op 'bad' (an unnamed plugin): forward returned list, not a float (a per-element op returns Python floats)"
    )


def test_the_number_of_inputs_must_match_the_arity() -> None:
    with pytest.raises(ReplayError, match=r"^op 'cube' \(an unnamed plugin\) takes 1 input, got 2$"):
        evaluate(CUBE, [column(1.0), column(2.0)], {})


def test_a_leaf_tag_cannot_be_evaluated() -> None:
    leaf = Op("leaf", 0, forward=None, derivatives=None, plugin="graphsvc", plugin_version="0.1.0")
    with pytest.raises(ReplayError) as info:
        evaluate(leaf, [], {})
    assert str(info.value) == "op 'leaf' (graphsvc 0.1.0) is a leaf tag: it has no forward or derivatives"


# -- plugin code that misbehaves: BaseExceptions, results that are not numbers, arity -------------------
class CustomBaseError(BaseException):
    pass


def _raising(exc: BaseException) -> object:
    def function(*args: object, **kwargs: object) -> object:
        raise exc

    return function


@pytest.mark.parametrize(
    ("exc", "described"),
    [
        (SystemExit(0), "SystemExit: 0"),
        (SystemExit(), "SystemExit"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (GeneratorExit("closing"), "GeneratorExit: closing"),
        (CustomBaseError("mine"), "CustomBaseError: mine"),
        (MemoryError(), "MemoryError"),
        (OverflowError("math range error"), "OverflowError: math range error"),
    ],
)
@pytest.mark.parametrize("vectorized", [True, False], ids=["vectorized", "per element"])
def test_any_base_exception_from_an_op_is_a_replay_error_naming_it(
    exc: BaseException, described: str, vectorized: bool
) -> None:
    source = {"plugin": "p", "plugin_version": "0.3"}
    raising = Op("x", 1, forward=_raising(exc), derivatives=lambda x, out: (1.0,), vectorized=vectorized, **source)
    with pytest.raises(ReplayError) as info:
        evaluate(raising, [column(1.0, 2.0)], {})
    assert str(info.value) == f"op 'x' (p 0.3): forward raised {described}"
    assert info.value.__cause__ is exc
    slope = Op("x", 1, forward=lambda x: x, derivatives=_raising(exc), vectorized=vectorized, **source)
    with pytest.raises(ReplayError) as info:
        local_derivatives(slope, [column(1.0)], column(1.0), {})
    assert str(info.value) == f"op 'x' (p 0.3): derivatives raised {described}"
    with pytest.raises(ReplayError) as info, interrupts_told_apart():  # replay holds it around evaluate_node
        evaluate_node(raising, [column(1.0)], {})
    assert str(info.value) == f"op 'x' (p 0.3): forward raised {described}"


def test_a_long_exception_message_is_cut() -> None:
    op = Op("x", 1, forward=_raising(ValueError("y" * 10_000)), derivatives=lambda x, out: (1.0,))
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0)], {})
    assert (
        str(info.value)
        == "op 'x' (an unnamed plugin): forward raised ValueError: " + "y" * 177 + "... (10,000 characters)"
    )


def test_the_users_ctrl_c_is_not_an_op_failure() -> None:
    op = Op("x", 1, forward=_raising(UserInterrupt()), derivatives=lambda x, out: (1.0,))
    with pytest.raises(UserInterrupt):
        evaluate(op, [column(1.0)], {})


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "forward returned NoneType, not real numbers"),
        ("1.5", "forward returned str, not real numbers"),  # numpy would parse it as 1.5
        (["1.5", "2.5"], "forward returned list, not real numbers"),
        ([1.0, 2.0], "forward returned an array of shape (2,), expected (3,) or a scalar"),
        (np.array([1.0, None, 3.0], dtype=object), "forward returned ndarray of object, not real numbers"),
        (np.array([1.0, 2.0, 3.0], dtype=object), "forward returned ndarray of object, not real numbers"),
        (10**400, "forward returned an integer out of float64's range"),
        ([1.0, [2.0], 3.0], "forward returned list, not real numbers"),  # ragged
    ],
)
def test_a_result_that_is_not_numbers_is_a_replay_error(result: object, message: str) -> None:
    op = Op("bad", 1, forward=lambda x: result, derivatives=lambda x, out: (1.0,), plugin="p")
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0, 2.0, 3.0)], {})
    assert str(info.value) == f"op 'bad' (p): {message}"


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "returned NoneType, not a float"),
        ("1.5", "returned str, not a float"),
        (np.array([1.0, 2.0]), "returned ndarray, not a float"),
        (10**400, "returned a number out of float64's range"),
    ],
)
def test_a_per_element_result_that_is_not_a_float_is_a_replay_error(result: object, message: str) -> None:
    op = Op("bad", 1, forward=lambda x: result, derivatives=lambda x, out: (result,), vectorized=False, plugin="p")
    suffix = "" if "range" in message else " (a per-element op returns Python floats)"
    with pytest.raises(ReplayError) as info:
        evaluate(op, [column(1.0)], {})
    assert str(info.value) == f"op 'bad' (p): forward {message}{suffix}"
    with pytest.raises(ReplayError) as info:
        local_derivatives(op, [column(1.0)], column(1.0), {})
    assert str(info.value) == f"op 'bad' (p): derivatives {message}{suffix}"


def test_numbers_of_other_real_types_are_accepted() -> None:
    per_element = Op(
        "f", 1, forward=lambda x: Fraction(1, 4), derivatives=lambda x, out: (np.int64(2),), vectorized=False
    )
    assert evaluate(per_element, [column(1.0)], {}).tolist() == [0.25]
    assert local_derivatives(per_element, [column(1.0)], column(0.25), {})[0].tolist() == [2.0]
    ints = Op("g", 1, forward=lambda x: np.array([1, 2], dtype=np.int32), derivatives=lambda x, out: (True,))
    assert evaluate(ints, [column(5.0, 6.0)], {}).tolist() == [1.0, 2.0]


def test_evaluate_node_makes_the_call_a_group_gets() -> None:
    seen: list[tuple[type, tuple[int, ...]]] = []

    def forward(x: np.ndarray, exponent: float) -> np.ndarray:
        seen.append((type(x), x.shape))
        return x**exponent

    op = Op("pow", 1, forward=forward, derivatives=lambda x, out, exponent: (x,))
    x = -1.3275170599102342  # where libm's pow(x, 2.0) and numpy's x * x differ by one ulp
    assert evaluate_node(op, [column(x)], {"exponent": 2.0}) == x * x == 1.7623015443527121
    assert seen == [(np.ndarray, (1,))]


def test_an_op_is_refused_at_registration_when_its_functions_cannot_take_arity_arguments() -> None:
    registry = OpRegistry()
    two = Op("two", 2, forward=lambda x: x, derivatives=lambda x, y, out: (1.0, 1.0))
    with pytest.raises(OpError) as info:
        registry.register(two, plugin="p", plugin_version="1.0")
    assert str(info.value) == "op 'two' (p 1.0): forward(x) cannot take its inputs as 2 positional arguments (arity 2)"
    no_out = Op("one", 1, forward=lambda x: x, derivatives=lambda x: (1.0,))
    with pytest.raises(OpError) as info:
        registry.register(no_out)
    assert (
        str(info.value) == "op 'one': derivatives(x) cannot take its inputs and out as 2 positional arguments (arity 1)"
    )
    assert len(registry) == 0


def test_star_args_keywords_and_builtins_without_a_signature_are_taken_on_trust() -> None:
    registry = OpRegistry()
    registry.register(Op("a", 3, forward=lambda *xs: xs[0], derivatives=lambda *a: (1.0, 1.0, 1.0)))
    registry.register(Op("b", 1, forward=lambda x, exponent: x**exponent, derivatives=lambda x, out, *, k=1: (k,)))
    registry.register(Op("c", 2, forward=math.hypot, derivatives=lambda x, y, out: (x / out, y / out)))
    registry.register(Op("d", 2, forward=np.hypot, derivatives=lambda x, y, out: (x / out, y / out)))
    assert [op.name for op in registry] == ["a", "b", "c", "d"]


def test_interrupts_told_apart_is_entered_once_per_with_block() -> None:
    import signal

    told = interrupts_told_apart()
    with told:
        with pytest.raises(RuntimeError, match=r"^interrupts_told_apart\(\) is entered once; make a new one"):
            told.__enter__()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with told:  # one after the other is fine
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _twice(x: np.ndarray, out: np.ndarray) -> tuple[float]:
    return (2.0,)


def test_an_op_pickles_after_a_tensor_replay_worked_out_its_vjp() -> None:
    """The derived VJP Op.tensor_vjp keeps is a closure; pickling leaves it out."""
    import pickle

    op = Op("twice", 1, forward=np.add, derivatives=_twice)
    assert op.tensor_vjp.takes_needs
    copy = pickle.loads(pickle.dumps(op))
    assert copy == op and "tensor_vjp" not in copy.__dict__
    assert copy.tensor_vjp.function(np.array(3.0), None, np.array(1.0), needs_input_grad=(True,))[0] == 6.0


# -- a variadic op's most inputs (max_arity) -----------------------------------------------------------
def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, scale: float = 1.0) -> np.ndarray:
    return scale * (x @ w + (0.0 if b is None else b))


def _linear_vjp(
    g: np.ndarray, out: np.ndarray, x: np.ndarray, w: np.ndarray, b: Any = None, *, scale: float = 1.0
) -> Any:
    return (scale * g @ w.T, scale * x.T @ g) + (() if b is None else (scale * g.sum(axis=0),))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_arity": 3}, "op 'linear': max_arity is given, but the op is not variadic (give variadic=True)"),
        ({"variadic": True, "max_arity": 2}, "op 'linear': max_arity must be more than arity 2, not 2"),
        ({"variadic": True, "max_arity": 1}, "op 'linear': max_arity must be more than arity 2, not 1"),
        ({"variadic": True, "max_arity": "3"}, "op 'linear': max_arity must be an integer or None, not '3'"),
        ({"variadic": True, "max_arity": True}, "op 'linear': max_arity must be an integer or None, not True"),
        (
            {"variadic": True, "max_arity": 4, "forward": lambda x, w, b=None: x @ w},
            "op 'linear': forward(x, w, b=None) cannot take its inputs as 4 positional arguments "
            "(arity 2, max_arity 4)",
        ),
        (
            {"variadic": True, "max_arity": 3, "vjp": lambda g, out, x, w: (g, g)},
            "op 'linear': vjp(g, out, x, w) cannot take g, out and its inputs as 5 positional arguments "
            "(arity 2, max_arity 3)",
        ),
    ],
)
def test_max_arity_is_refused_at_registration_unless_a_variadic_ops_functions_take_that_many(
    fields: dict[str, Any], message: str
) -> None:
    registry = OpRegistry()
    op = Op("linear", 2, **{"forward": _linear, "vjp": _linear_vjp} | fields)
    with pytest.raises(OpError) as info:
        registry.register(op)
    assert str(info.value) == message
    assert len(registry) == 0


def test_a_variadic_op_with_max_arity_takes_that_many_inputs_at_most() -> None:
    linear = Op("linear", 2, forward=_linear, vjp=_linear_vjp, variadic=True, max_arity=3)
    OpRegistry().register(linear)
    assert [linear.arity_problem(n) for n in range(5)] == [
        "takes at least 2 inputs",
        "takes at least 2 inputs",
        None,
        None,
        "takes at most 3 inputs",
    ]
    unlimited = Op("cat", 1, forward=lambda *xs: xs[0], vjp=lambda g, out, *xs: (g,) * len(xs), variadic=True)
    assert [unlimited.arity_problem(n) for n in (0, 1, 100)] == ["takes at least 1 input", None, None]
    assert [CUBE.arity_problem(n) for n in (0, 1, 2)] == ["takes 1 input", None, "takes 1 input"]


def test_a_variadic_ops_optional_inputs_up_to_max_arity_are_inputs_not_attributes() -> None:
    """``b=None`` is the third input of a node with three, so a node cannot give it as an attribute;
    without max_arity nothing says it is an input."""
    bounded = Op("linear", 2, forward=_linear, vjp=_linear_vjp, variadic=True, max_arity=3)
    assert bounded.attributes == Attributes(frozenset({"scale"}), ())
    unbounded = Op("linear", 2, forward=_linear, vjp=_linear_vjp, variadic=True)
    assert unbounded.attributes == Attributes(frozenset({"b", "scale"}), ())
