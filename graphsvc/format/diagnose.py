"""Saying exactly what is wrong with a bad file: the slow path, taken only once reading has failed.

:func:`decode_error` turns what msgpack raised while decoding a document into the one-line
:class:`FormatError` a user reads; for a repeated key, a key that is not a string or invalid UTF-8
it decodes the bytes again, permissively, and names where the problem is, as a path such as
``metadata.notes[2]`` (:func:`locate_bad_key_or_string`). The wording helpers (:func:`expect`,
:func:`describe`, :func:`shown`) are shared with the document checks (:mod:`graphsvc.format.document`), so
every message names a value from the file the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from graphsvc.errors import FormatError
from graphsvc.text import counted, shorten

if TYPE_CHECKING:
    from graphsvc.format.fastload import Buffer
    from graphsvc.format.layout import Limits


# -- what the strict decoder (graphsvc.format.codec) raises from its hooks --------------------------------
class DuplicateKey(Exception):
    pass


class NonStringKey(Exception):
    pass


class ExtType(Exception):
    pass


NON_STRING_KEY = "a map has a key that is not a string"
EXT_MESSAGE = "the file contains a msgpack ext type; graphsvc files never do"


def bounds(size: int, limits: Limits) -> dict[str, Any]:
    """What every decode of ``size`` bytes tells msgpack. Each array item or map entry takes at least
    one byte (two for a map entry), so a count larger than the file cannot be honest: refusing it
    avoids a huge allocation. Every ext type is refused (the empty ones reach :func:`reject_ext`)."""
    return {
        "max_array_len": size,
        "max_map_len": size // 2,
        "max_bin_len": size,
        "max_str_len": min(size, limits.max_string_length),
        "max_ext_len": 0,
        "ext_hook": reject_ext,
    }


def reject_ext(code: int, data: bytes) -> Any:
    raise ExtType(code)


def decode_error(exc: Exception, data: Buffer, limits: Limits, size: int | None = None) -> FormatError:
    """The error for a document msgpack could not decode (``exc``, raised decoding ``data``): the
    whole file, or its first bytes when ``size`` says how long the file is (a repeated or
    non-string key, or invalid UTF-8, is then located only when the first bytes hold the document)."""
    if size is None:
        size = len(data)
    if isinstance(exc, msgpack.ExtraData):
        return extra_data_error(exc.unpacked, data, size, size - len(exc.extra))
    if isinstance(exc, ExtType):
        return FormatError(EXT_MESSAGE)
    if isinstance(exc, NonStringKey):
        return FormatError(locate_bad_key_or_string(data, limits) or NON_STRING_KEY)
    if isinstance(exc, DuplicateKey):
        return FormatError(locate_bad_key_or_string(data, limits) or f"a map repeats the key {exc.args[0]!r}")
    if isinstance(exc, UnicodeDecodeError):
        return FormatError(locate_bad_key_or_string(data, limits) or "a string is not valid UTF-8")
    if isinstance(exc, msgpack.StackError):
        return FormatError("not a valid msgpack document: it nests too deeply")
    if isinstance(exc, msgpack.FormatError):  # the one byte msgpack never uses: 0xc1
        return FormatError("not a valid msgpack document: it holds the reserved byte 0xc1")
    if isinstance(exc, ValueError):
        return _value_error(str(exc), data, limits, size)
    # msgpack's own errors: FormatError, StackError, ...
    return FormatError(f"not a valid msgpack document: {type(exc).__name__}: {exc}")


def extra_data_error(document: Any, data: Buffer, size: int, end: int) -> FormatError:
    """The error for a file of ``size`` bytes whose first msgpack value (``document``, starting
    ``data``) ends at byte ``end``, before the file does."""
    if not isinstance(document, dict):  # a graph file starts with a map: this is another kind of file
        return FormatError(f"not a graphsvc file: it starts with {bytes(data[:8])!r}, not a msgpack map")
    extra = size - end
    follow = "follows" if extra == 1 else "follow"
    return FormatError(f"trailing bytes after the document: {counted(extra, 'byte')} {follow} the first {end}")


def _value_error(text: str, data: Buffer, limits: Limits, size: int) -> FormatError:
    if "incomplete" in text:
        ends = "ends" if size == 1 else "end"
        return FormatError(f"the file is truncated: {counted(size, 'byte')} {ends} in the middle of the document")
    too_long = re.match(r"(\d+) exceeds max_(\w+)_len\((\d+)\)", text)
    if too_long:
        declared, kind, allowed = too_long.groups()
        if kind == "ext":
            return FormatError(EXT_MESSAGE)
        if kind == "str" and int(allowed) == limits.max_string_length < size:
            string, limit = counted(int(declared), "byte"), counted(int(allowed), "byte")
            return FormatError(f"a string of {string} is longer than the limit of {limit}")
        noun = {"str": "a string", "bin": "bin data", "array": "an array", "map": "a map"}.get(kind, kind)
        items = (
            counted(int(declared), "entry", plural="entries")
            if kind in ("array", "map")
            else counted(int(declared), "byte")
        )
        return FormatError(
            f"the file is truncated: {noun} declares {items}, more than the file's {counted(size, 'byte')} can hold"
        )
    if "not allowed for map key" in text:
        return FormatError(locate_bad_key_or_string(data, limits) or NON_STRING_KEY)
    return FormatError(f"not a valid msgpack document: {text}")


# -- where a bad key or string is ------------------------------------------------------------------
class _Pairs(list[tuple[Any, Any]]):
    """A map decoded as its (key, value) pairs, by :func:`locate_bad_key_or_string`."""


#: What invalid UTF-8 becomes when decoded with "surrogateescape"; valid UTF-8 never gives these.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def locate_bad_key_or_string(data: Buffer, limits: Limits) -> str | None:
    """Say where the first repeated key, non-string key or invalid UTF-8 is, as a path such as
    ``metadata.notes[2]``; None when it cannot tell.

    Only called after the fast decode failed: the bytes are decoded again permissively (maps as
    their pairs, any key type, invalid UTF-8 kept as lone surrogates) and the document is walked
    in order, without recursion.
    """
    size = len(data)
    try:
        doc = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            unicode_errors="surrogateescape",
            object_pairs_hook=_Pairs,
            **bounds(size, limits),
        )
    except Exception:  # another problem comes first: the caller keeps its plain message
        return None
    # One iterator per open container and the key that leads into it: memory grows with the depth
    # and the document, never with their product; a path is spelled only once a problem is found.
    path: list[str | int] = []
    open_containers: list[Iterator[tuple[str | int, Any]]] = [iter([("", doc)])]
    while open_containers:
        entry = next(open_containers[-1], None)
        if entry is None:
            open_containers.pop()
            if path:
                path.pop()
            continue
        key, value = entry
        if isinstance(value, str):
            if _ESCAPED_BYTE.search(value):
                return f"the string at {_path(_where(path, key))} is not valid UTF-8"
        elif isinstance(value, _Pairs):
            problem = _bad_key(value)
            if problem is not None:
                where = _where(path, key)
                return f"{f'the map at {_path(where)}' if where else 'the document'} {problem}"
            path.append(key)
            open_containers.append(iter(value))
        elif isinstance(value, list):
            path.append(key)
            open_containers.append(enumerate(value))
    return None


def _where(path: list[str | int], key: str | int) -> tuple[str | int, ...]:
    """The segments from the document to ``key`` (the first of ``path`` leads into the document)."""
    return tuple([*path, key][1:])


def _bad_key(pairs: _Pairs) -> str | None:
    """What is wrong with a map's keys (as the end of a sentence), or None."""
    seen: set[str] = set()
    for i, (key, _) in enumerate(pairs):
        if type(key) is not str:
            return f"has a key that is not a string ({describe(key)}, entry {i})"
        if _ESCAPED_BYTE.search(key):
            return f"has a key that is not valid UTF-8 (entry {i})"
        if key in seen:
            return f"repeats the key {key!r}"
        seen.add(key)
    return None


def _path(segments: tuple[str | int, ...]) -> str:
    """``("ops", 1, "tag")`` -> ``ops[1].tag``; keys that are not identifiers are quoted."""
    text = ""
    for segment in segments:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif segment.isidentifier():
            text += f".{segment}" if text else segment
        else:
            text += f"[{segment!r}]"
    return text or "the document"


# -- naming values from the file ---------------------------------------------------------------------
def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """``value``, or FormatError saying that ``where`` must be a ``kind``, not what it is."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise FormatError(f"{where} must be {_article(names)}, not {describe(value)}")
    return value


def _article(names: str) -> str:
    plain = {"int": "an integer", "str": "a string", "list": "an array", "dict": "a map", "bytes": "bin data"}
    return " or ".join(plain.get(n, n) for n in names.split(" or "))


def describe(value: Any) -> str:
    """What kind of msgpack value ``value`` is, in words (``an integer``, ``nil``)."""
    if value is None:
        return "nil"
    if isinstance(value, _Pairs):
        return "a map"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        bytes: "bin data",
        list: "an array",
        dict: "a map",
    }.get(type(value), type(value).__name__)


def shown(value: Any) -> str:
    """A value from the file, in a message: a string's repr (escaped, shortened), else its kind."""
    if isinstance(value, str):
        return shorten(repr(value), 40)
    if type(value) is int:
        return shorten(str(value), 40)
    return describe(value)


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    """A shape from the file, in a message: ``[2, 3]`` (shortened)."""
    return shorten(f"[{', '.join(map(str, shape))}]", 80)
