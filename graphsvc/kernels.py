"""Compiled versions of the graph sweeps in :mod:`graphsvc.topo` and :mod:`graphsvc.replay`.

Each function here is a line-for-line twin of a pure-Python reference kept beside its caller (the
tests compare the two on random graphs, bit for bit). They are compiled with numba, cached on disk,
and used only for graphs of at least :data:`JIT_THRESHOLD` nodes, so small graphs and the CLI's
start-up never pay numba's import. ``GRAPHSVC_JIT=0`` turns them off; without numba installed the
references run.

None of these sweeps recurses: each keeps an explicit stack in an array.
"""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType
from typing import Any

#: Graphs with fewer nodes use the pure-Python sweeps (numba's import costs about half a second).
JIT_THRESHOLD = 50_000


@cache
def _compiled() -> ModuleType | None:
    if os.environ.get("GRAPHSVC_JIT", "1") == "0":
        return None
    try:
        from graphsvc import _jit
    except ImportError:
        return None
    return _jit


def compiled_for(num_nodes: int) -> Any:
    """The compiled kernels when they are worth it for a graph of this size, else ``None``."""
    if num_nodes < JIT_THRESHOLD:
        return None
    return _compiled()
