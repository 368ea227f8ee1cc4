"""Helpers for plugin authors: check an op's derivatives against central finite differences.

    from graphsvc.testing import check_op

    def test_cube():
        result = check_op(CUBE)
        assert result.ok, result.message

:func:`check_op` evaluates the op at sample points (all at once, through the same code path replay
uses), nudges each input by ``±h`` and compares ``(f(x + h) - f(x - h)) / 2h`` with the op's own
derivatives. ``graphsvc gradcheck`` runs it on every registered op.

Sample points come from :data:`SAMPLE_VALUES`, chosen away from 0, from the integers and from each
other, so kinks (``relu``, ``abs``) and ties (``max``) are not sampled. A point where the forward is
not finite (``log`` of a negative number) is skipped, so an op needs to declare nothing about its
domain. Attributes without a default (``pow``'s ``exponent``) are tried with each of
:data:`ATTRIBUTE_SAMPLES`; attributes with a default use it. Pass ``points`` or ``attrs`` to choose.

:func:`check_vjp` checks an op on arrays: its ``vjp`` (or, for an elementwise op, its derivatives
turned into one, broadcast dimensions summed back) against central finite differences of
``sum(g * forward(...))`` for a random cotangent ``g``, element by element::

    result = check_vjp(CONV2D, x, weight, attrs={"stride": 2})
    assert result.ok, result.message

:func:`random_shapes` draws shapes that broadcast together (scalars, size-1 and missing leading
dimensions among them) and :func:`reduction_attrs` the ``axis``/``keepdims`` cases of a reduction.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from numbers import Real
from typing import Any

import numpy as np

from graphsvc.errors import GraphsvcError, OpError
from graphsvc.ops import (
    Op,
    OpRegistry,
    _as_column,
    _call_one,
    check_op_declaration,
    evaluate,
    interrupts_told_apart,
    local_derivatives,
    per_element,
)
from graphsvc.pluginhost import running_plugin_code
from graphsvc.replay.arrays import (
    cotangent_for,
    cotangents_error,
    missing_cotangent,
    output_and_residuals,
    tensor_result,
    vjp_keywords,
    vjp_of,
)
from graphsvc.replay.compare import tolerance_problem
from graphsvc.text import counted

__all__ = [
    "ATTRIBUTE_SAMPLES",
    "SAMPLE_VALUES",
    "GradcheckResult",
    "check_op",
    "check_registry",
    "check_vjp",
    "random_shapes",
    "reduction_attrs",
    "ulp_distance",
]

#: Input values the sample points are drawn from.
SAMPLE_VALUES: tuple[float, ...] = (-1.7, -0.6, 0.3, 0.9, 2.2)
#: Values tried for an attribute that has no default.
ATTRIBUTE_SAMPLES: tuple[float, ...] = (2.0, 0.5, -1.5)


@dataclass(frozen=True)
class GradcheckResult:
    """The outcome of checking one op."""

    op: str
    plugin: str | None
    plugin_version: str | None
    #: True when every checked point agreed within tolerance.
    ok: bool
    #: How many (point, attributes) pairs were checked.
    points: int
    #: How many were skipped because the forward was not finite there.
    skipped: int
    max_abs_error: float
    max_rel_error: float
    #: Empty when ok; otherwise the first disagreement (or the error the op raised).
    message: str = ""
    #: Why the op was not checked (a vjp op without ``samples``); empty when it was.
    unchecked: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite errors become the strings ``"nan"`` and ``"inf"``)."""
        data = asdict(self)
        for key in ("max_abs_error", "max_rel_error"):
            if not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


def check_op(
    op: Op,
    points: Sequence[Sequence[float]] | None = None,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    attrs: Mapping[str, Any] | None = None,
) -> GradcheckResult:
    """Compare ``op``'s local derivatives with central finite differences.

    ``points`` holds tuples of ``op.arity`` inputs (default: drawn from :data:`SAMPLE_VALUES`).
    The step for an input ``x`` is ``eps * max(1, |x|)``. A point passes when
    ``|analytic - numeric| <= atol + rtol * |numeric|`` for every input. ``attrs`` fixes the node
    attributes (default: see the module docstring). An op that raises (anything, ``sys.exit``
    included) or returns something other than numbers fails with the :class:`~graphsvc.errors.ReplayError` text;
    what it prints goes to stderr.
    """
    _check_options(eps, rtol, atol)
    with running_plugin_code():
        return _check_op(op, points, eps, rtol, atol, attrs)


def _check_op(
    op: Op,
    points: Sequence[Sequence[float]] | None,
    eps: float,
    rtol: float,
    atol: float,
    attrs: Mapping[str, Any] | None,
) -> GradcheckResult:

    def result(ok: bool, checked: int, skipped: int, abs_err: float, rel_err: float, message: str) -> GradcheckResult:
        return GradcheckResult(op.name, op.plugin, op.plugin_version, ok, checked, skipped, abs_err, rel_err, message)

    if op.arity == 0:
        return result(True, 0, 0, 0.0, 0.0, "")
    table = np.array(list(points) if points is not None else _sample_points(op.arity), dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != op.arity:
        raise ValueError(f"points must be tuples of {counted(op.arity, 'input')} for op {op.name!r}")
    checked = skipped = 0
    max_abs = max_rel = 0.0
    first_failure = ""
    for sample in [dict(attrs)] if attrs is not None else _attribute_samples(op):
        try:
            outcome = _check_at(op, table, sample, eps, rtol, atol)
        except GraphsvcError as exc:
            return result(False, checked, skipped, max_abs, max_rel, f"{exc}{_with(sample)}")
        checked += outcome.checked
        skipped += outcome.skipped
        max_abs = max(max_abs, outcome.max_abs)
        max_rel = max(max_rel, outcome.max_rel)
        first_failure = first_failure or outcome.failure
    if first_failure:
        return result(False, checked, skipped, max_abs, max_rel, first_failure)
    if checked == 0:
        message = "the forward is not finite at any sample point; pass points inside the op's domain"
        return result(False, 0, skipped, max_abs, max_rel, message)
    return result(True, checked, skipped, max_abs, max_rel, "")


def check_registry(registry: OpRegistry, names: Iterable[str] | None = None, **options: Any) -> list[GradcheckResult]:
    """Check the named ops (default: every op with inputs, by name). An unknown name is an OpError.

    ``options`` go to :func:`check_op` (``eps``, ``rtol``, ``atol``).
    """
    unknown = sorted(set(options) - {"eps", "rtol", "atol"})
    if unknown:
        raise TypeError(f"check_registry() takes the options eps, rtol and atol, not {unknown[0]!r}")
    _check_options(**options)
    ops = [op for op in registry if op.arity > 0] if names is None else [registry.get(n) for n in dict.fromkeys(names)]
    with running_plugin_code():  # once, around every op's check
        return [_check_samples(op, **options) if op.vjp is not None else check_op(op, **options) for op in ops]


def _check_samples(op: Op, **options: Any) -> GradcheckResult:
    """Check an op given by its VJP with :func:`check_vjp` at each of its ``samples``, merged into
    one result (the first failure's message); without samples, a result that says so."""
    if op.samples is None:
        return GradcheckResult(
            op.name, op.plugin, op.plugin_version, True, 0, 0, 0.0, 0.0, unchecked="it gives a vjp but no samples"
        )
    try:
        samples = list(op.samples(np.random.default_rng(0)))
    except Exception as exc:
        message = f"op {op.name!r} ({op.source}): samples raised {type(exc).__name__}: {exc}"
        return GradcheckResult(op.name, op.plugin, op.plugin_version, False, 0, 0, 0.0, 0.0, message)
    for number, (inputs, _) in enumerate(samples):  # one check_vjp would refuse with a ValueError
        problem = op.arity_problem(len(inputs))
        if problem is not None:
            given = counted(len(inputs), "input")
            message = f"op {op.name!r} ({op.source}): sample {number} has {given}, but the op {problem}"
            return GradcheckResult(op.name, op.plugin, op.plugin_version, False, 0, 0, 0.0, 0.0, message)
    results = [check_vjp(op, *inputs, attrs=attrs, **options) for inputs, attrs in samples]
    failures = [r.message for r in results if not r.ok]
    return GradcheckResult(
        op.name,
        op.plugin,
        op.plugin_version,
        not failures,
        sum(r.points for r in results),
        sum(r.skipped for r in results),
        max((r.max_abs_error for r in results), default=0.0),
        max((r.max_rel_error for r in results), default=0.0),
        failures[0] if failures else "",
    )


@dataclass
class _Outcome:
    checked: int
    skipped: int
    max_abs: float
    max_rel: float
    failure: str


def _check_at(op: Op, table: np.ndarray, attrs: Mapping[str, Any], eps: float, rtol: float, atol: float) -> _Outcome:
    inputs = [table[:, i].copy() for i in range(op.arity)]
    if op.vectorized and op.forward is not None:  # checked as a replay of arrays checks it (float16 refused)
        with np.errstate(all="ignore"), interrupts_told_apart():
            out = _as_column(op, "forward", _forward(op, inputs, attrs), len(table))
    else:
        out = evaluate(op, inputs, attrs)
    analytic = local_derivatives(op, inputs, out, attrs)
    usable = np.isfinite(out)
    numeric = []
    for i, x in enumerate(inputs):
        step = eps * np.maximum(1.0, np.abs(x))
        plus = evaluate(op, [*inputs[:i], x + step, *inputs[i + 1 :]], attrs)
        minus = evaluate(op, [*inputs[:i], x - step, *inputs[i + 1 :]], attrs)
        usable &= np.isfinite(plus) & np.isfinite(minus)
        with np.errstate(all="ignore"):
            numeric.append((plus - minus) / (2 * step))
    failure = ""
    max_abs = max_rel = 0.0
    for i in range(op.arity):
        with np.errstate(all="ignore"):
            error = np.abs(analytic[i] - numeric[i])[usable]
            scale = np.abs(numeric[i])[usable]
            error = np.where(np.isnan(error), np.inf, error)  # a nan derivative is as wrong as it gets
            relative = error / np.maximum(scale, np.finfo(np.float64).tiny)
        if error.size:
            max_abs = max(max_abs, float(error.max()))
            max_rel = max(max_rel, float(relative.max()))
        bad = np.flatnonzero(~(error <= atol + rtol * scale))
        if bad.size and not failure:
            row = int(np.flatnonzero(usable)[bad[0]])
            at = ", ".join(f"{v:g}" for v in table[row])
            failure = (
                f"d/d(input {i}) at ({at}){_with(attrs)}: derivatives give {float(analytic[i][row]):.6g}, "
                f"finite differences give {float(numeric[i][row]):.6g}"
            )
    checked = int(usable.sum())
    return _Outcome(checked, len(table) - checked, max_abs, max_rel, failure)


def _check_options(eps: Any = 1e-6, rtol: Any = 0.0, atol: Any = 0.0) -> None:
    """Refuse a step ``eps`` that is not a finite number above 0 and a tolerance that is not a finite
    number, 0 or more (:func:`graphsvc.replay.compare.tolerance_problem`)."""
    for name, value in (("eps", eps), ("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not 0 < eps < math.inf:
        raise ValueError(f"eps must be a finite number above 0, not {eps!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        problem = tolerance_problem(name, value)
        if problem is not None:
            raise ValueError(problem)


def _with(attrs: Mapping[str, Any]) -> str:
    return " with " + ", ".join(f"{k}={v!r}" for k, v in attrs.items()) if attrs else ""


def _sample_points(arity: int) -> list[tuple[float, ...]]:
    """Every ordering of distinct sample values for up to 3 inputs; rotations beyond that."""
    if arity <= 3:
        return list(itertools.permutations(SAMPLE_VALUES, arity))
    n = len(SAMPLE_VALUES)
    return [tuple(SAMPLE_VALUES[(i + j) % n] for j in range(arity)) for i in range(n)]


def _attribute_samples(op: Op) -> list[dict[str, Any]]:
    """One attribute dict per value in ATTRIBUTE_SAMPLES for the attributes the op needs (the
    forward's keywords without a default: :attr:`graphsvc.ops.Op.attributes`)."""
    required = op.attributes.required
    if not required:
        return [{}]
    return [dict.fromkeys(required, value) for value in ATTRIBUTE_SAMPLES]


# -- tensor ops: vector-Jacobian products -------------------------------------------------------
Shape = tuple[int, ...]


def check_vjp(
    op: Op,
    *inputs: Any,
    attrs: Mapping[str, Any] | None = None,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    seed: int = 0,
) -> GradcheckResult:
    """Compare ``op``'s vector-Jacobian product with central finite differences at ``inputs``.

    Float inputs are converted to float64 and passed read-only; integer inputs (index inputs) are
    passed as int64 and must get the cotangent ``None``. With ``g`` a random normal array of the
    output's shape (from ``seed``), the cotangent of input ``i`` at element ``j`` should be
    ``(sum(g * f(x_ij + h)) - sum(g * f(x_ij - h))) / 2h``, with ``h = eps * max(1, |x_ij|)``;
    every element of every float input is checked (two forward calls each), except where the
    forward is not finite. An op without a ``vjp`` has its elementwise ``derivatives`` turned into
    one (``g * partial``, summed back over broadcast dimensions). A float input whose cotangent is
    ``None`` fails the check (a replay refuses it: :func:`graphsvc.replay.arrays.missing_cotangent`).
    An element passes when ``|analytic - numeric| <= atol + rtol *
    |numeric|``; the message of a failure names the op, the input and its worst element.
    ``points`` counts the elements checked, ``skipped`` the float elements not checked (index
    inputs are neither). A ``vjp`` that takes ``needs_input_grad`` is also asked for each float
    input alone, and must give it the cotangent it gives with every input needed. An op that
    gives ``forward_with_residuals`` must get ``forward``'s output from it, and its ``vjp``, given
    those residuals, the cotangents it gives with ``residuals=None``.
    """
    _check_options(eps, rtol, atol)
    with running_plugin_code(), np.errstate(all="ignore"), interrupts_told_apart():
        return _check_vjp(op, inputs, dict(attrs or {}), eps, rtol, atol, seed)


def _check_vjp(
    op: Op, raw: Sequence[Any], attrs: dict[str, Any], eps: float, rtol: float, atol: float, seed: int
) -> GradcheckResult:
    def result(ok: bool, checked: int, skipped: int, abs_err: float, rel_err: float, message: str) -> GradcheckResult:
        return GradcheckResult(op.name, op.plugin, op.plugin_version, ok, checked, skipped, abs_err, rel_err, message)

    try:  # what registering it would refuse (a forward_with_residuals without a vjp to take them)
        check_op_declaration(op)
    except OpError as exc:
        return result(False, 0, 0, 0.0, 0.0, str(exc))
    inputs = [_check_input(op, i, x) for i, x in enumerate(raw)]
    problem = "takes 0 inputs" if op.arity == 0 else op.arity_problem(len(inputs))
    if problem is not None:
        raise ValueError(f"op {op.name!r} {problem}, got {len(inputs)}")
    prefix = f"op {op.name!r} ({op.source})"
    try:
        out = _forward(op, inputs, attrs)
        g = np.random.default_rng(seed).standard_normal(out.shape)
        g.flags.writeable = False
        analytic = _cotangents(op, g, out, inputs, attrs)
        selective = _selective_failure(op, g, out, inputs, attrs, analytic) or _residuals_failure(
            op, g, out, inputs, attrs, analytic
        )
    except GraphsvcError as exc:
        return result(False, 0, 0, 0.0, 0.0, f"{exc}{_with(attrs)}")
    if selective is not None:
        return result(False, 0, 0, 0.0, 0.0, f"{selective}{_with(attrs)}")
    checked = skipped = 0
    max_abs = max_rel = 0.0
    worst: tuple[float, str] | None = None  # (how far beyond the tolerance, message)
    for i, (x, cotangent) in enumerate(zip(inputs, analytic, strict=True)):
        if cotangent is None:
            if x.dtype.kind == "f":  # a float input needs a gradient: None would leave it zero
                message = str(missing_cotangent(op, "vjp", i))
                return result(False, checked, skipped, max_abs, max_rel, f"{message}{_with(attrs)}")
            continue  # an index input: nothing to check
        if x.dtype.kind != "f":
            message = f"{prefix}: vjp gives the {x.dtype} input {i} a cotangent; an index input gets None"
            return result(False, checked, skipped, max_abs, max_rel, message)
        numeric = np.empty(x.shape)
        for j in np.ndindex(*x.shape):
            numeric[j] = _directional_difference(op, inputs, i, j, g, attrs, eps)
        usable = np.isfinite(numeric)
        checked += int(usable.sum())
        skipped += int((~usable).sum())
        error = np.abs(cotangent - numeric)
        error = np.where(np.isnan(error), np.inf, error)  # a nan cotangent is as wrong as it gets
        scale = np.abs(numeric)
        if usable.any():
            max_abs = max(max_abs, float(error[usable].max()))
            max_rel = max(max_rel, float((error / np.maximum(scale, np.finfo(np.float64).tiny))[usable].max()))
        beyond = np.where(usable, error / (atol + rtol * scale), 0.0)
        j = np.unravel_index(int(np.argmax(beyond)), x.shape) if x.size else ()
        if x.size and beyond[j] > 1.0 and (worst is None or beyond[j] > worst[0]):
            at = "[" + ", ".join(str(int(k)) for k in j) + "]"
            name = "vjp" if op.vjp is not None else "derivatives"
            message = (
                f"{prefix}: d/d(input {i}) at {at} of {_describe(x)}{_with(attrs)}: {name} give"
                f"{'s' if name == 'vjp' else ''} {float(cotangent[j]):.6g}, finite differences give "
                f"{float(numeric[j]):.6g}"
            )
            worst = (float(beyond[j]), message)
    if worst is not None:
        return result(False, checked, skipped, max_abs, max_rel, worst[1])
    if checked == 0:
        message = f"{prefix}: nothing to check (no float input gets a cotangent where the forward is finite)"
        return result(False, 0, skipped, max_abs, max_rel, message)
    return result(True, checked, skipped, max_abs, max_rel, "")


def _check_input(op: Op, i: int, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind in "biu":
        array = array.astype(np.int64)
    elif array.dtype.kind == "f":
        array = array.astype(np.float64)
    else:
        raise ValueError(f"input {i} of op {op.name!r} must hold real numbers, not {array.dtype}")
    array.flags.writeable = False  # as in a replay: an op must not write into its inputs
    return array


def _describe(x: np.ndarray) -> str:
    return f"{x.dtype}[{','.join(map(str, x.shape))}]"


def _forward(op: Op, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """The op's output at ``inputs`` as float64, checked as a replay checks it (an array of float64,
    float32 or int64: :func:`graphsvc.replay.arrays.tensor_result`)."""
    forward = op.forward
    assert forward is not None
    if op.vectorized:
        result = _call_one(op, "forward", forward, inputs, attrs)
    else:  # its checks are the replay's; its errors name the op already
        result = per_element(op, "forward")(*inputs, **attrs)
    return tensor_result(op, "forward", result).astype(np.float64, copy=False)


def _vjp_call(
    op: Op,
    g: np.ndarray,
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    attrs: Mapping[str, Any],
    needs: tuple[bool, ...] | None,
    residuals: Any = None,
) -> Any:
    """The op's vjp (or its derivatives as one, as replay calls them), told ``needs`` when it takes
    ``needs_input_grad`` and ``needs`` is given, and given ``residuals`` when it takes them."""
    vjp = vjp_of(op)
    attrs = vjp_keywords(vjp, attrs, needs, residuals)
    if op.vjp is not None:
        return _call_one(op, "vjp", vjp.function, [g, out, *inputs], attrs)
    return vjp.function(g, out, *inputs, **attrs)  # the derived VJP's errors name the op already


def _selective_failure(
    op: Op,
    g: np.ndarray,
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    attrs: Mapping[str, Any],
    full: Sequence[np.ndarray | None],
) -> str | None:
    """For an op whose vjp takes ``needs_input_grad``: ask for each float input alone; the
    cotangent must be the one given with every input needed (bit for bit: the same arithmetic)."""
    for i, x in enumerate(inputs):
        if x.dtype.kind != "f" or full[i] is None:
            continue
        needs = tuple(j == i for j in range(len(inputs)))
        got = _cotangent(op, _vjp_call(op, g, out, inputs, attrs, needs), i, inputs)
        if not _same(got, full[i]):
            shown = "None" if got is None else "a different cotangent"
            return (
                f"op {op.name!r} ({op.source}): with needs_input_grad={needs}, vjp gives input {i} {shown}, "
                "not the one it gives with every input needed"
            )
    return None


def _residuals_failure(
    op: Op,
    g: np.ndarray,
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    attrs: Mapping[str, Any],
    full: Sequence[np.ndarray | None],
) -> str | None:
    """For an op that gives ``forward_with_residuals``: its output must be ``forward``'s, and its
    vjp given those residuals (after a second call on other inputs, as a replay makes every forward
    call before the first VJP) must give every cotangent it gives without them (bit for bit: a
    replay of stored values has none)."""
    what = "forward_with_residuals"
    if op.forward_with_residuals is None:
        return None
    prefix = f"op {op.name!r} ({op.source})"
    output, residuals = output_and_residuals(op, _call_one(op, what, op.forward_with_residuals, inputs, attrs))
    # In a replay every forward runs before any VJP: a second call, on other inputs (the same
    # numbers in reverse order), must leave the first call's residuals as they were. A plugin that
    # keeps a buffer it writes into again fails here: graphsvc made the residuals read-only.
    other = [_reversed(x) if x.dtype.kind == "f" else x for x in inputs]
    output_and_residuals(op, _call_one(op, what, op.forward_with_residuals, other, attrs))
    if not np.array_equal(tensor_result(op, what, output), out, equal_nan=True):
        return f"{prefix}: forward_with_residuals gives an output that is not the one forward gives"
    given = _vjp_call(op, g, out, inputs, attrs, None, residuals)
    for i, want in enumerate(full):
        if want is not None and not _same(_cotangent(op, given, i, inputs), want):
            return (
                f"{prefix}: given the residuals of forward_with_residuals, vjp gives input {i} "
                "a different cotangent than without them"
            )
    return None


def _cotangent(op: Op, given: Any, i: int, inputs: Sequence[np.ndarray]) -> np.ndarray | None:
    """Input ``i``'s cotangent in what the op's vjp returned, checked as a replay checks it
    (:func:`graphsvc.replay.arrays.cotangent_for`); None where the vjp gives none."""
    if not isinstance(given, tuple | list) or len(given) != len(inputs):
        raise cotangents_error(op, "vjp", given, len(inputs))
    return None if given[i] is None else cotangent_for(op, "vjp", i, given[i], inputs[i])


def _same(got: Any, want: np.ndarray | None) -> bool:
    """``got`` is ``want``, bit for bit (nan where nan)."""
    return (
        got is not None and want is not None and np.array_equal(np.asarray(got, dtype=np.float64), want, equal_nan=True)
    )


def _reversed(x: np.ndarray) -> np.ndarray:
    """``x``'s elements in reverse order, in its shape, read-only (as an input in a replay)."""
    flipped = np.ascontiguousarray(x.reshape(-1)[::-1]).reshape(x.shape)
    flipped.flags.writeable = False
    return flipped


def _cotangents(
    op: Op, g: np.ndarray, out: np.ndarray, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]
) -> list[np.ndarray | None]:
    """The op's vjp, or its elementwise derivatives as one (graphsvc.ops.elementwise_vjp, as
    replay does), each checked against its input's shape."""
    what = "vjp" if op.vjp is not None else "derivatives"
    given = _vjp_call(op, g, out, inputs, attrs, None)
    if not isinstance(given, tuple | list) or len(given) != len(inputs):
        raise cotangents_error(op, what, given, len(inputs))
    cotangents: list[np.ndarray | None] = []
    for i, (x, c) in enumerate(zip(inputs, given, strict=True)):
        if c is None or (op.vjp is None and x.dtype.kind != "f"):  # replay gives int64 inputs no gradient
            cotangents.append(None)
        elif x.dtype.kind != "f":  # an index input: the caller says it gets None
            cotangents.append(np.asarray(c))
        else:
            cotangents.append(cotangent_for(op, what, i, c, x))
    return cotangents


def _directional_difference(
    op: Op,
    inputs: Sequence[np.ndarray],
    i: int,
    j: tuple[int, ...],
    g: np.ndarray,
    attrs: Mapping[str, Any],
    eps: float,
) -> float:
    """``(sum(g * f(x + h e_j)) - sum(g * f(x - h e_j))) / 2h`` for element ``j`` of input ``i``."""
    x = inputs[i]
    step = eps * max(1.0, abs(float(x[j])))
    sums = []
    for sign in (1.0, -1.0):
        nudged = x.copy()
        nudged[j] += sign * step
        nudged.flags.writeable = False
        sums.append(float(np.sum(g * _forward(op, [*inputs[:i], nudged, *inputs[i + 1 :]], attrs))))
    return (sums[0] - sums[1]) / (2 * step)


def random_shapes(
    arity: int, count: int = 8, *, seed: int = 0, max_ndim: int = 3, max_size: int = 4
) -> list[tuple[Shape, ...]]:
    """``count`` tuples of ``arity`` shapes that broadcast together, for checking an elementwise op.

    The first tuples are the cases broadcasting gets wrong most often: every input the same shape;
    the first input a scalar ``()``; the last input missing the leading dimensions; the last input with
    size 1 in the first dimension (as a ``keepdims`` reduction leaves it). The rest are drawn from
    ``seed``: a full shape of up to ``max_ndim`` dimensions of 2 to ``max_size``, from which each
    input drops leading dimensions and sets others to 1 at random.
    """
    rng = np.random.default_rng(seed)
    full: Shape = (2, 3, 4)[:max_ndim] if max_size >= 4 else (2,) * max_ndim
    cases: list[tuple[Shape, ...]] = [(full,) * arity]
    if arity >= 1 and full:
        cases.append(((), *(full,) * (arity - 1)))
        cases.append(((full,) * (arity - 1)) + (full[1:],))
        cases.append(((full,) * (arity - 1)) + ((1, *full[1:]),))
    while len(cases) < count:
        base = tuple(int(n) for n in rng.integers(2, max_size + 1, size=int(rng.integers(1, max_ndim + 1))))
        shapes = []
        for _ in range(arity):
            shape = base[int(rng.integers(0, len(base) + 1)) :]
            shapes.append(tuple(1 if rng.random() < 0.3 else n for n in shape))
        cases.append(tuple(shapes))
    return cases[:count]


def reduction_attrs(ndim: int) -> list[dict[str, Any]]:
    """The ``axis``/``keepdims`` attributes to check a reduction (``sum``, ``mean``, ``amax``) with on
    an input of ``ndim`` dimensions: every axis, ``-1``, all axes (``None``) and, for ``ndim >= 2``,
    the pair ``[0, -1]`` (a list, as a file stores it), each with ``keepdims`` false and true."""
    axes: list[Any] = [None, *range(ndim), -1] if ndim else [None]
    if ndim >= 2:
        axes.append([0, -1])
    return [{"axis": axis, "keepdims": keepdims} for axis in axes for keepdims in (False, True)]


def ulp_distance(a: float, b: float) -> int:
    """How many steps of one float64 apart ``a`` and ``b`` are: 0 for the same number (``0.0`` and
    ``-0.0``, or two nans), 1 for neighbours. A nan against a number raises ``ValueError``.

    For comparing results that need not agree bit for bit: ``exp``, ``tanh``, ``pow``... are not
    correctly rounded, and numpy's SIMD loops, libm (``math``) and compiled code may differ in the last bit
    or two, from one CPU to another (``+ - * /``, ``sqrt``, ``abs``, ``min`` and ``max`` are exact
    in IEEE 754 and agree everywhere).
    """
    if math.isnan(a) or math.isnan(b):
        if math.isnan(a) and math.isnan(b):
            return 0
        raise ValueError(f"ulp_distance({a!r}, {b!r}): a nan is no number of steps from a number")
    return abs(_ordered(a) - _ordered(b))


def _ordered(x: float) -> int:
    """The float64's position on the number line, as an integer (``-0.0`` and ``0.0`` both 0)."""
    (bits,) = struct.unpack("<q", struct.pack("<d", x))
    return bits if bits >= 0 else -(bits & 0x7FFF_FFFF_FFFF_FFFF)
