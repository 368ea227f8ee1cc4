"""Compiled versions of the graph sweeps in :mod:`graphsvc.topo`, :mod:`graphsvc.graph` and
:mod:`graphsvc.replay`.

Each kernel is written in C (``csrc/topo.c``, ``csrc/replay.c``; built at install by
``hatch_build.py``) and called through a thin module (:mod:`graphsvc._topo_kernels`,
:mod:`graphsvc._replay_kernels`) that allocates its results with numpy. Each is the twin of a
pure-Python reference kept beside its caller; the tests compare the two on random graphs, bit for
bit. They cost nothing to start (no compiler at run time, no cache), so they run for every graph of
:data:`JIT_THRESHOLD` nodes or more; ``GRAPHSVC_JIT=0`` turns them off, and where the extensions
could not be built (no C compiler at install) the references run, with the same results.

None of these sweeps recurses: each keeps an explicit stack in an array.
"""

from __future__ import annotations

import os
from functools import cache
from types import SimpleNamespace
from typing import Any

from graphsvc.opmath import RULES, digest

#: Graphs with fewer nodes use the pure-Python references (as fast there, and the oracle every
#: compiled path is tested against).
JIT_THRESHOLD = 1_000

#: The primitives the compiled replay knows, by the name an op gives as its ``kernel``, with the
#: number of inputs of each: the elementwise ops of :data:`graphsvc.opmath.RULES`. An op may name
#: one only if its forward and derivatives compute exactly what the primitive computes (the builtin
#: ops of the same names do: they are derived from the same table). A primitive with an attribute
#: (``pow``'s ``exponent``) takes it as a per-node parameter.
PRIMITIVE_ARITY = {name: rule.arity for name, rule in RULES.items()}
#: The same names in order: position + 1 is the primitive's code in ``csrc/opmath.h``.
PRIMITIVES = tuple(PRIMITIVE_ARITY)
#: The attributes each primitive takes, as per-node parameters (at most one: ``pow``'s ``exponent``).
PRIMITIVE_ATTRS = {name: rule.attrs for name, rule in RULES.items()}


@cache
def _compiled() -> Any:
    """A namespace of every compiled kernel, or None when they are turned off or not all built."""
    if os.environ.get("GRAPHSVC_JIT", "1") == "0":
        return None
    try:
        from graphsvc import _replay_kernels, _topo_kernels
    except ImportError:  # an extension was not built here: the references run
        return None
    if _replay_kernels.OPMATH_DIGEST != digest():  # built from another op table: rebuild it
        return None
    return SimpleNamespace(
        **{name: getattr(module, name) for module in (_topo_kernels, _replay_kernels) for name in module.__all__}
    )


def compiled_for(num_nodes: int) -> Any:
    """The compiled kernels when they are worth it for a graph of this size, else ``None``."""
    return None if num_nodes < JIT_THRESHOLD else _compiled()


def compiled_elementwise() -> Any:
    """The compiled kernels for :mod:`graphsvc.builtin_ops`' elementwise loops, whatever the graph's
    size (an op must compute the same bits on every path), or ``None`` where they are off or not built."""
    return _compiled()
