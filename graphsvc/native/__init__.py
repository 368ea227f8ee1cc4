"""Which code runs a graph's sweeps: the :class:`Engine`, chosen once at the top of a replay
(:func:`engine_for`) and handed down to every sweep it makes in :mod:`graphsvc.replay.columns`,
:mod:`graphsvc.topo` and :mod:`graphsvc.graph`.

An engine is either compiled or the reference. Each compiled kernel is written in C
(``csrc/topo.c``, ``csrc/replay.c``; built at install by ``hatch_build.py``) and called through a
thin module (:mod:`graphsvc.native.topo_kernels`, :mod:`graphsvc.native.replay_kernels`) that allocates its
results with numpy. Each is the twin of a pure-Python reference kept beside its caller; the tests
compare the two on random graphs, bit for bit, by passing each engine explicitly. The kernels cost
nothing to start (no compiler at run time, no cache), so they run for every graph of
:data:`JIT_THRESHOLD` nodes or more; ``GRAPHSVC_JIT=0`` turns them off, and where the extensions
could not be built (no C compiler at install) the references run, with the same results.

None of these sweeps recurses: each keeps an explicit stack in an array.
"""

from __future__ import annotations

import os
from functools import cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

#: Graphs with fewer nodes use the pure-Python references (as fast there, and the oracle every
#: compiled path is tested against).
JIT_THRESHOLD = 1_000

#: Forward replay computes levels narrower than this node by node (one Python call each), wider
#: ones one numpy call per (op, attributes) group: a deep chain is all narrow levels, an MLP layer wide.
NARROW_LEVEL = 32

if TYPE_CHECKING:
    #: The primitives the compiled replay knows, by the name an op gives as its ``kernel``, with the
    #: number of inputs of each: the elementwise ops of :data:`graphsvc.ops.opmath.RULES`. An op may name
    #: one only if its forward and derivatives compute exactly what the primitive computes (the
    #: builtin ops of the same names do: they are derived from the same table). A primitive with an
    #: attribute (``pow``'s ``exponent``) takes it as a per-node parameter.
    PRIMITIVE_ARITY: dict[str, int]
    #: The same names in order: position + 1 is the primitive's code in ``csrc/opmath.h``.
    PRIMITIVES: tuple[str, ...]
    #: The attributes each primitive takes, as per-node parameters (at most one: ``pow``'s ``exponent``).
    PRIMITIVE_ATTRS: dict[str, tuple[str, ...]]


def __getattr__(name: str) -> Any:
    """:data:`PRIMITIVE_ARITY`, :data:`PRIMITIVES` and :data:`PRIMITIVE_ATTRS`, made from
    :mod:`graphsvc.ops.opmath`'s table when first asked for: a load, whose structure check uses the
    compiled kernels, never imports the op table."""
    if name not in ("PRIMITIVE_ARITY", "PRIMITIVES", "PRIMITIVE_ATTRS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from graphsvc.ops.opmath import RULES

    arity = {op: rule.arity for op, rule in RULES.items()}
    globals().update(
        PRIMITIVE_ARITY=arity, PRIMITIVES=tuple(arity), PRIMITIVE_ATTRS={op: rule.attrs for op, rule in RULES.items()}
    )
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), "PRIMITIVE_ARITY", "PRIMITIVES", "PRIMITIVE_ATTRS"})


@cache
def _compiled() -> Any:
    """A namespace of every compiled kernel, or None when they are turned off or not all built."""
    topo = _compiled_topo()
    if topo is None:
        return None
    try:
        from graphsvc.native import replay_kernels as _replay_kernels
    except ImportError:  # an extension was not built here: the references run
        return None
    from graphsvc.ops.opmath import digest

    if _replay_kernels.OPMATH_DIGEST != digest():  # built from another op table: rebuild it
        return None
    return SimpleNamespace(**vars(topo), **{name: getattr(_replay_kernels, name) for name in _replay_kernels.__all__})


@cache
def _compiled_topo() -> Any:
    """A namespace of the compiled structure and order kernels (``csrc/topo.c``), or None."""
    if os.environ.get("GRAPHSVC_JIT", "1") == "0":
        return None
    try:
        from graphsvc.native import topo_kernels as _topo_kernels
    except ImportError:
        return None
    return SimpleNamespace(**{name: getattr(_topo_kernels, name) for name in _topo_kernels.__all__})


class Engine(NamedTuple):
    """How one replay runs its sweeps: chosen once at its top and passed down, never looked up again.

    ``kernels`` is the namespace of compiled kernels, or ``None`` for the pure-Python references
    (the oracle every compiled path is tested against). ``narrow_level`` splits forward replay
    between node-by-node calls and numpy groups (see :data:`NARROW_LEVEL`): 0 groups every level,
    a number larger than the graph computes every node on its own. (A NamedTuple, not a dataclass:
    every command that loads a file makes one.)
    """

    kernels: Any = None
    narrow_level: int = NARROW_LEVEL

    @property
    def name(self) -> str:
        """``"compiled"`` or ``"reference"``."""
        return "reference" if self.kernels is None else "compiled"

    def __repr__(self) -> str:  # not the kernels' namespace, a screen of functions
        return f"Engine({self.name}, narrow_level={self.narrow_level})"


#: The pure-Python references, whatever the graph's size.
REFERENCE = Engine()


def engine_for(num_nodes: int) -> Engine:
    """The engine for a graph of this size: the compiled kernels from :data:`JIT_THRESHOLD` nodes
    on, where they are built and not turned off (``GRAPHSVC_JIT=0``); else the references."""
    return REFERENCE if num_nodes < JIT_THRESHOLD else Engine(_compiled())


def compiled_checks() -> Engine:
    """The compiled structure and order kernels whatever the graph's size, where they are built and
    not turned off, else the references: for :meth:`graphsvc.graph.Graph.check` (microseconds
    compiled, tens of them in numpy), with no replay kernels, so a load never imports the op table."""
    return Engine(_compiled_topo())


@cache
def compiled_table() -> Any:
    """``graphsvc.native._ctable`` (``csrc/table.c``: a file header's walk and its tensor table's check, in
    C), or None where it was not built (no C compiler at install), or was built from an older
    ``csrc/table.c`` than this Python (a checkout not rebuilt: it lacks ``scan``). Without it,
    :mod:`graphsvc.format.fastload` walks every header in Python and :mod:`graphsvc.format.document` checks every
    table entry by entry, with the same results."""
    try:
        from graphsvc.native import _ctable
    except ImportError:
        return None
    return _ctable if hasattr(_ctable, "scan") else None


def compiled_elementwise() -> Any:
    """The compiled kernels for :mod:`graphsvc.ops.builtin`' elementwise loops, whatever the graph's
    size (an op must compute the same bits on every path), or ``None`` where they are off or not built."""
    return _compiled()
