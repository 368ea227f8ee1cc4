"""Draw the pictures in docs/images/ (run from the repository root; needs Graphviz and micrograd 0.1.0).

    python docs/images/make_images.py

* seed004.svg: seed 004's ``L = (a*b + c)*(a + b)``, replayed, as ``graphsvc render`` draws it.
* micrograd_mlp.svg: the neighbourhood of the loss of a small micrograd MLP (``examples/micrograd_mlp.msgpack``,
  written here too, from ``micrograd.nn.MLP(3, [4, 4, 1])`` on the four samples of micrograd's demo, with the
  parameters named ``w{layer}.{neuron}.{input}`` and ``b{layer}.{neuron}``, the predictions ``ypred{i}``).
* notebook_draw.svg: what ``graphsvc.draw(L)`` shows in a notebook for seed 004 built with ``Value``.
* rooms.svg: the packages of graphsvc and their layers (docs/architecture.md), drawn from ``rooms.dot``.
"""

from __future__ import annotations

import random
from pathlib import Path

from graphsvc.console.render import draw, render
from graphsvc.format import load, save
from graphsvc.micrograd import from_micrograd
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay
from graphsvc.replay.run import backward as graphsvc_backward

ROOT = Path(__file__).resolve().parent.parent.parent
IMAGES = ROOT / "docs" / "images"


def micrograd_mlp() -> Path:
    """Train-step graph of micrograd's MLP on four samples, with its gradients; saved to examples/."""
    from micrograd.nn import MLP

    random.seed(1337)
    model = MLP(3, [4, 4, 1])
    xs = [[2.0, 3.0, -1.0], [3.0, -1.0, 0.5], [0.5, 1.0, 1.0], [1.0, 1.0, -1.0]]
    ys = [1.0, -1.0, -1.0, 1.0]
    predictions = [model(x) for x in xs]
    loss = sum((p - y) ** 2 for p, y in zip(predictions, ys, strict=True))
    loss.backward()
    names = {loss: "loss"} | {p: f"ypred{i}" for i, p in enumerate(predictions)}
    for li, layer in enumerate(model.layers):
        for ni, neuron in enumerate(layer.neurons):
            names |= {w: f"w{li}.{ni}.{k}" for k, w in enumerate(neuron.w)} | {neuron.b: f"b{li}.{ni}"}
    # micrograd sums each gradient in the order of a set, which changes from run to run (the last
    # bit of 28 gradients did); graphsvc's backward gives the same gradients in one fixed order, so
    # the example file is the same every time the script runs
    graph = from_micrograd(loss, names=names)
    graph = graphsvc_backward(graph, output="loss", registry=load_registry(disable_third_party=True)[0])
    path = ROOT / "examples" / "micrograd_mlp.msgpack"
    save(graph, path)
    return path


def rooms() -> None:
    """The picture of docs/architecture.md, drawn from the DOT text written by hand beside it."""
    (IMAGES / "rooms.svg").write_bytes(draw((IMAGES / "rooms.dot").read_text(), "svg"))


def main() -> None:
    seed004 = load(ROOT / "examples" / "seed004.msgpack")
    registry, _ = load_registry(disable_third_party=True)
    values = replay.forward(seed004, registry)
    seed004.grads = replay.backward(seed004, registry, replay.default_output(seed004), values)
    render(seed004, IMAGES / "seed004.svg")
    render(load(micrograd_mlp()), IMAGES / "micrograd_mlp.svg", around="loss", depth=3)
    notebook_draw()
    rooms()


def notebook_draw() -> None:
    """The tutorial's notebook picture: graphsvc.draw of seed 004's loss, built with Value."""
    import graphsvc
    from graphsvc import Value

    a, b, c = Value(2.0, name="a"), Value(3.0, name="b"), Value(1.0, name="c")
    loss = (a * b + c) * (a + b)
    loss.name = "L"
    loss.backward()
    graphsvc.draw(loss).save(IMAGES / "notebook_draw.svg")


if __name__ == "__main__":
    main()
