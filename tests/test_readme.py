"""The README's front door stays true: its commands are the ones CI runs, and they work."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = bash_blocks()[1]
    ci = (ROOT / ".ci" / "run").read_text()
    between = ci.split("# >>> the README's test command")[1].split("# <<<")[0]
    assert [line for line in between.splitlines()[1:] if line.strip()] == [f"readme_test_command='{test_command}'"]
    after = ci.split("# <<<")[1]
    # its installs, then PyTorch, then its tests, which must not skip for want of PyTorch
    steps = [
        'bash -c "$readme_installs"',
        "pip install -q torch==2.13.0",
        "export GRAPHSVC_REQUIRE_TORCH=1",
        'bash -c "$readme_tests"',
    ]
    lines = [line.strip() for line in after.splitlines()]
    assert [lines.index(step) for step in steps] == sorted(lines.index(step) for step in steps)
    assert "torch" not in test_command.replace("./plugins/graphsvc-torch", "")  # the README's tests run without it


def test_ci_splits_the_readme_test_command_into_its_installs_and_its_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    split = "\n".join(
        line
        for line in ci.splitlines()
        if line.startswith(("readme_test_command=", "readme_installs=", "readme_tests=", "test "))
    )
    script = split + '\nprintf "%s\\n%s\\n" "$readme_installs" "$readme_tests"'
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, check=True)
    installs, tests = result.stdout.splitlines()
    assert installs == bash_blocks()[1].removesuffix(" && python -m pytest -q")
    assert tests == "python -m pytest -q"


def test_the_quick_start_job_runs_on_the_shipped_example() -> None:
    job = bash_blocks()[0]
    assert job == "pip install . && graphsvc backward examples/seed004.msgpack --steps"
    command = job.split("&& ", 1)[1].split()
    result = subprocess.run(
        [sys.executable, "-m", "graphsvc", *command[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    assert "step 7: a (leaf) grad = 22.0" in lines
    assert "0\ta\tleaf\t-\t2.0\t22.0" in lines
    assert "1\tb\tleaf\t-\t3.0\t17.0" in lines
    assert "2\tc\tleaf\t-\t1.0\t5.0" in lines
