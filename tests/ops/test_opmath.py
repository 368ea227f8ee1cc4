"""graphsvc.ops.opmath: the one table of op math, and the three backends derived from it (numpy, C,
Python floats) against each other, bit for bit where the promise says so."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc.native as kernels
from graphsvc.ops import opmath
from graphsvc.ops.opmath import RULES, Rule
from tests.conftest import ROOT, require_compiled, require_native, same_bits

SUBNORMAL = 2.0**-1060
SPECIAL = [
    *(-0.0, 0.0, math.nan, math.inf, -math.inf, 5e-324, -5e-324, SUBNORMAL, 2.2250738585072014e-308),
    *(1.7976931348623157e308, -1e308, 1e300, 1e-300, -1e-300, 710.0, -745.5, 1e-8, -1e-8, 22.0, -40.0),
    *(1.0, -1.0, 0.5, 2.5, -3.0, 7.0, math.pi, 1e22),
]
#: Exponents pow is checked with.
EXPONENTS = [2.0, 3.0, -1.0, -2.0, 0.5, -0.5, 0.0, 1.0, 2.5, -3.0, 1e-3, 1e300, math.inf, math.nan]


def points(arity: int) -> list[np.ndarray]:
    """Every pair (or single) of special values, and random numbers of every scale."""
    rng = np.random.default_rng(7)
    pairs = list(itertools.product(SPECIAL, repeat=arity))
    columns = [np.array([p[k] for p in pairs], dtype=np.float64) for k in range(arity)]
    random = [rng.standard_normal(5000) * 10.0 ** rng.integers(-8, 4, 5000) for _ in range(arity)]
    return [np.concatenate([c, r]) for c, r in zip(columns, random, strict=True)]


def cases() -> list[tuple[str, dict[str, float]]]:
    return [(name, {"exponent": k}) for name in RULES if RULES[name].attrs for k in EXPONENTS] + [
        (name, {}) for name in RULES if not RULES[name].attrs
    ]


# -- the table ---------------------------------------------------------------------------------------
def test_the_committed_c_header_is_what_the_table_gives() -> None:
    """csrc/opmath.h is generated (`python -m graphsvc.ops.opmath`); after a change to the table, run it."""
    assert (ROOT / "csrc" / "opmath.h").read_text() == opmath.c_header()


def test_the_built_extension_comes_from_this_table() -> None:
    creplay = require_native("replay")
    assert creplay.opmath_digest == opmath.digest()
    assert len(opmath.digest()) == 8


def test_an_extension_built_from_another_table_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the replay extension built from another table, no primitive runs compiled: neither the
    primitive sweeps of a replay on the compiled engine nor the builtin ops' elementwise loop (the
    compiled orderings and the plain backward sweep, which know no op, still run)."""
    from graphsvc.graph import GraphBuilder
    from graphsvc.pluginhost import load_registry
    from graphsvc.replay import columns

    compiled = require_compiled()
    registry, _ = load_registry(disable_third_party=True)
    b = GraphBuilder()
    x = b.leaf(0.5, name="x")
    graph = b.build([b.add("tanh", [b.add("mul", [x, b.leaf(3.0)])])])
    engine = kernels.Engine(compiled)
    expected = columns.forward(graph, registry, engine=engine)
    expected_grads = columns.backward(graph, registry, 3, expected, engine=engine)
    calls: list[str] = []
    for name in ("forward_all_primitives", "forward_primitives", "primitive_derivatives", "backward_primitives"):
        kernel = getattr(compiled, name)
        monkeypatch.setattr(compiled, name, lambda *args, name=name, kernel=kernel: calls.append(name) or kernel(*args))
    for name in ("elementwise", "elementwise_partials"):
        monkeypatch.setattr(compiled, name, lambda *args, name=name: calls.append(name))
    monkeypatch.setattr(opmath, "RULES", {**RULES, "double": Rule(1, "x + x", ("2",), "2x")})
    opmath.compiled_primitives.cache_clear()
    try:
        assert opmath.compiled_primitives() is False
        values = columns.forward(graph, registry, engine=engine)
        grads = columns.backward(graph, registry, 3, values, engine=engine)
        assert calls == []  # numpy's tanh, not libm's through the C loop: the last bit may differ
        np.testing.assert_allclose(values, expected, rtol=1e-12)
        np.testing.assert_allclose(grads, expected_grads, rtol=1e-12)
    finally:
        monkeypatch.undo()
        opmath.compiled_primitives.cache_clear()
    assert opmath.compiled_primitives() is True
    assert kernels.opmath_digest() == opmath.digest()


def test_the_primitives_are_the_table_in_order() -> None:
    assert opmath.PRIMITIVES == (
        *("add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt"),
        *("sin", "cos", "tanh", "relu", "sigmoid", "abs", "max", "min"),
    )
    assert opmath.PRIMITIVE_ARITY == {name: rule.arity for name, rule in RULES.items()}
    assert {name: attrs for name, attrs in opmath.PRIMITIVE_ATTRS.items() if attrs} == {"pow": ("exponent",)}
    assert opmath.CODES["add"] == 1 and opmath.CODES["min"] == 17


def test_which_ops_are_correctly_rounded() -> None:
    """Those give the same bits from numpy, C and Python on every CPU; the others use libm."""
    exact = [name for name in RULES if opmath.rounded(name)]
    assert exact == ["add", "sub", "mul", "div", "neg", "sqrt", "relu", "abs", "max", "min"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (Rule(1, "x + z", ("1",), ""), "op bad: 'x + z' uses 'z', not one of x"),
        (Rule(1, "x", ("out + y",), ""), "op bad: 'out + y' uses 'y', not one of x, out"),
        (Rule(1, "x / 2", ("1",), ""), "op bad: 'x / 2': only + - * (and the words) combine numbers"),
        (Rule(1, "hypot(x, x)", ("1",), ""), "op bad: 'hypot(x, x)': hypot(x, x) is not a call of a word"),
        (Rule(1, "exp(x, x)", ("1",), ""), "op bad: 'exp(x, x)': exp(x, x) is not a call of a word"),
        (Rule(1, "x if x else 0", ("1",), ""), "op bad: 'x if x else 0': IfExp is not part of the rule language"),
        (Rule(1, "'x'", ("1",), ""), "op bad: \"'x'\": 'x' is not a number"),
        (Rule(1, "x ** 2", ("1",), ""), "op bad: 'x ** 2': only + - * (and the words) combine numbers"),
        (Rule(1, "+x", ("1",), ""), "op bad: '+x': only unary - is allowed"),
    ],
)
def test_a_rule_outside_the_language_is_refused(rule: Rule, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(RULES, "bad", rule)
    with pytest.raises(ValueError) as info:
        opmath.python_forward.__wrapped__("bad")
        opmath.python_partials.__wrapped__("bad")
    assert str(info.value) == message


def test_the_generated_code_of_a_rule() -> None:
    """Fully parenthesized, so each operation rounds where the rule's reading says; the words of C."""
    header = opmath.c_header()
    assert "case OPMATH_SIGMOID: return opmath_div(1.0, (1.0 + opmath_exp((-x)))); /* div(1, 1 + exp(-x)) */" in header
    assert "        *dx = (opmath_gt(x, y) + (0.5 * opmath_eq(x, y)));" in header
    assert "        *dx = (p * opmath_pow(x, (p - 1.0)));" in header
    assert "OPMATH_INLINE double opmath_maximum(double a, double b) { return (a > b || a != a) ? a : b; }" in header


# -- the backends against each other --------------------------------------------------------------
def test_python_floats_by_hand() -> None:
    f, d = opmath.python_forward, opmath.python_partials
    assert f("div")(1.0, -0.0) == -math.inf and math.isnan(f("div")(0.0, 0.0))
    assert f("pow")(0.0, -1.0) == math.inf and f("pow")(-0.0, -3.0) == -math.inf and f("pow")(-0.0, -2.0) == math.inf
    assert f("pow")(-10.0, 309.0) == -math.inf and f("pow")(-10.0, 310.0) == math.inf
    assert math.isnan(f("pow")(-8.0, 1 / 3))
    x = -1.3275170599102342  # libm's pow(x, 2.0) is one ulp above x * x here; a square is x * x
    assert f("pow")(x, 2.0) == x * x == 1.7623015443527121
    assert f("exp")(1000.0) == math.inf and f("log")(0.0) == -math.inf and math.isnan(f("log")(-1.0))
    assert math.isnan(f("sqrt")(-1.0)) and math.isnan(f("sin")(math.inf)) and math.isnan(f("cos")(-math.inf))
    assert f("sigmoid")(-1000.0) == 0.0 and f("sigmoid")(0.0) == 0.5
    assert math.copysign(1.0, f("max")(0.0, -0.0)) == -1.0  # numpy's tie: the second operand
    assert math.isnan(f("max")(1.0, math.nan)) and math.isnan(f("min")(math.nan, 1.0))
    assert f("relu")(-0.0) == 0.0 and math.copysign(1.0, f("relu")(-0.0)) == 1.0
    assert d("max")(2.0, 2.0, 2.0) == (0.5, 0.5) and d("min")(1.0, 2.0, 1.0) == (1.0, 0.0)
    assert d("abs")(-0.0, 0.0) == (0.0,) and d("relu")(0.0, 0.0) == (0.0,)
    assert d("div")(1.0, 4.0, 0.25) == (0.25, -0.0625) and d("pow")(3.0, 27.0, 3.0) == (27.0,)


@pytest.mark.parametrize(("name", "attrs"), cases(), ids=lambda c: c if isinstance(c, str) else repr(c))
def test_python_floats_and_the_c_loop_give_the_same_bits(name: str, attrs: dict[str, float]) -> None:
    """Value's arithmetic (math: libm) and the compiled kernels (libm) on one machine: every op,
    special values and random ones, forward and derivatives."""
    jit = require_compiled()
    rule, code = RULES[name], opmath.CODES[name]
    param = attrs.get("exponent", 0.0)
    inputs = points(rule.arity)
    x, y = inputs[0], inputs[-1]
    out = jit.elementwise(code, x, y, param)
    dx, dy = jit.elementwise_partials(code, x, y, out, param)
    forward, partials = opmath.python_forward(name), opmath.python_partials(name)
    args = list(zip(*(c.tolist() for c in inputs), strict=True))
    assert same_bits(out, [forward(*a, *attrs.values()) for a in args])
    python_partials = [partials(*a, o, *attrs.values()) for a, o in zip(args, out.tolist(), strict=True)]
    assert same_bits(dx, [p[0] for p in python_partials])
    if rule.arity == 2:
        assert same_bits(dy, [p[1] for p in python_partials])


@pytest.mark.parametrize(("name", "attrs"), cases(), ids=lambda c: c if isinstance(c, str) else repr(c))
def test_numpy_and_the_c_loop(name: str, attrs: dict[str, float]) -> None:
    """The numpy functions derived from the table: the same bits as the C loop for the correctly
    rounded ops; for the others (numpy's own loops), the same numbers within a few ulps."""
    jit = require_compiled()
    rule, code = RULES[name], opmath.CODES[name]
    param = attrs.get("exponent", 0.0)
    inputs = points(rule.arity)
    forward, derivatives = opmath.numpy_functions(name)
    with np.errstate(all="ignore"):
        out = np.broadcast_to(forward(*inputs, **attrs), inputs[0].shape)
        partials = [np.broadcast_to(d, out.shape) for d in derivatives(*inputs, out, **attrs)]
    compiled = jit.elementwise(code, inputs[0], inputs[-1], param)
    compiled_partials = jit.elementwise_partials(code, inputs[0], inputs[-1], out.copy(), param)[: rule.arity]
    if opmath.rounded(name):
        assert same_bits(out, compiled)
        for mine, theirs in zip(partials, compiled_partials, strict=True):
            assert same_bits(mine, theirs)
    else:  # numpy's loops take shortcuts of their own at special values (power(-inf, 0.5) is nan)
        finite = np.isfinite(out) & np.isfinite(compiled)
        assert finite.any() or np.isnan(compiled).all()
        np.testing.assert_allclose(out[finite], compiled[finite], rtol=1e-14, atol=1e-300)
        for mine, theirs in zip(partials, compiled_partials, strict=True):
            both = finite & np.isfinite(mine) & np.isfinite(theirs)
            np.testing.assert_allclose(mine[both], theirs[both], rtol=1e-13, atol=1e-300)


def test_the_c_loop_refuses_bad_arguments() -> None:
    creplay = require_native("replay")
    x = np.ones(3)
    with pytest.raises(ValueError, match=r"^code 18 is not a primitive \(1 to 17\)$"):
        creplay.elementwise(18, x, x, 0.0, np.empty(3))
    with pytest.raises(ValueError, match=r"^y: 2 items, expected as many as x \(3\)$"):
        creplay.elementwise(1, x, np.ones(2), 0.0, np.empty(3))
    with pytest.raises(TypeError, match=r"^out: items of 4 bytes, not 8$"):
        creplay.elementwise(1, x, x, 0.0, np.empty(3, dtype=np.float32))


def test_regenerating_the_header(tmp_path: Path) -> None:
    target = tmp_path / "opmath.h"
    result = subprocess.run(
        [sys.executable, "-m", "graphsvc.ops.opmath", str(target)], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote {target}\n"
    assert target.read_text() == (ROOT / "csrc" / "opmath.h").read_text()


def test_the_words_of_a_rule_read_from_its_text_are_those_its_parse_finds() -> None:
    """rounded() reads the words from the rule's text (no parse at start-up): the same set."""
    import ast

    for name, rule in RULES.items():
        trees = [opmath._parse(name, rule, rule.forward, partial=False)]
        trees += [opmath._parse(name, rule, p, partial=True) for p in rule.partials]
        calls = {
            n.func.id for t in trees for n in ast.walk(t) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert opmath._words(name) == calls, name


def test_numpy_functions_parse_their_rule_at_their_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = opmath._parse

    def counted(name: str, rule: Rule, source: str, *, partial: bool) -> Any:
        parsed.append(source)
        return real(name, rule, source, partial=partial)

    monkeypatch.setattr(opmath, "_parse", counted)
    forward, derivatives = opmath.numpy_functions("tanh")
    assert parsed == []  # registering an op parses nothing
    assert forward(np.array([0.0, 1.0])).tolist() == np.tanh([0.0, 1.0]).tolist()  # numpy's word: its bits
    assert forward(np.array(2.0)) == np.tanh(2.0)
    assert parsed == ["tanh(x)"]  # once, at the first call
    assert derivatives(np.array(0.5), np.array(0.25)) == (1 - 0.25 * 0.25,)
    assert parsed == ["tanh(x)", "1 - out * out"]
