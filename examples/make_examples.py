"""Build the example graphs shipped in examples/ (run from the repository root).

    python examples/make_examples.py

Each graph is built by hand with GraphBuilder, then replayed forward and backward so the files carry
values and gradients.
"""

from __future__ import annotations

from pathlib import Path

from graphsvc.format import save
from graphsvc.graph import Graph, GraphBuilder, OpSource
from graphsvc.ops import OpRegistry
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay

HERE = Path(__file__).resolve().parent


def seed000() -> Graph:
    """Seed 000's chain: z -> t1 -> t2 -> t3 <- 1, t3 -> y. Reverse order: y t3 t2 t1 z 1."""
    b = GraphBuilder()
    z = b.leaf(0.5, name="z")
    t1 = b.add("sin", [z], name="t1")
    t2 = b.add("exp", [t1], name="t2")
    one = b.const(1.0, name="1")
    t3 = b.add("add", [one, t2], name="t3")
    b.add("log", [t3], name="y")
    return b.build(metadata={"source": "seed 000", "expression": "y = log(1 + exp(sin(z)))"})


def seed002() -> Graph:
    """Seed 002: f(x) = sqrt(x^2 + exp(x^2)) + cos(x^2 + exp(x^2)) at x = 0.5."""
    b = GraphBuilder()
    x = b.leaf(0.5, name="x")
    a = b.add("pow", [x], name="a", attrs={"exponent": 2.0})
    e = b.add("exp", [a], name="b")
    c = b.add("add", [a, e], name="c")
    d = b.add("sqrt", [c], name="d")
    cc = b.add("cos", [c], name="e")
    b.add("add", [d, cc], name="f")
    return b.build(metadata={"source": "seed 002", "expression": "f(x) = sqrt(x^2 + exp(x^2)) + cos(x^2 + exp(x^2))"})


def seed004() -> Graph:
    """Seed 004: L = (a*b + c)*(a + b) at a=2, b=3, c=1: dL/da = 22, dL/db = 17, dL/dc = 5."""
    b = GraphBuilder()
    a = b.leaf(2.0, name="a")
    bb = b.leaf(3.0, name="b")
    c = b.leaf(1.0, name="c")
    ab = b.add("mul", [a, bb], name="ab")
    abc = b.add("add", [ab, c], name="abc")
    apb = b.add("add", [a, bb], name="apb")
    b.add("mul", [abc, apb], name="L")
    return b.build(metadata={"source": "seed 004", "expression": "L = (a*b + c)*(a + b)"})


def square() -> Graph:
    """x*x: one node with the same parent twice. d(x*x)/dx = 2x = 6 at x = 3."""
    b = GraphBuilder()
    x = b.leaf(3.0, name="x")
    b.add("mul", [x, x], name="y")
    return b.build(metadata={"expression": "y = x*x"})


def max_gate() -> Graph:
    """Seed 002's max gate routes the gradient to the larger input: z = max(x, y) * w."""
    b = GraphBuilder()
    x = b.leaf(4.0, name="x")
    y = b.leaf(-1.0, name="y")
    w = b.leaf(2.0, name="w")
    m = b.add("max", [x, y], name="m")
    b.add("mul", [m, w], name="z")
    return b.build(metadata={"expression": "z = max(x, y) * w"})


EXAMPLES = {"seed000": seed000, "seed002": seed002, "seed004": seed004, "square": square, "max_gate": max_gate}


def replayed(graph: Graph, registry: OpRegistry) -> Graph:
    """The graph with values and gradients (of its single output) filled in by replay."""
    graph.values = replay.forward(graph, registry)
    graph.grads = replay.backward(graph, registry, replay.default_output(graph), graph.values)
    for tag in graph.op_table:
        op = registry.get(tag) if tag in registry else None
        graph.op_sources[tag] = OpSource(op.plugin, op.plugin_version) if op else OpSource("graphsvc", None)
    return graph


def main() -> None:
    registry, _ = load_registry(disable_third_party=True)
    for name, make in EXAMPLES.items():
        graph = replayed(make(), registry)
        save(graph, HERE / f"{name}.msgpack")
        print(f"wrote examples/{name}.msgpack ({graph.num_nodes} nodes)")


if __name__ == "__main__":
    main()
