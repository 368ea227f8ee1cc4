"""Shell completion of graphsvc's options: node names from the command's graph file, ``NAME=`` for
``--set``, op names for ``gradcheck --op``. Each callback returns nothing on any error, and never
reads a file that could block the shell (a FIFO, standard input) or take long (a big one).

Imported when the CLI starts (its callbacks are declared with the options): what reading a graph or
loading plugins needs is imported inside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from graphsvc.graph import Graph

__all__ = ["COMPLETION_MAX_BYTES", "assignments", "completion_file", "completion_graph", "node_names", "op_names"]

#: Shell completion reads node names from graph files up to this size (a bigger file would stall the shell).
COMPLETION_MAX_BYTES = 64 << 20


def completion_graph(ctx: typer.Context) -> Graph | None:
    """The graph named by the command's FILE argument, when completing one of its options."""
    import stat
    import warnings

    from graphsvc.errors import GraphsvcWarning
    from graphsvc.format import load

    file = ctx.params.get("file") or completion_file(ctx)
    if file is None:
        return None
    info = Path(file).stat()
    # only a regular file of bounded size: a FIFO, a device or standard input could block the shell
    if not stat.S_ISREG(info.st_mode) or info.st_size > COMPLETION_MAX_BYTES:
        return None
    with warnings.catch_warnings():  # a warning (an unknown key) would be printed into the shell's line
        warnings.simplefilter("ignore", GraphsvcWarning)
        return load(file)


def completion_file(ctx: typer.Context) -> str | None:
    """FILE from the words being completed, when the parse stopped short of it.

    Completing ``graphsvc backward FILE --output <TAB>``, Click parses the words with the option's
    value missing and gives up before it assigns FILE; so find it among the words the shell sent
    (Typer's completion scripts put them in ``_TYPER_COMPLETE_ARGS`` or bash's ``COMP_WORDS``).
    """
    import os
    import shlex

    words = shlex.split(os.environ.get("_TYPER_COMPLETE_ARGS") or os.environ.get("COMP_WORDS") or "")
    if ctx.info_name not in words:
        return None
    takes_value = {
        name
        for param in ctx.command.params
        if param.param_type_name == "option" and not getattr(param, "is_flag", False)
        for name in param.opts
    }
    skip = False
    for word in words[words.index(ctx.info_name) + 1 :]:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in takes_value
        else:
            return word
    return None


def node_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Node names from FILE that start with what was typed; nothing on any error."""
    try:
        graph = completion_graph(ctx)
        if graph is None:
            return []
        return [name for _, name in sorted(graph.names.items()) if name.startswith(incomplete)]
    except Exception:
        return []


def assignments(ctx: typer.Context, incomplete: str) -> list[str]:
    """``NAME=`` for every named leaf or const (what --set can change: not a node of another op
    without parents, which the replay refuses); nothing on any error."""
    try:
        from graphsvc.graph import LEAF_TAGS

        graph = completion_graph(ctx)
        if graph is None or "=" in incomplete:
            return []
        settable = (graph.names[i] for i in graph.leaves().tolist() if i in graph.names and graph.op(i) in LEAF_TAGS)
        return [f"{name}=" for name in settable if name.startswith(incomplete)]
    except Exception:
        return []


def op_names(incomplete: str) -> list[str]:
    """Names of the registered ops that take inputs; nothing on any error."""
    try:
        from graphsvc.pluginhost import load_registry, plugin_output_to_stderr

        with plugin_output_to_stderr():
            registry, _ = load_registry()
        return [op.name for op in registry if op.arity > 0 and op.name.startswith(incomplete)]
    except Exception:
        return []
