"""Build the invalid-file corpus of the format spec (run from the repository root).

    python schemas/examples/make_invalid.py

Every rule of ``schemas/FORMAT.md`` that a file can break gets its smallest breaking files in
``invalid/``, one ``.msgpack`` per case, named after the rule (``7.6-self-loop.msgpack``: §7, rule 6;
``15.3.8-grad-dtype.msgpack``: §15.3, rule 8), and ``invalid/expected.json`` maps each file to the
rules it breaks and the exact error graphsvc gives (the message of its ``FormatError``; the CLI
prints ``Error: FILE: message`` and exits with code 3). Each file breaks that one rule and no
other, so a reader that checks its rules in another order still has only one thing to refuse.
``NO_FILE`` lists the numbered rules that no file can break, with why.

The bytes are deterministic: each document is ``msgpack.packb`` of plain dicts and lists in a fixed
order (or bytes spelled out here). ``tests/format/test_invalid_corpus.py`` rebuilds the corpus and
compares it byte for byte, loads each file through ``graphsvc.load`` with and without the C
extensions, and checks that every numbered rule has a file or a reason here.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import msgpack

HERE = Path(__file__).resolve().parent
INVALID = HERE / "invalid"
NAN = 0x7FF8000000000000


def _f64(*bits_or_floats: float | int) -> bytes:
    return b"".join(
        struct.pack("<Q", item) if isinstance(item, int) else struct.pack("<d", item) for item in bits_or_floats
    )


def column(dtype: str, data: bytes, length: int | None = None) -> dict[str, Any]:
    size = {"<u2": 2, "<i8": 8, "<i4": 4, "<f8": 8}[dtype]
    return {"dtype": dtype, "length": len(data) // size if length is None else length, "data": data}


def op(tag: str) -> dict[str, Any]:
    return {"tag": tag, "plugin": None, "version": None}


def nodes(
    op_codes: list[int], parents: list[list[int]], values: bytes | None = None, grads: bytes | None = None
) -> dict[str, Any]:
    """``nodes`` for these op codes and parent lists (values 0.0 unless given)."""
    offsets = [0]
    for node_parents in parents:
        offsets.append(offsets[-1] + len(node_parents))
    flat = [parent for node_parents in parents for parent in node_parents]
    result = {
        "count": len(op_codes),
        "op_codes": column("<u2", struct.pack(f"<{len(op_codes)}H", *op_codes)),
        "parent_offsets": column("<i8", struct.pack(f"<{len(offsets)}q", *offsets)),
        "parent_indices": column("<i4", struct.pack(f"<{len(flat)}i", *flat)),
        "values": column("<f8", bytes(8 * len(op_codes)) if values is None else values),
    }
    if grads is not None:
        result["grads"] = column("<f8", grads)
    return result


def v1(**changes: Any) -> dict[str, Any]:
    """The smallest 1.0 document with a node: one leaf (node 0, 0.0), its output; ``changes``
    replace keys in place (None: remove the key)."""
    doc: dict[str, Any] = {
        "format": "graphsvc",
        "version": [1, 0],
        "ops": [op("leaf")],
        "nodes": nodes([0], [[]]),
        "names": [],
        "attrs": [],
        "outputs": [0],
        "metadata": {},
    }
    return _changed(doc, changes)


def v1_pair(**changes: Any) -> dict[str, Any]:
    """Two nodes: a leaf (node 0) and ``neg`` of it (node 1), for the rules about parents."""
    pair: dict[str, Any] = {"ops": [op("leaf"), op("neg")], "nodes": nodes([0, 1], [[], [0]]), "outputs": [1]}
    return v1(**{**pair, **changes})


def v2(**changes: Any) -> dict[str, Any]:
    """The smallest 2.0 document: one leaf (node 0) whose value is a float64 0-d array (0.0), its
    column entry nan, no ``pad``; ``changes`` as for :func:`v1`."""
    doc: dict[str, Any] = {
        "format": "graphsvc",
        "version": [2, 0],
        "ops": [op("leaf")],
        "nodes": nodes([0], [[]], values=_f64(NAN)),
        "tensors": [[0, "value", "F64", [], 0, 8]],
        "data": bytes(8),
        "names": [],
        "attrs": [],
        "outputs": [0],
        "metadata": {},
    }
    return _changed(doc, changes)


def _changed(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return doc


def _entry(entry: list[Any], **changes: Any) -> dict[str, Any]:
    """:func:`v2` with its one tensor entry changed (items by position: ``i4=64`` sets the offset)."""
    changed = list(entry)
    for name, value in changes.items():
        changed[int(name[1:])] = value
    return v2(tensors=[changed])


_ENTRY = [0, "value", "F64", [], 0, 8]


def _nested(depth: int) -> Any:
    """A value nested ``depth`` levels below the map that holds it (``{"k": ...}`` is level 1)."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _two_arrays(grad: list[Any], grads_column: bytes | None = None, value: list[Any] | None = None) -> dict[str, Any]:
    """2.0 with node 0's value an F32 [2] array at 0 and a gradient entry ``grad`` (at 64)."""
    return v2(
        nodes=nodes([0], [[]], values=_f64(NAN), grads=grads_column),
        tensors=[value or [0, "value", "F32", [2], 0, 8], grad],
        data=bytes(128),
    )


def _with_pad(pad: Any) -> dict[str, Any]:
    """:func:`v2` with ``pad`` before ``data``, where a writer puts it."""
    doc: dict[str, Any] = {}
    for key, value in v2().items():
        if key == "data":
            doc["pad"] = pad
        doc[key] = value
    return doc


def _pack(doc: Any) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


#: The rules of FORMAT.md's numbered lists that no file can break, and why. Keys as in CASES.
NO_FILE: dict[str, str] = {
    "2.1": "an evolution rule for writers of future minor versions (new fields optional), not a property of one file",
    "2.2": "an evolution rule (never reorder keys); a reader looks keys up by name, so no order is invalid",
    "2.3": "an evolution rule (never reuse a code or a name) for the authors of the format, not of a file",
    "2.4": "an evolution rule (what needs a new major version); a file of an unknown major is rule 7.1's",
    "2.5": "an evolution rule (a tensor entry never grows); an entry of seven items is rule 15.3.2's",
}

#: ``(file stem, rules broken, what the file is, the document or its bytes, graphsvc's error)``.
#: A rule is ``"7.6"`` (§7's rule 6), ``"15.3.8"`` (§15.3's rule 8), ``"7.strings"`` (§7's
#: paragraph on Unicode text) or ``"9"`` (§9's safety rules). The tensor table's files break §7's
#: rule 5 too.
Case = tuple[str, tuple[str, ...], str, Any, str]

T = ("7.5",)  # the tensor table is §7's rule 5

CASES: list[Case] = [
    # -- §7 rule 1: the document, format, version, the keys ------------------------------------------
    ("7.1-not-a-map", ("7.1",), "the document is an array", [], "the document must be a map, not an array"),
    (
        "7.1-format",
        ("7.1",),
        "format is not graphsvc",
        v1(format="graphsvd"),
        "not a graphsvc file (format is 'graphsvd', expected 'graphsvc')",
    ),
    (
        "7.1-version-form",
        ("7.1",),
        "version has one item",
        v1(version=[1]),
        "version must be an array of two non-negative integers [major, minor], not [1]",
    ),
    (
        "7.1-version-major-3",
        ("7.1",),
        "a major version this reader does not read",
        v1(version=[3, 0]),
        "the file uses format version 3.0, newer than this graphsvc reads (major versions 1 and 2); upgrade graphsvc",
    ),
    ("7.1-version-major-0", ("7.1",), "major version 0", v1(version=[0, 1]), "unknown format version 0.1"),
    ("7.1-lacks-metadata", ("7.1",), "no metadata key", v1(metadata=None), "the document lacks the key metadata"),
    (
        "7.1-lacks-tensors",
        ("7.1",),
        "a 2.0 document without tensors",
        v2(tensors=None),
        "the document lacks the key tensors",
    ),
    ("7.1-lacks-data", ("7.1",), "a 2.0 document without data", v2(data=None), "the document lacks the key data"),
    # -- §7 rule 2: the op table ---------------------------------------------------------------------------
    (
        "7.2-too-many-ops",
        ("7.2",),
        "65,537 op table entries (each nil: the count is checked before any entry)",
        v1(ops=[None] * 65_537),
        "too many ops: 65537 (at most 65536)",
    ),
    (
        "7.2-entry-not-a-map",
        ("7.2",),
        "an op entry that is a string",
        v1(ops=["leaf"]),
        "ops[0] must be a map, not a string",
    ),
    ("7.2-empty-tag", ("7.2",), "an empty op tag", v1(ops=[op("")]), "ops[0].tag is an empty string"),
    (
        "7.2-tag-not-a-string",
        ("7.2",),
        "an op tag that is an int",
        v1(ops=[{"tag": 1}]),
        "ops[0].tag must be a string, not an integer",
    ),
    (
        "7.2-plugin-type",
        ("7.2",),
        "a plugin that is an int",
        v1(ops=[{"tag": "leaf", "plugin": 1, "version": None}]),
        "ops[0].plugin must be a string, not an integer",
    ),
    (
        "7.2-tag-twice",
        ("7.2",),
        "the tag leaf twice",
        v1(ops=[op("leaf"), op("leaf")]),
        "ops lists the tag 'leaf' twice",
    ),
    # -- §7 rule 3: count and the columns ---------------------------------------------------------------
    (
        "7.3-count-negative",
        ("7.3",),
        "count -1",
        v1(nodes={**nodes([0], [[]]), "count": -1}),
        "nodes.count is -1, outside the limit 0..2147483647",
    ),
    (
        "7.3-count-too-large",
        ("7.3",),
        "count 2^31",
        v1(nodes={**nodes([0], [[]]), "count": 1 << 31}),
        "nodes.count is 2147483648, outside the limit 0..2147483647",
    ),
    (
        "7.3-column-dtype",
        ("7.3",),
        "values as <f4",
        v1(nodes={**nodes([0], [[]]), "values": {"dtype": "<f4", "length": 1, "data": bytes(4)}}),
        "nodes.values.dtype is '<f4', but version 1 requires '<f8'",
    ),
    (
        "7.3-column-length",
        ("7.3",),
        "op_codes with two items for one node",
        v1(nodes={**nodes([0], [[]]), "op_codes": column("<u2", bytes(4))}),
        "nodes.op_codes.length is 2, expected 1",
    ),
    (
        "7.3-column-data",
        ("7.3",),
        "values declaring one item and holding 4 bytes",
        v1(nodes={**nodes([0], [[]]), "values": column("<f8", bytes(4), length=1)}),
        "nodes.values.data holds 4 bytes, but 1 x <f8 needs 8",
    ),
    (
        "7.3-column-missing",
        ("7.3",),
        "no values column",
        v1(nodes={key: value for key, value in nodes([0], [[]]).items() if key != "values"}),
        "nodes.values must be a map, not nil",
    ),
    # -- §7 rule 4: names, attrs, outputs, metadata -------------------------------------------------------
    (
        "7.4-name-entry",
        ("7.4",),
        "a names entry of one item",
        v1(names=[[0]]),
        "names[0] must be an array [node id, name]",
    ),
    (
        "7.4-name-id-range",
        ("7.4",),
        "a name for node 1 of 1",
        v1(names=[[1, "x"]]),
        "names[0] refers to node 1, which does not exist (the graph has 1 node)",
    ),
    (
        "7.4-names-order",
        ("7.4",),
        "names of nodes 1 then 0",
        v1_pair(names=[[1, "y"], [0, "x"]]),
        "names[1]: node 0 is listed out of order (ids must increase)",
    ),
    (
        "7.4-name-type",
        ("7.4",),
        "a name that is an int",
        v1(names=[[0, 7]]),
        "names[0][1] must be a string, not an integer",
    ),
    (
        "7.4-attrs-type",
        ("7.4",),
        "attributes that are an array",
        v1(attrs=[[0, []]]),
        "attrs[0][1] must be a map, not an array",
    ),
    (
        "7.4-attrs-depth",
        ("7.4",),
        "attributes nested 33 levels",
        v1(attrs=[[0, {"k": _nested(32)}]]),
        "the attribute map of node 0 nests deeper than 32 levels",
    ),
    (
        "7.4-output-type",
        ("7.4",),
        "an output that is a string",
        v1(outputs=["0"]),
        "outputs[0] must be an integer, not a string",
    ),
    (
        "7.4-metadata-type",
        ("7.4",),
        "metadata that is an array",
        v1(metadata=[]),
        "metadata must be a map, not an array",
    ),
    (
        "7.4-metadata-depth",
        ("7.4",),
        "metadata nested 33 levels",
        v1(metadata={"k": _nested(32)}),
        "metadata nests deeper than 32 levels",
    ),
    # -- §7 rule 6: the graph ------------------------------------------------------------------------------
    (
        "7.6-offsets-start",
        ("7.6",),
        "parent_offsets starting at 1",
        v1(nodes={**nodes([0], [[]]), "parent_offsets": column("<i8", struct.pack("<2q", 1, 0))}),
        "parent_offsets must start at 0, not 1",
    ),
    (
        "7.6-offsets-end",
        ("7.6",),
        "parent_offsets ending at 1 with no parent index",
        v1(nodes={**nodes([0], [[]]), "parent_offsets": column("<i8", struct.pack("<2q", 0, 1))}),
        "parent_offsets ends at 1 but there are 0 parent indices",
    ),
    (
        "7.6-offsets-decrease",
        ("7.6",),
        "parent_offsets 0, 2, 1 with one parent index",
        v1_pair(
            nodes={
                **nodes([0, 1], [[], [0]]),
                "parent_offsets": column("<i8", struct.pack("<3q", 0, 2, 1)),
            }
        ),
        "parent_offsets decreases at node 1",
    ),
    (
        "7.6-op-code",
        ("7.6",),
        "op code 1 with a table of one entry",
        v1(nodes=nodes([1], [[]])),
        "node 0 has op code 1, but the op table has 1 entry",
    ),
    (
        "7.6-parent-negative",
        ("7.6",),
        "a parent index -1",
        v1_pair(nodes=nodes([0, 1], [[], [-1]])),
        "node 1 has a negative parent index -1",
    ),
    (
        "7.6-parent-range",
        ("7.6",),
        "a parent index 2 of 2 nodes",
        v1_pair(nodes=nodes([0, 1], [[], [2]])),
        "node 1 has parent 2, which does not exist (the graph has 2 nodes)",
    ),
    (
        "7.6-self-loop",
        ("7.6",),
        "node 1 listing itself",
        v1_pair(nodes=nodes([0, 1], [[], [1]])),
        "node 1 lists itself as a parent (a self-loop)",
    ),
    (
        "7.6-parent-after-child",
        ("7.6",),
        "node 1 with parent 2",
        v1(ops=[op("leaf"), op("neg")], nodes=nodes([0, 1, 1], [[], [2], [0]]), outputs=[1]),
        (
            "node 1 has parent 2, which does not come before it: node ids must be in topological order "
            "(every parent id smaller than its child's)"
        ),
    ),
    (
        "7.6-leaf-with-parents",
        ("7.6",),
        "a leaf with a parent",
        v1_pair(nodes=nodes([0, 0], [[], [0]])),
        "node 1 is a leaf but has parents",
    ),
    (
        "7.6-empty-name",
        ("7.6",),
        "an empty name",
        v1(names=[[0, ""]]),
        "node 0 has a name that is not a non-empty string",
    ),
    (
        "7.6-name-twice",
        ("7.6",),
        "the name x for two nodes",
        v1_pair(names=[[0, "x"], [1, "x"]]),
        "name 'x' is used by nodes 0 and 1",
    ),
    (
        "7.6-output-range",
        ("7.6",),
        "output 1 of 1 node",
        v1(outputs=[1]),
        "output 1 does not exist (the graph has 1 node)",
    ),
    # -- §7: strings are Unicode text ---------------------------------------------------------------------------
    (
        "7.strings-surrogate",
        ("7.strings",),
        "a name holding the UTF-8 encoding of U+D800",
        _pack(v1(names=[[0, "x"]])).replace(b"\xa1x", b"\xa3\xed\xa0\x80"),
        "the string at names[0][1] is not valid UTF-8",
    ),
    # -- §9: safety ------------------------------------------------------------------------------------------
    (
        "9-ext-type",
        ("9",),
        "metadata holding a msgpack timestamp (ext -1)",
        _pack(v1(metadata={"t": 0})).replace(b"\xa1t\x00", b"\xa1t\xd6\xff\x00\x00\x00\x00"),
        "the file contains a msgpack ext type; graphsvc files never do",
    ),
    (
        "9-repeated-key",
        ("9",),
        "the key format twice",
        _pack(v1()).replace(b"\x88", b"\x89", 1) + b"\xa6format\xa8graphsvc",
        "the document repeats the key 'format'",
    ),
    (
        "9-key-not-a-string",
        ("9",),
        "metadata with the key 1",
        _pack(v1(metadata={"a": 0})).replace(b"\x81\xa1a\x00", b"\x81\x01\x00"),
        "the map at metadata has a key that is not a string (an integer, entry 0)",
    ),
    (
        "9-trailing-bytes",
        ("9",),
        "one byte after the document",
        _pack(v1()) + b"\x00",
        "trailing bytes after the document: 1 byte follows the first 284",
    ),
    (
        "9-truncated",
        ("9",),
        "the document's last byte missing",
        _pack(v1())[:-1],
        "the file is truncated: 283 bytes end in the middle of the document",
    ),
    (
        "9-declared-size",
        ("9",),
        "an array declaring 2^32 - 1 entries in a 5-byte file",
        b"\xdd\xff\xff\xff\xff",
        "the file is truncated: an array declares 4294967295 entries, more than the file's 5 bytes can hold",
    ),
    (
        "9-nesting",
        ("9",),
        "metadata nested 1,025 levels (the document is level 1)",
        _pack(v1(metadata={})).replace(b"\xa8metadata\x80", b"\xa8metadata\x81\xa1k" + b"\x91" * 1023 + b"\x00"),
        "not a valid msgpack document: it nests too deeply",
    ),
    # -- §15.3: the tensor table and the data section ------------------------------------------------------------
    ("15.3.1-tensors-type", (*T, "15.3.1"), "tensors a map", v2(tensors={}), "tensors must be an array, not a map"),
    ("15.3.1-pad-type", (*T, "15.3.1"), "pad a string", _with_pad(""), "pad must be bin data, not a string"),
    ("15.3.1-data-type", (*T, "15.3.1"), "data a string", v2(data="x"), "data must be bin data, not a string"),
    (
        "15.3.2-entry-items",
        (*T, "15.3.2"),
        "an entry of seven items",
        _entry([*_ENTRY, None]),
        "tensors[0] must be an array [node, which, dtype, shape, offset, nbytes]",
    ),
    (
        "15.3.2-node",
        (*T, "15.3.2"),
        "an entry for node 1 of 1",
        _entry(_ENTRY, i0=1),
        "tensors[0] refers to node 1, which does not exist (the graph has 1 node)",
    ),
    (
        "15.3.2-which",
        (*T, "15.3.2"),
        "which 'values'",
        _entry(_ENTRY, i1="values"),
        'tensors[0][1] must be "value" or "grad", not \'values\'',
    ),
    (
        "15.3.2-dtype",
        (*T, "15.3.2"),
        "dtype 'f64'",
        _entry(_ENTRY, i2="f64"),
        'tensors[0][2] must be a dtype "F64", "F32" or "I64", not \'f64\'',
    ),
    (
        "15.3.3-dimensions",
        (*T, "15.3.3"),
        "a shape of 33 ones",
        _entry(_ENTRY, i3=[1] * 33),
        "tensors[0]: the shape has 33 dimensions, more than 32",
    ),
    (
        "15.3.3-dimension",
        (*T, "15.3.3"),
        "a dimension -1",
        _entry(_ENTRY, i3=[-1]),
        "tensors[0][3][0] must be a non-negative integer (a dimension), not -1",
    ),
    (
        "15.3.4-too-large",
        (*T, "15.3.4"),
        "shape [0, 2^60] of F64: 2^63 bytes of nonzero dimensions",
        _entry(_ENTRY, i3=[0, 1 << 60], i5=0),
        "tensors[0]: the shape [0, 1152921504606846976] is too large (more than 2**63 - 1 bytes)",
    ),
    (
        "15.3.5-fits",
        (*T, "15.3.5"),
        "shape [2] of F64 in 8 bytes of data",
        _entry(_ENTRY, i3=[2], i5=16),
        "tensors[0]: an F64 array of shape [2] takes 16 bytes, more than the data section's 8",
    ),
    (
        "15.3.6-nbytes",
        (*T, "15.3.6"),
        "nbytes 4 for one F64",
        _entry(_ENTRY, i5=4),
        "tensors[0]: nbytes is 4, but an F64 array of shape [] takes 8",
    ),
    (
        "15.3.6-offset-negative",
        (*T, "15.3.6"),
        "offset -64",
        _entry(_ENTRY, i4=-64),
        "tensors[0]: the offset -64 is negative",
    ),
    (
        "15.3.6-offset-alignment",
        (*T, "15.3.6"),
        "offset 8",
        v2(tensors=[[0, "value", "F64", [], 8, 8]], data=bytes(16)),
        "tensors[0]: the offset 8 is not a multiple of 64",
    ),
    (
        "15.3.6-outside",
        (*T, "15.3.6"),
        "offset 64 in 8 bytes of data",
        _entry(_ENTRY, i4=64),
        "tensors[0]: bytes 64 to 72 lie outside the data section's 8 bytes",
    ),
    (
        "15.3.7-twice",
        (*T, "15.3.7"),
        "node 0's value listed twice",
        v2(tensors=[_ENTRY, [0, "value", "F64", [], 64, 8]], data=bytes(72)),
        "tensors[1]: the value of node 0 is listed twice",
    ),
    (
        "15.3.7-order",
        (*T, "15.3.7"),
        "node 0's gradient before its value",
        v2(tensors=[[0, "grad", "F64", [], 0, 8], [0, "value", "F64", [], 64, 8]], data=bytes(72)),
        "tensors[1]: the value of node 0 is listed out of order (entries are sorted by node, a value first)",
    ),
    (
        "15.3.8-value-not-nan",
        (*T, "15.3.8"),
        "0.0 in the values column of an array node",
        v2(nodes=nodes([0], [[]])),
        "tensors[0]: node 0 holds a value array, so its entry in the values column must be nan, not 0.0",
    ),
    (
        "15.3.8-grad-not-nan",
        (*T, "15.3.8"),
        "0.0 in the grads column of a node with a gradient array",
        _two_arrays([0, "grad", "F32", [2], 64, 8], grads_column=bytes(8)),
        "tensors[1]: node 0 holds a gradient array, so its entry in the grads column must be nan, not 0.0",
    ),
    (
        "15.3.8-grad-dtype",
        (*T, "15.3.8"),
        "an F32 value with an I64 gradient",
        _two_arrays([0, "grad", "I64", [2], 64, 16]),
        "tensors[1]: node 0's gradient is I64, but its value is F32 (a gradient has its value's dtype)",
    ),
    (
        "15.3.8-grad-shape",
        (*T, "15.3.8"),
        "a value of shape [2] with a gradient of shape [1]",
        _two_arrays([0, "grad", "F32", [1], 64, 4]),
        "tensors[1]: node 0's gradient has shape [1], but its value has shape [2]",
    ),
    (
        "15.3.9-overlap",
        (*T, "15.3.9"),
        "a value and its gradient at the same offset",
        _two_arrays([0, "grad", "F32", [2], 0, 8]),
        "tensors[0] and tensors[1] overlap in the data section (at byte 0)",
    ),
]


def corpus() -> dict[str, bytes]:
    """Every file of ``invalid/`` by name, ``expected.json`` included."""
    files: dict[str, bytes] = {}
    manifest = []
    for stem, rules, what, doc, message in CASES:
        name = f"{stem}.msgpack"
        if name in files:
            raise ValueError(f"two cases named {stem}")
        files[name] = doc if isinstance(doc, bytes) else _pack(doc)
        manifest.append({"file": name, "rules": list(rules), "what": what, "error": message})
    document = {
        "description": (
            "Each file breaks one rule of schemas/FORMAT.md (section.rule; 7.5 is the tensor table of "
            "15.3) and gets exactly this error from graphsvc (the CLI: 'Error: FILE: <error>', exit 3). "
            "Made by schemas/examples/make_invalid.py."
        ),
        "files": manifest,
        "rules_without_a_file": NO_FILE,
    }
    files["expected.json"] = (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode()
    return files


def main() -> None:
    INVALID.mkdir(exist_ok=True)
    made = corpus()
    for stale in INVALID.iterdir():
        if stale.name not in made:
            stale.unlink()
    for name, data in made.items():
        (INVALID / name).write_bytes(data)


if __name__ == "__main__":
    main()
