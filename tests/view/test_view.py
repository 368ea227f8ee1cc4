"""graphsvc/view/__init__.py: the room imports nothing heavy (the CLI's start-up does not pay for it)."""

from __future__ import annotations

import subprocess
import sys

import graphsvc.view


def test_importing_the_room_imports_neither_numpy_nor_the_model() -> None:
    assert graphsvc.view.__doc__ is not None and "a view at a time" in graphsvc.view.__doc__
    code = "import sys, graphsvc.view; print('numpy' in sys.modules, 'graphsvc.view.model' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
