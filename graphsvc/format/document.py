"""The mapping between a graph file's document and a :class:`Graph`, with every check on the way.

Writing: the parts of the document a graph gives (:func:`op_entries`, :func:`columns`,
:func:`stored_arrays`, :func:`names_entries`, :func:`attrs_entries`), in the layout of
:mod:`graphsvc.format.layout`, after :func:`check_writable` has made sure a reader will accept them.
Reading: :func:`validate` turns a decoded document (maps, lists, str, int, bytes; columns and the
data section possibly already numpy buffers, read by :mod:`graphsvc.format.fastload`) into a Graph, or
raises the one-line :class:`FormatError` that says which rule the document breaks. No msgpack here:
bytes are :mod:`graphsvc.format.codec`'s.
"""

from __future__ import annotations

import itertools
import mmap
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from graphsvc.errors import FormatError, GraphFileError, GraphStructureError
from graphsvc.format.diagnose import describe, expect, shape_text, shown
from graphsvc.format.layout import (
    ALIGNMENT,
    ATTRS_KEY,
    CANONICAL_NAN_BITS,
    COLUMN_DATA_KEY,
    COLUMN_DTYPE_KEY,
    COLUMN_DTYPES,
    COLUMN_LENGTH_KEY,
    COLUMNS,
    COUNT,
    DATA_KEY,
    DEFAULT_LIMITS,
    DTYPE_NAMES,
    FORMAT_KEY,
    FORMAT_NAME,
    GRADS_COLUMN,
    KEYS,
    MAX_ARRAY_BYTES,
    METADATA_KEY,
    NAMES_KEY,
    NODES_KEY,
    OP_CODES_COLUMN,
    OP_FIELDS,
    OP_PLUGIN_KEY,
    OP_TAG_KEY,
    OP_VERSION_KEY,
    OPS_KEY,
    OUTPUTS_KEY,
    PAD_KEY,
    PARENT_INDICES_COLUMN,
    PARENT_OFFSETS_COLUMN,
    READ_MAJORS,
    REQUIRED_KEYS_2,
    TENSOR_DTYPES,
    TENSORS_KEY,
    VALUES_COLUMN,
    VERSION_KEY,
    WHICH,
    WHICH_GRAD,
    WHICH_VALUE,
    Limits,
    aligned,
)
from graphsvc.graph import FLOAT_DTYPE, MAX_DIMENSIONS, MAX_OPS, Graph, OpSource
from graphsvc.native import compiled_checks, compiled_table
from graphsvc.text import counted, escape, first_surrogate, shorten

if TYPE_CHECKING:  # annotations only: the CLI does not import numpy.typing at run time
    import numpy.typing as npt


# -- Graph -> document --------------------------------------------------------------------------------
def op_entries(graph: Graph) -> list[dict[str, Any]]:
    """The op table: one ``{tag, plugin, version}`` per tag, in the graph's op-code order."""
    entries = []
    for tag in graph.op_table:
        source = graph.op_sources.get(tag) or OpSource()
        entries.append({OP_TAG_KEY: tag, OP_PLUGIN_KEY: source.plugin, OP_VERSION_KEY: source.version})
    return entries


def columns(graph: Graph) -> list[tuple[str, npt.NDArray[Any]]]:
    """``nodes``' columns in file order, each as the dtype the layout requires (a view when it is)."""
    found: list[tuple[str, npt.NDArray[Any]]] = [(key, getattr(graph, key)) for key in COLUMNS]
    if graph.grads is not None:
        found.append((GRADS_COLUMN, graph.grads))
    if graph.is_tensor_graph:  # an array node's column entry is the one quiet nan, whatever nan the graph holds
        found = [(key, _with_canonical_nan(array, _array_nodes(graph, key))) for key, array in found]
    return [(key, np.ascontiguousarray(array, dtype=COLUMN_DTYPES[key])) for key, array in found]


def _array_nodes(graph: Graph, key: str) -> list[int]:
    arrays = {VALUES_COLUMN: graph.arrays, GRADS_COLUMN: graph.grad_arrays}.get(key, {})
    return sorted(arrays)


def _with_canonical_nan(column: npt.NDArray[Any], nodes: list[int]) -> npt.NDArray[Any]:
    """``column`` with the canonical nan at ``nodes`` (a copy only when some entry differs)."""
    if not nodes or bool((column[nodes].view(np.uint64) == CANONICAL_NAN_BITS).all()):
        return column
    fixed = np.array(column, dtype=FLOAT_DTYPE)
    fixed.view(np.uint64)[nodes] = CANONICAL_NAN_BITS
    return fixed


def names_entries(graph: Graph) -> list[list[Any]]:
    """``names``: ``[node, name]`` pairs by node id."""
    return [[node, graph.names[node]] for node in sorted(graph.names)]


def attrs_entries(graph: Graph) -> list[list[Any]]:
    """``attrs``: ``[node, map]`` pairs by node id, keys sorted; an empty map is no attributes, so it
    has no entry (FORMAT.md §5) and both spellings give one encoding. A map of one key is sorted
    already and goes as it is: a million ``pow`` nodes' entries are made a column at a time."""
    attrs = graph.attrs
    nodes = sorted(attrs)
    maps = list(map(attrs.__getitem__, nodes))
    if not all(maps):
        nodes, maps = [node for node in nodes if attrs[node]], list(filter(None, maps))
    if set(map(len, maps)) != {1}:
        maps = [m if len(m) == 1 else _sorted_map(m) for m in maps]
    return list(map(list, zip(nodes, maps, strict=True)))


def _sorted_map(attrs: dict[str, Any]) -> dict[str, Any]:
    return {key: attrs[key] for key in sorted(attrs)}


class Stored(NamedTuple):
    """One array as version 2.0 stores it: a tensor table entry and the array it describes."""

    node: int
    which: str
    array: np.ndarray
    offset: int

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[(self.array.dtype.kind, self.array.dtype.itemsize)]

    def entry(self) -> list[Any]:
        """``[node, which, dtype, shape, offset, nbytes]``."""
        return [self.node, self.which, self.dtype_name, list(self.array.shape), self.offset, self.array.nbytes]


def stored_arrays(graph: Graph) -> list[Stored]:
    """The tensor table in its canonical order (by node, a value before its gradient), each payload
    at the first multiple of :data:`ALIGNMENT` after the one before it."""
    stored: list[Stored] = []
    end = 0
    for node, which in sorted([(node, 0) for node in graph.arrays] + [(node, 1) for node in graph.grad_arrays]):
        array = graph.grad_arrays[node] if which else graph.arrays[node]
        offset = aligned(end)
        stored.append(Stored(node, WHICH[which], array, offset))
        end = offset + array.nbytes
    return stored


def data_length(stored: list[Stored]) -> int:
    """The data section's length: up to the end of the last payload."""
    return stored[-1].offset + stored[-1].array.nbytes if stored else 0


def little_endian_bytes(array: np.ndarray) -> memoryview:
    """The array's items, C order, little-endian, as bytes (a view when it already is so)."""
    if _LITTLE_ENDIAN and array.dtype.isnative and array.flags.c_contiguous and array.size:
        return array.data.cast("B")
    data = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    return data.reshape(-1).view(np.uint8).data


#: Is this machine little-endian (so that native arrays are stored as they are)?
_LITTLE_ENDIAN = sys.byteorder == "little"


# -- what a reader will accept ---------------------------------------------------------------------------
def check_writable(graph: Graph) -> list[Stored] | None:
    """Every structural rule, and what a reader refuses in attributes and metadata (a map key that
    is not a string, nesting deeper than the default limit), so that ``load`` reads what ``save`` writes.
    Returns the tensor table the file will hold (:func:`stored_arrays`), None for a graph of scalars."""
    graph.check()
    stored = None
    if graph.is_tensor_graph:
        stored = stored_arrays(graph)
        _check_arrays_writable(graph, stored)
    check_text(graph, DEFAULT_LIMITS)
    return stored


def _check_arrays_writable(graph: Graph, stored: list[Stored]) -> None:
    """What version 2.0 requires of a tensor graph beyond :meth:`Graph.check` (which holds a
    gradient to its value's shape and arrays to 32 dimensions): nan in the columns where a node
    holds an array, and a data section a msgpack bin can hold (``stored``: its arrays)."""
    for what, key, arrays, column in (
        ("value", VALUES_COLUMN, graph.arrays, graph.values),
        ("gradient", GRADS_COLUMN, graph.grad_arrays, graph.grads),
    ):
        if not arrays or column is None:
            continue
        nodes = np.fromiter(arrays, dtype=np.int64, count=len(arrays))  # ids Graph.check found in range
        nodes.sort()
        not_nan = ~np.isnan(column[nodes])
        if not_nan.any():
            node = int(nodes[not_nan.argmax()])
            raise FormatError(
                f"node {node} holds a {what} array, so its entry in the {key} column must be nan, "
                f"not {float(column[node])!r}"
            )
    size = data_length(stored)
    if size >= 1 << 32:
        raise FormatError(
            f"the graph's arrays take {counted(size, 'byte', thousands=True)} with their alignment, "
            "more than the 4 GiB a msgpack bin holds "
            "(4,294,967,295 bytes)"
        )


def check_text(graph: Graph, limits: Limits) -> None:
    """What a reader with ``limits`` refuses in the graph's text: attributes and metadata nested
    deeper than ``limits.max_attr_depth`` or with a map key that is not a string, and anywhere (op
    tags, op sources, names, attribute and metadata keys and strings) a string that is not Unicode
    text (a lone surrogate) or is longer in UTF-8 than ``limits.max_string_length``."""
    longest = limits.max_string_length
    check_graph_nesting(graph, limits.max_attr_depth, longest)
    tags = graph.op_table
    if not _all_text(tags, longest):
        for tag in tags:
            _check_string(tag, f"the op tag {quoted(tag)}", longest)
    sources = [(tag, graph.op_sources[tag]) for tag in tags if tag in graph.op_sources]  # the ones written
    texts = [text for _, source in sources for text in source if text is not None]
    if not _all_text(texts, longest):
        for tag, source in sources:
            for what, text in (("plugin", source.plugin), ("plugin version", source.version)):
                if text is not None:
                    _check_string(text, f"the {what} of the op {quoted(tag)}", longest)
    names = list(graph.names.values())
    if not _all_text(names, longest):
        for node in sorted(graph.names):
            _check_string(graph.names[node], f"the name of node {node}", longest)


def _all_text(texts: list[str], longest: int) -> bool:
    """Is each of ``texts`` Unicode text, none longer than ``longest`` bytes in UTF-8? (One pass in C;
    False may be a doubt: a string of more than a quarter of ``longest`` characters.)"""
    return not texts or (max(map(len, texts)) * 4 <= longest and first_surrogate("".join(texts)) is None)


def _check_string(text: str, where: str, limit: int) -> None:
    """Unicode text (no lone surrogate, which UTF-8 cannot encode), no longer in UTF-8 than ``limit`` bytes."""
    at = first_surrogate(text)
    if at is not None:
        raise FormatError(f"{where} {not_unicode(text[at])}")
    if len(text) * 4 > limit:  # a character takes at most 4 bytes: only long strings need encoding
        size = len(text.encode("utf-8"))
        if size > limit:
            raise FormatError(
                f"{where} is {counted(size, 'byte')} long, longer than the {counted(limit, 'byte')} a reader accepts"
            )


def quoted(text: str) -> str:
    """A file's text (an op tag) in an error message: escaped, cut to 40 characters, in quotes."""
    return f"'{escape(shorten(text, 40))}'"


def not_unicode(surrogate: str) -> str:
    """The end of a sentence saying that a string holds ``surrogate``, a lone surrogate."""
    return f"holds a lone surrogate ({escape(surrogate)}), which is not Unicode text"


def check_graph_nesting(graph: Graph, limit: int, string_limit: int | None = None) -> None:
    """:func:`check_nesting` of every node's attributes, by node id, then of the metadata."""
    check_nesting_of(graph.attrs, _attributes_of, limit, string_limit)
    check_nesting_of({METADATA_KEY: graph.metadata}, str, limit, string_limit)


def check_nesting_of(
    items: Mapping[Any, Any],
    where: Callable[[Any], str],
    limit: int,
    string_limit: int | None = None,
) -> None:
    """:func:`check_nesting` of each value of ``items``: all at once by :func:`_nesting_ok`, and one
    by one, in the order of the keys, only to word a problem it found (``where(key)`` names the place)."""
    if not _nesting_ok(list(items.values()), limit, string_limit):
        for key in sorted(items):
            check_nesting(items[key], limit, where(key), string_limit)


def _attributes_of(node: int) -> str:
    return f"the attribute map of node {node}"


def check_nesting(
    value: Any,
    limit: int,
    where: str,
    string_limit: int | None = None,
) -> None:
    """Nested at most ``limit`` levels, every map key a string (a decoded file's always are); given
    ``string_limit`` (when writing, or reading the JSON form), every string Unicode text of at most
    that many bytes in UTF-8."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            raise FormatError(f"{where} nests deeper than {counted(limit, 'level')}")
        if isinstance(item, str):
            if string_limit is not None:
                _check_string(item, f"a string in {where}", string_limit)
        elif isinstance(item, dict):
            for key in item:
                if type(key) is not str:
                    raise FormatError(f"{where} has a map key that is not a string ({describe(key)} {key!r})")
                if string_limit is not None:
                    _check_string(key, f"a map key in {where}", string_limit)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, level + 1) for v in item)
        elif type(item) is int and not -(1 << 63) <= item < 1 << 64:
            digits = str(item) if abs(item) < 10**30 else f"an integer of {counted(len(str(abs(item))), 'digit')}"
            raise FormatError(f"{where} holds {digits}, outside the integers msgpack stores (-2**63 to 2**64 - 1)")


#: The types of decoded values that hold nothing (an int is checked for its range).
_LEAF_TYPES = frozenset({str, float, bool, type(None), bytes})
#: The types :func:`_nesting_ok` walks through or judges; anything else is left to check_nesting.
_KNOWN_TYPES = _LEAF_TYPES | {dict, list, int}


def _nesting_ok(items: list[Any], limit: int, string_limit: int | None = None) -> bool:
    """Does each item keep what :func:`check_nesting` checks (given ``string_limit``: no string of
    more than a quarter that many characters, and no lone surrogate), as a decoded document's
    values do? Walked a level at a time, all items at once, each check one pass in C
    over the level (a million nodes' attribute maps: ~0.1 s; an item at a time took 2 s); False
    (for :func:`check_nesting` to word the first problem) at anything else, or an unusual type."""
    level = 0
    while items:
        if level > limit:
            return False
        kinds = set(map(type, items))
        if not kinds <= _KNOWN_TYPES:
            return False
        nested: list[Any] = []
        if str in kinds and string_limit is not None and not _all_text(_of_kind(items, str, kinds), string_limit):
            return False
        if int in kinds:
            ints = _of_kind(items, int, kinds)
            if min(ints) < -(1 << 63) or max(ints) >= 1 << 64:
                return False
        if dict in kinds:
            maps = _of_kind(items, dict, kinds)
            keys = list(itertools.chain.from_iterable(maps))
            if keys and set(map(type, keys)) != {str}:
                return False
            if keys and string_limit is not None and not _all_text(keys, string_limit):
                return False
            nested.extend(itertools.chain.from_iterable(map(dict.values, maps)))
        if list in kinds:
            nested.extend(itertools.chain.from_iterable(_of_kind(items, list, kinds)))
        items = nested
        level += 1
    return True


def _of_kind(items: list[Any], kind: type, kinds: set[type]) -> list[Any]:
    """The items of type ``kind`` (exactly), ``kinds`` being the types among them."""
    return items if len(kinds) == 1 else [item for item in items if type(item) is kind]


# -- document -> Graph -------------------------------------------------------------------------------------
def validate(doc: Any, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    """The graph a decoded document holds, and the version it declares; FormatError naming the
    first rule it breaks."""
    try:
        return _from_document(doc, limits)
    except GraphStructureError as exc:
        raise FormatError(str(exc)) from None
    except FormatError:
        raise
    except (
        ValueError,
        TypeError,
        OverflowError,
        IndexError,
        KeyError,
        MemoryError,
        RecursionError,
    ) as exc:  # pragma: no cover
        # a safety net: the fuzz harness and tests/format/test_hostile_files.py treat reaching it as a bug
        raise FormatError(f"invalid document: {type(exc).__name__}: {exc}") from None


def _from_document(doc: Any, limits: Limits) -> tuple[Graph, tuple[int, int]]:
    doc = expect(doc, dict, "the document")
    if doc.get(FORMAT_KEY) != FORMAT_NAME:
        raise FormatError(f"not a graphsvc file (format is {doc.get(FORMAT_KEY)!r}, expected {FORMAT_NAME!r})")
    version = _read_version(doc)
    missing = [key for key in (KEYS if version[0] == 1 else REQUIRED_KEYS_2) if key not in doc]
    if missing:
        raise FormatError(f"the document lacks the key{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    op_table, op_sources = _read_ops(doc)
    nodes = expect(doc[NODES_KEY], dict, NODES_KEY)
    count = expect(nodes.get(COUNT), int, f"{NODES_KEY}.{COUNT}")
    if not 0 <= count <= limits.max_nodes:
        raise FormatError(f"{NODES_KEY}.{COUNT} is {count}, outside the limit 0..{limits.max_nodes}")
    op_codes = _read_column(nodes, OP_CODES_COLUMN, count)
    offsets = _read_column(nodes, PARENT_OFFSETS_COLUMN, count + 1)
    parents = _read_column(nodes, PARENT_INDICES_COLUMN, None)
    if len(parents) > limits.max_edges:
        raise FormatError(
            f"{NODES_KEY}.{PARENT_INDICES_COLUMN} has {counted(len(parents), 'entry', plural='entries')}, "
            f"over the limit {limits.max_edges}"
        )
    values = _read_column(nodes, VALUES_COLUMN, count)
    grads = _read_column(nodes, GRADS_COLUMN, count) if nodes.get(GRADS_COLUMN) is not None else None
    names = _read_sparse(doc, NAMES_KEY, str, count)
    attrs = _read_sparse(doc, ATTRS_KEY, dict, count)
    if not all(attrs.values()):  # an empty map is no attributes
        attrs = {node: node_attrs for node, node_attrs in attrs.items() if node_attrs}
    check_nesting_of(attrs, _attributes_of, limits.max_attr_depth)
    outputs = [expect(o, int, f"{OUTPUTS_KEY}[{i}]") for i, o in enumerate(expect(doc[OUTPUTS_KEY], list, OUTPUTS_KEY))]
    metadata = expect(doc[METADATA_KEY], dict, METADATA_KEY)
    check_nesting_of({METADATA_KEY: metadata}, str, limits.max_attr_depth)
    arrays: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})
    if version[0] >= 2:
        arrays = _read_tensors(doc, count, values, grads)
    graph = Graph(
        op_table=op_table,
        op_codes=op_codes,
        parent_offsets=offsets,
        parent_indices=parents,
        values=values,
        grads=grads,
        names=names,
        attrs=attrs,
        outputs=outputs,
        metadata=metadata,
        op_sources=op_sources,
        arrays=arrays[0],
        grad_arrays=arrays[1],
    )
    # the compiled check wherever it is built, whatever the graph's size: it costs microseconds even
    # for a few nodes, where the reference's numpy calls cost tens (a load is all small costs); the
    # arrays were made from the tensor table, which held them to every rule of theirs
    graph.check(compiled_checks(), arrays_checked=True)
    return graph, version


def _read_column(nodes: dict[str, Any], key: str, expected_length: int | None) -> npt.NDArray[Any]:
    # Each rule is a plain test; its message is made only when it fails (a load reads five columns).
    column = nodes.get(key)
    expected_dtype = COLUMN_DTYPES[key]
    where = f"{NODES_KEY}.{key}"
    if type(column) is not dict:
        column = expect(column, dict, where)
    dtype_name = column.get(COLUMN_DTYPE_KEY)
    if dtype_name != expected_dtype.str:
        expect(dtype_name, str, f"{where}.{COLUMN_DTYPE_KEY}")
        raise FormatError(f"{where}.dtype is {dtype_name!r}, but version 1 requires {expected_dtype.str!r}")
    length = column.get(COLUMN_LENGTH_KEY)
    if type(length) is not int:
        length = expect(length, int, f"{where}.{COLUMN_LENGTH_KEY}")
    if length < 0:
        raise FormatError(f"{where}.length is negative ({length})")
    if expected_length is not None and length != expected_length:
        raise FormatError(f"{where}.length is {length}, expected {expected_length}")
    data = column.get(COLUMN_DATA_KEY)
    if not isinstance(data, np.ndarray):  # read by fastload: a uint8 buffer of its own, else bytes
        data = expect(data, bytes, f"{where}.{COLUMN_DATA_KEY}")
    if len(data) != length * expected_dtype.itemsize:
        raise FormatError(
            f"{where}.{COLUMN_DATA_KEY} holds {counted(len(data), 'byte')}, but {length} x {expected_dtype.str} needs "
            f"{length * expected_dtype.itemsize}"
        )
    array = data.view(expected_dtype) if type(data) is np.ndarray else np.frombuffer(data, dtype=expected_dtype)
    array.flags.writeable = False  # as a view of bytes is: a loaded graph's columns are read-only
    return array


def _read_version(doc: dict[str, Any]) -> tuple[int, int]:
    version = doc.get(VERSION_KEY)
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)
    ):
        raise FormatError(f"version must be an array of two non-negative integers [major, minor], not {version!r}")
    major, minor = version
    if major > READ_MAJORS[-1]:
        raise FormatError(
            f"the file uses format version {major}.{minor}, newer than this graphsvc reads "
            f"(major versions {' and '.join(map(str, READ_MAJORS))}); upgrade graphsvc"
        )
    if major < 1:
        raise FormatError(f"unknown format version {major}.{minor}")
    return major, minor


#: The ``plugin`` and ``version`` of an op table entry: a str or nil.
_STR_OR_NIL = frozenset({str, type(None)})
_TAG, _PLUGIN, _VERSION = (operator.methodcaller("get", field) for field in OP_FIELDS)


def _read_ops(doc: dict[str, Any]) -> tuple[list[str], dict[str, OpSource]]:
    ops = expect(doc[OPS_KEY], list, OPS_KEY)
    if len(ops) > MAX_OPS:  # op codes are uint16: checked first, before any entry (FORMAT.md §7, rule 2)
        raise FormatError(f"too many ops: {len(ops)} (at most {MAX_OPS})")
    # Every rule at once, a field at a time; when one fails, entry by entry below, which words it.
    if ops and set(map(type, ops)) == {dict}:
        tags, plugins, versions = list(map(_TAG, ops)), list(map(_PLUGIN, ops)), list(map(_VERSION, ops))
        if (
            set(map(type, tags)) == {str}
            and all(tags)
            and len(set(tags)) == len(tags)
            and set(map(type, plugins)) <= _STR_OR_NIL
            and set(map(type, versions)) <= _STR_OR_NIL
        ):
            pairs = list(zip(plugins, versions, strict=True))
            shared = {pair: OpSource(*pair) for pair in set(pairs)}  # frozen, so one per (plugin, version)
            return tags, {tag: shared[pair] for tag, pair in zip(tags, pairs, strict=True)}
    table: list[str] = []
    sources: dict[str, OpSource] = {}
    for i, entry in enumerate(ops):
        where = f"{OPS_KEY}[{i}]"
        entry = expect(entry, dict, where)
        tag = expect(entry.get(OP_TAG_KEY), str, f"{where}.{OP_TAG_KEY}")
        if not tag:
            raise FormatError(f"{where}.{OP_TAG_KEY} is an empty string")
        plugin = entry.get(OP_PLUGIN_KEY)
        version = entry.get(OP_VERSION_KEY)
        if plugin is not None:
            expect(plugin, str, f"{where}.{OP_PLUGIN_KEY}")
        if version is not None:
            expect(version, str, f"{where}.{OP_VERSION_KEY}")
        if tag in sources:
            raise FormatError(f"ops lists the tag {tag!r} twice")
        table.append(tag)
        sources[tag] = OpSource(plugin, version)
    return table, sources


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _read_sparse(doc: dict[str, Any], key: str, kind: type, n: int) -> dict[int, Any]:
    entries = expect(doc[key], list, key)
    if not entries:
        return {}
    # Every rule at once, a column at a time; when one fails, entry by entry below, which words it.
    if set(map(type, entries)) == {list} and set(map(len, entries)) == {2}:
        nodes, items = list(map(_FIRST, entries)), list(map(_SECOND, entries))  # zip(*entries): 3x as long
        if (
            set(map(type, nodes)) == {int}
            and set(map(type, items)) == {kind}
            and 0 <= nodes[0]
            and nodes[-1] < n
            and all(map(operator.lt, nodes[:-1], nodes[1:]))
        ):
            return dict(zip(nodes, items, strict=True))
    result: dict[int, Any] = {}
    previous = -1
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, list) or len(entry) != 2:
            raise FormatError(f"{where} must be an array [node id, {'name' if kind is str else 'map'}]")
        node = expect(entry[0], int, f"{where}[0]")
        if not 0 <= node < n:
            raise FormatError(
                f"{where} refers to node {node}, which does not exist (the graph has {counted(n, 'node')})"
            )
        if node <= previous:
            what = "twice" if node == previous else "out of order (ids must increase)"
            raise FormatError(f"{where}: node {node} is listed {what}")
        previous = node
        result[node] = expect(entry[1], kind, f"{where}[1]")
    return result


def _read_tensors(
    doc: dict[str, Any], count: int, values: npt.NDArray[Any], grads: npt.NDArray[Any] | None
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Version 2.0's arrays: every entry of the tensor table checked against the data section
    (which the file holds already, so nothing is allocated until all pass), then each array a
    read-only view into it; the empty arrays (a dimension of 0) of one dtype and shape are one
    read-only array, shared by their nodes (a table of a million empty arrays holds one)."""
    entries = expect(doc[TENSORS_KEY], list, TENSORS_KEY)
    if PAD_KEY in doc:  # optional; its bytes are ignored, but it is bin data (FORMAT.md §15.3, rule 1)
        expect(doc[PAD_KEY], bytes, PAD_KEY)
    data = doc[DATA_KEY]
    if not isinstance(data, np.ndarray):  # read by fastload: the payload's own buffer, else bytes
        data = expect(data, bytes, DATA_KEY)
    else:  # read-only down to the memory's owner: no array of the graph can be made writable again
        data.flags.writeable = False
    size = len(data)
    # Views of a read-only buffer are read-only: no flag to set per array.
    buffer = np.frombuffer(data, dtype=np.uint8)
    buffer.flags.writeable = False
    if _ctable is not None and _NATIVE_DTYPES:
        viewed = _ctable.tensor_views(entries, count, size, ALIGNMENT, _DTYPE_ITEMS, values, grads, np.ndarray, buffer)
        if viewed is not None:
            views: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = viewed
            return views
    # no C check, or some rule is broken (or the table is unusual): checked entry by entry, which words it
    table = _checked_table(entries, count, size, values, grads)
    arrays: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})
    empties: dict[tuple[np.dtype[Any], tuple[int, ...]], np.ndarray] = {}  # one array a dtype and shape
    for node, which, dtype, shape, offset in table:
        empty = 0 in shape
        array = empties.get((dtype, tuple(shape))) if empty else None
        if array is None:
            array = np.ndarray(shape, dtype, buffer, offset)
            if not dtype.isnative:  # a big-endian machine: the one case that copies
                array = array.astype(dtype.newbyteorder("="))
                array.flags.writeable = False
            if empty:
                empties[dtype, tuple(shape)] = array
        arrays[which][node] = array
    return arrays


#: ``graphsvc.native._ctable`` (:func:`graphsvc.native.compiled_table`), or None. Its ``tensor_views`` is
#: the C twin of :func:`_checked_table`: it checks the whole table in one pass and only says "every
#: rule holds" (the arrays) or "look closer" (None: :func:`_checked_table` words the error); it
#: accepts payloads only in table order, as a writer lays them out.
_ctable = compiled_table()
#: ``(dtype, itemsize)`` by a dtype's name in the tensor table, for the C twin.
_DTYPE_ITEMS = {name: (dtype, dtype.itemsize) for name, dtype in TENSOR_DTYPES.items()}
#: A stored dtype's name in the tensor table (``F32``), by the dtype.
_DTYPE_NAME = {dtype: name for name, dtype in TENSOR_DTYPES.items()}
#: Are the stored dtypes (little-endian) this machine's own? Else arrays are copied (below), in Python.
_NATIVE_DTYPES = all(dtype.isnative for dtype in TENSOR_DTYPES.values())

#: What :func:`_checked_table` returns: ``(node, which, dtype, shape, offset)`` per entry.
_Table = list[tuple[int, int, np.dtype[Any], Any, int]]


def _checked_table(
    entries: list[Any], count: int, size: int, values: npt.NDArray[Any], grads: npt.NDArray[Any] | None
) -> _Table:
    """The tensor table checked entry by entry, in the order FORMAT.md states the rules: raises the
    FormatError naming the first rule broken."""
    checked = [_read_tensor_entry(entry, i, count, size) for i, entry in enumerate(entries)]
    not_nan = _first_not_nan([entry[0] for entry in checked], [entry[1] for entry in checked], values, grads)
    previous: tuple[int, int] = (-1, 1)
    for i, (node, which, _, shape, _, _) in enumerate(checked):
        if (node, which) <= previous:
            what = "twice" if (node, which) == previous else "out of order (entries are sorted by node, a value first)"
            raise FormatError(f"tensors[{i}]: the {WHICH[which]} of node {node} is listed {what}")
        previous = (node, which)
        if i == not_nan:
            column, key = (values, VALUES_COLUMN) if which == 0 else (grads, GRADS_COLUMN)
            assert column is not None
            raise FormatError(
                f"tensors[{i}]: node {node} holds a {'value' if which == 0 else 'gradient'} array, so its entry in "
                f"the {key} column must be nan, not {float(column[node])!r}"
            )
        if which == 1 and i and checked[i - 1][:2] == (node, 0):  # a gradient array beside a value array
            value_dtype, value_shape = checked[i - 1][2], checked[i - 1][3]
            if checked[i][2] != value_dtype:
                raise FormatError(
                    f"tensors[{i}]: node {node}'s gradient is {_DTYPE_NAME[checked[i][2]]}, "
                    f"but its value is {_DTYPE_NAME[value_dtype]} (a gradient has its value's dtype)"
                )
            if value_shape != shape:
                raise FormatError(
                    f"tensors[{i}]: node {node}'s gradient has shape {shape_text(shape)}, "
                    f"but its value has shape {shape_text(value_shape)}"
                )
    spans = sorted((offset, offset + nbytes, i) for i, (*_, offset, nbytes) in enumerate(checked) if nbytes)
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            one, two = sorted((first, second))
            raise FormatError(f"tensors[{one}] and tensors[{two}] overlap in the data section (at byte {start})")
    return [(node, which, dtype, shape, offset) for node, which, dtype, shape, offset, _ in checked]


def _first_not_nan(
    nodes: Sequence[int], which: Sequence[int], values: npt.NDArray[Any], grads: npt.NDArray[Any] | None
) -> int | None:
    """The index of the first entry whose node's column entry is not nan (rule 8), or None: one
    vectorized look at the columns instead of one per entry."""
    if not nodes:
        return None
    index = np.array(nodes, dtype=np.int64)
    is_grad = np.array(which, dtype=bool)
    entries = values[index]
    if grads is not None:
        entries = np.where(is_grad, grads[index], entries)
    else:
        entries = np.where(is_grad, np.nan, entries)
    bad = ~np.isnan(entries)
    return int(bad.argmax()) if bad.any() else None


def _read_tensor_entry(
    entry: Any, i: int, count: int, size: int
) -> tuple[int, int, np.dtype[Any], tuple[int, ...], int, int]:
    """One tensor table entry (``tensors[i]``), checked on its own: ``(node, which, dtype, shape,
    offset, nbytes)``. The checks of a well-formed entry are inlined (a table has thousands)."""
    if type(entry) is not list or len(entry) != 6:
        raise FormatError(f"tensors[{i}] must be an array [node, which, dtype, shape, offset, nbytes]")
    node, which_name, dtype_name, raw_shape, offset, nbytes = entry
    if type(node) is not int:
        expect(node, int, f"tensors[{i}][0]")
    if not 0 <= node < count:
        raise FormatError(
            f"tensors[{i}] refers to node {node}, which does not exist (the graph has {counted(count, 'node')})"
        )
    if which_name == WHICH_VALUE:
        which = 0
    elif which_name == WHICH_GRAD:
        which = 1
    else:
        raise FormatError(f'tensors[{i}][1] must be "value" or "grad", not {shown(which_name)}')
    dtype = TENSOR_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise FormatError(f'tensors[{i}][2] must be a dtype "F64", "F32" or "I64", not {shown(dtype_name)}')
    if type(raw_shape) is not list:
        expect(raw_shape, list, f"tensors[{i}][3]")
    if len(raw_shape) > MAX_DIMENSIONS:
        raise FormatError(
            f"tensors[{i}]: the shape has {counted(len(raw_shape), 'dimension')}, more than {MAX_DIMENSIONS}"
        )
    items = 1
    for k, dimension in enumerate(raw_shape):
        if type(dimension) is not int or dimension < 0:
            raise FormatError(
                f"tensors[{i}][3][{k}] must be a non-negative integer (a dimension), not {shown(dimension)}"
            )
        items *= dimension or 1  # as numpy counts: an empty array may not have a huge other dimension either
    shape = tuple(raw_shape)
    if items * dtype.itemsize > MAX_ARRAY_BYTES:
        raise FormatError(f"tensors[{i}]: the shape {shape_text(shape)} is too large (more than 2**63 - 1 bytes)")
    needed = dtype.itemsize * (0 if 0 in shape else items)
    if needed > size:
        raise FormatError(
            f"tensors[{i}]: an {dtype_name} array of shape {shape_text(shape)} takes "
            f"{counted(needed, 'byte', thousands=True)}, more than the data section's {size:,}"
        )
    if type(offset) is not int:
        expect(offset, int, f"tensors[{i}][4]")
    if type(nbytes) is not int:
        expect(nbytes, int, f"tensors[{i}][5]")
    if nbytes != needed:
        raise FormatError(
            f"tensors[{i}]: nbytes is {nbytes}, but an {dtype_name} array of shape {shape_text(shape)} takes {needed}"
        )
    if offset < 0:
        raise FormatError(f"tensors[{i}]: the offset {offset} is negative")
    if offset % ALIGNMENT:
        raise FormatError(f"tensors[{i}]: the offset {offset} is not a multiple of {ALIGNMENT}")
    if offset + nbytes > size:
        raise FormatError(
            f"tensors[{i}]: bytes {offset:,} to {offset + nbytes:,} lie outside the data section's "
            f"{counted(size, 'byte', thousands=True)}"
        )
    return node, which, dtype, shape, offset, nbytes


# -- graphs whose arrays view a mapped file ----------------------------------------------------
MAPPED_CHANGED = (
    "the file this graph's arrays are mapped from (load(mmap=True)) was truncated or changed while mapped: "
    "its arrays cannot be read; load it again"
)


def mappings(graph: Graph) -> list[mmap.mmap]:
    """The mapped files (``load(mmap=True)``) ``graph``'s arrays view, each once."""
    found: dict[int, mmap.mmap] = {}
    for table in (graph.arrays, graph.grad_arrays):
        for array in table.values():
            base = getattr(array, "base", None)
            while base is not None:
                if isinstance(base, mmap.mmap):
                    found[id(base)] = base
                    break
                base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return list(found.values())


def check_mapped(graph: Graph) -> None:
    """Raise :class:`GraphFileError` if a file ``graph``'s arrays are mapped from (``load(mmap=True)``)
    is now shorter than its mapping: reading the pages it lost would kill the process with SIGBUS.

    ``graphsvc.format``'s save, dump and dumps, ``jsonio.dumps`` and the replays call it before they
    read the arrays. It cannot see bytes written
    into the file in place, nor a truncation after it returns (see :func:`load`)."""
    for mapping in mappings(graph):
        try:
            now = mapping.size()  # the file's size now (fstat of the descriptor the mapping keeps)
        except (OSError, ValueError):  # a closed mapping: numpy keeps its own open
            continue
        if now < len(mapping):
            raise GraphFileError(
                f"the file this graph's arrays are mapped from (load(mmap=True)) is now "
                f"{counted(now, 'byte', thousands=True)}, shorter than the {len(mapping):,} mapped: it was "
                "truncated while mapped, and reading its arrays would kill the process (SIGBUS); load it again"
            )
