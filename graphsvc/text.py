"""Text from a file, made safe to print: escaped, shortened, one line.

A graph file is data, and so are the names, op tags and metadata in it. Wherever graphsvc prints
such text (the tab-separated listings, the terminal tables, error messages), it goes through
:func:`escape` first, so a name cannot add a row to a listing, end an error line early or send the
terminal an escape sequence. Long lists in messages go through :func:`listed` and whole messages
through :func:`one_line`, so an error stays one line of useful length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from functools import cache
from numbers import Integral, Real

#: What :func:`escape` rewrites: the backslash itself (so escaping can be undone and a name that
#: spells ``\\n`` is not confused with one that holds a newline), C0 and C1 control characters and
#: DEL (tab, newline, carriage return, ESC...), Unicode's line and paragraph separators, the
#: bidirectional controls that can make text display in another order than it reads, and lone
#: surrogates (a plugin's text; a graph file holds none, FORMAT.md §7), which UTF-8 cannot encode:
#: printed as they are, they stopped the listing with a UnicodeEncodeError or wrote bytes that are not UTF-8.
_SURROGATES = "\ud800-\udfff"
_CONTROLS = "\x00-\x1f\x7f-\x9f\u0085\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069" + _SURROGATES


# Every character in _CONTROLS is unprintable (str.isprintable), so text that is printable and has
# no backslash needs no pattern at all; the patterns are compiled on first use (~1 ms at start-up).
@cache
def _unsafe() -> re.Pattern[str]:
    return re.compile(f"[\\\\{_CONTROLS}]")


@cache
def _control() -> re.Pattern[str]:
    return re.compile(f"[{_CONTROLS}]")


@cache
def _surrogate() -> re.Pattern[str]:
    return re.compile(f"[{_SURROGATES}]")


_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every unsafe character spelled as a Python escape (``\\t``, ``\\x1b``,
    ``\\u202e``) and each backslash doubled; text without any is returned as it is."""
    if "\\" not in text and text.isprintable():
        return text
    return _unsafe().sub(_escaped, text)


def json_escaped(text: str) -> str:
    """JSON text as ``json.dumps(..., ensure_ascii=False)`` writes it, with each lone surrogate
    (which that leaves as it is) written as its JSON escape (``\\ud800``): the same string to a JSON
    reader, and text that UTF-8 can encode, on standard output or in a file."""
    if text.isascii() or text.isprintable():  # a surrogate is neither
        return text
    return _surrogate().sub(_escaped, text)


def first_surrogate(text: str) -> int | None:
    """Where ``text``'s first lone surrogate is (U+D800 to U+DFFF: not Unicode text, which UTF-8
    cannot encode; ``json.loads`` makes one of ``"\\ud800"``), or None when it has none."""
    if text.isascii():
        return None
    found = _surrogate().search(text)
    return None if found is None else found.start()


def needs_escape(texts: Iterable[str]) -> bool:
    """Does any of ``texts`` hold a character :func:`escape` would rewrite? (One pass over them all.)"""
    joined = "".join(texts)
    if "\\" not in joined and joined.isprintable():  # every character escape() rewrites is unprintable
        return False
    return _unsafe().search(joined) is not None


#: Longest item :func:`listed` shows before cutting it.
ITEM_CHARS = 60


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    marker = f"... ({counted(len(text), 'character', thousands=True)})"
    return text[: max(limit - len(marker), 1)] + marker


def listed(items: Iterable[str], total: int | None = None, shown: int = 10, *, quoted: bool = False) -> str:
    """``a, b, c``, or for a long list its first ``shown`` items and a count:
    ``y0, y1, ..., y9 and 19,990 more``. Each item is escaped (``quoted``: in quotes, as ``repr``
    writes it, ``'a', 'b'``) and cut to :data:`ITEM_CHARS`.

    ``total`` is the list's length when ``items`` holds only its start (an iterator over a large
    column need not be walked to the end).
    """
    first: list[str] = []
    count = 0
    for item in items:
        if count < shown:
            first.append(shorten(repr(item) if quoted else escape(item), ITEM_CHARS))
        count += 1
        if total is not None and count >= shown:
            break
    total = count if total is None else total
    text = ", ".join(first)
    if total > len(first):
        text += f" and {total - len(first):,} more"
    return text


#: Longest error or warning line graphsvc prints.
LINE_CHARS = 400


def one_line(message: str, limit: int = LINE_CHARS) -> str:
    """A message as one printable line of at most ``limit`` characters: its control characters
    escaped as :func:`escape` does (backslashes are left alone, so text a message already quoted
    with ``repr`` is not escaped twice), then cut."""
    if not message.isprintable():
        message = _control().sub(_escaped, message)
    return shorten(message, limit)


def counted(count: float, noun: str, *, plural: str | None = None, thousands: bool = False) -> str:
    """``count`` and ``noun``, plural unless the count is one: ``1 node``, ``7 nodes``, ``1 entry``,
    ``2 entries`` (``plural``, when adding an s is not it). ``thousands`` groups the digits
    (``1,000,000 nodes``). A float is written in its shortest form (``1 second``, ``0.5 seconds``)."""
    if isinstance(count, float):
        number = f"{count:,g}" if thousands else f"{count:g}"
    else:
        number = f"{count:,}" if thousands else str(count)
    return f"{number} {noun}" if count == 1 else f"{number} {plural or noun + 's'}"


def shown_number(number: Real) -> str:
    """A number a caller gave, as a message shows it: an integer with its thousands separated, or
    counted if it has 30 digits or more (Python refuses to write one of over 4,300 as text); any
    other number as a float, or by its type past float's range."""
    if isinstance(number, Integral):  # numpy's integers too
        integer = int(number)
        if abs(integer) < 10**30:
            return f"{integer:,}"
        return f"an integer of {counted(_digits(abs(integer)), 'digit', thousands=True)}"
    try:
        return repr(float(number))
    except OverflowError:
        return f"a {type(number).__name__}"


def _digits(positive: int) -> int:
    """How many decimal digits ``positive`` has, without writing it as text."""
    digits = int(positive.bit_length() * math.log10(2)) + 1  # right, or one too many
    return digits - 1 if 10 ** (digits - 1) > positive else digits
