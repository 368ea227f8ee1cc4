"""Keys a reader does not know: found in a valid document, worded, warned about or refused.

FORMAT.md §2: a reader ignores keys it does not know (a newer minor version may add optional
ones). A key a hand-written file misspells (``"parnets"``) is one of them, and ignoring it silently
changes the graph (the node loses its parents), so a read finds them, and ``load`` and ``loads``
then warn (:class:`graphsvc.errors.UnknownKeyWarning`, one warning a line, each naming the place,
the key and the known key closest to it) or, with ``strict=True``, refuse the file
(:class:`FormatError`, exit 3).

Where keys are looked for: in msgpack, the document, ``nodes``, each column map and each ``ops``
entry (the tensor table's entries are arrays, which have no keys); in the JSON form, the document,
each node, each ``ops`` entry and each array object. Attributes and metadata are free-form: any key
is theirs. The look is made on a document that passed every check, so its parts have their types;
it costs a set difference per map (the msgpack fast path reads a few maps; a JSON document's nodes
are looked at together, one pass in C over their keys).

The reading functions report what they find with :func:`found`; :func:`collecting` gathers it for
the verb that called them (which prefixes the file's name), else it is warned about at once.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from graphsvc.errors import FormatError, UnknownKeyWarning
from graphsvc.format.layout import (
    COLUMN_FIELDS,
    COLUMNS,
    COUNT,
    KEYS,
    KEYS_2,
    NODES_KEY,
    OP_FIELDS,
    OPS_KEY,
    OPTIONAL_COLUMN,
)
from graphsvc.text import counted, escape, shorten

#: How many unknown keys a warning names one by one; the rest are counted on one more line.
SHOWN = 5

#: The keys of the JSON form (FORMAT.md §13): the document, a node, an ``ops`` entry, an array object.
JSON_KEYS = ("format", "version", "ops", "nodes", "outputs", "metadata")
JSON_NODE_KEYS = ("id", "name", "op", "parents", "value", "grad", "attrs")
JSON_OP_KEYS = ("plugin", "version")
JSON_ARRAY_KEYS = ("dtype", "shape", "data")
_NODE_KEYS = (COUNT, *COLUMNS, OPTIONAL_COLUMN)


class UnknownKey(NamedTuple):
    """One unknown key: where (``nodes[3]``), the key, and the keys known there (for "did you mean")."""

    where: str
    key: str
    known: tuple[str, ...]
    #: What kind of place it is, plural (``nodes``): a key unknown in many places of one kind is
    #: said once, with a count of the others.
    kind: str

    def text(self) -> str:
        """``nodes[3]: unknown key 'parnets' (did you mean 'parents'?)``: the key escaped and cut."""
        import difflib  # here: only a file with an unknown key needs it

        close = difflib.get_close_matches(self.key, self.known, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{self.where}: unknown key '{escape(shorten(self.key, 40))}'{guess}"


# -- finding them ----------------------------------------------------------------------------------
def _unknown(keys: Iterable[str], known: Sequence[str]) -> list[str]:
    return [key for key in keys if key not in known]


def in_msgpack(doc: dict[str, Any], major: int) -> list[UnknownKey]:
    """The unknown keys of a valid msgpack document of version ``major``: the document's own, then
    ``nodes``', each column's, each ``ops`` entry's."""
    found: list[UnknownKey] = []
    top = KEYS if major == 1 else KEYS_2
    found += [UnknownKey("the document", key, top, "") for key in _unknown(doc, top)]
    nodes = doc[NODES_KEY]
    found += [UnknownKey(NODES_KEY, key, _NODE_KEYS, "") for key in _unknown(nodes, _NODE_KEYS)]
    for column in _NODE_KEYS[1:]:
        fields = nodes.get(column)
        if isinstance(fields, dict) and len(fields) != len(COLUMN_FIELDS):
            found += [
                UnknownKey(f"{NODES_KEY}.{column}", key, COLUMN_FIELDS, "columns")
                for key in _unknown(fields, COLUMN_FIELDS)
            ]
    ops = doc[OPS_KEY]
    if ops and set(itertools.chain.from_iterable(ops)) - set(OP_FIELDS):
        for i, entry in enumerate(ops):
            found += [
                UnknownKey(f"{OPS_KEY}[{i}]", key, OP_FIELDS, "ops entries") for key in _unknown(entry, OP_FIELDS)
            ]
    return found


def in_json(doc: dict[str, Any], arrays: bool) -> list[UnknownKey]:
    """The unknown keys of a valid JSON document: the document's own, then each ``ops`` entry's,
    each node's, each array object's (``arrays``: whether it holds any, a tensor graph's)."""
    found = [UnknownKey("the document", key, JSON_KEYS, "") for key in _unknown(doc, JSON_KEYS)]
    ops = doc.get("ops") or {}
    if set(itertools.chain.from_iterable(ops.values())) - set(JSON_OP_KEYS):
        for tag, entry in ops.items():
            where = f"ops['{escape(shorten(tag, 40))}']"
            found += [UnknownKey(where, key, JSON_OP_KEYS, "ops entries") for key in _unknown(entry, JSON_OP_KEYS)]
    nodes = doc["nodes"]
    if set(itertools.chain.from_iterable(nodes)) - set(JSON_NODE_KEYS):
        for i, item in enumerate(nodes):
            found += [UnknownKey(f"nodes[{i}]", key, JSON_NODE_KEYS, "nodes") for key in _unknown(item, JSON_NODE_KEYS)]
    if arrays:
        for i, item in enumerate(nodes):
            for field in ("value", "grad"):
                array = item.get(field)
                if isinstance(array, dict):
                    found += [
                        UnknownKey(f"nodes[{i}].{field}", key, JSON_ARRAY_KEYS, "array objects")
                        for key in _unknown(array, JSON_ARRAY_KEYS)
                    ]
    return found


# -- saying them -------------------------------------------------------------------------------------
def lines(found: Sequence[UnknownKey], shown: int = SHOWN) -> list[str]:
    """One warning line per unknown key, up to ``shown`` of them, then one counting the others. A key
    unknown in many places of one kind (``'parnets'`` in every node) is one line: the first place,
    and how many more."""
    groups: dict[tuple[str, str], list[UnknownKey]] = {}
    for item in found:
        groups.setdefault((item.kind, item.key) if item.kind else (item.where, item.key), []).append(item)
    said = []
    for (kind, _), items in itertools.islice(groups.items(), shown):
        others = f", and in {len(items) - 1:,} more {kind}" if len(items) > 1 else ""
        said.append(f"{items[0].text()}{others}; ignored")
    rest = sum(map(len, itertools.islice(groups.values(), shown, None)))
    if rest:
        said.append(f"{counted(rest, 'more unknown key', thousands=True)} ignored")
    return said


def refusal(found: Sequence[UnknownKey]) -> FormatError:
    """The error of a strict read: the first unknown key, and how many others there are."""
    others = f" ({counted(len(found) - 1, 'more unknown key', thousands=True)})" if len(found) > 1 else ""
    return FormatError(f"{found[0].text()}{others}; a strict read refuses unknown keys")


# -- passing them to the verb that reads ---------------------------------------------------------------
_collected: ContextVar[list[UnknownKey] | None] = ContextVar("graphsvc_unknown_keys", default=None)


def found(items: list[UnknownKey]) -> None:
    """Report unknown keys a read found: to the :func:`collecting` block around it, else as warnings."""
    if not items:
        return
    collected = _collected.get()
    if collected is None:
        warn(items, stacklevel=4)
    else:
        collected.extend(items)


@contextlib.contextmanager
def collecting() -> Iterator[list[UnknownKey]]:
    """Gather the unknown keys the reads in this block find (in this thread or task), in order."""
    items: list[UnknownKey] = []
    token = _collected.set(items)
    try:
        yield items
    finally:
        _collected.reset(token)


def warn(found: Sequence[UnknownKey], label: str | None = None, stacklevel: int = 2) -> None:
    """Warn about ``found``, one :class:`UnknownKeyWarning` per line of :func:`lines`, each after
    ``label:`` (the file's name) when given."""
    prefix = f"{label}: " if label is not None else ""
    for line in lines(found):
        warnings.warn(UnknownKeyWarning(prefix + line), stacklevel=stacklevel + 1)
