"""The graphsvc command line: parse arguments, call the graphsvc API, print text or ``--json``.

No graph logic lives here. Library code raises :class:`graphsvc.errors.GraphsvcError`; this module
turns it into one line ``Error: ...`` on stderr and the error's exit code:

    0 success · 1 anything else · 2 usage error · 3 a missing, unreadable or invalid graph file
    4 an op or plugin problem

numpy, msgpack and the plugins are imported inside the commands that need them, so ``--help`` is
fast.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, TypeVar

import typer
from typer._click.exceptions import NoArgsIsHelpError  # typer pinned <0.29
from typer._click.exceptions import UsageError as ClickUsageError
from typer.core import TyperCommand, TyperGroup

from graphsvc.errors import GraphsvcError, UsageError

if TYPE_CHECKING:
    from graphsvc.graph import Graph
    from graphsvc.ops import OpRegistry
    from graphsvc.replay.run import ReplayRun

F = TypeVar("F", bound=Callable[..., Any])

#: The global options (see ``main``), which may also follow the command: (option words, takes a value).
GLOBAL_OPTIONS = {
    "--plugin": True,
    "--strict-plugins": False,
    "--disable-plugins": False,
    "--debug": False,
    "--quiet": False,
    "-q": False,
}


class _Group(TyperGroup):
    """The app's group: moves global options given after the command to before it, so
    ``graphsvc backward F -q`` works as ``graphsvc -q backward F`` does (as pip and gh allow), and
    says Click's usage errors (an unknown option, a missing argument) in one line, as every error."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _globals_first(args, self))

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        with _usage_in_one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _usage_in_one_line():  # a command's own arguments are parsed here
            return super().invoke(ctx)


class _OneLineUsageError(ClickUsageError):
    """A usage error said as graphsvc says every error: one line, ``Error: ...`` (exit code 2)."""

    def show(self, file: Any = None) -> None:
        from graphsvc.text import one_line

        command = self.ctx.command_path if self.ctx is not None else "graphsvc"
        typer.echo(one_line(f"Error: {self.format_message().rstrip('.')}; see {command} -h"), err=True)


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except ClickUsageError as exc:
        if isinstance(exc, (_OneLineUsageError, NoArgsIsHelpError)):  # `graphsvc` alone prints the help
            raise
        raise _OneLineUsageError(exc.format_message(), exc.ctx) from None


def _globals_first(args: list[str], group: Any) -> list[str]:
    """``args`` with the global options that follow the command name moved in front of it.

    The words after ``--`` and the value of an option of the command (``--output -q`` names a node
    ``-q``) stay where they are.
    """
    position = 0
    while position < len(args) and args[position].startswith("-"):
        position += 2 if GLOBAL_OPTIONS.get(args[position]) else 1  # a global option, with its value
    if position >= len(args):
        return args
    command = group.commands.get(args[position])
    if command is None:
        return args
    takes_value = {
        name
        for param in command.params
        if param.param_type_name == "option" and not getattr(param, "is_flag", False)
        for name in param.opts
    }
    moved: list[str] = []
    kept: list[str] = []
    rest = iter(args[position + 1 :])
    for word in rest:
        if word == "--":
            kept.append(word)
            kept.extend(rest)
            break
        name = word.split("=", 1)[0]
        is_global = name in GLOBAL_OPTIONS and name not in takes_value
        needs_value = GLOBAL_OPTIONS[name] if is_global else word in takes_value
        value = next(rest, None) if needs_value and "=" not in word else None
        if is_global and needs_value and value is None and "=" not in word:
            is_global = False  # `--plugin` with nothing after it: leave it for Click to report
        taken = moved if is_global else kept
        taken.append(word)
        if value is not None:
            taken.append(value)
    return [*args[:position], *moved, args[position], *kept] if moved else args


class _Command(TyperCommand):
    """A command whose help names its arguments plainly (``FILE``, not ``{file}`` and ``<path>``)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar or ""]
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_metavar(param) if param.required else f"[{_metavar(param)}]")
        return [piece for piece in pieces if piece]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        params = self.get_params(ctx)
        arguments = [(_metavar(p), getattr(p, "help", None) or "") for p in params if p.param_type_name == "argument"]
        options = [
            record for p in params if p.param_type_name == "option" and (record := p.get_help_record(ctx)) is not None
        ]
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        if options:
            with formatter.section("Options"):
                formatter.write_dl(options)


def _metavar(param: Any) -> str:
    return str(param.metavar or param.name.upper())


app = typer.Typer(
    name="graphsvc",
    cls=_Group,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

#: Said at the end of every command's help.
GLOBALS_EPILOG = (
    "Global options (graphsvc -h): --plugin, --strict-plugins, --disable-plugins, --debug, --quiet/-q; "
    "they may come before or after the command."
)


def command(*, name: str | None = None) -> Callable[[F], F]:
    """``@app.command``, with the help layout and closing line every graphsvc command has."""
    return app.command(name=name, cls=_Command, epilog=GLOBALS_EPILOG)


class _State:
    """Global options, set by the callback before any command runs."""

    debug = False
    plugins: tuple[str, ...] = ()
    strict_plugins = False
    disable_plugins = False
    quiet = False
    #: Plugins that failed to load in this command (each warned about): an op missing later may be theirs.
    failed_plugins: tuple[str, ...] = ()


STATE = _State()


def _fail(message: str, code: int) -> typer.Exit:
    from graphsvc.text import one_line

    typer.echo(f"Error: {one_line(message)}", err=True)
    return typer.Exit(code)


def handles_errors(command: F) -> F:
    """Turn a GraphsvcError into ``Error: ...`` and its exit code; never print a traceback
    unless ``--debug`` was given."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except GraphsvcError as exc:
            if STATE.debug:
                raise
            raise _fail(_in_cli_words(exc), exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            sys.stderr.close()
            raise typer.Exit(1) from None
        except OSError as exc:  # the library words its own file errors; this is writing stdout (/dev/full)
            if STATE.debug:
                raise
            where = "standard output" if exc.filename is None else str(exc.filename)
            raise _fail(f"cannot write {where}: {exc.strerror or exc}", 1) from None
        except Exception as exc:
            if STATE.debug:
                raise
            raise _fail(
                f"internal error: {type(exc).__name__}: {exc} (run with --debug for a traceback and report it)", 1
            ) from None

    return wrapper  # type: ignore[return-value]


def _in_cli_words(exc: GraphsvcError) -> str:
    """A library error as the CLI says it: remedies name the CLI's options, not Python's parameters."""
    from graphsvc.errors import MissingOpsError, UnknownOpError

    words = _with_cli_remedies(exc)
    if isinstance(exc, (MissingOpsError, UnknownOpError)) and STATE.failed_plugins:
        failed = STATE.failed_plugins
        which = f"plugin {failed[0]}" if len(failed) == 1 else f"plugins {', '.join(failed)}"
        return f"{words}; {which} failed to load (see the warning above)"
    return words


def _with_cli_remedies(exc: GraphsvcError) -> str:
    from graphsvc.errors import MissingOpsError, TooLargeToDraw

    if isinstance(exc, MissingOpsError):
        if not exc.install_hint:  # every op named has a likely spelling: no plugin to install
            if STATE.disable_plugins:
                return f"{exc}; if not, run without --disable-plugins (it keeps out every plugin, --plugin ones too)"
            return str(exc)
        if STATE.disable_plugins:
            return f"{exc}, without --disable-plugins (it keeps out every plugin, --plugin ones too)"
        return f"{exc} or pass --plugin"
    if isinstance(exc, TooLargeToDraw):
        if exc.around is not None:
            return f"{exc.problem}; give a smaller --depth"
        return f"{exc.problem}; draw the neighbourhood of one node with --around NODE --depth K"
    return str(exc)


def _print_version(value: bool) -> None:
    if value:
        import importlib.util

        from graphsvc import __version__, native

        built = [name for name in NATIVE_MODULES if importlib.util.find_spec(f"graphsvc.native._c{name}") is not None]
        runs = f"compiled: {', '.join(built)}" if built else "compiled: none, pure Python (no C compiler at install)"
        if built and not native.enabled():
            runs += f"; off with {native.SWITCH}=0: pure Python"
        typer.echo(f"graphsvc {__version__} ({runs})")
        raise typer.Exit(0)


#: graphsvc's C extensions (csrc/NAME.c is graphsvc._cNAME).
NATIVE_MODULES = ["memory", "replay", "table", "text", "topo", "walk"]


@app.callback()
def main(
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            metavar="MODULE_OR_PATH",
            help="Load a plugin: a module name or a .py file. Repeatable. Also: GRAPHSVC_PLUGINS=a,b.",
        ),
    ] = None,
    strict_plugins: Annotated[
        bool, typer.Option("--strict-plugins", help="Make a plugin that fails to load a fatal error (exit 4).")
    ] = False,
    disable_plugins: Annotated[
        bool,
        typer.Option("--disable-plugins", help="Load only graphsvc's builtin ops. Also: GRAPHSVC_DISABLE_PLUGINS=1."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show a traceback on errors (for bug reports).")] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Show no progress bar (it appears on stderr, after a second).")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print graphsvc's version and exit."),
    ] = False,
) -> None:
    """Save, reload, inspect and replay computation graphs.

    Exit codes: 0 success, 1 other failure, 2 usage error, 3 missing, unreadable or invalid graph
    file, 4 op or plugin problem.

    Example: graphsvc backward examples/seed004.msgpack --steps
    """
    STATE.debug = debug
    STATE.quiet = quiet
    STATE.plugins = tuple(plugin or ())
    STATE.strict_plugins = strict_plugins
    STATE.disable_plugins = disable_plugins
    STATE.failed_plugins = ()


class Choice(StrEnum):
    """An option that takes one of a few words: ``-h`` shows ``[a|b]``, the shell completes them,
    and anything else is a one-line usage error (exit 2) naming the choices."""

    @classmethod
    def metavar(cls) -> str:
        return f"[{'|'.join(cls)}]"

    @classmethod
    def complete(cls, incomplete: str) -> list[str]:
        return [choice.value for choice in cls if choice.startswith(incomplete)]

    @classmethod
    def parse(cls, option: str, text: str) -> Choice:
        try:
            return cls(text)
        except ValueError:
            raise UsageError(f"{option} must be {' or '.join(cls)}, not {text!r}") from None


class Algorithm(Choice):
    """``order --algorithm``."""

    dfs = "dfs"
    kahn = "kahn"


class Form(Choice):
    """``convert --to``."""

    json = "json"
    msgpack = "msgpack"


# -- helpers -----------------------------------------------------------------------------------
FileArg = Annotated[
    Path,
    typer.Argument(
        metavar="FILE",
        help="A graph file: msgpack or its JSON form (told apart by content); - reads standard input.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]

#: Shell completion reads node names from graph files up to this size (a bigger file would stall the shell).
COMPLETION_MAX_BYTES = 64 << 20


def _completion_graph(ctx: typer.Context) -> Graph | None:
    """The graph named by the command's FILE argument, when completing one of its options."""
    import stat

    from graphsvc.format import load

    file = ctx.params.get("file") or _completion_file(ctx)
    if file is None:
        return None
    info = Path(file).stat()
    # only a regular file of bounded size: a FIFO, a device or standard input could block the shell
    if not stat.S_ISREG(info.st_mode) or info.st_size > COMPLETION_MAX_BYTES:
        return None
    return load(file)


def _completion_file(ctx: typer.Context) -> str | None:
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


def _complete_node(ctx: typer.Context, incomplete: str) -> list[str]:
    """Node names from FILE that start with what was typed; nothing on any error."""
    try:
        graph = _completion_graph(ctx)
        if graph is None:
            return []
        return [name for _, name in sorted(graph.names.items()) if name.startswith(incomplete)]
    except Exception:
        return []


def _complete_assignment(ctx: typer.Context, incomplete: str) -> list[str]:
    """``NAME=`` for every named leaf or const (what --set can change: not a node of another op
    without parents, which the replay refuses); nothing on any error."""
    try:
        from graphsvc.graph import LEAF_TAGS

        graph = _completion_graph(ctx)
        if graph is None or "=" in incomplete:
            return []
        settable = (graph.names[i] for i in graph.leaves().tolist() if i in graph.names and graph.op(i) in LEAF_TAGS)
        return [f"{name}=" for name in settable if name.startswith(incomplete)]
    except Exception:
        return []


def _complete_op(incomplete: str) -> list[str]:
    """Names of the registered ops that take inputs; nothing on any error."""
    try:
        from graphsvc.pluginhost import load_registry

        with _plugin_code():
            registry, _ = load_registry()
        return [op.name for op in registry if op.arity > 0 and op.name.startswith(incomplete)]
    except Exception:
        return []


def _load(path: Path) -> Graph:
    return _load_versioned(path)[0]


def _load_versioned(path: Path) -> tuple[Graph, tuple[int, int]]:
    """The graph in ``path`` (msgpack or JSON, told apart by content; ``-`` is standard input)."""
    from graphsvc.format import load_versioned

    with _progress(f"loading {_shown(path)}"):
        return load_versioned(sys.stdin.buffer if _is_stdio(path) else path)


def _is_stdio(path: Path | None) -> bool:
    return path is not None and str(path) == "-"


def _shown(path: Path) -> str:
    return "standard input" if _is_stdio(path) else str(path)


def _wrote(path: Path, nodes: int) -> None:
    """What every command that writes a file says, on stderr."""
    from graphsvc.text import counted, one_line

    typer.echo(one_line(f"wrote {_shown(path)} ({counted(nodes, 'node', thousands=True)})"), err=True)


def _progress(description: str) -> Any:
    """A progress bar on stderr for work that runs longer than a second (not with --quiet)."""
    from graphsvc.console.terminal import progress

    return progress(description, quiet=STATE.quiet)


def _plugin_code() -> Any:
    """Around anything that runs plugin code (loading plugins, replaying, checking ops): what it
    writes to stdout, through ``sys.stdout`` or file descriptor 1, goes to stderr, so it cannot
    corrupt a listing or ``--json``."""
    from graphsvc.pluginhost import plugin_output_to_stderr

    return plugin_output_to_stderr()


@contextlib.contextmanager
def _replaying(description: str) -> Iterator[None]:
    with _progress(description), _plugin_code():
        yield


def _json_text(document: Any) -> str:
    import json  # here, not at the top: --help and the text listings never need it

    from graphsvc.text import json_escaped

    return json_escaped(json.dumps(document, indent=None, separators=(",", ":"), ensure_ascii=False, allow_nan=False))


def _print_json(document: Any) -> None:
    typer.echo(_json_text(document))


def _jsonable(value: Any) -> Any:
    """Metadata as JSON can show it: nan and inf as strings, bin data as ``{"$bin": hex}``."""
    if isinstance(value, float):
        from graphsvc.format.jsonio import json_float  # here: metadata without floats needs neither it nor json

        return json_float(value)
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def _echo_chunks(chunks: Iterable[str]) -> None:
    """Write listing chunks as they are: typer.echo would scan each (megabytes) for terminal colour
    codes to strip, and a listing holds none (text from the file is escaped)."""
    stream = sys.stdout
    for chunk in chunks:
        stream.write(chunk)
    stream.flush()


def _echo_listing(chunks: Iterable[str], nodes: int) -> None:
    """A node listing, chunk by chunk, under a progress bar (printing millions of nodes to a file
    or a pipe takes seconds)."""
    from graphsvc.text import counted

    with _progress(f"printing {counted(nodes, 'node', thousands=True)}"):
        _echo_chunks(chunks)


def _print_json_listing(head: dict[str, Any], nodes: Iterable[str], count: int, tail: dict[str, Any]) -> None:
    """``{**head, "nodes": [...], **tail}`` as ``_print_json`` prints it, the nodes streamed
    (graphsvc.console.listing.json_objects) rather than held as one document."""
    opening = _json_text(head)[:-1] + ("," if head else "") + '"nodes":['
    closing = "]" + ("," + _json_text(tail)[1:] if tail else "}")
    _echo_chunks([opening])
    _echo_listing(nodes, count)
    typer.echo(closing)


def _echo_lines(lines: list[str]) -> None:
    """One line each; nothing at all for none (an empty graph prints no blank line)."""
    if lines:
        typer.echo("\n".join(lines))


#: Table columns (header, justification) of a node line, as graphsvc.console.listing.rows gives them.
NODE_COLUMNS = (("id", "right"), ("name", "left"), ("op", "left"), ("parents", "left"))


def _wants_table(rows: int) -> bool:
    """Print an aligned table (stdout is a terminal) rather than plain tab-separated text (piped)?"""
    from graphsvc.console.terminal import wants_table

    return wants_table(rows)


def _print_table(columns: Iterable[tuple[str, str]], rows: Sequence[Sequence[str]], show_header: bool = True) -> None:
    from graphsvc.console.terminal import print_table

    print_table(list(columns), rows, show_header)


# -- inspection commands -------------------------------------------------------------------------
@command()
@handles_errors
def order(
    file: FileArg,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="NODE",
            help="Order only this node's ancestors (an id or a name). Default: the whole graph.",
            autocompletion=_complete_node,
        ),
    ] = None,
    algorithm: Annotated[
        str,
        typer.Option(
            "--algorithm",
            metavar=Algorithm.metavar(),
            help="dfs (micrograd's build_topo) or kahn (autograd's child counts).",
            autocompletion=Algorithm.complete,
        ),
    ] = Algorithm.dfs.value,
    as_json: JsonOpt = False,
) -> None:
    """Print the reverse topological order, one node a line: id, name, op, parents.

    Example: graphsvc order examples/seed000.msgpack --algorithm kahn
    """
    from graphsvc.console import listing
    from graphsvc.topo import reverse_topological_order

    chosen = Algorithm.parse("--algorithm", algorithm)
    graph = _load(file)
    start = None if output is None else graph.node_id(output)
    nodes = reverse_topological_order(graph, start, "dfs" if chosen is Algorithm.dfs else "kahn")
    if as_json:
        _print_json_listing(
            {"algorithm": chosen.value, "output": start}, listing.json_objects(graph, nodes), len(nodes), {}
        )
    elif _wants_table(len(nodes)):
        _print_table(NODE_COLUMNS, listing.all_rows(graph, nodes))
    else:
        _echo_listing(listing.text(graph, nodes), len(nodes))


@command()
@handles_errors
def inspect(file: FileArg, as_json: JsonOpt = False) -> None:
    """Summarize a graph file: version, sizes, leaves, outputs, depth, ops, plugins needed.

    Example: graphsvc inspect examples/seed004.msgpack --json
    """
    from graphsvc.text import counted, escape, listed
    from graphsvc.topo import depth

    graph, version = _load_versioned(file)
    leaves = graph.leaves().tolist()
    ops = graph.op_histogram()
    plugin_list = graph.ops_by_plugin()
    info: dict[str, Any] = {
        "file": _shown(file),
        "file_size": None if _is_stdio(file) else file.stat().st_size,
        "format_version": list(version),
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "leaves": len(leaves),
        "outputs": [{"id": o, "name": graph.names.get(o)} for o in graph.outputs],
        "depth": depth(graph),
        "has_grads": graph.has_grads,
        "tensors": graph.tensor_summary() if graph.is_tensor_graph else None,
        "ops": ops,
        "plugins": plugin_list,
        "metadata": _jsonable(graph.metadata),
    }
    if as_json:
        _print_json(info)
        return
    size = "" if info["file_size"] is None else f" ({counted(info['file_size'], 'byte')})"
    rows = [
        ["file", f"{escape(info['file'])}{size}"],
        ["format version", f"{version[0]}.{version[1]}"],
        ["nodes", f"{graph.num_nodes}"],
        ["edges", f"{graph.num_edges}"],
        ["leaves", f"{len(leaves)} ({listed(map(graph.label, leaves[:10]), total=len(leaves))})" if leaves else "0"],
        ["outputs", listed(map(graph.label, graph.outputs[:10]), total=len(graph.outputs)) or "-"],
        ["depth", f"{info['depth']}"],
        ["gradients stored", f"{'yes' if info['has_grads'] else 'no'}"],
        *([["tensors", _tensor_info_text(info["tensors"])]] if info["tensors"] else []),
        ["ops", listed((f"{tag} {count}" for tag, count in sorted(ops.items())), total=len(ops), shown=40)],
        [
            "plugins",
            "; ".join(f"{escape(key)} ({listed(tags, shown=40)})" for key, tags in list(plugin_list.items())[:20])
            + (f"; and {len(plugin_list) - 20:,} more" if len(plugin_list) > 20 else ""),
        ],
    ]
    if _wants_table(len(rows)):
        _print_table((("field", "left"), ("value", "left")), rows, show_header=False)
    else:
        typer.echo("\n".join(f"{key}: {value}" for key, value in rows))


def _tensor_info_text(info: dict[str, Any]) -> str:
    from graphsvc.text import counted

    dtypes = ", ".join(f"{dtype} {count}" for dtype, count in info["dtypes"].items())
    holds = "node holds an array" if info["nodes"] == 1 else "nodes hold arrays"
    return (
        f"{info['nodes']} {holds} ({dtypes}); "
        f"{counted(info['value_bytes'], 'byte', thousands=True)} of values, "
        f"{counted(info['grad_bytes'], 'byte', thousands=True)} of gradients"
    )


@command()
@handles_errors
def validate(file: FileArg) -> None:
    """Check every structural rule; exit 0 with a summary, or print the error and exit 3.

    Example: graphsvc validate examples/seed002.msgpack
    """
    graph = _load(file)
    from graphsvc.text import counted, escape

    typer.echo(
        f"{escape(_shown(file))}: valid graphsvc graph, {counted(graph.num_nodes, 'node')}, "
        f"{counted(graph.num_edges, 'edge')}"
    )


@command()
@handles_errors
def convert(
    file: FileArg,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar=Form.metavar(),
            help="The form to write (default: from OUT's extension).",
            autocompletion=Form.complete,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="OUT",
            help="Where to write; - is standard output (default: standard output for json, FILE with .msgpack "
            "for msgpack).",
        ),
    ] = None,
) -> None:
    """Convert between the msgpack format and a readable JSON form, either way.

    Example: graphsvc convert examples/seed004.msgpack -o seed004.json
    """
    from graphsvc import format as fmt
    from graphsvc.format import jsonio

    form = _form_of(out) if to is None else Form.parse("--to", to)
    target = out if out is not None else Path("-") if form is Form.json else _msgpack_name(file)
    if not _is_stdio(target) and not _is_stdio(file) and target.resolve() == file.resolve():
        raise UsageError(f"refusing to overwrite the input {file}; give --out")
    if form is Form.msgpack and _is_stdio(target) and sys.stdout.isatty():
        raise UsageError("msgpack is binary: not written to a terminal; give --out or redirect standard output")
    graph = _load(file)
    if form is Form.msgpack and not _is_stdio(target):
        with _progress(f"writing {target}"):
            fmt.save(graph, target)
        _wrote(target, graph.num_nodes)
        return
    with _progress(f"converting to {form.value}"):
        data = jsonio.dumps(graph).encode() if form is Form.json else fmt.dumps(graph)
    if _is_stdio(target):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    _write_bytes_atomically(target, data)
    _wrote(target, graph.num_nodes)


#: The form each file extension stands for, when convert's --to is not given.
FORMS = {".json": Form.json, ".msgpack": Form.msgpack, ".mpk": Form.msgpack, ".msgpk": Form.msgpack}


def _form_of(out: Path | None) -> Form:
    form = None if out is None else FORMS.get(out.suffix.lower())
    if form is None:
        where = "" if out is None else f" ({out} has no .json or .msgpack extension)"
        raise UsageError(f"say which form to write: --to json or --to msgpack{where}")
    return form


def _msgpack_name(file: Path) -> Path:
    if _is_stdio(file):
        raise UsageError("reading standard input: say where to write with --out (- for standard output)")
    return file.with_suffix(".msgpack")


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    from graphsvc.format.atomic import atomic_writer

    with atomic_writer(path, "wb") as stream:
        stream.write(data)


# -- replay commands -----------------------------------------------------------------------------
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="NAME=VALUE",
        help="Replace a leaf's value before replaying: NAME=VALUE (or ID=VALUE). Repeatable.",
        autocompletion=_complete_assignment,
    ),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="Compare with the values/gradients stored in the file.")]
#: --check's tolerances when not given: a replay on another machine may differ in the last bits.
DEFAULT_RTOL, DEFAULT_ATOL = 1e-9, 1e-12
RtolOpt = Annotated[
    float | None,
    typer.Option(
        "--rtol",
        metavar="R",
        help=f"With --check: the relative tolerance, finite, 0 or more (default {DEFAULT_RTOL:g}).",
    ),
]
AtolOpt = Annotated[
    float | None,
    typer.Option(
        "--atol",
        metavar="A",
        help=f"With --check: the absolute tolerance, finite, 0 or more (default {DEFAULT_ATOL:g}).",
    ),
]
WriteOpt = Annotated[
    Path | None,
    typer.Option("--write", metavar="OUT", help="Save the graph with the replayed numbers to OUT (atomically)."),
]
DataOpt = Annotated[
    bool, typer.Option("--data", help="With --json on a tensor graph: every array's elements, not only a summary.")
]


class _Replay(NamedTuple):  # not a dataclass: that import and class build would cost every start-up
    """What forward or backward found, for :func:`_report` to print and ``--write`` to save."""

    #: The graph as loaded: --check compares with the numbers it stores.
    graph: Graph
    #: The numbers (grads None for forward; steps with --steps, in the sweep's order) in the form of
    #: the engine that replayed them: float64 columns for a graph of scalars (graphsvc.replay.columns), one
    #: array per node for a tensor graph (graphsvc.replay.arrays, ``run.tensor``).
    run: ReplayRun
    #: The node backward differentiated; None for forward.
    output: int | None
    #: Where nan or inf first appeared: ``{"values": finding or None[, "grads": ...]}``.
    nonfinite: dict[str, Any]
    #: With --check: how far the numbers are from the stored ones, values then gradients.
    comparisons: Sequence[Any] = ()


def _replay(graph: Graph, registry: OpRegistry, overrides: dict[int, Any], output: int | None, steps: bool) -> _Replay:
    """Replay forward, then (``output`` given) backward from ``output``, with the engine the graph
    needs (graphsvc.replay.run.tensor_replay_needed); ``steps`` records the backward pass step by step."""
    from graphsvc.replay.run import replay_values

    description = "replaying forward" if output is None else "replaying forward and backward"
    with _replaying(description):
        run = replay_values(graph, registry, overrides, output, steps=steps)
    return _Replay(graph, run, output, run.nonfinite())


def _check_options(check: bool, rtol: float | None, atol: float | None, as_json: bool, data: bool) -> None:
    """Refuse --rtol/--atol without --check or out of range, and --data without --json: options
    that would otherwise be taken and do nothing."""
    from graphsvc.replay.compare import tolerance_problem

    for option, value, what in (("--rtol", rtol, "relative"), ("--atol", atol, "absolute")):
        if value is None:
            continue
        if not check:
            raise UsageError(f"{option} goes with --check: it is the {what} tolerance of that comparison")
        problem = tolerance_problem(option, value)
        if problem is not None:
            raise UsageError(problem)
    if data and not as_json:
        raise UsageError("--data goes with --json: it adds every array's elements to the JSON")


def _checked(result: _Replay, rtol: float | None, atol: float | None) -> _Replay:
    """``result`` with --check's comparisons: its values (and gradients) against those the file stores."""
    rtol, atol = DEFAULT_RTOL if rtol is None else rtol, DEFAULT_ATOL if atol is None else atol
    return result._replace(comparisons=result.run.compare(result.graph, rtol, atol))


def _element(graph: Graph, at: tuple[int, tuple[int, ...]] | None) -> str:
    """``name[2,3]``: a node and an index into its array (no index for a scalar)."""
    if at is None:
        return "-"
    node, index = at
    return _label(graph, node) + (f"[{','.join(map(str, index))}]" if index else "")


def _overrides(graph: Graph, assignments: list[str] | None) -> dict[int, Any]:
    """``--set NAME=VALUE`` as node ids: a number, or an array read from a ``.npy`` file; resolved
    by graphsvc.replay.run.resolve_set, as ``graphsvc.forward(graph, set=...)`` resolves its ``set`` (a
    node given twice, by one name or by its id and its name, is refused, never the last one kept)."""
    from graphsvc.replay.run import resolve_set

    pairs: list[tuple[str, Any]] = []
    for text in assignments or ():
        ref, sep, number = text.partition("=")
        if not sep or not ref:
            raise UsageError(f"--set expects NAME=VALUE, not {text!r}")
        if number.endswith(".npy"):
            pairs.append((ref, _read_npy(ref, number)))
            continue
        value: float | int
        try:  # a whole number is kept exact, for an int64 leaf (resolve_set makes it a float elsewhere)
            value = int(number)
            if not -(2**63) <= value < 2**63 or value == 0:
                value = float(number)  # as before for a float leaf (inf past float's range; -0 keeps its sign)
        except ValueError:
            try:
                value = float(number)
            except ValueError:
                raise UsageError(f"--set {ref}: {number!r} is not a number or a .npy file") from None
        pairs.append((ref, value))
    overrides = resolve_set(graph, pairs, "--set")
    _note_changed_leaves(graph, overrides)
    return overrides


def _note_changed_leaves(graph: Graph, overrides: dict[int, Any]) -> None:
    """A note on standard error for each ``--set`` that gives a tensor leaf another dtype or shape
    than the file's: allowed (a batch of another size), but a float64 array where float32 was turns
    the replay float64, a shape that does not fit fails later, at the first op that uses it, and an
    int64 array where floats were takes the gradients away (int64 nodes get none). An array for a
    leaf the file holds as a number is how a leaf becomes a tensor: no note, unless it is int64."""
    import numpy as np

    for node, value in overrides.items():
        old = graph.arrays.get(node)
        new = np.asarray(value)
        if old is None:
            if new.dtype != np.int64:
                continue
            old = np.asarray(graph.values[node])  # a number: float64
        if (old.dtype, old.shape) != (new.dtype, new.shape):
            from graphsvc.replay.arrays import describe
            from graphsvc.text import escape, one_line

            label = escape(graph.label(node))
            lost = ""
            if new.dtype == np.int64 and old.dtype != np.int64:
                lost = "; an int64 leaf gets no gradient, nor does what is computed from it alone"
            typer.echo(
                one_line(f"Note: --set {label}: {describe(new)} replaces the file's {describe(old)}{lost}"), err=True
            )


def _read_npy(ref: str, path: str) -> Any:
    """An array from a ``.npy`` file (never pickled objects), its own shape (0-d stays 0-d);
    resolve_set copies it as a tensor leaf takes it (C order, native byte order)."""
    import os
    import stat

    import numpy as np

    from graphsvc.graph import TENSOR_DTYPES
    from graphsvc.text import escape, one_line

    where = f"--set {escape(ref)}: {escape(path)}"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would wait for a writer forever
            raise UsageError(f"{where} is not a regular file")
        array = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise UsageError(f"{where} cannot be read: {one_line(exc.strerror or str(exc))}") from None
    except (ValueError, EOFError, MemoryError):  # numpy's own words suggest pickle: not repeated
        raise UsageError(f"{where} is not a .npy file of numbers (without pickled objects)") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{where} is not a .npy file of numbers (without pickled objects)")
    dtype = array.dtype.newbyteorder("=")  # big-endian float64 is fine: resolve_set makes it native
    if dtype not in TENSOR_DTYPES:
        raise UsageError(f"{where} holds {dtype}; float64, float32 or int64 arrays only")
    return array


def _comparison_line(graph: Graph, c: Any) -> str:
    """A --check line, for scalars (checks.Comparison) and arrays (tensors.TensorComparison)."""
    from graphsvc.text import counted

    verdict = "ok" if c.ok else f"{c.mismatches} beyond tolerance"
    noun = "gradient" if c.what == "grads" else "value"
    have = "has" if c.unstored == 1 else "have"
    missing = f"{c.unstored} of {counted(c.nodes, 'node')} {have} no {noun} to compare; " if c.unstored else ""
    return (
        f"check {c.what}: {missing}worst abs diff {c.worst_abs!r} at {_element(graph, c.worst_abs_at)}, "
        f"worst rel diff {c.worst_rel!r} at {_element(graph, c.worst_rel_at)}: {verdict}"
    )


def _label(graph: Graph, node: int) -> str:
    """A node's name (or ``#id``) as printed: escaped, since it comes from the file."""
    from graphsvc.text import escape

    return escape(graph.label(node))


def _op(graph: Graph, node: int) -> str:
    from graphsvc.text import escape

    return escape(graph.op(node))


def _nonfinite_item(graph: Graph, found: Any) -> dict[str, Any] | None:
    """Where nan or inf first appeared, in --json. As for --check, the keys follow the file: a graph
    that holds arrays says where in its array (``index``), a graph of scalars does not, also when a
    vjp-only op has the tensor engine replay it."""
    from graphsvc.format.jsonio import json_float

    if found is None:
        return None
    node = found.node
    item: dict[str, Any] = {"node": node, "name": graph.names.get(node), "op": graph.op(node)}
    if graph.is_tensor_graph:
        item["index"] = list(found.index)
    return item | {"value": json_float(found.value), "count": found.count}


def _check_item(c: Any, graph: Graph) -> dict[str, Any]:
    """A --check result in --json. The keys follow the file, not the engine that replayed it: a
    graph of scalars gives the worst nodes (``worst_abs_node``), also when a vjp-only op has the
    tensor engine replay it; a graph that holds arrays gives the worst elements, node and index
    (``worst_abs_at``)."""
    from graphsvc.format.jsonio import json_float

    def at(where: tuple[int, tuple[int, ...]] | None) -> list[Any] | None:
        return None if where is None else [where[0], list(where[1])]

    def node(where: tuple[int, tuple[int, ...]] | None) -> int | None:
        return None if where is None else where[0]

    item: dict[str, Any] = {"ok": c.ok, "mismatches": c.mismatches, "nodes": c.nodes, "unstored": c.unstored}
    if not graph.is_tensor_graph:  # checks.Comparison and TensorComparison both say worst_abs_at
        return item | {
            "worst_abs": json_float(c.worst_abs),
            "worst_abs_node": node(c.worst_abs_at),
            "worst_rel": json_float(c.worst_rel),
            "worst_rel_node": node(c.worst_rel_at),
        }
    return item | {
        "worst_abs": json_float(c.worst_abs),
        "worst_abs_at": at(c.worst_abs_at),
        "worst_rel": json_float(c.worst_rel),
        "worst_rel_at": at(c.worst_rel_at),
    }


def _nonfinite_line(graph: Graph, found: Any) -> str:
    """Where nan or inf first appeared, for scalars (checks.NonFinite) and arrays (an index too)."""
    from graphsvc.text import counted

    order = "first in the backward sweep" if found.what == "grads" else "first"
    where = _element(graph, (found.node, getattr(found, "index", ())))
    return (
        f"nonfinite {found.what}: {order} at {where} (node {found.node}, {_op(graph, found.node)})"
        f" = {found.value!r}; {found.count} of {counted(graph.num_nodes, 'node')}"
    )


def _report(result: _Replay, as_json: bool, data: bool) -> None:
    """Print what forward or backward found and exit 1 when --check finds differences beyond tolerance.

    As text: the steps (--steps) and a blank line, the nodes in decreasing id order (a reverse
    topological order), then where nan or inf first appeared and the --check lines. As ``--json``,
    one object: ``output``, ``steps``, ``nodes``, ``nonfinite``, ``check``. Graphs of scalars and
    tensor graphs differ only in their cells (:class:`_ScalarCells`, :class:`_TensorCells`); ``data``
    is --data, every array's elements in --json.
    """
    graph, run = result.graph, result.run
    cells = _TensorCells(graph, run, data) if run.tensor else _ScalarCells(graph, run)
    if as_json:
        head: dict[str, Any] = {} if result.output is None else {"output": result.output}
        if run.steps is not None:
            head["steps"] = cells.step_items(run.steps)
        tail: dict[str, Any] = {"nonfinite": {what: _nonfinite_item(graph, f) for what, f in result.nonfinite.items()}}
        if result.comparisons:
            tail["check"] = {c.what: _check_item(c, graph) for c in result.comparisons}
        _print_json_listing(head, cells.json_objects(), graph.num_nodes, tail)
    else:
        if run.steps:
            typer.echo("\n".join(_step_lines(graph, run.steps, cells)))
            typer.echo("")
        if _wants_table(graph.num_nodes):
            numbers = [("value", cells.align), *([("grad", cells.align)] if run.grads is not None else [])]
            _print_table([*NODE_COLUMNS, *numbers], cells.rows())
        else:
            _echo_listing(cells.text(), graph.num_nodes)
        findings = [_nonfinite_line(graph, found) for found in result.nonfinite.values() if found is not None]
        _echo_lines(findings + [_comparison_line(graph, c) for c in result.comparisons])
    if not all(c.ok for c in result.comparisons):
        raise typer.Exit(1)


def _step_lines(graph: Graph, steps: list[Any], cells: _ScalarCells | _TensorCells) -> list[str]:
    """--steps as text: each node of the backward pass with its gradient, then what it sends each parent."""
    from graphsvc.collector import gc_paused
    from graphsvc.text import escape

    codes = graph.op_codes.tolist()  # a list: one index a step, not a numpy scalar
    tags = [escape(tag) for tag in graph.op_table]
    label = graph.label  # _label's work, without its import a call (a million steps)
    lines = []
    with gc_paused():  # lists and tuples a step, while the replay's arrays live: see graphsvc.collector
        for number, (step, (grad, parents)) in enumerate(zip(steps, cells.step_texts(steps), strict=True), 1):
            node = step.node
            lines.append(f"step {number}: {escape(label(node))} ({tags[codes[node]]}) {grad}")
            lines += [f"  -> {escape(label(parent))}: {sent}" for parent, sent in parents]
    return lines


class _ScalarCells:
    """The nodes of a graph of scalars as forward and backward list them: values and gradients from
    float64 columns, written by graphsvc.console.listing (in C where it is compiled), numbers right-aligned
    in a table; a step gives each parent's local derivative and what it adds."""

    align = "right"

    def __init__(self, graph: Graph, run: ReplayRun) -> None:
        import numpy as np

        self.graph = graph
        self.run = run
        self.nodes = np.arange(graph.num_nodes - 1, -1, -1)  # decreasing ids: a reverse topological order

    def text(self) -> Iterable[str]:
        from graphsvc.console import listing

        return listing.text(self.graph, self.nodes, self.run.values, self.run.grads)

    def rows(self) -> Sequence[Sequence[str]]:
        from graphsvc.console import listing

        return listing.all_rows(self.graph, self.nodes, self.run.values, self.run.grads)

    def json_objects(self) -> Iterable[str]:
        from graphsvc.console import listing

        return listing.json_objects(self.graph, self.nodes, self.run.values, self.run.grads)

    def step_texts(self, steps: list[Any]) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each step's gradient and what it sends each parent, as --steps prints them."""
        return [(self.step_grad(step), self.step_parents(step)) for step in steps]

    def step_items(self, steps: list[Any]) -> list[dict[str, Any]]:
        return list(map(self.step_item, steps))

    def step_grad(self, step: Any) -> str:
        return f"grad = {step.grad!r}"

    def step_parents(self, step: Any) -> list[tuple[int, str]]:
        return [(parent, f"local derivative {local!r}, adds {adds!r}") for parent, local, adds in step.contributions]

    def step_item(self, step: Any) -> dict[str, Any]:
        from graphsvc.format.jsonio import json_float

        return {
            "node": step.node,
            "grad": json_float(step.grad),
            "contributions": [
                {"parent": p, "local": json_float(d), "adds": json_float(c)} for p, d, c in step.contributions
            ],
        }


class _TensorCells:
    """The nodes of a tensor graph as forward and backward list them: each array summarized
    (graphsvc.replay.arrays.summary: dtype, shape, mean, largest magnitude; min and max for integers),
    left-aligned in a table; in --json as graphsvc.replay.arrays.json_cell gives it (the same numbers),
    with every element when ``data``; a step gives the shape and norm of what it sends each parent.
    The numbers of a chunk of nodes are worked out together (graphsvc.console.tensor_listing), not a call
    an array."""

    align = "left"

    def __init__(self, graph: Graph, run: ReplayRun, data: bool) -> None:
        self.graph = graph
        self.run = run
        self.data = data
        self.nodes = range(graph.num_nodes - 1, -1, -1)  # decreasing ids: a reverse topological order

    def text(self) -> Iterable[str]:
        from graphsvc.console import tensor_listing

        return tensor_listing.text(self.graph, self.nodes, self.run.values, self.run.grads)

    def rows(self) -> Sequence[Sequence[str]]:
        from graphsvc.console import tensor_listing

        chunks = tensor_listing.rows(self.graph, self.nodes, self.run.values, self.run.grads)
        return [row for chunk in chunks for row in chunk]

    def json_objects(self) -> Iterator[str]:
        from graphsvc.console import tensor_listing
        from graphsvc.replay.arrays import json_cell

        graph, values, grads = self.graph, self.run.values, self.run.grads
        if not self.data:
            yield from tensor_listing.json_objects(graph, self.nodes, values, grads)
            return
        separator = ""  # chunks after the first start with their comma (see _print_json_listing)
        for node in self.nodes:
            item = {
                "id": node,
                "name": graph.names.get(node),
                "op": graph.op(node),
                "parents": graph.parents(node),
                "value": json_cell(values[node], self.data),
                "grad": None if grads is None else json_cell(grads[node], self.data),
            }
            yield separator + _json_text(item)
            separator = ","

    @staticmethod
    def _step_norms(steps: list[Any]) -> tuple[list[Any], list[float]]:
        """Every array of the steps (each step's gradient, then what each sends its parents, in
        order; None for no gradient) and their norms (graphsvc.replay.arrays.norm), worked out together."""
        from graphsvc.console.tensor_listing import norms

        arrays = [step.grad for step in steps] + [sent for step in steps for _, sent in step.cotangents]
        return arrays, norms(arrays)

    def step_texts(self, steps: list[Any]) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each step's gradient and what it sends each parent, as --steps prints them."""
        from graphsvc.console.tensor_listing import descriptions

        arrays, norms = self._step_norms(steps)
        shown = iter(
            [
                "no gradient" if array is None else f"{description} norm {norm:.6g}"
                for array, description, norm in zip(arrays, descriptions(arrays), norms, strict=True)
            ]
        )
        grads = [f"grad {next(shown)}" for _ in steps]
        return [
            (grad, [(parent, next(shown)) for parent, _ in step.cotangents])
            for grad, step in zip(grads, steps, strict=True)
        ]

    def step_items(self, steps: list[Any]) -> list[dict[str, Any]]:
        from graphsvc.collector import gc_paused

        with gc_paused():  # dicts a step: see graphsvc.collector
            return self._step_items(steps)

    def _step_items(self, steps: list[Any]) -> list[dict[str, Any]]:
        from graphsvc.format.jsonio import json_float

        arrays, norms = self._step_norms(steps)
        numbers = iter([None if array is None else json_float(norm) for array, norm in zip(arrays, norms, strict=True)])
        grads = [
            {"dtype": str(step.grad.dtype), "shape": list(step.grad.shape), "norm": next(numbers)} for step in steps
        ]
        return [
            {"node": step.node, "grad": grad, "to": [{"parent": p, "norm": next(numbers)} for p, _ in step.cotangents]}
            for grad, step in zip(grads, steps, strict=True)
        ]


def _check_write(write: Path | None) -> None:
    if _is_stdio(write):
        raise UsageError("--write -: standard output holds the listing; give a file name")


def _write_replayed(result: _Replay, registry: OpRegistry, out: Path) -> None:
    """--write: the graph with the replayed numbers, each op attributed to the plugin that replayed it."""
    from graphsvc.format import save

    replayed = result.run.replayed(result.graph, registry)
    save(replayed, out)
    _wrote(out, replayed.num_nodes)


@command()
@handles_errors
def forward(
    file: FileArg,
    set_: SetOpt = None,
    check: CheckOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    as_json: JsonOpt = False,
    data: DataOpt = False,
    write: WriteOpt = None,
) -> None:
    """Recompute every value from the leaves, in topological order.

    Prints each node (id, name, op, parents, value), outputs first. Exit 1 when --check finds
    values beyond tolerance.

    Example: graphsvc forward examples/seed004.msgpack --set a=3 --set b=1
    """
    _check_options(check, rtol, atol, as_json, data)
    _check_write(write)
    graph = _load(file)
    if check and not graph.has_computed_values:
        raise UsageError("--check: the file stores no value of a computed node to compare with")
    registry = _registry()
    result = _replay(graph, registry, _overrides(graph, set_), None, steps=False)
    if write is not None:
        _write_replayed(result, registry, write)
    _report(_checked(result, rtol, atol) if check else result, as_json, data)


@command()
@handles_errors
def backward(
    file: FileArg,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="NODE",
            help="The node to differentiate (default: the single output).",
            autocompletion=_complete_node,
        ),
    ] = None,
    set_: SetOpt = None,
    check: CheckOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    steps: Annotated[bool, typer.Option("--steps", help="Print the backward pass step by step.")] = False,
    as_json: JsonOpt = False,
    data: DataOpt = False,
    write: WriteOpt = None,
) -> None:
    """Replay forward, then backward from one output seeded with 1, from zero gradients.

    Prints each node (id, name, op, parents, value, gradient) in reverse topological order. Exit
    1 when --check finds values or gradients beyond tolerance.

    Example: graphsvc backward examples/seed004.msgpack --steps
    """
    from graphsvc.replay import columns as replay

    _check_options(check, rtol, atol, as_json, data)
    _check_write(write)
    graph = _load(file)
    if check and not graph.has_grads:
        raise UsageError("--check: the file stores no gradients to compare with")
    registry = _registry()
    start = replay.default_output(graph, "--output") if output is None else graph.node_id(output)
    result = _replay(graph, registry, _overrides(graph, set_), start, steps)
    if write is not None:
        _write_replayed(result, registry, write)
    _report(_checked(result, rtol, atol) if check else result, as_json, data)


# -- drawing -------------------------------------------------------------------------------------
@command()
@handles_errors
def render(
    file: FileArg,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            metavar="OUT",
            help="The picture: .svg, .png or .pdf (drawn by Graphviz), or .dot (DOT text); - writes DOT text to "
            "standard output.",
            show_default=False,
        ),
    ],
    around: Annotated[
        str | None,
        typer.Option(
            "--around",
            metavar="NODE",
            help="Draw only the nodes near this one (an id or a name); needed above 2000 nodes.",
            autocompletion=_complete_node,
        ),
    ] = None,
    depth: Annotated[
        int | None,
        typer.Option(
            "--depth", metavar="K", help="With --around: at most this many edges away, either way (default 2)."
        ),
    ] = None,
    replay_first: Annotated[
        bool, typer.Option("--replay", help="Replay forward and backward first, so the boxes show fresh gradients.")
    ] = False,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="NODE",
            help="With --replay: the node to differentiate (default: the single output).",
            autocompletion=_complete_node,
        ),
    ] = None,
) -> None:
    """Draw the graph as micrograd's draw_dot does: each value a box (name | data | grad), each op a
    small node of its own, left to right.

    .svg, .png and .pdf need Graphviz (apt-get install graphviz, or brew install graphviz; and pip
    install graphviz); .dot needs neither. A picture of more than 2000 nodes is refused (Graphviz
    would take minutes or hours): draw a part with --around; .dot and -o - write any size.

    Example: graphsvc render examples/seed004.msgpack --replay -o seed004.svg
    """
    from graphsvc.console import render as drawing

    if depth is not None and around is None:
        raise UsageError("--depth goes with --around NODE: it limits the picture to the nodes near that one")
    if depth is not None and depth < 0:
        raise UsageError(f"--depth must be 0 or more, not {depth}")
    graph = _load(file)
    if replay_first:
        from graphsvc.replay import columns as replay
        from graphsvc.replay import run as api

        registry = _registry()
        start = replay.default_output(graph, "--output") if output is None else graph.node_id(output)
        with _replaying("replaying forward and backward"):
            graph = api.backward(graph, start, registry=registry)
    elif output is not None:
        raise UsageError("--output chooses the node to differentiate: it needs --replay")
    depth = 2 if depth is None else depth
    if _is_stdio(out):  # the DOT text, for a pipe into dot or another tool: no limit, dot is not run here
        nodes = drawing.select(graph, around, depth, None)
        typer.echo(drawing.to_dot(graph, nodes, None if around is None else graph.node_id(around)), nl=False)
        return
    with _progress(f"drawing {out}"):
        drawn = drawing.render(graph, out, around=around, depth=depth)
    _wrote(out, drawn)


# -- op and plugin commands ----------------------------------------------------------------------
def _registry() -> OpRegistry:
    """Load the ops with the global plugin options; print each plugin problem as one warning line."""
    from graphsvc.pluginhost import load_registry
    from graphsvc.text import one_line

    with _plugin_code():
        registry, problems = load_registry(
            STATE.plugins, strict=STATE.strict_plugins, disable_third_party=STATE.disable_plugins
        )
    for problem in problems:
        typer.echo(one_line(f"Warning: plugin {problem.plugin}: {problem.message}"), err=True)
    STATE.failed_plugins = tuple(dict.fromkeys(problem.plugin for problem in problems))
    return registry


@command()
@handles_errors
def ops(as_json: JsonOpt = False) -> None:
    """List every op by name: arity (1+: one or more inputs; 2-3: two or three), version, the plugin
    (and its version) that registered it, and its kind: an elementwise op "vectorized" or called "per
    element", a tensor op given by its "vjp", or a "leaf tag".

    Example: graphsvc --plugin my_ops.py ops --json
    """
    registry = _registry()
    if as_json:
        fields = ("name", "arity", "variadic", "max_arity", "version", "plugin", "plugin_version", "vectorized", "doc")
        _print_json(
            {"ops": [{field: getattr(op, field) for field in fields} | {"vjp": op.vjp is not None} for op in registry]}
        )
        return
    from graphsvc.text import escape

    rows = []
    for op in registry:
        if not op.variadic:
            arity = str(op.arity)
        else:
            arity = f"{op.arity}+" if op.max_arity is None else f"{op.arity}-{op.max_arity}"
        rows.append([escape(op.name), arity, escape(str(op.version)), escape(op.source), op.kind])
    if _wants_table(len(rows)):
        columns = (("op", "left"), ("inputs", "right"), ("version", "left"), ("plugin", "left"), ("kind", "left"))
        _print_table(columns, rows)
    else:
        for row in rows:
            typer.echo("\t".join(row))


@command()
@handles_errors
def gradcheck(
    op: Annotated[
        list[str] | None,
        typer.Option(
            "--op",
            metavar="OP",
            help="Check only this op. Repeatable. Default: every op with inputs.",
            autocompletion=_complete_op,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check each op's local derivatives against central finite differences at sample points.

    Prints one line per op and exits 1 when any op fails, naming them (graphsvc.testing.check_op
    is the same check, for a plugin's own tests).

    Example: graphsvc --plugin my_ops.py gradcheck --op cube
    """
    from graphsvc.ops import describe_source
    from graphsvc.testing import check_registry
    from graphsvc.text import counted, escape, listed, one_line

    registry = _registry()
    with _plugin_code():
        results = check_registry(registry, op)
    failed = [r.op for r in results if not r.ok]
    if as_json:
        _print_json({"ok": not failed, "failed": failed, "ops": [r.to_dict() for r in results]})
    else:
        for r in results:
            name = escape(f"{r.op} ({describe_source(r.plugin, r.plugin_version)})")
            if not r.ok:
                typer.echo(f"{name}: FAIL: {one_line(r.message)}")
            elif r.unchecked:
                typer.echo(f"{name}: not checked ({r.unchecked})")
            elif r.points == 0:
                typer.echo(f"{name}: nothing to check (a leaf tag)")
            else:
                skipped = f", {r.skipped} skipped where the forward is not finite" if r.skipped else ""
                typer.echo(
                    f"{name}: ok ({counted(r.points, 'point')}{skipped}; max abs error {r.max_abs_error:.1e},"
                    f" max rel error {r.max_rel_error:.1e})"
                )
    if failed:
        raise GraphsvcError(f"gradcheck failed for {len(failed)} of {counted(len(results), 'op')}: {listed(failed)}")


def run() -> None:
    """Console-script entry point."""
    app(prog_name="graphsvc")


if __name__ == "__main__":
    run()
