"""graphsvc.format.diagnose: the exact one-line words for a document msgpack could not decode, the
path to the first bad key or string (``metadata.notes[2]``), and the words every message uses to
name a value from the file."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from graphsvc import format as fmt
from graphsvc.errors import FormatError
from graphsvc.format import diagnose
from graphsvc.format.layout import Limits


def error_for(data: bytes, limits: Limits = fmt.DEFAULT_LIMITS) -> str:
    """What decode_error says of what msgpack raised decoding ``data`` with diagnose.bounds."""
    try:
        msgpack.unpackb(data, raw=False, strict_map_key=True, **diagnose.bounds(len(data), limits))
    except Exception as exc:
        return str(diagnose.decode_error(exc, data, limits))
    raise AssertionError(f"{data!r} decoded")


# -- what msgpack is told -----------------------------------------------------------------------------
def test_bounds_allow_no_count_larger_than_the_file_and_no_ext_type() -> None:
    limits = Limits(max_string_length=40)
    assert diagnose.bounds(100, limits) == {
        "max_array_len": 100,
        "max_map_len": 50,  # a map entry takes two bytes at least
        "max_bin_len": 100,
        "max_str_len": 40,  # the smaller of the file and the limit
        "max_ext_len": 0,
        "ext_hook": diagnose.reject_ext,
    }
    assert diagnose.bounds(10, limits)["max_str_len"] == 10
    with pytest.raises(diagnose.ExtType) as info:
        diagnose.reject_ext(7, b"")
    assert info.value.args == (7,)


# -- decode_error: one line for each way a document is broken -----------------------------------------
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x02\x03", "not a graphsvc file: it starts with b'\\x01\\x02\\x03', not a msgpack map"),
        (b"\x80\x00\x00", "trailing bytes after the document: 2 bytes follow the first 1"),
        (b"\x80\x00", "trailing bytes after the document: 1 byte follows the first 1"),
        (b"\xa1", "the file is truncated: 1 byte ends in the middle of the document"),
        (b"\x81", "the file is truncated: a map declares 1 entry, more than the file's 1 byte can hold"),
        (b"\x81\xa1a", "the file is truncated: 3 bytes end in the middle of the document"),
        (b"\xdc\x00\x10", "the file is truncated: an array declares 16 entries, more than the file's 3 bytes can hold"),
        (b"\xde\x00\x10", "the file is truncated: a map declares 16 entries, more than the file's 3 bytes can hold"),
        (b"\xc5\x01\x00", "the file is truncated: 3 bytes end in the middle of the document"),  # msgpack: incomplete
        (b"\xda\x01\x00", "the file is truncated: 3 bytes end in the middle of the document"),
        (b"\xc1", "not a valid msgpack document: it holds the reserved byte 0xc1"),
        (b"\xd4\x01\x00", "the file contains a msgpack ext type; graphsvc files never do"),
        (b"\xc7\x01\x05x", "the file contains a msgpack ext type; graphsvc files never do"),
        (b"\x81\x01\x02", "the document has a key that is not a string (an integer, entry 0)"),
        (b"\x91" * 1100 + b"\xc0", "not a valid msgpack document: it nests too deeply"),
    ],
)
def test_decode_error_words(data: bytes, message: str) -> None:
    assert error_for(data) == message


def test_a_string_longer_than_the_limit_is_named_with_both_lengths() -> None:
    data = msgpack.packb({"a": "hello world"})
    assert error_for(data, Limits(max_string_length=4)) == "a string of 11 bytes is longer than the limit of 4 bytes"


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (diagnose.DuplicateKey("k"), "a map repeats the key 'k'"),
        (diagnose.NonStringKey(), diagnose.NON_STRING_KEY),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "a string is not valid UTF-8"),
        (ValueError("something else"), "not a valid msgpack document: something else"),
        (RuntimeError("odd"), "not a valid msgpack document: RuntimeError: odd"),
    ],
)
def test_when_the_bytes_show_no_culprit_the_plain_words_stay(exc: Exception, message: str) -> None:
    """A valid document (an empty map): locate_bad_key_or_string finds nothing, so the message is the plain one."""
    assert str(diagnose.decode_error(exc, b"\x80", fmt.DEFAULT_LIMITS)) == message


# -- where the bad key or string is ----------------------------------------------------------------------
def _bad_utf8_in_notes() -> bytes:
    packed = msgpack.packb({"metadata": {"notes": ["a", "b", "c"]}})
    return packed.replace(b"\xa1c", b"\xa1\xff")


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (_bad_utf8_in_notes(), "the string at metadata.notes[2] is not valid UTF-8"),
        (b"\x81\xa6my key\x82\xa1x\x01\xa1x\x02", "the map at ['my key'] repeats the key 'x'"),
        (b"\x81\xa3ops\x92\x80\x81\xc0\x01", "the map at ops[1] has a key that is not a string (nil, entry 0)"),
        (b"\x81\xa1a\x81\xa2\xc3\x28\x01", "the map at a has a key that is not valid UTF-8 (entry 0)"),
        (b"\x82\xa1a\x01\xa1a\x02", "the document repeats the key 'a'"),
        (b"\x81\xa1a\x01", None),
        (b"\x81", None),  # truncated: another problem comes first
    ],
)
def test_the_first_bad_key_or_string_is_found_by_its_path(data: bytes, where: str | None) -> None:
    assert diagnose.locate_bad_key_or_string(data, fmt.DEFAULT_LIMITS) == where


def test_paths_quote_keys_that_are_not_identifiers() -> None:
    assert diagnose._path(("ops", 1, "tag")) == "ops[1].tag"
    assert diagnose._path(("a b", 0, "c")) == "['a b'][0].c"
    assert diagnose._path((0,)) == "[0]"
    assert diagnose._path(()) == "the document"


# -- naming values from the file -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        (True, int, "version[0] must be an integer, not a boolean"),
        ("1", int, "version[0] must be an integer, not a string"),
        (1, (list, dict), "version[0] must be an array or a map, not an integer"),
        (None, bytes, "version[0] must be bin data, not nil"),
        (1.5, str, "version[0] must be a string, not a float"),
        ({}, list, "version[0] must be an array, not a map"),
    ],
)
def test_expect_names_what_was_wanted_and_what_was_found(value: Any, kind: Any, message: str) -> None:
    with pytest.raises(FormatError) as info:
        diagnose.expect(value, kind, "version[0]")
    assert str(info.value) == message


def test_expect_returns_a_value_of_the_kind() -> None:
    marker = [1]
    assert diagnose.expect(marker, list, "x") is marker
    assert diagnose.expect(True, bool, "x") is True
    assert diagnose.expect(3, (int, float), "x") == 3


def test_describe_and_shown() -> None:
    assert [diagnose.describe(v) for v in (None, True, 1, 1.0, "s", b"b", [], {}, diagnose._Pairs(), 1j)] == [
        "nil", "a boolean", "an integer", "a float", "a string", "bin data", "an array", "a map", "a map", "complex",
    ]  # fmt: skip
    assert diagnose.shown("ab\n") == "'ab\\n'"  # repr: a file's text cannot add a line
    assert diagnose.shown("x" * 50) == "'" + "x" * 20 + "... (52 characters)"  # 40 in all
    assert diagnose.shown(12) == "12"
    assert diagnose.shown(True) == "a boolean"
    assert diagnose.shown(2.5) == "a float"
    assert diagnose.shape_text([2, 3]) == "[2, 3]"
    assert diagnose.shape_text(()) == "[]"
    # "[1, 1, ..., 1]" is 120 characters: cut to 80, the count included
    assert diagnose.shape_text([1] * 40) == "[" + "1, " * 19 + "1,... (120 characters)"
