"""The pluggy markers and hook specifications of graphsvc. Nothing else lives here.

A plugin is a module with functions marked ``@hookimpl``::

    from graphsvc.hookspecs import hookimpl
    from graphsvc.ops import Op

    @hookimpl
    def graphsvc_register_ops(register):
        register(Op("cube", 1, forward=lambda x: x**3, derivatives=lambda x, out: (3 * x**2,)))

A plugin that serves an open set of tags sharing a prefix (every PyTorch operator, ``aten.*``)
registers an op family instead, whose resolver makes each op when a graph first uses its tag::

    @hookimpl
    def graphsvc_register_op_families(register):
        register(OpFamily("aten.", resolve=aten_op, doc="PyTorch's operators, replayed by PyTorch"))

See docs/plugins.md for the op contract, entry points and testing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from graphsvc.ops import Op, OpFamily

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


@hookspec
def graphsvc_register_op_families(register: Callable[[OpFamily], None]) -> None:
    """Register the plugin's op families by calling ``register(family)`` once per
    :class:`graphsvc.ops.OpFamily`: a tag prefix, a resolver ``tag -> Op | None`` and a doc line.

    The registry asks a family's resolver for the op of a tag with its prefix the first time a graph
    uses one that no op is registered by (an op registered by name wins), and keeps the answer. A
    resolver that raises or returns anything but a well-formed op of that name leaves the tag
    unknown, with the reason. As for ops: a prefix another plugin registered is reported naming both
    (the first family is kept), the families are committed only if the hook returns without
    raising, and ``register`` may be called only while the hook runs.
    """
