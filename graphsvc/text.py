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
#: spells ``\\n`` is not confused with one that holds a newline) and every character that Python's
#: ``str.isprintable()`` calls unprintable except the ASCII space, that is the Unicode categories
#:
#: * Cc: the C0 and C1 controls and DEL (tab, newline, ESC, U+009B: a one-byte CSI on some terminals);
#: * Cf: format characters: the bidirectional controls (U+202E, U+2066...), zero-width ones (U+200B,
#:   U+200D, U+2060), the soft hyphen U+00AD, the byte-order mark U+FEFF, the tags U+E0001-U+E007F;
#: * Zl, Zp: the line and paragraph separators U+2028, U+2029;
#: * Zs other than the space: spaces that look like it (U+00A0, U+2007, U+3000...);
#: * Co, Cn: private use and unassigned code points (as this Python's Unicode database knows them);
#: * Cs: lone surrogates (a plugin's text; a graph file holds none, FORMAT.md §7), which UTF-8
#:   cannot encode.
#:
#: Each shows as ``repr`` writes it (``\\t``, ``\\x1b``, ``\\u202e``, ``\\U000e0041``), so two
#: names that differ never print alike, nothing invisible or reordering reaches the terminal, and text
#: that Python's ``repr`` quotes (``no node named '...'``) reads the same. Every escape is ASCII.
#:
#: Text is scanned for each backslash and each run of characters past printable ASCII; a run that is
#: printable (``é``, ``名前``) is kept whole, so only the rare unprintable text costs a call a character.
_NOT_PLAIN = r"\\|[^\x20-\x7e]+"
#: The same without the backslash: what :func:`one_line` escapes (a message may quote text with repr).
_NOT_PRINTABLE_ASCII = r"[^\x20-\x7e]+"
#: In JSON text: anything past ASCII, and DEL (C0 controls and the backslash are JSON's own to escape).
_NOT_JSON_ASCII = r"[^\x00-\x7e]+"


@cache
def _unsafe() -> re.Pattern[str]:
    return re.compile(_NOT_PLAIN)


@cache
def _control() -> re.Pattern[str]:
    return re.compile(_NOT_PRINTABLE_ASCII)


@cache
def _json_unsafe() -> re.Pattern[str]:
    return re.compile(_NOT_JSON_ASCII)


@cache
def _surrogate() -> re.Pattern[str]:
    return re.compile("[\ud800-\udfff]")


_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _python_escape(char: str) -> str:
    """One unprintable character as ``repr`` spells it."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped(match: re.Match[str]) -> str:
    run = match.group()
    if run == "\\":  # matched alone
        return "\\\\"
    if run.isprintable():  # é, 名前: printable text past ASCII
        return run
    return "".join(char if char.isprintable() else _python_escape(char) for char in run)


def _json_char(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character past U+FFFF as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _json_escaped_run(match: re.Match[str]) -> str:
    run = match.group()
    if run.isprintable():
        return run
    return "".join(char if char.isprintable() else _json_char(char) for char in run)


def escape(text: str) -> str:
    """``text`` with every unprintable character spelled as ``repr`` spells it (``\\t``, ``\\x1b``,
    ``\\u202e``, ``\\U000e0041``) and each backslash doubled; text without any is returned as it is."""
    if "\\" not in text and text.isprintable():
        return text
    return _unsafe().sub(_escaped, text)


def json_escaped(text: str) -> str:
    """JSON text as ``json.dumps(..., ensure_ascii=False)`` writes it, with each character that
    :func:`escape` would escape and JSON leaves as it is (DEL, the C1 controls, format, bidi and
    zero-width characters, U+2028, unusual spaces, private use, unassigned, lone surrogates) written
    as its JSON escape (``\\u202e``; ``\\udb40\\udc41`` for U+E0041): the same string to a JSON reader,
    inert on a terminal, and text that UTF-8 can encode. Outside its strings JSON text is ASCII, so
    the whole text can be scanned; JSON's own whitespace (a newline of indented JSON) is left alone."""
    if (text.isascii() and "\x7f" not in text) or text.isprintable():
        return text
    return _json_unsafe().sub(_json_escaped_run, text)


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
    return "\\" in joined or not joined.isprintable()


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
        message = _control().sub(_escaped, message)  # a run holds no backslash: left alone
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
