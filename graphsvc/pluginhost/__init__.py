"""All plugin wiring, in one function and one fixed order: :func:`load_registry`.

Nothing is loaded at import time. Each call builds a fresh pluggy ``PluginManager`` and a fresh
:class:`~graphsvc.ops.OpRegistry` from, in this order:

1. graphsvc's builtin ops (:mod:`graphsvc.ops.builtin`), through the same hook as everyone else;
2. the entry points of group ``graphsvc``, sorted by entry-point name (found by :func:`_entry_points`,
   which reads only the ``entry_points.txt`` of each installed distribution, without importing
   :mod:`importlib.metadata`, and falls back to it where the layout is not plain folders);
3. the environment variable ``GRAPHSVC_PLUGINS`` (comma-separated module names or ``.py`` files);
4. the ``extra`` argument (the CLI's repeatable ``--plugin``).

``GRAPHSVC_DISABLE_PLUGINS=1`` (or ``disable_third_party=True``) loads the builtins only.

Each third-party plugin is imported here, inside ``try``, so one broken plugin cannot stop the
others (the lesson of simonw/llm issue #1280, where one bad entry point took the whole tool down).
"Broken" includes a plugin that calls ``sys.exit`` or raises ``KeyboardInterrupt`` (or any
``BaseException``) at import or in its hook; only the user's own Ctrl-C stops loading (see
:func:`graphsvc.ops.interrupts_told_apart`). Whatever plugin code prints while it is imported or its
hook runs goes to stderr in the CLI (:func:`plugin_output_to_stderr`), so it cannot corrupt ``--json``.
A plugin's hook gets its own ``register`` callback, so every op is recorded with the plugin that
registered it; its ops are staged and committed only if the hook returns without raising. The
same holds for the op families of ``graphsvc_register_op_families`` (a plugin implements either
hook or both). Problems (an import that fails, a hook that raises, a hook with the wrong
signature, a malformed op or family, an op name or family prefix that is already taken) are
returned as :class:`PluginProblem`; with ``strict=True`` the first
one raises :class:`~graphsvc.errors.PluginError` (exit code 4).

The registry used where none is given (:class:`~graphsvc.value.Value`, :func:`graphsvc.forward`,
:func:`graphsvc.backward`) is :func:`default_registry`, ``load_registry()``'s, loaded on first use;
:func:`use_registry` replaces it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import pluggy

from graphsvc import _version
from graphsvc.errors import OpError, PluginError
from graphsvc.ops import (
    BUILTIN_PLUGIN,
    Op,
    OpFamily,
    OpRegistry,
    check_family_declaration,
    check_op_declaration,
    describe_exception,
    duplicate_family_message,
    duplicate_message,
    expect_registry,
    interrupts_told_apart,
    is_user_interrupt,
)
from graphsvc.text import counted, listed, one_line, shorten

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginProblem",
    "default_registry",
    "keep_stdout_from_plugins",
    "load_registry",
    "plugin_output_to_stderr",
    "running_plugin_code",
    "use_registry",
]

#: The entry-point group third-party distributions declare their plugin module in.
ENTRY_POINT_GROUP = "graphsvc"
#: Extra plugins to load: comma-separated module names or ``.py`` files.
PLUGINS_ENV = "GRAPHSVC_PLUGINS"
#: Set to 1 to load graphsvc's builtin ops only.
DISABLE_ENV = "GRAPHSVC_DISABLE_PLUGINS"

#: Longest message a :class:`PluginProblem` carries (the plugin's exception text is cut shorter).
PROBLEM_CHARS = 300

_HOOK = "graphsvc_register_ops"
_FAMILY_HOOK = "graphsvc_register_op_families"
#: The hooks a plugin may implement, and what each one registers.
_HOOKS = {_HOOK: "ops", _FAMILY_HOOK: "op families"}
_TRUE = frozenset({"1", "true", "yes", "on"})


class PluginProblem(NamedTuple):
    """A plugin that did not load cleanly: its name (distribution, module or file) and what went wrong."""

    plugin: str
    message: str

    def __str__(self) -> str:
        return f"plugin {self.plugin}: {self.message}"


class _Candidate:
    """A plugin to load: how to get its module, and the provenance its ops are recorded with.

    (A plain class: a frozen dataclass costs about a millisecond of every command's start-up to create.)"""

    __slots__ = ("label", "load", "plugin", "version")

    def __init__(
        self, label: str, load: Callable[[], ModuleType], plugin: str | None = None, version: str | None = None
    ) -> None:
        self.label = label  # the name used in problems
        self.load = load
        self.plugin = plugin  # provenance; None: the module's name
        self.version = version  # None: the module's __version__, if any


def load_registry(
    extra: Sequence[str] = (), *, strict: bool = False, disable_third_party: bool = False
) -> tuple[OpRegistry, list[PluginProblem]]:
    """Load graphsvc's builtin ops and every plugin, in the fixed order of the module docstring.

    ``extra`` holds module names or paths of ``.py`` files. Returns the registry and the problems
    found (empty when everything loaded). With ``strict=True`` the first problem raises
    :class:`~graphsvc.errors.PluginError` instead.
    """
    from graphsvc import hookspecs
    from graphsvc.ops import builtin as builtin_ops

    extra = _plugin_specs(extra)
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    loader = _Loader(manager, OpRegistry(), strict)
    with running_plugin_code():
        loader.load(_Candidate("graphsvc", lambda: builtin_ops, BUILTIN_PLUGIN, _version.__version__))
        if not (disable_third_party or os.environ.get(DISABLE_ENV, "").strip().lower() in _TRUE):
            for candidate in _third_party(extra):
                loader.load(candidate)
    return loader.registry, loader.problems


# -- the default registry ---------------------------------------------------------------------------
_registry: OpRegistry | None = None


def default_registry() -> OpRegistry:
    """The registry used where none is given (:class:`graphsvc.value.Value`, :func:`graphsvc.forward`,
    :func:`graphsvc.backward`): :func:`load_registry`'s, loaded on first use, until
    :func:`use_registry` replaces it. A plugin that fails to load is reported as a
    :class:`RuntimeWarning` of one line, not an error."""
    global _registry
    if _registry is None:
        registry, problems = load_registry()
        for problem in problems:
            warnings.warn(one_line(str(problem)), RuntimeWarning, stacklevel=2)
        _registry = registry
    return _registry


def use_registry(registry: OpRegistry | None) -> None:
    """Make ``registry`` the default (``None``: load the default again on next use).

    >>> from graphsvc.pluginhost import load_registry
    >>> registry, problems = load_registry(["myops.py"])  # doctest: +SKIP
    >>> use_registry(registry)  # doctest: +SKIP
    """
    expect_registry(registry)
    global _registry
    _registry = registry


@contextlib.contextmanager
def plugin_output_to_stderr() -> Iterator[None]:
    """Send everything written to stdout to stderr while plugin code runs, so a plugin's ``print``
    cannot corrupt ``--json`` or the tab-separated listings.

    ``sys.stdout`` is set to ``sys.stderr`` (as :func:`contextlib.redirect_stdout` does); when
    stdout is a real file descriptor (fd 1), fd 1 is pointed at fd 2 as well (flushing first,
    restored after), which catches C extensions and ``os.write(1, ...)``. Meant to be entered once
    around a whole load or replay, not per op call. Uses nest and may overlap across threads: the
    first one in redirects, the last one out restores. Output of other threads written meanwhile
    goes to stderr too.
    """
    global _redirects, _saved_stdout, _saved_fd
    with _redirect_lock:
        if _redirects == 0:
            _flush_own_stdout()
            _saved_stdout, _saved_fd = sys.stdout, None
            if _is_fd(sys.stdout, 1) and _is_fd(sys.stderr, 2):
                _flush(sys.stdout, sys.stderr)
                _saved_fd = os.dup(1)
                os.dup2(2, 1)
            sys.stdout = sys.stderr
        _redirects += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirects -= 1
            if _redirects == 0:
                if _saved_fd is not None:
                    _flush(sys.stdout, sys.stderr, sys.__stdout__)
                    os.dup2(_saved_fd, 1)
                    os.close(_saved_fd)
                sys.stdout, _saved_stdout, _saved_fd = _saved_stdout, None, None


def keep_stdout_from_plugins(open_stdout: Callable[[int, Any], Any] | None = None) -> None:
    """From now on, for the rest of the process, only graphsvc itself writes to stdout: a thread a
    plugin started, a process it forked, or code of its own that runs later (a finalizer, an atexit
    hook) writes to stderr, whenever it writes. For a program whose stdout is data (the CLI's
    ``--json``), called before the first plugin code runs; calling it again changes nothing.

    When stdout is file descriptor 1, the stream graphsvc prints through gets a private duplicate of
    it, and fd 1 is pointed at stderr (fd 2) for good: ``os.write(1, ...)``, C extensions and child
    processes write to stderr. ``sys.stdout`` becomes a guard that passes graphsvc's writes on to that
    stream, and sends writes from any other thread or process (after a ``fork``) to ``sys.stderr``.
    Where stdout is not fd 1 (a test's capture), only the guard is installed. ``open_stdout(fd,
    current)`` makes the stream over the duplicate, given the stream it replaces (the CLI's writes
    every byte or raises: :func:`graphsvc.console.printing.stdout_stream`); by default a plain
    buffered text stream with the current one's encoding.
    """
    current = sys.stdout
    if isinstance(current, _StdoutGuard) or current is None:
        return
    own: Any = current
    if _is_fd(current, 1) and _is_fd(sys.stderr, 2):
        _flush(current, sys.stderr)
        private = os.dup(1)
        os.set_inheritable(private, False)
        os.dup2(2, 1)
        if open_stdout is not None:
            own = open_stdout(private, current)
        else:
            own = io.TextIOWrapper(  # the process's stdout from now on (flushed at exit, as sys.stdout is)
                io.BufferedWriter(io.FileIO(private, "w")),
                encoding=getattr(current, "encoding", None) or "utf-8",
                errors=getattr(current, "errors", None) or "strict",
                line_buffering=bool(getattr(current, "line_buffering", False)),
            )
    sys.stdout = _StdoutGuard(own)


class _StdoutGuard:
    """``sys.stdout`` after :func:`keep_stdout_from_plugins`: graphsvc's stream for the thread and
    process that installed it, ``sys.stderr`` for every other."""

    def __init__(self, own: Any) -> None:
        self._own = own
        self._pid = os.getpid()
        self._thread = threading.current_thread()

    def _target(self) -> Any:
        if os.getpid() == self._pid and threading.current_thread() is self._thread:
            return self._own
        return sys.stderr

    def write(self, text: str) -> int:
        return int(self._target().write(text))

    def writelines(self, lines: Iterable[str]) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._target().flush()

    def fileno(self) -> int:
        return int(self._target().fileno())

    def isatty(self) -> bool:
        return bool(self._target().isatty())

    def __getattr__(self, name: str) -> Any:  # buffer, encoding, errors...
        return getattr(self._target(), name)


def _flush_own_stdout() -> None:
    """Before plugin code runs: nothing of graphsvc's may wait in a buffer a ``fork`` would copy."""
    if isinstance(sys.stdout, _StdoutGuard):
        _flush(sys.stdout)


_redirect_lock = threading.Lock()
_redirects = 0  # how many plugin_output_to_stderr() are active, in every thread
_saved_stdout: Any = None
_saved_fd: int | None = None


def _is_fd(stream: Any, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # a StringIO, a CliRunner capture, a closed stream
        return False


def _flush(*streams: Any) -> None:
    for stream in streams:
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


@contextlib.contextmanager
def running_plugin_code() -> Iterator[None]:
    """Around a load or a replay, anything that calls plugin code:
    :func:`graphsvc.ops.interrupts_told_apart` (the user's Ctrl-C stops the tool; a
    ``KeyboardInterrupt`` the plugin raises is its failure). Nesting costs a few microseconds.

    It does not move stdout: in a library that would take the whole process's stdout (another
    thread's output, a protocol spoken over it) for the length of a replay. A program whose stdout
    is data, as the CLI's ``--json`` is, wraps its plugin calls in :func:`plugin_output_to_stderr`."""
    with interrupts_told_apart():
        yield


def _plugin_specs(extra: object) -> list[str]:
    """``extra`` of :func:`load_registry` as a list of str; a lone str or path (read letter by
    letter, it would load plugins named "m", "y"...) or anything but names and paths is a TypeError."""
    if isinstance(extra, (str, bytes, os.PathLike)) or not isinstance(extra, Iterable):
        raise TypeError(
            "extra must be a list of module names or paths of .py files, such as ['my_ops.py'], "
            f"not {type(extra).__name__}"
        )
    specs = list(extra)
    for spec in specs:
        if not isinstance(spec, (str, os.PathLike)):
            raise TypeError(f"extra must hold module names or paths of .py files, not {type(spec).__name__}")
    return [str(os.fspath(spec)) for spec in specs]


def _third_party(extra: Sequence[str]) -> Iterable[_Candidate]:
    seen: set[tuple[str, str]] = set()
    for ep in sorted(_entry_points(), key=lambda ep: (ep.name, ep.value)):
        if (ep.name, ep.value) in seen:  # one distribution found twice on sys.path
            continue
        seen.add((ep.name, ep.value))
        dist = ep.dist
        if dist is not None:
            yield _Candidate(dist.name, ep.load, dist.name, dist.version)
        else:
            yield _Candidate(ep.name, ep.load, ep.name)
    env = [item.strip() for item in os.environ.get(PLUGINS_ENV, "").split(",")]
    files: set[Path] = set()
    for spec in [*(item for item in env if item), *extra]:
        if spec.endswith(".py"):
            path = Path(spec)
            if path.resolve() in files:  # the same file given twice: load it once
                continue
            files.add(path.resolve())
            yield _Candidate(str(path), functools.partial(_import_file, path), path.stem)
        else:
            yield _Candidate(spec, functools.partial(importlib.import_module, spec))


if TYPE_CHECKING:  # for the type checker only: creating Protocol classes costs start-up time

    class _DistributionLike(Protocol):
        @property
        def name(self) -> str: ...

        @property
        def version(self) -> str: ...

    class _EntryPointLike(Protocol):
        """What :func:`_third_party` needs of an entry point: ours, importlib.metadata's, a test's fake."""

        @property
        def name(self) -> str: ...

        @property
        def value(self) -> str: ...

        @property
        def dist(self) -> _DistributionLike | None: ...

        def load(self) -> Any: ...


def _entry_points() -> Sequence[_EntryPointLike]:
    """The installed entry points of group ``graphsvc`` (tests replace this).

    The same answer as ``importlib.metadata.entry_points(group="graphsvc")``, found without importing
    :mod:`importlib.metadata` (which imports the :mod:`email` package, ~20 ms) or parsing every
    distribution's metadata: :func:`_scan_entry_points` lists the folders on ``sys.path`` and reads the
    ``entry_points.txt`` of each distribution in them, every run (no cache, so a plugin installed a
    moment ago is found). Where discovery is not plain folders, importlib.metadata answers.
    """
    found = _scan_entry_points(sys.path, sys.meta_path)
    if found is not None:
        return found
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


class _Distribution(NamedTuple):
    name: str
    version: str


#: importlib.metadata's ``EntryPoint.pattern``: ``module[:attr.attr] [extras]`` (compiled on first
#: use, through :mod:`re`'s cache, not at import: ``order``, ``inspect`` and ``validate`` load no plugin).
_ENTRY_POINT_VALUE = r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$"


class _EntryPoint(NamedTuple):
    """One entry point found by :func:`_scan_entry_points`; ``load`` as importlib.metadata's does it."""

    name: str
    value: str
    dist: _Distribution | None

    def load(self) -> Any:
        match = re.match(_ENTRY_POINT_VALUE, self.value)
        if match is None:
            raise ValueError(f"malformed entry point {self.name} = {self.value}")
        module = importlib.import_module(match.group("module"))
        return functools.reduce(getattr, filter(None, (match.group("attr") or "").split(".")), module)


def _scan_entry_points(
    path: Sequence[Any], meta_path: Sequence[Any], group: str = ENTRY_POINT_GROUP
) -> list[_EntryPoint] | None:
    """The entry points of ``group`` of the distributions in the folders of ``path``, as
    importlib.metadata finds them; None where it would look elsewhere too.

    importlib.metadata's rules, kept here: each folder on ``path`` in order (``""`` is the current
    folder) is listed, and its ``*.dist-info`` and ``*.egg-info`` entries are distributions, named by
    the part of the entry name before its first ``-``, normalized (PEP 503, ``-`` as ``_``); the first
    distribution of each normalized name wins. Its ``entry_points.txt`` is an INI-like file
    (``[group]`` lines, then ``name = value`` lines, ``#`` comments). The distribution's name and
    version are the ``Name:`` and ``Version:`` headers of its ``METADATA`` (or ``PKG-INFO``), read
    only for a distribution that has an entry point in ``group``.

    None (ask importlib.metadata) when a finder on ``meta_path`` other than the standard path finder
    can find distributions, or an entry of ``path`` is not a string, is a file (a zip) or an ``.egg``.
    """
    from importlib.machinery import PathFinder

    if any(hasattr(finder, "find_distributions") and finder is not PathFinder for finder in meta_path):
        return None
    found: list[_EntryPoint] = []
    seen: set[str] = set()
    for entry in path:
        if not isinstance(entry, str) or entry.lower().endswith(".egg"):
            return None
        folder = entry or "."
        try:
            children = os.listdir(folder)
        except NotADirectoryError:
            return None  # a zip file on sys.path
        except OSError:
            continue  # a folder that does not exist: importlib.metadata skips it too
        for child in children:
            low = child.lower()
            if not low.endswith((".dist-info", ".egg-info")):
                continue
            normalized = re.sub(r"[-_.]+", "_", low.rpartition(".")[0].partition("-")[0])
            if normalized in seen:
                continue
            seen.add(normalized)
            info = os.path.join(folder, child)
            pairs = _group_entries(_read_text(info, "entry_points.txt") or "", group)
            if pairs:
                dist = _read_distribution(info)
                found.extend(_EntryPoint(name, value, dist) for name, value in pairs)
    return found


def _read_text(info: str, name: str) -> str | None:
    """A file of an installed distribution's metadata, or None. Read only when what was opened is a
    regular file: a FIFO in a folder on Python's path (the current one, for ``python -m``) is not
    waited for at every start."""
    from graphsvc.files import open_regular

    try:
        with open_regular(os.path.join(info, name)) as file:
            return file.read().decode("utf-8", "replace")
    except OSError:  # no such file, not a regular file, an .egg-info that is itself a file, unreadable
        return None


def _group_entries(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` pairs of ``[group]`` in an ``entry_points.txt`` (importlib.metadata's
    ``Sectioned`` reading: stripped lines, ``#`` comments and blank lines skipped)."""
    if group not in text:
        return []
    pairs: list[tuple[str, str]] = []
    section: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
        elif section == group:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def _read_distribution(info: str) -> _Distribution | None:
    """Name and version from the headers of ``METADATA`` (or ``PKG-INFO``), None without both."""
    text = _read_text(info, "METADATA") or _read_text(info, "PKG-INFO") or ""
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line; the description follows
        key, colon, value = line.partition(":")
        if colon and not line[0].isspace():
            headers.setdefault(key.strip().lower(), value.strip())
    name, version = headers.get("name"), headers.get("version")
    return _Distribution(name, version) if name and version else None


def _import_file(path: Path) -> ModuleType:
    """Execute a ``.py`` file as a module named after its stem, without leaving it in ``sys.modules``.

    The source is read from what was opened, once it is known to be a regular file (a FIFO at the
    path, even one swapped in after a look at it, is refused, not waited for), and run from there."""
    from graphsvc.files import NotRegularFile, open_regular

    try:
        with open_regular(path) as file:
            source = file.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {path}") from None
    except NotRegularFile as exc:
        raise OSError(f"{path} {exc}") from None
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # The module is visible in sys.modules while it runs (dataclasses need that), then removed
    # so a plugin file cannot shadow a real module of the same name.
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    finally:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    return module


def _import_problem(candidate: _Candidate, exc: BaseException) -> str:
    """Why ``candidate`` did not import. A module name that Python's path lacks while the current
    folder holds a file of that name (the console script's path has no current folder, a script's
    has its own: graphsvc does not add it, so a file there cannot shadow a module) says to pass the
    file's path instead."""
    name = candidate.label
    if isinstance(exc, ModuleNotFoundError) and candidate.plugin is None and exc.name == name:
        file = f"{name}.py"
        if os.path.isfile(file):
            return f"cannot import {name!r}: no module of that name on Python's path (pass the file: ./{file})"
    return f"cannot import: {describe_exception(exc)}"


class _Loader:
    """Loads plugins one at a time into one plugin manager and one registry, collecting problems."""

    def __init__(self, manager: pluggy.PluginManager, registry: OpRegistry, strict: bool) -> None:
        self.manager = manager
        self.registry = registry
        self.strict = strict
        self.problems: list[PluginProblem] = []

    def load(self, candidate: _Candidate) -> None:
        before = len(self.problems)
        try:
            self._load(candidate)
        except BaseException as exc:  # plugin code run by pluggy's inspection (a module __getattr__...)
            if is_user_interrupt(exc):
                raise
            self._problem(candidate.label, f"failed while loading: {describe_exception(exc)}")
        if self.strict and len(self.problems) > before:
            raise PluginError(str(self.problems[before]))

    def _problem(self, plugin: str, message: str) -> None:
        self.problems.append(PluginProblem(plugin, shorten(message, PROBLEM_CHARS)))

    def _load(self, candidate: _Candidate) -> None:
        label = candidate.label
        try:
            module = candidate.load()
        except BaseException as exc:  # sys.exit and a KeyboardInterrupt of the plugin's own are failures too
            if is_user_interrupt(exc):
                raise
            self._problem(label, _import_problem(candidate, exc))
            return
        if self.manager.is_registered(module):  # the same module listed twice: load it once
            return
        plugin = candidate.plugin or module.__name__
        version = candidate.version if candidate.version is not None else _module_version(module)
        try:
            self.manager.register(module, name=f"{len(self.manager.get_plugins())}:{label}")
        except pluggy.PluginValidationError as exc:
            if self.manager.is_registered(module):
                self.manager.unregister(module)
            self._problem(label, f"bad hook: {_signature_problem(module) or _one_line(str(exc))}")
            return
        impls = self._hookimpls(label, module)
        if impls is None:
            return
        for hook, hook_impls in impls.items():
            register: _Registration | _FamilyRegistration
            if hook == _HOOK:
                register = _Registration(self, label, plugin, version)
            else:
                register = _FamilyRegistration(self, label, plugin, version)
            for impl in hook_impls:
                try:
                    impl.function(**dict.fromkeys(impl.argnames, register))
                except BaseException as exc:
                    if is_user_interrupt(exc):
                        raise
                    self._problem(
                        label, f"{hook} raised {describe_exception(exc)} (none of its {_HOOKS[hook]} were registered)"
                    )
                    register.staged.clear()
                    register.duplicates.clear()
                    break
            register.closed = True
            register.report_duplicates()
            register.commit()

    def _hookimpls(self, label: str, module: ModuleType) -> dict[str, list[Any]] | None:
        """The module's implementations of each hook it implements (ops first, then op families);
        None (and a problem) when it has none usable."""
        unknown = [caller.name for caller in self.manager.get_hookcallers(module) or [] if not caller.has_spec()]
        if unknown:
            self.manager.unregister(module)
            self._problem(label, f"unknown hook {unknown[0]!r} (the hooks are {_HOOK} and {_FAMILY_HOOK})")
            return None
        found = {
            hook: [impl for impl in getattr(self.manager.hook, hook).get_hookimpls() if impl.plugin is module]
            for hook in _HOOKS
        }
        found = {hook: impls for hook, impls in found.items() if impls}
        if not found:
            self._problem(label, f"defines no @hookimpl {_HOOK}(register) or {_FAMILY_HOOK}(register)")
            return None
        for hook, impls in found.items():
            for impl in impls:
                if impl.wrapper or impl.hookwrapper:
                    self._problem(label, f"bad hook: {hook} must not be a hook wrapper")
                    return None
                if "register" not in impl.argnames:  # pluggy accepts it; it could never register anything
                    self._problem(
                        label,
                        f"bad hook: {hook}() takes no argument, so it cannot register {_HOOKS[hook]}: {hook}(register)",
                    )
                    return None
        return found


class _Registration:
    """The ``register`` callback one plugin's hook receives: it checks each op and stages it."""

    def __init__(self, loader: _Loader, label: str, plugin: str, version: str | None) -> None:
        self.loader = loader
        self.label = label
        self.plugin = plugin
        self.version = version
        self.staged: list[Op] = []
        self.duplicates: list[tuple[Op, Op]] = []  # (the op kept, the one refused)
        self.closed = False

    def __call__(self, op: Op) -> None:
        if self.closed:
            raise OpError(f"register() was called after {_HOOK} returned; call it inside the hook")
        try:
            check_op_declaration(op)
        except OpError as exc:
            self.loader._problem(self.label, f"malformed op: {exc}")
            return
        recorded = dataclasses.replace(op, plugin=self.plugin, plugin_version=self.version)
        registry = self.loader.registry
        first = registry.registered(op.name) or next((s for s in self.staged if s.name == op.name), None)
        if first is not None:
            self.duplicates.append((first, recorded))
            return
        self.staged.append(recorded)

    def report_duplicates(self) -> None:
        """One problem per plugin whose names this one repeated (a list cut with a count), not one per op."""
        by_source: dict[str, list[tuple[Op, Op]]] = {}
        for first, second in self.duplicates:
            by_source.setdefault(first.source, []).append((first, second))
        for pairs in by_source.values():
            first, second = pairs[0]
            if len(pairs) == 1:
                self.loader._problem(self.label, duplicate_message(first, second))
                continue
            names = listed(first.name for first, _ in pairs)
            ops = counted(len(pairs), "op", thousands=True)
            if (first.plugin, first.plugin_version) == (second.plugin, second.plugin_version):
                message = f"{ops} are registered twice by {first.source} (the first ones are kept): {names}"
            else:
                message = (
                    f"{ops} are registered by both {first.source} and {second.source} "
                    f"(the first ones are kept): {names}"
                )
            self.loader._problem(self.label, message)

    def commit(self) -> None:
        """Add the staged ops to the registry."""
        for op in self.staged:
            try:
                self.loader.registry.register(op, plugin=self.plugin, plugin_version=self.version)
            except OpError as exc:  # cannot happen after the callback's checks; report it anyway
                self.loader._problem(self.label, str(exc))


class _FamilyRegistration:
    """The ``register`` callback of one plugin's ``graphsvc_register_op_families``: it checks each
    op family and stages it."""

    def __init__(self, loader: _Loader, label: str, plugin: str, version: str | None) -> None:
        self.loader = loader
        self.label = label
        self.plugin = plugin
        self.version = version
        self.staged: list[OpFamily] = []
        self.duplicates: list[tuple[OpFamily, OpFamily]] = []  # (the family kept, the one refused)
        self.closed = False

    def __call__(self, family: OpFamily) -> None:
        if self.closed:
            raise OpError(f"register() was called after {_FAMILY_HOOK} returned; call it inside the hook")
        try:
            check_family_declaration(family)
        except OpError as exc:
            self.loader._problem(self.label, f"malformed op family: {exc}")
            return
        recorded = dataclasses.replace(family, plugin=self.plugin, plugin_version=self.version)
        first = self.loader.registry.family(family.prefix)
        first = first or next((s for s in self.staged if s.prefix == family.prefix), None)
        if first is not None:
            self.duplicates.append((first, recorded))
            return
        self.staged.append(recorded)

    def report_duplicates(self) -> None:
        """One problem per prefix registered again."""
        for first, second in self.duplicates:
            self.loader._problem(self.label, duplicate_family_message(first, second))

    def commit(self) -> None:
        """Add the staged families to the registry."""
        for family in self.staged:
            try:
                self.loader.registry.register_family(family, plugin=self.plugin, plugin_version=self.version)
            except OpError as exc:  # cannot happen after the callback's checks; report it anyway
                self.loader._problem(self.label, str(exc))


def _module_version(module: ModuleType) -> str | None:
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


def _signature_problem(module: ModuleType) -> str | None:
    """Say what is wrong with a hook's arguments, when that is what pluggy refused."""
    for hook in _HOOKS:
        function = getattr(module, hook, None)
        if function is None:
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        if not set(signature.parameters) <= {"register"}:
            return f"{hook}{signature} must take the one argument the hook passes: {hook}(register)"
    return None


def _one_line(text: str) -> str:
    # pluggy's first line names the plugin by its internal registration name; leave it out
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[1:] or lines)
