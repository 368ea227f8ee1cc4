"""graphsvc: save, reload, inspect and replay computation graphs.

Attributes are imported lazily (PEP 562), so ``import graphsvc`` and the CLI's start-up do not pay
for numpy or msgpack until they are used.

>>> import graphsvc
>>> graph = graphsvc.backward(graphsvc.load("examples/seed004.msgpack"), set={"c": 2.0})  # doctest: +SKIP
>>> graph.value("L"), graph.grad("a")  # doctest: +SKIP
(40.0, 23.0)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from graphsvc._version import __version__

__all__ = [
    "CONST",
    "LEAF",
    "FormatError",
    "Graph",
    "GraphBuilder",
    "GraphsvcError",
    "Limits",
    "Op",
    "OpError",
    "OpRegistry",
    "OpSource",
    "PluginError",
    "PluginProblem",
    "ReplayError",
    "Value",
    "__version__",
    "backward",
    "diff",
    "draw",
    "dumps",
    "forward",
    "from_micrograd",
    "gradcheck",
    "hookimpl",
    "load",
    "load_registry",
    "loads",
    "reverse_topological_order",
    "save",
    "trace",
    "use_registry",
    "zero_grad",
]

_HOME = {
    "CONST": "graphsvc.graph",
    "LEAF": "graphsvc.graph",
    "FormatError": "graphsvc.errors",
    "Graph": "graphsvc.graph",
    "GraphBuilder": "graphsvc.graph",
    "GraphsvcError": "graphsvc.errors",
    "Limits": "graphsvc.format",
    "Op": "graphsvc.ops",
    "OpError": "graphsvc.errors",
    "OpRegistry": "graphsvc.ops",
    "OpSource": "graphsvc.graph",
    "PluginError": "graphsvc.errors",
    "PluginProblem": "graphsvc.pluginhost",
    "ReplayError": "graphsvc.errors",
    "Value": "graphsvc.value",
    "backward": "graphsvc.replay.run",
    "diff": "graphsvc.diff",
    "draw": "graphsvc.drawing",
    "dumps": "graphsvc.format",
    "forward": "graphsvc.replay.run",
    "from_micrograd": "graphsvc.micrograd",
    "gradcheck": "graphsvc.replay.gradcheck",
    "hookimpl": "graphsvc.hookspecs",
    "load": "graphsvc.format",
    "load_registry": "graphsvc.pluginhost",
    "loads": "graphsvc.format",
    "reverse_topological_order": "graphsvc.topo",
    "save": "graphsvc.value",
    "trace": "graphsvc.value",
    "use_registry": "graphsvc.pluginhost",
    "zero_grad": "graphsvc.value",
}

if TYPE_CHECKING:
    from graphsvc.diff import diff
    from graphsvc.drawing import draw
    from graphsvc.errors import FormatError, GraphsvcError, OpError, PluginError, ReplayError
    from graphsvc.format import Limits, dumps, load, loads
    from graphsvc.graph import CONST, LEAF, Graph, GraphBuilder, OpSource
    from graphsvc.hookspecs import hookimpl
    from graphsvc.micrograd import from_micrograd
    from graphsvc.ops import Op, OpRegistry
    from graphsvc.pluginhost import PluginProblem, load_registry, use_registry
    from graphsvc.replay.run import backward, forward
    from graphsvc.topo import reverse_topological_order
    from graphsvc.value import Value, save, trace, zero_grad


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'graphsvc' has no attribute {name!r}")
    module = importlib.import_module(home)
    # graphsvc.diff is a room that, called, is its function: the name is bound to the room, as
    # importing it binds it, whichever comes first (else `import graphsvc.diff` could give the function)
    value = module if home == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value
