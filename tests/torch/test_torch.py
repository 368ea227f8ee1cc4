"""graphsvc.torch: importing the package costs no torch import."""

from __future__ import annotations

import subprocess
import sys

import graphsvc.torch  # noqa: F401


def test_importing_graphsvc_torch_does_not_import_torch() -> None:
    code = "import sys, graphsvc.torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"
