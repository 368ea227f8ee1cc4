"""A readable JSON form of a graph, for writing graphs by hand or from another tool.

``graphsvc convert FILE --to json`` writes it; ``graphsvc convert FILE.json --to msgpack`` reads it.
Node ids in JSON may be any distinct non-negative integers in any order and a parent may be given
by name; reading sorts the nodes topologically (ties keep the order they are listed in), so ids
already in topological order are kept, and a cycle is an error naming the nodes on it.

Floats that JSON cannot hold are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``;
every other float is written with Python's shortest round-trip repr, so values survive exactly.
A tensor node's value or gradient is an object ``{"dtype": "float32", "shape": [2, 3], "data":
[[...], [...]]}`` (JSON version 2.0, written only for tensor graphs; see schemas/FORMAT.md §13).

Writing goes a chunk of nodes at a time from the columns (:func:`chunks`; the nodes' text in C,
``graphsvc.native._ctext``, where it was built): a 5M-node chain's 734 MB of JSON is written
holding one chunk's text, never a document of Python objects. Reading takes the bytes straight
into the columns (:func:`read_columns`, in C: ``graphsvc.native._cjson``) when the document is in
the shape a writer gives it, with no Python object per node; any other document, or any doubt, is
read the long way (:func:`read_objects`: ``json.loads``, then every check), which builds the same
graph or words the error, so a document gives the same graph, warnings or error either way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from graphsvc.errors import FormatError, GraphStructureError, GraphsvcError
from graphsvc.format import keys
from graphsvc.format.document import check_mapped, check_text, not_unicode, quoted
from graphsvc.format.layout import DEFAULT_LIMITS, MAX_ARRAY_BYTES
from graphsvc.graph import (
    FLOAT_DTYPE,
    MAX_DIMENSIONS,
    MAX_OPS,
    Graph,
    OpSource,
    graph_from_buffers,
    graph_from_lists,
    sealed,
)
from graphsvc.native.loader import extension
from graphsvc.text import counted, first_surrogate, json_escaped, shorten
from graphsvc.topo import topological_sort

JSON_FORMAT_NAME = "graphsvc-json"
#: The version written for a graph of float64 scalars.
JSON_VERSION = (1, 0)
#: The version written for a tensor graph: a value or gradient may be an array object.
JSON_TENSOR_VERSION = (2, 0)
#: A tensor's dtype in the JSON form (numpy's names) -> its numpy dtype.
JSON_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype("float64"),
    "float32": np.dtype("float32"),
    "int64": np.dtype("int64"),
}
_INT64_RANGE = (-(1 << 63), (1 << 63) - 1)
_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _characters(text: str) -> str:
    return counted(len(text), "character", thousands=True)


def json_float(x: float) -> float | str:
    """A float for strict JSON: finite floats as they are, the others as "nan", "inf", "-inf"."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _float_in(x: Any, where: str) -> float:
    if isinstance(x, str) and x in _SPECIAL:
        return _SPECIAL[x]
    if isinstance(x, float):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            digits = counted(len(str(abs(x))), "digit")
            raise FormatError(f"{where} is an integer too large for a float64 ({digits})") from None
    raise FormatError(f'{where} must be a number or one of "nan", "inf", "-inf", not {x!r}')


def json_array(array: np.ndarray) -> dict[str, Any]:
    """A tensor for JSON: ``{"dtype", "shape", "data"}``, data as nested lists (a 0-d array's is
    one number), floats as :func:`json_float` writes them; a float32 with the shortest text that
    reads back to the same float32."""
    if array.dtype.kind == "i":
        flat: list[Any] = array.reshape(-1).tolist()
    elif array.dtype.itemsize == 4:
        flat = [_float32_text(x) for x in array.reshape(-1)]
    else:
        flat = [json_float(x) for x in array.reshape(-1).tolist()]
    nested = np.empty(len(flat), dtype=object)
    nested[:] = flat
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": nested.reshape(array.shape).tolist()}


def _float32_text(x: np.float32) -> float | str:
    """The float64 to write for a float32: its shortest decimal when that reads back to the same
    bits, else its exact value."""
    if not np.isfinite(x):
        return json_float(float(x))
    short = float(str(x))
    return short if np.float32(short).view(np.uint32) == x.view(np.uint32) else float(x)


def to_document(graph: Graph) -> dict[str, Any]:
    """The JSON document of a graph (a plain dict); a tensor node's value or gradient is an object
    of :func:`json_array`."""
    values = graph.values.tolist()
    grads = None if graph.grads is None else graph.grads.tolist()
    offsets = graph.parent_offsets.tolist()
    parents = graph.parent_indices.tolist()
    nodes = []
    for node in range(graph.num_nodes):
        item: dict[str, Any] = {
            "id": node,
            "name": graph.names.get(node),
            "op": graph.op(node),
            "parents": parents[offsets[node] : offsets[node + 1]],
            "value": json_array(graph.arrays[node]) if node in graph.arrays else json_float(values[node]),
        }
        if node in graph.grad_arrays:
            item["grad"] = json_array(graph.grad_arrays[node])
        elif grads is not None:
            item["grad"] = json_float(grads[node])
        if node in graph.attrs:
            item["attrs"] = graph.attrs[node]
        nodes.append(item)
    ops = {}
    for tag in graph.op_table:
        source = graph.op_sources.get(tag, OpSource())
        ops[tag] = {"plugin": source.plugin, "version": source.version}
    return {
        "format": JSON_FORMAT_NAME,
        "version": list(JSON_TENSOR_VERSION if graph.is_tensor_graph else JSON_VERSION),
        "ops": ops,
        "nodes": nodes,
        "outputs": list(graph.outputs),
        "metadata": graph.metadata,
    }


#: An array holding only numbers, strings, true, false or null, one item per line as ``json.dumps``
#: indents it (a string item may hold brackets and escaped quotes; it never holds a newline).
_FLAT_ARRAY = re.compile(r'\[\n(?:[ ]*(?:"(?:[^"\\\n]|\\.)*"|[-+.\w]+),?\n)+[ ]*\]')


def _one_line(match: re.Match[str]) -> str:
    items = [line.strip().rstrip(",") for line in match.group(0).split("\n")[1:-1]]  # not splitlines: U+2028
    return "[" + ", ".join(items) + "]"


def dumps(graph: Graph) -> str:
    """The graph as indented JSON text: one key per line, an array of numbers or strings on one
    line (parents, a shape, the innermost rows of an array's data). Refuses, as ``save`` does, what
    a reader would refuse in its text (a lone surrogate, a string over 1 MiB, nesting past 32 levels).
    The same text as :func:`chunks` gives, in one str."""
    return b"".join(chunks(graph)).decode()


#: How many nodes one chunk of :func:`chunks` holds.
CHUNK_NODES = 1 << 16


def chunks(graph: Graph) -> Iterator[bytes]:
    """:func:`dumps`'s text as UTF-8, a chunk of :data:`CHUNK_NODES` nodes at a time, written from
    the columns (no document of Python objects: a chunk's text is all that is held). Everything
    that could refuse the graph (the checks of ``save``, attributes or metadata that JSON cannot
    hold) is checked before the first chunk is given, so a refused graph writes nothing."""
    check_mapped(graph)
    check_text(graph, DEFAULT_LIMITS)
    _check_attrs(graph)  # before the metadata (in the frame), as the document has them
    head, tail = _frame(graph)
    n = graph.num_nodes
    if not n:
        yield (head + "]" + tail).encode()
        return
    specials = _special_nodes(graph)
    yield (head + "\n").encode()
    for first in range(0, n, CHUNK_NODES):
        last = min(first + CHUNK_NODES, n)
        inside = specials[np.searchsorted(specials, first) : np.searchsorted(specials, last)]
        yield json_escaped(nodes_text(graph, first, last, inside, first > 0)).encode()
    yield ("\n " + "]" + tail).encode()


def _json_text(value: Any, depth: int) -> str:
    """``value`` as ``json.dumps(value, indent=1)`` writes it at ``depth`` levels of indentation
    (arrays of numbers or strings on one line), not yet escaped (:func:`json_escaped`, over the chunk)."""
    try:
        text = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:  # nan, inf or bin data inside attributes or metadata
        raise _unwritable(exc) from None
    text = _FLAT_ARRAY.sub(_one_line, text)
    return text.replace("\n", "\n" + " " * depth) if depth else text  # a string never holds a newline


def _frame(graph: Graph) -> tuple[str, str]:
    """The document around its nodes: the text up to the nodes' ``[`` and from after its ``]``."""
    document = {
        "format": JSON_FORMAT_NAME,
        "version": list(JSON_TENSOR_VERSION if graph.is_tensor_graph else JSON_VERSION),
        "ops": {
            tag: {"plugin": source.plugin, "version": source.version}
            for tag, source in ((tag, graph.op_sources.get(tag, OpSource())) for tag in graph.op_table)
        },
        "nodes": [],
        "outputs": list(graph.outputs),
        "metadata": graph.metadata,
    }
    text = json_escaped(_json_text(document, 0)) + "\n"
    # the document's own key, at one space: a key inside ops or metadata is indented more, and no
    # string holds a newline
    head, tail = text.split('\n "nodes": []', 1)
    return head + '\n "nodes": [', tail


def _check_attrs(graph: Graph) -> None:
    """Refuse attributes JSON cannot hold (nan, inf, bin data) before anything is written."""
    attrs = list(graph.attrs.values())
    for start in range(0, len(attrs), CHUNK_NODES):
        batch = attrs[start : start + CHUNK_NODES]
        try:  # compact, in C; what fails here fails indented too, which words it as dumps does
            json.dumps(batch, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            _json_text(batch, 0)


def _unwritable(exc: Exception) -> GraphsvcError:
    return GraphsvcError(
        f"cannot write the graph as JSON: {exc} (in JSON, attributes and metadata cannot hold nan, inf or bin data)"
    )


def _special_nodes(graph: Graph) -> npt.NDArray[np.int64]:
    """The nodes whose text has a part :func:`_parts` writes (an array value or gradient, attributes), sorted."""
    found = set(graph.attrs).union(graph.arrays, graph.grad_arrays)
    return np.array(sorted(found), dtype=np.int64)


def _parts(graph: Graph, node: int) -> tuple[str | None, str | None, str | None]:
    """A node's value, gradient and attributes as JSON text at a node's keys' depth, where they are
    not a scalar (None: the column's float, or no attributes)."""
    array = graph.arrays.get(node)
    grad = graph.grad_arrays.get(node)
    attrs = graph.attrs.get(node)
    return (
        None if array is None else _array_text(array, _KEY_DEPTH),
        None if grad is None else _array_text(grad, _KEY_DEPTH),
        None if attrs is None else _json_text(attrs, _KEY_DEPTH),
    )


def _array_text(array: np.ndarray, depth: int) -> str:
    """``_json_text(json_array(array), depth)``: its innermost rows written one line each
    (:func:`_row_texts`), the nesting around them here."""
    dtype, shape = json.dumps(array.dtype.name), json.dumps(list(array.shape))
    if array.ndim == 0:
        data_text = json.dumps(json_array(array)["data"], allow_nan=False)
    else:
        data_text = _nested(array.shape, iter(_row_texts(array) if array.size else ()))
    text = f'{{\n "dtype": {dtype},\n "shape": {shape},\n "data": {data_text}\n}}'
    return text.replace("\n", "\n" + " " * depth)


def _row_texts(array: np.ndarray) -> list[str]:
    """The innermost rows of a non-empty array of at least one dimension, in C order, each as
    ``json.dumps`` writes a list of :func:`json_array`'s items: a float64 array's in C
    (``graphsvc.native._ctext.json_float_rows``) where it was built."""
    width = array.shape[-1]
    text_module = extension("text")
    if array.dtype == np.float64 and text_module is not None:
        return list(text_module.json_float_rows(np.ascontiguousarray(array).reshape(-1), width))
    if array.dtype.kind == "i" or (array.dtype.itemsize == 8 and bool(np.isfinite(array).all())):
        return ["[" + ", ".join(map(repr, row)) + "]" for row in array.reshape(-1, width).tolist()]
    flat = json_array(array.reshape(-1))["data"]
    return [json.dumps(flat[i : i + width], allow_nan=False) for i in range(0, len(flat), width)]


def _nested(shape: tuple[int, ...], rows: Iterator[str]) -> str:
    """The nesting of an array of ``shape`` around its innermost ``rows``, as ``json.dumps(...,
    indent=1)`` writes it at one level of indentation (one row a line, ``[]`` for an empty axis).
    A stack, not recursion (a shape has at most MAX_DIMENSIONS axes)."""
    last = len(shape) - 1
    out: list[str] = []
    work: list[str | tuple[int, int]] = [(0, 1)]  # (axis, indentation), or text
    while work:
        item = work.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        axis, level = item
        if not shape[axis]:
            out.append("[]")
        elif axis == last:
            out.append(next(rows))
        else:
            pieces: list[str | tuple[int, int]] = ["[\n"]
            for i in range(shape[axis]):
                pieces += [" " * (level + 1), (axis + 1, level + 1), ",\n" if i < shape[axis] - 1 else "\n"]
            pieces.append(" " * level + "]")
            work.extend(reversed(pieces))
    return "".join(out)


#: The indentation of a node's keys: the document's keys at 1, a node at 2, its keys at 3.
_KEY_DEPTH = 3


def nodes_text(graph: Graph, first: int, last: int, specials: npt.NDArray[np.int64], leading_comma: bool) -> str:
    """The text of nodes ``first`` to ``last - 1`` as :func:`dumps` writes them, joined by ``,\\n``
    (and one more first with ``leading_comma``), not yet escaped; ``specials``: those of them that
    :func:`_parts` writes a part of. In C (``graphsvc.native._ctext.graph_json_chunk``) where it
    was built, else :func:`reference_nodes_text`."""
    text_module = extension("text")
    if text_module is None:
        return reference_nodes_text(graph, first, last, specials, leading_comma)
    return str(
        text_module.graph_json_chunk(
            first,
            last,
            graph.op_codes,
            graph.parent_offsets,
            graph.parent_indices,
            graph.values,
            graph.grads,
            graph.names or None,
            graph.op_table,
            specials,
            lambda node: _parts(graph, node),
            leading_comma,
        )
    )


def reference_nodes_text(
    graph: Graph, first: int, last: int, specials: npt.NDArray[np.int64], leading_comma: bool
) -> str:
    """:func:`nodes_text` in Python."""
    values = graph.values[first:last].tolist()
    grads = None if graph.grads is None else graph.grads[first:last].tolist()
    offsets = graph.parent_offsets[first : last + 1].tolist()
    parents = graph.parent_indices[offsets[0] : offsets[-1]].tolist()
    base = offsets[0]
    tags = [json.dumps(tag, ensure_ascii=False) for tag in graph.op_table]
    codes = graph.op_codes[first:last].tolist()
    special = set(specials.tolist())
    out = []
    for i, node in enumerate(range(first, last)):
        name = graph.names.get(node)
        value, grad, attrs = _parts(graph, node) if node in special else (None, None, None)
        if value is None:
            value = _float_text(values[i])
        if grad is None and grads is not None:
            grad = _float_text(grads[i])
        listed = ", ".join(map(str, parents[offsets[i] - base : offsets[i + 1] - base]))
        text = (
            f'  {{\n   "id": {node},\n   "name": {"null" if name is None else json.dumps(name, ensure_ascii=False)},'
            f'\n   "op": {tags[codes[i]]},\n   "parents": [{listed}],\n   "value": {value}'
        )
        if grad is not None:
            text += f',\n   "grad": {grad}'
        if attrs is not None:
            text += f',\n   "attrs": {attrs}'
        out.append(text + "\n  }")
    return (",\n" if leading_comma else "") + ",\n".join(out)


def _float_text(x: float) -> str:
    """A float as JSON text (:func:`json_float`): its repr, or ``"nan"``, ``"inf"``, ``"-inf"`` quoted."""
    return repr(x) if math.isfinite(x) else f'"{json_float(x)}"'


def loads(text: str) -> Graph:
    """Read a graph from JSON text; any problem raises :class:`FormatError`. A key the reader does
    not know is ignored with an :class:`~graphsvc.errors.UnknownKeyWarning` (``graphsvc.load`` and
    ``graphsvc.loads`` take ``strict=True`` to refuse it)."""
    return loads_versioned(text)[0]


def loads_versioned(text: str) -> tuple[Graph, tuple[int, int]]:
    """Like :func:`loads`, and also return the version the document declares ``(major, minor)``."""
    try:  # a BOM in a str is an error of json.loads's: the long way words it
        data = None if text.startswith("\ufeff") else text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the long way says where
        data = None
    found = None if data is None else read_columns(data)
    del data
    return found if found is not None else read_objects(text)


def read_columns(data: bytes | bytearray | memoryview) -> tuple[Graph, tuple[int, int]] | None:
    """The graph of a document in UTF-8 (a BOM allowed) read straight into its columns, in C
    (``graphsvc.native._cjson``): no Python object per node, and the same graph :func:`read_objects`
    builds (an array object's data read straight into the array's bytes). None, so that
    :func:`read_objects` reads it and words what is wrong, when the document is not in the shape a
    writer gives it (ids 0, 1, 2... in order, parents by id before their children, an array object's
    keys in the order dtype, shape, data, no unknown or repeated key, only Unicode text, numbers a
    float64 holds), or anything about it is in doubt, or the extension is not in use."""
    module = extension("json")
    if module is None:
        return None
    try:
        parsed = module.read(data)
    except MemoryError:  # the long way says it, or gets through with less
        return None
    if parsed is None:
        return None
    top, tags, codes, offsets, parents, values, grads, names, attrs, arrays, grad_arrays = parsed
    del parsed
    version = top.get("version")
    n = len(offsets) // 8 - 1
    outputs = top.get("outputs", [])
    metadata = top.get("metadata", {})
    ops = top.get("ops", {})
    if (  # what from_document checks of these parts; any doubt: the long way, which words it
        top.get("format") != JSON_FORMAT_NAME
        or not isinstance(version, list)
        or len(version) != 2
        or not all(type(v) is int and v >= 0 for v in version)
        or version[0] > JSON_TENSOR_VERSION[0]
        or not isinstance(outputs, list)
        or not all(type(o) is int and 0 <= o < n for o in outputs)
        or not isinstance(metadata, dict)
        or not isinstance(ops, dict)
        or not all(
            isinstance(entry, dict) and all(isinstance(entry.get(k), (str, type(None))) for k in JSON_OP_FIELDS)
            for entry in ops.values()
        )
        or len(set(names.values())) != len(names)
        or ((arrays or grad_arrays) and version[0] < JSON_TENSOR_VERSION[0])  # 1.x holds no arrays
    ):
        return None
    sources = {tag: OpSource(ops.get(tag, {}).get("plugin"), ops.get(tag, {}).get("version")) for tag in tags}
    graph = graph_from_buffers(
        tags,
        codes,
        offsets,
        parents,
        values,
        grads,
        names=names,
        attrs=attrs,
        outputs=list(outputs),
        metadata=metadata,
        op_sources=sources,
        arrays={node: _array_of(*found) for node, found in arrays.items()},
        grad_arrays={node: _array_of(*found) for node, found in grad_arrays.items()},
    )
    try:
        graph.check()
    except GraphStructureError:
        return None
    if "outputs" not in top:  # left out: the sinks, as GraphBuilder.build() defaults them
        graph.outputs = [int(s) for s in graph.sinks()]
    keys.found(keys.in_json({**top, "nodes": []}, False))
    return graph, (version[0], version[1])


def _array_of(dtype: str, shape: tuple[int, ...], data: bytearray) -> np.ndarray:
    """An array the C reader read: its items' bytes viewed, read-only, as a loaded graph keeps them."""
    # viewed through a read-only buffer, so that no view of it can be made writable again
    return sealed(np.frombuffer(memoryview(data).toreadonly(), dtype=JSON_DTYPES[dtype]).reshape(shape))


#: The keys of an ``ops`` entry.
JSON_OP_FIELDS = ("plugin", "version")


def read_objects(text: str) -> tuple[Graph, tuple[int, int]]:
    """:func:`loads_versioned` the long way: ``json.loads`` with every check, then the graph built
    from the decoded document; any problem is a :class:`FormatError` that says what is wrong."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_object)
    except _RepeatedKey:
        raise FormatError(_text_problem(text) or "an object repeats a key") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300 by default)
        raise FormatError(f"not valid JSON: {shorten(str(exc).split(';')[0], 120)}") from None
    except MemoryError:
        raise FormatError(f"not enough memory to read {_characters(text)} of JSON") from None
    if _may_hold_surrogates(text):
        problem = _text_problem(text)
        if problem is not None:
            raise FormatError(problem)
    try:
        graph = from_document(doc)
    except GraphStructureError as exc:
        raise FormatError(str(exc)) from None
    except MemoryError:
        raise FormatError(f"not enough memory to build the graph of {_characters(text)} of JSON") from None
    keys.found(keys.in_json(doc, graph.is_tensor_graph))
    major, minor = doc["version"]
    return graph, (major, minor)


#: How far from the end of the first bytes a syntax error must be for :func:`check_head` to trust
#: it (a number, a literal or an escape cut off at the end is an error only there).
_HEAD_MARGIN = 64


def check_head(text: str) -> None:
    """Raise the FormatError :func:`loads_versioned` gives the whole text when ``text``, its start,
    already shows it: a syntax error well before the end of ``text`` is where the whole text's
    parse fails too (the parse is one pass from the start), except a string left open, which
    the rest may close. Nothing otherwise: the whole text decides."""
    try:
        json.loads(text, parse_constant=str, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        if exc.pos < len(text) - _HEAD_MARGIN and not exc.msg.startswith("Unterminated string"):
            raise FormatError(f"not valid JSON: {exc}") from None
    except (_RepeatedKey, ValueError, RecursionError, MemoryError):  # the whole text words these
        pass


class _RepeatedKey(Exception):
    """An object of the JSON text lists a key twice (:func:`_text_problem` says where)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a repeated key (``json`` would keep the last value), as the
    msgpack reader refuses a map that repeats one. A Python call per object: ``loads`` of 100,000
    nodes with an attribute each took 1.6 s, 1.9 s with it."""
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise _RepeatedKey
    return mapping


#: The JSON escape of a surrogate code point (half of a pair, one character, or a lone one), or an
#: escaped backslash, matched as a whole so that the ``u`` after it is not read as an escape's.
_SURROGATE_ESCAPE = re.compile(r"\\\\|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _may_hold_surrogates(text: str) -> bool:
    """Might a string of the document hold a lone surrogate? At once for almost every text: the
    escapes of surrogates are looked at only where there are some, each high one for the low one
    that must follow it (an escaped backslash is skipped whole, so that ``"\\\\ud800\\udc00"``, a
    backslash, ``ud800`` and a lone low surrogate, is not taken for a pair)."""
    if first_surrogate(text) is not None:  # in the text itself (a str given to loads)
        return True
    if "\\u" not in text:
        return False
    pair_end = -1  # where a high surrogate's escape ended: the low one's must start there
    for match in _SURROGATE_ESCAPE.finditer(text):
        if match.end() - match.start() == 2:  # an escaped backslash: "\\ud800" holds no surrogate
            if pair_end != -1:
                return True  # a high surrogate's escape, then no low one
            continue
        low = match.group()[3] in "cdefCDEF"
        if pair_end != -1:
            if not (low and match.start() == pair_end):
                return True
            pair_end = -1
        elif low:
            return True
        else:
            pair_end = match.end()
    return pair_end != -1


class _Pairs(list[tuple[str, Any]]):
    """An object's pairs in their order, for :func:`_text_problem`."""


def _text_problem(text: str) -> str | None:
    """Where the first object that repeats a key, or string or key that holds a lone surrogate (not
    Unicode text, which a graph file holds), is, in the order of the text; None if there is none.
    Only called once one was seen: the text is parsed again, keeping each object's pairs, and
    walked without recursion."""
    try:
        doc = json.loads(text, parse_constant=str, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):  # a problem after the object that repeats a key: words its own
        return None
    walks: list[tuple[str, Iterator[tuple[str | int, Any]]]] = [("", iter([("", doc)]))]
    while walks:
        where, items = walks[-1]
        entry = next(items, None)
        if entry is None:
            walks.pop()
            continue
        key, value = entry
        path = _child_path(where, key) if walks[1:] else ""
        if isinstance(value, str):
            at = first_surrogate(value)
            if at is not None:
                return f"the string at {path} {not_unicode(value[at])}"
        elif isinstance(value, _Pairs):
            container = f"the object at {path}" if path else "the document"
            seen: set[str] = set()
            for i, (name, _) in enumerate(value):
                at = first_surrogate(name)
                if at is not None:
                    return f"a key of {container} (entry {i}) {not_unicode(name[at])}"
                if name in seen:
                    return f"{container} repeats the key {shorten(repr(name), 60)}"
                seen.add(name)
            walks.append((path, iter(value)))
        elif isinstance(value, list):
            walks.append((path, enumerate(value)))
    return None


def _child_path(where: str, key: str | int) -> str:
    """``nodes`` + 0 -> ``nodes[0]``; ``nodes[0]`` + ``name`` -> ``nodes[0].name``; a key that is not
    an identifier is quoted (``metadata['a b']``)."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{shorten(repr(key), 60)}]"


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise FormatError(
            f'the number {shorten(literal, 40)} is too large for a float64 (write "inf" or "-inf" for an infinity)'
        )
    return value


def _reject_constant(name: str) -> Any:
    raise FormatError(f'JSON has a bare {name}; write it as a string ("nan", "inf", "-inf")')


def from_document(doc: Any) -> Graph:
    """Build a graph from a decoded JSON document."""
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT_NAME:
        raise FormatError(f'not a graphsvc JSON document (expected "format": "{JSON_FORMAT_NAME}")')
    version = doc.get("version")
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)
    ):
        raise FormatError("version must be [major, minor]")
    if version[0] > JSON_TENSOR_VERSION[0]:
        raise FormatError(f"the document uses JSON version {version[0]}.{version[1]}, newer than this graphsvc reads")
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        raise FormatError("nodes must be a list")
    by_id: dict[int, dict[str, Any]] = {}
    id_of_name: dict[str, int] = {}
    for i, item in enumerate(raw_nodes):
        if not isinstance(item, dict):
            raise FormatError(f"nodes[{i}] must be an object")
        node_id = item.get("id", i)
        if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id < 0:
            raise FormatError(f"nodes[{i}].id must be a non-negative integer")
        if node_id in by_id:
            raise FormatError(f"nodes[{i}]: id {node_id} is used twice")
        by_id[node_id] = item
        name = item.get("name")
        if name is not None:
            if not isinstance(name, str) or not name:
                raise FormatError(f"nodes[{i}].name must be a non-empty string")
            if name in id_of_name:
                raise FormatError(f"name {name!r} is used by nodes {id_of_name[name]} and {node_id}")
            id_of_name[name] = node_id

    def resolve(ref: Any, where: str) -> int:
        if isinstance(ref, str):
            if ref not in id_of_name:
                raise FormatError(f"{where}: no node is named {ref!r}")
            return id_of_name[ref]
        if isinstance(ref, int) and not isinstance(ref, bool):
            return ref
        raise FormatError(f"{where}: {ref!r} is not a node id or name")

    parents_of: dict[int, list[int]] = {}
    for node_id, item in by_id.items():
        raw = item.get("parents", [])
        if not isinstance(raw, list):
            raise FormatError(f"node {node_id}: parents must be a list")
        parents_of[node_id] = [resolve(p, f"node {node_id}") for p in raw]
    describe = {node_id: _describe(node_id, item) for node_id, item in by_id.items()}
    order = topological_sort(parents_of, describe)
    new_id = {old: new for new, old in enumerate(order)}
    return _assemble(doc, version, by_id, parents_of, order, new_id, resolve)


def _json_value(value: Any) -> str:
    """A decoded JSON value that is not a string, for an error message: a number or a literal as it
    is, anything else by its type (an array or an object may be of any size)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return shorten(repr(value), 40)
    return _json_type(value)


def _json_type(value: Any) -> str:
    """What a decoded JSON value is, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    names = {str: "a string", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _describe(node_id: int, item: dict[str, Any]) -> str:
    name = item.get("name")
    return f"{node_id} ({name})" if name else str(node_id)


def _assemble(
    doc: dict[str, Any],
    version: list[int],
    by_id: dict[int, dict[str, Any]],
    parents_of: dict[int, list[int]],
    order: list[int],
    new_id: dict[int, int],
    resolve: Any,
) -> Graph:
    major, minor = version
    tags: list[str] = []
    op_index: dict[str, int] = {}
    counts: list[int] = []
    parents: list[int] = []
    values: list[float] = []
    grads: list[float] = []
    names: dict[int, str] = {}
    attrs: dict[int, dict[str, Any]] = {}
    arrays: dict[int, np.ndarray] = {}
    grad_arrays: dict[int, np.ndarray] = {}
    # the grads column exists when some node has a scalar gradient (a tensor's is an object)
    has_grads = any("grad" in item and not isinstance(item["grad"], dict) for item in by_id.values())
    for old in order:
        item = by_id[old]
        node = new_id[old]
        op = item.get("op")
        if not isinstance(op, str) or not op:
            raise FormatError(f"node {old}: op must be a non-empty string")
        if op not in op_index and len(op_index) == MAX_OPS:
            raise FormatError(f"the graph uses more than {MAX_OPS:,} op tags, the most the format holds")
        op_index.setdefault(op, len(op_index))
        tags.append(op)
        parents.extend(new_id[p] for p in parents_of[old])
        counts.append(len(parents_of[old]))
        for key, column, tensors in (("value", values, arrays), ("grad", grads, grad_arrays)):
            raw = item.get(key, "nan")
            if isinstance(raw, dict):
                if major < JSON_TENSOR_VERSION[0]:  # as a 1.x msgpack file holds no arrays
                    raise FormatError(
                        f"node {old}: {key} is an array object, which needs JSON version 2.0 "
                        f"(the document's version is {major}.{minor})"
                    )
                tensors[node] = sealed(_array_in(raw, f"node {old}: {key}"))
                raw = "nan"
            column.append(_float_in(raw, f"node {old}: {key}"))
        if item.get("name") is not None:
            names[node] = item["name"]
        if "attrs" in item:
            if not isinstance(item["attrs"], dict):
                raise FormatError(f"node {old}: attrs must be an object, not {_json_type(item['attrs'])}")
            if item["attrs"]:  # an empty object is no attributes (FORMAT.md §5)
                attrs[node] = item["attrs"]
    raw_outputs = doc.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise FormatError("outputs must be a list")
    outputs: list[int] = []
    for ref in raw_outputs:
        old = resolve(ref, "outputs")
        if old not in new_id:
            raise FormatError(f"output {ref!r} does not exist")
        outputs.append(new_id[old])
    metadata = doc.get("metadata", {})
    if not isinstance(metadata, dict):
        raise FormatError("metadata must be an object")
    raw_ops = doc.get("ops", {})
    if not isinstance(raw_ops, dict):
        raise FormatError("ops must be an object")
    for tag, entry in raw_ops.items():  # every entry, used or not, as the msgpack reader checks its op table
        where = f"ops[{quoted(tag)}]"  # a tag is the file's text, of any length
        if not isinstance(entry, dict):
            raise FormatError(f"{where} must be an object, not {_json_type(entry)}")
        for key in ("plugin", "version"):
            if not isinstance(entry.get(key), (str, type(None))):
                raise FormatError(f"{where}.{key} must be a string or null, not {_json_value(entry[key])}")
    op_table = list(op_index)
    sources = {}
    for tag in op_table:
        entry = raw_ops.get(tag, {})
        sources[tag] = OpSource(entry.get("plugin"), entry.get("version"))
    graph = graph_from_lists(
        tags,
        counts,
        parents,
        values,
        grads=np.array(grads, dtype=FLOAT_DTYPE) if has_grads else None,
        names=names,
        attrs=attrs,
        outputs=outputs,
        metadata=metadata,
        op_sources=sources,
        arrays=arrays,
        grad_arrays=grad_arrays,
    )
    graph.check()
    if "outputs" not in doc:  # left out: the sinks, as GraphBuilder.build() defaults them
        graph.outputs = [int(s) for s in graph.sinks()]
    return graph


def _array_in(raw: dict[str, Any], where: str) -> np.ndarray:
    """A tensor object ``{"dtype", "shape", "data"}``: data nested exactly as the shape says."""
    name = raw.get("dtype")
    dtype = JSON_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise FormatError(f'{where}: dtype must be "float64", "float32" or "int64", not {shorten(repr(name), 40)}')
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise FormatError(f"{where}: shape must be a list of non-negative integers")
    if len(shape) > MAX_DIMENSIONS:
        raise FormatError(f"{where}: the shape has {counted(len(shape), 'dimension')}, more than {MAX_DIMENSIONS}")
    if math.prod(d or 1 for d in shape) * dtype.itemsize > MAX_ARRAY_BYTES:  # as numpy counts, empty too
        raise FormatError(f"{where}: the shape {shorten(str(shape), 80)} is too large (more than 2**63 - 1 bytes)")
    if "data" not in raw:
        raise FormatError(f"{where}: the array has no data")
    level: list[Any] = [raw["data"]]
    for depth, size in enumerate(shape):  # level by level, so the items stay in C order
        if not all(isinstance(item, list) and len(item) == size for item in level):
            raise FormatError(f"{where}: data does not have the shape {shorten(str(shape), 80)} (at depth {depth})")
        level = [x for item in level for x in item]
    if dtype.kind == "i":
        for x in level:
            if type(x) is not int or not _INT64_RANGE[0] <= x <= _INT64_RANGE[1]:
                raise FormatError(f"{where}: an int64 array holds {shorten(repr(x), 40)}, not an integer of 64 bits")
        return np.array(level, dtype=np.int64).reshape(shape)
    wide = np.array([_float_in(x, f"{where}: an item") for x in level], dtype=np.float64)
    if dtype.itemsize == 8:
        return wide.reshape(shape)
    with np.errstate(over="ignore"):
        narrow = wide.astype(np.float32)
    overflow = np.flatnonzero(np.isinf(narrow) & np.isfinite(wide))
    if len(overflow):
        raise FormatError(f"{where}: the item {float(wide[overflow[0]])!r} is too large for a float32")
    return narrow.reshape(shape)
