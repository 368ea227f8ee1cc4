"""graphsvc.torch.capturing: one PyTorch step captured, saved, loaded and replayed by ``graphsvc
backward --check``; the gradients in the file are PyTorch's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.graph import Graph
from tests.conftest import run_cli

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install torch==2.13.0")
nn = torch.nn
F = torch.nn.functional

from graphsvc.torch.capturing import capture  # noqa: E402  (after the skip: it needs torch)

#: --check's tolerances for each dtype: float64 to 1e-10, float32 to 1e-4.
TOLERANCE = {torch.float64: ("--rtol", "1e-10", "--atol", "1e-12"), torch.float32: ("--rtol", "1e-4", "--atol", "1e-6")}


def listing(graph: Graph) -> list[str]:
    """Each node as ``name op parents attrs``."""
    rows = []
    for node in range(graph.num_nodes):
        parents = ",".join(graph.label(p) for p in graph.parents(node))
        attrs = graph.attrs.get(node)
        rows.append(f"{graph.label(node)} {graph.op(node)} {parents}" + (f" {attrs}" if attrs else ""))
    return rows


def replayed(graph: Graph, tmp_path: Path, dtype: Any, *extra: str, env: dict[str, str] | None = None) -> str:
    """``graphsvc backward FILE --check`` on the graph saved and its exit code 0: what it printed."""
    path = tmp_path / "step.msgpack"
    graphsvc.save(graph, path)
    code, out, err = run_cli("backward", str(path), "--check", *TOLERANCE[dtype], *extra, env=env)
    assert (code, err) == (0, ""), out
    checks = [line for line in out.splitlines() if line.startswith("check ")]
    assert len(checks) == 2 and all(line.endswith(": ok") for line in checks), checks
    return out


def assert_parameter_grads(graph: Graph, model: Any) -> None:
    """Every parameter's gradient in the graph is p.grad, to the bit."""
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        stored = graph.grad(name)
        assert stored.dtype == p.grad.numpy().dtype, name
        assert np.array_equal(stored, p.grad.numpy()), name


def mlp_step(dtype: Any) -> tuple[Any, Graph, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)).to(dtype)
    x, y = torch.randn(5, 4, dtype=dtype), torch.tensor([0, 2, 1, 1, 0])
    with capture(model) as run:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    return model, run.graph(), loss


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_mlp_with_inplace_relu_replays_to_pytorchs_values_and_gradients(dtype: Any, tmp_path: Path) -> None:
    model, graph, loss = mlp_step(dtype)
    assert listing(graph) == [
        "0.weight leaf ",
        "0.t transpose 0.weight",
        "0.bias leaf ",
        "input0 leaf ",
        "0.addmm.mm matmul input0,0.t",
        "0.addmm add 0.bias,0.addmm.mm",
        "1.relu relu 0.addmm",
        "2.weight leaf ",
        "2.t transpose 2.weight",
        "2.bias leaf ",
        "2.addmm.mm matmul 1.relu,2.t",
        "2.addmm add 2.bias,2.addmm.mm",
        "log_softmax log_softmax 2.addmm {'axis': 1}",
        "input1 leaf ",
        "nll_loss_forward nll_loss log_softmax,input1 {'reduction': 'mean', 'ignore_index': -100}",
    ]
    assert graph.outputs == [14]
    assert graph.value("nll_loss_forward") == loss.item()
    assert graph.value("input1").dtype == np.int64
    assert graph.metadata == {"captured": {"torch": torch.__version__, "model": "Sequential", "parameters": 67}}
    assert_parameter_grads(graph, model)
    # the in-place ReLU: the linear layer's output keeps its value before the ReLU
    assert graph.value("0.addmm").min() < 0 <= graph.value("1.relu").min()
    replayed(graph, tmp_path, dtype)
