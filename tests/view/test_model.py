"""graphsvc.view.model: the groups, views, node details and searches ``graphsvc view``'s page is given."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

import graphsvc
from graphsvc import GraphBuilder
from graphsvc.errors import UsageError
from graphsvc.graph import Graph
from graphsvc.replay.run import nonfinite_findings
from graphsvc.view.model import FANOUT, MAX_ITEMS, ViewModel


def seed004(value_a: float = 2.0) -> Graph:
    """L = (a*b + c)*(a + b) with a=2, b=3, c=1, names in two scopes; grads 22, 17, 5 hand-derived."""
    b = GraphBuilder()
    a_ = b.leaf(value_a, "in.a")
    b_ = b.leaf(3.0, "in.b")
    c_ = b.leaf(1.0, "in.c")
    ab = b.add("mul", [a_, b_], name="body.ab")
    abc = b.add("add", [ab, c_], name="body.abc")
    apb = b.add("add", [a_, b_], name="body.apb")
    b.add("mul", [abc, apb], name="L")
    return graphsvc.backward(b.build())


def json_ok(answer: dict[str, Any]) -> dict[str, Any]:
    """Every answer must be JSON as a browser reads it: no nan, no numpy types."""
    return json.loads(json.dumps(answer, allow_nan=False))


def labels(view: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(item["key"], item["label"], item["parent"]) for item in view["items"]]


def test_seed004_groups_edges_and_numbers() -> None:
    model = ViewModel(seed004(), files=["s.msgpack"])
    meta = json_ok(model.meta())
    assert meta["nodes"] == 7 and meta["edges"] == 8 and meta["groups"] == 3
    assert meta["ops"] == {"add": 2, "mul": 2, "leaf": 3}
    assert meta["outputs"] == [6] and meta["diff"] is None and meta["max_items"] == MAX_ITEMS

    root = json_ok(model.view([]))
    assert labels(root) == [("g1", "in", None), ("g2", "body", None), ("n6", "L", None)]
    assert root["edges"] == [
        {"source": "g1", "target": "g2", "count": 5},  # a, b into a*b and a + b; c into a*b + c
        {"source": "g2", "target": "n6", "count": 2},
    ]
    group_in, group_body, loss = root["items"]
    # the grads 22, 17, 5 of a, b, c: the largest |grad| inside "in" is 22
    assert group_in["nodes"] == 3 and group_in["ops"] == {"leaf": 3}
    assert group_in["max_abs_grad"] == 22.0 and group_in["max_abs_value"] == 3.0
    assert group_body["nodes"] == 3 and group_body["ops"] == {"add": 2, "mul": 1}
    assert group_body["max_abs_value"] == 7.0  # a*b + c = 7
    assert loss["value"] == "35" and loss["grad"] == "1" and loss["step"] == 0

    opened = json_ok(model.view([1]))
    assert labels(opened) == [
        ("g2", "body", None),
        ("n6", "L", None),
        ("g1", "in", None),
        ("n0", "in.a", "g1"),
        ("n1", "in.b", "g1"),
        ("n2", "in.c", "g1"),
    ]
    assert opened["open"] == [0, 1]
    assert opened["edges"] == [
        {"source": "n0", "target": "g2", "count": 2},
        {"source": "n1", "target": "g2", "count": 2},
        {"source": "n2", "target": "g2", "count": 1},
        {"source": "g2", "target": "n6", "count": 2},
    ]
    grads = {item["label"]: item["max_abs_grad"] for item in opened["items"] if item["kind"] == "node"}
    assert grads == {"in.a": 22.0, "in.b": 17.0, "in.c": 5.0, "L": 1.0}


def test_node_details() -> None:
    model = ViewModel(seed004())
    detail = json_ok(model.node(3))
    assert detail["label"] == "body.ab" and detail["op"] == "mul" and detail["plugin"] == "graphsvc"
    assert detail["value"]["text"] == "6.0" and detail["grad"]["text"] == "5.0"  # dL/d(ab) = a + b
    assert detail["parents"] == [{"id": 0, "label": "in.a", "op": "leaf"}, {"id": 1, "label": "in.b", "op": "leaf"}]
    assert detail["children"] == [{"id": 4, "label": "body.abc", "op": "add"}]
    assert detail["groups"] == [0, 2] and detail["step"] == json_ok(model.view([2]))["items"][-3]["step"]


def test_search_by_name_op_and_id() -> None:
    model = ViewModel(seed004())
    assert [m["label"] for m in model.search("AB")["matches"]] == ["body.ab", "body.abc"]
    assert [m["id"] for m in model.search("mul")["matches"]] == [3, 6]
    assert model.search("#5")["matches"] == [{"id": 5, "label": "body.apb", "op": "add", "groups": [0, 2]}]
    limited = model.search("in.", limit=2)
    assert [m["label"] for m in limited["matches"]] == ["in.a", "in.b"] and limited["more"] is True
    assert model.search("nothing like it") == {"matches": [], "more": False}


def test_single_child_groups_merge_and_unnamed_nodes_follow_their_first_parent() -> None:
    b = GraphBuilder()
    w = b.leaf(2.0, "encoder.layers.0.w")
    x = b.leaf(3.0)  # unnamed leaf: the top level
    h = b.add("mul", [w, x])  # unnamed: joins encoder.layers.0 (its first parent's group)
    y = b.add("mul", [x, h])  # unnamed, first parent unnamed leaf: the top level
    b.add("add", [y, w], name="out")
    model = ViewModel(b.build())
    root = model.view([])
    assert labels(root) == [
        ("g1", "encoder.layers.0", None),
        ("n1", "#1", None),
        ("n3", "#3", None),
        ("n4", "out", None),
    ]
    assert [item["label"] for item in model.view([1])["items"] if item["parent"] == "g1"] == [
        "encoder.layers.0.w",
        "#2",
    ]


def chain(n: int) -> Graph:
    b = GraphBuilder()
    node = b.leaf(0.5)
    for _ in range(n - 1):
        node = b.add("neg", [node])
    return b.build()


def test_range_groups_nest_so_no_group_shows_more_than_64_items() -> None:
    model = ViewModel(chain(5000))
    root = model.view([])
    # 5,000 nodes: ranges of 4,096 (64 x 64) at the top level
    assert labels(root) == [("g1", "#0–4,095", None), ("g66", "#4,096–4,999", None)]
    assert root["edges"] == [{"source": "g1", "target": "g66", "count": 1}]
    first = model.view([1])
    inside = [item["label"] for item in first["items"] if item["parent"] == "g1"]
    assert len(inside) == FANOUT and inside[:2] == ["#0–63", "#64–127"] and inside[-1] == "#4,032–4,095"
    deepest = model.view([1, 2])
    nodes = [item["id"] for item in deepest["items"] if item["parent"] == "g2"]
    assert nodes == list(range(64))
    for g in range(len(model._gparent)):
        assert len(model._gchildren[g]) + int(model._direct_nodes[g]) <= FANOUT


def test_too_many_items_and_unknown_ids() -> None:
    b = GraphBuilder()
    for i in range(MAX_ITEMS + 1):
        b.leaf(float(i), f"g{i // 60}.x{i}")
    model = ViewModel(b.build())
    opened = list(range(1, 52))
    with pytest.raises(UsageError) as caught:
        model.view(opened)
    assert str(caught.value) == (
        "opening these groups would show 3,052 items; the page shows at most 3,000: close a group first"
    )
    with pytest.raises(UsageError, match=r"^no group 999: this graph has groups 0 to 51$"):
        model.view([999])
    with pytest.raises(UsageError, match=r"^no node -1: this graph has nodes 0 to 3000$"):
        model.node(-1)


def test_nan_and_inf_are_flagged_and_given_as_strings() -> None:
    b = GraphBuilder()
    x = b.leaf(-1.0, "x")
    r = b.add("log", [x], name="blocks.0.log")  # log(-1) = nan: the first op to give one
    side = b.add("neg", [x], name="side")  # a finite computed value: the graph stores computed values
    b.add("add", [b.add("mul", [r, x], name="blocks.1.out"), side], name="loss")
    with np.errstate(invalid="ignore"):
        graph = graphsvc.backward(b.build())
    model = ViewModel(graph)
    root = json_ok(model.view([]))
    blocks = next(item for item in root["items"] if item["label"] == "blocks")
    assert blocks["label"] == "blocks" and blocks["nonfinite"] == 2 and blocks["first_nonfinite"] == 1
    node = json_ok(model.view([1, 2]))["items"]
    log = next(item for item in node if item["label"] == "blocks.0.log")
    # the nodes replay's nan/inf report names: the first nan value (log(-1), node 1) and the first
    # nan gradient of the backward sweep (x's: d(r*x)/dx = r = nan; r's own is x = -1, finite)
    flagged = [item["label"] for item in node if item["first_nonfinite"] is True]
    assert flagged == ["x", "blocks.0.log"]
    found = nonfinite_findings(False, graph.values, graph.grads)
    assert {what: f.node for what, f in found.items() if f is not None} == {"values": 1, "grads": 0}
    x = next(item for item in node if item["label"] == "x")
    assert x["nonfinite"] == "grad" and x["grad"] == "nan" and x["value"] == "-1"
    assert log["nonfinite"] == "value" and log["first_nonfinite"] is True and log["value"] == "nan"
    assert json_ok(model.node(1))["value"]["nan"] == 1 and math.isnan(float(graph.values[1]))


def test_tensor_nodes_show_dtype_shape_and_a_summary() -> None:
    b = GraphBuilder()
    w = b.leaf(np.arange(6, dtype=np.float32).reshape(2, 3), "layer.w")
    b.add("sum", [w], name="loss")
    model = ViewModel(graphsvc.backward(b.build()))
    items = json_ok(model.view([1]))["items"]
    w_item = next(item for item in items if item["label"] == "layer.w")
    assert (w_item["dtype"], w_item["shape"], w_item["value"]) == ("float32", [2, 3], "[2, 3] float32 mean 2.5")
    assert w_item["max_abs_value"] == 5.0 and w_item["max_abs_grad"] == 1.0
    assert json_ok(model.node(0))["value"]["text"] == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]"


def test_diff_overlay_marks_the_first_divergence() -> None:
    model = ViewModel(seed004(2.0), seed004(2.5), files=["a", "b"])
    meta = json_ok(model.meta())
    assert "diff" in meta["overlays"]
    # a differs (2 against 2.5): the leaf is where the runs were given different inputs, and the
    # first op whose value differs while its parents' agree... has none; diff names a*b
    found = graphsvc.diff(seed004(2.0), seed004(2.5))
    assert found.first_value is not None and found.first_value.name == "body.ab"
    assert meta["diff"]["first_divergence"]["values"]["name"] == "body.ab"
    # a = 2 against 2.5 (b = 3, c = 1): values 6/7/5/35 against 7.5/8.5/5.5/46.75; grads of a, b, c
    # 22/17/5 against 25/22.25/5.5, of a*b, a*b + c, a + b 5/5/7 against 5.5/5.5/8.5; L's grad 1 in both.
    # The backward sweep's first differing gradient is a + b's (node 5: the highest id)
    assert meta["diff"]["first_divergence"]["grads"] == {"name": "body.apb", "node": 5, "op": "add", "a": 7.0, "b": 8.5}
    assert meta["diff"]["differing"] == 7 and meta["diff"]["unaligned"] == 0
    items = json_ok(model.view([1, 2]))["items"]
    assert [(item["label"], item["diff"], item.get("first_divergence")) for item in items] == [
        ("L", "values", None),
        ("in", 3, None),
        ("in.a", "both", None),
        ("in.b", "grads", None),
        ("in.c", "grads", None),
        ("body", 3, None),
        ("body.ab", "both", "values"),
        ("body.abc", "both", None),
        ("body.apb", "both", "grads"),
    ]
    assert json_ok(model.node(3))["diff"] == {
        "status": "both",
        "node_b": 3,
        "differences": [{"kind": "value", "a": "6.0", "b": "7.5"}, {"kind": "grad", "a": "5.0", "b": "5.5"}],
    }


def test_names_are_given_as_text_not_changed() -> None:
    b = GraphBuilder()
    b.leaf(1.0, '<script>alert(1)</script>.x&"')
    model = ViewModel(b.build())
    assert model.view([])["items"][0]["label"] == "<script>alert(1)</script>"


def micrograd_named() -> Graph:
    """A micrograd MLP layer of 2 neurons on inputs x.0, x.1, named as micrograd parameters are
    (``w1.{neuron}.{input}``, ``b1.{neuron}``); products, sums and tanh unnamed, as micrograd makes them."""
    b = GraphBuilder()
    xs = [b.leaf(v, f"x.{i}") for i, v in enumerate([0.5, -1.0])]
    weights = {(0, 0): 0.2, (0, 1): -0.4, (1, 0): 0.3, (1, 1): 0.1}
    outs = []
    for j in range(2):
        w = [b.leaf(weights[j, k], f"w1.{j}.{k}") for k in range(2)]
        s = b.leaf(0.1 * (j + 1), f"b1.{j}")
        for k in range(2):
            s = b.add("add", [s, b.add("mul", [w[k], xs[k]])])
        outs.append(b.add("tanh", [s]))
    b.add("add", outs, name="loss")
    return graphsvc.backward(b.build())


def test_micrograd_parameter_names_group_by_layer_and_neuron() -> None:
    # ids: x.0 0, x.1 1; neuron 0: w 2, 3, b 4, w*x 5, add 6, w*x 7, add 8, tanh 9; neuron 1: 10..17; loss 18
    model = ViewModel(micrograd_named())
    root = json_ok(model.view([]))
    assert labels(root) == [("g1", "x", None), ("g2", "w1", None), ("g5", "b1", None), ("n18", "loss", None)]
    assert [item["nodes"] for item in root["items"][:3]] == [2, 8, 8]  # w*x join w1.j; the sums and tanh, b1
    assert root["edges"] == [
        {"source": "g1", "target": "g2", "count": 4},  # each x into both neurons' products
        {"source": "g2", "target": "g5", "count": 4},  # each product into its running sum
        {"source": "g5", "target": "n18", "count": 2},  # the two tanh into the loss
    ]
    opened = json_ok(model.view([2, 3]))
    assert [
        (item["key"], item["label"], item["path"] if item["kind"] == "group" else None, item["parent"])
        for item in opened["items"]
    ] == [
        ("g1", "x", "x", None),
        ("g5", "b1", "b1", None),
        ("n18", "loss", None, None),
        ("g2", "w1", "w1", None),
        ("g4", "1", "w1.1", "g2"),
        ("g3", "0", "w1.0", "g2"),
        ("n2", "w1.0.0", None, "g3"),
        ("n3", "w1.0.1", None, "g3"),
        ("n5", "#5", None, "g3"),
        ("n7", "#7", None, "g3"),
    ]
    assert opened["edges"] == [  # nodes first, then groups, as sources and as targets
        {"source": "n2", "target": "n5", "count": 1},
        {"source": "n3", "target": "n7", "count": 1},
        {"source": "n5", "target": "g5", "count": 1},
        {"source": "n7", "target": "g5", "count": 1},
        {"source": "g1", "target": "n5", "count": 1},
        {"source": "g1", "target": "n7", "count": 1},
        {"source": "g1", "target": "g4", "count": 2},
        {"source": "g4", "target": "g5", "count": 2},
        {"source": "g5", "target": "n18", "count": 2},
    ]
    # dloss/dw1.0.0 = (1 - tanh(s0)^2) * x.0 with s0 = 0.1 + 0.2*0.5 - 0.4*-1.0 = 0.6
    w000 = next(item for item in opened["items"] if item["label"] == "w1.0.0")
    assert w000["max_abs_grad"] == pytest.approx((1 - math.tanh(0.6) ** 2) * 0.5, rel=1e-15)
    assert model.search("w1.1")["matches"] == [
        {"id": 10, "label": "w1.1.0", "op": "leaf", "groups": [0, 2, 4]},
        {"id": 11, "label": "w1.1.1", "op": "leaf", "groups": [0, 2, 4]},
    ]


def test_captured_module_paths_group_by_module() -> None:
    b = GraphBuilder()
    h = b.leaf(np.ones((2, 3)), "input")
    for i in range(2):
        w = b.leaf(np.full((3, 3), 0.5), f"encoder.layers.{i}.linear1.weight")
        h = b.add("matmul", [h, w], name=f"encoder.layers.{i}.linear1.mm")
        h = b.add("tanh", [h], name=f"encoder.layers.{i}.act.tanh")
    b.add("sum", [h], name="loss.sum")
    model = ViewModel(graphsvc.backward(b.build()))
    root = json_ok(model.view([]))
    # encoder holds only layers: one group, "encoder.layers"; loss holds a node, so it stays
    assert labels(root) == [("g1", "encoder.layers", None), ("g8", "loss", None), ("n0", "input", None)]
    assert root["edges"] == [{"source": "n0", "target": "g1", "count": 1}, {"source": "g1", "target": "g8", "count": 1}]
    opened = json_ok(model.view([1, 2, 3]))
    assert [(item["key"], item["label"], item["parent"]) for item in opened["items"]][2:] == [
        ("g1", "encoder.layers", None),
        ("g5", "1", "g1"),
        ("g2", "0", "g1"),
        ("g4", "act", "g2"),
        ("g3", "linear1", "g2"),
        ("n1", "encoder.layers.0.linear1.weight", "g3"),
        ("n2", "encoder.layers.0.linear1.mm", "g3"),
    ]
    mm = next(item for item in opened["items"] if item["key"] == "n2")
    assert (mm["op"], mm["dtype"], mm["shape"], mm["value"]) == ("matmul", "float64", [2, 3], "[2, 3] float64 mean 1.5")
    assert opened["edges"] == [
        {"source": "n0", "target": "n2", "count": 1},
        {"source": "n1", "target": "n2", "count": 1},
        {"source": "n2", "target": "g4", "count": 1},
        {"source": "g4", "target": "g5", "count": 1},
        {"source": "g5", "target": "g8", "count": 1},
    ]
    assert [m["groups"] for m in model.search("tanh")["matches"]] == [[0, 1, 2, 4], [0, 1, 5, 7]]


def test_edges_of_random_views_agree_with_each_node_mapped_to_the_item_shown() -> None:
    """The edges a view gives (merged group pairs and the shown nodes' own edges) against the
    definition: each edge's ends mapped to the outermost closed group holding them, or themselves."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    nodes = [b.leaf(1.0, f"in.{i}") for i in range(40)]
    for i in range(600):
        first, second = (int(k) for k in rng.integers(0, len(nodes), 2))
        name = None if i % 3 == 0 else f"s{i % 4}.l{i % 7}.op{i}"
        nodes.append(b.add("add", [nodes[first], nodes[second]], name=name))
    graph = b.build()
    model = ViewModel(graph)
    groups = json_ok(model.meta())["groups"]
    for _ in range(30):
        opened = sorted({int(g) for g in rng.integers(1, groups, 4)})
        view = model.view(opened)
        is_open = set(view["open"])
        expected: dict[tuple[str, str], int] = {}
        item = []
        for v in range(graph.num_nodes):
            around = model.node(v)["groups"]
            closed = [g for g in around[1:] if g not in is_open]
            item.append(f"g{closed[0]}" if closed else f"n{v}")
        for child in range(graph.num_nodes):
            for parent in graph.parents(child):
                if item[parent] != item[child]:
                    key = (item[parent], item[child])
                    expected[key] = expected.get(key, 0) + 1
        assert {(e["source"], e["target"]): e["count"] for e in view["edges"]} == expected
        keys = {it["key"] for it in view["items"]}
        assert all(e["source"] in keys and e["target"] in keys for e in view["edges"])


def test_an_empty_graph_has_only_the_root() -> None:
    model = ViewModel(GraphBuilder().build(), files=["empty.msgpack"])
    meta = json_ok(model.meta())
    assert (meta["nodes"], meta["edges"], meta["groups"], meta["ops"], meta["outputs"]) == (0, 0, 1, {}, [])
    assert json_ok(model.view([])) == {"items": [], "edges": [], "open": [0]}
    assert json_ok(model.search("x")) == {"matches": [], "more": False}
    with pytest.raises(UsageError, match=r"^no group 1: this graph has groups 0 to 0$"):
        model.view([1])


def test_one_node_scopes_fold_into_their_scope_only_when_crowded() -> None:
    b = GraphBuilder()
    x = b.leaf(1.0, "x")
    for i in range(FANOUT + 1):  # 65 scopes of one node each inside "crowded": no groups of one
        b.add("neg", [x], name=f"crowded.step{i}.neg")
    for i in range(3):  # 3 such scopes inside "few": each stays a group
        b.add("neg", [x], name=f"few.step{i}.neg")
    model = ViewModel(b.build())
    top = {item["label"]: item for item in model.view([])["items"]}
    assert sorted(top) == ["crowded", "few", "x"]
    crowded, few = top["crowded"], top["few"]
    assert (crowded["nodes"], crowded["items"]) == (65, 2)  # 65 members: two range groups
    ranges = [item for item in model.view([crowded["id"]])["items"] if item["parent"] == f"g{crowded['id']}"]
    first = ranges[0]
    shown = model.view([crowded["id"], first["id"]])["items"]
    inside = [(item["kind"], item["label"]) for item in shown if item["parent"] == f"g{first['id']}"]
    # the range holds the nodes themselves, not 64 groups of one node each
    assert inside[:2] == [("node", "crowded.step0.neg"), ("node", "crowded.step1.neg")] and len(inside) == 64
    assert (few["nodes"], few["items"]) == (3, 3)
    inside_few = [item["label"] for item in model.view([few["id"]])["items"] if item["parent"] == f"g{few['id']}"]
    assert inside_few == ["step0", "step1", "step2"]
