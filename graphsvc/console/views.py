"""What ``graphsvc order``, ``inspect``, ``ops`` and ``gradcheck`` print, as text or ``--json``.

Each ``print_*`` function takes what the library gave the command and writes it to standard output
(a table on a terminal, tab-separated or ``key: value`` lines in a pipe, or one JSON object).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from graphsvc.console import printing

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from graphsvc.graph import Graph
    from graphsvc.ops import Op, OpRegistry
    from graphsvc.replay.gradcheck import GraphGradcheck
    from graphsvc.testing import GradcheckResult

__all__ = [
    "gradcheck_line",
    "graph_gradcheck_lines",
    "graph_info",
    "info_rows",
    "metadata_text",
    "op_detail",
    "op_detail_lines",
    "op_inputs",
    "op_rows",
    "print_gradcheck",
    "print_graph_gradcheck",
    "print_info",
    "print_op_details",
    "print_ops",
    "print_order",
    "tensor_info_text",
    "validity_line",
]


# -- order ----------------------------------------------------------------------------------------
def print_order(
    graph: Graph, nodes: npt.NDArray[np.int64], algorithm: str, start: int | None, as_json: bool, quiet: bool = False
) -> None:
    """``nodes`` (a reverse topological order, by ``algorithm``, of ``start``'s ancestors or of the
    whole graph) one node a line: id, name, op, parents; in --json, ``{"algorithm", "output", "nodes"}``."""
    from graphsvc.console import listing

    if as_json:
        objects = listing.json_objects(graph, nodes)
        printing.print_json_listing({"algorithm": algorithm, "output": start}, objects, len(nodes), {}, quiet)
    elif printing.wants_table(len(nodes)):
        printing.print_table(printing.NODE_COLUMNS, listing.all_rows(graph, nodes))
    else:
        printing.echo_listing(listing.text(graph, nodes), len(nodes), quiet)


# -- validate -------------------------------------------------------------------------------------
def validity_line(file: str, graph: Graph) -> str:
    """``validate``'s line: ``FILE: valid graphsvc graph, N nodes, M edges`` (``file`` as shown, escaped here)."""
    from graphsvc.text import counted, escape

    return (
        f"{escape(file)}: valid graphsvc graph, {counted(graph.num_nodes, 'node')}, {counted(graph.num_edges, 'edge')}"
    )


# -- inspect --------------------------------------------------------------------------------------
def graph_info(graph: Graph, version: tuple[int, int], file: str, file_size: int | None) -> dict[str, Any]:
    """``inspect --json``'s object: the file (``file`` as shown, its size, None for standard input),
    its format version, sizes, outputs, depth, tensors, ops, the plugins they need and the metadata."""
    from graphsvc.topo import depth

    return {
        "file": file,
        "file_size": file_size,
        "format_version": list(version),
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "leaves": len(graph.leaves()),
        "outputs": [{"id": o, "name": graph.names.get(o)} for o in graph.outputs],
        "depth": depth(graph),
        "has_grads": graph.has_grads,
        "tensors": graph.tensor_summary() if graph.is_tensor_graph else None,
        "ops": graph.op_histogram(),
        "plugins": graph.ops_by_plugin(),
        "metadata": printing.jsonable(graph.metadata),
        **({"modules": module_tree(graph)} if "captured" in graph.metadata else {}),
    }


#: How deep and how many modules ``inspect`` lists (JSON lists them all).
MODULE_DEPTH, MODULE_ROWS = 3, 40


def module_tree(graph: Graph) -> list[dict[str, Any]]:
    """A captured step's modules, from its names (``layers.0.linear1.addmm`` ran in
    ``layers.0.linear1``): each module's path, depth (0 for a top-level one), the nodes that ran in
    it or its submodules, and its parameters (elements of the leaves under it with a stored
    gradient), depth first in the order the step first used each. The modules are those the
    capture lists (``captured.modules``: the model's and any other the step ran): the parts of an
    op it wrote as several (``head.addmm.mm`` and ``head.addmm``) ran in ``head``, whatever a module
    is named. A file without that list (written by other tools) has its modules read from the
    names alone: a prefix that names a node is an op there, not a module."""
    import math

    nodes: dict[str, int] = {}
    parameters: dict[str, int] = {}
    captured = graph.metadata.get("captured")
    listed = captured.get("modules") if isinstance(captured, dict) else None
    # what a prefix of a node's name is: a module the capture listed, or (no list) not a node's name
    modules = {m for m in listed if isinstance(m, str)} if isinstance(listed, list) else None
    named = set(graph.names.values()) if modules is None else set()

    def is_module(path: str) -> bool:
        return path in modules if modules is not None else path not in named

    grads = graph.grads
    for node, name in sorted(graph.names.items()):
        op = graph.op(node)
        if op == "const":  # a constant's name is its op's (mul.scalar), not a module's
            continue
        parts = name.split(".")[:-1]
        size = 0
        if op == "leaf":
            if node in graph.grad_arrays:
                size = int(graph.grad_arrays[node].size)
            elif node not in graph.arrays and grads is not None and not math.isnan(grads[node]):
                size = 1  # a 0-d parameter: its gradient is a number in the column
        for k in range(1, len(parts) + 1):
            path = ".".join(parts[:k])
            if not is_module(path):
                break
            nodes[path] = nodes.get(path, 0) + 1
            parameters[path] = parameters.get(path, 0) + size
    children: dict[str, list[str]] = {}
    for path in nodes:  # first use order
        children.setdefault(path.rpartition(".")[0], []).append(path)
    tree: list[dict[str, Any]] = []
    stack = list(reversed(children.get("", [])))
    while stack:  # depth first, no recursion
        path = stack.pop()
        tree.append({"module": path, "depth": path.count("."), "nodes": nodes[path], "parameters": parameters[path]})
        stack.extend(reversed(children.get(path, [])))
    return tree


def info_rows(graph: Graph, info: dict[str, Any]) -> list[list[str]]:
    """:func:`graph_info` as the (field, value) rows of ``inspect``'s text, names and tags escaped."""
    from graphsvc.text import counted, escape, listed

    leaves = graph.leaves().tolist()
    ops, plugin_list = info["ops"], info["plugins"]
    version = info["format_version"]
    size = "" if info["file_size"] is None else f" ({counted(info['file_size'], 'byte')})"
    return [
        ["file", f"{escape(info['file'])}{size}"],
        ["format version", f"{version[0]}.{version[1]}"],
        ["nodes", f"{graph.num_nodes}"],
        ["edges", f"{graph.num_edges}"],
        ["leaves", f"{len(leaves)} ({listed(map(graph.label, leaves[:10]), total=len(leaves))})" if leaves else "0"],
        ["outputs", listed(map(graph.label, graph.outputs[:10]), total=len(graph.outputs)) or "-"],
        ["depth", f"{info['depth']}"],
        ["gradients stored", f"{'yes' if info['has_grads'] else 'no'}"],
        *([["tensors", tensor_info_text(info["tensors"])]] if info["tensors"] else []),
        ["ops", listed((f"{tag} {count}" for tag, count in sorted(ops.items())), total=len(ops), shown=40)],
        [
            "plugins",
            "; ".join(f"{escape(key)} ({listed(tags, shown=40)})" for key, tags in list(plugin_list.items())[:20])
            + (f"; and {len(plugin_list) - 20:,} more" if len(plugin_list) > 20 else ""),
        ],
        *([["metadata", metadata_text(info["metadata"])]] if info["metadata"] else []),
        *module_rows(info.get("modules")),
    ]


def module_rows(modules: list[dict[str, Any]] | None) -> list[list[str]]:
    """``inspect``'s rows of :func:`module_tree`: a count, then a module a row, indented by depth
    (at most :data:`MODULE_DEPTH` deep and :data:`MODULE_ROWS` rows), its own name, nodes and
    parameters; escaped."""
    from graphsvc.text import escape

    if not modules:
        return []
    shown = [m for m in modules if m["depth"] < MODULE_DEPTH]
    rows = [["modules", f"{len(modules):,} (nodes, parameters)"]]
    for module in shown[:MODULE_ROWS]:
        name = module["module"].rpartition(".")[2]
        rows.append([f"{'  ' * (module['depth'] + 1)}{escape(name)}", f"{module['nodes']:,}, {module['parameters']:,}"])
    if len(modules) > len(rows) - 1:
        rows.append(["  …", f"{len(modules) - (len(rows) - 1):,} more (inspect --json lists every one)"])
    return rows


def metadata_text(metadata: dict[str, Any]) -> str:
    """``inspect``'s metadata line: ``key: value; ...``, a string as it is, anything else as compact
    JSON; escaped, each value cut to 80 characters, at most 20 keys. (json is imported only for a
    list or a map: text output of strings and numbers needs none of it.)"""
    from graphsvc.text import escape, shorten

    def shown(value: Any) -> str:
        if isinstance(value, str):
            text = value
        elif value is None or isinstance(value, bool):
            text = {None: "null", True: "true", False: "false"}[value]
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            import json

            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return shorten(escape(text), 80)

    items = list(metadata.items())
    text = "; ".join(f"{shorten(escape(key), 60)}: {shown(value)}" for key, value in items[:20])
    return text + (f"; and {len(items) - 20:,} more" if len(items) > 20 else "")


def tensor_info_text(info: dict[str, Any]) -> str:
    """``inspect``'s tensors line: how many nodes hold arrays, of which dtypes, and their bytes."""
    from graphsvc.text import counted

    dtypes = ", ".join(f"{dtype} {count}" for dtype, count in info["dtypes"].items())
    holds = "node holds an array" if info["nodes"] == 1 else "nodes hold arrays"
    return (
        f"{info['nodes']} {holds} ({dtypes}); "
        f"{counted(info['value_bytes'], 'byte', thousands=True)} of values, "
        f"{counted(info['grad_bytes'], 'byte', thousands=True)} of gradients"
    )


def print_info(graph: Graph, version: tuple[int, int], file: str, file_size: int | None, as_json: bool) -> None:
    """``inspect``: :func:`graph_info` as one JSON object, or :func:`info_rows` as a table or lines."""
    info = graph_info(graph, version, file, file_size)
    if as_json:
        printing.print_json(info)
        return
    rows = info_rows(graph, info)
    if printing.wants_table(len(rows)):
        printing.print_table((("field", "left"), ("value", "left")), rows, show_header=False)
    else:
        typer.echo("\n".join(f"{key}: {value}" for key, value in rows))


# -- ops and gradcheck ----------------------------------------------------------------------------
#: The fields of an op in ``ops --json`` (and ``vjp``: whether it has one).
OP_FIELDS = ("name", "arity", "variadic", "max_arity", "version", "plugin", "plugin_version", "vectorized", "doc")


#: The fields of an op family in ``ops --json`` (``families``).
FAMILY_FIELDS = ("name", "prefix", "plugin", "plugin_version", "doc")


def op_rows(registry: OpRegistry) -> list[list[str]]:
    """Each op: name, inputs (``1+``: one or more; ``2-3``), version, plugin, kind; each op family
    one row, in name order with the ops (``aten.*``, inputs and version ``-``, kind ``family``); escaped."""
    from graphsvc.text import escape

    rows = []
    for op in registry:
        if not op.variadic:
            arity = str(op.arity)
        else:
            arity = f"{op.arity}+" if op.max_arity is None else f"{op.arity}-{op.max_arity}"
        rows.append((op.name, [escape(op.name), arity, escape(str(op.version)), escape(op.source), op.kind]))
    for family in registry.families():
        rows.append((family.name, [escape(family.name), "-", "-", escape(family.source), "family"]))
    return [row for _, row in sorted(rows, key=lambda row: row[0])]


def print_ops(registry: OpRegistry, as_json: bool) -> None:
    """``ops``: every op and op family, as :func:`op_rows` or in --json ``{"ops": [...], "families": [...]}``."""
    if as_json:
        ops = [{field: getattr(op, field) for field in OP_FIELDS} | {"vjp": op.vjp is not None} for op in registry]
        families = [{field: getattr(family, field) for field in FAMILY_FIELDS} for family in registry.families()]
        printing.print_json({"ops": ops, "families": families})
        return
    columns = (("op", "left"), ("inputs", "right"), ("version", "left"), ("plugin", "left"), ("kind", "left"))
    printing.print_rows(columns, op_rows(registry))


def op_inputs(op: Op) -> str:
    """How many inputs a node of ``op`` has, in words: ``2``, ``1 or more``, ``2 to 3``."""
    if not op.variadic:
        return str(op.arity)
    return f"{op.arity} or more" if op.max_arity is None else f"{op.arity} to {op.max_arity}"


def _json_default(value: Any) -> Any:
    """An attribute's default as JSON holds it: a number, string, bool, null, or a list of them
    (a tuple too); anything else as ``{"repr": "..."}``, the signature's text of it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return printing.jsonable(value)
    if isinstance(value, (list, tuple)):
        items = [_json_default(item) for item in value]
        if not any(isinstance(item, dict) for item in items):
            return items
    return {"repr": repr(value)}


def op_detail(op: Op) -> dict[str, Any]:
    """``ops NAME --json``'s object for one op: the fields of ``ops --json``, its ``kind``, and its
    ``attributes``: each ``{"name", "required"}`` with its ``"default"`` when it has one, in the
    order of ``forward``'s signature (``null``: it takes any, ``**kwargs``, or has no forward;
    the text says which it names)."""
    import inspect

    from graphsvc.ops import attribute_parameters, required_attributes

    read = attribute_parameters(op)
    listed_attributes: list[dict[str, Any]] | None = None
    if read is not None and not read[1]:
        keywords = read[0]
        required = required_attributes(op, keywords)
        listed_attributes = []
        for parameter in keywords:
            entry: dict[str, Any] = {"name": parameter.name, "required": parameter.name in required}
            if parameter.default is not inspect.Parameter.empty:
                entry["default"] = _json_default(parameter.default)
            listed_attributes.append(entry)
    return {field: getattr(op, field) for field in OP_FIELDS} | {
        "vjp": op.vjp is not None,
        "kind": op.kind,
        "attributes": listed_attributes,
    }


def op_detail_lines(op: Op) -> list[str]:
    """``ops NAME``'s text for one op, ``key: value`` lines: op, kind, inputs, attributes (each as
    ``name=default`` or ``name (required)``), plugin, version, then ``doc:`` and the doc's lines,
    indented by two spaces; everything a plugin wrote escaped."""
    import inspect

    from graphsvc.ops import attribute_parameters, required_attributes
    from graphsvc.text import escape

    read = attribute_parameters(op)
    if read is None:
        shown = "any (not checked)" if op.arity else "none (a leaf tag's values come from the file)"
    else:
        keywords, takes_any = read
        required = required_attributes(op, keywords)
        shown = (
            ", ".join(
                f"{escape(p.name)} (required)"
                if p.name in required or p.default is inspect.Parameter.empty
                else f"{escape(p.name)}={escape(repr(p.default))}"
                for p in keywords
            )
            or "none"
        )
        if takes_any:
            shown = "any (not checked)" if shown == "none" else f"{shown}; any others (not checked)"
    inputs = op_inputs(op) + (" (variadic)" if op.variadic else "")
    doc = inspect.cleandoc(op.doc if isinstance(op.doc, str) else str(op.doc)).splitlines() or ["(none)"]
    return [
        f"op: {escape(op.name)}",
        f"kind: {op.kind}",
        f"inputs: {inputs}",
        f"attributes: {shown}",
        f"plugin: {escape(op.source)}",
        f"version: {escape(str(op.version))}",
        "doc:",
        *(f"  {escape(line)}".rstrip() for line in doc),
    ]


def print_op_details(ops: Sequence[Op], as_json: bool) -> None:
    """``ops NAME...``: each op as :func:`op_detail_lines`, a blank line between two, or in --json
    ``{"ops": [...]}`` of :func:`op_detail` objects."""
    if as_json:
        printing.print_json({"ops": [op_detail(op) for op in ops]})
        return
    lines: list[str] = []
    for op in ops:
        lines.extend(([""] if lines else []) + op_detail_lines(op))
    typer.echo("\n".join(lines))


def gradcheck_line(result: GradcheckResult) -> str:
    """One op's gradcheck, as text: ok with its points and errors, FAIL and why, or not checked."""
    from graphsvc.ops import describe_source
    from graphsvc.text import counted, escape, one_line

    name = escape(f"{result.op} ({describe_source(result.plugin, result.plugin_version)})")
    if not result.ok:
        return f"{name}: FAIL: {one_line(result.message)}"
    if result.unchecked:
        return f"{name}: not checked ({result.unchecked})"
    if result.points == 0:
        return f"{name}: nothing to check (a leaf tag)"
    skipped = f", {result.skipped} skipped where the forward is not finite" if result.skipped else ""
    return (
        f"{name}: ok ({counted(result.points, 'point')}{skipped}; max abs error {result.max_abs_error:.1e},"
        f" max rel error {result.max_rel_error:.1e})"
    )


def print_gradcheck(results: Sequence[GradcheckResult], as_json: bool) -> None:
    """``gradcheck``: one line an op, or in --json ``{"ok", "failed", "ops"}``."""
    if as_json:
        failed = [r.op for r in results if not r.ok]
        printing.print_json({"ok": not failed, "failed": failed, "ops": [r.to_dict() for r in results]})
        return
    for result in results:
        typer.echo(gradcheck_line(result))


def _number(number: float) -> str:
    return f"{number:.6g}"


def graph_gradcheck_lines(result: GraphGradcheck) -> list[str]:
    """``gradcheck FILE`` as text: how it checked, a line a leaf, the culprit op and the verdict; escaped."""
    from graphsvc.text import counted, escape, listed

    elements = sum(leaf.elements for leaf in result.leaves)
    cast = " (its float32 numbers cast)" if result.cast_float32 else ""
    lines = [
        f"output {escape(result.output_name)}: {counted(len(result.leaves), 'leaf', plural='leaves')},"
        f" {counted(elements, 'element')}, replayed in float64{cast}"
    ]
    if result.projected:
        lines.append(f"the output is not a scalar: checked is sum(output * r), r random (seed {result.seed})")
    if result.skipped:
        lines.append(f"not perturbed (int64): {listed(result.skipped)}")
    if result.method == "elements":
        how = "each leaf element perturbed"
    else:
        how = "random directions over all the leaves, then one a leaf when one fails"
    lines.append(
        f"{how} ({counted(result.replays, 'replay')}; eps {result.eps:g}, rtol {result.rtol:g}, atol {result.atol:g})"
    )
    for leaf in result.leaves:
        name = escape(leaf.name)
        if leaf.failure is None:
            if result.method == "elements":  # directions: only the leaves that fail, --json lists all
                lines.append(f"  {name}: ok")
            continue
        element, analytic, numeric = leaf.failure
        where = "in a random direction" if element is None else f"at element {element}"
        lines.append(f"  {name}: FAIL {where}: analytic {_number(analytic)}, finite differences {_number(numeric)}")
    culprit = result.culprit
    if culprit is not None:
        lines.append(
            f"wrong derivative: node {culprit.node} ({escape(culprit.name)}), op {escape(culprit.op)}"
            f" from {escape(culprit.plugin)}: input {culprit.input} gets {_number(culprit.analytic)},"
            f" finite differences {_number(culprit.numeric)}"
        )
    elif not result.passed:
        lines.append("no single op's derivative disagrees at its inputs")
    if result.passed:
        lines.append(f"ok: the gradient with respect to {counted(len(result.leaves), 'leaf', plural='leaves')} matches")
    else:
        lines.append(f"FAIL: {listed(result.failed)}")
    return lines


def print_graph_gradcheck(result: GraphGradcheck, as_json: bool) -> None:
    """``gradcheck FILE``: :func:`graph_gradcheck_lines`, or in --json the result's fields."""
    if as_json:
        printing.print_json(result.to_dict())
        return
    typer.echo("\n".join(graph_gradcheck_lines(result)))
