"""The one loader of graphsvc's C extensions (see :mod:`graphsvc.native`, which re-exports it):
:func:`extension` loads each once, or gives None where it is not in use, and ``GRAPHSVC_NATIVE=0``
turns them all off."""

from __future__ import annotations

import importlib
import os
from functools import cache
from types import ModuleType

#: graphsvc's C extensions: ``csrc/NAME.c`` is the module ``graphsvc.native._cNAME``.
EXTENSIONS = ("json", "memory", "replay", "table", "text", "topo", "walk")

#: The environment variable that turns every extension off when set to ``0``.
SWITCH = "GRAPHSVC_NATIVE"


def enabled() -> bool:
    """False where ``GRAPHSVC_NATIVE=0`` turns the extensions off. :func:`extension` reads it when an
    extension is first asked for and keeps its answer for the process."""
    return os.environ.get(SWITCH, "1") != "0"


@cache
def extension(name: str) -> ModuleType | None:
    """The C extension ``graphsvc.native._cNAME`` (``name`` one of :data:`EXTENSIONS`), loaded once;
    None where it was not built here, cannot be loaded (built for another Python or numpy) or all
    are turned off (``GRAPHSVC_NATIVE=0``)."""
    if name not in EXTENSIONS:
        raise ValueError(f"graphsvc has no C extension {name!r} (it has {', '.join(EXTENSIONS)})")
    if not enabled():
        return None
    try:
        return importlib.import_module(f"graphsvc.native._c{name}")
    except Exception:  # not built, or not loadable here (the memory handler needs numpy 1.22 or later)
        return None


def built() -> list[str]:
    """The names of the extensions built here, on or off, found without loading any."""
    import importlib.util

    return [name for name in EXTENSIONS if importlib.util.find_spec(f"graphsvc.native._c{name}") is not None]


def opmath_digest() -> str | None:
    """The checksum of the op table the replay extension was built from (``OPMATH_DIGEST`` of the
    generated ``csrc/opmath.h``), or None where that extension is not in use.
    :func:`graphsvc.ops.opmath.compiled_primitives` compares it with the table's own."""
    replay = extension("replay")
    return None if replay is None else str(replay.opmath_digest)
