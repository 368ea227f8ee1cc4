"""Python's cyclic garbage collector paused while millions of containers are made.

Making a container counts towards the collector's next pass; containers that live on (a loaded
graph's attribute maps, a traced graph's nodes) make full passes come again and again, each
scanning every container made so far: seconds for a million nodes, for nothing, as no cycle is
made. Reference counting still frees memory meanwhile.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector in this block (left off if it was off already)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
