"""One exception hierarchy, rooted at :class:`GraphsvcError`.

Library code raises these; only the CLI turns them into ``Error: ...`` and an exit code.
Each class carries the exit code the CLI uses for it (see the table in docs/cli.md):

    1 GraphsvcError, ReplayError, RenderError · 2 UsageError · 3 GraphFileError, FormatError,
    GraphStructureError (the input graph) · 4 OpError and its kinds · 5 OutputError (an output that
    cannot be written)
"""

from __future__ import annotations


class GraphsvcError(Exception):
    """Root of every error graphsvc raises on purpose. Exit code 1."""

    exit_code = 1


class UsageError(GraphsvcError):
    """A request that cannot be honoured as asked (an unknown node name, a bad ``--set``). Exit 2."""

    exit_code = 2


class GraphFileError(GraphsvcError):
    """A graph file that is missing or cannot be read. Exit 3.

    An output that cannot be written is its subclass :class:`OutputError` (exit 5)."""

    exit_code = 3


class OutputError(GraphFileError):
    """An output that cannot be written or was cut short: a file (``--write``, ``convert -o``,
    ``render -o``: its folder is missing, it names a device, the disk is full) or standard output
    (full, or over ``ulimit -f``). Exit 5.

    A subclass of :class:`GraphFileError`, so code that caught a failed save as one still does;
    its exit code is its own: a failed output says nothing about the input graph."""

    exit_code = 5


class FormatError(GraphFileError):
    """Bytes that are not a valid graphsvc document: the only error a decoder raises. Exit 3."""


class GraphStructureError(GraphsvcError):
    """A graph that breaks a structural rule (a cycle, a bad parent, a duplicate name). Exit 3.

    Raised where graphs enter graphsvc: the builder and the JSON converter.
    """

    exit_code = 3


class OpError(GraphsvcError):
    """An op problem: missing from the registry, registered twice, malformed. Exit 4."""

    exit_code = 4


class UnknownOpError(OpError):
    """An op asked for by name (``gradcheck --op``, ``Value.apply``) that no loaded plugin registers. Exit 4."""


class MissingOpsError(OpError):
    """A graph uses ops no loaded plugin registers (the message names them and their plugins). Exit 4.

    ``install_hint``: whether the message ends by saying to install a plugin (``False`` when every
    op it names is given a registered name it likely misspells instead, or the message says what to
    install itself); ``misspelt``: whether it gives such a name for one of them."""

    def __init__(self, message: str, *, install_hint: bool = True, misspelt: bool = False) -> None:
        super().__init__(message)
        self.install_hint = install_hint
        self.misspelt = misspelt


class PluginError(OpError):
    """A plugin failed to import or raised in its hook. Exit 4."""


class ReplayError(GraphsvcError):
    """Replay failed (an op raised or returned the wrong shape). Exit 1."""


class RenderError(GraphsvcError):
    """Drawing a graph failed: Graphviz is not installed, or ``dot`` failed. Exit 1."""


class TooLargeToDraw(UsageError):
    """More nodes than one picture can show. ``problem`` says how many; the message adds the
    remedy in Python's words (the CLI words it with its options). Exit 2."""

    def __init__(self, problem: str, around: str | None) -> None:
        self.problem = problem
        #: The node whose neighbourhood was asked for (None: the whole graph).
        self.around = around
        remedy = "give a smaller depth" if around is not None else "draw one node's neighbourhood (around=, depth=)"
        super().__init__(f"{problem}; {remedy}")

    def __reduce__(self) -> tuple[type[TooLargeToDraw], tuple[str, str | None], dict[str, object]]:
        """For pickle and copy: ``args`` holds the message, not the ``problem`` and ``around`` that
        ``__init__`` takes, so the default (``cls(*args)``, then the attributes) fails."""
        return type(self), (self.problem, self.around), self.__dict__


class GraphsvcWarning(UserWarning):
    """Root of every warning graphsvc gives (Python's :mod:`warnings`; the CLI shows each as one
    line, ``Warning: ...``, on stderr). Library code never prints."""


class UnknownKeyWarning(GraphsvcWarning):
    """A graph file holds a key the reader does not know, which it ignores (FORMAT.md §2): a newer
    minor version's, or a misspelt one (``nodes[3]: unknown key 'parnets' (did you mean
    'parents'?); ignored``). ``strict=True`` on ``load``/``loads`` refuses such a file instead."""
