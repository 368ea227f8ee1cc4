"""Compiled versions of the graph sweeps in :mod:`graphsvc.topo` and :mod:`graphsvc.replay`.

Each function here is a line-for-line twin of a pure-Python reference kept beside its caller (the
tests compare the two on random graphs, bit for bit). They are compiled with numba, cached on disk,
and used only for graphs of at least :data:`JIT_THRESHOLD` nodes, so small graphs and the CLI's
start-up never pay numba's import; the structure check that every load runs is compiled only once
numba runs anyway, or for very large graphs (:func:`compiled_if_running`). ``GRAPHSVC_JIT=0``
turns them off; without numba installed the references run.

None of these sweeps recurses: each keeps an explicit stack in an array.
"""

from __future__ import annotations

import os
from functools import cache
from types import SimpleNamespace
from typing import Any

#: Graphs with fewer nodes use the pure-Python sweeps (numba's start-up, its import and first call,
#: costs about 0.9 s per process).
JIT_THRESHOLD = 50_000

#: The primitives the compiled replay knows, by the name an op gives as its ``kernel``; an op may
#: name one only if its forward and derivatives compute exactly what the primitive computes (the
#: builtin ops of the same names do). Position + 1 is the primitive's code in ``_jit``.
PRIMITIVES = ("add", "sub", "mul", "div", "neg", "relu", "abs", "max", "min")
#: The number of inputs of each primitive.
PRIMITIVE_ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "neg": 1, "relu": 1, "abs": 1, "max": 2, "min": 2}


@cache
def _compiled() -> Any:
    """A namespace of every compiled kernel, or None when they are turned off or none is available.

    The kernels written in C (each module wraps one extension built from ``csrc/``) come first;
    numba's ``_jit`` supplies what none of them has yet."""
    if os.environ.get("GRAPHSVC_JIT", "1") == "0":
        return None
    found: dict[str, Any] = {}
    for module in _native_modules():
        found.update({name: getattr(module, name) for name in module.__all__})
    try:
        from graphsvc import _jit
    except ImportError:
        pass
    else:
        for name in _jit.KERNELS:
            found.setdefault(name, getattr(_jit, name))
    return SimpleNamespace(**found) if found else None


def _native_modules() -> list[Any]:
    """The modules of C kernels whose extension was built here."""
    modules: list[Any] = []
    try:
        from graphsvc import _topo_kernels

        modules.append(_topo_kernels)
    except ImportError:
        pass
    try:
        from graphsvc import _replay_kernels  # type: ignore[attr-defined, unused-ignore]

        modules.append(_replay_kernels)
    except ImportError:
        pass
    return modules


#: Set once a caller has been handed the compiled kernels: numba is then running in this process.
_running = False


def compiled_for(num_nodes: int) -> Any:
    """The compiled kernels when they are worth it for a graph of this size, else ``None``."""
    global _running
    if num_nodes < JIT_THRESHOLD:
        return None
    jit = _compiled()
    _running = _running or jit is not None
    return jit


#: From this size on, :func:`compiled_if_running` starts numba even when nothing else has: in a fresh
#: process numpy's structure check of 10,000,000 nodes takes about 1.2 s, numba's start-up 0.9 s.
START_THRESHOLD = 5_000_000


def compiled_if_running(num_nodes: int) -> Any:
    """Like :func:`compiled_for`, but below :data:`START_THRESHOLD` nodes only once this process
    already uses the kernels.

    For a single pass that numpy does in milliseconds (the structure check: 20 ms at 400,000 nodes,
    40 ms at 1,000,000), numba's start-up (its import and first call, about 0.9 s) is not worth
    paying: ``graphsvc validate`` of such a file would spend most of its time there. Once another
    step has paid it, the compiled pass is the faster one."""
    return compiled_for(num_nodes) if _running or num_nodes >= START_THRESHOLD else None
