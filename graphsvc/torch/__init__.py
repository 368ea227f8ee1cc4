"""Capturing PyTorch runs into graphsvc graphs (``from graphsvc.torch import capture``).

Importing this package does not import torch: the plugin that replays PyTorch's operators reads
:mod:`graphsvc.torch.calls` without it; :func:`capture` imports torch when it is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Capture", "CaptureError", "capture"]


def __getattr__(name: str) -> Any:
    """``capture``, ``Capture`` and ``CaptureError``, from :mod:`graphsvc.torch.capturing` on first use."""
    if name in __all__:
        import graphsvc.torch.capturing as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
