"""Helpers for plugin authors: check an op's local derivatives against central finite differences.

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
"""

from __future__ import annotations

import inspect
import itertools
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from graphsvc.errors import GraphsvcError
from graphsvc.ops import Op, OpRegistry, evaluate, local_derivatives
from graphsvc.plugins import running_plugin_code

__all__ = ["ATTRIBUTE_SAMPLES", "SAMPLE_VALUES", "GradcheckResult", "check_op", "check_registry", "ulp_distance"]

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
        raise ValueError(f"points must be tuples of {op.arity} inputs for op {op.name!r}")
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
    ops = [op for op in registry if op.arity > 0] if names is None else [registry.get(n) for n in dict.fromkeys(names)]
    with running_plugin_code():  # once, around every op's check
        return [check_op(op, **options) for op in ops]


@dataclass
class _Outcome:
    checked: int
    skipped: int
    max_abs: float
    max_rel: float
    failure: str


def _check_at(op: Op, table: np.ndarray, attrs: Mapping[str, Any], eps: float, rtol: float, atol: float) -> _Outcome:
    inputs = [table[:, i].copy() for i in range(op.arity)]
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


def _with(attrs: Mapping[str, Any]) -> str:
    return " with " + ", ".join(f"{k}={v!r}" for k, v in attrs.items()) if attrs else ""


def _sample_points(arity: int) -> list[tuple[float, ...]]:
    """Every ordering of distinct sample values for up to 3 inputs; rotations beyond that."""
    if arity <= 3:
        return list(itertools.permutations(SAMPLE_VALUES, arity))
    n = len(SAMPLE_VALUES)
    return [tuple(SAMPLE_VALUES[(i + j) % n] for j in range(arity)) for i in range(n)]


def _attribute_samples(op: Op) -> list[dict[str, Any]]:
    """One attribute dict per value in ATTRIBUTE_SAMPLES for the forward's keywords without a default."""
    try:
        parameters = list(inspect.signature(op.forward).parameters.values())  # type: ignore[arg-type]
    except Exception:  # builtins without an inspectable signature (TypeError, ValueError), odd callables
        return [{}]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    inputs = 0
    while inputs < min(op.arity, len(parameters)) and parameters[inputs].kind in positional:
        inputs += 1
    required = [
        p.name
        for p in parameters[inputs:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.default is inspect.Parameter.empty
    ]
    if not required:
        return [{}]
    return [dict.fromkeys(required, value) for value in ATTRIBUTE_SAMPLES]


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
