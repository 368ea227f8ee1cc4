"""What ``graphsvc diff`` prints: the JSON document, or text (an aligned table on a terminal, plain
tab-separated lines when piped). It reads :meth:`graphsvc.diff.GraphDiff.to_json`'s document (the
diff room sits above this one), and escapes every name and value from the files."""

from __future__ import annotations

from typing import Any

import typer

from graphsvc.console.printing import jsonable, print_json, print_rows
from graphsvc.text import escape

COLUMNS = (("kind", "left"), ("node", "right"), ("name", "left"), ("op", "left"), ("A", "left"), ("B", "left"))


def number_text(value: Any) -> str:
    """A number or an array's summary, as one cell."""
    if isinstance(value, dict) and "shape" in value:
        text = f"{value['dtype']}{value['shape']}"
        if "max_abs_diff" in value:
            text += f" max|a-b|={value['max_abs_diff']:.6g} at {value['first_index']}"
        return text
    if isinstance(value, float):
        return repr(value)
    return escape(str(value))


def _name(name: str | None) -> str:
    return "" if name is None else escape(name)


def _divergence(what: str, node: dict[str, Any] | None) -> str:
    if node is None:
        return f"first divergence ({what}): none"
    return (
        f"first divergence ({what}): node {node['node']} {_name(node['name']) or '-'} ({escape(node['op'])}):"
        f" A {number_text(node['a'])}, B {number_text(node['b'])}"
    )


def print_diff(document: dict[str, Any], as_json: bool, limit: int | None) -> None:
    """Print what diff found (``document``: GraphDiff.to_json(limit)); as JSON, the numbers and
    attributes compared as :func:`graphsvc.console.printing.jsonable` writes them (nan and inf as
    strings, bin data as ``{"$bin": hex}``)."""
    if as_json:
        print_json(jsonable(document))
        return
    nodes, counts = document["nodes"], document["counts"]
    verdict = "equal within tolerance" if document["equal"] else "differ"
    typer.echo(f"A: {nodes['a']:,} nodes, B: {nodes['b']:,} nodes, {nodes['aligned']:,} aligned: {verdict}")
    typer.echo(_divergence("values", document["first_divergence"]["values"]))
    typer.echo(_divergence("grads", document["first_divergence"]["grads"]))
    rows: list[list[str]] = []
    for item in document["structural"] + document["numeric"]:
        rows.append(
            [
                item["kind"],
                str(item["node"]),
                _name(item["name"]),
                escape(item["op"]),
                number_text(item["a"]),
                number_text(item["b"]),
            ]
        )
    for item in document["unaligned"]:
        other = "" if item["other"] is None else f"B node {item['other']}"
        rows.append([item["why"], f"{item['graph']}{item['node']}", _name(item["name"]), escape(item["op"]), "", other])
    if rows:
        typer.echo(
            f"{counts['structural']:,} structural, {counts['numeric']:,} numeric differences,"
            f" {counts['unaligned']:,} unaligned nodes"
        )
        print_rows(COLUMNS, rows)
    shown = len(document["structural"]) + len(document["numeric"]) + len(document["unaligned"])
    total = counts["structural"] + counts["numeric"] + counts["unaligned"]
    if limit is not None and shown < total:
        typer.echo(f"... {total - shown:,} more (--limit {limit})")
