"""Print the annotated hex dump of the worked example in FORMAT.md §11 (run from the repository root).

    python schemas/examples/annotate_worked.py

The notes are written here by hand; the bytes come from the real encoder, and the script stops if
the notes do not cover the encoding exactly. ``tests/test_format.py`` checks the dump in FORMAT.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_golden import worked

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


def main() -> None:
    data = dumps(worked())
    position = 0
    for size, note in notes():
        chunk = data[position : position + size]
        print(f"{position:04x}  {chunk.hex(' '):<44}  {note}")
        position += size
    if position != len(data):
        raise SystemExit(f"the notes cover {position} bytes, the encoding has {len(data)}")


if __name__ == "__main__":
    main()
