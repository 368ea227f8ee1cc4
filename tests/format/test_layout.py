"""graphsvc.format.layout: the one description of the file's layout, which the writer (codec.py) and the
fast reader (fastload.py) both derive from."""

from __future__ import annotations

import ast
from pathlib import Path

import msgpack
import pytest

from graphsvc.format import layout
from graphsvc.format.layout import ARRAY, BIN, MAP, STR, UINT

PACKAGE = Path(__file__).resolve().parents[2] / "graphsvc" / "format"


@pytest.mark.parametrize(
    ("family", "number", "expected"),
    [
        (UINT, 127, b"\x7f"),
        (UINT, 128, b"\xcc\x80"),
        (UINT, 1 << 16, b"\xce\x00\x01\x00\x00"),
        (UINT, 1 << 32, b"\xcf\x00\x00\x00\x01\x00\x00\x00\x00"),
        (STR, 31, b"\xbf"),
        (STR, 32, b"\xd9\x20"),
        (BIN, 0, b"\xc4\x00"),
        (BIN, 255, b"\xc4\xff"),
        (BIN, 256, b"\xc5\x01\x00"),
        (BIN, 1 << 16, b"\xc6\x00\x01\x00\x00"),
        (ARRAY, 15, b"\x9f"),
        (ARRAY, 16, b"\xdc\x00\x10"),
        (MAP, 15, b"\x8f"),
        (MAP, 16, b"\xde\x00\x10"),
        (MAP, 1 << 16, b"\xdf\x00\x01\x00\x00"),
    ],
)
def test_each_family_writes_the_smallest_header_as_msgpack_does(
    family: layout.Family, number: int, expected: bytes
) -> None:
    assert family.header(number) == expected
    packed = {
        "uint": lambda: msgpack.packb(number),
        "str": lambda: msgpack.packb("x" * number),
        "bin": lambda: msgpack.packb(bytes(number)),
        "array": lambda: msgpack.packb([0] * number),
        "map": lambda: msgpack.packb({str(i): 0 for i in range(number)}),
    }[family.name]()
    assert packed.startswith(expected)


def test_a_family_reads_back_its_fix_form_and_nothing_else() -> None:
    assert (STR.number(0xA5), MAP.number(0x83), UINT.number(0x7F)) == (5, 3, 127)
    assert (STR.number(0xD9), MAP.number(0xA5), BIN.number(0xC4)) == (None, None, None)
    assert layout.NUMBER_FORMATS[0xC6] == ">I" and layout.NUMBER_FORMATS[0xCF] == ">Q"


def test_version_2_pads_with_a_bin8_and_writes_data_with_a_bin32_header() -> None:
    assert layout.key("pad") == b"\xa3pad"
    assert layout.PAD_OVERHEAD == 16
    # after 100 bytes, the data payload must start at 128: 100 + 16 + 12 zero bytes
    assert layout.pad_and_data_header(100, 72) == b"\xa3pad\xc4\x0c" + bytes(12) + b"\xa4data\xc6\x00\x00\x00\x48"
    assert layout.pad_and_data_header(48, 0) == b"\xa3pad\xc4\x00\xa4data\xc6\x00\x00\x00\x00"
    assert (layout.aligned(0), layout.aligned(1), layout.aligned(64), layout.aligned(65)) == (0, 64, 64, 128)


def test_the_key_orders() -> None:
    assert layout.KEYS_2 == (
        "format", "version", "ops", "nodes", "tensors", "pad", "data", "names", "attrs", "outputs", "metadata"
    )  # fmt: skip
    assert tuple(layout.COLUMN_FIELD_TYPES.items()) == (("dtype", STR), ("length", UINT), ("data", BIN))


def _literals(module: str) -> tuple[list[int], list[str]]:
    tree = ast.parse((PACKAGE / module).read_text())
    source = (PACKAGE / module).read_text().splitlines()
    hexes, keys = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            text = source[node.lineno - 1][node.col_offset : node.end_col_offset]
            if text.lower().startswith("0x"):
                hexes.append(node.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            layout_names = (
                *layout.KEYS_2,
                *layout.COLUMNS,
                layout.OPTIONAL_COLUMN,
                layout.COUNT,
                *layout.COLUMN_FIELDS,
            )
            if node.value in layout_names:
                keys.append(node.value)
    return hexes, keys


@pytest.mark.parametrize("module", ["fastload.py", "codec.py"])
def test_the_writer_and_the_fast_reader_spell_no_type_byte_and_no_key_of_the_layout(module: str) -> None:
    """Both take the layout from graphsvc/format/layout.py: no msgpack type byte, no key of their own."""
    hexes, keys = _literals(module)
    assert hexes == []
    assert keys == []
