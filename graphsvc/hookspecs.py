"""The pluggy markers and hook specifications of graphsvc. Nothing else lives here.

A plugin is a module with functions marked ``@hookimpl``::

    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,)))

See docs/plugins.md for the op contract, entry points and testing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from graphsvc.ops import Op

#: The pluggy project name: entry points use the group ``graphsvc``.
PROJECT_NAME = "graphsvc"

#: Marks a hook specification (graphsvc's own use).
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: Marks a hook implementation: decorate your ``graphsvc_register_ops`` with it.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def graphsvc_register_ops(register: Callable[[Op], None]) -> None:
    """Register the plugin's ops by calling ``register(op)`` once per :class:`graphsvc.ops.Op`.

    graphsvc owns the table: ``register`` rejects a malformed op or a name another plugin already
    registered (reported as a problem naming both plugins; the first registration is kept).
    The ops are recorded with the plugin's distribution name and version, and are committed only
    if the hook returns without raising. Call ``register`` only while the hook runs.
    """
