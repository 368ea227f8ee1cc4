"""Capturing PyTorch runs into graphsvc graphs (``from graphsvc.torch import capture``).

Importing this package does not import torch: the plugin that replays PyTorch's operators reads
:mod:`graphsvc.torch.calls` without it; :func:`capture` imports torch when it is called.
"""
