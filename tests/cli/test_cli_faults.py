"""The CLI under faults: broken plugins everywhere still leave --help and `ops` working; output bytes do
not depend on PYTHONHASHSEED; a user error is one line and never a traceback; --debug shows one; Typer's
pretty exceptions never print local variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from graphsvc import format as fmt
from graphsvc import topo
from graphsvc.graph import GraphBuilder, OpSource
from tests.conftest import EXAMPLES, ROOT

runner = CliRunner()

BROKEN_PLUGINS = {
    "fails_to_import": 'raise ImportError("needs torch")\n',
    "raising_hook": """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_ops(register):
            raise RuntimeError("boom")
    """,
    "bad_signature": """
        from graphsvc.hookspecs import hookimpl

        @hookimpl
        def graphsvc_register_ops(registry, extra):
            pass
    """,
    "malformed_op": """
        from graphsvc.hookspecs import hookimpl
        from graphsvc.ops import Op

        @hookimpl
        def graphsvc_register_ops(register):
            register(Op("half", 1, forward=None, derivatives=None))
    """,
}


def _write_broken(folder: Path) -> dict[str, Path]:
    paths = {}
    for name, body in BROKEN_PLUGINS.items():
        paths[name] = folder / f"graphsvc_broken_{name}.py"
        paths[name].write_text(textwrap.dedent(body), encoding="utf-8")
    return paths


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRAPHSVC_", "_TYPER"))}
    env.update(extra)
    return env


# -- 7. every third-party plugin broken --------------------------------------------------------------
def test_help_and_ops_work_when_every_installed_plugin_is_broken(tmp_path: Path) -> None:
    """Each broken plugin is installed for real: a distribution with a `graphsvc` entry point, found on
    PYTHONPATH. `--help` loads no plugin at all; `ops` lists the builtins (and the working example
    plugins, if installed) and warns once per broken distribution, by name."""
    site = tmp_path / "site"
    site.mkdir()
    for name in _write_broken(site):
        info = site / f"graphsvc_broken_{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: graphsvc-broken-{name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[graphsvc]\n{name} = graphsvc_broken_{name}\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    command = [sys.executable, "-m", "graphsvc"]
    help_run = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (help_run.returncode, help_run.stderr) == (0, "")
    assert "Save, reload, inspect and replay computation graphs." in help_run.stdout

    ops_run = subprocess.run([*command, "ops"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ops_run.returncode == 0, ops_run.stderr
    listed = [line.split("\t")[0] for line in ops_run.stdout.splitlines()]
    assert {"add", "mul", "leaf", "tanh"} <= set(listed) and "half" not in listed
    warnings = sorted(ops_run.stderr.splitlines())
    assert warnings == [
        "Warning: plugin graphsvc-broken-bad_signature: bad hook: graphsvc_register_ops(registry, extra) must "
        "take the one argument the hook passes: graphsvc_register_ops(register)",
        "Warning: plugin graphsvc-broken-fails_to_import: cannot import: ImportError: needs torch",
        "Warning: plugin graphsvc-broken-malformed_op: malformed op: op 'half': forward must be a function, not None",
        "Warning: plugin graphsvc-broken-raising_hook: graphsvc_register_ops raised RuntimeError: boom "
        "(none of its ops were registered)",
    ]

    off = subprocess.run(
        [*command, "ops"], capture_output=True, text=True, env={**env, "GRAPHSVC_DISABLE_PLUGINS": "1"}, cwd=tmp_path
    )
    assert (off.returncode, off.stderr) == (0, "")
    assert all(line.split("\t")[3].startswith("graphsvc ") for line in off.stdout.splitlines())


@pytest.mark.usefixtures("no_installed_plugins")
def test_ops_works_with_broken_plugins_from_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _write_broken(tmp_path)
    monkeypatch.setenv("GRAPHSVC_PLUGINS", f"{paths['fails_to_import']},{paths['raising_hook']}")
    result = runner.invoke(
        app, ["--plugin", str(paths["bad_signature"]), "--plugin", str(paths["malformed_op"]), "ops"]
    )
    assert result.exit_code == 0
    assert len(result.stderr.splitlines()) == 4
    assert all(line.startswith("Warning: plugin ") for line in result.stderr.splitlines())
    clean = runner.invoke(app, ["--disable-plugins", "ops"])
    assert result.stdout == clean.stdout


# -- 9. the same bytes under any PYTHONHASHSEED -----------------------------------------------------------
DRIVER = """
import sys
from typer.testing import CliRunner
from cli import app

runner = CliRunner()
for args in {commands!r}:
    result = runner.invoke(app, args)
    sys.stdout.write(f"$ {{' '.join(args[1:])}} -> {{result.exit_code}}\\n{{result.stdout}}{{result.stderr}}")
"""


def test_output_bytes_do_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    b = GraphBuilder()
    leaves = [b.leaf(float(i), name=name) for i, name in enumerate(["w", "b", "x", "é", "z1", "a"])]
    h = b.add("mul", [leaves[0], leaves[2]], name="h", attrs={"zeta": 1, "alpha": {"k": [1, 2]}, "mid": "m"})
    s = b.add("add", [h, leaves[1]], attrs={"b": 2, "a": 1})
    t = b.add("tanh", [s], name="t")
    u = b.add("mul", [t, leaves[3]])
    b.add("add", [u, b.add("exp", [leaves[4]])], name="L")
    for tag in ("mul", "add", "tanh", "exp"):
        b.op_sources[tag] = OpSource("graphsvc", "0.1.0")
    graph = b.build(metadata={"run": {"seed": 4, "tags": ["b", "a"]}, "author": "z", "α": 1.5})
    path = tmp_path / "g.msgpack"
    fmt.save(graph, path)
    file = str(path)
    commands = [
        ["--disable-plugins", "order", file],
        ["--disable-plugins", "order", file, "--algorithm", "kahn", "--json"],
        ["--disable-plugins", "inspect", file],
        ["--disable-plugins", "inspect", file, "--json"],
        ["--disable-plugins", "backward", file, "--json", "--steps"],
        ["--disable-plugins", "backward", file, "--check"],
        ["--disable-plugins", "convert", file, "--to", "json"],
        ["ops", "--json"],
    ]
    code = DRIVER.format(commands=commands)
    outputs = {}
    for seed in ("0", "1", "4242"):
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            cwd=ROOT,
            env=_env(PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT)),
            check=True,
        )
        outputs[seed] = run.stdout
    assert len(set(outputs.values())) == 1, "output differs between hash seeds"
    text = outputs["0"].decode()
    assert text.count("$ ") == len(commands)
    assert "-> 0\n" in text and "Traceback" not in text


# -- 10. no traceback for a user error; --debug shows one; never local variables ---------------------------
def _hostile(tmp_path: Path) -> Path:
    path = tmp_path / "huge.msgpack"
    path.write_bytes(b"\x88\xa6format\xa8graphsvc\xa5nodes\xdd\xff\xff\xff\xff")
    return path


def _unknown_op(tmp_path: Path) -> Path:
    b = GraphBuilder()
    b.add("cube", [b.leaf(2.0, name="x")], name="y")
    path = tmp_path / "cube.msgpack"
    fmt.save(b.build(), path)
    return path


USER_ERRORS = [
    (["validate", "{tmp}/missing.msgpack"], 3, "Error: {tmp}/missing.msgpack: no such file"),
    (["inspect", "{tmp}"], 3, "Error: {tmp}: is a folder, not a graph file"),
    (["order", "{garbage}"], 3, "Error: {garbage}: not a valid msgpack document: it holds the reserved byte 0xc1"),
    (
        ["validate", "{huge}"],
        3,
        "Error: {huge}: the file is truncated: an array declares 4294967295 entries, more than the file's 28 bytes "
        "can hold",
    ),
    (
        ["backward", "{cube}"],
        4,
        "Error: the graph uses an op not registered here: cube (plugin unknown); install the plugin that provides "
        "it, without --disable-plugins (it keeps out every plugin, --plugin ones too)",
    ),
    (["backward", "{seed}", "--output", "nope"], 2, "Error: no node named 'nope' (the outputs: L)"),
    (
        ["forward", "{seed}", "--set", "L=1"],
        2,
        "Error: node L is a mul node, not a leaf: only leaves can be set",
    ),
    (["forward", "{seed}", "--set", "a=abc"], 2, "Error: --set a: 'abc' is not a number or a .npy file"),
    (["convert", "{seed}", "--to", "xml"], 2, "Error: --to must be json or msgpack, not 'xml'"),
    (["gradcheck", "--op", "nope"], 4, "Error: unknown op 'nope': no loaded plugin registers it (see `graphsvc ops`)"),
    (
        ["gradcheck", "--op", "nll_los"],
        4,
        "Error: unknown op 'nll_los': no loaded plugin registers it; did you mean 'nll_loss'? (see `graphsvc ops`)",
    ),
]


@pytest.mark.parametrize(("args", "code", "expected"), USER_ERRORS, ids=[" ".join(c[0][:2]) for c in USER_ERRORS])
def test_a_user_error_is_one_line_without_a_traceback(
    tmp_path: Path, args: list[str], code: int, expected: str
) -> None:
    garbage = tmp_path / "garbage.msgpack"
    garbage.write_bytes(b"\xc1not msgpack")
    names = {
        "tmp": str(tmp_path),
        "garbage": str(garbage),
        "huge": str(_hostile(tmp_path)),
        "cube": str(_unknown_op(tmp_path)),
        "seed": str(EXAMPLES / "seed004.msgpack"),
    }
    result = runner.invoke(app, ["--disable-plugins", *(arg.format(**names) for arg in args)])
    assert result.exit_code == code
    assert result.stderr == expected.format(**names) + "\n"
    assert result.stdout == ""
    assert isinstance(result.exception, SystemExit)


def test_an_internal_error_is_one_line_and_asks_for_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_depth(graph: object) -> int:
        raise RuntimeError("bug")

    monkeypatch.setattr(topo, "depth", broken_depth)
    result = runner.invoke(app, ["inspect", str(EXAMPLES / "seed004.msgpack")])
    assert result.exit_code == 1
    assert (
        result.stderr == "Error: internal error: RuntimeError: bug (run with --debug for a traceback and report it)\n"
    )


SECRET_PLUGIN = """
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op


def explode(x):
    token = "LOCAL" + "-SENTINEL-" + str(7 * 6)
    raise ValueError("the op failed")


@hookimpl
def graphsvc_register_ops(register):
    register(Op("explode", 1, forward=explode, derivatives=lambda x, out: (x,)))
"""


def test_debug_shows_a_traceback_and_never_local_variables(tmp_path: Path) -> None:
    assert app.pretty_exceptions_show_locals is False
    plugin = tmp_path / "secret_plugin.py"
    plugin.write_text(SECRET_PLUGIN, encoding="utf-8")
    b = GraphBuilder()
    b.add("explode", [b.leaf(1.0, name="x")], name="y")
    path = tmp_path / "g.msgpack"
    fmt.save(b.build(), path)
    base = [sys.executable, "-m", "graphsvc", "--plugin", str(plugin)]
    env = _env(PYTHONPATH=str(ROOT), COLUMNS="100", FORCE_COLOR="1", TERM="xterm-256color")
    plain = subprocess.run([*base, "forward", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert plain.returncode == 1
    assert plain.stderr == "Error: node y: op 'explode' (secret_plugin): forward raised ValueError: the op failed\n"
    debug = subprocess.run(
        [*base[:3], "--debug", *base[3:], "forward", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert debug.returncode == 1
    assert "Traceback (most recent call last):" in debug.stderr
    assert 'raise ValueError("the op failed")' in debug.stderr  # the plugin's own frame is shown
    assert "The above exception was the direct cause of the following exception:" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1] == (
        "graphsvc.errors.ReplayError: node y: op 'explode' (secret_plugin): forward raised ValueError: the op failed"
    )
    assert "LOCAL-SENTINEL-42" not in debug.stderr  # no frame's locals are printed
    assert "locals" not in debug.stderr.lower()
    json.dumps(debug.stderr)  # plain text: no rich markup objects


# -- a small file that asks for unbounded work; Ctrl-C --------------------------------------------
def _broadcast_then_sum(path: Path, shape: list[int]) -> None:
    b = GraphBuilder()
    x = b.leaf(np.ones((1, 1)), name="x")
    b.add("sum", [b.add("broadcast_to", [x], attrs={"shape": shape})], name="loss")
    fmt.save(b.build(), path)


def test_a_file_asking_for_an_8_tib_array_is_refused_before_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "huge.msgpack"
    _broadcast_then_sum(path, [2**20, 2**20])
    assert path.stat().st_size < 1000
    result = runner.invoke(app, ["--disable-plugins", "backward", str(path), "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "Error: node #1 (broadcast_to): asks for a 1048576x1048576 float64 array (8.0 TiB), more than the "
        "limit of 4.0 GiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)\n"
    )


def test_the_array_limit_is_set_by_an_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "wide.msgpack"
    _broadcast_then_sum(path, [1024, 1024])  # 8 MiB
    assert runner.invoke(app, ["--disable-plugins", "forward", str(path)]).exit_code == 0
    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "4MiB")
    result = runner.invoke(app, ["--disable-plugins", "forward", str(path)])
    assert (result.exit_code, result.stderr) == (
        1,
        "Error: node #1 (broadcast_to): asks for a 1024x1024 float64 array (8.0 MiB), more than the limit of "
        "4.0 MiB on one array (GRAPHSVC_MAX_ARRAY_BYTES)\n",
    )
    monkeypatch.setenv("GRAPHSVC_MAX_ARRAY_BYTES", "lots")
    result = runner.invoke(app, ["--disable-plugins", "forward", str(path)])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: GRAPHSVC_MAX_ARRAY_BYTES must be a positive number of bytes, with a unit or without "
        "(4294967296, 512MiB, 16GiB), not 'lots'\n",
    )


def test_ctrl_c_stops_a_replay_between_ops_with_exit_code_130(tmp_path: Path) -> None:
    plugin = tmp_path / "slow_ops.py"
    plugin.write_text(
        textwrap.dedent(
            """
            import time
            from graphsvc.hookspecs import hookimpl
            from graphsvc.ops import Op

            def slow(x):
                time.sleep(0.01)
                return x + 1.0

            @hookimpl
            def graphsvc_register_ops(register):
                register(Op("slow", 1, forward=slow, vjp=lambda g, out, x: (g,)))
            """
        )
    )
    b = GraphBuilder()
    node = b.leaf(np.ones(3), name="x")
    for _ in range(3000):  # 30 s of work
        node = b.add("slow", [node])
    path = tmp_path / "slow.msgpack"
    fmt.save(b.build(), path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(
        [sys.executable, "-m", "graphsvc", "--plugin", str(plugin), "forward", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = process.communicate(timeout=20)
    assert time.monotonic() - started < 5
    assert (process.returncode, out, err) == (130, "", "Error: interrupted\n")


# -- plugins writing after the fact -----------------------------------------------------------------
_WRITES_LATER = """
import os, sys, threading, time
from graphsvc.hookspecs import hookimpl
from graphsvc.ops import Op

def later():
    time.sleep(0.3)
    print("thread print")
    sys.stdout.flush()
    os.write(1, b"thread fd write\\n")

def forward(x):
    if os.fork() == 0:  # the child goes on as graphsvc would, prints its own report, and writes later
        time.sleep(0.2)
        os.write(1, b"child fd write\\n")
        print("child print")
    return x + 1.0

@hookimpl
def graphsvc_register_ops(register):
    threading.Thread(target=later).start()
    register(Op("noisy", 1, forward=forward, vjp=lambda g, out, x: (g,)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_plugins_thread_and_forked_child_writing_later_cannot_corrupt_json(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(_WRITES_LATER)
    b = GraphBuilder()
    b.add("sum", [b.add("noisy", [b.leaf(np.ones(2), name="x")])], name="loss")
    fmt.save(b.build(), tmp_path / "g.msgpack")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run(
        [sys.executable, "-m", "graphsvc", "--plugin", "noisy.py", "backward", "g.msgpack", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)  # exactly one JSON document, nothing else
    assert run.stdout == json.dumps(document, separators=(",", ":")) + "\n"
    assert document["nodes"][0]["name"] == "loss"
    # on stderr (unbuffered when it is not a terminal), where the child's report is written a chunk
    # at a time, a write of the parent's thread may land between two chunks and a chunk between a
    # print's two writes (its text, then its newline); an os.write arrives whole
    for line in ("thread fd write\n", "child fd write\n", "thread print", "child print"):
        assert line in run.stderr
    assert run.stderr.count('{"output":2') == 1  # the child's report went to stderr
