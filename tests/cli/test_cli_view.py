"""``graphsvc view``: the command around the view server (its page is tested in tests/view/test_page.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, python_m_graphsvc, run_cli

SEED004 = ROOT / "examples" / "seed004.msgpack"


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C, then its output; killed if it has not ended in 20 s (no server left behind)."""
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``graphsvc view ARGS --no-browser`` running; its first line of output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "graphsvc", "--disable-plugins", "view", *args, "--no-browser"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRAPHSVC_")},
    )
    assert process.stdout is not None
    return process, process.stdout.readline()


def test_it_serves_the_graph_until_ctrl_c_which_exits_0() -> None:
    process, line = serve("examples/seed004.msgpack")
    try:
        port = int(line.rsplit(":", 1)[1].rstrip("/\n"))
        assert line == f"graphsvc view: serving examples/seed004.msgpack (7 nodes) at http://127.0.0.1:{port}/\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/graph", timeout=10) as response:
            meta = json.load(response)
        assert (meta["files"], meta["nodes"], meta["edges"]) == (["examples/seed004.msgpack"], 7, 8)
    finally:
        out, err = stop(process)
    assert (process.returncode, out, err) == (0, "", "")


def test_two_files_are_named_in_the_serving_line() -> None:
    process, line = serve("examples/seed004.msgpack", "examples/seed004.msgpack")
    stop(process)
    assert line.startswith("graphsvc view: serving examples/seed004.msgpack and examples/seed004.msgpack (7 nodes) at ")


def test_a_missing_file_is_the_usual_error_before_anything_is_served() -> None:
    run = python_m_graphsvc("view", "missing.msgpack", "--no-browser")
    assert (run.returncode, run.stdout, run.stderr) == (3, "", "Error: missing.msgpack: no such file\n")


def test_a_bad_second_file_is_the_usual_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"\x00\x01")
    code, out, err = run_cli("view", str(SEED004), str(bad), "--no-browser")
    assert (code, out) == (3, "")
    assert err.startswith(f"Error: {bad}: ") and err.count("\n") == 1


def test_a_port_in_use_is_a_usage_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli("view", str(SEED004), "--port", str(port), "--no-browser")
    assert (code, out, err) == (2, "", f"Error: cannot serve on 127.0.0.1:{port}: Address already in use\n")


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_port_out_of_range_is_a_usage_error(port: str) -> None:
    code, _, err = run_cli("view", "examples/seed004.msgpack", "--port", port)
    assert code == 2
    assert "Invalid value for '--port'" in err
