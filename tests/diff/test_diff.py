"""graphsvc.diff and ``graphsvc diff A B``: alignment, differences, first divergence, text, --json, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc.diff import GraphDiff, close, diff, tolerances
from graphsvc.format import save
from graphsvc.graph import Graph, GraphBuilder
from tests.conftest import ROOT, needs_torch, run_cli

SEED004 = ROOT / "examples" / "seed004.msgpack"


def seed004_with_c(c: float) -> Graph:
    """seed004 (a=2, b=3, c=1; L = (a*b + c) * (a + b)) replayed with c changed."""
    return graphsvc.backward(graphsvc.load(SEED004), set={"c": c})


def test_one_leaf_changed_diverges_at_the_first_node_using_it_and_the_gradients_as_derived_by_hand() -> None:
    found = diff(graphsvc.load(SEED004), seed004_with_c(2.0))
    assert not found.equal
    # abc = a*b + c: 7 -> 8, the first op reading c; L = abc * apb: 35 -> 40.
    assert found.first_value is not None
    assert (found.first_value.node, found.first_value.name, found.first_value.a, found.first_value.b) == (
        4,
        "abc",
        7.0,
        8.0,
    )
    # dL/dL = 1, dL/dabc = apb = 5 agree; dL/dapb = abc: 7 -> 8, then dL/da = b*apb + abc: 22 -> 23.
    assert found.first_grad is not None
    assert (found.first_grad.node, found.first_grad.name, found.first_grad.a, found.first_grad.b) == (
        5,
        "apb",
        7.0,
        8.0,
    )
    assert [(d.kind, d.node, d.a, d.b) for d in found.numeric] == [
        ("grad", 0, 22.0, 23.0),
        ("grad", 1, 17.0, 18.0),
        ("value", 2, 1.0, 2.0),
        ("value", 4, 7.0, 8.0),
        ("grad", 5, 7.0, 8.0),
        ("value", 6, 35.0, 40.0),
    ]
    assert found.structural == [] and found.unaligned == []


def test_tolerances_fit_the_dtypes_and_the_looser_wins() -> None:
    assert tolerances("float64", "float64", None, None) == (1e-9, 1e-12)
    assert tolerances("float32", "float64", None, None) == (1e-4, 1e-6)
    assert tolerances("int64", "int64", None, None) == (0.0, 0.0)
    assert tolerances("float32", "float32", 0.5, None) == (0.5, 1e-6)


def test_nan_and_inf_are_compared_as_values() -> None:
    a = np.array([np.nan, np.inf, -np.inf, np.inf, 1.0])
    b = np.array([np.nan, np.inf, -np.inf, -np.inf, 1.0 + 1e-10])
    assert close(a, b, 1e-9, 1e-12, False).tolist() == [False, True, True, False, True]
    assert close(a, b, 1e-9, 1e-12, True).tolist() == [True, True, True, False, True]


def scalars(x: float, names: bool = True, extra: bool = False) -> Graph:
    builder = GraphBuilder()
    a = builder.leaf(x, name="a" if names else None)
    b = builder.leaf(3.0, name="b" if names else None)
    s = builder.add("mul", [a, b], name="s" if names else None)
    if extra:
        builder.add("neg", [s], name="n")
    return builder.build()


def test_nan_equal_only_when_asked(tmp_path: Path) -> None:
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    save(graphsvc.forward(scalars(float("nan"))), a)
    save(graphsvc.forward(scalars(float("nan"))), b)
    assert run_cli("diff", str(a), str(b))[0] == 1
    assert run_cli("diff", str(a), str(b), "--nan-equal")[0] == 0
    found = diff(graphsvc.load(a), graphsvc.load(b))
    assert [(d.kind, d.node) for d in found.numeric] == [("value", 0), ("value", 2)]
    assert found.first_value is not None and found.first_value.node == 2


def test_unnamed_nodes_are_aligned_by_structure_and_a_node_only_in_b_is_reported() -> None:
    found = diff(graphsvc.forward(scalars(2.0)), graphsvc.forward(scalars(2.0, names=False)))
    assert found.equal and found.matched.tolist() == [0, 1, 2]
    # B's output is a neg node past s: B's outputs are [n], A's [s]: op differs there, n only in B.
    builder = GraphBuilder()
    x = builder.leaf(2.0)
    y = builder.leaf(3.0)
    s = builder.add("mul", [x, y])
    builder.add("neg", [s])
    found = diff(graphsvc.forward(scalars(2.0)), graphsvc.forward(builder.build()))
    assert not found.equal
    assert [(u.graph, u.node, u.why, u.other) for u in found.unaligned] == [
        ("A", 0, "only in A", None),
        ("A", 1, "only in A", None),
        ("A", 2, "op differs", 3),
        ("B", 0, "only in B", None),
        ("B", 1, "only in B", None),
        ("B", 2, "only in B", None),
        ("B", 3, "only in B", None),
    ]
    found = diff(graphsvc.forward(scalars(2.0)), graphsvc.forward(scalars(2.0, extra=True)))
    assert found.matched.tolist() == [0, 1, 2]
    assert [(u.graph, u.node, u.name, u.why) for u in found.unaligned] == [("B", 3, "n", "only in B")]


def test_an_op_that_differs_on_a_named_node_and_its_attributes_are_structural() -> None:
    builder = GraphBuilder()
    a = builder.leaf(2.0, name="a")
    b = builder.leaf(3.0, name="b")
    builder.add("add", [a, b], name="s")
    found = diff(graphsvc.forward(scalars(2.0)), graphsvc.forward(builder.build()))
    assert [(d.kind, d.node, d.a, d.b) for d in found.structural] == [("op", 2, "mul", "add")]
    assert [(d.kind, d.node, d.a, d.b) for d in found.numeric] == [("value", 2, 6.0, 5.0)]


def test_attributes_that_differ_name_their_keys_and_a_pair_of_different_ops_has_no_attrs_line() -> None:
    def powers(exponent: float, extra: dict[str, Any], last: str) -> Graph:
        builder = GraphBuilder()
        x = builder.leaf(2.0, name="x")
        p = builder.add("pow", [x], name="p", attrs={"exponent": exponent, **extra})
        builder.add(last, [p], name="y", attrs={"exponent": 2.0} if last == "pow" else None)
        return builder.build()  # not replayed: pow takes no "note" (a plugin's op might)

    found = diff(powers(2.0, {"note": None}, "pow"), powers(3.0, {}, "exp"))
    assert [(d.kind, d.node, d.a, d.b) for d in found.structural] == [
        ("attrs", 1, {"exponent": 2.0, "note": None}, {"exponent": 3.0}),
        ("op", 2, "pow", "exp"),
    ]
    assert found.structural[0].to_json()["a"] == {"exponent": 2.0, "note": None}


def test_json_writes_nan_inf_and_attributes_as_strict_json(tmp_path: Path) -> None:
    def built(attrs: dict[str, Any], value: float) -> Graph:  # not replayed: the op's value is not stored
        b = GraphBuilder()
        x = b.leaf(value, name="x")
        b.add("pow", [x], name="p", attrs=attrs)
        return b.build()

    save(built({"exponent": 2.0}, float("inf")), tmp_path / "a.msgpack")
    save(built({"exponent": float("nan")}, 1.0), tmp_path / "b.msgpack")
    code, out, err = run_cli("diff", "--json", str(tmp_path / "a.msgpack"), str(tmp_path / "b.msgpack"))
    assert (code, err) == (1, "")
    document = json.loads(out)  # strict JSON: nan and inf as strings
    assert document["structural"] == [
        {
            "kind": "attrs",
            "name": "p",
            "node": 1,
            "node_b": 1,
            "op": "pow",
            "a": {"exponent": 2.0},
            "b": {"exponent": "nan"},
        }
    ]
    assert [(d["name"], d["a"], d["b"]) for d in document["numeric"]] == [("x", "inf", 1.0), ("p", "nan", "nan")]


def tensor_graph(dtype: Any) -> Graph:
    builder = GraphBuilder()
    x = builder.leaf(np.linspace(-1.0, 1.0, 6).reshape(2, 3).astype(dtype), name="x")
    w = builder.leaf(np.linspace(0.5, 2.0, 12).reshape(3, 4).astype(dtype), name="w")
    m = builder.add("matmul", [x, w], name="m")
    t = builder.add("tanh", [m], name="t")
    builder.add("sum", [t], name="L")
    return graphsvc.backward(builder.build())


def test_a_float32_copy_of_a_tensor_graph_is_equal_within_the_defaults_and_a_change_is_summarised() -> None:
    a, b = tensor_graph(np.float64), tensor_graph(np.float32)
    found = diff(a, b)
    assert found.equal
    assert [(d.kind, d.node, d.a, d.b) for d in found.structural] == [
        ("dtype", n, "float64", "float32") for n in range(5)
    ]
    assert not diff(a, b, rtol=0.0, atol=0.0).equal
    changed = graphsvc.backward(tensor_graph(np.float64), set={"w": np.linspace(0.5, 2.0, 12).reshape(3, 4) * 1.5})
    document = diff(a, changed).to_json()
    first = document["first_divergence"]["values"]
    assert (first["name"], first["node"], first["op"]) == ("m", 2, "matmul")
    assert first["a"]["shape"] == [2, 4] and first["a"]["dtype"] == "float64"
    assert first["a"]["first_index"] == [0, 0]
    m_a = np.linspace(-1.0, 1.0, 6).reshape(2, 3) @ np.linspace(0.5, 2.0, 12).reshape(3, 4)
    assert first["a"]["max_abs_diff"] == pytest.approx(float(np.abs(m_a * 0.5).max()))


def test_bad_tolerances_are_usage_errors() -> None:
    code, out, err = run_cli("diff", str(SEED004), str(SEED004), "--rtol", "-1")
    assert (code, out, err) == (2, "", "Error: --rtol must be a finite number >= 0, not -1.0\n")


def test_a_bad_file_exits_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"not a graph")
    code, out, err = run_cli("diff", str(SEED004), str(bad))
    assert code == 3 and out == "" and err.startswith("Error: ")


TEXT = (
    "A: 7 nodes, B: 7 nodes, 7 aligned: differ\n"
    "first divergence (values): node 4 abc (add): A 7.0, B 8.0\n"
    "first divergence (grads): node 5 apb (add): A 7.0, B 8.0\n"
    "0 structural, 6 numeric differences, 0 unaligned nodes\n"
    "grad\t0\ta\tleaf\t22.0\t23.0\n"
    "grad\t1\tb\tleaf\t17.0\t18.0\n"
    "value\t2\tc\tleaf\t1.0\t2.0\n"
    "value\t4\tabc\tadd\t7.0\t8.0\n"
    "grad\t5\tapb\tadd\t7.0\t8.0\n"
    "value\t6\tL\tmul\t35.0\t40.0\n"
)


def test_the_text_and_json_are_pinned(tmp_path: Path) -> None:
    changed = tmp_path / "c2.msgpack"
    save(seed004_with_c(2.0), changed)
    assert run_cli("diff", str(SEED004), str(changed)) == (1, TEXT, "")
    assert run_cli("diff", str(SEED004), str(SEED004)) == (
        0,
        "A: 7 nodes, B: 7 nodes, 7 aligned: equal within tolerance\n"
        "first divergence (values): none\nfirst divergence (grads): none\n",
        "",
    )
    code, out, _ = run_cli("diff", str(SEED004), str(changed), "--json", "--limit", "1")
    assert code == 1
    assert json.loads(out) == {
        "equal": False,
        "nodes": {"a": 7, "b": 7, "aligned": 7},
        "first_divergence": {
            "values": {"name": "abc", "node": 4, "op": "add", "a": 7.0, "b": 8.0},
            "grads": {"name": "apb", "node": 5, "op": "add", "a": 7.0, "b": 8.0},
        },
        "structural": [],
        "numeric": [{"kind": "grad", "name": "a", "node": 0, "node_b": 0, "op": "leaf", "a": 22.0, "b": 23.0}],
        "unaligned": [],
        "counts": {"structural": 0, "numeric": 6, "unaligned": 0},
    }
    code, out, _ = run_cli("diff", str(SEED004), str(changed), "--limit", "2")
    assert out == "".join(TEXT.splitlines(keepends=True)[:6]) + "... 4 more (--limit 2)\n"


def test_names_from_a_file_are_escaped(tmp_path: Path) -> None:
    builder = GraphBuilder()
    builder.leaf(1.0, name="x\x1b[2J")
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    save(builder.build(), a)
    builder = GraphBuilder()
    builder.leaf(2.0, name="x\x1b[2J")
    save(builder.build(), b)
    code, out, _ = run_cli("diff", str(a), str(b))
    assert code == 1 and "\x1b" not in out
    assert "value\t0\tx\\x1b[2J\tleaf\t1.0\t2.0\n" in out


def test_a_graph_diff_is_what_python_gets() -> None:
    assert isinstance(graphsvc.diff(graphsvc.load(SEED004), graphsvc.load(SEED004)), GraphDiff)


def torch_step(change: bool) -> Graph:
    torch = needs_torch()
    from torch import nn

    from graphsvc.torch import capture

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    if change:
        with torch.no_grad():
            model[2].weight[0, 0] += 0.5
    x = torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(2, 4)
    with capture(model) as run:
        loss = model(x).square().sum()
        loss.backward()
    return run.graph()


def test_a_captured_pytorch_step_against_itself_and_against_one_weight_changed(tmp_path: Path) -> None:
    a, same, changed = tmp_path / "a.msgpack", tmp_path / "same.msgpack", tmp_path / "changed.msgpack"
    save(torch_step(False), a)
    save(torch_step(False), same)
    save(torch_step(True), changed)
    assert run_cli("diff", str(a), str(same))[0] == 0
    code, out, _ = run_cli("diff", str(a), str(changed), "--json")
    assert code == 1
    document = json.loads(out)
    values = document["first_divergence"]["values"]
    # 2.weight's first use: the transpose nn.Linear writes as t before addmm.
    assert (values["name"], values["op"]) == ("2.t", "transpose")
    assert values["a"]["max_abs_diff"] == 0.5 and values["a"]["first_index"] == [0, 0]
    # backward: sum and pow and 2.addmm's gradients agree (the loss's gradient does not depend on
    # the weight until it flows through 2.weight into 1.relu).
    grads = document["first_divergence"]["grads"]
    assert (grads["name"], grads["op"]) == ("1.relu", "relu")


def test_parents_that_differ_through_the_alignment_are_structural() -> None:
    # s = a * b in A, s = b * a in B: the same names, the parents swapped.
    builder = GraphBuilder()
    a = builder.leaf(2.0, name="a")
    b = builder.leaf(3.0, name="b")
    builder.add("mul", [b, a], name="s")
    found = diff(graphsvc.forward(scalars(2.0)), graphsvc.forward(builder.build()))
    assert [(d.kind, d.node, d.a, d.b) for d in found.structural] == [("parents", 2, [0, 1], [1, 0])]
    assert found.numeric == [] and not found.equal


def _random_pair(seed: int) -> tuple[Graph, Graph]:
    """Two random DAGs over a few op tags that share a start, then part (another op, another parent,
    nodes only in one), with some names shared: nodes compete for partners in the walk."""
    rng = np.random.default_rng(seed)
    graphs = []
    for variant in range(2):
        b = GraphBuilder()
        nodes = [b.leaf(float(i), f"x{i}" if i % 2 else None) for i in range(4)]
        for i in range(60):
            ops = ("add", "mul") if variant == 0 or i < 20 else ("add", "sub")
            op = ops[int(rng.integers(2))]
            picks = rng.integers(0, len(nodes), size=2)
            name = f"n{i}" if rng.random() < 0.2 else None
            nodes.append(b.add(op, [nodes[int(picks[0])], nodes[int(picks[1])]], name=name))
        graphs.append(b.build([nodes[-1]]))
    return graphs[0], graphs[1]


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_walk_aligns_as_the_reference_walk(seed: int) -> None:
    from graphsvc.diff import align
    from graphsvc.native import REFERENCE, Engine, _compiled, built
    from tests.conftest import native_missing

    if not built():
        native_missing("the C extensions are not built here (pip install -e . builds them)")
    a, b = _random_pair(seed)
    matched_c, unaligned_c = align(a, b, engine=Engine(_compiled()))
    matched_py, unaligned_py = align(a, b, engine=REFERENCE)
    assert matched_c.tolist() == matched_py.tolist()
    assert [u.to_json() for u in unaligned_c] == [u.to_json() for u in unaligned_py]
    assert (matched_c >= 0).any()


def test_one_changed_op_is_one_difference_and_the_rest_aligns() -> None:
    """The walk goes on through a pair whose ops differ: the nodes the changed op depends on still
    pair by position (else one edit in the middle of a chain left half of it unaligned)."""
    from graphsvc.diff import align

    graphs = []
    for middle_op in ("mul", "add"):
        b = GraphBuilder()
        h = b.leaf(0.5)
        w = b.leaf(2.0)
        for i in range(200):
            h = b.add(middle_op if i == 100 else "mul", [h, w])
        graphs.append(b.build([h]))
    matched, unaligned = align(*graphs)
    changed = 2 + 100
    assert [(u.graph, u.node, u.why, u.other) for u in unaligned] == [
        ("A", changed, "op differs", changed),
        ("B", changed, "only in B", None),
    ]
    assert (matched == np.arange(len(matched))).sum() == len(matched) - 1
