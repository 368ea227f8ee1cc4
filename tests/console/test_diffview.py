"""graphsvc.console.diffview: diff's text, a table on a terminal, plain lines when piped."""

from __future__ import annotations

from typing import Any

import pytest

from graphsvc.console import diffview

DOCUMENT: dict[str, Any] = {
    "equal": False,
    "nodes": {"a": 3, "b": 4, "aligned": 3},
    "first_divergence": {
        "values": {
            "name": "m",
            "node": 2,
            "op": "matmul",
            "a": {"shape": [2, 4], "dtype": "float64", "max_abs_diff": 0.25, "first_index": [0, 1]},
            "b": {"shape": [2, 4], "dtype": "float32", "max_abs_diff": 0.25, "first_index": [0, 1]},
        },
        "grads": None,
    },
    "structural": [
        {"kind": "dtype", "name": None, "node": 0, "node_b": 0, "op": "leaf", "a": "float64", "b": "float32"}
    ],
    "numeric": [],
    "unaligned": [{"graph": "B", "node": 3, "name": "n\n", "op": "neg", "why": "only in B", "other": None}],
    "counts": {"structural": 1, "numeric": 0, "unaligned": 1},
}


def test_plain_text_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    diffview.print_diff(DOCUMENT, as_json=False, limit=None)
    assert capsys.readouterr().out == (
        "A: 3 nodes, B: 4 nodes, 3 aligned: differ\n"
        "first divergence (values): node 2 m (matmul): A float64[2, 4] max|a-b|=0.25 at [0, 1],"
        " B float32[2, 4] max|a-b|=0.25 at [0, 1]\n"
        "first divergence (grads): none\n"
        "1 structural, 0 numeric differences, 1 unaligned nodes\n"
        "dtype\t0\t\tleaf\tfloat64\tfloat32\n"
        "only in B\tB3\tn\\n\tneg\t\t\n"
    )


def test_an_aligned_table_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    drawn: list[Any] = []
    monkeypatch.setattr(diffview, "print_rows", lambda columns, rows: drawn.append((columns, rows)))
    diffview.print_diff(DOCUMENT, as_json=False, limit=None)
    assert drawn == [
        (
            diffview.COLUMNS,
            [["dtype", "0", "", "leaf", "float64", "float32"], ["only in B", "B3", "n\\n", "neg", "", ""]],
        )
    ]
