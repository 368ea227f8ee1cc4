"""The math of graphsvc's builtin elementwise ops, written once: one rule per op.

Each :class:`Rule` gives an op's forward and its local derivatives (one per input) as expressions
in a small language: the names ``x`` and ``y`` (the inputs), ``out`` (the output, in derivatives)
and the op's attributes (``exponent``); float constants; ``+ - *`` and unary ``-``; and calls of
the words of :data:`WORDS` (``div``, ``exp``, ``maximum``, ``gt``...). Everything that computes
these ops is derived from the table:

* the numpy functions of :mod:`graphsvc.ops.builtin` (:func:`numpy_functions`), on arrays;
* the compiled kernels: ``python -m graphsvc.ops.opmath`` writes ``csrc/opmath.h`` (:func:`c_header`),
  the switch of every op's forward and derivatives that the sweeps of ``csrc/replay.c`` use;
  ``tests/ops/test_opmath.py`` checks that the committed header is what the table gives, and
  :func:`compiled_primitives` that the built extension is (else no primitive runs compiled);
* the Python float arithmetic of :class:`graphsvc.value.Value` (:func:`python_forward`).

Each word is defined once per backend (numpy, C, Python floats), with IEEE results everywhere:
``div(1, 0)`` is inf and ``log(-1)`` nan in all three, never an exception. Words marked
``rounded`` are one correctly rounded IEEE operation (or exact), so every backend gives the same
bits on every CPU; the others (``exp``, ``log``, ``pow``, ``sin``, ``cos``, ``tanh``) are libm's in
C and in Python's ``math``, so the C kernels and ``Value`` agree bit for bit on one machine, and
:mod:`graphsvc.ops.builtin` runs the ops that use them through the C loop when it is built.

Conventions at the points where an op is not differentiable (the same as micrograd and PyTorch):
``relu`` at 0 has derivative 0 (micrograd's ``out > 0``); ``abs`` at 0 has derivative 0
(``sign(0)``); ``max`` and ``min`` on a tie split the gradient evenly, 0.5 to each input (PyTorch's
``torch.maximum``; also what a central difference measures).

This module does not import numpy at import time (:mod:`graphsvc.value` does not import it).
"""

from __future__ import annotations

import math
import operator
import re
import sys
import zlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from graphsvc import native

if TYPE_CHECKING:
    import ast


class Rule(NamedTuple):
    """One elementwise op: its forward and one local derivative per input, as expressions."""

    arity: int
    forward: str
    partials: tuple[str, ...]
    doc: str
    #: The op's attributes (at most one: a compiled node carries one parameter).
    attrs: tuple[str, ...] = ()


# fmt: off
RULES: dict[str, Rule] = {
    # -- arithmetic ----------------------------------------------------------------------------------
    "add": Rule(2, "x + y", ("1", "1"), "x + y. Distributes the gradient: both inputs receive it unchanged."),
    "sub": Rule(2, "x - y", ("1", "-1"), "x - y."),
    "mul": Rule(2, "x * y", ("y", "x"), "x * y. Swaps the multipliers: d/dx = y, d/dy = x."),
    "div": Rule(2, "div(x, y)", ("div(1, y)", "div(-out, y)"), "x / y. d/dx = 1/y, d/dy = -x/y**2."),
    "neg": Rule(1, "-x", ("-1",), "-x."),
    "pow": Rule(
        1, "pow(x, exponent)", ("exponent * pow(x, exponent - 1)",),
        "x ** exponent, with a constant exponent (attribute `exponent`). nan for x < 0 and a non-integer exponent.",
        attrs=("exponent",),
    ),
    # -- exponentials and logarithms -----------------------------------------------------------------
    "exp": Rule(1, "exp(x)", ("out",), "e ** x. Its own derivative: d/dx = out."),
    "log": Rule(1, "log(x)", ("div(1, x)",), "Natural logarithm. nan for x < 0, -inf at 0."),
    "sqrt": Rule(1, "sqrt(x)", ("div(0.5, out)",), "Square root. nan for x < 0; the derivative is inf at 0."),
    # -- trigonometry --------------------------------------------------------------------------------
    "sin": Rule(1, "sin(x)", ("cos(x)",), "Sine (radians)."),
    "cos": Rule(1, "cos(x)", ("-sin(x)",), "Cosine (radians)."),
    # -- activations ---------------------------------------------------------------------------------
    "tanh": Rule(1, "tanh(x)", ("1 - out * out",), "Hyperbolic tangent. d/dx = 1 - out**2."),
    "relu": Rule(1, "maximum(x, 0)", ("gt(out, 0)",), "max(x, 0). The derivative at 0 is 0 (micrograd's out > 0)."),
    "sigmoid": Rule(1, "div(1, 1 + exp(-x))", ("out * (1 - out)",), "1 / (1 + e ** -x). d/dx = out * (1 - out)."),
    # -- piecewise -----------------------------------------------------------------------------------
    "abs": Rule(1, "fabs(x)", ("sign(x)",), "|x|. The derivative at 0 is 0 (sign(0))."),
    "max": Rule(
        2, "maximum(x, y)", ("gt(x, y) + 0.5 * eq(x, y)", "gt(y, x) + 0.5 * eq(x, y)"),
        "The larger of x and y. Routes the gradient to the larger input; on a tie each gets half.",
    ),
    "min": Rule(
        2, "minimum(x, y)", ("lt(x, y) + 0.5 * eq(x, y)", "lt(y, x) + 0.5 * eq(x, y)"),
        "The smaller of x and y. Routes the gradient to the smaller input; on a tie each gets half.",
    ),
}
# fmt: on

#: The ops in order: position + 1 is an op's code in the compiled kernels (0: not compiled).
CODES: dict[str, int] = {name: code for code, name in enumerate(RULES, start=1)}

#: The primitives the compiled replay knows, by the name an op gives as its ``kernel``, with the
#: number of inputs of each: the ops of :data:`RULES`. An op may name one only if its forward and
#: derivatives compute exactly what the primitive computes (the builtin ops of the same names do:
#: they are derived from this table). A primitive with an attribute (``pow``'s ``exponent``) takes it
#: as a per-node parameter.
PRIMITIVE_ARITY: dict[str, int] = {name: rule.arity for name, rule in RULES.items()}
#: The same names in order: position + 1 is the primitive's code (:data:`CODES`, ``csrc/opmath.h``).
PRIMITIVES: tuple[str, ...] = tuple(RULES)
#: The attributes each primitive takes, as per-node parameters (at most one: ``pow``'s ``exponent``).
PRIMITIVE_ATTRS: dict[str, tuple[str, ...]] = {name: rule.attrs for name, rule in RULES.items()}


# -- the words, once per backend -----------------------------------------------------------------
# Python floats: IEEE results where Python would raise (ZeroDivisionError, OverflowError, ValueError)
# or return a complex. Each calls the libm function that C's exp(), log()... call.
def _div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0.0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _numpy_pow(np: Any, a: Any, b: Any) -> Any:
    if np.ndim(b) == 0:
        if b == 2.0:
            return np.multiply(a, a)
        if b == 1.0:  # pow(a, 1.0) is a, exactly, as is a * 1.0 (in power's result dtype)
            return np.multiply(a, b)
    return np.power(a, b)


def _is_odd_integer(k: float) -> bool:
    return k == k and abs(k) != math.inf and k % 2.0 == 1.0


def _pow(a: float, k: float) -> float:
    if k == 2.0:
        return a * a
    if -math.inf < a < 0.0 and -math.inf < k < math.inf and k != math.floor(k):  # Python: a complex
        return math.nan
    try:
        result = a**k
    except ZeroDivisionError:  # 0 ** negative: inf, with 0's sign for an odd integer exponent
        return math.copysign(math.inf, a) if _is_odd_integer(k) else math.inf
    except OverflowError:  # too large: inf, negative for a negative base and an odd integer exponent
        return -math.inf if a < 0.0 and _is_odd_integer(k) else math.inf
    return result


def _exp(a: float) -> float:
    try:
        return math.exp(a)
    except OverflowError:
        return math.inf


def _log(a: float) -> float:
    return math.log(a) if a > 0.0 else (-math.inf if a == 0.0 else math.nan)


def _sqrt(a: float) -> float:
    return math.sqrt(a) if a >= 0.0 else math.nan


def _sin(a: float) -> float:
    try:
        return math.sin(a)
    except ValueError:  # sin(inf)
        return math.nan


def _cos(a: float) -> float:
    try:
        return math.cos(a)
    except ValueError:
        return math.nan


def _maximum(a: float, b: float) -> float:
    return a if a > b or a != a else b


def _minimum(a: float, b: float) -> float:
    return a if a < b or a != a else b


def _sign(a: float) -> float:
    return 1.0 if a > 0.0 else (-1.0 if a < 0.0 else (0.0 if a == 0.0 else a))


class Word(NamedTuple):
    """A function of the rule language, in each backend."""

    arity: int
    #: C: an expression of ``a`` (and ``b``), the body of ``static inline double opmath_NAME``.
    c: str
    #: Python floats.
    python: Callable[..., float]
    #: numpy: given the numpy module, the function (``np.exp``).
    numpy: Callable[[Any], Callable[..., Any]]
    #: One correctly rounded IEEE operation (or exact): the same bits from every backend, every CPU.
    rounded: bool


def _indicator(np: Any, truth: Any, a: Any) -> Any:
    """A comparison's truth as numpy gives it (an array of bools): 1.0 and 0.0 wherever it meets
    a number, without a pass that converts it first (a float32 gradient times ``relu``'s partial
    stays float32); a Python float for two scalars."""
    return truth if isinstance(truth, np.ndarray) else float(truth)


WORDS: dict[str, Word] = {
    "div": Word(2, "a / b", _div, lambda np: np.divide, rounded=True),
    "sqrt": Word(1, "sqrt(a)", _sqrt, lambda np: np.sqrt, rounded=True),
    # numpy.maximum and numpy.minimum: a nan in either operand is the result; on a tie (0.0 and
    # -0.0) the second operand (comparisons with nan are false; ``a != a`` only for nan).
    "maximum": Word(2, "(a > b || a != a) ? a : b", _maximum, lambda np: np.maximum, rounded=True),
    "minimum": Word(2, "(a < b || a != a) ? a : b", _minimum, lambda np: np.minimum, rounded=True),
    "fabs": Word(1, "fabs(a)", abs, lambda np: np.abs, rounded=True),  # clears the sign bit, of -0.0 too
    # numpy.sign: +0.0 for both zeros, nan for nan
    "sign": Word(1, "a > 0.0 ? 1.0 : (a < 0.0 ? -1.0 : (a == 0.0 ? 0.0 : a))", _sign, lambda np: np.sign, rounded=True),
    "gt": Word(
        2,
        "a > b ? 1.0 : 0.0",
        lambda a, b: 1.0 if a > b else 0.0,
        lambda np: lambda a, b: _indicator(np, np.greater(a, b), a),
        rounded=True,
    ),
    "lt": Word(
        2,
        "a < b ? 1.0 : 0.0",
        lambda a, b: 1.0 if a < b else 0.0,
        lambda np: lambda a, b: _indicator(np, np.less(a, b), a),
        rounded=True,
    ),
    "eq": Word(
        2,
        "a == b ? 1.0 : 0.0",
        lambda a, b: 1.0 if a == b else 0.0,
        lambda np: lambda a, b: _indicator(np, np.equal(a, b), a),
        rounded=True,
    ),
    "exp": Word(1, "exp(a)", _exp, lambda np: np.exp, rounded=False),
    "log": Word(1, "log(a)", _log, lambda np: np.log, rounded=False),
    # a square is a * a (correctly rounded, as numpy's array power computes it), else libm's pow;
    # numpy's power of an array to a number is ~7x a multiplication even for 2.0 and 1.0 (the
    # derivative of a square), so both take the short way there
    "pow": Word(
        2,
        "b == 2.0 ? a * a : pow(a, b)",
        _pow,
        lambda np: lambda a, b: _numpy_pow(np, a, b),
        rounded=False,
    ),
    "sin": Word(1, "sin(a)", _sin, lambda np: np.sin, rounded=False),
    "cos": Word(1, "cos(a)", _cos, lambda np: np.cos, rounded=False),
    "tanh": Word(1, "tanh(a)", math.tanh, lambda np: np.tanh, rounded=False),
}


# -- reading a rule ------------------------------------------------------------------------------
def _names(rule: Rule, *, partial: bool) -> tuple[str, ...]:
    return ("x", "y")[: rule.arity] + (("out",) if partial else ()) + rule.attrs


def _parse(name: str, rule: Rule, source: str, *, partial: bool) -> ast.expr:
    """The expression ``source`` of ``rule``, checked against the language."""
    import ast  # here, not at import: graphsvc's start-up does not need it

    tree = ast.parse(source, mode="eval").body
    allowed = _names(rule, partial=partial)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in allowed and not (isinstance(node.ctx, ast.Load) and node.id in WORDS):
                raise ValueError(f"op {name}: {source!r} uses {node.id!r}, not one of {', '.join(allowed)}")
        elif isinstance(node, ast.Call):
            word = WORDS.get(node.func.id) if isinstance(node.func, ast.Name) else None
            if word is None or node.keywords or len(node.args) != word.arity:
                raise ValueError(f"op {name}: {source!r}: {ast.unparse(node)} is not a call of a word")
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                raise ValueError(f"op {name}: {source!r}: {node.value!r} is not a number")
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
                raise ValueError(f"op {name}: {source!r}: only + - * (and the words) combine numbers")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                raise ValueError(f"op {name}: {source!r}: only unary - is allowed")
        elif not isinstance(node, (ast.Load, ast.operator, ast.unaryop, ast.expr_context)):
            raise ValueError(f"op {name}: {source!r}: {type(node).__name__} is not part of the rule language")
    return tree


#: A call of a word in a rule's text: the word's name, then ``(`` (the language has no other calls).
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")


def _words(name: str) -> set[str]:
    """The words op ``name``'s rule calls, read from its text (nothing parsed at start-up)."""
    rule = RULES[name]
    return {word for source in (rule.forward, *rule.partials) for word in _CALL.findall(source)}


def rounded(name: str) -> bool:
    """True when op ``name``'s forward and derivatives use only correctly rounded words: the same
    bits from numpy, C and Python on every CPU."""
    return all(WORDS[word].rounded for word in _words(name))


def _emit(tree: ast.expr, call: Callable[[str, list[str]], str], name: Callable[[str], str]) -> str:
    """The expression as source text, fully parenthesized (each operation rounds where Python's does)."""
    import ast

    if isinstance(tree, ast.Name):
        return name(tree.id)
    if isinstance(tree, ast.Constant):
        assert isinstance(tree.value, (int, float))  # _parse checked it
        return repr(float(tree.value))
    if isinstance(tree, ast.UnaryOp):
        return f"(-{_emit(tree.operand, call, name)})"
    if isinstance(tree, ast.BinOp):
        left, right = _emit(tree.left, call, name), _emit(tree.right, call, name)
        operator = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}[type(tree.op)]
        return f"({left} {operator} {right})"
    assert isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)
    return call(tree.func.id, [_emit(arg, call, name) for arg in tree.args])


def _closure(tree: ast.expr, params: tuple[str, ...], words: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """The expression as a function of the tuple of ``params``' values (closures, no source text:
    graphsvc never calls eval)."""
    import ast

    if isinstance(tree, ast.Name):
        return operator.itemgetter(params.index(tree.id))
    if isinstance(tree, ast.Constant):
        assert isinstance(tree.value, (int, float))  # _parse checked it
        constant = float(tree.value)
        return lambda args: constant
    if isinstance(tree, ast.UnaryOp):
        inner = _closure(tree.operand, params, words)
        return lambda args: -inner(args)
    if isinstance(tree, ast.BinOp):
        left, right = _closure(tree.left, params, words), _closure(tree.right, params, words)
        combine = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}[type(tree.op)]
        return lambda args: combine(left(args), right(args))
    assert isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)
    word = words[tree.func.id]
    parts = [_closure(arg, params, words) for arg in tree.args]
    if len(parts) == 1:
        (only,) = parts
        return lambda args: word(only(args))
    first, second = parts
    return lambda args: word(first(args), second(args))


def _function(tree: ast.expr, params: tuple[str, ...], words: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """The expression as a function of ``params`` (positional): the word itself when the
    expression applies one to the parameters in order (``tanh(x)``: math.tanh), else closures."""
    import ast

    names = [a.id if isinstance(a, ast.Name) else None for a in getattr(tree, "args", ())]
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tuple(names) == params:
        return words[tree.func.id]
    if isinstance(tree, ast.BinOp) and isinstance(tree.left, ast.Name) and isinstance(tree.right, ast.Name):
        if (tree.left.id, tree.right.id) == params:
            return {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}[type(tree.op)]
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.operand, ast.Name) and (tree.operand.id,) == params:
        return operator.neg
    run = _closure(tree, params, words)
    return lambda *args: run(args)


def _partials(op: str, params: tuple[str, ...], words: dict[str, Callable[..., Any]]) -> Callable[..., tuple[Any, ...]]:
    rule = RULES[op]
    runs = [_closure(_parse(op, rule, p, partial=True), params, words) for p in rule.partials]
    if len(runs) == 1:
        (only,) = runs
        return lambda *args: (only(args),)
    first, second = runs
    return lambda *args: (first(args), second(args))


# -- Python floats (graphsvc.value.Value) -----------------------------------------------------------
_PYTHON_WORDS: dict[str, Callable[..., Any]] = {name: word.python for name, word in WORDS.items()}


@cache
def python_forward(op: str) -> Callable[..., float]:
    """``forward(x[, y][, attribute])`` of op ``op`` on Python floats (positional arguments)."""
    rule = RULES[op]
    tree = _parse(op, rule, rule.forward, partial=False)
    return _function(tree, _names(rule, partial=False), _PYTHON_WORDS)


@cache
def python_partials(op: str) -> Callable[..., tuple[float, ...]]:
    """``partials(x[, y], out[, attribute])`` of op ``op`` on Python floats: one per input."""
    return _partials(op, _names(RULES[op], partial=True), _PYTHON_WORDS)


# -- numpy (graphsvc.ops.builtin) ---------------------------------------------------------------------
def constant_partials(op: str) -> tuple[float, ...] | None:
    """The local derivatives of op ``op`` when every one is a number (``add``: 1 and 1), else None."""
    try:
        return tuple(float(partial) for partial in RULES[op].partials)
    except ValueError:
        return None


def numpy_functions(op: str) -> tuple[Callable[..., Any], Callable[..., tuple[Any, ...]]]:
    """``forward(x[, y], **attrs)`` and ``derivatives(x[, y], out, **attrs)`` of op ``op`` on numpy
    arrays (with broadcasting); ``attrs`` must be the op's attributes, no more, no fewer. A constant
    derivative is a Python float. Each is made from the rule at its first call: registering the
    builtin ops at start-up parses nothing."""
    rule = RULES[op]
    forward_names, partial_names = _names(rule, partial=False), _names(rule, partial=True)
    return (
        _with_signature(
            lambda: _function(_parse(op, rule, rule.forward, partial=False), forward_names, _numpy_words()),
            forward_names,
        ),
        _with_signature(lambda: _partials(op, partial_names, _numpy_words()), partial_names),
    )


@cache
def _numpy_words() -> dict[str, Callable[..., Any]]:
    import numpy as np

    return {name: word.numpy(np) for name, word in WORDS.items()}


def _with_signature(build: Callable[[], Callable[..., Any]], names: tuple[str, ...]) -> Callable[..., Any]:
    """The function ``build()`` makes (positional: inputs, then attributes; made at the first call)
    taking the attributes as keywords too, with the signature ``(x[, y][, out], attribute...)``: the
    registry checks it, gradcheck reads the attributes from it, and a missing or unknown attribute
    is the TypeError Python would raise."""
    import inspect

    signature = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    inputs = tuple(n for n in names if n in ("x", "y", "out"))
    attributes = names[len(inputs) :]
    built: list[Callable[..., Any]] = []

    def function(*args: Any, **attrs: Any) -> Any:
        if not built:
            built.append(build())
        run = built[0]
        if len(args) == len(inputs) and len(attrs) == len(attributes):
            if not attrs:  # most ops have no attributes: nothing to look up
                return run(*args)
            if all(n in attrs for n in attributes):
                return run(*args, *[attrs[n] for n in attributes])
        return run(*signature.bind(*args, **attrs).args)

    function.__signature__ = signature  # type: ignore[attr-defined]
    return function


# -- C (csrc/opmath.h) --------------------------------------------------------------------------------
def _c_name(rule: Rule) -> Callable[[str], str]:
    return lambda name: "p" if name in rule.attrs else name


def _c_call(word: str, args: list[str]) -> str:
    return f"opmath_{word}({', '.join(args)})"


def digest() -> str:
    """A checksum of the table (rules and words' C spelling), written into ``csrc/opmath.h``: a
    compiled extension built from another table is not used."""
    text = repr(
        [(name, rule.arity, rule.forward, rule.partials, rule.attrs) for name, rule in RULES.items()]
        + [(name, word.arity, word.c) for name, word in WORDS.items()]
    )
    return f"{zlib.crc32(text.encode()):08x}"


@cache
def compiled_primitives() -> bool:
    """Whether the compiled kernels compute this table's primitives: the replay extension is in use
    (:func:`graphsvc.native.extension`) and was built from this table (its checksum,
    :func:`graphsvc.native.opmath_digest`, is :func:`digest`). Where it was built from another table
    (a checkout not rebuilt after the table changed), no primitive runs compiled: the replay's
    sweeps call every op's functions and the builtin ops run numpy's loops, as with the extension off."""
    return native.opmath_digest() == digest()


def c_header() -> str:
    """The text of ``csrc/opmath.h``."""
    lines = [
        "/* Generated from graphsvc/ops/opmath.py by `python -m graphsvc.ops.opmath`: do not edit (the table is the",
        " * source; tests/ops/test_opmath.py checks this file against it).",
        " *",
        " * opmath_forward(code, x, y, p) and opmath_partials(code, x, y, out, p, &dx, &dy) of every builtin",
        " * elementwise op, by its code (graphsvc.ops.opmath.PRIMITIVES: position + 1). Unary ops ignore y (and",
        " * dy); p is the op's one attribute (pow's exponent), else ignored. Compile with -ffp-contract=off:",
        " * each operation rounds as it does in numpy and in Python. */",
        "#ifndef GRAPHSVC_OPMATH_H",
        "#define GRAPHSVC_OPMATH_H",
        "",
        "#include <math.h>",
        "",
        "/* Inlined into each sweep's loop: a call per node costs as much as the node's arithmetic. */",
        "#if defined(__GNUC__)",
        "#define OPMATH_INLINE static inline __attribute__((always_inline))",
        "#else",
        "#define OPMATH_INLINE static inline",
        "#endif",
        "",
        f'#define OPMATH_DIGEST "{digest()}"',
        f"#define OPMATH_COUNT {len(RULES)}",
        "",
        "enum {",
        *(f"    OPMATH_{name.upper()} = {code}," for name, code in CODES.items()),
        "};",
        "",
        "/* The words of the rule language. */",
    ]
    for word_name, word in WORDS.items():
        params = "double a" if word.arity == 1 else "double a, double b"
        lines.append(f"OPMATH_INLINE double opmath_{word_name}({params}) {{ return {word.c}; }}")
    lines += [
        "",
        "/* 1 for an op whose nodes carry a parameter p (an attribute), else 0. */",
        "OPMATH_INLINE int opmath_takes_param(int code) {",
        "    switch (code) {",
        *(f"    case OPMATH_{n.upper()}:" for n, r in RULES.items() if r.attrs),
        "        return 1;",
        "    default:",
        "        return 0;",
        "    }",
        "}",
        "",
        "/* An op's output (nan for a code that is no op). */",
        "OPMATH_INLINE double opmath_forward(int code, double x, double y, double p) {",
        "    (void)y;",
        "    (void)p;",
        "    switch (code) {",
    ]
    for name, rule in RULES.items():
        body = _emit(_parse(name, rule, rule.forward, partial=False), _c_call, _c_name(rule))
        lines.append(f"    case OPMATH_{name.upper()}: return {body}; /* {rule.forward} */")
    lines += [
        "    default: return NAN;",
        "    }",
        "}",
        "",
        "/* An op's (d out/d x, d out/d y); dy is 0 for a unary op. */",
        "OPMATH_INLINE void opmath_partials(int code, double x, double y, double out, double p, double *dx,",
        "                                   double *dy) {",
        "    (void)y;",
        "    (void)out;",
        "    (void)p;",
        "    switch (code) {",
    ]
    for name, rule in RULES.items():
        bodies = [_emit(_parse(name, rule, s, partial=True), _c_call, _c_name(rule)) for s in rule.partials]
        dy = bodies[1] if rule.arity == 2 else "0.0"
        lines += [
            f"    case OPMATH_{name.upper()}: /* {', '.join(rule.partials)} */",
            f"        *dx = {bodies[0]};",
            f"        *dy = {dy};",
            "        return;",
        ]
    lines += ["    default: *dx = NAN; *dy = NAN; return;", "    }", "}", "", "#endif", ""]
    return "\n".join(lines)


HEADER = Path(__file__).resolve().parents[2] / "csrc" / "opmath.h"


def main(argv: list[str]) -> int:
    """``python -m graphsvc.ops.opmath [PATH]``: write the C header (default: csrc/opmath.h)."""
    path = Path(argv[0]) if argv else HEADER
    path.write_text(c_header())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
