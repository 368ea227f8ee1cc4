"""benchmarks/op_calls.py: the benchmark's "op calls alone" makes graphsvc's op calls in a plain
loop, so its loss and gradients are graphsvc.backward's, bit for bit (the same calls, in the same
order, summed in the same order)."""

from __future__ import annotations

import numpy as np
import pytest

import graphsvc
from benchmarks.op_calls import op_calls_alone
from benchmarks.tensor_models import MODELS
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

SMALL = {
    "mlp": {"batch": 4, "sizes": (12, 16, 16, 5)},
    "cnn": {"batch": 4, "image": 8, "channels": (3, 4), "classes": 5},
    "transformer": {"batch": 2, "seq": 6, "d_model": 16, "heads": 4, "hidden": 24, "classes": 5},
}


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_op_calls_alone_give_graphsvcs_loss_and_gradients_bit_for_bit(name: str, dtype: type) -> None:
    if name == "cnn":
        pytest.importorskip("graphsvc_conv", reason="pip install ./plugins/graphsvc-conv")
        registry, problems = load_registry(["graphsvc_conv"])
    else:
        registry, problems = load_registry(disable_third_party=True)
    assert not problems
    model = MODELS[name](dtype, 5, **SMALL[name])
    graph = model.graph
    loss = graph.node_id("loss")
    step = op_calls_alone(graph, replay.resolve_ops(graph, registry), loss, list(model.params))
    expected = graphsvc.backward(graph, output="loss", registry=registry)
    for _ in range(2):  # a second pass starts afresh
        value, grads = step()
        assert np.asarray(value).tobytes() == np.asarray(expected.value("loss")).tobytes()
        assert set(grads) == set(model.params)
        for key, grad in grads.items():
            want = np.asarray(expected.grad(key))
            assert grad.dtype == want.dtype and grad.shape == want.shape and grad.tobytes() == want.tobytes(), key
