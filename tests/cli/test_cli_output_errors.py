"""Outputs that cannot be written (issue 25, items 6 and 9): every output path, a file or standard
output, fails with one line and exit code 5 (OutputError), never 3 (a bad input graph) and never 0
with a cut file. Standard output is checked under ``ulimit -f`` (a short write, then EFBIG: Python
ignores SIGXFSZ) and on /dev/full (ENOSPC); a closed pipe keeps its quiet exit 1."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graphsvc.console import printing
from graphsvc.errors import GraphFileError, OutputError
from tests.conftest import EXAMPLES, ROOT

MLP = EXAMPLES / "micrograd_mlp.msgpack"
SEED004 = EXAMPLES / "seed004.msgpack"
#: ``ulimit -f`` in blocks of 1024 bytes: every output below is larger.
LIMIT_BLOCKS = 2


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``bash -c COMMAND`` with ``graphsvc`` meaning ``python -m graphsvc --disable-plugins``."""
    graphsvc = f"{shlex.quote(sys.executable)} -m graphsvc --disable-plugins"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRAPHSVC_FORCE_TERMINAL", None)
    # the command word only: a checkout's path (a clone into ./graphsvc) has the word in it too
    script = re.sub(r"(^|; )graphsvc ", lambda m: f"{m.group(1)}{graphsvc} ", command)
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, env=env, check=False)


def test_output_error_has_its_own_exit_code_and_is_a_graph_file_error() -> None:
    assert OutputError.exit_code == 5
    assert issubclass(OutputError, GraphFileError) and GraphFileError.exit_code == 3


STDOUT_COMMANDS = [
    f"convert {MLP} --to json",
    f"convert {MLP} --to msgpack -o -",
    f"render {MLP} -o -",
    f"order {MLP} --json",
    f"order {MLP}",
    f"forward {MLP} --json",
    f"backward {MLP}",
]


@pytest.mark.parametrize("args", STDOUT_COMMANDS)
def test_standard_output_over_ulimit_f_exits_5_not_0(args: str, tmp_path: Path) -> None:
    whole = shell(f"graphsvc {args} > whole", tmp_path)
    assert (whole.returncode, whole.stderr) == (0, "")
    assert (tmp_path / "whole").stat().st_size > 2 * LIMIT_BLOCKS * 1024
    cut = shell(f"ulimit -f {LIMIT_BLOCKS}; graphsvc {args} > cut", tmp_path)
    assert (cut.returncode, cut.stderr) == (5, "Error: cannot write standard output: File too large\n")


@pytest.mark.parametrize("args", [*STDOUT_COMMANDS, f"inspect {MLP} --json", f"validate {SEED004}", "--version", "-h"])
def test_standard_output_on_dev_full_exits_5(args: str, tmp_path: Path) -> None:
    full = shell(f"graphsvc {args} > /dev/full", tmp_path)
    assert (full.returncode, full.stderr) == (5, "Error: cannot write standard output: No space left on device\n")


@pytest.mark.parametrize(
    ("args", "out"),
    [
        (f"convert {SEED004} -o nodir/x.json", "nodir/x.json"),
        (f"convert {SEED004} -o nodir/x.msgpack", "nodir/x.msgpack"),
        (f"render {SEED004} -o nodir/x.dot", "nodir/x.dot"),
        (f"forward {SEED004} --write nodir/out.msgpack", "nodir/out.msgpack"),
        (f"backward {SEED004} --write nodir/out.msgpack", "nodir/out.msgpack"),
    ],
)
def test_a_file_output_in_a_missing_folder_exits_5(args: str, out: str, tmp_path: Path) -> None:
    result = shell(f"graphsvc {args} > /dev/null", tmp_path)
    assert (result.returncode, result.stderr) == (5, f"Error: cannot write {out}: No such file or directory\n")
    assert list(tmp_path.iterdir()) == []


def test_a_file_output_over_ulimit_f_exits_5_and_writes_nothing(tmp_path: Path) -> None:
    result = shell(f"ulimit -f {LIMIT_BLOCKS}; graphsvc convert {MLP} --to json -o out.json", tmp_path)
    assert (result.returncode, result.stderr) == (5, "Error: cannot write out.json: File too large\n")
    assert list(tmp_path.iterdir()) == []


def test_a_closed_pipe_keeps_its_quiet_exit_1(tmp_path: Path) -> None:
    """docs/cli.md: ``| head`` ends the command without a word; the big listing cannot fit a pipe."""
    big = tmp_path / "big.msgpack"
    from graphsvc import format as fmt
    from graphsvc.graph import GraphBuilder

    builder = GraphBuilder()
    node = builder.leaf(1.0, name="x")
    for _ in range(100_000):
        node = builder.add("neg", [node])
    fmt.save(builder.build(outputs=[node]), big)
    result = shell(f"graphsvc order {big} | head -1; echo ${{PIPESTATUS[0]}}", tmp_path)
    assert (result.stdout, result.stderr) == ("100000\t-\tneg\t99999\n1\n", "")


def test_write_bytes_refuses_a_short_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stdout the CLI did not make whole (a library caller's): a short count is an error."""

    class Short:
        def write(self, data: bytes) -> int:
            return len(data) // 2

        def flush(self) -> None:
            pass

    class Stdout:
        buffer = Short()

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Stdout())
    with pytest.raises(OSError, match=r"^\[Errno 0\] only 2 of 4 bytes were written$"):
        printing.write_bytes(b"abcd")


def test_whole_writes_resume_short_writes_then_discard_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    raw = printing._WholeWrites(write)
    calls: list[int] = []
    real = os.write

    def short(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(27, "File too large")
        return real(fd, data[:2])

    monkeypatch.setattr(os, "write", short)
    assert raw.write(b"abcd") == 4
    with pytest.raises(OSError, match="File too large"):
        raw.write(b"efgh")
    assert raw.write(b"ijkl") == 4  # discarded: the command is already failing
    monkeypatch.undo()
    os.close(write)
    assert os.read(read, 100) == b"abcd"
    assert calls == [4, 2, 4]
    os.close(read)


def test_sigxfsz_restored_to_its_default_still_gives_exit_5_not_a_kill(tmp_path: Path) -> None:
    """An embedding program that put SIGXFSZ back to SIG_DFL: check_stdout ignores it again."""
    script = (
        "import signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
        "sys.argv = ['graphsvc', '--disable-plugins', 'convert', sys.argv[1], '--to', 'json']; "
        "from graphsvc.__main__ import main; main()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = f"ulimit -f {LIMIT_BLOCKS}; {shlex.quote(sys.executable)} -c {shlex.quote(script)} {MLP} > cut"
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert (result.returncode, result.stderr) == (5, "Error: cannot write standard output: File too large\n")
