"""Print the annotated hex dump of the worked example in FORMAT.md §11, or with ``--v2`` of the
tensor graph of §15 (run from the repository root).

    python schemas/examples/annotate_worked.py [--v2]

The notes are written here by hand; the bytes come from the real encoder, and the script stops if
the notes do not cover the encoding exactly. ``tests/format/test_format.py`` and ``tests/format/test_format_v2.py``
check the dumps in FORMAT.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_golden import tensor_worked, worked

from graphsvc.format import dumps


def _str(text: str) -> tuple[int, str]:
    return 1 + len(text), f'str({len(text)}) "{text}"'


def notes() -> list[tuple[int, str]]:
    """(number of bytes, what they mean), in file order."""
    rows = [(1, "map, 8 entries: the document"), _str("format"), _str("graphsvc"), _str("version")]
    rows += [(1, "array, 2 items"), (1, "major 1"), (1, "minor 0"), _str("ops"), (1, "array, 3 entries: the op table")]
    for code, tag in enumerate(("leaf", "const", "mul")):
        rows += [(1, f"map, 3 entries: op code {code}"), _str("tag"), _str(tag)]
        rows += [_str("plugin"), (1, "nil (not from a plugin)"), _str("version"), (1, "nil")]
    rows += [_str("nodes"), (1, "map, 5 entries (no grads column)"), _str("count"), (1, "3 nodes")]
    columns = [
        ("op_codes", "<u2", 2, ["node 0: op 0 (leaf)", "node 1: op 1 (const)", "node 2: op 2 (mul)"]),
        (
            "parent_offsets",
            "<i8",
            8,
            [
                "0: node 0's parents start at slot 0",
                "0: node 1's parents start at slot 0",
                "0: node 2's parents start at slot 0",
                "2: node 2's parents end before slot 2",
            ],
        ),
        ("parent_indices", "<i4", 4, ["slot 0: node 0 (a)", "slot 1: node 1 (the const)"]),
        ("values", "<f8", 8, ["2.0 (a)", "3.0", "6.0 (y)"]),
    ]
    for key, dtype, size, items in columns:
        rows += [_str(key), (1, "map, 3 entries"), _str("dtype"), _str(dtype), _str("length"), (1, f"{len(items)}")]
        rows += [_str("data"), (2, f"bin8, {len(items) * size} bytes")]
        rows += [(size, item) for item in items]
    rows += [_str("names"), (1, "array, 2 entries"), (1, "array, 2 items"), (1, "node 0"), _str("a")]
    rows += [(1, "array, 2 items"), (1, "node 2"), _str("y"), _str("attrs"), (1, "array, 0 entries")]
    rows += [_str("outputs"), (1, "array, 1 item"), (1, "node 2"), _str("metadata"), (1, "map, 0 entries")]
    return rows


def _column(key: str, dtype: str, size: int, items: list[str]) -> list[tuple[int, str]]:
    rows = [_str(key), (1, "map, 3 entries"), _str("dtype"), _str(dtype), _str("length"), (1, f"{len(items)}")]
    rows += [_str("data"), (2, f"bin8, {len(items) * size} bytes")]
    return rows + [(size, item) for item in items]


def _zeros(count: int, note: str) -> list[tuple[int, str]]:
    """``count`` zero bytes, 8 to a row."""
    return [(min(8, count - start), note if not start else "padding") for start in range(0, count, 8)]


def tensor_notes() -> list[tuple[int, str]]:
    """(number of bytes, what they mean) of the tensor graph of §15, in file order."""
    rows = [(1, "map, 11 entries: the document"), _str("format"), _str("graphsvc"), _str("version")]
    rows += [(1, "array, 2 items"), (1, "major 2"), (1, "minor 0"), _str("ops"), (1, "array, 2 entries: the op table")]
    for code, tag in enumerate(("leaf", "mul")):
        rows += [(1, f"map, 3 entries: op code {code}"), _str("tag"), _str(tag)]
        rows += [_str("plugin"), (1, "nil (not from a plugin)"), _str("version"), (1, "nil")]
    rows += [_str("nodes"), (1, "map, 5 entries (no grads column)"), _str("count"), (1, "3 nodes")]
    rows += _column("op_codes", "<u2", 2, ["node 0: op 0 (leaf)", "node 1: op 0 (leaf)", "node 2: op 1 (mul)"])
    offsets = ["0: node 0's parents start at slot 0", "0: node 1's parents start at slot 0"]
    offsets += ["0: node 2's parents start at slot 0", "2: node 2's parents end before slot 2"]
    rows += _column("parent_offsets", "<i8", 8, offsets)
    rows += _column("parent_indices", "<i4", 4, ["slot 0: node 0 (x)", "slot 1: node 1 (w)"])
    rows += _column("values", "<f8", 8, ["nan (x holds an array)", "3.0 (w, a scalar node)", "nan (y holds an array)"])
    rows += [_str("tensors"), (1, "array, 2 entries: the tensor table")]
    for node, offset, name in ((0, 0, "x"), (2, 64, "y")):
        rows += [(1, "array, 6 items"), (1, f"node {node} ({name})"), _str("value"), _str("F32")]
        rows += [(1, "array, 1 item: the shape"), (1, "2"), (1, f"offset {offset}"), (1, "nbytes 8")]
    rows += [_str("pad"), (2, "bin8, 7 bytes: the data payload starts at 0x0180 = 6 x 64")]
    rows += [(7, "zeros")]
    rows += [_str("data"), (5, "bin32, 72 bytes: the data section")]
    rows += [(4, "+0: x[0] = 1.5 (<f4)"), (4, "+4: x[1] = -2.0")]
    rows += _zeros(56, "+8: zeros up to the next multiple of 64")
    rows += [(4, "+64: y[0] = 4.5"), (4, "+68: y[1] = -6.0")]
    rows += [_str("names"), (1, "array, 3 entries")]
    for node, name in ((0, "x"), (1, "w"), (2, "y")):
        rows += [(1, "array, 2 items"), (1, f"node {node}"), _str(name)]
    rows += [_str("attrs"), (1, "array, 0 entries")]
    rows += [_str("outputs"), (1, "array, 1 item"), (1, "node 2"), _str("metadata"), (1, "map, 0 entries")]
    return rows


def dump(data: bytes, rows: list[tuple[int, str]]) -> str:
    """The hex dump: offset, bytes, note; stops if the notes do not cover ``data`` exactly."""
    lines = []
    position = 0
    for size, note in rows:
        chunk = data[position : position + size]
        lines.append(f"{position:04x}  {chunk.hex(' '):<44}  {note}".rstrip())
        position += size
    if position != len(data):
        raise SystemExit(f"the notes cover {position} bytes, the encoding has {len(data)}")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:] == ["--v2"]:
        print(dump(dumps(tensor_worked()), tensor_notes()))
    else:
        print(dump(dumps(worked()), notes()))


if __name__ == "__main__":
    main()
