"""graphsvc.testing: the finite-difference check shipped for plugin authors must catch wrong
derivatives, skip points outside an op's domain, and try attributes that have no default."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from graphsvc.errors import OpError
from graphsvc.ops import Op, OpRegistry
from graphsvc.testing import (
    ATTRIBUTE_SAMPLES,
    SAMPLE_VALUES,
    GradcheckResult,
    check_op,
    check_registry,
    check_vjp,
    random_shapes,
    reduction_attrs,
    ulp_distance,
)

SQUARE = Op("square", 1, forward=lambda x: x * x, derivatives=lambda x, out: (2 * x,))
WRONG_SQUARE = Op("square", 1, forward=lambda x: x * x, derivatives=lambda x, out: (x,), plugin="p", plugin_version="1")
LOG = Op("log", 1, forward=np.log, derivatives=lambda x, out: (1.0 / x,))
POW = Op(
    "pow",
    1,
    forward=lambda x, exponent: x**exponent,
    derivatives=lambda x, out, exponent: (exponent * x ** (exponent - 1),),
)


def test_a_correct_op_passes_at_every_default_point() -> None:
    result = check_op(SQUARE)
    assert (result.ok, result.points, result.skipped, result.message) == (True, len(SAMPLE_VALUES), 0, "")
    assert 0 <= result.max_abs_error < 1e-8


def test_a_wrong_derivative_fails_naming_the_input_the_point_and_both_values() -> None:
    result = check_op(WRONG_SQUARE, points=[(3.0,)])
    assert (result.op, result.plugin, result.plugin_version, result.ok) == ("square", "p", "1", False)
    assert result.message == "d/d(input 0) at (3): derivatives give 3, finite differences give 6"
    assert result.max_abs_error == pytest.approx(3.0)
    assert result.max_rel_error == pytest.approx(0.5)


def test_the_wrong_partial_of_a_binary_op_is_found() -> None:
    # d(x*y)/dy is x; this op swaps nothing and returns y for both
    bad_mul = Op("mul", 2, forward=lambda x, y: x * y, derivatives=lambda x, y, out: (y, y))
    result = check_op(bad_mul, points=[(2.0, 5.0)])
    assert result.message == "d/d(input 1) at (2, 5): derivatives give 5, finite differences give 2"


def test_points_where_the_forward_is_not_finite_are_skipped() -> None:
    result = check_op(LOG)
    assert (result.ok, result.points, result.skipped) == (True, 3, 2)  # -1.7 and -0.6 are outside the domain


def test_an_op_finite_nowhere_fails_with_advice() -> None:
    result = check_op(LOG, points=[(-1.0,), (-2.0,)])
    assert (result.ok, result.points, result.skipped) == (False, 0, 2)
    assert result.message == "the forward is not finite at any sample point; pass points inside the op's domain"


def test_an_attribute_without_a_default_is_tried_with_each_sample_value() -> None:
    result = check_op(POW)
    # exponent 2.0 everywhere; 0.5 and -1.5 only at the three positive points
    assert (result.ok, result.points, result.skipped) == (True, 5 + 3 + 3, 2 + 2)
    assert ATTRIBUTE_SAMPLES == (2.0, 0.5, -1.5)


def test_a_wrong_derivative_that_depends_on_the_attribute_is_reported_with_it() -> None:
    bad_pow = Op("pow", 1, forward=lambda x, exponent: x**exponent, derivatives=lambda x, out, exponent: (2 * x,))
    result = check_op(bad_pow, points=[(3.0,)])
    assert (
        result.message == "d/d(input 0) at (3) with exponent=0.5: derivatives give 6, finite differences give 0.288675"
    )


def test_explicit_attributes_replace_the_samples() -> None:
    result = check_op(POW, points=[(2.0,)], attrs={"exponent": 3.0})
    assert (result.ok, result.points) == (True, 1)


def test_attributes_with_a_default_use_it() -> None:
    leaky = Op(
        "leaky", 1,
        forward=lambda x, alpha=0.1: np.where(x > 0, x, alpha * x),
        derivatives=lambda x, out, alpha=0.1: (np.where(x > 0, 1.0, 0.2),),  # wrong below 0
    )  # fmt: skip
    assert check_op(leaky).message == "d/d(input 0) at (-1.7): derivatives give 0.2, finite differences give 0.1"


def test_an_op_that_raises_fails_with_the_replay_error() -> None:
    def forward(x: float) -> float:
        raise ValueError("math domain error")

    op = Op("broken", 1, forward=forward, derivatives=lambda x, out: (0.0,), vectorized=False)
    result = check_op(op)
    assert not result.ok
    assert result.message == "op 'broken' (an unnamed plugin): forward raised ValueError: math domain error"


def test_a_per_element_op_is_checked_through_the_fallback() -> None:
    op = Op("exp", 1, forward=math.exp, derivatives=lambda x, out: (out,), vectorized=False)
    assert check_op(op).ok


def test_binary_ops_are_sampled_at_every_ordered_pair_of_distinct_values() -> None:
    seen: list[tuple[float, float]] = []

    def forward(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if not seen:
            seen.extend(zip(x.tolist(), y.tolist(), strict=True))
        return np.maximum(x, y)

    op = Op("max", 2, forward=forward, derivatives=lambda x, y, out: (x > y, y > x))
    result = check_op(op)
    n = len(SAMPLE_VALUES)
    assert (result.ok, result.points) == (True, n * (n - 1))
    assert all(x != y for x, y in seen)  # no ties, where max has no derivative


def test_a_leaf_tag_has_nothing_to_check() -> None:
    assert check_op(Op("leaf", 0, None, None)) == GradcheckResult("leaf", None, None, True, 0, 0, 0.0, 0.0, "")


def test_points_must_have_one_value_per_input() -> None:
    with pytest.raises(ValueError, match=r"^points must be tuples of 1 input for op 'square'$"):
        check_op(SQUARE, points=[(1.0, 2.0)])


def test_check_registry_checks_every_op_with_inputs_by_name_or_the_named_ones() -> None:
    registry = OpRegistry()
    for op in (SQUARE, LOG, Op("leaf", 0, None, None)):
        registry.register(op, plugin="mine")
    assert [(r.op, r.ok, r.plugin) for r in check_registry(registry)] == [
        ("log", True, "mine"),
        ("square", True, "mine"),
    ]
    assert [r.op for r in check_registry(registry, ["square", "leaf", "square"])] == ["square", "leaf"]
    with pytest.raises(OpError, match=r"^unknown op 'cube'"):
        check_registry(registry, ["cube"])


def test_to_dict_is_json_ready() -> None:
    result = check_op(Op("nan", 1, forward=lambda x: x, derivatives=lambda x, out: (x * np.nan,)), points=[(1.0,)])
    assert result.to_dict() == {
        "op": "nan",
        "plugin": None,
        "plugin_version": None,
        "ok": False,
        "points": 1,
        "skipped": 0,
        "max_abs_error": "inf",
        "max_rel_error": "inf",
        "message": "d/d(input 0) at (1): derivatives give nan, finite differences give 1",
        "unchecked": "",
    }


def test_an_op_that_exits_fails_its_check_instead_of_ending_the_process() -> None:
    def forward(x: np.ndarray) -> np.ndarray:
        raise SystemExit(0)

    quitter = Op("quit", 1, forward=forward, derivatives=lambda x, out: (1.0,), plugin="p", plugin_version="2")
    (result,) = check_registry(_registry_of(quitter))
    assert (result.ok, result.points, result.message) == (False, 0, "op 'quit' (p 2): forward raised SystemExit: 0")


def test_an_ops_prints_stay_on_stdout_in_a_library_check(capsys: pytest.CaptureFixture[str]) -> None:
    def forward(x: np.ndarray) -> np.ndarray:
        print("computing")
        return x * x

    result = check_op(Op("loud", 1, forward=forward, derivatives=lambda x, out: (2 * x,)))
    assert result.ok
    # the library leaves stdout to its caller; `graphsvc gradcheck` moves it (tests/cli/test_cli_ops.py)
    assert capsys.readouterr().out.splitlines() == ["computing"] * 3  # the point, then one step either side


def _registry_of(op: Op) -> OpRegistry:
    registry = OpRegistry()
    registry.register(op, plugin=op.plugin, plugin_version=op.plugin_version)
    return registry


def test_ulp_distance_counts_float64_steps() -> None:
    assert ulp_distance(1.0, 1.0) == 0
    assert ulp_distance(0.0, -0.0) == 0
    assert ulp_distance(math.nan, -math.nan) == 0
    assert ulp_distance(1.0, math.nextafter(1.0, 2.0)) == 1
    assert ulp_distance(-5e-324, 5e-324) == 2  # across zero: -min, 0, +min
    assert ulp_distance(1.3176906300700788e-10, 1.317690630070079e-10) == 1  # numpy's SIMD pow and libm's
    assert ulp_distance(math.inf, 1.7976931348623157e308) == 1
    assert ulp_distance(1.0, 2.0) == 2**52
    with pytest.raises(ValueError, match=r"^ulp_distance\(nan, 1\.0\): a nan is no number of steps from a number$"):
        ulp_distance(math.nan, 1.0)


# -- check_vjp: tensor ops ---------------------------------------------------------------------------
MUL = Op("mul", 2, forward=lambda x, y: x * y, derivatives=lambda x, y, out: (y, x))
SUM_ROWS = Op(
    "sum_rows", 1, forward=lambda x: x.sum(axis=-1), vjp=lambda g, out, x: (np.broadcast_to(g[..., None], x.shape),)
)
TAKE = Op(
    "take", 2,
    forward=lambda x, i: np.take(x, i, axis=0),
    vjp=lambda g, out, x, i: (np.add.at(z := np.zeros(x.shape), i, g) or z, None),
)  # fmt: skip


@pytest.mark.parametrize("shapes", random_shapes(2))
def test_check_vjp_turns_derivatives_into_a_vjp_summed_over_broadcast_dimensions(
    shapes: tuple[tuple[int, ...], ...],
) -> None:
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(shape) for shape in shapes)
    result = check_vjp(MUL, x, y)
    assert (result.ok, result.points, result.skipped) == (True, x.size + y.size, 0), result.message


def test_check_vjp_names_the_op_the_input_and_the_worst_element() -> None:
    # d(x*y)/dy summed over the broadcast rows is sum(g * x, axis=0); this op gives sum(g * y)
    wrong = Op("mul", 2, forward=lambda x, y: x * y, derivatives=lambda x, y, out: (y, y), plugin="p")
    x, y = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([10.0, -20.0])
    g = np.random.default_rng(0).standard_normal((2, 2))
    result = check_vjp(wrong, x, y)
    given, true = g.sum(axis=0) * y, (g * x).sum(axis=0)
    worst = int(np.argmax(np.abs(given - true) / (1e-7 + 1e-5 * np.abs(true))))
    assert result.message == (
        f"op 'mul' (p): d/d(input 1) at [{worst}] of float64[2]: derivatives give {given[worst]:.6g}, "
        f"finite differences give {true[worst]:.6g}"
    )
    assert (result.ok, result.points) == (False, 6)


def test_check_vjp_checks_a_vjp_and_its_attributes() -> None:
    scale = Op("scale", 1, forward=lambda x, k: k * x, vjp=lambda g, out, x, k: (g * 2.0,))
    assert check_vjp(scale, np.ones(3), attrs={"k": 2.0}).ok
    result = check_vjp(scale, np.array([1.0, 2.0, 3.0]), attrs={"k": 3.0}, seed=5)
    g = np.random.default_rng(5).standard_normal(3)
    worst = int(np.argmax(np.abs(g)))
    assert result.message == (
        f"op 'scale' (an unnamed plugin): d/d(input 0) at [{worst}] of float64[3] with k=3.0: "
        f"vjp gives {2 * g[worst]:.6g}, finite differences give {3 * g[worst]:.6g}"
    )


def test_check_vjp_skips_an_index_input_with_no_cotangent() -> None:
    x = np.random.default_rng(2).standard_normal((4, 3))
    result = check_vjp(TAKE, x, np.array([2, 0, 2]))
    # the index input's elements are neither checked nor "skipped"
    assert (result.ok, result.points, result.skipped) == (True, 12, 0), result.message
    assert check_vjp(SUM_ROWS, x).ok


def test_check_vjp_refuses_a_cotangent_for_an_index_input_and_one_of_the_wrong_shape() -> None:
    give_index = Op("take", 2, forward=TAKE.forward, vjp=lambda g, out, x, i: (np.zeros(x.shape), np.zeros(3)))
    result = check_vjp(give_index, np.ones((4, 3)), np.array([2, 0, 2]))
    assert result.message == (
        "op 'take' (an unnamed plugin): vjp gives the int64 input 1 a cotangent; an index input gets None"
    )
    flat = Op("sum_rows", 1, forward=SUM_ROWS.forward, vjp=lambda g, out, x: (g,))
    assert check_vjp(flat, np.ones((2, 3))).message == (
        "op 'sum_rows' (an unnamed plugin): vjp returned a cotangent of shape [2] for input 0, whose shape is [2, 3]"
    )


def test_check_vjp_passes_read_only_float64_inputs() -> None:
    def forward(x: np.ndarray) -> np.ndarray:
        assert (x.dtype, x.flags.writeable) == (np.float64, False)
        x += 1  # an op that writes into its input fails its check
        return x

    op = Op("inplace", 1, forward=forward, vjp=lambda g, out, x: (g,))
    result = check_vjp(op, np.ones(2, dtype=np.float32))
    assert result.message == ("op 'inplace' (an unnamed plugin): forward raised ValueError: output array is read-only")


def test_check_vjp_of_a_per_element_op_calls_it_per_element() -> None:
    op = Op("exp", 1, forward=math.exp, derivatives=lambda x, out: (out,), vectorized=False)
    result = check_vjp(op, np.array([[0.5, -1.0], [2.0, 0.0]]))
    assert (result.ok, result.points) == (True, 4)


def test_random_shapes_start_with_the_broadcasting_cases_and_broadcast_together() -> None:
    cases = random_shapes(2, count=12, seed=3)
    assert cases[:4] == [((2, 3, 4), (2, 3, 4)), ((), (2, 3, 4)), ((2, 3, 4), (3, 4)), ((2, 3, 4), (1, 3, 4))]
    assert len(cases) == 12
    for shapes in cases:
        np.broadcast_shapes(*shapes)  # raises if they do not
    assert random_shapes(2, count=12, seed=3) == cases  # the seed decides
    assert random_shapes(3, count=1) == [((2, 3, 4),) * 3]


def test_reduction_attrs_cover_every_axis_negative_all_and_a_pair_with_and_without_keepdims() -> None:
    axes = [(a["axis"], a["keepdims"]) for a in reduction_attrs(2)]
    assert axes == [
        (None, False), (None, True), (0, False), (0, True), (1, False), (1, True),
        (-1, False), (-1, True), ([0, -1], False), ([0, -1], True),
    ]  # fmt: skip
    assert reduction_attrs(0) == [{"axis": None, "keepdims": False}, {"axis": None, "keepdims": True}]


# -- a variadic op's input counts -------------------------------------------------------------------
def _affine(x: np.ndarray, w: np.ndarray, *bias: np.ndarray) -> np.ndarray:
    return x @ w + (bias[0] if bias else 0.0)


AFFINE = Op(
    "affine",
    2,
    forward=_affine,
    vjp=lambda g, out, x, w, *bias: (g @ w.T, x.T @ g, *(g.sum(axis=0) for _ in bias)),
    variadic=True,
    max_arity=3,
    plugin="p",
    plugin_version="1",
)


def test_check_vjp_takes_a_variadic_ops_inputs_up_to_its_max_arity() -> None:
    x, w, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4) / 10, np.ones(4)
    assert (check_vjp(AFFINE, x, w).points, check_vjp(AFFINE, x, w, b).points) == (18, 22)
    with pytest.raises(ValueError, match=r"^op 'affine' takes at most 3 inputs, got 4$"):
        check_vjp(AFFINE, x, w, b, b)
    with pytest.raises(ValueError, match=r"^op 'affine' takes at least 2 inputs, got 1$"):
        check_vjp(AFFINE, x)
    with pytest.raises(ValueError, match=r"^op 'square' takes 1 input, got 2$"):
        check_vjp(SQUARE, x, x)


def test_gradcheck_fails_a_sample_with_more_inputs_than_the_op_takes() -> None:
    """A sample beyond max_arity is the op's failure, named, not a ValueError out of gradcheck."""
    x, w, b = np.ones((2, 3)), np.ones((3, 4)), np.ones(4)
    samples = [((x, w, b), {}), ((x, w, b, b), {})]
    (result,) = check_registry(_registry_of(dataclasses.replace(AFFINE, samples=lambda rng: samples)))
    assert (result.ok, result.points) == (False, 0)
    assert result.message == "op 'affine' (p 1): sample 1 has 4 inputs, but the op takes at most 3 inputs"


# -- what a replay refuses, check_vjp and check_op refuse in its words ----------------------------------
def _vjp_op(name: str, forward: Any, vjp: Any) -> Op:
    return Op(name, 1, forward=forward, vjp=vjp, plugin="p", plugin_version="1")


REFUSED = {
    "half": (
        _vjp_op("half", lambda x: (2 * x).astype(np.float16), lambda g, out, x: (2 * g,)),
        "op 'half' (p 1): forward returned an array of float16, not an array of float64, float32 or int64",
    ),
    "i32": (
        _vjp_op("i32", lambda x: np.round(x).astype(np.int32), lambda g, out, x: (g,)),
        "op 'i32' (p 1): forward returned an array of int32, not an array of float64, float32 or int64",
    ),
    "half_ct": (
        _vjp_op("half_ct", lambda x: 2 * x, lambda g, out, x: ((2 * g).astype(np.float16),)),
        "op 'half_ct' (p 1): vjp returned an array of float16, not an array of float64, float32 or int64",
    ),
    "bool_ct": (
        _vjp_op("bool_ct", lambda x: 2 * x, lambda g, out, x: (g > 0,)),
        "op 'bool_ct' (p 1): vjp returned an array of bool, not an array of float64, float32 or int64",
    ),
    "narrow_ct": (
        _vjp_op("narrow_ct", lambda x: 2 * x, lambda g, out, x: ((2 * g)[:1],)),
        "op 'narrow_ct' (p 1): vjp returned a cotangent of shape [1, 3] for input 0, whose shape is [2, 3]",
    ),
    "two_ct": (
        _vjp_op("two_ct", lambda x: 2 * x, lambda g, out, x: (2 * g, g)),
        "op 'two_ct' (p 1): vjp returned 2 cotangents, expected one per input (1)",
    ),
    "bare_ct": (
        _vjp_op("bare_ct", lambda x: 2 * x, lambda g, out, x: 2 * g),
        "op 'bare_ct' (p 1): vjp returned ndarray, expected one per input (1)",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_check_vjp_refuses_what_a_replay_refuses_in_the_same_words(name: str) -> None:
    """A float16 or int32 output was cast to float64 and reported as a numeric mismatch ("vjp gives
    1.28085, finite differences give 0"); a float16 or bool cotangent likewise."""
    import graphsvc
    from graphsvc.errors import ReplayError
    from graphsvc.graph import GraphBuilder
    from graphsvc.pluginhost import load_registry

    op, message = REFUSED[name]
    x = np.random.default_rng(0).standard_normal((2, 3))
    result = check_vjp(op, x)
    assert (result.ok, result.points, result.message) == (False, 0, message)
    registry, _ = load_registry(disable_third_party=True)
    registry.register(op, plugin="p", plugin_version="1")
    b = GraphBuilder()
    b.add("sum", [b.add(name, [b.leaf(x, name="x")], name="n")])
    with pytest.raises(ReplayError) as info:
        graphsvc.backward(b.build(), registry=registry)
    assert str(info.value) == f"node n: {message}"
    (checked,) = check_registry(
        _registry_of(dataclasses.replace(op, samples=lambda rng: [((x,), {})]))  # as `graphsvc gradcheck` checks it
    )
    assert (checked.ok, checked.message) == (False, message)


def test_check_vjp_refuses_a_needs_input_grad_cotangent_a_replay_refuses() -> None:
    def vjp(g: np.ndarray, out: np.ndarray, x: np.ndarray, needs_input_grad: Any = None) -> Any:
        return ((2 * g).astype(np.float16 if needs_input_grad else np.float64),)

    result = check_vjp(_vjp_op("picky", lambda x: 2 * x, vjp), np.ones(3))
    assert result.message == (
        "op 'picky' (p 1): vjp returned an array of float16, not an array of float64, float32 or int64"
    )


def test_check_op_refuses_a_float16_forward_as_a_replay_of_arrays_does() -> None:
    """check_op (what `graphsvc gradcheck` runs on an elementwise op) reported "derivatives give 2,
    finite differences give 0": the float16 output, cast to float64, hid the step."""
    half = Op("half", 1, forward=lambda x: (2 * x).astype(np.float16), derivatives=lambda x, out: (2.0,))
    expected = (
        "op 'half' (an unnamed plugin): forward returned an array of float16, not an array of float64, float32 or int64"
    )
    result = check_op(half)
    assert (result.ok, result.points, result.message) == (False, 0, expected)
    assert check_vjp(half, np.ones(3)).message == expected
    f32 = Op("f32", 1, forward=lambda x: x.astype(np.float32), derivatives=lambda x, out: (1.0,))
    assert check_op(f32, eps=1e-2, rtol=1e-3).ok  # float32 is a dtype a graph holds


# -- eps, rtol and atol ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"rtol": -1e-5}, ValueError, "rtol must be a finite number, 0 or more, not -1e-05"),
        ({"rtol": math.nan}, ValueError, "rtol must be a finite number, 0 or more, not nan"),
        ({"atol": -5}, ValueError, "atol must be a finite number, 0 or more, not -5"),
        ({"atol": math.inf}, ValueError, "atol must be a finite number, 0 or more, not inf"),
        ({"eps": 0.0}, ValueError, "eps must be a finite number above 0, not 0.0"),
        ({"eps": -1e-6}, ValueError, "eps must be a finite number above 0, not -1e-06"),
        ({"eps": math.nan}, ValueError, "eps must be a finite number above 0, not nan"),
        ({"eps": math.inf}, ValueError, "eps must be a finite number above 0, not inf"),
        ({"rtol": "1e-5"}, TypeError, "rtol must be a number, not str"),
        ({"atol": True}, TypeError, "atol must be a number, not bool"),
        ({"eps": None}, TypeError, "eps must be a number, not NoneType"),
    ],
)
def test_check_functions_refuse_a_step_or_tolerance_out_of_range(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """They were taken: a negative or nan tolerance failed every op, an eps of 0 divided by zero,
    a string raised numpy's TypeError from deep inside."""
    checks = [
        lambda: check_op(SQUARE, **options),
        lambda: check_vjp(SQUARE, np.ones(2), **options),
        lambda: check_registry(_registry_of(SQUARE), **options),
    ]
    for check in checks:
        with pytest.raises(error) as info:
            check()
        assert str(info.value) == message


def test_check_registry_names_an_option_it_does_not_take() -> None:
    with pytest.raises(TypeError) as info:
        check_registry(_registry_of(SQUARE), seed=1)
    assert str(info.value) == "check_registry() takes the options eps, rtol and atol, not 'seed'"


def test_tolerances_of_0_are_taken() -> None:
    exact = Op("neg", 1, forward=lambda x: -x, derivatives=lambda x, out: (-1.0,))
    assert check_op(exact, points=[(1.0,), (2.0,)], eps=0.5, rtol=0, atol=0).ok  # steps of 0.5 and 1: exact


def test_check_vjp_fails_a_vjp_that_gives_a_float_input_none() -> None:
    op = Op("times", 2, forward=lambda x, y: x * y, vjp=lambda g, out, x, y: (g * y, None))
    result = check_vjp(op, np.ones(3), np.full(3, 2.0))
    assert (result.ok, result.message) == (
        False,
        "op 'times' (an unnamed plugin): vjp returned None for input 1, which needs a gradient "
        "(None is only for an input whose needs_input_grad entry is False)",
    )
