"""graphsvc.torch: importing the package costs no torch import; capture() comes on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import graphsvc.torch
from tests.conftest import needs_torch


def test_importing_graphsvc_torch_does_not_import_torch() -> None:
    code = "import sys, graphsvc.torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"


def test_capture_is_the_capturing_modules_and_other_names_are_not_there() -> None:
    needs_torch()
    from graphsvc.torch import capturing

    assert graphsvc.torch.capture is capturing.capture
    assert graphsvc.torch.CaptureError is capturing.CaptureError
    with pytest.raises(AttributeError, match=r"^module 'graphsvc.torch' has no attribute 'nope'$"):
        graphsvc.torch.nope  # noqa: B018


def test_a_capture_without_pytorch_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch fails as where it is not installed
        "from graphsvc.torch import capture\n"
        "try:\n"
        "    with capture():\n"
        "        pass\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc, exc.exit_code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == (
        "CaptureError capture records PyTorch steps and PyTorch is not installed: "
        'pip install ".[torch]" in graphsvc\'s checkout (or pip install torch) 2\n'
    )
