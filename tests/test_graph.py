"""The column model and the builder: layout, derived columns, and every structural rule."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

import graphsvc
from examples.make_examples import seed000  # the shipped example, built with GraphBuilder
from graphsvc.errors import GraphStructureError, UsageError
from graphsvc.graph import CONST, LEAF, MAX_OPS, Graph, GraphBuilder, OpSource, copy_maps, data_copy


def test_builder_lays_out_columns_in_csr_form() -> None:
    g = seed000()
    assert g.op_table == [LEAF, "sin", "exp", CONST, "add", "log"]
    assert g.op_codes.tolist() == [0, 1, 2, 3, 4, 5]
    assert g.parent_offsets.tolist() == [0, 0, 1, 2, 2, 4, 5]
    assert g.parent_indices.tolist() == [0, 1, 3, 2, 4]
    assert (g.op_codes.dtype.str, g.parent_offsets.dtype.str, g.parent_indices.dtype.str) == ("<u2", "<i8", "<i4")
    assert g.values.dtype.str == "<f8"
    assert g.values[0] == 0.5 and g.values[3] == 1.0 and math.isnan(g.values[5])
    assert g.grads is None
    assert g.names == {0: "z", 1: "t1", 2: "t2", 3: "1", 4: "t3", 5: "y"}
    assert g.outputs == [5]
    assert (g.num_nodes, g.num_edges) == (6, 5)


def test_parents_keep_order_and_repeats() -> None:
    b = GraphBuilder()
    x = b.leaf(3.0, name="x")
    w = b.leaf(2.0, name="w")
    b.add("mul", ["w", x], name="wx")
    b.add("mul", [x, x], name="xx")
    g = b.build()
    assert g.parents(2) == [w, x]
    assert g.parents(3) == [x, x]
    assert g.child_counts().tolist() == [3, 1, 0, 0]
    assert g.child_ids().tolist() == [2, 2, 3, 3]
    assert g.sinks().tolist() == [2, 3]
    assert g.leaves().tolist() == [0, 1]
    assert g.outputs == [2, 3]  # default outputs: the sinks
    assert g.op_histogram() == {"leaf": 2, "mul": 2}


def test_grads_column_appears_when_any_node_has_a_grad() -> None:
    b = GraphBuilder()
    a = b.leaf(2.0, grad=4.0)
    b.add("neg", [a], value=-2.0)
    g = b.build()
    assert g.grads is not None
    assert g.grads[0] == 4.0 and math.isnan(g.grads[1])


def test_node_id_resolves_names_and_ids() -> None:
    g = seed000()
    assert g.node_id("t3") == 4
    assert g.node_id(4) == 4
    assert g.node_id("4") == 4
    assert g.node_id("1") == 3  # a name wins over an id spelled the same
    assert g.label(3) == "1"
    with pytest.raises(UsageError, match=r"^no node named 'nope'$"):
        g.node_id("nope")
    with pytest.raises(UsageError, match=r"^no node with id 6 \(the graph has 6 nodes\)$"):
        g.node_id(6)
    with pytest.raises(UsageError, match=r"^no node with id -1 \(the graph has 6 nodes\)$"):
        g.node_id("-1")
    for text in ("--1", "\u00b2", "1_0", " 4", "+4"):  # int() would take some, or crash on others
        with pytest.raises(UsageError, match=rf"^no node named {re.escape(repr(text))}$"):
            g.node_id(text)


def test_value_and_grad_by_id_or_name() -> None:
    b = GraphBuilder()
    x = b.leaf(2.0, name="x", grad=0.5)
    b.add("neg", [x], value=-2.0, name="y", grad=1.0)
    g = b.build()
    assert (g.value("x"), g.value(1), g.value("1"), g.grad("x"), g.grad(np.int64(1))) == (2.0, -2.0, -2.0, 0.5, 1.0)
    assert type(g.value("x")) is float and type(g.grad("y")) is float
    g.grads = None
    with pytest.raises(UsageError) as info:
        g.grad("y")
    assert str(info.value) == (
        "the graph holds no gradients, so node y has none: replay it with graphsvc.backward(graph) first"
    )
    with pytest.raises(UsageError, match=r"^no node named 'z'$"):
        g.value("z")


@pytest.mark.parametrize("ref", [1.0, True, None, b"x"])
def test_node_id_refuses_what_is_neither_an_id_nor_a_name(ref: object) -> None:
    with pytest.raises(TypeError) as info:
        seed000().node_id(ref)  # type: ignore[arg-type]
    assert str(info.value) == f"a node is given by its id (an int) or its name (a str), not {type(ref).__name__}"


def test_copy_is_deep_and_writable() -> None:
    g = seed000()
    c = g.copy()
    c.values[0] = 9.0
    c.names[0] = "zz"
    assert g.values[0] == 0.5 and g.names[0] == "z"


def _attributed() -> tuple[GraphBuilder, dict[str, Any], dict[str, Any]]:
    attrs: dict[str, Any] = {"shape": [3, 2], "spec": {"axes": [[0], [1]]}, "eps": 1e-5}
    metadata: dict[str, Any] = {"run": {"steps": [1, 2]}}
    b = GraphBuilder()
    b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("reshape", ["x"], attrs=attrs, name="r")
    return b, attrs, metadata


def _change_in_place(attrs: dict[str, Any], metadata: dict[str, Any]) -> None:
    attrs["shape"][0] = 99
    attrs["spec"]["axes"][1].append(7)
    attrs["spec"]["new"] = 1
    metadata["run"]["steps"].append(3)


EXPECTED_ATTRS = {"shape": [3, 2], "spec": {"axes": [[0], [1]]}, "eps": 1e-5}
EXPECTED_METADATA = {"run": {"steps": [1, 2]}}


def test_what_the_builder_is_given_is_copied_to_the_bottom() -> None:
    b, attrs, metadata = _attributed()
    g = b.build(metadata=metadata)
    _change_in_place(attrs, metadata)  # the caller's lists and maps, changed after the fact
    assert g.attrs[1] == EXPECTED_ATTRS and g.metadata == EXPECTED_METADATA
    _change_in_place(g.attrs[1], g.metadata)  # one build's, changed: not the builder's next build
    assert b.build(metadata=EXPECTED_METADATA).attrs[1] == EXPECTED_ATTRS


def test_a_copy_shares_no_list_or_map_of_the_attributes_or_metadata() -> None:
    b, _, metadata = _attributed()
    g = b.build(metadata=metadata)
    c = g.copy()
    _change_in_place(c.attrs[1], c.metadata)
    assert g.attrs[1] == EXPECTED_ATTRS and g.metadata == EXPECTED_METADATA
    _change_in_place(g.attrs[1], g.metadata)
    assert c.attrs[1]["shape"] == [99, 2]  # changed once, by the first call, not twice


def test_a_replays_result_shares_no_list_or_map_with_the_graph_replayed() -> None:
    b = GraphBuilder()
    b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("reshape", ["x"], attrs={"shape": [3, 2]}, name="r")
    b.add("sum", ["r"], name="loss")
    g = b.build(metadata={"run": {"steps": [1, 2]}})
    result = graphsvc.backward(g, output="loss")
    result.attrs[1]["shape"][0] = 6
    result.metadata["run"]["steps"].append(3)
    assert g.attrs[1] == {"shape": [3, 2]} and g.metadata == {"run": {"steps": [1, 2]}}
    assert graphsvc.backward(g, output="loss").grad("x").shape == (2, 3)  # the graph replays as before


def test_data_copy_keeps_shared_and_self_holding_containers_and_any_nesting() -> None:
    shared = [1.0]
    looped: list[Any] = ["a"]
    looped.append(looped)
    copied = data_copy({"a": shared, "b": shared, "loop": looped, "t": (1, 2), "s": "x"})
    assert copied["a"] is copied["b"] and copied["a"] is not shared and copied["a"] == [1.0]
    assert copied["loop"][1] is copied["loop"] and copied["loop"] is not looped
    flat = [3, 2.5, "x", None, True, b"y"]  # a shape, axes: copied without a walk
    assert data_copy(flat) == flat and data_copy(flat) is not flat
    holding = [1, np.arange(2.0)]
    assert data_copy(holding)[1] is not holding[1] and data_copy(holding)[1].tolist() == [0.0, 1.0]
    deep: list[Any] = []
    tail = deep
    for _ in range(100_000):  # far past Python's recursion limit
        tail.append([])
        tail = tail[0]
    result = data_copy(deep)
    for _ in range(100_000):
        result = result[0]
    assert result == []


def test_an_array_among_the_attributes_is_copied_a_tuple_shared() -> None:
    shape, pad = np.array([3, 2]), ([1], [0])
    b = GraphBuilder()
    b.leaf(np.ones((2, 3), dtype=np.float32), name="x")
    b.add("reshape", ["x"], attrs={"shape": shape, "pad": pad, "nested": [shape]})
    g = b.build()
    shape[0] = 6
    assert g.attrs[1]["shape"].tolist() == [3, 2] and g.attrs[1]["nested"][0].tolist() == [3, 2]
    c = g.copy()
    c.attrs[1]["shape"][0] = 1
    assert g.attrs[1]["shape"].tolist() == [3, 2]
    assert c.attrs[1]["pad"] is pad  # a tuple is shared, with what it holds (as documented)


def test_copy_maps_copies_maps_of_numbers_alone_a_map_at_a_time() -> None:
    maps = {node: {"exponent": float(node)} for node in range(1000)}
    copied = copy_maps(maps)
    assert copied == maps and all(copied[node] is not maps[node] for node in maps)


def test_binary_graph_of_a_million_nodes_stays_under_100_bytes_a_node() -> None:
    n = 1_000_000
    g = Graph(
        op_table=["leaf", "add"],
        op_codes=np.ones(n, dtype="<u2"),
        parent_offsets=np.arange(0, 2 * n + 1, 2, dtype="<i8"),
        parent_indices=np.zeros(2 * n, dtype="<i4"),
        values=np.zeros(n, dtype="<f8"),
        grads=np.zeros(n, dtype="<f8"),
    )
    columns = (g.op_codes, g.parent_offsets, g.parent_indices, g.values, g.grads)
    # op code 2 + offset 8 + two parent indices 8 + value 8 + grad 8 bytes, plus one offset
    assert sum(a.nbytes for a in columns if a is not None) == 34 * n + 8


BEFORE = "(parents must be added before their children)"


def _i4(ids: list[int]) -> np.ndarray:
    return np.array(ids, dtype="<i4")


def _i8(ids: list[int]) -> np.ndarray:
    return np.array(ids, dtype="<i8")


def _u2(ids: list[int]) -> np.ndarray:
    return np.array(ids, dtype="<u2")


# -- builder errors ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda b: b.add("f", [1]), "node 1 lists itself as a parent (a self-loop)"),
        (
            lambda b: b.add("f", [5]),
            f"node 1: parent 5 does not exist yet {BEFORE}",
        ),
        (
            lambda b: b.add("f", [-1]),
            f"node 1: parent -1 does not exist yet {BEFORE}",
        ),
        (lambda b: b.add("f", ["ghost"]), "node 1: no earlier node is named 'ghost'"),
        (lambda b: b.add("f", [1.0]), "node 1: parent 1.0 is not a node id or name"),
        (lambda b: b.add("f", [True]), "node 1: parent True is not a node id or name"),
        (lambda b: b.add("", [0]), "op tag '' is not a non-empty string"),
        (lambda b: b.add("leaf", [0]), "a leaf node cannot have parents"),
        (lambda b: b.add("const", [0]), "a const node cannot have parents"),
        (lambda b: b.leaf(1.0, name="a"), "name 'a' is already used by node 0"),
        (lambda b: b.leaf(1.0, name=""), "name '' is not a non-empty string"),
    ],
)
def test_builder_refuses_bad_nodes(build, message: str) -> None:  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    b.leaf(1.0, name="a")
    with pytest.raises(GraphStructureError) as info:
        build(b)
    assert str(info.value) == message


def test_builder_refuses_unknown_outputs() -> None:
    b = GraphBuilder()
    b.leaf()
    with pytest.raises(UsageError, match=r"^no node with id 3 \(the graph has 1 node\)$"):
        b.build(outputs=[3])


# -- Graph.check ------------------------------------------------------------------------------------
def _broken(**change: object) -> Graph:
    g = seed000().copy()
    for key, value in change.items():
        setattr(g, key, value)
    return g


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"values": np.zeros(5)}, "column values has 5 entries, expected 6"),
        ({"grads": np.zeros(7)}, "column grads has 7 entries, expected 6"),
        ({"parent_offsets": np.array([1, 1, 1, 2, 2, 4, 5])}, "parent_offsets must start at 0, not 1"),
        (
            {"parent_offsets": _i8([0, 0, 1, 2, 2, 4, 4])},
            "parent_offsets ends at 4 but there are 5 parent indices",
        ),
        ({"parent_offsets": np.array([0, 0, 3, 2, 2, 4, 5])}, "parent_offsets decreases at node 2"),
        (
            {"op_codes": _u2([0, 1, 2, 3, 4, 6])},
            "node 5 has op code 6, but the op table has 6 entries",
        ),
        ({"parent_indices": _i4([0, 1, 3, -2, 4])}, "node 4 has a negative parent index -2"),
        (
            {"parent_indices": _i4([0, 1, 3, 9, 4])},
            "node 4 has parent 9, which does not exist (the graph has 6 nodes)",
        ),
        ({"parent_indices": _i4([0, 1, 3, 4, 4])}, "node 4 lists itself as a parent (a self-loop)"),
        (
            {"parent_indices": _i4([0, 1, 5, 2, 4])},
            "node 4 has parent 5, which does not come before it: "
            "node ids must be in topological order (every parent id smaller than its child's)",
        ),
        ({"op_codes": _u2([0, 1, 2, 3, 4, 0])}, "node 5 is a leaf but has parents"),
        ({"op_table": ["leaf", "sin", "exp", "const", "add", "sin"]}, "op table lists 'sin' twice"),
        ({"op_table": ["leaf", "sin", "exp", "const", "add", ""]}, "op tag '' is not a non-empty string"),
        ({"names": {0: "z", 4: "z"}}, "name 'z' is used by nodes 0 and 4"),
        ({"names": {6: "w"}}, "name 'w' is given to node 6, which does not exist"),
        ({"names": {1: ""}}, "node 1 has a name that is not a non-empty string"),
        ({"attrs": {9: {}}}, "attributes are given to node 9, which does not exist"),
        ({"attrs": {1: {1: 2}}}, "attributes of node 1 must be a map with string keys"),
        ({"outputs": [6]}, "output 6 does not exist (the graph has 6 nodes)"),
    ],
)
def test_check_names_the_broken_rule(change: dict[str, object], message: str) -> None:
    with pytest.raises(GraphStructureError) as info:
        _broken(**change).check()
    assert str(info.value) == message


def test_the_builder_refuses_more_op_tags_than_op_codes_hold() -> None:
    b = GraphBuilder()
    for i in range(MAX_OPS + 1):
        b.add(f"op{i}")
    with pytest.raises(GraphStructureError, match=r"^too many ops: 65537 \(at most 65536\)$"):
        b.build()


def test_ops_by_plugin_groups_the_tags_by_recorded_source() -> None:
    b = GraphBuilder()
    x = b.leaf(1.0)
    b.add("tanh", [b.add("softplus", [b.add("mul", [x, x])])])
    b.op_sources = {"softplus": OpSource("graphsvc-activations", "0.1.0"), "mul": OpSource("graphsvc", None)}
    assert b.build().ops_by_plugin() == {
        "graphsvc ?": ["mul"],
        "graphsvc-activations 0.1.0": ["softplus"],
        "graphsvc (builtin)": ["leaf", "tanh"],
    }


# -- has_grads and tensor_summary -----------------------------------------------------------------
def test_has_grads_sees_the_column_and_the_tensor_gradients() -> None:
    b = GraphBuilder()
    b.add("neg", [b.leaf(2.0, name="a")])
    graph = b.build()
    assert graph.has_grads is False
    graph.grads = np.zeros(2)
    assert graph.has_grads is True
    graph.grads = None
    graph.grad_arrays = {0: np.zeros(3)}
    assert graph.has_grads is True


def test_tensor_summary_counts_dtypes_and_bytes() -> None:
    b = GraphBuilder()
    x = b.const(np.ones((2, 3), dtype=np.float32), name="x")
    w = b.leaf(np.ones((3, 4)), name="w")
    b.const(np.array([0, 1], dtype=np.int64), name="labels")
    b.add("matmul", [x, w], name="y")
    graph = b.build()
    assert graph.tensor_summary() == {
        "nodes": 3,
        "dtypes": {"float32": 1, "float64": 1, "int64": 1},
        "value_bytes": 6 * 4 + 12 * 8 + 2 * 8,
        "grad_bytes": 0,
    }
    graph.grad_arrays = {1: np.zeros((3, 4), dtype=np.float32)}
    assert graph.tensor_summary()["grad_bytes"] == 48
    scalars = GraphBuilder()
    scalars.leaf(1.0)
    assert scalars.build().tensor_summary() == {"nodes": 0, "dtypes": {}, "value_bytes": 0, "grad_bytes": 0}


# -- the checks' fast paths -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("names", "ok"),
    [
        ({}, True),
        ({0: "a", 2: "b"}, True),
        ({0: "a", 2: "a"}, False),  # a name twice
        ({0: ""}, False),
        ({0: 1}, False),
        ({3: "a"}, False),  # no such node
        ({-1: "a"}, False),
        ({True: "a"}, False),  # not an int
    ],
)
def test_the_names_are_checked_at_once_and_any_doubt_left_to_the_loop(names: dict[int, str], ok: bool) -> None:
    from graphsvc.graph import _names_ok

    assert _names_ok(names, 3) is ok


@pytest.mark.parametrize(
    ("arrays", "ok"),
    [
        ({0: np.zeros(2)}, True),
        ({0: np.zeros(2, dtype=np.float32), 1: np.zeros((), dtype=np.int64)}, True),
        ({0: np.zeros(2, dtype=">f8")}, False),  # not this machine's float64
        ({0: np.zeros(2, dtype=np.int32)}, False),
        ({0: np.zeros([1] * 33)}, False),
        ({3: np.zeros(2)}, False),
        ({0: [1.0]}, False),
        ({0: np.ma.zeros(2)}, False),  # a subclass: for the loop to judge
    ],
)
def test_the_arrays_are_checked_at_once_and_any_doubt_left_to_the_loop(arrays: dict[int, object], ok: bool) -> None:
    from graphsvc.graph import _arrays_ok

    assert _arrays_ok(arrays, 3) is ok  # type: ignore[arg-type]


def test_a_gradient_of_another_shape_is_found_by_the_loop_after_the_column_check() -> None:
    b = GraphBuilder()
    x = b.leaf(np.zeros((2, 3)), name="x")
    b.add("neg", [x], value=np.zeros((2, 3)))
    graph = b.build()
    graph.grad_arrays = {0: np.zeros((2, 3)), 1: np.zeros((3, 2))}
    with pytest.raises(GraphStructureError) as info:
        graph.check()
    assert str(info.value) == "node 1's gradient array has shape [3, 2], but its value array has shape [2, 3]"
    graph.grad_arrays = {1: np.zeros((2, 3))}
    graph.check()


@pytest.mark.parametrize(
    ("attrs", "ok"),
    [
        ({}, True),
        ({0: {"axis": 1}, 2: {}}, True),
        ({0: {"a": {1: 2}}}, True),  # nested maps are the nesting check's (graphsvc.format.document)
        ({0: {1: 2}}, False),  # a key that is not a string
        ({0: {"a": 1, b"b": 2}}, False),
        ({0: [("a", 1)]}, False),  # not a map
        ({3: {}}, False),  # no such node
        ({-1: {}}, False),
        ({True: {}}, False),  # not an int
    ],
)
def test_the_attributes_are_checked_at_once_and_any_doubt_left_to_the_loop(attrs: dict[int, object], ok: bool) -> None:
    from graphsvc.graph import _attrs_ok

    assert _attrs_ok(attrs, 3) is ok  # type: ignore[arg-type]


def test_arrays_checked_leaves_out_only_the_array_rules() -> None:
    b = GraphBuilder()
    b.add("neg", [b.leaf(np.zeros((2, 3)), name="x")], value=np.zeros((2, 3)))
    graph = b.build()
    graph.grad_arrays = {1: np.zeros((3, 2))}
    graph.check(arrays_checked=True)  # the caller vouches for the arrays
    with pytest.raises(GraphStructureError, match=r"^node 1's gradient array has shape \[3, 2\]"):
        graph.check()
    graph.outputs = [7]
    with pytest.raises(GraphStructureError, match=r"^output 7 does not exist"):
        graph.check(arrays_checked=True)


def test_a_name_lookup_follows_changes_to_the_names() -> None:
    """node_id finds a name through an index made on first use; a rename, a removal, a new name or
    a new names dict after that still gives the answer a scan of the names gives."""
    b = GraphBuilder()
    x = b.leaf(1.0, name="x")
    y = b.add("neg", [x], name="y")
    z = b.add("neg", [y], name="z")
    graph = b.build()
    assert [graph.node_id(n) for n in ("x", "y", "z", "2")] == [x, y, z, 2]
    graph.names[y] = "why"  # renamed: the old name is gone, the new one found
    assert graph.node_id("why") == y
    with pytest.raises(UsageError, match="no node named 'y'"):
        graph.node_id("y")
    del graph.names[z]
    with pytest.raises(UsageError, match="no node named 'z'"):
        graph.node_id("z")
    graph.names[z] = "x2"
    assert graph.node_id("x2") == z
    graph.names = {x: "z", z: "x"}  # a new dict, the names swapped
    assert (graph.node_id("z"), graph.node_id("x")) == (x, z)
    graph.names[y] = "1"  # a name of digits is a name first, an id only when no node has it
    assert graph.node_id("1") == y and graph.node_id("0") == 0


def test_a_name_no_node_has_costs_a_scan_and_keeps_the_index() -> None:
    """An id written as text (as the CLI's options give it) or a name no node has: one scan, as
    before the index, not a new index per lookup (three times a scan's cost on a big graph);
    a name that an unchecked graph's unhashable name sits beside is found by the scan."""
    b = GraphBuilder()
    x = b.leaf(1.0, name="x")
    b.add("neg", [x], name="y")
    graph = b.build()
    assert graph.node_id("y") == 1
    index = graph._by_name
    assert graph.node_id("0") == 0
    with pytest.raises(UsageError, match="no node named 'nope'"):
        graph.node_id("nope")
    assert graph._by_name is index
    graph.names[0] = ["x"]  # type: ignore[assignment]  # broken, as a graph not checked yet may be
    assert graph.node_id("y") == 1
    with pytest.raises(UsageError, match="no node named 'x'"):
        graph.node_id("x")


# -- values and gradients a scalar node cannot hold -------------------------------------------------
def _builder_with_a_leaf() -> tuple[GraphBuilder, int]:
    b = GraphBuilder()
    return b, b.leaf(1.0)


BAD_NUMBERS: list[tuple[Any, str]] = [
    (
        lambda: GraphBuilder().leaf("1.0"),
        "node 0: a value must be a number (a float or an int) or a numpy array, not str",
    ),
    (
        lambda: GraphBuilder().leaf(True),
        "node 0: a value must be a number (a float or an int) or a numpy array, not bool",
    ),
    (
        lambda: GraphBuilder().leaf(None),
        "node 0: a value must be a number (a float or an int) or a numpy array, not NoneType",
    ),
    (
        lambda: GraphBuilder().leaf([1.0, 2.0]),
        "node 0: a value must be a number (a float or an int) or a numpy array, not list",
    ),
    (
        lambda: GraphBuilder().leaf(1.0, grad="2"),
        "node 0: a gradient must be a number (a float or an int) or a numpy array, not str",
    ),
    (
        lambda: GraphBuilder().leaf(1.0, grad=False),
        "node 0: a gradient must be a number (a float or an int) or a numpy array, not bool",
    ),
    (
        lambda: GraphBuilder().const("3"),
        "node 0: a value must be a number (a float or an int) or a numpy array, not str",
    ),
    (
        lambda: GraphBuilder().const(1j),
        "node 0: a value must be a number (a float or an int) or a numpy array, not complex",
    ),
    (
        lambda: GraphBuilder().add("mul", [], value="6"),
        "node 0: a value must be a number (a float or an int) or a numpy array, not str",
    ),
    (
        lambda: (lambda b, x: b.add("neg", [x], grad=True))(*_builder_with_a_leaf()),
        "node 1: a gradient must be a number (a float or an int) or a numpy array, not bool",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD_NUMBERS, ids=[f"{i}" for i in range(len(BAD_NUMBERS))])
def test_a_value_or_gradient_that_is_not_a_number_is_a_type_error(call: Any, message: str) -> None:
    """A string ("1.0") and a bool were taken as floats; None and lists raised float()'s own error."""
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: GraphBuilder().leaf(10**400), "node 0: a value of an integer of 401 digits is out of float64's range"),
        (
            lambda: GraphBuilder().const(-(10**400)),
            "node 0: a value of an integer of 401 digits is out of float64's range",
        ),
        (
            lambda: GraphBuilder().leaf(0.0, grad=2**1024),
            "node 0: a gradient of an integer of 309 digits is out of float64's range",
        ),
        (
            lambda: GraphBuilder().add("add", [], value=__import__("fractions").Fraction(10**400, 3)),
            "node 0: a value of a Fraction is out of float64's range",
        ),
    ],
)
def test_a_number_past_float64s_range_is_a_structure_error(call: Any, message: str) -> None:
    """It raised OverflowError: int too large to convert to float."""
    with pytest.raises(GraphStructureError) as info:
        call()
    assert str(info.value) == message


def test_numbers_of_every_real_kind_are_taken() -> None:
    import fractions

    b = GraphBuilder()
    nodes = [b.leaf(2), b.leaf(np.float64(0.5)), b.leaf(np.int64(3)), b.leaf(fractions.Fraction(1, 4)), b.const(-1e308)]
    graph = b.build()
    assert [graph.value(n) for n in nodes] == [2.0, 0.5, 3.0, 0.25, -1e308]
    assert graph.arrays.keys() == {2}  # a numpy integer is a 0-d int64 array, as before


# -- an unknown name: the close ones suggested, the wanted ones listed --------------------------------
def test_close_names_ignore_case_then_ask_difflib() -> None:
    from graphsvc.graph import close_names

    assert close_names("A", ["a", "b"]) == ["a"]
    assert close_names("wieght", ["weight", "bias", 3]) == ["weight"]
    assert close_names("zzz", ["a", "b"]) == []


def test_unknown_name_lists_what_the_caller_wants() -> None:
    b = GraphBuilder()
    xs = [b.leaf(float(i), name=f"x{i}") for i in range(12)]
    b.add("add", [xs[0], xs[1]], name="total")
    graph = b.build(outputs=["total"])
    with pytest.raises(GraphStructureError, match=r"^node 13: no earlier node is named 'X1'; did you mean 'x1'\?$"):
        b.add("neg", ["X1"])
    assert graph.unknown_name("X3") == "no node named 'X3'; did you mean 'x3'?"
    assert graph.unknown_name("totl", "outputs") == "no node named 'totl'; did you mean 'total'? (the outputs: total)"
    assert graph.unknown_name("nope", "leaves") == (
        "no node named 'nope' (the leaves: x0, x1, x2, x3, x4, x5, x6, x7, x8, x9 and 2 more)"
    )
    with pytest.raises(UsageError, match=r"^no node named 'y' \(the outputs: total\)$"):
        graph.node_id("y", "outputs")
    long = "q" * 500
    assert graph.unknown_name(long) == f"no node named '{'q' * 79}... (502 characters)"


def test_builtin_tags_are_the_builtin_ops_and_name_their_plugin() -> None:
    from graphsvc.graph import BUILTIN_TAGS
    from graphsvc.ops.builtin import BUILTIN_OPS

    assert {op.name for op in BUILTIN_OPS} == BUILTIN_TAGS
    b = GraphBuilder()
    b.add("cube", [b.leaf(2.0, name="x")])
    graph = b.build()
    assert graph.ops_by_plugin() == {"graphsvc (builtin)": ["leaf"], "unknown": ["cube"]}


def test_a_node_without_a_gradient_where_others_have_theirs_says_so() -> None:
    from graphsvc.errors import UsageError
    from graphsvc.graph import graph_from_lists

    # as a captured step stores them: arrays of gradients, none for the input
    graph = graph_from_lists(
        ["leaf", "exp"], [0, 1], [0], [math.nan, math.nan], names={0: "x", 1: "y"},
        arrays={0: np.ones(2), 1: np.exp(np.ones(2))}, grad_arrays={1: np.ones(2)},
    )  # fmt: skip
    with pytest.raises(UsageError) as info:
        graph.grad("x")
    assert str(info.value) == "node x has no gradient stored (the graph stores those of 1 other node)"
    assert graph.grad("y").tolist() == [1.0, 1.0]
