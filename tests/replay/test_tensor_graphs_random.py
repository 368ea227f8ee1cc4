"""Random tensor graphs, checked whole: every leaf's gradient against central differences of the
replayed loss, and (with PyTorch installed) values and gradients against PyTorch.

One op's VJP can be right on the samples of ``tests/replay/test_tensors.py`` and wrong where ops compose
(take's VJP once gave zeros to the Fortran-ordered output of a transpose). :func:`random_graph`
composes every builtin op with random attributes: negative axes, lists of axes, keepdims,
broadcasting, batched matmul, concatenate of one to four inputs, take with repeated indices,
transposed values feeding reshapes, nodes used by several consumers, const arrays among the leaves.
Values are kept where every op is smooth (no log of a value near 0, no tie of max, min or amax, no
relu or abs near 0), so a central difference measures what the VJPs must give. Putting take's old
VJP back (before b1afb22) makes the finite-difference test fail, as do a transpose VJP that does
not invert its axes, a concatenate VJP that splits along axis 0 and a softmax VJP that ignores axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.graph import Graph, GraphBuilder
from tests.conftest import builtin_registry, needs_torch

pytestmark = pytest.mark.usefixtures("no_installed_plugins")

GRAPHS = 300
MAX_NODES = 14
MARGIN = 0.02  # how far a value stays from a kink (0 for relu and abs, a tie for max, min, amax)


REGISTRY = builtin_registry()


# -- the recipe of a random graph -----------------------------------------------------------------
@dataclass
class Node:
    """One node of a random graph: ``leaf``, ``const`` or an op, with its value as the generator
    computed it (the builtin op's forward)."""

    op: str
    parents: list[int]
    attrs: dict[str, Any]
    value: np.ndarray
    scalar: bool = False  # a leaf or const given as a float (a number in the columns)

    @property
    def name(self) -> str:
        return {"leaf": "x", "const": "c"}.get(self.op, "n")


@dataclass
class Recipe:
    nodes: list[Node] = field(default_factory=list)

    def name(self, node: int) -> str:
        return "loss" if node == len(self.nodes) - 1 else f"{self.nodes[node].name}{node}"

    def leaves(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.op == "leaf"]

    def needs_grad(self) -> list[int]:
        """The nodes whose values a user may vary: leaves and scalar consts."""
        return [i for i, n in enumerate(self.nodes) if n.op == "leaf" or (n.op == "const" and n.scalar)]

    def graph(self, values: dict[int, np.ndarray] | None = None) -> Graph:
        """The graph, with the values of some leaves or consts replaced."""
        b = GraphBuilder()
        for i, node in enumerate(self.nodes):
            value = (values or {}).get(i, node.value)
            given: float | np.ndarray = float(value) if node.scalar else value
            if node.op == "leaf":
                assert b.leaf(given, name=self.name(i)) == i
            elif node.op == "const":
                assert b.const(given, name=self.name(i)) == i
            else:
                assert b.add(node.op, node.parents, attrs=node.attrs, name=self.name(i)) == i
        return b.build()

    def describe(self) -> str:
        lines = []
        for i, n in enumerate(self.nodes):
            what = f"{n.value.dtype}{list(n.value.shape)}" + (" scalar" if n.scalar else "")
            lines.append(f"{self.name(i)} = {n.op}{n.parents} {n.attrs} -> {what}")
        return "\n".join(lines)


def _forward(op: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    function = REGISTRY.get(op).forward
    assert function is not None
    with np.errstate(all="ignore"):
        return np.asarray(function(*inputs, **attrs))


# -- the generator --------------------------------------------------------------------------------
UNARY = ["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "relu", "sigmoid", "abs", "pow"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]
TENSOR = [
    "matmul", "sum", "mean", "amax", "reshape", "transpose", "broadcast_to",
    "concatenate", "take", "softmax", "log_softmax", "nll_loss",
]  # fmt: skip


class Generator:
    """Grows one random :class:`Recipe` from a seeded ``numpy`` generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.recipe = Recipe()

    # -- small choices
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options: Sequence[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def shape(self, ndim: int | None = None) -> tuple[int, ...]:
        ndim = int(self.rng.integers(1, 5)) if ndim is None else ndim
        while True:
            shape = tuple(int(s) for s in self.rng.integers(1, 5, ndim))
            if math.prod(shape) <= 24:
                return shape

    def axis(self, ndim: int) -> int:
        """An axis of ``ndim`` dimensions, negative half the time."""
        axis = int(self.rng.integers(ndim))
        return axis - ndim if self.chance(0.5) else axis

    def data(self, shape: tuple[int, ...], positive: bool = False) -> np.ndarray:
        """Values in [0.5, 2) (of either sign unless ``positive``): away from 0 and log's pole."""
        values = self.rng.uniform(0.5, 2.0, shape)
        if not positive:
            values *= self.rng.choice([-1.0, 1.0], shape)
        return values

    # -- nodes
    def push(self, node: Node) -> int:
        self.recipe.nodes.append(node)
        return len(self.recipe.nodes) - 1

    def operand(self, shape: tuple[int, ...], positive: bool = False) -> int:
        """A new input of ``shape``: a leaf (mostly), a const array, or a number (a scalar const
        or leaf in the columns) when ``shape`` is ``()``."""
        value = self.data(shape, positive)
        if shape == () and self.chance(0.6):
            return self.push(Node("const" if self.chance(0.7) else "leaf", [], {}, value, scalar=True))
        return self.push(Node("const" if self.chance(0.3) else "leaf", [], {}, value))

    def floats(self) -> list[int]:
        return [i for i, n in enumerate(self.recipe.nodes) if n.value.dtype == np.float64]

    def primary(self) -> int:
        """An input for the next op: the newest node most of the time (chains grow deep), often a
        value laid out as no fresh array is (a transpose's Fortran order, a broadcast's zero
        strides), else any float node (so nodes get several consumers)."""
        floats = self.floats()
        laid_out = [i for i in floats if not self.recipe.nodes[i].value.flags.c_contiguous]
        if laid_out and self.chance(0.4):
            return self.pick(laid_out)
        return floats[-1] if self.chance(0.6) else self.pick(floats)

    def fitting(self, accepts: Callable[[np.ndarray], bool]) -> list[int]:
        return [i for i in self.floats() if accepts(self.recipe.nodes[i].value)]

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: a suffix of it, some dimensions 1, sometimes a
        new leading dimension or a stretched 1."""
        keep = int(self.rng.integers(0, len(shape) + 1))
        out = [
            int(self.rng.integers(2, 4)) if s == 1 and self.chance(0.3) else 1 if self.chance(0.3) else s
            for s in shape[len(shape) - keep :]
        ]
        if keep == len(shape) < 4 and self.chance(0.3):
            out.insert(0, int(self.rng.integers(1, 4)))
        return tuple(out)

    # -- ops: each returns (op, parents, attrs), or None when it does not fit here
    def unary(self, op: str) -> tuple[str, list[int], dict[str, Any]] | None:
        attrs: dict[str, Any] = {}
        if op == "pow":
            attrs["exponent"] = float(self.pick([2.0, 3.0, 1.0, 0.0, -1.0, -2.0, 0.5, 1.5, -0.5, 2.5]))
        exponent = attrs.get("exponent", 1.0)
        accepts: dict[str, Callable[[np.ndarray], bool]] = {
            "log": lambda v: bool(np.all(v > 0.2)),
            "sqrt": lambda v: bool(np.all(v > 0.2)),
            "pow": lambda v: bool(np.all(v > 0.2) if exponent != int(exponent) else np.all(np.abs(v) > 0.2)),
            "relu": lambda v: bool(np.all(np.abs(v) > MARGIN)),
            "abs": lambda v: bool(np.all(np.abs(v) > MARGIN)),
            "exp": lambda v: bool(np.all(v < 4.0)),
        }
        fit = self.fitting(accepts.get(op, lambda v: True))
        if not fit or self.chance(0.15):
            return op, [self.operand(self.shape(), positive=True)], attrs
        newest = [i for i in fit if i == self.floats()[-1]]
        return op, [newest[0] if newest and self.chance(0.6) else self.pick(fit)], attrs

    def binary(self, op: str) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        shape = self.recipe.nodes[x].value.shape
        compatible = [i for i in self.floats() if _broadcasts(self.recipe.nodes[i].value.shape, shape)]
        if compatible and self.chance(0.35):
            y = self.pick(compatible)
        elif op in ("add", "sub", "mul", "div") and self.chance(0.1):  # integers (int64 data)
            y = self.push(Node("const", [], {}, self.rng.integers(1, 4, self.broadcastable(shape)).astype(np.int64)))
        else:
            y = self.operand(self.broadcastable(shape) if self.chance(0.8) else (), positive=op == "div")
        parents = [x, y] if op == "div" or self.chance(0.5) else [y, x]
        a, b = (self.recipe.nodes[p].value for p in parents)
        if op == "div" and not np.all(np.abs(b) > 0.2):
            return None
        if op in ("max", "min") and not np.all(np.abs(a - b) > MARGIN):
            return None
        return op, parents, {}

    def matmul(self) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        shape = self.recipe.nodes[x].value.shape
        if not shape:
            return None
        left = self.chance(0.5)  # x @ partner, else partner @ x
        k = shape[-1] if left else shape[-2] if len(shape) >= 2 else shape[0]
        batch = shape[:-2]
        form = self.pick(["vector", "matrix", "stack"])
        if form == "vector":
            partner: tuple[int, ...] = (k,)
        else:
            other = int(self.rng.integers(1, 5))
            partner = (k, other) if left else (other, k)
            if form == "stack":
                partner = (*self.broadcastable(batch or (int(self.rng.integers(1, 4)),)), *partner)[-4:]
        if len(shape) == 1 and len(partner) == 1 and self.chance(0.5):
            return None  # a dot product: fine, but rarer
        y = self.operand(partner)
        return "matmul", [x, y] if left else [y, x], {}

    def reduction(self, op: str) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        value = self.recipe.nodes[x].value
        attrs: dict[str, Any] = {}
        if value.ndim and self.chance(0.75):
            if self.chance(0.5):
                attrs["axis"] = self.axis(value.ndim)
            else:
                count = int(self.rng.integers(1, value.ndim + 1))
                axes = self.rng.permutation(value.ndim)[:count].tolist()
                attrs["axis"] = [a - value.ndim if self.chance(0.5) else a for a in axes]
        if self.chance(0.5):
            attrs["keepdims"] = True
        if op == "amax" and not _no_ties(value, attrs.get("axis")):
            return None
        return op, [x], attrs

    def reshape(self) -> tuple[str, list[int], dict[str, Any]] | None:
        transposed = [i for i in self.floats() if self.recipe.nodes[i].op == "transpose"]
        x = self.pick(transposed) if transposed and self.chance(0.5) else self.primary()
        size = self.recipe.nodes[x].value.size
        target = _factor(size, int(self.rng.integers(1, 5)), self.rng)
        if self.chance(0.5):
            target[int(self.rng.integers(len(target)))] = -1
        return "reshape", [x], {"shape": target}

    def transpose(self) -> tuple[str, list[int], dict[str, Any]] | None:
        wide = [i for i in self.floats() if sum(s > 1 for s in self.recipe.nodes[i].value.shape) >= 2]
        x = self.pick(wide) if wide and self.chance(0.5) else self.primary()  # a layout that changes
        ndim = self.recipe.nodes[x].value.ndim
        if ndim < 2 or self.chance(0.3):
            return "transpose", [x], {}
        axes = [a - ndim if self.chance(0.4) else a for a in self.rng.permutation(ndim).tolist()]
        return "transpose", [x], {"axes": axes}

    def broadcast_to(self) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        shape = self.recipe.nodes[x].value.shape
        target = [int(self.rng.integers(2, 4)) if s == 1 and self.chance(0.6) else s for s in shape]
        while len(target) < 4 and self.chance(0.4):
            target.insert(0, int(self.rng.integers(1, 4)))
        if math.prod(target) > 48:
            return None
        return "broadcast_to", [x], {"shape": target}

    def concatenate(self) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        shape = self.recipe.nodes[x].value.shape
        if not shape:
            return None
        axis = self.axis(len(shape))
        parents = [x]
        for _ in range(int(self.rng.integers(0, 4))):
            if self.chance(0.25):
                parents.append(self.pick(parents))  # the same node twice
                continue
            other = list(shape)
            other[axis] = int(self.rng.integers(1, 4))
            parents.append(self.operand(tuple(other)))
        order = self.rng.permutation(len(parents)).tolist()
        return "concatenate", [parents[i] for i in order], {"axis": axis}

    def nll_loss(self) -> tuple[str, list[int], dict[str, Any]] | None:
        """PyTorch's layouts: classes along axis 0 of one row, else axis 1; targets of the other
        axes, some of them ignored (the default -100 or an index of the attribute's)."""
        x = self.primary()
        shape = self.recipe.nodes[x].value.shape
        if not shape:
            return None
        axis = 0 if len(shape) == 1 else 1
        target = self.rng.integers(0, shape[axis], shape[:axis] + shape[axis + 1 :])
        attrs: dict[str, Any] = {"reduction": self.pick(["mean", "sum", "none"])}
        if target.size and self.chance(0.4):
            ignored = -100 if self.chance(0.5) else int(self.rng.integers(-3, 9))
            if ignored != -100:
                attrs["ignore_index"] = ignored
            target.reshape(-1)[0] = ignored
        if attrs["reduction"] == "mean" and target.size and np.all(target == attrs.get("ignore_index", -100)):
            return None  # every target ignored: the mean of none, nan
        targets = self.push(Node("const", [], {}, target.astype(np.int64)))
        return "nll_loss", [x, targets], attrs

    def take(self) -> tuple[str, list[int], dict[str, Any]] | None:
        fortran = [i for i in self.floats() if not self.recipe.nodes[i].value.flags.c_contiguous]
        x = self.pick(fortran) if fortran and self.chance(0.5) else self.primary()  # b1afb22's case
        value = self.recipe.nodes[x].value
        attrs: dict[str, Any] = {}
        if value.ndim and self.chance(0.5):
            attrs["axis"] = self.axis(value.ndim)
            length = value.shape[attrs["axis"]]
        else:
            length = value.size
        shape = self.shape(int(self.rng.integers(0, 3)))
        indices = self.push(Node("const", [], {}, self.rng.integers(0, length, shape).astype(np.int64)))
        if len(shape) == 2 and self.chance(0.3):  # indices computed too: an int64 node, transposed
            indices = self.push(Node("transpose", [indices], {}, self.recipe.nodes[indices].value.T))
        return "take", [x, indices], attrs

    def softmax(self, op: str) -> tuple[str, list[int], dict[str, Any]] | None:
        x = self.primary()
        ndim = self.recipe.nodes[x].value.ndim
        if not ndim:
            return None
        return op, [x], {} if self.chance(0.3) else {"axis": self.axis(ndim)}

    def step(self) -> None:
        """Add one op node (and the new inputs it needs), or nothing when the choice does not fit."""
        op = self.pick(UNARY + BINARY + TENSOR + TENSOR + ["transpose"] * 4 + ["take"] * 2)
        mark = len(self.recipe.nodes)
        if op in UNARY:
            call = self.unary(op)
        elif op in BINARY:
            call = self.binary(op)
        elif op in ("sum", "mean", "amax"):
            call = self.reduction(op)
        elif op in ("softmax", "log_softmax"):
            call = self.softmax(op)
        else:
            call = getattr(self, op)()
        if call is not None:
            name, parents, attrs = call
            value = _forward(name, [self.recipe.nodes[p].value for p in parents], attrs)
            if np.all(np.isfinite(value)) and np.max(np.abs(value), initial=0.0) < 100.0 and value.size <= 64:
                self.push(Node(name, parents, attrs, value))
                return
        del self.recipe.nodes[mark:]  # the new inputs of a call that did not fit

    def loss(self) -> None:
        """Reduce the newest node to a scalar, sometimes times a number."""
        x = self.floats()[-1]
        total = self.push(self.reduced("sum" if self.chance(0.5) else "mean", x))
        if self.chance(0.3):
            scale = self.operand((), positive=True)
            self.push(Node("mul", [total, scale], {}, self.recipe.nodes[total].value * self.recipe.nodes[scale].value))

    def reduced(self, op: str, x: int) -> Node:
        value = _forward(op, [self.recipe.nodes[x].value], {})
        return Node(op, [x], {}, value)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _no_ties(value: np.ndarray, axis: int | list[int] | None) -> bool:
    """Whether the largest element of each group ``amax`` reduces is ahead of the next by MARGIN."""
    axes = tuple(range(value.ndim)) if axis is None else tuple(np.atleast_1d(axis) % max(value.ndim, 1))
    moved = np.moveaxis(value, axes, tuple(range(-len(axes), 0))) if value.ndim else value
    groups = moved.reshape(-1, math.prod(value.shape[a] for a in axes) if value.ndim else 1)
    if groups.shape[1] < 2:
        return True
    top = np.sort(groups, axis=1)
    return bool(np.all(top[:, -1] - top[:, -2] > MARGIN))


def _factor(size: int, ndim: int, rng: np.random.Generator) -> list[int]:
    """A shape of ``ndim`` dimensions (or fewer) holding ``size`` elements."""
    shape = []
    for _ in range(ndim - 1):
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        d = divisors[int(rng.integers(len(divisors)))]
        shape.append(d)
        size //= d
    return [*shape, size]


@functools.cache
def random_graph(seed: int) -> Recipe:
    """A random graph of 2 to 14 nodes whose last node, ``loss``, is a scalar (made once per seed:
    the tests below share them)."""
    generator = Generator(np.random.default_rng(seed))
    generator.operand(generator.shape())
    target = int(generator.rng.integers(2, MAX_NODES + 1))
    for _ in range(100):
        if len(generator.recipe.nodes) >= target - 1:
            break
        generator.step()
    generator.loss()
    return generator.recipe


# -- the checks -----------------------------------------------------------------------------------
def numeric_gradient(recipe: Recipe, graph: Graph, node: int) -> np.ndarray:
    """d loss / d node by central differences of the replayed loss, one element at a time: a leaf
    set by ``graphsvc.forward``, a const (which cannot be set) by rebuilding the graph."""
    x = recipe.nodes[node].value
    grad = np.zeros_like(x)
    for position in np.ndindex(x.shape):
        step = 1e-6 * max(1.0, abs(float(x[position])))
        losses = []
        for sign in (1.0, -1.0):
            shifted = x.copy()
            shifted[position] += sign * step
            if recipe.nodes[node].op == "leaf":
                given: float | np.ndarray = float(shifted) if recipe.nodes[node].scalar else shifted
                replayed = graphsvc.forward(graph, set={node: given}, registry=REGISTRY)
            else:
                replayed = graphsvc.forward(recipe.graph({node: shifted}), registry=REGISTRY)
            losses.append(float(replayed.value("loss")))
        grad[position] = (losses[0] - losses[1]) / (2 * step)
    return grad


def check_against_finite_differences(recipe: Recipe) -> None:
    built = recipe.graph()
    graph = graphsvc.backward(built, output="loss", registry=REGISTRY)
    context = recipe.describe()
    varied = recipe.needs_grad()
    requires: list[bool] = []
    for i, node in enumerate(recipe.nodes):
        grad = graph.grad(recipe.name(i))
        computed = node.op not in ("leaf", "const") and any(requires[p] for p in node.parents)
        requires.append(node.value.dtype == np.float64 and (i in varied or computed))
        if not requires[i]:  # const arrays, int64 nodes, what is computed from them alone
            assert isinstance(grad, float) and math.isnan(grad), f"{recipe.name(i)}\n{context}"
            continue
        array = np.asarray(grad)
        assert array.shape == node.value.shape and array.dtype == node.value.dtype, f"{recipe.name(i)}\n{context}"
        if i in varied:
            assert isinstance(grad, float) if node.scalar else isinstance(grad, np.ndarray), context
            numeric = numeric_gradient(recipe, built, i)
            assert np.allclose(array, numeric, rtol=1e-5, atol=1e-7), f"{recipe.name(i)}\n{context}"


@pytest.mark.parametrize("first", range(0, GRAPHS, 50))
def test_random_graphs_match_finite_differences(first: int) -> None:
    for seed in range(first, first + 50):
        check_against_finite_differences(random_graph(seed))


def test_the_random_graphs_use_every_builtin_op_and_attribute_form() -> None:
    """What the generator makes, so that a change to it cannot quietly narrow the check."""
    seen: set[str] = set()
    node_counts: set[int] = set()
    for seed in range(GRAPHS):
        recipe = random_graph(seed)
        node_counts.add(len(recipe.nodes))
        for node in recipe.nodes:
            seen.add(node.op)
            axis = node.attrs.get("axis")
            if isinstance(axis, list):
                seen.add(f"{node.op}:axes")
            elif isinstance(axis, int) and axis < 0:
                seen.add(f"{node.op}:negative")
            if node.attrs.get("keepdims"):
                seen.add(f"{node.op}:keepdims")
            if node.op == "reshape" and -1 in node.attrs["shape"]:
                seen.add("reshape:-1")
            if node.op == "reshape" and recipe.nodes[node.parents[0]].op == "transpose":
                seen.add("reshape:of-transpose")
            if node.op == "concatenate":
                seen.add(f"concatenate:{len(node.parents)}")
            if node.op == "matmul":
                seen.add("matmul:" + "x".join(str(recipe.nodes[p].value.ndim) for p in node.parents))
            if node.scalar:
                seen.add(f"{node.op}:scalar")
            inputs = [recipe.nodes[p].value for p in node.parents]
            if any(x.flags.f_contiguous and not x.flags.c_contiguous for x in inputs):
                seen.add(f"{node.op}:fortran" + (":flat" if node.op == "take" and "axis" not in node.attrs else ""))
            if any(0 in x.strides and x.size > 1 for x in inputs):
                seen.add(f"{node.op}:broadcast")
            if len(set(node.parents)) < len(node.parents):
                seen.add(f"{node.op}:repeated")
            if node.op not in ("leaf", "const") and node.value.dtype == np.int64:
                seen.add(f"{node.op}:int64")
    wanted = {*UNARY, *BINARY, *TENSOR, "leaf", "const", "leaf:scalar", "const:scalar"}
    wanted |= {"sum:axes", "mean:negative", "amax:keepdims", "reshape:-1", "reshape:of-transpose"}
    wanted |= {"take:negative", "softmax:negative", "concatenate:1", "concatenate:4"}
    wanted |= {"matmul:1x1", "matmul:1x3", "matmul:2x2", "matmul:3x2", "matmul:4x3"}
    wanted |= {"take:fortran:flat", "reshape:fortran", "matmul:fortran", "sum:broadcast", "mul:repeated"}
    wanted |= {"concatenate:repeated", "transpose:int64"}
    assert wanted <= seen, sorted(wanted - seen)
    assert min(node_counts) <= 3 and max(node_counts) >= MAX_NODES


# -- against PyTorch -----------------------------------------------------------------------------
def torch_ops(torch: Any) -> dict[str, Callable[..., Any]]:
    """Each builtin op as a PyTorch expression of its inputs and attributes."""

    def dims(x: Any, axis: Any) -> tuple[int, ...]:
        return tuple(range(x.dim())) if axis is None else tuple(np.atleast_1d(axis).tolist())

    def reduce(function: Callable[..., Any]) -> Callable[..., Any]:
        def run(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
            if not x.dim():  # numpy reduces a 0-d array to a new 0-d array
                return function(x.reshape(1), dim=0)
            return function(x, dim=dims(x, axis), keepdim=keepdims)

        return run

    def take(x: Any, indices: Any, axis: int | None = None) -> Any:
        if axis is None:
            return torch.take(x, indices)
        axis %= x.dim()
        picked = torch.index_select(x, axis, indices.reshape(-1))
        return picked.reshape((*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]))

    def transpose(x: Any, axes: Any = None) -> Any:
        return x.permute(tuple(reversed(range(x.dim()))) if axes is None else tuple(axes))

    return {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
        "pow": lambda x, exponent: torch.pow(x, exponent),
        "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "sin": torch.sin, "cos": torch.cos,
        "tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "abs": torch.abs,
        "max": torch.maximum, "min": torch.minimum,
        "matmul": torch.matmul,
        "sum": reduce(torch.sum), "mean": reduce(torch.mean), "amax": reduce(torch.amax),
        "reshape": lambda x, shape: torch.reshape(x, shape),
        "transpose": transpose,
        "broadcast_to": lambda x, shape: torch.broadcast_to(x, shape),
        "concatenate": lambda *xs, axis=0: torch.cat(xs, dim=axis),
        "take": take,
        "softmax": lambda x, axis=-1: torch.softmax(x, dim=axis),
        "log_softmax": lambda x, axis=-1: torch.log_softmax(x, dim=axis),
        "nll_loss": lambda x, target, reduction="mean", ignore_index=-100: torch.nn.functional.nll_loss(
            x, target, reduction=reduction, ignore_index=ignore_index
        ),
    }  # fmt: skip


def test_random_graphs_match_pytorch() -> None:
    torch = needs_torch()
    ops = torch_ops(torch)
    assert set(ops) == {*UNARY, *BINARY, *TENSOR}
    for seed in range(GRAPHS):
        recipe = random_graph(seed)
        graph = graphsvc.backward(recipe.graph(), output="loss", registry=REGISTRY)
        tensors: list[Any] = []
        for node in recipe.nodes:
            if node.op in ("leaf", "const"):
                wants = node.op == "leaf" or node.scalar
                tensors.append(torch.tensor(node.value, requires_grad=wants))
            else:
                tensors.append(ops[node.op](*(tensors[p] for p in node.parents), **node.attrs))
        for tensor in tensors:
            if tensor.requires_grad and not tensor.is_leaf:
                tensor.retain_grad()
        if tensors[-1].requires_grad:  # else the loss is computed from consts alone: zero gradients
            tensors[-1].backward()
        context = recipe.describe()
        for i, tensor in enumerate(tensors):
            value = np.asarray(graph.value(recipe.name(i)))
            assert value.shape == tuple(tensor.shape), context
            assert np.allclose(value, tensor.detach().numpy(), rtol=1e-10, atol=1e-12), f"{recipe.name(i)}\n{context}"
            grad = np.asarray(graph.grad(recipe.name(i)))
            if tensor.requires_grad:
                want = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
                assert np.allclose(grad, want.numpy(), rtol=1e-9, atol=1e-12), f"{recipe.name(i)}\n{context}"
            else:
                assert np.isnan(grad).all(), f"{recipe.name(i)}\n{context}"
