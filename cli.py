"""The graphsvc command line: each command declares its arguments and options (Typer parses them)
and calls the library: graphsvc for the work, graphsvc.console for what is printed (text or --json).

No graph logic and no formatting live here. Library code raises :class:`graphsvc.errors.GraphsvcError`; this module
turns it into one line ``Error: ...`` on stderr and the error's exit code:

    0 success · 1 anything else · 2 usage error · 3 a missing, unreadable or invalid graph file
    4 an op or plugin problem · 5 an output that cannot be written (a file, or standard output)
    130 interrupted (Ctrl-C)

numpy, msgpack and the plugins are imported inside the commands that need them: ``--help`` is fast.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from graphsvc.errors import GraphsvcError, UsageError

if TYPE_CHECKING:
    from graphsvc.graph import Graph
    from graphsvc.ops import OpRegistry

F = TypeVar("F", bound=Callable[..., Any])

#: Click's UsageError (an unknown option, a missing argument...). typer 0.28 vendors Click as its
#: private ``typer._click`` (the ``click`` package, when installed, is another copy, whose classes
#: typer never raises) and exports one subclass of it, BadParameter: its base is UsageError.
CLICK_USAGE_ERROR: type[Exception] = typer.BadParameter.__mro__[1]


class _Group(TyperGroup):
    """The app's group: says Click's usage errors (an unknown option, a missing argument) in one
    line, as every error."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if not args and self.no_args_is_help:  # `graphsvc` alone prints the help, as Click shows it
            return super().make_context(info_name, args, parent=parent, **extra)
        with _usage_in_one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _usage_in_one_line():  # a command's own arguments are parsed here
            return super().invoke(ctx)


class _OneLineUsageError(typer.BadParameter):
    """A usage error said as graphsvc says every error: one line, ``Error: ...`` (exit code 2)."""

    def format_message(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        from graphsvc.text import one_line

        command = self.ctx.command_path if self.ctx is not None else "graphsvc"
        typer.echo(one_line(f"Error: {self.format_message().rstrip('.')}; see {command} -h"), err=True)


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except CLICK_USAGE_ERROR as exc:
        if isinstance(exc, _OneLineUsageError):
            raise
        usage: Any = exc
        raise _OneLineUsageError(_missing_file(usage) or usage.format_message(), usage.ctx) from None


def _missing_file(usage: Any) -> str | None:
    """For a command run without FILE and with standard input redirected (``graphsvc order < g``),
    what to do instead of Click's "Missing argument 'FILE'"; None otherwise."""
    param = getattr(usage, "param", None)
    if type(usage).__name__ != "MissingParameter" or param is None or getattr(param, "metavar", None) != "FILE":
        return None
    if sys.stdin is None or sys.stdin.isatty():
        return None
    return "FILE is missing; give - to read the graph from standard input"


def _global_options() -> list[TyperOption]:
    """``main``'s options once more, hidden, for every command: Click parses them after the command
    too, so ``graphsvc backward F -q`` works as ``graphsvc -q backward F`` does (as pip and gh
    allow). Each adds to what ``main`` set: --plugin's modules to those before the command, a flag
    turns on. A word that is the value of one of the command's options (``--output -q`` names a
    node ``-q``) or follows ``--`` is not one of them: Click's parser tells them apart."""

    def flag(name: str) -> Callable[[Any, Any, bool], None]:
        def given(ctx: Any, param: Any, value: bool) -> None:
            if value:
                setattr(STATE, name, True)

        return given

    def plugins(ctx: Any, param: Any, value: tuple[str, ...]) -> None:
        STATE.plugins += tuple(value)

    def hidden(*words: str, **options: Any) -> TyperOption:
        return TyperOption(param_decls=list(words), hidden=True, expose_value=False, **options)

    return [
        hidden("--plugin", multiple=True, metavar="MODULE_OR_PATH", callback=plugins),
        *(
            hidden(*words, is_flag=True, callback=flag(name))
            for name, words in (
                ("strict_plugins", ("--strict-plugins",)),
                ("disable_plugins", ("--disable-plugins",)),
                ("debug", ("--debug",)),
                ("quiet", ("--quiet", "-q")),
            )
        ),
    ]


class _Command(TyperCommand):
    """A command whose help names its arguments plainly (``FILE``, not ``{file}`` and ``<path>``),
    and which takes the global options after its name too (:func:`_global_options`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_global_options())

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
    """Global options, set by the callback before any command runs (and by the same options after
    the command's name, as Click parses them: see _global_options)."""

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
            done = command(*args, **kwargs)
            sys.stdout.flush()  # here, not at exit: a write that fails now is an error and its code
            return done
        except GraphsvcError as exc:
            if STATE.debug:
                raise
            raise _fail(_in_cli_words(exc), exc.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:  # the user's Ctrl-C (a plugin's own is its failure): 128 + SIGINT
            if STATE.debug:
                raise
            raise _fail("interrupted", 130) from None
        except BrokenPipeError:
            sys.stderr.close()
            raise typer.Exit(1) from None
        except OSError as exc:  # the library words its own file errors; this is writing stdout (/dev/full)
            if STATE.debug:
                raise
            from graphsvc.errors import OutputError

            where = "standard output" if exc.filename is None else str(exc.filename)
            raise _fail(f"cannot write {where}: {exc.strerror or exc}", OutputError.exit_code) from None
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
        if not exc.install_hint:  # every op named has a likely spelling, or the message says what to install
            if STATE.disable_plugins:
                remedy = "if not, run" if exc.misspelt else "and run"
                return f"{exc}; {remedy} without --disable-plugins (it keeps out every plugin, --plugin ones too)"
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
        from graphsvc import __version__, native

        built = native.built()
        runs = f"compiled: {', '.join(built)}" if built else "compiled: none, pure Python (no C compiler at install)"
        if built and not native.enabled():
            runs += f"; off with {native.SWITCH}=0: pure Python"
        typer.echo(f"graphsvc {__version__} ({runs})")
        raise typer.Exit(0)


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
        typer.Option(
            "--version", "-V", is_eager=True, callback=_print_version, help="Print graphsvc's version and exit."
        ),
    ] = False,
) -> None:
    """Save, reload, inspect and replay computation graphs.

    Exit codes: 0 success, 1 other failure, 2 usage error, 3 missing, unreadable or invalid graph
    file, 4 op or plugin problem, 5 an output that cannot be written, 130 interrupted (Ctrl-C),
    143 terminated (SIGTERM).

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


# Shell completion (graphsvc.console.completion, imported when the shell asks, not at every start).
def _complete_node(ctx: typer.Context, incomplete: str) -> list[str]:
    from graphsvc.console.completion import node_names

    return node_names(ctx, incomplete)


def _complete_assignment(ctx: typer.Context, incomplete: str) -> list[str]:
    from graphsvc.console.completion import assignments

    return assignments(ctx, incomplete)


def _complete_op(incomplete: str) -> list[str]:
    from graphsvc.console.completion import op_names

    return op_names(incomplete)


def _complete_op_or_tag(incomplete: str) -> list[str]:
    from graphsvc.console.completion import op_names

    return op_names(incomplete, leaf_tags=True)


def _load(path: Path, strict: bool = False) -> Graph:
    return _load_versioned(path, strict)[0]


def _load_versioned(path: Path, strict: bool = False) -> tuple[Graph, tuple[int, int]]:
    """The graph in ``path`` (msgpack or JSON, told apart by content; ``-`` is standard input);
    each warning of the read (a key it does not know) one line ``Warning: ...`` on stderr, after it."""
    import warnings

    from graphsvc.errors import GraphsvcWarning
    from graphsvc.format import load_versioned
    from graphsvc.text import one_line

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GraphsvcWarning)
        with _progress(f"loading {_shown(path)}"):
            loaded = load_versioned(sys.stdin.buffer if _is_stdio(path) else path, strict=strict)
    for warning in caught:
        if isinstance(warning.message, GraphsvcWarning):
            typer.echo(one_line(f"Warning: {warning.message}"), err=True)
        else:  # not graphsvc's: as Python would have shown it
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return loaded


def _is_stdio(path: Path | None) -> bool:
    return path is not None and str(path) == "-"


def _shown(path: Path) -> str:
    return "standard input" if _is_stdio(path) else str(path)


def _progress(description: str) -> Any:
    """A progress bar on stderr for work that runs longer than a second (not with --quiet)."""
    from graphsvc.console.terminal import progress

    return progress(description, quiet=STATE.quiet)


def _plugin_code() -> Any:
    """Around anything that runs plugin code (loading plugins, replaying, checking ops): what it
    writes to stdout, through ``sys.stdout`` or file descriptor 1, goes to stderr, so it cannot
    corrupt a listing or ``--json``."""
    from graphsvc.console.printing import stdout_stream
    from graphsvc.pluginhost import keep_stdout_from_plugins, plugin_output_to_stderr

    keep_stdout_from_plugins(stdout_stream)  # and after it: a plugin's thread or child process writes to stderr too
    return plugin_output_to_stderr()


@contextlib.contextmanager
def _replaying(description: str) -> Iterator[None]:
    with _progress(description), _plugin_code():
        yield


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
    from graphsvc.console.views import print_order
    from graphsvc.topo import reverse_topological_order

    chosen = Algorithm.parse("--algorithm", algorithm)
    graph = _load(file)
    start = None if output is None else graph.node_id(output, "outputs")
    nodes = reverse_topological_order(graph, start, "dfs" if chosen is Algorithm.dfs else "kahn")
    print_order(graph, nodes, chosen.value, start, as_json, STATE.quiet)


@command()
@handles_errors
def inspect(file: FileArg, as_json: JsonOpt = False) -> None:
    """Summarize a graph file: version, sizes, leaves, outputs, depth, ops, plugins needed.

    Example: graphsvc inspect examples/seed004.msgpack --json
    """
    from graphsvc.console.views import print_info

    graph, version = _load_versioned(file)
    print_info(graph, version, _shown(file), None if _is_stdio(file) else file.stat().st_size, as_json)


@command()
@handles_errors
def validate(
    file: FileArg,
    strict: Annotated[
        bool, typer.Option("--strict", help="Refuse a key the reader does not know (by default: a warning).")
    ] = False,
    format_only: Annotated[
        bool,
        typer.Option("--format-only", help="Check the file alone: load no plugin, check no op."),
    ] = False,
) -> None:
    """Check that a replay here can run the file: every rule of the format (else exit 3), then its
    ops against the loaded plugins, as a replay checks them before it runs (else exit 4). Exit 0
    with a one-line summary.

    Example: graphsvc validate examples/seed002.msgpack
    """
    graph = _load(file, strict)
    from graphsvc.console.views import validity_line

    if not format_only:
        from graphsvc.replay.run import check_replayable

        registry = _registry()
        with _plugin_code():
            check_replayable(graph, registry, _shown(file))
    typer.echo(validity_line(_shown(file), graph))


@command()
@handles_errors
def diff(
    file_a: Annotated[
        Path, typer.Argument(metavar="A", help="The first graph file (- reads standard input).", show_default=False)
    ],
    file_b: Annotated[Path, typer.Argument(metavar="B", help="The second graph file.", show_default=False)],
    rtol: Annotated[
        float | None,
        typer.Option(
            "--rtol", metavar="R", help="The relative tolerance (default: by dtype, 1e-9 float64, 1e-4 float32)."
        ),
    ] = None,
    atol: Annotated[
        float | None,
        typer.Option(
            "--atol", metavar="A", help="The absolute tolerance (default: by dtype, 1e-12 float64, 1e-6 float32)."
        ),
    ] = None,
    nan_equal: Annotated[bool, typer.Option("--nan-equal", help="Count nan equal to nan.")] = False,
    as_json: JsonOpt = False,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", min=0, help="Print at most N items of each list.")
    ] = None,
) -> None:
    """Compare two graphs: align their nodes (by name, then by structure from the outputs), list
    the structural and numeric differences and name the first divergence of values and of
    gradients. Exit 0 when they are equal within tolerance, 1 when not.

    Example: graphsvc diff examples/seed004.msgpack changed.msgpack
    """
    from graphsvc.console.diffview import print_diff
    from graphsvc.diff import diff as compare

    if _is_stdio(file_a) and _is_stdio(file_b):
        raise _fail("A and B cannot both be standard input", 2)
    graph_a = _load(file_a)
    graph_b = _load(file_b)
    found = compare(graph_a, graph_b, rtol=rtol, atol=atol, nan_equal=nan_equal)
    print_diff(found.to_json(limit), as_json, limit)
    if not found.equal:
        raise typer.Exit(1)


@command()
@handles_errors
def convert(
    file: FileArg,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar=Form.metavar(),
            help="The form to write (default: OUT's extension's; without OUT, or with -, the form FILE is not in).",
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
    """Convert between the msgpack format and a readable JSON form, either way: by default to the
    form FILE is not in (JSON to standard output, msgpack to FILE with .msgpack).

    Example: graphsvc convert examples/seed004.msgpack -o seed004.json
    """
    from graphsvc.console import convert as converting

    # a missing or broken FILE is that error, whatever OUT would be (standard input is read once, after)
    graph = None if _is_stdio(file) else _load(file)
    form = converting.form_of(out, file) if to is None else Form.parse("--to", to).value
    target = converting.target_of(file, form, out)
    converting.write(_load(file) if graph is None else graph, form, target, STATE.quiet)


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
RtolOpt = Annotated[
    float | None,
    typer.Option(
        "--rtol",
        metavar="R",
        help="With --check: the relative tolerance, finite, 0 or more (default by dtype: float64 1e-9, float32 1e-4,"
        " int64 0).",
    ),
]
AtolOpt = Annotated[
    float | None,
    typer.Option(
        "--atol",
        metavar="A",
        help="With --check: the absolute tolerance, finite, 0 or more (default by dtype: float64 1e-12, float32 1e-6,"
        " int64 0).",
    ),
]
WriteOpt = Annotated[
    Path | None,
    typer.Option("--write", metavar="OUT", help="Save the graph with the replayed numbers to OUT (atomically)."),
]
DataOpt = Annotated[
    bool, typer.Option("--data", help="With --json on a tensor graph: every array's elements, not only a summary.")
]


def _replay(
    file: Path,
    set_: list[str] | None,
    check: bool,
    tolerances: tuple[float | None, float | None],
    as_json: bool,
    data: bool,
    write: Path | None,
    *,
    backward: bool = False,
    output: str | None = None,
    steps: bool = False,
) -> None:
    """forward, or ``backward`` from ``output``: load, replay (graphsvc.replay.run.replay_values), save
    with --write, print the report (graphsvc.console.report); exit 1 when --check finds differences."""
    from graphsvc.console.printing import wrote
    from graphsvc.console.report import check_options, check_stored, print_report, set_notes
    from graphsvc.format import save
    from graphsvc.replay.run import output_node, replay_values, resolve_set, set_from_text

    rtol, atol = tolerances
    check_options(check, rtol, atol, as_json, data, write)
    graph = _load(file)
    if check:
        check_stored(graph, backward)
    registry = _registry()
    start = output_node(graph, output, "--output") if backward else None
    overrides = resolve_set(graph, set_from_text(set_ or (), "--set"), "--set")
    for note in set_notes(graph, overrides):
        typer.echo(note, err=True)
    within = (rtol, atol) if check else None  # None: each dtype's default (graphsvc.replay.compare)
    with _replaying("replaying forward" if start is None else "replaying forward and backward"):
        result = replay_values(graph, registry, overrides, start, steps=steps, find_nonfinite=True, check=within)
    if write is not None:
        replayed = result.replayed()
        save(replayed, write)
        wrote(write, replayed.num_nodes)
    print_report(result, as_json, data, STATE.quiet)
    if not result.ok:
        raise typer.Exit(1)


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
    _replay(file, set_, check, (rtol, atol), as_json, data, write)


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
    _replay(file, set_, check, (rtol, atol), as_json, data, write, backward=True, output=output, steps=steps)


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

    .svg, .png and .pdf need Graphviz's dot program (apt-get install graphviz, brew install graphviz,
    or conda install graphviz; see graphviz.org/download); .dot needs nothing. A picture of more
    than 2000 nodes is refused (Graphviz would take minutes or hours): draw a part with --around;
    .dot and -o - write any size.

    Example: graphsvc render examples/seed004.msgpack --replay -o seed004.svg
    """
    from graphsvc.console import render as drawing

    within = drawing.depth_of(around, depth)
    graph = _load(file)
    if replay_first:
        from graphsvc.replay import run as api

        registry = _registry()
        start = api.output_node(graph, output, "--output")
        with _replaying("replaying forward and backward"):
            graph = api.backward(graph, start, registry=registry)
    elif output is not None:
        raise UsageError("--output chooses the node to differentiate: it needs --replay")
    drawing.picture(graph, out, around, within, STATE.quiet)


@command()
@handles_errors
def view(
    file: FileArg,
    file2: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE2]",
            help="A second graph file: the page can colour where the two differ (as graphsvc diff finds it).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int,
        typer.Option("--port", metavar="P", min=0, max=65535, help="The port on 127.0.0.1 (0: a free one)."),
    ] = 0,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Do not open a web browser.")] = False,
) -> None:
    """Look at a graph of any size in a web browser: nodes grouped into layers by the dotted
    structure of their names, collapsed to start, opened on demand; search, details of a node,
    colours by value, |grad|, nan/inf, backward step (and difference, with FILE2). Serves on
    127.0.0.1 until Ctrl-C (exit 0).

    Example: graphsvc view examples/seed004.msgpack
    """
    from graphsvc.errors import UsageError
    from graphsvc.view.model import ViewModel
    from graphsvc.view.server import ViewServer

    if file2 is not None and _is_stdio(file) and _is_stdio(file2):
        raise _fail("FILE and FILE2 cannot both be standard input", 2)
    graph = _load(file)
    other = None if file2 is None else _load(file2)
    files = [_shown(file)] if file2 is None else [_shown(file), _shown(file2)]
    model = ViewModel(graph, other, files=files)
    try:
        server = ViewServer(model, port)
    except OSError as exc:
        raise UsageError(f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    from graphsvc.text import counted

    with server:
        try:  # from the serving line on, Ctrl-C is how a user ends the server: exit 0
            shown = " and ".join(files)
            typer.echo(f"graphsvc view: serving {shown} ({counted(graph.num_nodes, 'node')}) at {server.url}")
            sys.stdout.flush()
            if not no_browser:
                import webbrowser

                webbrowser.open(server.url)
            server.serve_forever()
        except KeyboardInterrupt:
            pass


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
def ops(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="NAME...",
            help="Show these ops in full: kind, inputs, attributes and their defaults, doc, plugin.",
            autocompletion=_complete_op_or_tag,
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List every op by name: arity (1+: one or more inputs; 2-3: two or three), version, the plugin
    (and its version) that registered it, and its kind: an elementwise op "vectorized" or called "per
    element", a tensor op given by its "vjp", or a "leaf tag". With NAMEs, each of those ops in
    full: its kind, inputs, attributes (which are required, the defaults of the others), plugin,
    version and doc; an op no plugin registers is an error (exit 4).

    Example: graphsvc --plugin my_ops.py ops --json; graphsvc ops pow sum
    """
    from graphsvc.console.views import print_op_details, print_ops

    registry = _registry()
    if not names:
        print_ops(registry, as_json)
        return
    print_op_details([registry.get(name) for name in dict.fromkeys(names)], as_json)


@command()
@handles_errors
def gradcheck(
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE]",
            help="Check this graph's gradient against finite differences of its forward replays.",
            show_default=False,
        ),
    ] = None,
    op: Annotated[
        list[str] | None,
        typer.Option(
            "--op",
            metavar="OP",
            help="Check only this op. Repeatable. Default: every op with inputs.",
            autocompletion=_complete_op,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output", metavar="NODE", help="With FILE: the node differentiated (default: the single output)."
        ),
    ] = None,
    set_: SetOpt = None,
    leaves: Annotated[
        list[str] | None,
        typer.Option("--leaves", metavar="NAME", help="With FILE: check only this leaf. Repeatable."),
    ] = None,
    rtol: Annotated[float, typer.Option("--rtol", metavar="R", help="With FILE: the relative tolerance.")] = 1e-3,
    atol: Annotated[float, typer.Option("--atol", metavar="A", help="With FILE: the absolute tolerance.")] = 1e-5,
    eps: Annotated[float, typer.Option("--eps", metavar="E", help="With FILE: the finite-difference step.")] = 1e-6,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="With FILE: the random directions' seed.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Check each op's local derivatives against central finite differences at sample points, or
    with FILE the graph's gradient with respect to its leaves against finite differences of replays.

    Prints one line per op and exits 1 when any op fails, naming them (graphsvc.testing.check_op
    is the same check, for a plugin's own tests). With FILE: a line per leaf and, when one fails,
    the op whose derivative is wrong; exit 1 when a leaf fails.

    Example: graphsvc --plugin my_ops.py gradcheck --op cube
    """
    if file is not None:
        if op:
            raise UsageError("gradcheck takes FILE or --op, not both")
        _gradcheck_file(file, output, set_, leaves, (rtol, atol, eps), seed, as_json)
        return
    given = [name for name, value in (("--output", output), ("--set", set_), ("--leaves", leaves)) if value]
    given += [
        name
        for name, value, default in (
            ("--rtol", rtol, 1e-3),
            ("--atol", atol, 1e-5),
            ("--eps", eps, 1e-6),
            ("--seed", seed, 0),
        )
        if value != default
    ]
    if given:
        raise UsageError(f"{given[0]} needs FILE: gradcheck FILE {given[0]} ...")
    from graphsvc.console.views import print_gradcheck
    from graphsvc.testing import check_registry
    from graphsvc.text import counted, listed

    registry = _registry()
    with _plugin_code():
        results = check_registry(registry, op)
    print_gradcheck(results, as_json)
    failed = [r.op for r in results if not r.ok]
    if failed:
        raise GraphsvcError(f"gradcheck failed for {len(failed)} of {counted(len(results), 'op')}: {listed(failed)}")


def _gradcheck_file(
    file: Path,
    output: str | None,
    set_: list[str] | None,
    leaves: list[str] | None,
    tolerances: tuple[float, float, float],
    seed: int,
    as_json: bool,
) -> None:
    """``gradcheck FILE``: load, check (graphsvc.replay.gradcheck), print; exit 1 when a leaf fails."""
    import math

    from graphsvc.console.views import print_graph_gradcheck
    from graphsvc.replay.gradcheck import gradcheck as check_graph
    from graphsvc.replay.run import set_from_text
    from graphsvc.text import listed

    rtol, atol, eps = tolerances
    for name, number in (("--rtol", rtol), ("--atol", atol), ("--eps", eps)):
        if not (math.isfinite(number) and number >= 0) or (name == "--eps" and number == 0):
            raise UsageError(
                f"{name} must be a finite number, {'more than 0' if name == '--eps' else '0 or more'}, not {number:g}"
            )
    graph = _load(file)
    registry = _registry()
    output_ref = None if output is None else graph.node_id(output, "outputs")  # a name or an id, as elsewhere
    with _replaying("checking gradients"):
        result = check_graph(
            graph,
            output_ref,
            dict(set_from_text(set_ or (), "--set")),
            leaves,
            eps=eps,
            rtol=rtol,
            atol=atol,
            seed=seed,
            registry=registry,
        )
    print_graph_gradcheck(result, as_json)
    if not result.passed:
        raise GraphsvcError(f"gradcheck failed for {listed(result.failed)}")


def run() -> None:
    """Console-script entry point."""
    from graphsvc.console.printing import check_stdout

    check_stdout()
    try:
        app(prog_name="graphsvc")
    except BrokenPipeError:  # --help or --version into a closed pipe: quiet, as a command's output is
        sys.stderr.close()
        raise SystemExit(1) from None
    except OSError as exc:  # --help or --version on a full standard output: commands say theirs themselves
        if STATE.debug or exc.filename is not None:
            raise
        from graphsvc.errors import OutputError

        _fail(f"cannot write standard output: {exc.strerror or exc}", OutputError.exit_code)
        raise SystemExit(OutputError.exit_code) from None


if __name__ == "__main__":
    run()
