"""graphsvc.text: text from a file made safe to print (escape, json_escaped, one_line), cut to a
useful length (shorten, listed) and counted in words (counted, shown_number)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from graphsvc import text
from graphsvc.text import counted, escape, listed, one_line, shown_number


# -- escape ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
        ("back\\slash", "back\\\\slash"),  # doubled: escaping can be undone
        ("\x00\x1b[2J\x7f", "\\x00\\x1b[2J\\x7f"),
        ("\x85\x9f", "\\x85\\x9f"),  # C1 controls
        ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),  # bidi overrides and isolates
        ("\u061c\u200e\u200f", "\\u061c\\u200e\\u200f"),
        ("lone \ud800", "lone \\ud800"),  # UTF-8 cannot encode it
        ("\u200b\u200d\xad\ufeff\U000e0041", "\\u200b\\u200d\\xad\\ufeff\\U000e0041"),  # invisible ones
    ],
)
def test_escape_spells_each_unsafe_character_as_a_python_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown


def test_escape_returns_safe_text_as_it_is() -> None:
    safe = "é ü 名前 [bold] :smile:"
    assert escape(safe) is safe


def test_json_escaped_writes_lone_surrogates_as_json_escapes() -> None:
    assert text.json_escaped('{"n": "a\ud800b\udfff"}') == '{"n": "a\\ud800b\\udfff"}'
    plain = '{"n": "é\\n"}'
    assert text.json_escaped(plain) is plain


def test_first_surrogate_and_needs_escape() -> None:
    assert text.first_surrogate("ab\udc80c\ud800") == 2
    assert text.first_surrogate("abc") is None
    assert text.first_surrogate("é名") is None
    assert text.needs_escape(["a", "é", "b c"]) is False
    assert text.needs_escape(["a", "\\"]) is True
    assert text.needs_escape(["a", "b\x1b"]) is True
    assert text.needs_escape([]) is False


# -- shorten, listed, one_line ------------------------------------------------------------------------
def test_shorten_counts_what_it_cut_in_characters() -> None:
    from graphsvc.text import shorten

    assert shorten("abc", 3) == "abc"
    assert shorten("x" * 1234, 30) == "xxxxxxxx... (1,234 characters)"
    assert shorten("a", 0) == "a... (1 character)"  # never less than one character of the text


def test_listed_shows_ten_items_and_counts_the_rest() -> None:
    assert listed(["a", "b", "c"]) == "a, b, c"
    assert listed([]) == ""
    names = [f"y{i}" for i in range(20_000)]
    assert listed(names) == "y0, y1, y2, y3, y4, y5, y6, y7, y8, y9 and 19,990 more"
    assert listed(names[:11]) == "y0, y1, y2, y3, y4, y5, y6, y7, y8, y9 and 1 more"
    assert listed(names, shown=2) == "y0, y1 and 19,998 more"


def test_listed_with_a_total_reads_only_the_start_of_the_items() -> None:
    def items() -> object:
        yield from ("p", "q", "r")
        raise AssertionError("read past the items shown")

    assert listed(items(), total=1_000_000, shown=3) == "p, q, r and 999,997 more"  # type: ignore[arg-type]


def test_listed_escapes_quotes_and_cuts_each_item() -> None:
    assert listed(["a\nb", "\x1b"]) == "a\\nb, \\x1b"
    assert listed(["a", "it's"], quoted=True) == "'a', \"it's\""
    # each item cut to 60 characters, the count included: 40 x and "... (100 characters)"
    assert listed(["x" * 100]) == "x" * 40 + "... (100 characters)"
    assert len(listed(["x" * 100])) == text.ITEM_CHARS


def test_one_line_escapes_controls_but_not_backslashes_and_cuts_to_400() -> None:
    assert one_line("a\nb\\n 'c\\t'") == "a\\nb\\n 'c\\t'"
    assert one_line("tab\there\x1b]0;x\x07") == "tab\\there\\x1b]0;x\\x07"
    long = one_line("x" * 500)
    assert long == "x" * 380 + "... (500 characters)" and len(long) == text.LINE_CHARS
    assert one_line("y" * 50, limit=30) == "y" * 11 + "... (50 characters)"


# -- counted, shown_number --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (counted(1, "node"), "1 node"),
        (counted(0, "node"), "0 nodes"),
        (counted(7, "node"), "7 nodes"),
        (counted(1, "entry", plural="entries"), "1 entry"),
        (counted(2, "entry", plural="entries"), "2 entries"),
        (counted(1_000_000, "node"), "1000000 nodes"),
        (counted(1_000_000, "node", thousands=True), "1,000,000 nodes"),
        (counted(1.0, "second"), "1 second"),
        (counted(0.5, "second"), "0.5 seconds"),
        (counted(12345.0, "byte", thousands=True), "12,345 bytes"),
    ],
)
def test_counted(words: str, expected: str) -> None:
    assert words == expected


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (1234567, "1,234,567"),
        (-5, "-5"),
        (np.int64(-70_000), "-70,000"),
        (10**30 - 1, ",".join(["999"] * 10)),
        (10**30, "an integer of 31 digits"),
        (-(10**5000), "an integer of 5,001 digits"),  # Python would refuse to write it as text
        (2.5, "2.5"),
        (np.float32(0.5), "0.5"),
        (Fraction(1, 4), "0.25"),
        (Fraction(10**400, 3), "a Fraction"),  # past float's range
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str) else value[:20],
)
def test_shown_number(number: object, expected: str) -> None:
    assert shown_number(number) == expected  # type: ignore[arg-type]


def test_digits_is_exact_at_every_power_of_ten() -> None:
    for k in range(1, 400):
        assert text._digits(10**k - 1) == k
        assert text._digits(10**k) == k + 1
    assert text._digits(1) == 1


#: The Unicode categories escape() rewrites: every one str.isprintable() rejects (the space aside).
ESCAPED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}


def test_escape_rewrites_exactly_the_unprintable_categories_as_repr_does() -> None:
    """Every code point: escaped exactly when its category is one of ESCAPED_CATEGORIES (but the
    space) or it is the backslash, spelled as repr spells it; alone, and inside other text."""
    import unicodedata

    from graphsvc.text import escape, one_line

    everything = [chr(code) for code in range(0x110000)]
    assert [escape(char) for char in everything] == [repr(char)[1:-1] for char in everything]
    escaped = {char for char in everything if escape(char) != char}
    assert escaped == {
        char for char in everything if unicodedata.category(char) in ESCAPED_CATEGORIES and char != " "
    } | {"\\"}
    assert {char for char in everything if one_line(char) != char} == escaped - {"\\"}
    for char in ("\u200b", "\u00ad", "\U000e0041", "\ufeff", "\u202e", "\x9b", "\u2029", "\ue000", "\U0010ffff"):
        inside = f"é{char}\\x{char}名"
        assert escape(inside) == repr(inside)[1:-1]
        assert one_line(inside) == repr(inside)[1:-1].replace("\\\\", "\\")
    assert escape("a\\b\tc\u202e\xa0d") == "a\\\\b\\tc\\u202e\\xa0d"  # NBSP: a space that looks like one
    assert one_line("C:\\dir\tx\u2028y\xa0") == "C:\\dir\\tx\\u2028y\\xa0"  # backslashes left alone
    safe = "plain name é 名前"
    assert escape(safe) is safe and one_line(safe) is safe


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\u200bb", "a\\u200bb"),  # zero-width space
        ("a\u200db", "a\\u200db"),  # zero-width joiner
        ("soft\u00adhyphen", "soft\\xadhyphen"),
        ("tag\U000e0041", "tag\\U000e0041"),  # TAG LATIN CAPITAL LETTER A: past U+FFFF, eight digits
        ("\ufeffbom", "\\ufeffbom"),
        ("\u202eevil", "\\u202eevil"),
        ("csi\x9b2J", "csi\\x9b2J"),  # a one-byte CSI on some terminals
        ("pua\ue000", "pua\\ue000"),
        ("unassigned\u0378", "unassigned\\u0378"),
    ],
)
def test_invisible_characters_are_escaped_so_names_that_differ_print_differently(raw: str, shown: str) -> None:
    from graphsvc.text import escape

    assert escape(raw) == shown
    assert escape(raw) != escape(raw.translate({ord(c): None for c in raw if not c.isprintable()}))


@pytest.mark.parametrize(
    ("raw", "json_text"),
    [
        ("a\u200bb", '"a\\u200bb"'),
        ("a\u200db", '"a\\u200db"'),
        ("soft\u00adhyphen", '"soft\\u00adhyphen"'),
        ("tag\U000e0041", '"tag\\udb40\\udc41"'),  # JSON spells it as a UTF-16 surrogate pair
        ("\ufeffbom", '"\\ufeffbom"'),
        ("\u202eevil\u2066", '"\\u202eevil\\u2066"'),
        ("csi\x9b2J\x7f", '"csi\\u009b2J\\u007f"'),
        ("nb\xa0sp é", '"nb\\u00a0sp é"'),
        ("lone\ud800", '"lone\\ud800"'),
    ],
)
def test_json_escaped_writes_each_unprintable_character_as_its_json_escape(raw: str, json_text: str) -> None:
    import json

    written = text.json_escaped(json.dumps(raw, ensure_ascii=False))
    assert written == json_text
    assert json.loads(written) == raw


def test_json_escaped_leaves_indented_json_and_printable_text_alone() -> None:
    indented = '{\n "a": "é\\n"\n}'
    assert text.json_escaped(indented) == indented  # JSON's own newlines are not in a string
    assert text.json_escaped('{\n "a": "\u200b"\n}') == '{\n "a": "\\u200b"\n}'
