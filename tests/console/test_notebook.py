"""graphsvc.console.notebook: a Drawing shows as SVG in Jupyter, and says why where it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

import graphsvc
from graphsvc.console.notebook import drawing
from graphsvc.errors import RenderError, UsageError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_without_graphviz_the_cell_shows_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    picture = drawing(graphsvc.load(EXAMPLES / "seed004.msgpack"))
    assert picture._repr_svg_() is None  # Jupyter falls back to the text form
    assert repr(picture).startswith("<Drawing of 7 nodes: no picture, drawing .svg needs the Graphviz `dot` program")
    with pytest.raises(RenderError):
        _ = picture.svg


def test_save_by_suffix(tmp_path: Path) -> None:
    picture = drawing(graphsvc.load(EXAMPLES / "seed004.msgpack"), around="L", depth=1)
    assert picture.nodes == [4, 5, 6]
    assert picture.save(tmp_path / "L.dot").read_text(encoding="utf-8") == picture.dot
    with pytest.raises(UsageError, match=r"must end in .svg, .png, .pdf or .dot$"):
        picture.save(tmp_path / "L.jpg")
    assert not (tmp_path / "L.jpg").exists()
