"""Shell completion of graphsvc's options: node names from the command's graph file, ``NAME=`` for
``--set``, op names for ``gradcheck --op`` and ``ops NAME``. Each callback returns nothing on any error, and never
reads a file that could block the shell (a FIFO, standard input) or take long (a big one).

Imported when the CLI starts (its callbacks are declared with the options): what reading a graph or
loading plugins needs is imported inside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from graphsvc.graph import Graph

__all__ = [
    "COMPLETION_MAX_BYTES",
    "SHELLS",
    "assignments",
    "completing_shell",
    "completion_file",
    "completion_graph",
    "for_shell",
    "node_names",
    "op_names",
]

#: Shell completion reads node names from graph files up to this size (a bigger file would stall the shell).
COMPLETION_MAX_BYTES = 64 << 20


def completion_graph(ctx: typer.Context) -> Graph | None:
    """The graph named by the command's FILE argument, when completing one of its options: only a
    regular file of bounded size (a FIFO, a device or standard input could block the shell), as
    the opened file is (not a look at the path first, which a FIFO swapped in would get past);
    one whose first bytes rule it out is refused from them, unread."""
    import warnings

    from graphsvc.errors import GraphsvcWarning
    from graphsvc.format import Limits, load_regular

    file = ctx.params.get("file") or completion_file(ctx)
    if file is None or str(file) == "-":
        return None
    with warnings.catch_warnings():  # a warning (an unknown key) would be printed into the shell's line
        warnings.simplefilter("ignore", GraphsvcWarning)
        return load_regular(file, Limits(max_file_bytes=COMPLETION_MAX_BYTES))


def completion_file(ctx: typer.Context) -> str | None:
    """FILE from the words being completed, when the parse stopped short of it.

    Completing ``graphsvc backward FILE --output <TAB>``, Click parses the words with the option's
    value missing and gives up before it assigns FILE; so find it among the words the shell sent
    (Typer's completion scripts put them in ``_TYPER_COMPLETE_ARGS`` or bash's ``COMP_WORDS``).
    """
    import os
    import shlex

    # split as Click splits them: a quote still open (``--set 'w<TAB>``) ends the last word
    lexer = shlex.shlex(os.environ.get("_TYPER_COMPLETE_ARGS") or os.environ.get("COMP_WORDS") or "", posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[str] = []
    try:
        words.extend(lexer)
    except ValueError:
        words.append(lexer.token)
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


#: The shells Typer completes for, by the name in ``_GRAPHSVC_COMPLETE=complete_<shell>``.
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
#: Words every shell takes as they are: no quoting, globbing, expansion or word splitting.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+,./:=@%-")
#: The characters PowerShell takes for a single quote (the ASCII one and four typographic ones).
_POWERSHELL_QUOTES = "'\u2018\u2019\u201a\u201b"


def completing_shell() -> str | None:
    """The shell completion is running for (``bash``, ``zsh``, ``fish``, ``powershell``, ``pwsh``),
    from the ``_<PROG>_COMPLETE`` variable its script sets (``complete_bash``; Click's own order,
    ``bash_complete``, too); None when not completing, "" for a shell not known."""
    import os

    value = os.environ.get("_GRAPHSVC_COMPLETE")
    if value is None:  # run under another name (python cli.py: _CLI_PY_COMPLETE)
        value = next((v for k, v in os.environ.items() if k.startswith("_") and k.endswith("_COMPLETE")), None)
        if value is None:
            return None
    first, _, second = value.partition("_")
    return first if first in SHELLS else second if second in SHELLS else ""


def for_shell(words: Iterable[str], shell: str | None, typed: str = "") -> list[str]:
    """Candidates taken from a file (node names, op names), each starting with ``typed`` (what was
    typed of the word), as a word the completing shell inserts safely: a name that could run a
    command (``w$(touch X)``) or split the candidate list must never reach a command line as the
    shell would read it.

    Any name holding a control character (a newline, a tab, an escape sequence) is left out: it
    would split the list or write to the terminal, and nobody types it. A plain name (letters,
    digits, ``_+,./:=@%-``) is safe everywhere as it is. Otherwise, per shell, as Typer's scripts
    hand candidates over (and Typer keeps only those that start with ``typed``): bash inserts a
    candidate as it is, so the rest of the name after ``typed`` is single-quoted
    (``w'eight$(touch X)='``; left out when ``typed`` is not plain itself); zsh and fish quote
    what they insert themselves, so they get the name as it is, except that zsh leaves out one
    with a backslash, a quote or two spaces in a row (Typer's zsh script passes candidates through
    ``eval``, which would lose or misread them); PowerShell inserts as it is, so the name is
    single-quoted its way (every quote doubled, the typographic ones too) when nothing was typed
    yet and left out otherwise, as is one holding ``:::`` (Typer's separator). ``shell`` None (not
    completing): as they are; a shell not known: plain names only."""
    out = []
    typed_plain = _PLAIN.issuperset(typed)
    for word in words:
        if not word.isprintable() and any(char < " " or "\x7f" <= char <= "\x9f" for char in word):
            continue
        if shell in ("powershell", "pwsh") and ":::" in word:
            continue
        if shell is None or shell == "fish" or _PLAIN.issuperset(word):
            out.append(word)
        elif shell == "bash":
            if typed_plain:
                rest = word[len(typed) :]
                out.append(typed + (rest if _PLAIN.issuperset(rest) else "'" + rest.replace("'", "'\\''") + "'"))
        elif shell == "zsh":
            if not any(char in word for char in "\\'\"") and "  " not in word:
                out.append(word)
        elif shell in ("powershell", "pwsh"):
            if not typed:
                out.append("'" + "".join(char * 2 if char in _POWERSHELL_QUOTES else char for char in word) + "'")
    return out


def node_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Node names from FILE that start with what was typed, quoted for the shell (:func:`for_shell`);
    nothing on any error."""
    try:
        graph = completion_graph(ctx)
        if graph is None:
            return []
        names = [name for _, name in sorted(graph.names.items()) if name.startswith(incomplete)]
        return for_shell(names, completing_shell(), incomplete)
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
        candidates = (f"{name}=" for name in settable if name.startswith(incomplete))
        return for_shell(candidates, completing_shell(), incomplete)
    except Exception:
        return []


def op_names(incomplete: str, leaf_tags: bool = False) -> list[str]:
    """Names of the registered ops that take inputs (``gradcheck --op``), and the leaf tags too
    with ``leaf_tags`` (``ops NAME``); nothing on any error."""
    try:
        from graphsvc.pluginhost import load_registry, plugin_output_to_stderr

        with plugin_output_to_stderr():
            registry, _ = load_registry()
        return for_shell(
            (op.name for op in registry if (leaf_tags or op.arity > 0) and op.name.startswith(incomplete)),
            completing_shell(),
            incomplete,
        )
    except Exception:
        return []
