"""graphsvc's C extensions: the one place that loads them, and the :class:`Engine` that says which
code runs a graph's sweeps.

Each C file ``csrc/NAME.c`` is compiled at install (by ``hatch_build.py``; nothing is compiled at
run time) into the module ``graphsvc.native._cNAME``, one of :data:`EXTENSIONS`: ``memory`` (the
memory cache of tensor replays), ``replay`` (the replay sweeps), ``table`` (a file header's walk and
its tensor table's check), ``text`` (the listings), ``topo`` (orderings and the structure check) and
``walk`` (the walks over :class:`~graphsvc.value.Value` and micrograd objects). Every module that
runs one gets it from :func:`extension` (of :mod:`graphsvc.native.loader`, re-exported here with
the rest of the loader), which gives None where it was not built (no C compiler at install),
cannot be loaded, or where ``GRAPHSVC_NATIVE=0`` turns all of them off: the caller then runs the
pure-Python twin it keeps beside it, with the same results (the tests hold each pair to the same
bits; only the ops that call libm may differ in their last bits without the replay extension, see
:mod:`graphsvc.replay.columns`). ``graphsvc --version`` says which run.

The sweeps' engine is chosen once at the top of a replay (:func:`engine_for`) and handed down to
every sweep it makes in :mod:`graphsvc.replay.columns`, :mod:`graphsvc.topo` and
:mod:`graphsvc.graph`: the compiled kernels, called through thin modules that allocate their
results with numpy (:mod:`graphsvc.native.topo_kernels`, :mod:`graphsvc.native.replay_kernels`),
for every graph of :data:`NATIVE_THRESHOLD` nodes or more, else the pure-Python references. The
compiled primitives (the elementwise ops of :mod:`graphsvc.ops.opmath`'s table, by their codes)
run only where the replay extension was built from that table: this module gives the table's
checksum the extension was built from (:func:`opmath_digest`) and :mod:`graphsvc.ops.opmath`
compares it with its own (:func:`graphsvc.ops.opmath.compiled_primitives`); this module knows no
op.

None of these sweeps recurses: each keeps an explicit stack in an array.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any, NamedTuple

from graphsvc.native.loader import EXTENSIONS, SWITCH, built, enabled, extension, opmath_digest

__all__ = [
    "EXTENSIONS",
    "NARROW_LEVEL",
    "NATIVE_THRESHOLD",
    "REFERENCE",
    "SWITCH",
    "Engine",
    "built",
    "compiled_checks",
    "compiled_elementwise",
    "compiled_table",
    "enabled",
    "engine_for",
    "extension",
    "opmath_digest",
]

#: Graphs with fewer nodes use the pure-Python references (as fast there, and the oracle every
#: compiled path is tested against).
NATIVE_THRESHOLD = 1_000

#: Forward replay computes levels narrower than this node by node (one Python call each), wider
#: ones one numpy call per (op, attributes) group: a deep chain is all narrow levels, an MLP layer wide.
NARROW_LEVEL = 32


@cache
def _compiled() -> Any:
    """A namespace of every compiled kernel (the structure and order kernels and the replay
    sweeps), or None where they are turned off or not all built. Whether the sweeps of primitives
    may run is the op table's to say (:func:`graphsvc.ops.opmath.compiled_primitives`)."""
    topo = _compiled_topo()
    if topo is None or extension("replay") is None:
        return None
    from graphsvc.native import replay_kernels

    return SimpleNamespace(**vars(topo), **{name: getattr(replay_kernels, name) for name in replay_kernels.__all__})


@cache
def _compiled_topo() -> Any:
    """A namespace of the compiled structure and order kernels (``csrc/topo.c``), or None."""
    if extension("topo") is None:
        return None
    from graphsvc.native import topo_kernels

    return SimpleNamespace(**{name: getattr(topo_kernels, name) for name in topo_kernels.__all__})


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
    """The engine for a graph of this size: the compiled kernels from :data:`NATIVE_THRESHOLD` nodes
    on, where they are built and not turned off (``GRAPHSVC_NATIVE=0``); else the references."""
    return REFERENCE if num_nodes < NATIVE_THRESHOLD else Engine(_compiled())


def compiled_checks() -> Engine:
    """The compiled structure and order kernels whatever the graph's size, where they are built and
    not turned off, else the references: for :meth:`graphsvc.graph.Graph.check` (microseconds
    compiled, tens of them in numpy), with no replay kernels."""
    return Engine(_compiled_topo())


def compiled_table() -> Any:
    """``graphsvc.native._ctable`` (``csrc/table.c``: a file header's walk and its tensor table's
    check, in C), or None where it is not in use (see :func:`extension`) or was built from an older
    ``csrc/table.c`` than this Python (a checkout not rebuilt: it lacks ``scan``). Without it,
    :mod:`graphsvc.format.fastload` walks every header in Python and :mod:`graphsvc.format.document`
    checks every table entry by entry, with the same results."""
    table = extension("table")
    return table if hasattr(table, "scan") else None


def compiled_elementwise() -> Any:
    """The compiled kernels for :mod:`graphsvc.ops.builtin`' elementwise loops, whatever the graph's
    size (an op must compute the same bits on every path), or ``None`` where they are off or not
    built. (:mod:`graphsvc.ops.builtin` runs them only when
    :func:`graphsvc.ops.opmath.compiled_primitives` says they are its table's.)"""
    return _compiled()
