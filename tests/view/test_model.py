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
    assert [item["label"] for item in node if item["first_nonfinite"] is True] == ["blocks.0.log"]
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
    items = {item["label"]: item for item in json_ok(model.view([1, 2]))["items"]}
    assert items["body.ab"]["first_divergence"] in ("values", "both") and items["in.a"]["diff"] == "both"
    assert items["in.c"]["diff"] == "grads"  # c's value agrees; dL/dc = a + b does not
    assert items["body"]["diff"] == 3


def test_names_are_given_as_text_not_changed() -> None:
    b = GraphBuilder()
    b.leaf(1.0, '<script>alert(1)</script>.x&"')
    model = ViewModel(b.build())
    assert model.view([])["items"][0]["label"] == "<script>alert(1)</script>"
