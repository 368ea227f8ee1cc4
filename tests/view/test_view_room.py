"""graphsvc.view: importing the room imports nothing heavy (the CLI imports it before it knows the command)."""

from __future__ import annotations

import subprocess
import sys

import graphsvc.view


def test_importing_the_room_imports_neither_numpy_nor_torch_nor_the_model() -> None:
    assert graphsvc.view.__name__ == "graphsvc.view"
    heavy = "('numpy', 'torch', 'graphsvc.view.model')"
    code = f"import sys, graphsvc.view; print(sorted(m for m in {heavy} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"
