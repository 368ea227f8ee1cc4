"""The invalid-file corpus, schemas/examples/invalid/ (FORMAT.md §17): each file gets exactly its
expected error through ``graphsvc.load``, with and without the C extensions; the script that makes
it gives the same bytes again; every numbered rule of FORMAT.md has a file or a reason why not."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import graphsvc
from graphsvc.errors import FormatError
from graphsvc.format import document, fastload
from tests.conftest import GOLDEN_DIR, ROOT, import_script

INVALID = GOLDEN_DIR / "invalid"
MANIFEST: dict[str, Any] = json.loads((INVALID / "expected.json").read_text(encoding="utf-8"))
FILES: list[dict[str, Any]] = MANIFEST["files"]


def make_invalid() -> Any:
    return import_script(GOLDEN_DIR / "make_invalid.py")


@pytest.fixture(params=["C", "Python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The C table check and header walk where they are built, then neither (the Python path)."""
    if request.param == "Python":
        monkeypatch.setattr(document, "_ctable", None)
        monkeypatch.setattr(fastload, "_ctable", None)
    yield request.param


@pytest.mark.parametrize("case", FILES, ids=[case["file"] for case in FILES])
def test_each_file_gets_exactly_its_error(case: dict[str, Any], reader: str) -> None:
    path = INVALID / case["file"]
    with pytest.raises(FormatError) as info:
        graphsvc.load(path)
    assert str(info.value) == f"{path}: {case['error']}"  # load names the file
    with pytest.raises(FormatError) as from_bytes:
        graphsvc.loads(path.read_bytes())
    assert str(from_bytes.value) == case["error"]


@pytest.mark.parametrize("case", FILES[::10], ids=[case["file"] for case in FILES[::10]])
def test_a_mapped_load_gets_the_same_error(case: dict[str, Any]) -> None:
    path = INVALID / case["file"]
    with pytest.raises(FormatError) as info:
        graphsvc.load(path, mmap=True)
    assert str(info.value) == f"{path}: {case['error']}"


def test_the_script_makes_the_same_bytes() -> None:
    made = make_invalid().corpus()
    on_disk = {path.name: path.read_bytes() for path in INVALID.iterdir()}
    assert sorted(made) == sorted(on_disk)
    for name, data in made.items():
        assert data == on_disk[name], f"{name} differs: run python schemas/examples/make_invalid.py"


def test_the_manifest_lists_each_file_once() -> None:
    names = [case["file"] for case in FILES]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(path.name for path in INVALID.glob("*.msgpack"))
    for case in FILES:
        assert case["file"].split("-")[0] == case["rules"][-1], case  # named after the rule it is about
        assert case["error"] and case["what"]


def _numbered_rules(text: str, heading: str, stop: str) -> list[str]:
    """The numbers of the numbered list items between ``heading`` and the next ``stop`` line."""
    start = text.index(heading)
    end = text.index(stop, start + len(heading))
    return re.findall(r"(?m)^\s*(\d+)\. ", text[start:end])


def rules_of_format_md() -> list[str]:
    text = (ROOT / "schemas" / "FORMAT.md").read_text(encoding="utf-8")
    found = [f"2.{n}" for n in _numbered_rules(text, "- Evolution rules", "\n## ")]
    found += [f"7.{n}" for n in _numbered_rules(text, "## 7. ", "\n## ")]
    found += [f"15.3.{n}" for n in _numbered_rules(text, "### 15.3 Rules", "\n**")]
    return found


def test_every_numbered_rule_has_a_file_or_a_reason() -> None:
    rules = rules_of_format_md()
    assert rules[:5] == ["2.1", "2.2", "2.3", "2.4", "2.5"]
    assert [r for r in rules if r.startswith("7.")] == [f"7.{n}" for n in range(1, 7)]
    assert [r for r in rules if r.startswith("15.3.")] == [f"15.3.{n}" for n in range(1, 10)]
    covered = {rule for case in FILES for rule in case["rules"]}
    without = MANIFEST["rules_without_a_file"]
    for rule in rules:
        assert (rule in covered) != (rule in without), rule  # a file, or a reason: never both, never neither
    assert set(without) <= set(rules)
    assert covered - set(rules) == {"7.strings", "9"}  # the paragraphs on text and safety, not list items


def test_format_md_describes_the_corpus() -> None:
    text = (ROOT / "schemas" / "FORMAT.md").read_text(encoding="utf-8")
    assert "## 17. The invalid-file corpus" in text
    assert f"{len(FILES)} files" in text


def test_the_cli_refuses_a_corpus_file_with_exit_code_3(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

    case = next(case for case in FILES if case["file"].startswith("7.6-self-loop"))
    result = CliRunner().invoke(app, ["validate", str(INVALID / case["file"])])
    assert result.exit_code == 3
    assert f"{case['file']}: {case['error']}" in result.output
