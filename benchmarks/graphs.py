"""The benchmark graphs, and the same graphs in the forms the alternatives use.

Three graphs (all with one output, the last node):

* ``mlp``: micrograd's ``MLP(width, [width, width, 1])`` applied to one input of ``width`` leaves,
  built with micrograd and converted (``graphsvc.micrograd.from_micrograd`` when it exists,
  else :func:`micrograd_to_graph` below). Width 256 gives about 395,000 nodes.
* ``chain``: a one-unit recurrent net unrolled: ``x = relu(x * w + b)`` repeated, with shared leaves
  ``w = 0.999`` and ``b = 0.01`` (values stay near 10, gradients shrink to ~1e-145 over a million
  ops but never become subnormal). Three ops per step, so a chain of ``n`` ops is ``n // 3`` steps,
  and the graph is as deep as it is long. Built as numpy columns (:func:`chain`) or with micrograd
  (:func:`micrograd_chain`). micrograd 0.1.0 has no ``tanh``, hence ``relu``.
* ``dag``: a wide random DAG of binary ops (add, sub, mul, max), generated as columns with numpy:
  ten layers (the first are leaves in [0.5, 1.5]); each node of a layer takes as first parent a
  node of the layer before it (a random permutation, so every node gets used) and as second parent
  a uniformly random earlier node; then a balanced tree of adds sums the last layer into the
  output (a loss). Depth is about 9 + log2(n / 11), so 26 at a million nodes.

Two more graphs of ops beyond micrograd 0.1.0's (the scalar targets: every builtin op
compiled), with micrograd's ``Value`` given the ``tanh`` of its lecture (:func:`micrograd_tanh`):

* ``tanh_chain``: ``x = tanh(x * w + b)`` repeated ``steps`` times (``w = 0.9``, ``b = 0.1``, from
  ``x0 = 0.5``), three ops per step (:func:`tanh_chain`, :func:`build_micrograd_tanh_chain`).
* ``mixed_dag``: the random DAG above with the ops add, mul and tanh (tanh takes the first parent
  only), leaves in [0.5, 1.5] (:func:`dag` with ``ops``); micrograd builds the same graph node by
  node from its columns (:func:`build_micrograd_graph`).

One graph whose every computed node carries an attribute (attributes are the slow part of loading
and replaying a graph; none of the graphs above has any):

* ``pow_chain``: ``x = x ** e`` repeated ``n`` times from the leaf ``x0 = 1.5``, each ``pow`` node with
  its own ``exponent`` attribute: ``1.0001`` or ``1 / 1.0001`` in a random order (seeded), so the
  product of the exponents walks around 1 (over a million steps ``x`` stays between 1.45 and 1.55,
  the gradients between 0.8 and 1.01) rather than repeating one value every other step. ``n + 1``
  nodes, as deep as it is long (:func:`pow_chain`, :func:`build_micrograd_pow_chain`: micrograd's
  ``Value.__pow__`` takes the exponent as a float, the same ``x ** e`` of Python floats).

Alternative forms: per-node records (``{"op", "parents", "value"}`` dicts in a list, with ``"attrs"``
where a node has attributes, for pickle and msgpack), a ``{node: parents}`` map for :mod:`graphlib`,
and the same scalar expression in PyTorch.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from graphsvc.graph import CONST, FLOAT_DTYPE, INDEX_DTYPE, LEAF, LEAF_TAGS, OFFSET_DTYPE, OP_CODE_DTYPE, Graph

CHAIN_W = 0.999
CHAIN_B = 0.01
CHAIN_X0 = 1.0
DAG_LAYERS = 10
DAG_OPS = ("add", "sub", "mul", "max")
MIXED_OPS = ("add", "mul", "tanh")
TANH_W, TANH_B, TANH_X0 = 0.9, 0.1, 0.5
POW_X0 = 1.5
POW_EXPONENTS = (1.0001, 1 / 1.0001)
_UNARY = {"tanh": np.tanh}


# -- numpy column generators ---------------------------------------------------------------------
def _chain(steps: int, activation: str, values: np.ndarray, name: str) -> Graph:
    """``x = activation(x * w + b)``, ``steps`` times, as columns: leaves x0, w, b, then ``mul, add,
    activation`` per step; ``values`` is the value column (3 + 3 * steps)."""
    n = 3 + 3 * steps
    codes = np.empty(n, dtype=OP_CODE_DTYPE)
    codes[:3] = 0
    codes[3::3], codes[4::3], codes[5::3] = 1, 2, 3  # mul, add, the activation
    base = 3 + 3 * np.arange(steps, dtype=np.int64)
    counts = np.empty(n, dtype=np.int64)
    counts[:3] = 0
    counts[3::3], counts[4::3], counts[5::3] = 2, 2, 1
    offsets = np.zeros(n + 1, dtype=OFFSET_DTYPE)
    np.cumsum(counts, out=offsets[1:])
    parents = np.empty(int(offsets[-1]), dtype=INDEX_DTYPE)
    step_slots = 5 * np.arange(steps, dtype=np.int64)  # 5 parent slots per step
    parents[step_slots] = np.where(base == 3, 0, base - 1)  # mul: previous activation (x0 first)
    parents[step_slots + 1] = 1  # w
    parents[step_slots + 2] = base  # add: the mul
    parents[step_slots + 3] = 2  # b
    parents[step_slots + 4] = base + 1  # the activation: the add
    return Graph(
        op_table=[LEAF, "mul", "add", activation],
        op_codes=codes,
        parent_offsets=offsets,
        parent_indices=parents,
        values=values,
        outputs=[n - 1],
        metadata={"benchmark": name, "steps": steps},
    )


def chain(num_ops: int) -> Graph:
    """The recurrent chain as columns: leaves x0, w, b, then ``mul, add, relu`` per step."""
    steps = max(1, num_ops // 3)
    values = np.empty(3 + 3 * steps, dtype=FLOAT_DTYPE)
    values[:3] = (CHAIN_X0, CHAIN_W, CHAIN_B)
    x, out = CHAIN_X0, []
    for _ in range(steps):  # the same float operations, in the same order, as micrograd's
        m = x * CHAIN_W
        a = m + CHAIN_B
        x = 0 if a < 0 else a
        out += (m, a, x)
    values[3:] = out
    return _chain(steps, "relu", values, "chain")


def tanh_chain(steps: int) -> Graph:
    """``x = tanh(x * w + b)``, ``steps`` times, as columns: leaves x0, w, b, then mul, add, tanh."""
    values = np.full(3 + 3 * steps, np.nan, dtype=FLOAT_DTYPE)  # computed values unstored: replay computes them
    values[:3] = (TANH_X0, TANH_W, TANH_B)
    return _chain(steps, "tanh", values, "tanh_chain")


def pow_exponents(steps: int, seed: int = 0) -> list[float]:
    """The pow chain's exponents, one per step: :data:`POW_EXPONENTS` in a random order."""
    picks = np.random.default_rng(seed).integers(0, len(POW_EXPONENTS), steps)
    return [POW_EXPONENTS[k] for k in picks.tolist()]


def pow_chain(steps: int, seed: int = 0) -> Graph:
    """``x = x ** e``, ``steps`` times, as columns: the leaf x0, then one ``pow`` per step, each with
    its ``exponent`` attribute (:func:`pow_exponents`)."""
    exponents = pow_exponents(steps, seed)
    n = 1 + steps
    codes = np.ones(n, dtype=OP_CODE_DTYPE)
    codes[0] = 0
    offsets = np.zeros(n + 1, dtype=OFFSET_DTYPE)
    offsets[2:] = np.arange(1, steps + 1)
    x, values = POW_X0, [POW_X0]
    for e in exponents:  # the same float operation as micrograd's Value.__pow__
        x = x**e
        values.append(x)
    return Graph(
        op_table=[LEAF, "pow"],
        op_codes=codes,
        parent_offsets=offsets,
        parent_indices=np.arange(steps, dtype=INDEX_DTYPE),
        values=np.array(values, dtype=FLOAT_DTYPE),
        attrs={i: {"exponent": e} for i, e in enumerate(exponents, start=1)},
        outputs=[n - 1],
        metadata={"benchmark": "pow_chain", "steps": steps, "seed": seed},
    )


def _binary(op: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if op in _UNARY:
        return _UNARY[op](x)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum}[op](x, y)


def dag(n: int, seed: int = 0, ops: tuple[str, ...] = DAG_OPS) -> Graph:
    """The wide random DAG of exactly ``n`` nodes (``n >= 64``); see the module docstring. With
    ``ops``, its layers mix those ops (a unary op, tanh, takes the first parent only)."""
    rng = np.random.default_rng(seed)
    width = n // (DAG_LAYERS + 1)
    num_leaves = n - DAG_LAYERS * width + 1  # the layers, then width - 1 adds of the reduction
    sizes = [num_leaves] + [width] * (DAG_LAYERS - 1)
    starts = np.cumsum([0, *sizes])
    core = int(starts[-1])
    op_table = [LEAF, *ops]
    codes = np.zeros(n, dtype=OP_CODE_DTYPE)
    values = np.empty(n, dtype=FLOAT_DTYPE)
    values[:num_leaves] = rng.uniform(0.5, 1.5, num_leaves)
    first = np.empty(n, dtype=np.int64)  # parents of each non-leaf (leaves unused)
    second = np.empty(n, dtype=np.int64)
    for k in range(1, DAG_LAYERS):
        lo, hi, prev_lo = int(starts[k]), int(starts[k + 1]), int(starts[k - 1])
        count, prev_size = hi - lo, lo - prev_lo
        first[lo:hi] = prev_lo + rng.permutation(max(count, prev_size))[:count] % prev_size
        second[lo:hi] = rng.integers(0, lo, count)
        codes[lo:hi] = rng.integers(1, 1 + len(ops), count)
        x, y = values[first[lo:hi]], values[second[lo:hi]]
        layer = np.empty(count)
        for c, op in enumerate(ops, start=1):
            mask = codes[lo:hi] == c
            layer[mask] = _binary(op, x[mask], y[mask])
        values[lo:hi] = layer
    add = 1 + ops.index("add")
    level = np.arange(int(starts[-2]), core, dtype=np.int64)  # the last layer, summed pairwise
    nxt = core
    while len(level) > 1:
        pairs = len(level) // 2
        ids = np.arange(nxt, nxt + pairs)
        first[ids], second[ids] = level[0 : 2 * pairs : 2], level[1 : 2 * pairs : 2]
        codes[ids] = add
        values[ids] = values[first[ids]] + values[second[ids]]
        nxt += pairs
        level = np.concatenate([ids, level[2 * pairs :]])
    assert nxt == n, (nxt, n)
    unary = np.isin(codes, [1 + ops.index(op) for op in ops if op in _UNARY])
    counts = np.where(np.arange(n) < num_leaves, 0, np.where(unary, 1, 2))
    offsets = np.zeros(n + 1, dtype=OFFSET_DTYPE)
    np.cumsum(counts, out=offsets[1:])
    pairs = np.stack([first, second], axis=1)[num_leaves:]
    keep = np.stack([np.ones(n - num_leaves, dtype=bool), ~unary[num_leaves:]], axis=1)  # a unary op: one
    parents = pairs[keep].astype(INDEX_DTYPE)
    return Graph(
        op_table=op_table,
        op_codes=codes,
        parent_offsets=offsets,
        parent_indices=parents,
        values=values,
        outputs=[n - 1],
        metadata={"benchmark": "dag", "seed": seed},
    )


# -- micrograd ---------------------------------------------------------------------------------------
def micrograd_mlp(width: int, seed: int = 0) -> tuple[Any, Any, list[Any]]:
    """micrograd's MLP(width, [width, width, 1]) and one input; returns (model, output, inputs)."""
    from micrograd.engine import Value
    from micrograd.nn import MLP

    random.seed(seed)
    model = MLP(width, [width, width, 1])
    x = [Value(random.uniform(-1.0, 1.0)) for _ in range(width)]
    return model, model(x), x


def micrograd_chain(num_ops: int) -> tuple[Any, tuple[Any, Any, Any]]:
    """The recurrent chain built with micrograd; returns (output, (x0, w, b))."""
    from micrograd.engine import Value

    x0, w, b = Value(CHAIN_X0), Value(CHAIN_W), Value(CHAIN_B)
    return build_micrograd_chain(num_ops, x0, w, b), (x0, w, b)


def build_micrograd_chain(num_ops: int, x0: Any, w: Any, b: Any) -> Any:
    x = x0
    for _ in range(max(1, num_ops // 3)):
        x = (x * w + b).relu()
    return x


def micrograd_tanh(x: Any) -> Any:
    """``x.tanh()`` as micrograd's lecture writes it (micrograd 0.1.0's ``Value`` has no tanh)."""
    from micrograd.engine import Value

    t = math.tanh(x.data)
    out = Value(t, (x,), "tanh")

    def _backward() -> None:
        x.grad += (1 - t**2) * out.grad

    out._backward = _backward
    return out


def micrograd_tanh_chain(steps: int) -> tuple[Any, tuple[Any, Any, Any]]:
    """The tanh chain built with micrograd; returns (output, (x0, w, b))."""
    from micrograd.engine import Value

    x0, w, b = Value(TANH_X0), Value(TANH_W), Value(TANH_B)
    return build_micrograd_tanh_chain(steps, x0, w, b), (x0, w, b)


def build_micrograd_tanh_chain(steps: int, x0: Any, w: Any, b: Any) -> Any:
    x = x0
    for _ in range(steps):
        x = micrograd_tanh(x * w + b)
    return x


def micrograd_pow_chain(steps: int, seed: int = 0) -> tuple[Any, Any, list[float]]:
    """The pow chain built with micrograd; returns (output, x0, the exponents)."""
    from micrograd.engine import Value

    x0, exponents = Value(POW_X0), pow_exponents(steps, seed)
    return build_micrograd_pow_chain(x0, exponents), x0, exponents


def build_micrograd_pow_chain(x0: Any, exponents: list[float]) -> Any:
    x = x0
    for e in exponents:
        x = x**e
    return x


def micrograd_columns(graph: Graph) -> tuple[list[str], list[list[int]], list[float]]:
    """What :func:`build_micrograd_graph` reads: each node's op tag, parents and (leaf) value."""
    tags = [graph.op_table[c] for c in graph.op_codes.tolist()]
    offsets, parents = graph.parent_offsets.tolist(), graph.parent_indices.tolist()
    return tags, [parents[offsets[i] : offsets[i + 1]] for i in range(graph.num_nodes)], graph.values.tolist()


def build_micrograd_graph(columns: tuple[list[str], list[list[int]], list[float]]) -> Any:
    """The graph (leaves, add, mul, tanh) built with micrograd's ``Value``, node by node in id
    order, as a user's program would compute it; returns the last node."""
    from micrograd.engine import Value

    tags, parents, values = columns
    made: list[Any] = []
    append = made.append
    for tag, ps, value in zip(tags, parents, values, strict=True):
        if tag == "add":
            append(made[ps[0]] + made[ps[1]])
        elif tag == "mul":
            append(made[ps[0]] * made[ps[1]])
        elif tag == "tanh":
            append(micrograd_tanh(made[ps[0]]))
        else:
            append(Value(value))
    return made[-1]


_MICROGRAD_OPS = {"+": "add", "*": "mul", "ReLU": "relu", "tanh": "tanh"}


def micrograd_postorder(root: Any) -> list[Any]:
    """Every value ``root`` depends on, parents first (iterative; micrograd's own is recursive)."""
    order: list[Any] = []
    done: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            done.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((p, False) for p in node._prev if id(p) not in done)
    return order


def micrograd_to_graph(root: Any) -> Graph:
    """A linear-time converter of a micrograd graph, used when graphsvc.micrograd is missing.

    micrograd keeps parents in a set, so ``a * a`` has one; binary ops get it twice. Every node
    without parents becomes a ``leaf`` (micrograd does not tell constants apart).
    """
    order = micrograd_postorder(root)
    index = {id(v): i for i, v in enumerate(order)}
    tags, counts, parents, attrs = [], [], [], {}
    for i, v in enumerate(order):
        ps = [index[id(p)] for p in v._prev]
        if not v._op:
            tag = LEAF
        elif v._op.startswith("**"):
            tag = "pow"
            attrs[i] = {"exponent": float(v._op[2:])}
        else:
            tag = _MICROGRAD_OPS[v._op]
            if len(ps) == 1 and tag in ("add", "mul"):
                ps = ps * 2
        tags.append(tag)
        counts.append(len(ps))
        parents.extend(ps)
    op_table = list(dict.fromkeys(tags))
    code = {t: c for c, t in enumerate(op_table)}
    offsets = np.zeros(len(order) + 1, dtype=OFFSET_DTYPE)
    np.cumsum(counts, out=offsets[1:])
    return Graph(
        op_table=op_table,
        op_codes=np.array([code[t] for t in tags], dtype=OP_CODE_DTYPE),
        parent_offsets=offsets,
        parent_indices=np.array(parents, dtype=INDEX_DTYPE),
        values=np.array([float(v.data) for v in order], dtype=FLOAT_DTYPE),
        attrs=attrs,
        outputs=[len(order) - 1],
    )


def from_micrograd(root: Any) -> tuple[Graph, str]:
    """Convert with graphsvc's converter when it exists; returns the graph and which converter ran."""
    try:
        from graphsvc.micrograd import from_micrograd as convert  # type: ignore[import-not-found]
    except ImportError:
        return micrograd_to_graph(root), "benchmarks.graphs.micrograd_to_graph (graphsvc.micrograd missing)"
    return convert(root), "graphsvc.micrograd.from_micrograd"


def micrograd_build_topo(v: Any) -> list[Any]:
    """micrograd 0.1.0's ``build_topo``, verbatim (it is nested inside ``Value.backward``)."""
    topo = []
    visited = set()

    def build_topo(v: Any) -> None:
        if v not in visited:
            visited.add(v)
            for child in v._prev:
                build_topo(child)
            topo.append(v)

    build_topo(v)
    return topo


# -- per-node records (pickle, msgpack) and graphlib ---------------------------------------------------
def to_records(graph: Graph) -> dict[str, Any]:
    """The graph as a user might keep it without graphsvc: a list of per-node dicts."""
    table = graph.op_table
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    values = graph.values.tolist()
    grads = None if graph.grads is None else graph.grads.tolist()
    nodes = []
    for i, code in enumerate(graph.op_codes.tolist()):
        node: dict[str, Any] = {"op": table[code], "parents": parents[offsets[i] : offsets[i + 1]], "value": values[i]}
        if grads is not None:
            node["grad"] = grads[i]
        if i in graph.names:
            node["name"] = graph.names[i]
        if i in graph.attrs:
            node["attrs"] = graph.attrs[i]
        nodes.append(node)
    return {"nodes": nodes, "outputs": list(graph.outputs), "metadata": dict(graph.metadata)}


def from_records(records: dict[str, Any]) -> Graph:
    """The inverse of :func:`to_records` (op table in order of first use)."""
    nodes = records["nodes"]
    tags = [node["op"] for node in nodes]
    op_table = list(dict.fromkeys(tags))
    code = {t: c for c, t in enumerate(op_table)}
    offsets = np.zeros(len(nodes) + 1, dtype=OFFSET_DTYPE)
    np.cumsum([len(node["parents"]) for node in nodes], out=offsets[1:])
    has_grads = bool(nodes) and "grad" in nodes[0]
    return Graph(
        op_table=op_table,
        op_codes=np.array([code[t] for t in tags], dtype=OP_CODE_DTYPE),
        parent_offsets=offsets,
        parent_indices=np.array([p for node in nodes for p in node["parents"]], dtype=INDEX_DTYPE),
        values=np.array([node["value"] for node in nodes], dtype=FLOAT_DTYPE),
        grads=np.array([node["grad"] for node in nodes], dtype=FLOAT_DTYPE) if has_grads else None,
        names={i: node["name"] for i, node in enumerate(nodes) if "name" in node},
        attrs={i: node["attrs"] for i, node in enumerate(nodes) if "attrs" in node},
        outputs=list(records["outputs"]),
        metadata=dict(records["metadata"]),
    )


def parents_map(records: dict[str, Any]) -> dict[int, list[int]]:
    """``{node: parents}``, the input :class:`graphlib.TopologicalSorter` takes."""
    return {i: node["parents"] for i, node in enumerate(records["nodes"])}


def same_graph(a: Graph, b: Graph) -> bool:
    """Equal columns (values bit for bit), op tags, names, attributes and outputs."""

    def tags(g: Graph) -> list[str]:
        return [g.op_table[c] for c in g.op_codes.tolist()]

    def bits(x: np.ndarray | None) -> bytes | None:
        return None if x is None else np.asarray(x, dtype=FLOAT_DTYPE).tobytes()

    return (
        tags(a) == tags(b)
        and np.array_equal(a.parent_offsets, b.parent_offsets)
        and np.array_equal(a.parent_indices, b.parent_indices)
        and bits(a.values) == bits(b.values)
        and bits(a.grads) == bits(b.grads)
        and a.names == b.names
        and a.attrs == b.attrs
        and list(a.outputs) == list(b.outputs)
    )


# -- PyTorch ------------------------------------------------------------------------------------------
def to_torch(graph: Graph) -> tuple[Any, list[Any], list[int]]:
    """The same scalar expression with float64 0-d tensors; returns (output, leaf tensors, leaf ids).

    Leaves require grad (constants do not); ops run in id order, which is topological.
    """
    import torch

    def power(x: Any, exponent: float) -> Any:
        return x**exponent

    unary = {
        "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "sin": torch.sin,
        "cos": torch.cos, "tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "abs": torch.abs,
    }  # fmt: skip
    binary = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "max": torch.maximum, "min": torch.minimum,
    }  # fmt: skip
    table = graph.op_table
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    values = graph.values.tolist()
    tensors: list[Any] = [None] * graph.num_nodes
    leaves, leaf_ids = [], []
    for i, code in enumerate(graph.op_codes.tolist()):
        tag = table[code]
        args = [tensors[p] for p in parents[offsets[i] : offsets[i + 1]]]
        if tag in LEAF_TAGS:
            t = torch.tensor(values[i], dtype=torch.float64, requires_grad=tag != CONST)
            if tag != CONST:
                leaves.append(t)
                leaf_ids.append(i)
        elif tag == "pow":
            t = power(args[0], graph.attrs[i]["exponent"])
        elif tag in unary:
            t = unary[tag](args[0])
        else:
            t = binary[tag](args[0], args[1])
        tensors[i] = t
    return tensors[graph.outputs[0]], leaves, leaf_ids
