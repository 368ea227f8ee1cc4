"""Every fenced code block in README.md, every docs/*.md page, benchmarks/README.md and the example
plugins' READMEs runs as written.

Each document gets a fresh temporary directory (README.md's and docs/cli.md's with a copy of
examples/), and its blocks run there in order, in subprocesses, with this environment's ``python`` and
``graphsvc`` first on PATH. By language:

- ``python``: a block whose first line is ``# NAME.py`` shows a file: it is written to NAME.py, for the
  blocks after it to run. A block whose first line is ``# from PATH`` quotes the repository file PATH:
  each of its statements, bodies aside, must be one of PATH's top-level statements. Any other block runs
  as a script of its own (every block imports what it uses, so a reader can paste any one of them). When
  one of its ``print(...)`` lines ends in a comment, every one must, and the lines the script
  prints must be those comments.
- ``console``: ``$ COMMAND`` lines, each followed by exactly what COMMAND prints on stdout (trailing
  whitespace aside). The commands run in one bash shell, so ``$ echo $?`` shows the previous exit code;
  a command that exits non-zero must be followed by ``$ echo $?``.
- ``bash``: the block runs under ``bash -euo pipefail``.
- ``toml``: the first line is ``# from PATH``, and the block must be a part of the TOML file PATH.
- ``text``: never runs; each such block is listed in NEVER_RUN with the reason.

Blocks that need PyTorch (a ``python`` block that imports torch or graphsvc.torch, a ``console``
block that reads a ``captured_*.msgpack`` file, which such a block writes) skip where torch is not
installed, as the README's test command runs without it; CI installs it.

Commands that install packages, run the whole test suite or fuzz for minutes are listed in
SKIPPED_COMMANDS with the reason and taken out of their block; a block left with nothing to run is
skipped. Blocks that write an image need Graphviz's ``dot``: without it they skip, or fail when
GRAPHSVC_REQUIRE_GRAPHVIZ=1 (CI sets it). Blocks that need PyTorch (a python block that imports
torch, or that names a file an earlier block of its document wrote that imports it; a console or bash
block that names such a file), or the graphsvc-torch plugin (code that imports it, a command that
names it), skip without it, or fail when GRAPHSVC_REQUIRE_TORCH=1 (CI sets it).
A block in any other language fails, so a new block cannot go
untested.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REQUIRE_TORCH, ROOT, graphviz_missing, torch_missing

DOCUMENTS = (
    "README.md",
    *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md")),
    "benchmarks/README.md",
    "plugins/graphsvc-activations/README.md",
    "plugins/graphsvc-binary/README.md",
    "plugins/graphsvc-conv/README.md",
    "plugins/graphsvc-torch/README.md",
)
#: What each document's directory starts with, copied from the checkout.
COPIED = {"README.md": ("examples",), "docs/cli.md": ("examples",)}

#: Commands (a whole console command, or one part of a bash `a && b` line) that never run, and why.
SKIPPED_COMMANDS = {
    "pip install .": "installs graphsvc; the blocks run the graphsvc installed from this checkout",
    'pip install -q -e ".[test]"': "installs the test tools, which these tests already run under",
    "pip install -q ./plugins/graphsvc-activations ./plugins/graphsvc-binary ./plugins/graphsvc-conv "
    "./plugins/graphsvc-torch": (
        "installs the example plugins; the test environment has them (CI's command installs them)"
    ),
    "pip install ./plugins/graphsvc-activations ./plugins/graphsvc-binary": (
        "installs the example plugins; the test environment has them (CI's command installs them)"
    ),
    **{
        f"pip install ./plugins/graphsvc-{name}": (
            "installs an example plugin; the test environment has it (CI's command installs it)"
        )
        for name in ("activations", "binary", "conv")
    },
    "pip install ./plugins/graphsvc-torch torch==2.13.0": (
        "installs the torch plugin and PyTorch; the test environment has the plugin (CI's command installs it), "
        "and the blocks that need PyTorch skip without it"
    ),
    "python -m pytest -q": (
        "runs the whole test suite, this file included; tests/test_readme.py checks it is CI's command"
    ),
    'pip install -e ".[fuzz]"': "installs atheris, which only the fuzzer needs",
    "python fuzz/fuzz_loads.py -max_total_time=600": "a ten-minute fuzzing run",
    "python fuzz/fuzz_json.py --seconds 600 --seed 1": "a ten-minute fuzzing run",
    "python fuzz/fuzz_walk.py --seconds 600 --seed 1": "a ten-minute fuzzing run",
}

#: ```text blocks, by document and the start of their first line, and why they never run.
NEVER_RUN = {
    ("docs/architecture.md", "layers, top to bottom"): "the layers of the package drawn in text, not a command",
    ("docs/architecture.md", "cli.py                      the Typer app"): "the map of the source tree, not a command",
    ("docs/cli.md", "Error: node #1 (broadcast_to): asks for"): (
        "the error for a file that asks for 8 TiB, shown; tests/cli/test_cli_faults.py checks it word for word"
    ),
    ("benchmarks/README.md", "pip install -e '.[bench]'"): (
        "the benchmarks' commands: each installs the tools compared or times for minutes "
        "(tests/test_benchmarks_smoke.py runs the generators and run.py on a tiny graph)"
    ),
}

IMAGE_OUTPUT = re.compile(r"-o\s+\S+\.(?:svg|png|pdf)\b")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[^`\s]*)\s*$")
FILE_MARK = re.compile(r"^# (?P<name>[\w.-]+\.py)$")
QUOTE_MARK = re.compile(r"^# from (?P<path>\S+)$")
COMMENTED_PRINT = re.compile(r"^print\(.*\)  # (?P<output>.*)$")
TIMEOUT = 120


def expect(condition: object, message: str) -> None:
    """Fail the block with this message (an ``assert`` would add pytest's rewritten comparison to it)."""
    if not condition:
        raise AssertionError(message)


class Skipped(Exception):
    """A block that does not run here, with the reason."""


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # the line of the opening fence, counting from 1
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks_of(document: str) -> list[Block]:
    """The fenced code blocks of a document, in order, each with its indentation removed."""
    found: list[Block] = []
    lines = (ROOT / document).read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent = len(opening["indent"])
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        expect(end < len(lines), f"{document}:{index + 1}: a code block that is never closed")
        body = [line[indent:] for line in lines[index + 1 : end]]
        found.append(Block(document, index + 1, opening["language"], "\n".join(body) + "\n"))
        index = end + 1
    return found


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]


def environment() -> dict[str, str]:
    """This process's environment without graphsvc's settings, with its python and graphsvc first on PATH."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("GRAPHSVC_") and name not in ("COLUMNS", "LINES")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(args: list[str], directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=directory, env=environment(), capture_output=True, text=True, timeout=TIMEOUT)


def report(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}"


def check_graphviz(block: Block) -> None:
    reason = graphviz_missing() if IMAGE_OUTPUT.search(block.text) else None
    if reason is None:
        return
    if os.environ.get("GRAPHSVC_REQUIRE_GRAPHVIZ") == "1":
        pytest.fail(f"{block.id}: {reason}")
    raise Skipped(reason)


NEEDS_TORCH = re.compile(r"^\s*(?:import torch\b|from torch\b|from graphsvc\.torch\b)", re.M)
#: A file only a block that captured a PyTorch step writes: reading it needs that block to have run.
CAPTURED_FILE = re.compile(r"\bcaptured_\w+\.msgpack\b")
#: The plugin's own README: its blocks replay with it.
TORCH_PLUGIN_README = "plugins/graphsvc-torch/README.md"
#: Code that needs the graphsvc-torch plugin: it imports it, or a command names it.
NEEDS_TORCH_PLUGIN = re.compile(r"^\s*(?:import graphsvc_torch\b|from graphsvc_torch\b|\$ .*graphsvc-torch)", re.M)


def torch_files(document: str) -> dict[str, str]:
    """The files (``NAME.py``) blocks of ``document`` write that import PyTorch, and their text."""
    return {
        mark["name"]: block.text
        for block in ALL_BLOCKS
        if block.document == document and (mark := FILE_MARK.match(block.first_line)) and NEEDS_TORCH.search(block.text)
    }


def check_torch(block: Block) -> None:
    """Skip a block that needs PyTorch, or the graphsvc-torch plugin, where it is missing (fail it
    under GRAPHSVC_REQUIRE_TORCH=1, where CI has installed both)."""
    files = {name: text for name, text in torch_files(block.document).items() if name.removesuffix(".py") in block.text}
    code = block.text if not FILE_MARK.match(block.first_line) else ""
    needs = (
        bool(files)
        or (block.language == "python" and bool(NEEDS_TORCH.search(code)))
        or bool(CAPTURED_FILE.search(block.text))
    )
    plugin = block.document == TORCH_PLUGIN_README or any(
        NEEDS_TORCH_PLUGIN.search(text) for text in (code, *files.values())
    )
    reason = torch_missing() if needs else None
    if reason is None and plugin and importlib.util.find_spec("graphsvc_torch") is None:
        reason = "needs the graphsvc-torch plugin: pip install ./plugins/graphsvc-torch"
    if reason is None:
        return
    if os.environ.get(REQUIRE_TORCH) == "1":
        pytest.fail(f"{block.id}: {reason}")
    raise Skipped(reason)


# -- python ------------------------------------------------------------------------------------------


def without_bodies(statement: ast.stmt) -> str:
    """A statement's source, with the bodies of functions and classes left out."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        statement = type(statement)(**{**statement.__dict__, "body": [ast.Expr(ast.Constant(...))]})
    return ast.unparse(statement)


def check_quote(block: Block, path: str) -> None:
    source = ROOT / path
    expect(source.is_file(), f"{block.id} quotes {path}, which is not a file of the repository")
    quoted = ast.parse(block.text).body
    expect(quoted, f"{block.id} quotes nothing from {path}")
    present = {without_bodies(statement) for statement in ast.parse(source.read_text()).body}
    for statement in quoted:
        expect(without_bodies(statement) in present, f"{block.id}: not in {path}:\n{without_bodies(statement)}")


def run_python(block: Block, directory: Path) -> None:
    first = block.first_line
    if file_mark := FILE_MARK.match(first):
        compile(block.text, file_mark["name"], "exec")
        (directory / file_mark["name"]).write_text(block.text)
        return
    if quote_mark := QUOTE_MARK.match(first):
        check_quote(block, quote_mark["path"])
        return
    check_torch(block)
    result = run([sys.executable, "-c", block.text], directory)
    expect(result.returncode == 0, f"{block.id} failed: {report(result)}")
    prints = [line.strip() for line in block.text.splitlines() if line.strip().startswith("print(")]
    shown = [match["output"] for line in prints if (match := COMMENTED_PRINT.match(line))]
    if shown:
        expect(len(shown) == len(prints), f"{block.id}: some print(...) lines show their output, some do not")
        printed = [line.rstrip() for line in result.stdout.splitlines()]
        expect(printed == shown, f"{block.id} printed {printed}; its comments show {shown}")


# -- console and bash --------------------------------------------------------------------------------


@dataclass
class Command:
    text: str
    shown: list[str] = field(default_factory=list)


def console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:]))
        else:
            expect(commands, f"{block.id}: a console block starts with `$ COMMAND`, not with {line!r}")
            commands[-1].shown.append(line.rstrip())
    expect(commands, f"{block.id}: a console block with no `$ COMMAND` line")
    return commands


def run_console(block: Block, directory: Path) -> None:
    check_graphviz(block)
    check_torch(block)
    commands = [command for command in console_commands(block) if command.text not in SKIPPED_COMMANDS]
    if not commands:
        raise Skipped("; ".join(SKIPPED_COMMANDS[command.text] for command in console_commands(block)))
    output = directory / ".console"
    output.mkdir(exist_ok=True)
    script = []
    for number, command in enumerate(commands):
        # The command's exit code is kept for a following `echo $?`, and recorded for the checks below.
        script.append(
            f"{{ {command.text}\n}} > .console/{number}.out\nstatus=$?\necho $status > .console/{number}.rc\n"
        )
        script.append("(exit $status)\n")
    result = run(["bash", "-c", "".join(script)], directory)
    for number, command in enumerate(commands):
        expect((output / f"{number}.rc").exists(), f"{block.id}: `{command.text}` did not run: {report(result)}")
        status = int((output / f"{number}.rc").read_text())
        printed = [line.rstrip() for line in (output / f"{number}.out").read_text().splitlines()]
        follows = commands[number + 1].text if number + 1 < len(commands) else None
        expect(
            status == 0 or follows == "echo $?",
            f"{block.id}: `{command.text}` exited {status} and no `$ echo $?` shows it; stderr:\n{result.stderr}",
        )
        expect(
            printed == command.shown,
            f"{block.id}: `{command.text}` printed other lines:\n" + "\n".join(printed) + f"\nstderr:\n{result.stderr}",
        )
    shutil.rmtree(output)


def bash_script(block: Block) -> tuple[str, list[str]]:
    """The block without its skipped commands, and the reasons they are skipped."""
    lines, reasons = [], []
    for line in block.text.splitlines():
        parts = [part.strip() for part in line.split(" && ")]
        kept = [part for part in parts if part not in SKIPPED_COMMANDS]
        reasons += [f"{part}: {SKIPPED_COMMANDS[part]}" for part in parts if part in SKIPPED_COMMANDS]
        if kept:
            lines.append(" && ".join(kept))
    return "\n".join(lines), reasons


def run_bash(block: Block, directory: Path) -> None:
    check_graphviz(block)
    check_torch(block)
    script, reasons = bash_script(block)
    if not script.strip():
        raise Skipped("; ".join(reasons))
    result = run(["bash", "-euo", "pipefail", "-c", script], directory)
    expect(result.returncode == 0, f"{block.id} failed: {report(result)}")


# -- toml and text -----------------------------------------------------------------------------------


def is_part(part: Any, whole: Any) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(key in whole and is_part(part[key], whole[key]) for key in part)
    return bool(part == whole)


def run_toml(block: Block, directory: Path) -> None:
    quote_mark = QUOTE_MARK.match(block.first_line)
    if quote_mark is None:
        raise AssertionError(f"{block.id}: a toml block starts with `# from PATH`")
    path = quote_mark["path"]
    expect((ROOT / path).is_file(), f"{block.id} quotes {path}, which is not a file of the repository")
    expect(is_part(tomllib.loads(block.text), tomllib.loads((ROOT / path).read_text())), f"{block.id}: not in {path}")


def never_run_reason(block: Block) -> str | None:
    for (document, start), reason in NEVER_RUN.items():
        if block.document == document and block.first_line.startswith(start):
            return reason
    return None


def run_text(block: Block, directory: Path) -> None:
    reason = never_run_reason(block)
    if reason is None:
        raise AssertionError(f"{block.id}: a ```text block that NEVER_RUN does not list")
    raise Skipped(reason)


RUNNERS = {"python": run_python, "console": run_console, "bash": run_bash, "toml": run_toml, "text": run_text}


# -- the tests ---------------------------------------------------------------------------------------


@dataclass
class DocumentRun:
    """One document's directory, and what each of its blocks did there (run in order, each at most once)."""

    directory: Path
    blocks: list[Block]
    outcomes: dict[int, BaseException | None] = field(default_factory=dict)

    def outcome(self, index: int) -> BaseException | None:
        for earlier in range(index + 1):
            if earlier not in self.outcomes:
                self.outcomes[earlier] = self._run(self.blocks[earlier])
        return self.outcomes[index]

    def _run(self, block: Block) -> BaseException | None:
        runner = RUNNERS.get(block.language)
        try:
            if runner is None:
                raise AssertionError(
                    f"{block.id}: a ```{block.language} block, which tests/test_docs.py does not know how to run"
                )
            runner(block, self.directory)
        except (AssertionError, Skipped, pytest.fail.Exception, subprocess.TimeoutExpired) as problem:
            return problem
        return None


@pytest.fixture(scope="module")
def document_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DocumentRun]:
    runs = {}
    for document in DOCUMENTS:
        directory = tmp_path_factory.mktemp(Path(document).stem)
        for name in COPIED.get(document, ()):
            shutil.copytree(ROOT / name, directory / name)
        runs[document] = DocumentRun(directory, [block for block in ALL_BLOCKS if block.document == document])
    return runs


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_block_runs_as_written(block: Block, document_runs: dict[str, DocumentRun]) -> None:
    run = document_runs[block.document]
    index = run.blocks.index(block)
    problem = run.outcome(index)
    if isinstance(problem, Skipped):
        pytest.skip(str(problem))
    if problem is not None:
        failed_before = [
            earlier.id
            for number, earlier in enumerate(run.blocks[:index])
            if run.outcomes[number] is not None and not isinstance(run.outcomes[number], Skipped)
        ]
        note = f"\n(earlier blocks of {block.document} failed: {', '.join(failed_before)})" if failed_before else ""
        pytest.fail(f"{problem}{note}", pytrace=False)


def test_the_documents_have_blocks_of_every_kind() -> None:
    languages = {block.language for block in ALL_BLOCKS}
    assert languages == {"python", "console", "bash", "toml", "text"}


def test_every_exception_is_still_in_the_documents() -> None:
    commands = set()
    for block in ALL_BLOCKS:
        if block.language == "console":
            commands |= {command.text for command in console_commands(block)}
        if block.language == "bash":
            commands |= {part.strip() for line in block.text.splitlines() for part in line.split(" && ")}
    assert set(SKIPPED_COMMANDS) <= commands, set(SKIPPED_COMMANDS) - commands
    for document, start in NEVER_RUN:
        assert any(
            block.language == "text" and block.document == document and block.first_line.startswith(start)
            for block in ALL_BLOCKS
        ), f"NEVER_RUN lists a ```text block of {document} starting {start!r} that is not there"


def test_a_block_in_another_language_fails(tmp_path: Path) -> None:
    block = Block("README.md", 1, "sh", "echo hello\n")
    problem = DocumentRun(tmp_path, [block]).outcome(0)
    assert (
        str(problem).splitlines()[0] == "README.md:1: a ```sh block, which tests/test_docs.py does not know how to run"
    )


def test_a_console_block_compares_exact_stdout(tmp_path: Path) -> None:
    block = Block("doc.md", 3, "console", "$ echo one\none\n$ echo two; false\ntwo\n$ echo $?\n1\n")
    assert DocumentRun(tmp_path, [block]).outcome(0) is None
    wrong = Block("doc.md", 3, "console", "$ echo one\none \n$ printf 'two\\n'\n2\n")
    problem = DocumentRun(tmp_path, [wrong]).outcome(0)
    assert str(problem).startswith("doc.md:3: `printf 'two\\n'` printed other lines")
    unshown = Block("doc.md", 3, "console", "$ false\n")
    problem = DocumentRun(tmp_path, [unshown]).outcome(0)
    assert str(problem).startswith("doc.md:3: `false` exited 1 and no `$ echo $?` shows it")


def test_a_python_block_checks_the_output_its_comments_show(tmp_path: Path) -> None:
    good = Block("doc.md", 5, "python", "print(0.1 + 0.2)  # 0.30000000000000004\nprint('a', 1)  # a 1\n")
    assert DocumentRun(tmp_path, [good]).outcome(0) is None
    wrong = Block("doc.md", 5, "python", "print(0.1 + 0.2)  # 0.3\n")
    problem = DocumentRun(tmp_path, [wrong]).outcome(0)
    assert str(problem).splitlines()[0] == "doc.md:5 printed ['0.30000000000000004']; its comments show ['0.3']"


def test_a_block_that_shows_a_file_writes_it(tmp_path: Path) -> None:
    shown = Block("doc.md", 7, "python", "# my_ops.py\nCUBE = 3\n")
    used = Block("doc.md", 9, "python", "from my_ops import CUBE\n\nprint(CUBE)  # 3\n")
    run = DocumentRun(tmp_path, [shown, used])
    assert run.outcome(1) is None
    assert (tmp_path / "my_ops.py").read_text() == "# my_ops.py\nCUBE = 3\n"


def test_a_quote_must_match_the_file_it_names(tmp_path: Path) -> None:
    quote = (
        "# from graphsvc/hookspecs.py\n"
        "@hookspec\n"
        "def graphsvc_register_ops(register: Callable[[Op], None]) -> None: ...\n"
    )
    assert DocumentRun(tmp_path, [Block("doc.md", 1, "python", quote)]).outcome(0) is None
    changed = quote.replace("register: Callable", "registry: Callable")
    problem = DocumentRun(tmp_path, [Block("doc.md", 1, "python", changed)]).outcome(0)
    assert str(problem).splitlines()[0] == "doc.md:1: not in graphsvc/hookspecs.py:"
    toml = "# from plugins/graphsvc-binary/pyproject.toml\n[project]\nname = 'graphsvc-activations'\n"
    problem = DocumentRun(tmp_path, [Block("doc.md", 1, "toml", toml)]).outcome(0)
    assert str(problem).splitlines()[0] == "doc.md:1: not in plugins/graphsvc-binary/pyproject.toml"


def test_a_bash_block_runs_without_its_skipped_commands(tmp_path: Path) -> None:
    block = Block("doc.md", 2, "bash", "pip install . && echo ran > ran.txt\n")
    assert bash_script(block) == ("echo ran > ran.txt", [f"pip install .: {SKIPPED_COMMANDS['pip install .']}"])
    assert DocumentRun(tmp_path, [block]).outcome(0) is None
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    failing = Block("doc.md", 2, "bash", "false | cat\necho not reached\n")
    assert str(DocumentRun(tmp_path, [failing]).outcome(0)).startswith("doc.md:2 failed: exit code 1")


def test_an_image_needs_graphviz_or_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = Block("doc.md", 4, "bash", "graphsvc render g.msgpack -o g.svg\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("GRAPHSVC_REQUIRE_GRAPHVIZ", raising=False)
    problem = DocumentRun(tmp_path, [block]).outcome(0)
    assert isinstance(problem, Skipped)
    missing = (
        "this test draws with Graphviz and needs Graphviz's `dot` program, which is not on PATH "
        "(`apt-get install graphviz` on Debian and Ubuntu, `brew install graphviz` on macOS)"
    )
    assert str(problem) == missing
    monkeypatch.setenv("GRAPHSVC_REQUIRE_GRAPHVIZ", "1")
    problem = DocumentRun(tmp_path, [block]).outcome(0)
    assert str(problem) == f"doc.md:4: {missing}"


def test_a_block_that_needs_pytorch_skips_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "torch_missing", lambda: "needs PyTorch: pip install torch==2.13.0")
    monkeypatch.delenv(REQUIRE_TORCH, raising=False)
    for block in (
        Block("doc.md", 1, "python", "import torch\nprint(1)  # 2\n"),
        Block("doc.md", 1, "python", "x = 1\nfrom graphsvc.torch import capture\n"),
        Block("doc.md", 1, "console", "$ graphsvc order captured_step.msgpack\nnothing\n"),
    ):
        problem = DocumentRun(tmp_path, [block]).outcome(0)
        assert isinstance(problem, Skipped) and str(problem) == "needs PyTorch: pip install torch==2.13.0"
    plain = Block("doc.md", 1, "python", "print('torch')  # torch\n")
    assert DocumentRun(tmp_path, [plain]).outcome(0) is None
