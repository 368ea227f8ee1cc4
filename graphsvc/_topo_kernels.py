"""The compiled orderings and structure check (C, in ``csrc/topo.c``), as their callers in
:mod:`graphsvc.topo` and :mod:`graphsvc.graph` call them: each allocates its results with numpy and
runs the C loop. Import only through :mod:`graphsvc.kernels`; raises ImportError where the
extension was not built.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from graphsvc import _ctopo

__all__ = ["levels"]

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]


def levels(offsets: Int64Array, parents: Int32Array, n: int) -> Int64Array:
    """Twin of ``topo.levels``."""
    level = np.empty(n, dtype=np.int64)
    _ctopo.levels(offsets, parents, level)
    return level
